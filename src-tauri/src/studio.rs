//! The app composed: each step's room opened on the app's data folder and handed to Tauri as its own
//! state, and the three things that span the steps: how the app opens (the window first, the engine
//! asked meanwhile), what the window shows when it opens and what happens when the app closes.
//! Everything here works without a window.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use needle_engine::backend::BackendInfo;
use needle_engine::hub::Hub;
use needle_engine::settings::{form_fields, presets, BuildWidth, FormField, Preset, BUILD_WIDTHS};
use serde::Serialize;
use tauri::{AppHandle, Manager, Runtime, State};

use crate::data::step::DataStep;
use crate::evaluate::step::EvaluateStep;
use crate::export::step::ExportStep;
use crate::ground::{blocking, lock, Answer};
use crate::history::step::HistoryStep;
use crate::model::preferences::{Preferences, Remembered};
use crate::model::step::ModelStep;
use crate::record::trainings::{HistoryEntry, Records};
use crate::secrets::keys::Secrets;
use crate::train::slot::TrainingSlot;
use crate::train::step::TrainStep;
use crate::worker::engine;
use crate::worker::process::Worker;

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

/// Every step's room; cloning is cheap.
#[derive(Clone)]
pub struct Studio {
    launch_dataset: Option<PathBuf>,
    worker: Worker,
    secrets: Secrets,
    model: ModelStep,
    data: DataStep,
    train: TrainStep,
    evaluate: EvaluateStep,
    export: ExportStep,
    history: HistoryStep,
}

/// What the app opens with: the rooms' data folder, the launch's arguments, the app's own worker, the hub,
/// and how long the bundled engine has to answer before the app trains on its own worker.
pub struct Start {
    pub data_dir: PathBuf,
    pub launch: Launch,
    pub app_worker: Worker,
    pub hub: Hub,
    pub engine_deadline: Duration,
}

/// The rooms while they open, for [`startup`]: the window is up before they are.
#[derive(Default)]
pub struct Opening {
    opened: Mutex<Option<Answer<Studio>>>,
    ready: Condvar,
    probe: Mutex<Probe>,
}

/// The bundled engine while it is asked what it trains on, and whether the app has closed: a window
/// closed within the engine's deadline must not leave the probe running after the app.
#[derive(Default)]
struct Probe {
    engine: Option<Worker>,
    closed: bool,
}

impl Opening {
    /// [`engine::discover`], its probe ended (or never started) if the app closes first.
    fn discover(&self, app_worker: Worker, deadline: Duration) -> (Worker, BackendInfo) {
        engine::discover(app_worker, deadline, |engine| {
            let mut probe = lock(&self.probe);
            if probe.closed {
                engine.kill_all();
            }
            probe.engine = Some(engine.clone());
        })
    }

    /// The app is closing: the engine's probe, if one runs, is killed, and none starts after.
    pub fn close(&self) {
        let mut probe = lock(&self.probe);
        probe.closed = true;
        if let Some(engine) = &probe.engine {
            engine.kill_all();
        }
    }

    fn finish(&self, opened: Answer<Studio>) {
        *lock(&self.opened) = Some(opened);
        self.ready.notify_all();
    }

    /// The rooms, once open, or why they could not open.
    fn wait(&self) -> Answer<Studio> {
        let opened = self.ready.wait_while(lock(&self.opened), |opened| opened.is_none());
        let opened = opened.unwrap_or_else(std::sync::PoisonError::into_inner);
        opened.clone().unwrap_or_else(|| Err("the app's rooms never opened".into()))
    }
}

/// The `Opening` state of `app`, managed by whichever comes first: [`start`] or [`Studio::manage`].
fn opening<R: Runtime>(app: &impl Manager<R>) -> Arc<Opening> {
    // Tauri keeps the first value of a type it manages; a second is dropped.
    app.manage(Arc::<Opening>::default());
    Arc::clone(app.state::<Arc<Opening>>().inner())
}

/// Opens the app's rooms on a thread of its own, so that the window never waits for the engine: the
/// bundled one is asked what it trains on (with `start.engine_deadline` to answer, else the app trains
/// on its own worker and the Model step says why), and then the rooms are handed to `app`. The window's
/// first command, [`startup`], waits for them.
pub fn start<R: Runtime>(app: &AppHandle<R>, start: Start) {
    opening(app);
    let app = app.clone();
    std::thread::spawn(move || {
        let Start { data_dir, launch, app_worker, hub, engine_deadline } = start;
        let (worker, hardware) = opening(&app).discover(app_worker, engine_deadline);
        match Studio::open(data_dir.clone(), launch, worker, hardware, hub) {
            Ok(studio) => studio.manage(&app),
            Err(error) => opening(&app)
                .finish(Err(format!("could not open the app's data folder {}: {error}", data_dir.display()))),
        }
    });
}

/// Everything the window shows when it opens.
#[derive(Debug, Serialize)]
pub struct Startup {
    pub hardware: BackendInfo,
    pub devices: Vec<String>,
    pub preferences: Preferences,
    pub dataset: Option<PathBuf>,
    pub presets: Vec<Preset>,
    /// The Train panel's fields: names, labels, ranges and the reference's defaults.
    pub training_fields: Vec<FormField>,
    /// The widths Build offers.
    pub build_widths: &'static [BuildWidth],
    pub history: Vec<HistoryEntry>,
}

