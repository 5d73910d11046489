//! The app composed: each step's room opened on the app's data folder and handed to Tauri as its own
//! state, and the two things that span the steps, what the window shows when it opens and what
//! happens when the app closes. Everything here works without a window.

use std::path::PathBuf;
use std::sync::Arc;

use needle_engine::backend::BackendInfo;
use needle_engine::hub::Hub;
use needle_engine::settings::{form_fields, presets, BuildWidth, FormField, Preset, BUILD_WIDTHS};
use serde::Serialize;
use tauri::{Manager, Runtime, State};

use crate::data::step::DataStep;
use crate::evaluate::step::EvaluateStep;
use crate::export::step::ExportStep;
use crate::ground::{blocking, Answer};
use crate::history::step::HistoryStep;
use crate::model::preferences::{Preferences, Remembered};
use crate::model::step::ModelStep;
use crate::record::trainings::{HistoryEntry, Records};
use crate::secrets::keys::Secrets;
use crate::train::slot::TrainingSlot;
use crate::train::step::TrainStep;
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
        app.manage(self);
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

/// Everything the window shows when it opens.
#[tauri::command]
pub async fn startup(studio: State<'_, Studio>) -> Answer<Startup> {
    let studio = studio.inner().clone();
    blocking(move || Ok(studio.startup())).await
}
