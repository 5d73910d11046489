//! Past trainings, one folder each under the app's data directory: `trainings/<id>/training.json` (the request, status,
//! losses, outputs) beside the training's adapter and `.cact`.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use needle_engine::calls::{CallScores, QuantRows};
use needle_engine::generation::Generation;
use needle_engine::hub::Uploaded;
use serde::{Deserialize, Serialize};

use crate::ground::read_limited;
use crate::record::acceptance::Acceptance;
use crate::record::request::TrainingRequest;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainingStatus {
    Running,
    Finished,
    /// Cancelled: the adapter holds what was learned up to the stop.
    Stopped,
    Failed,
    /// Cut short by the app closing (or dying) while it went.
    Interrupted,
}

/// A built `.cact`, as read back from the file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CactInfo {
    pub path: PathBuf,
    pub bytes: u64,
    pub tensors: usize,
    pub scheme: String,
    /// The tuned model three ways on the examples the training's scores used: float, its
    /// quantization simulated, and this file read back; `None` without a validation split. (Files
    /// scored before the three rows were kept have none: build again to score them.)
    #[serde(default)]
    pub rows: Option<QuantRows>,
    /// Why the file could not be scored, when it could not.
    #[serde(default)]
    pub scores_error: Option<String>,
    /// Where Publish put this file on the hub; a file built again is unpublished until published.
    #[serde(default)]
    pub published: Option<Uploaded>,
    /// The rung's depth when this file is one rung of the model's depth ladder, not the whole model.
    #[serde(default)]
    pub layers: Option<usize>,
}

impl HistoryEntry {
    /// Keeps `built` as what it is: the whole model's file, or one rung's beside it. A file written
    /// where an earlier one was recorded replaces that record: its file is gone.
    pub fn record_built(&mut self, built: CactInfo) {
        self.rungs.retain(|rung| rung.path != built.path);
        match built.layers {
            Some(_) => self.rungs.push(built),
            None => self.cact = Some(built),
        }
    }
}

/// One training as the History panel lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub id: String,
    /// Unix seconds.
    pub started_at: u64,
    /// What was asked for; Resume asks for it again.
    pub request: TrainingRequest,
    /// The backend and device the worker reported, e.g. `cpu (AMD EPYC)`.
    pub backend: Option<String>,
    pub status: TrainingStatus,
    pub seconds: Option<f64>,
    pub steps_done: usize,
    pub steps: usize,
    pub final_loss: Option<f32>,
    pub final_val: Option<f32>,
    /// Set once the worker has saved one (after the first epoch, or at a cancel).
    pub adapter: Option<PathBuf>,
    /// Why a training failed or stopped.
    pub message: Option<String>,
    /// The whole model's built file: the one Evaluate scores and Publish uploads.
    pub cact: Option<CactInfo>,
    /// Rungs of the model's depth ladder built as files of their own, beside the whole model's, never
    /// in its place.
    #[serde(default)]
    pub rungs: Vec<CactInfo>,
    /// Held-out loss and exact-call accuracy of the base and the tuned model, when the training finished.
    #[serde(default)]
    pub scores: Option<CallScores>,
    /// Where Build writes unless the user picks another file.
    pub suggested_cact: PathBuf,
    /// The confidence a turn needs for its calls to be acted on, as the user picked it in Evaluate;
    /// written beside the built `.cact` too.
    #[serde(default)]
    pub threshold: Option<f64>,
    /// The last acceptance suite run on the training's models.
    #[serde(default)]
    pub acceptance: Option<Acceptance>,
    /// Whether Resume can continue it: it ended early with its training state saved. Derived
    /// when the entry is listed, never stored.
    #[serde(default, skip_deserializing)]
    pub resumable: bool,
}

/// The losses behind a training's chart: `(step, loss)` per training step and per epoch's validation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    pub train: Vec<(usize, f32)>,
    pub val: Vec<(usize, f32)>,
}

/// What `training.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingRecord {
    pub entry: HistoryEntry,
    pub curve: Curve,
}

/// The `trainings/` folder.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