impl Studio {
    /// The rooms kept in `data_dir`; paths given at launch replace the remembered base model.
    pub fn open(
        data_dir: PathBuf,
        launch: Launch,
        worker: Worker,
        hardware: BackendInfo,
        hub: Hub,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(&data_dir)?;
        // Relative paths from the command line mean the directory the app was started in.
        let absolute = |path: PathBuf| std::path::absolute(&path).unwrap_or(path);
        let (checkpoint, tokenizer) = (launch.checkpoint.map(absolute), launch.tokenizer.map(absolute));
        let preferences = Remembered::open(&data_dir, &hub, checkpoint, tokenizer, launch.preset);
        let model = ModelStep::new(hub.clone(), hardware, preferences);
        let secrets = Secrets::default();
        let records = Records::open(&data_dir);
        let slot = TrainingSlot::default();
        Ok(Self {
            launch_dataset: launch.dataset.map(absolute),
            data: DataStep::new(worker.clone(), Arc::clone(&secrets.generate_key), Arc::clone(&model.preferences)),
            train: TrainStep {
                worker: worker.clone(),
                records: records.clone(),
                slot: slot.clone(),
                devices: model.devices().into(),
                preferences: Arc::clone(&model.preferences),
            },
            evaluate: EvaluateStep {
                worker: worker.clone(),
                records: records.clone(),
                base: Arc::clone(&model.preferences),
            },
            export: ExportStep {
                worker: worker.clone(),
                records: records.clone(),
                hub,
                token: Arc::clone(&secrets.hub_token),
                publishing: Arc::default(),
                ladder: Arc::default(),
            },
            history: HistoryStep { records, slot },
            model,
            secrets,
            worker,
        })
    }

    /// Hands each room to `app` as its own state, for its commands, and the whole for [`startup`]
    /// and the app's exit.
    pub fn manage<R: Runtime>(self, app: &impl Manager<R>) {
        app.manage(self.secrets.clone());
        app.manage(self.model.clone());
        app.manage(self.data.clone());
        app.manage(self.train.clone());
        app.manage(self.evaluate.clone());
        app.manage(self.export.clone());
        app.manage(self.history.clone());
        app.manage(self.clone());
        // Last: the window's other commands may run as soon as `startup` answers.
        opening(app).finish(Ok(self));
    }

    pub fn startup(&self) -> Startup {
        Startup {
            hardware: self.model.hardware.clone(),
            devices: self.model.devices(),
            preferences: self.model.preferences.get(),
            dataset: self.launch_dataset.clone(),
            presets: presets().to_vec(),
            training_fields: form_fields(),
            build_widths: &BUILD_WIDTHS,
            history: self.history.list(),
        }
    }

    /// The Data step's room (the tests ask it for reports side by side).
    pub fn data(&self) -> &DataStep {
        &self.data
    }

    /// Keys typed from now on stay in this process's memory, and the environment's keys are not
    /// read: the tests' app, which must neither use the developer's keys nor write their keychain.
    pub fn isolate_keys(&self) {
        self.secrets.isolate();
    }

    /// The app is closing: the training saves what it learned (or is killed after a grace), then
    /// every other worker ends at once.
    pub fn shutdown(&self) {
        self.train.slot.close();
        self.worker.kill_all();
    }
}

/// Everything the window shows when it opens, once the rooms are open.
#[tauri::command]
pub async fn startup(opening: State<'_, Arc<Opening>>) -> Answer<Startup> {
    let opening = Arc::clone(opening.inner());
    blocking(move || Ok(opening.wait()?.startup())).await
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::time::Instant;

    use super::*;

    /// A stand-in bundled engine in `dir/bin` that writes its pid to `dir/engine.pid` and never
    /// answers, and the app worker beside it.
    fn silent_engine(dir: &Path) -> Worker {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let engine = bin.join("needle");
        let script = format!("#!/bin/sh\necho $$ > '{}'\nexec sleep 600\n", dir.join("engine.pid").display());
        std::fs::write(&engine, script).unwrap();
        std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o755)).unwrap();
        Worker::app(bin.join("needle-studio"))
    }

    fn running(pid: &str) -> bool {
        std::process::Command::new("kill").args(["-0", pid.trim()]).status().unwrap().success()
    }

    /// The window closed while the engine is still being asked (well inside its deadline): the probe
    /// is killed then, not at the deadline, and the app's own worker is chosen.
    #[test]
    fn closing_the_app_ends_the_engine_probe_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let app_worker = silent_engine(dir.path());
        let opening = Arc::new(Opening::default());
        let (done, chosen) = std::sync::mpsc::channel();
        let probing = Arc::clone(&opening);
        std::thread::spawn(move || done.send(probing.discover(app_worker, Duration::from_secs(600))).unwrap());
        let pid_file = dir.path().join("engine.pid");
        let began = Instant::now();
        while std::fs::read_to_string(&pid_file).map_or(true, |pid| pid.trim().is_empty()) {
            assert!(began.elapsed() < Duration::from_secs(30), "the stand-in engine never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        let pid = std::fs::read_to_string(&pid_file).unwrap();

        opening.close();
        let (worker, hardware) = chosen.recv_timeout(Duration::from_secs(10)).expect("the probe ended on close");
        assert!(worker.program().ends_with("needle-studio"), "{}", worker.program().display());
        assert!(hardware.reason.contains("(the bundled engine did not answer: "), "{}", hardware.reason);
        let killed = Instant::now();
        while running(&pid) && killed.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!running(&pid), "the probe {} outlived the app", pid.trim());
    }

    /// The window closed before the probe began: the engine is never started.
    #[test]
    fn an_app_closed_before_the_probe_starts_no_engine() {
        let dir = tempfile::tempdir().unwrap();
        let app_worker = silent_engine(dir.path());
        let opening = Opening::default();
        opening.close();
        let (worker, hardware) = opening.discover(app_worker, Duration::from_secs(600));
        assert!(worker.program().ends_with("needle-studio"));
        assert!(hardware
            .reason
            .ends_with("(the bundled engine did not answer: the app is closing, so no worker starts)"));
        assert!(!dir.path().join("engine.pid").exists(), "the engine started after the app closed");
    }
}
