//! The app's state: where its files live, the worker, the hardware, the remembered preferences and
//! the training in progress. Commands are thin calls into here; everything here works without a window.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use needle_engine::backend::BackendInfo;
use needle_engine::checkpoint::file_generation;
use needle_engine::dataset::Dataset;
use needle_engine::generation::Generation;
use needle_engine::hub::{BaseModel, Hub};
use needle_engine::settings::{form_fields, preset, presets, BuildWidth, Field, FormField, Preset, BUILD_WIDTHS};
use needle_engine::train::Plan;
use serde::Serialize;

use crate::api_key::{Keys, SecretName, GENERATE_KEY, HUB_TOKEN};
use crate::base_model::Downloads;
use crate::generating::Generations;
use crate::history::{History, HistoryEntry};
use crate::preferences::Preferences;
use crate::publishing::Publishing;
use crate::training_request::{TrainingDraft, TrainingRequest};
use crate::training_slot::TrainingSlot;
use crate::worker::{Slot, Worker};
use crate::{chart, lock, Launch};

/// How much of a dataset line the window is shown.
const SHOWN_LINE_CHARS: usize = 16_384;

/// Shared by every command and by the threads that follow workers; cloning is cheap.
#[derive(Clone)]
pub struct Studio(Arc<Inner>);

struct Inner {
    preferences_path: PathBuf,
    launch_dataset: Option<PathBuf>,
    worker: Worker,
    hardware: BackendInfo,
    hub: Hub,
    downloads: Downloads,
    history: History,
    preferences: Mutex<Preferences>,
    training: TrainingSlot,
    /// The dataset report being computed: a newer request (another file, max length or tokenizer)
    /// ends it.
    report: Slot,
    /// The key to the endpoint that writes new examples, and the generation in progress.
    generate_key: Keys,
    generations: Generations,
    /// The token Publish uploads with, and the upload in progress.
    hub_token: Keys,
    publishing: Publishing,
}

/// Everything the window shows when it opens.
#[derive(Debug, Serialize)]
pub struct Startup {
    pub hardware: BackendInfo,
    pub devices: Vec<String>,
    pub preferences: Preferences,
    pub dataset: Option<PathBuf>,
    pub presets: Vec<Preset>,
    /// The Run panel's fields: names, labels, ranges and the reference's defaults.
    pub training_fields: Vec<FormField>,
    /// The widths Build offers.
    pub build_widths: &'static [BuildWidth],
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
    /// with neither, the chosen generation's (Needle 3 unless another was chosen) from the hub cache
    /// is used when it is there.
    pub fn open(
        data_dir: PathBuf,
        launch: Launch,
        worker: Worker,
        hardware: BackendInfo,
        hub: Hub,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(&data_dir)?;
        // Named before the preferences had their name; kept so that earlier choices still load.
        let preferences_path = data_dir.join("settings.json");
        let mut preferences = Preferences::load(&preferences_path);
        // Relative paths from the command line mean the directory the app was started in.
        let absolute = |path: PathBuf| std::path::absolute(&path).unwrap_or(path);
        if let Some(checkpoint) = launch.checkpoint.map(absolute) {
            preferences.tokenizer = Some(needle_engine::tokenizer::default_path(&checkpoint));
            preferences.checkpoint = Some(checkpoint);
        }
        if let Some(tokenizer) = launch.tokenizer.map(absolute) {
            preferences.tokenizer = Some(tokenizer);
        }
        if let Some(preset) = launch.preset.filter(|name| preset(name).is_some()) {
            preferences.preset = preset;
        }
        if preferences.checkpoint.is_none() {
            // Both files of one model: a remembered tokenizer may belong to another.
            if let Some(base) = needle_engine::hub::cached_base_model(&hub, preferences.generation) {
                preferences.tokenizer = Some(base.tokenizer);
                preferences.checkpoint = Some(base.checkpoint);
            }
        }
        Ok(Self(Arc::new(Inner {
            preferences_path,
            launch_dataset: launch.dataset.map(absolute),
            worker,
            hardware,
            hub,
            downloads: Downloads::default(),
            history: History::new(data_dir.join("runs")),
            preferences: Mutex::new(preferences),
            training: TrainingSlot::default(),
            report: Slot::default(),
            generate_key: Keys::new(GENERATE_KEY),
            generations: Generations::default(),
            hub_token: Keys::new(HUB_TOKEN),
            publishing: Publishing::default(),
        })))
    }

    pub fn startup(&self) -> Startup {
        Startup {
            hardware: self.0.hardware.clone(),
            devices: self.devices(),
            preferences: lock(&self.0.preferences).clone(),
            dataset: self.0.launch_dataset.clone(),
            presets: presets().to_vec(),
            training_fields: form_fields(),
            build_widths: &BUILD_WIDTHS,
            history: self.list_history(),
        }
    }

    /// The device selector's choices: automatic, or one of the backends the worker has.
    pub fn devices(&self) -> Vec<String> {
        std::iter::once("auto".to_string()).chain(self.0.hardware.compiled.iter().map(ToString::to_string)).collect()
    }

    /// Remembers what the window's fields say. The base model's generation is not a field: it stays
    /// as Download and Use chose it ([`Studio::use_base_model`]).
    pub fn save_preferences(&self, preferences: Preferences) -> Result<(), String> {
        let generation = lock(&self.0.preferences).generation;
        self.remember(Preferences { generation, ..preferences })
    }

    /// Makes `base`, the published base model of `generation`, the remembered one (Download, Use).
    pub fn use_base_model(&self, generation: Generation, base: &BaseModel) -> Result<(), String> {
        let mut preferences = lock(&self.0.preferences).clone();
        preferences.generation = generation;
        preferences.checkpoint = Some(base.checkpoint.clone());
        preferences.tokenizer = Some(base.tokenizer.clone());
        self.remember(preferences)
    }