/// The folder of the trainings in the app's data folder, and each one's record in its own folder.
const FOLDER: &str = "trainings";
const RECORD: &str = "training.json";
/// Their names before a training was called one everywhere: a data folder that has them is taken over.
const EARLIER_FOLDER: &str = "runs";
const EARLIER_RECORD: &str = "run.json";

impl Records {
    /// The trainings kept in `data_dir`.
    pub fn open(data_dir: &Path) -> Self {
        let dir = data_dir.join(FOLDER);
        let earlier = data_dir.join(EARLIER_FOLDER);
        if !dir.exists() && earlier.is_dir() {
            // A failed rename leaves the earlier trainings where they were: not listed, never lost.
            let _ = std::fs::rename(&earlier, &dir);
        }
        Self { dir }
    }

    /// A new training's record and folder; the adapter goes in that folder.
    pub fn create(&self, request: &TrainingRequest) -> Result<(TrainingRecord, PathBuf), String> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let id = format!("training-{}", now.as_millis());
        let dir = self.dir.join(&id);
        std::fs::create_dir_all(&dir)
            .map_err(|error| format!("could not create the training folder {}: {error}", dir.display()))?;
        let stem = request.dataset.file_stem().map_or_else(|| "needle".into(), |s| s.to_string_lossy().into_owned());
        let entry = HistoryEntry {
            id,
            started_at: now.as_secs(),
            request: request.clone(),
            backend: None,
            status: TrainingStatus::Running,
            seconds: None,
            steps_done: 0,
            steps: 0,
            final_loss: None,
            final_val: None,
            adapter: None,
            message: None,
            cact: None,
            rungs: Vec::new(),
            scores: None,
            suggested_cact: dir.join(format!("{stem}.cact")),
            threshold: None,
            acceptance: None,
            resumable: false,
        };
        let record = TrainingRecord { entry, curve: Curve::default() };
        self.save(&record)?;
        let adapter = self.adapter_path(&record.entry);
        Ok((record, adapter))
    }

    /// Where a training saves its adapter (and, beside it, the state Resume continues from), in the
    /// file its base's own package reads: 2.x's pickle for Needle 2, 3.x's safetensors for Needle 3.
    /// A checkpoint that can no longer be read (and so is neither trained nor resumed) is told by
    /// its extension.
    pub fn adapter_path(&self, entry: &HistoryEntry) -> PathBuf {
        let checkpoint = &entry.request.checkpoint;
        let generation = needle_engine::checkpoint::file_generation(checkpoint)
            .or_else(|| {
                let extension = checkpoint.extension()?;
                Generation::ALL.into_iter().find(|g| extension == g.profile().checkpoint.extension())
            })
            .unwrap_or_default();
        self.dir.join(&entry.id).join(format!("adapter.{}", generation.profile().adapter.extension()))
    }

    pub fn save(&self, record: &TrainingRecord) -> Result<(), String> {
        let folder = self.dir.join(&record.entry.id);
        let path = folder.join(RECORD);
        let json = serde_json::to_vec_pretty(record).map_err(|e| e.to_string())?;
        needle_engine::atomic::write_atomically(&path, &json)
            .map_err(|error| format!("could not save the training record {}: {error}", path.display()))?;
        // Saved under its new name, the record's earlier file would only be a stale copy.
        let _ = std::fs::remove_file(folder.join(EARLIER_RECORD));
        Ok(())
    }

    pub fn load(&self, id: &str) -> Result<TrainingRecord, String> {
        // Ids name folders: refuse anything that could reach outside `trainings/`.
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(format!("no training {id:?}"));
        }
        read_in(&self.dir.join(id))
    }

    /// Every readable training, newest first, as [`Self::listed`] shows it.
    pub fn list(&self, active: Option<&str>) -> Vec<HistoryEntry> {
        let Ok(folders) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut entries: Vec<HistoryEntry> = folders
            .filter_map(|folder| read_in(&folder.ok()?.path()).ok())
            .map(|record| self.listed(record.entry, active))
            .collect();
        entries.sort_by(|a, b| b.started_at.cmp(&a.started_at).then_with(|| b.id.cmp(&a.id)));
        entries
    }

    /// A training as the window sees it. One still marked running that is not `active` was cut short
    /// by the app dying; it reads as interrupted. One that ended early with its training state
    /// saved can be resumed.
    pub fn listed(&self, mut entry: HistoryEntry, active: Option<&str>) -> HistoryEntry {
        if entry.status == TrainingStatus::Running && active != Some(entry.id.as_str()) {
            entry.status = TrainingStatus::Interrupted;
            entry.message = Some("interrupted: the app closed while this training was going".into());
        }
        let ended_early =
            matches!(entry.status, TrainingStatus::Stopped | TrainingStatus::Failed | TrainingStatus::Interrupted);
        let state = needle_engine::train::state::state_path(&self.adapter_path(&entry));
        entry.resumable = ended_early && entry.steps_done < entry.steps && state.is_file();
        entry
    }
}

