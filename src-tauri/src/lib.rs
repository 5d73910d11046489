//! Needle Studio, the desktop app: a Tauri 2 shell over the Needle engine.
//!
//! One room per step of the window, each a folder holding its state, its work and the thin
//! `#[tauri::command]` glue the web UI calls: [`model`] (hardware, base model, preferences), [`data`]
//! (the dataset's report, Generate), [`train`] (the training and its chart), [`evaluate`] (the built
//! file's scores, Try), [`export`] (Build, Publish) and [`history`] (past trainings). They stand on
//! [`record`] (the trainings' record, which every step reads), [`worker`] (the `needle` CLI as a child
//! process, where trainings and builds run, so a crash, an out-of-memory kill or a cancel never takes
//! the window down), [`secrets`] (Generate's key, Publish's token), [`chart`] (the charts, as SVG)
//! and [`ground`] (helpers that import nothing of the app); [`studio`] composes them.
//! State lives in Rust; `ui/` renders what the commands return and their channels send.

mod chart;
mod data;
mod evaluate;
mod export;
mod ground;
mod history;
mod model;
mod record;
mod secrets;
mod studio;
mod train;
mod worker;

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use tauri::{AppHandle, Manager, RunEvent, Runtime};

use studio::Opening;
pub use studio::{start, Launch, Start, Studio};
pub use worker::process::{Worker, SUPERSEDED, WORKER_ARG};

/// Opens the app's window with what it was launched with, and returns when the window closes.
pub fn open_window(launch: Launch) -> ExitCode {
    webview_environment();
    let app = with_commands(tauri::Builder::default()).setup(move |app| {
        let start = Start {
            data_dir: app.path().app_data_dir()?,
            launch,
            app_worker: Worker::this_app()?,
            hub: needle_engine::hub::Hub::from_env(),
            engine_deadline: worker::engine::ANSWER_DEADLINE,
        };
        studio::start(app.handle(), start);
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

/// What the webview needs from the environment, set before it starts (and before any thread does, as
/// the environment is the process's): on Linux, WebKitGTK's DMA-BUF renderer takes the window down
/// where GPU buffers cannot be shared (Xvfb, virtual machines, some drivers), so it is off unless the
/// user set the switch themselves, and a first start never depends on how the app was launched.
fn webview_environment() {
    #[cfg(target_os = "linux")]
    if std::env::var_os(DMABUF_RENDERER_SWITCH).is_none() {
        std::env::set_var(DMABUF_RENDERER_SWITCH, "1");
    }
}

#[cfg(target_os = "linux")]
const DMABUF_RENDERER_SWITCH: &str = "WEBKIT_DISABLE_DMABUF_RENDERER";

/// The app's life: when it exits, its workers end with it (a training first saves what it
/// learned), and so does the engine's start-up probe if the rooms are still opening, so none is
/// left running without a window.
pub fn on_run_event<R: Runtime>(app: &AppHandle<R>, event: RunEvent) {
    if let RunEvent::Exit = event {
        if let Some(opening) = app.try_state::<Arc<Opening>>() {
            opening.close();
        }
        if let Some(studio) = app.try_state::<Studio>() {
            studio.shutdown();
        }
    }
}

/// The plugins and commands; the command tests build their mock app with the same.
pub fn with_commands<R: Runtime>(builder: tauri::Builder<R>) -> tauri::Builder<R> {
    builder
        .plugin(tauri_plugin_dialog::init())
        .plugin(tauri_plugin_notification::init())
        .plugin(tauri_plugin_opener::init())
        .invoke_handler(tauri::generate_handler![
            studio::startup,
            model::commands::save_preferences,
            model::commands::base_model,
            model::commands::download_base_model,
            model::commands::use_base_model,
            model::commands::cancel_download,
            data::commands::load_dataset,
            data::commands::dataset_line,
            data::commands::generate_setup,
            data::commands::generate_examples,
            data::commands::cancel_generation,
            secrets::commands::remember_key,
            secrets::commands::forget_key,
            train::commands::validate_training,
            train::commands::plan_training,
            train::commands::start_training,
            train::commands::resume_training,
            train::commands::cancel_training,
            evaluate::commands::evaluation,
            evaluate::commands::try_model,
            evaluate::commands::pick_threshold,
            evaluate::commands::run_acceptance,
            export::commands::build_cact,
            export::commands::publish_setup,
            export::commands::publish_cact,
            export::commands::cancel_publish,
            export::commands::ladder_refusal,
            export::commands::score_ladder,
            export::commands::cancel_ladder,
            export::commands::reveal,
            history::commands::history,
            history::commands::open_training,
        ])
}