    fn remember(&self, preferences: Preferences) -> Result<(), String> {
        preferences.save(&self.0.preferences_path)?;
        *lock(&self.0.preferences) = preferences;
        Ok(())
    }

    /// The training as asked for, or every problem with it in one message.
    pub fn check(&self, draft: &TrainingDraft) -> Result<TrainingRequest, String> {
        draft.check(&self.devices()).map_err(|errors| {
            let problems: Vec<String> = errors.iter().map(|(field, message)| format!("{field}: {message}")).collect();
            format!("the training is not ready: {}", problems.join("; "))
        })
    }

    /// `needle finetune --dry-run` in the worker: steps, sequence length, memory estimate.
    pub fn plan(&self, draft: &TrainingDraft) -> Result<Plan, String> {
        let request = self.check(draft)?;
        // Its own scratch folder: plans run side by side never share a file.
        let scratch = tempfile::tempdir().map_err(|error| format!("could not make a scratch folder: {error}"))?;
        let args = request.finetune_args(&scratch.path().join("adapter.pkl"), &["--dry-run"]);
        let out = self.0.worker.output(args)?;
        serde_json::from_str(out.trim())
            .map_err(|error| format!("the worker's plan was not understood ({error}): {out}"))
    }

    /// The dataset report (`needle data --json`) for the Dataset panel, computed in the worker: a
    /// huge or hostile file costs that process, never the window's. A newer request ends this one.
    /// `max_len` is as typed in the Run panel, read by the run's own max-length field; the lines
    /// are read as the chosen base model's generation reads them: `checkpoint`'s, else the published
    /// model chosen in the Model step.
    pub fn dataset_report(
        &self,
        path: &Path,
        tokenizer: Option<&Path>,
        checkpoint: Option<&Path>,
        max_len: &serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        let field = Field::named("max_len").ok_or("the run settings have no max length")?;
        let max_len = field.read(Some(max_len)).map_err(|problem| format!("{}: {problem}", field.label))?;
        let tokenizer = tokenizer.ok_or("choose the base model's tokenizer (.model) to see token lengths")?;
        let generation = match checkpoint {
            Some(checkpoint) => file_generation(checkpoint).ok_or_else(|| {
                format!(
                    "{} is not a Needle checkpoint (a 2.x .pkl or a 3.x .safetensors); choose the base model in the Model step",
                    checkpoint.display()
                )
            })?,
            None => lock(&self.0.preferences).generation,
        };
        let args: Vec<OsString> = vec![
            "data".into(),
            "--json".into(),
            "--max-len".into(),
            max_len.to_string().into(),
            "--tokenizer".into(),
            tokenizer.into(),
            "--generation".into(),
            generation.to_string().into(),
            "--".into(),
            path.into(),
        ];
        let out = self.0.worker.output_in(&self.0.report, args)?;
        serde_json::from_str(out.trim()).map_err(|error| format!("the worker's report was not understood ({error})"))
    }

    /// Line `line` of the dataset at `path` as it is written (a finding's line, shown when clicked);
    /// pretty-printed when it is JSON, and cut at [`SHOWN_LINE_CHARS`] characters.
    pub fn dataset_line(&self, path: &Path, line: usize) -> Result<String, String> {
        let text = Dataset::line_of(path, line)
            .map_err(|error| error.to_string())?
            .ok_or_else(|| format!("{} has no line {line}", path.display()))?;
        let text = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|value| serde_json::to_string_pretty(&value).ok())
            .unwrap_or(text);
        Ok(match text.char_indices().nth(SHOWN_LINE_CHARS) {
            Some((cut, _)) => format!("{}… (cut: the line is longer)", &text[..cut]),
            None => text,
        })
    }

    /// Keys typed from now on stay in this process's memory, and the environment's keys are not
    /// read: the tests' app, which must neither use the developer's keys nor write their keychain.
    pub fn isolate_keys(&self) {
        self.0.generate_key.isolate();
        self.0.hub_token.isolate();
    }

    /// The past trainings, newest first, the one going marked as such.
    pub fn list_history(&self) -> Vec<HistoryEntry> {
        self.0.history.list(self.0.training.running().as_deref())
    }

    pub fn open_training(&self, id: &str) -> Result<Opened, String> {
        let record = self.0.history.load(id)?;
        let entry = self.0.history.listed(record.entry, self.0.training.running().as_deref());
        let chart = (!record.curve.train.is_empty()).then(|| chart::loss_chart(&record.curve, entry.steps));
        Ok(Opened { entry, chart })
    }

    /// The app is closing: the training run saves what it learned (or is killed after a grace),
    /// then every other worker ends at once.
    pub fn shutdown(&self) {
        self.0.training.close();
        self.0.worker.kill_all();
    }

    pub(crate) fn preferences(&self) -> &Mutex<Preferences> {
        &self.0.preferences
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

    pub(crate) fn secret(&self, name: SecretName) -> &Keys {
        match name {
            SecretName::GenerateKey => &self.0.generate_key,
            SecretName::HubToken => &self.0.hub_token,
        }
    }

    pub(crate) fn generate_key(&self) -> &Keys {
        &self.0.generate_key
    }

    pub(crate) fn hub_token(&self) -> &Keys {
        &self.0.hub_token
    }

    pub(crate) fn publishing(&self) -> &Publishing {
        &self.0.publishing
    }

    pub(crate) fn generations(&self) -> &Generations {
        &self.0.generations
    }

    pub(crate) fn history(&self) -> &History {
        &self.0.history
    }

    pub(crate) fn training_slot(&self) -> &TrainingSlot {
        &self.0.training
    }
}
