//! Needle Studio, the desktop app: a Tauri 2 shell over the Needle engine.
//!
//! State lives here, in Rust ([`studio::Studio`]); the web UI in `ui/` only calls [`commands`] and
//! renders what their channels send. Training and building run in a worker process ([`worker`]) that
//! speaks `--events jsonl`, so a crash, an out-of-memory kill or a cancel never takes the window down.
//!
//! The rooms: [`training_request`] (a training as the Run panel asks for it),
//! [`training_slot`] (the one training in progress: start, cancel, close), [`training`] and [`building`] (the worker jobs that
//! train and build a `.cact`, and what the window hears of them), [`generating`] (more examples for the
//! dataset, written by an LLM), [`publishing`] (a built `.cact` pushed to the hub), [`api_key`] (their
//! key and token), [`tryout`] (Try), [`base_model`]
//! (the published base models and their download), [`history`] (past trainings on disk), [`preferences`]
//! (what the app remembers between launches), [`chart`] (the loss chart).

mod api_key;
mod base_model;
mod building;
mod chart;
mod commands;
mod generating;
mod history;
mod preferences;
mod publishing;
mod studio;
mod training;
mod training_request;
mod training_slot;
mod tryout;
mod worker;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tauri::{AppHandle, Manager, RunEvent, Runtime};

pub use studio::Studio;
pub use worker::{Worker, SUPERSEDED, WORKER_ARG};

/// What the app can be started with (the README's first command opens the bundled example).
#[derive(Debug, Clone, Default, clap::Parser)]
#[command(name = "needle-studio", version, about = "Fine-tune Needle on your dataset and build a .cact")]
pub struct Launch {
    /// A dataset (.jsonl) to open at start
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// A base checkpoint (.pkl, or a Needle 3 .safetensors) to use instead of the remembered one [default:
    /// the chosen generation's from the hub cache, Needle 3 until another is chosen]
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Its tokenizer [default: tokenizer.model beside the checkpoint]
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The preset to start with (quick, balanced or thorough) instead of the remembered one
    #[arg(long)]
    pub preset: Option<String>,
}

/// Opens the app's window with what it was launched with, and returns when the window closes.
pub fn open_window(launch: Launch) -> ExitCode {
    let app = with_commands(tauri::Builder::default()).setup(move |app| {
        let (worker, hardware) = worker::discover()?;
        let hub = needle_engine::hub::Hub::from_env();
        app.manage(Studio::open(app.path().app_data_dir()?, launch, worker, hardware, hub)?);
        Ok(())
    });
    match app.build(tauri::generate_context!()) {
        Ok(app) => {
            app.run(on_run_event);
            ExitCode::SUCCESS
        }
        Err(error) => {
            // Written, not `eprintln!`'d: a closed stderr must not turn a clean failure into a panic.
            let _ = writeln!(std::io::stderr(), "needle-studio: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The app's life: when it exits, its workers end with it (a training run first saves what it
/// learned), so none is left running without a window.
pub fn on_run_event<R: Runtime>(app: &AppHandle<R>, event: RunEvent) {
    if let RunEvent::Exit = event {
        if let Some(studio) = app.try_state::<Studio>() {
            studio.shutdown();
        }
    }
}

/// A poisoned lock only means a thread panicked mid-update; the state itself is still whole.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `path`, with `.{extension}` added unless it already ends in it: a save dialog that kept
/// `notes.txt` must not overwrite that file.
pub(crate) fn ending_in(path: &Path, extension: &str) -> PathBuf {
    if path.extension().is_some_and(|ext| ext.eq_ignore_ascii_case(extension)) {
        return path.to_owned();
    }
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(extension);
    PathBuf::from(name)
}

/// The plugins and commands; the command tests build their mock app with the same.
pub fn with_commands<R: Runtime>(builder: tauri::Builder<R>) -> tauri::Builder<R> {
    builder
        .plugin(tauri_plugin_dialog::init())
        .plugin(tauri_plugin_notification::init())
        .plugin(tauri_plugin_opener::init())
        .invoke_handler(tauri::generate_handler![
            commands::startup,
            commands::save_preferences,
            commands::base_model,
            commands::download_base_model,
            commands::use_base_model,
            commands::cancel_download,
            commands::load_dataset,
            commands::dataset_line,
            commands::generate_setup,
            commands::remember_key,
            commands::forget_key,
            commands::generate_examples,
            commands::cancel_generation,
            commands::validate_training,
            commands::plan_training,
            commands::start_training,
            commands::resume_training,
            commands::cancel_training,
            commands::build_cact,
            commands::publish_setup,
            commands::publish_cact,
            commands::try_model,
            commands::history,
            commands::open_training,
            commands::reveal,
        ])
}
