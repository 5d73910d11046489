//! The app's state: where its files live, the worker, the hardware, the remembered settings and the
//! run in progress. Commands are thin calls into here; everything here works without a window.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use needle_engine::backend::BackendInfo;
use needle_engine::dataset::{Dataset, DatasetReport};
use needle_engine::hub::{BaseModel, Hub};
use needle_engine::tokenizer::Tokenizer;
use needle_engine::train::Plan;
use serde::Serialize;

use crate::base_model::Downloads;
use crate::config::{presets, Preset, RunDraft, RunRequest};
use crate::history::{History, HistoryEntry};
use crate::settings::Settings;
use crate::worker::{Job, Worker};
use crate::{chart, Launch};

/// Shared by every command and by the threads that follow workers; cloning is cheap.
#[derive(Clone)]
pub struct Studio(Arc<Inner>);

struct Inner {
    settings_path: PathBuf,
    launch_dataset: Option<PathBuf>,
    worker: Worker,
    hardware: BackendInfo,
    hub: Hub,
    downloads: Downloads,
    history: History,
    settings: Mutex<Settings>,
    active: Arc<Mutex<Option<Active>>>,
}

/// The training run in progress.
pub struct Active {
    pub id: String,
    pub job: Arc<Job>,
    /// Cancel was pressed once: the worker was asked to stop after its step.
    pub stopping: bool,
}

/// Everything the window shows when it opens.
#[derive(Debug, Serialize)]
pub struct Startup {
    pub hardware: BackendInfo,
    pub devices: Vec<String>,
    pub settings: Settings,
    pub dataset: Option<PathBuf>,
    pub presets: Vec<Preset>,
    pub history: Vec<HistoryEntry>,
}

/// A past run reopened: its record and its chart.
#[derive(Debug, Serialize)]
pub struct Opened {
    pub entry: HistoryEntry,
    pub chart: Option<String>,
}

impl Studio {
    /// The state kept in `data_dir`; paths given at launch replace the remembered base model, and
    /// with neither, Needle 2 from the hub cache is used when it is there.
    pub fn open(
        data_dir: PathBuf,
        launch: Launch,
        worker: Worker,
        hardware: BackendInfo,
        hub: Hub,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(&data_dir)?;
        let settings_path = data_dir.join("settings.json");
        let mut settings = Settings::load(&settings_path);
        // Relative paths from the command line mean the directory the app was started in.
        let absolute = |path: PathBuf| std::path::absolute(&path).unwrap_or(path);
        if let Some(checkpoint) = launch.checkpoint.map(absolute) {
            settings.tokenizer = Some(needle_engine::tokenizer::default_path(&checkpoint));
            settings.checkpoint = Some(checkpoint);
        }
        if let Some(tokenizer) = launch.tokenizer.map(absolute) {
            settings.tokenizer = Some(tokenizer);
        }
        if let Some(preset) = launch.preset.filter(|name| presets().iter().any(|p| p.name == name)) {
            settings.preset = preset;
        }
        if settings.checkpoint.is_none() {
            // Both files of one model: a remembered tokenizer may belong to another.
            if let Some(base) = needle_engine::hub::cached_base_model(&hub) {
                settings.tokenizer = Some(base.tokenizer);
                settings.checkpoint = Some(base.checkpoint);
            }
        }
        Ok(Self(Arc::new(Inner {
            settings_path,
            launch_dataset: launch.dataset.map(absolute),
            worker,
            hardware,
            hub,
            downloads: Downloads::default(),
            history: History::new(data_dir.join("runs")),
            settings: Mutex::new(settings),
            active: Arc::new(Mutex::new(None)),
        })))
    }

    pub fn startup(&self) -> Startup {
        Startup {
            hardware: self.0.hardware.clone(),
            devices: self.devices(),
            settings: lock(&self.0.settings).clone(),
            dataset: self.0.launch_dataset.clone(),
            presets: presets(),
            history: self.history(),
        }
    }