/// The most a training record may hold: a long training's loss curve is a few MB; more is not a record.
const RECORD_LIMIT: u64 = 64 << 20;

/// The record in a training's `folder`, under its name or, not saved since, its earlier one.
fn read_in(folder: &Path) -> Result<TrainingRecord, String> {
    let path = folder.join(RECORD);
    let earlier = folder.join(EARLIER_RECORD);
    read_record(if !path.is_file() && earlier.is_file() { &earlier } else { &path })
}

fn read_record(path: &Path) -> Result<TrainingRecord, String> {
    let bytes = read_limited(path, RECORD_LIMIT)?;
    let not_a_record = |error: serde_json::Error| format!("{} is not a training record: {error}", path.display());
    let mut record: serde_json::Value = serde_json::from_slice(&bytes).map_err(not_a_record)?;
    nest_request(&mut record);
    let mut record: TrainingRecord = serde_json::from_value(record).map_err(not_a_record)?;
    // Before rungs had a list of their own, a rung built took the whole model's place.
    if let Some(rung) = record.entry.cact.take_if(|cact| cact.layers.is_some()) {
        record.entry.rungs.push(rung);
    }
    Ok(record)
}

/// The fields of the request, as records written before the entry held its [`TrainingRequest`]
/// have them: beside the entry's own.
const REQUEST_FIELDS: [&str; 5] = ["dataset", "checkpoint", "tokenizer", "device", "settings"];

/// Moves the request's fields of such a record into its `request`, so that it reads as a new one.
fn nest_request(record: &mut serde_json::Value) {
    let Some(entry) = record.get_mut("entry").and_then(serde_json::Value::as_object_mut) else { return };
    if entry.contains_key("request") {
        return;
    }
    let request: serde_json::Map<String, serde_json::Value> =
        REQUEST_FIELDS.iter().filter_map(|&field| Some((field.to_string(), entry.remove(field)?))).collect();
    entry.insert("request".into(), request.into());
}

#[cfg(test)]
mod tests {
    use super::*;
    use needle_engine::settings::presets;

    fn request() -> TrainingRequest {
        TrainingRequest {
            dataset: "/data/smart_home.jsonl".into(),
            checkpoint: "/m/base.pkl".into(),
            tokenizer: "/m/tokenizer.model".into(),
            device: "auto".into(),
            settings: presets()[0].settings,
        }
    }

    #[test]
    fn records_round_trip_and_list_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let history = Records::open(dir.path());
        let (mut first, adapter) = history.create(&request()).unwrap();
        assert_eq!(adapter, dir.path().join(FOLDER).join(&first.entry.id).join("adapter.pkl"));
        assert!(first.entry.suggested_cact.ends_with("smart_home.cact"));
        first.entry.status = TrainingStatus::Finished;
        first.curve.train.push((1, 2.5));
        history.save(&first).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let (second, _) = history.create(&request()).unwrap();
        assert_eq!(history.load(&first.entry.id).unwrap(), first);
        let listed = history.list(Some(&second.entry.id));
        assert_eq!(listed, vec![second.entry.clone(), first.entry.clone()]);
    }

    #[test]
    fn a_record_from_before_the_entry_held_its_request_and_under_its_earlier_names_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        // The request's fields beside the entry's, as records were written before, in `runs/<id>/run.json`.
        let old = serde_json::json!({
            "entry": {
                "id": "run-1", "started_at": 1, "dataset": "/data/smart_home.jsonl", "checkpoint": "/m/base.pkl",
                "tokenizer": "/m/tokenizer.model", "device": "auto", "backend": null,
                "settings": presets()[0].settings, "status": "finished", "seconds": 7.5, "steps_done": 3,
                "steps": 3, "final_loss": 4.5, "final_val": null, "adapter": "/r/run-1/adapter.pkl",
                "message": null, "cact": null, "suggested_cact": "/r/run-1/smart_home.cact"
            },
            "curve": {"train": [[1, 8.0]], "val": []}
        });
        let earlier = dir.path().join(EARLIER_FOLDER).join("run-1");
        std::fs::create_dir_all(&earlier).unwrap();
        std::fs::write(earlier.join(EARLIER_RECORD), serde_json::to_vec_pretty(&old).unwrap()).unwrap();
        let history = Records::open(dir.path());
        assert_eq!(history.list(None).len(), 1, "the earlier folder is taken over");
        let record = history.load("run-1").unwrap();
        assert_eq!(record.entry.request, request());
        assert_eq!((record.entry.status, record.entry.steps_done), (TrainingStatus::Finished, 3));
        assert_eq!(record.curve.train, [(1, 8.0)]);
        // Saved again, it is written in the new form, under the new name, and reads back the same.
        history.save(&record).unwrap();
        let folder = dir.path().join(FOLDER).join("run-1");
        assert!(!folder.join(EARLIER_RECORD).exists() && !dir.path().join(EARLIER_FOLDER).exists());
        let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(folder.join(RECORD)).unwrap()).unwrap();
        assert_eq!(saved["entry"]["request"]["dataset"], "/data/smart_home.jsonl");
        assert_eq!(history.load("run-1").unwrap(), record);
    }

    #[test]
    fn a_training_left_running_reads_as_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let history = Records::open(dir.path());
        let (record, _) = history.create(&request()).unwrap();
        let listed = history.list(None);
        assert_eq!(listed[0].status, TrainingStatus::Interrupted);
        assert!(listed[0].message.as_deref().unwrap().contains("interrupted"));
        assert_eq!(history.load(&record.entry.id).unwrap().entry.status, TrainingStatus::Running);
    }

    fn built(path: &str, layers: Option<usize>) -> CactInfo {
        CactInfo {
            path: path.into(),
            bytes: 1,
            tensors: 1,
            scheme: "W4A8".into(),
            rows: None,
            scores_error: None,
            published: None,
            layers,
        }
    }

    #[test]
    fn a_rung_is_recorded_beside_the_whole_model_never_in_its_place() {
        let dir = tempfile::tempdir().unwrap();
        let history = Records::open(dir.path());
        let (mut record, _) = history.create(&request()).unwrap();
        record.entry.record_built(built("/out/tuned.cact", None));
        record.entry.record_built(built("/out/tuned-2-layers.cact", Some(2)));
        record.entry.record_built(built("/out/tuned-3-layers.cact", Some(3)));
        record.entry.record_built(built("/out/tuned-2-layers.cact", Some(2)));
        assert_eq!(record.entry.cact, Some(built("/out/tuned.cact", None)));
        let rungs: Vec<_> = record.entry.rungs.iter().map(|rung| rung.layers).collect();
        assert_eq!(rungs, [Some(3), Some(2)], "a rung built again replaces its record");
        // The whole model written over a rung's file: that rung's file is gone.
        record.entry.record_built(built("/out/tuned-3-layers.cact", None));
        assert_eq!(record.entry.rungs, [built("/out/tuned-2-layers.cact", Some(2))]);

        // A record from when a rung took the whole model's place reads with it among the rungs.
        record.entry.cact = Some(built("/out/tuned-4-layers.cact", Some(4)));
        record.entry.rungs.clear();
        history.save(&record).unwrap();
        let read = history.load(&record.entry.id).unwrap().entry;
        assert_eq!((read.cact, read.rungs), (None, vec![built("/out/tuned-4-layers.cact", Some(4))]));
    }

    #[test]
    fn ids_cannot_leave_the_trainings_folder() {
        let history = Records::open(Path::new("/tmp/needle-history-test"));
        assert_eq!(history.load("../settings").unwrap_err(), "no training \"../settings\"");
    }
}