    /// The device selector's choices: automatic, or one of the backends the worker has.
    pub fn devices(&self) -> Vec<String> {
        std::iter::once("auto".to_string()).chain(self.0.hardware.compiled.iter().map(ToString::to_string)).collect()
    }

    pub fn save_settings(&self, settings: Settings) -> Result<(), String> {
        settings.save(&self.0.settings_path)?;
        *lock(&self.0.settings) = settings;
        Ok(())
    }

    /// Makes `base` the remembered base model (after a download).
    pub fn use_base_model(&self, base: &BaseModel) -> Result<(), String> {
        let mut settings = lock(&self.0.settings).clone();
        settings.checkpoint = Some(base.checkpoint.clone());
        settings.tokenizer = Some(base.tokenizer.clone());
        self.save_settings(settings)
    }

    /// The run, or every problem with it in one message.
    pub fn check(&self, draft: &RunDraft) -> Result<RunRequest, String> {
        draft.check(&self.devices()).map_err(|errors| {
            let problems: Vec<String> = errors.iter().map(|(field, message)| format!("{field}: {message}")).collect();
            format!("the run is not ready: {}", problems.join("; "))
        })
    }

    /// `needle finetune --dry-run` in the worker: steps, sequence length, memory estimate.
    pub fn plan(&self, draft: &RunDraft) -> Result<Plan, String> {
        let request = self.check(draft)?;
        let scratch = std::env::temp_dir().join("needle-studio-plan").join("adapter.pkl");
        let mut args = request.finetune_args(&scratch);
        args.push("--dry-run".into());
        let out = self.0.worker.output(args)?;
        serde_json::from_str(out.trim())
            .map_err(|error| format!("the worker's plan was not understood ({error}): {out}"))
    }

    pub fn history(&self) -> Vec<HistoryEntry> {
        let active = lock(&self.0.active).as_ref().map(|run| run.id.clone());
        self.0.history.list(active.as_deref())
    }

    pub fn open_run(&self, id: &str) -> Result<Opened, String> {
        let record = self.0.history.load(id)?;
        let active = lock(&self.0.active).as_ref().map(|run| run.id.clone());
        let entry = crate::history::interrupted_unless(record.entry, active.as_deref());
        let chart = (!record.curve.train.is_empty()).then(|| chart::loss_chart(&record.curve, entry.steps));
        Ok(Opened { entry, chart })
    }

    /// First press: ask the worker to stop after its step. Second press: end it now.
    pub fn cancel(&self) -> &'static str {
        match lock(&self.0.active).as_mut() {
            None => "idle",
            Some(run) if !run.stopping => {
                run.stopping = true;
                run.job.ask_to_stop();
                "stopping"
            }
            Some(run) => {
                run.job.kill();
                "killed"
            }
        }
    }

    pub(crate) fn settings(&self) -> &Mutex<Settings> {
        &self.0.settings
    }

    pub(crate) fn hub(&self) -> &Hub {
        &self.0.hub
    }

    pub(crate) fn downloads(&self) -> &Downloads {
        &self.0.downloads
    }

    pub(crate) fn worker(&self) -> &Worker {
        &self.0.worker
    }

    pub(crate) fn runs(&self) -> &History {
        &self.0.history
    }

    pub(crate) fn active(&self) -> &Arc<Mutex<Option<Active>>> {
        &self.0.active
    }
}

/// The dataset report (issue 2's) for the Dataset panel.
pub fn dataset_report(path: &Path, tokenizer: Option<&Path>, max_len: usize) -> Result<DatasetReport, String> {
    let tokenizer = tokenizer.ok_or("choose the base model's tokenizer (.model) to see token lengths")?;
    let tokenizer = Tokenizer::load(tokenizer).map_err(|e| e.to_string())?;
    let dataset = Dataset::load(path).map_err(|e| e.to_string())?;
    Ok(dataset.prepare(&tokenizer, max_len).map_err(|e| e.to_string())?.report)
}

/// A poisoned lock only means a thread panicked mid-update; the state itself is still whole.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
