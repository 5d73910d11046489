//! Past runs, one folder each under the app's data directory: `runs/<id>/run.json` (settings, status,
//! losses, outputs) beside the run's adapter and `.cact`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use needle_engine::calls::{CallScores, ModelScore};
use needle_engine::config::Generation;
use needle_engine::settings::TrainSettings;
use serde::{Deserialize, Serialize};

use crate::run_request::RunRequest;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
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
    /// Held-out loss and exact-call accuracy of the file's own (dequantized) weights, on the
    /// examples the run's scores used; `None` without a validation split.
    #[serde(default)]
    pub scores: Option<ModelScore>,
    /// Why the file could not be scored, when it could not.
    #[serde(default)]
    pub scores_error: Option<String>,
}

/// One run as the History panel lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub id: String,
    /// Unix seconds.
    pub started_at: u64,
    pub dataset: PathBuf,
    pub checkpoint: PathBuf,
    pub tokenizer: PathBuf,
    pub device: String,
    /// The backend and device the worker reported, e.g. `cpu (AMD EPYC)`.
    pub backend: Option<String>,
    pub settings: TrainSettings,
    pub status: Status,
    pub seconds: Option<f64>,
    pub steps_done: usize,
    pub steps: usize,
    pub final_loss: Option<f32>,
    pub final_val: Option<f32>,
    /// Set once the worker has saved one (after the first epoch, or at a cancel).
    pub adapter: Option<PathBuf>,
    /// Why a run failed or stopped.
    pub message: Option<String>,
    pub cact: Option<CactInfo>,
    /// Held-out loss and exact-call accuracy of the base and the tuned model, when the run finished.
    #[serde(default)]
    pub scores: Option<CallScores>,
    /// Where Build writes unless the user picks another file.
    pub suggested_cact: PathBuf,
    /// Whether Resume can continue it: it ended early with its training state saved. Derived
    /// when the entry is listed, never stored.
    #[serde(default, skip_deserializing)]
    pub resumable: bool,
}

/// The losses behind a run's chart: `(step, loss)` per training step and per epoch's validation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    pub train: Vec<(usize, f32)>,
    pub val: Vec<(usize, f32)>,
}

/// What `run.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub entry: HistoryEntry,
    pub curve: Curve,
}

/// The `runs/` folder.
#[derive(Debug, Clone)]
pub struct History {
    dir: PathBuf,
}

const RECORD: &str = "run.json";

impl History {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// A new run's record and folder; the adapter goes in that folder.
    pub fn create(&self, request: &RunRequest) -> Result<(RunRecord, PathBuf), String> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let id = format!("run-{}", now.as_millis());
        let dir = self.dir.join(&id);
        std::fs::create_dir_all(&dir)
            .map_err(|error| format!("could not create the run folder {}: {error}", dir.display()))?;
        let stem = request.dataset.file_stem().map_or_else(|| "needle".into(), |s| s.to_string_lossy().into_owned());
        let entry = HistoryEntry {
            id,
            started_at: now.as_secs(),
            dataset: request.dataset.clone(),
            checkpoint: request.checkpoint.clone(),
            tokenizer: request.tokenizer.clone(),
            device: request.device.clone(),
            backend: None,
            settings: request.settings,
            status: Status::Running,
            seconds: None,
            steps_done: 0,
            steps: 0,
            final_loss: None,
            final_val: None,
            adapter: None,
            message: None,
            cact: None,
            scores: None,
            suggested_cact: dir.join(format!("{stem}.cact")),
            resumable: false,
        };
        let record = RunRecord { entry, curve: Curve::default() };
        self.save(&record)?;
        let adapter = self.adapter_path(&record.entry);
        Ok((record, adapter))
    }

    /// Where a run saves its adapter (and, beside it, the state Resume continues from), in the
    /// file its base's own package reads: 2.x's pickle for Needle 2, 3.x's safetensors for Needle 3.
    pub fn adapter_path(&self, entry: &HistoryEntry) -> PathBuf {
        let name = match needle_engine::checkpoint::file_generation(&entry.checkpoint) {
            Some(Generation::Needle3) => "adapter.safetensors",
            _ => "adapter.pkl",
        };
        self.dir.join(&entry.id).join(name)
    }

    pub fn save(&self, record: &RunRecord) -> Result<(), String> {
        let path = self.dir.join(&record.entry.id).join(RECORD);
        let json = serde_json::to_vec_pretty(record).map_err(|e| e.to_string())?;
        needle_engine::atomic::write_atomically(&path, &json)
            .map_err(|error| format!("could not save the run record {}: {error}", path.display()))
    }

    pub fn load(&self, id: &str) -> Result<RunRecord, String> {
        // Ids name folders: refuse anything that could reach outside `runs/`.
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(format!("no run {id:?}"));
        }
        read_record(&self.dir.join(id).join(RECORD))
    }

    /// Every readable run, newest first, as [`Self::listed`] shows it.
    pub fn list(&self, active: Option<&str>) -> Vec<HistoryEntry> {
        let Ok(folders) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut entries: Vec<HistoryEntry> = folders
            .filter_map(|folder| read_record(&folder.ok()?.path().join(RECORD)).ok())
            .map(|record| self.listed(record.entry, active))
            .collect();
        entries.sort_by(|a, b| b.id.cmp(&a.id));
        entries
    }

    /// A run as the window sees it. One still marked running that is not `active` was cut short
    /// by the app dying; it reads as interrupted. One that ended early with its training state
    /// saved can be resumed.
    pub fn listed(&self, mut entry: HistoryEntry, active: Option<&str>) -> HistoryEntry {
        if entry.status == Status::Running && active != Some(entry.id.as_str()) {
            entry.status = Status::Interrupted;
            entry.message = Some("interrupted: the app closed while this run was going".into());
        }
        let ended_early = matches!(entry.status, Status::Stopped | Status::Failed | Status::Interrupted);
        let state = needle_engine::train::state::state_path(&self.adapter_path(&entry));
        entry.resumable = ended_early && entry.steps_done < entry.steps && state.is_file();
        entry
    }
}

/// The most a run record may hold: a long run's loss curve is a few MB; more is not a record.
const RECORD_LIMIT: u64 = 64 << 20;

fn read_record(path: &Path) -> Result<RunRecord, String> {
    let bytes = read_limited(path, RECORD_LIMIT)?;
    serde_json::from_slice(&bytes).map_err(|error| format!("{} is not a run record: {error}", path.display()))
}

/// The bytes of one of the app's own files, refusing one larger than `limit` before reading it: a
/// stray huge file in the app's folder must not cost the window its memory.
pub fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    let file = std::fs::File::open(path).map_err(|error| format!("could not read {}: {error}", path.display()))?;
    std::io::Read::take(file, limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("could not read {}: {error}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(format!("{} is larger than {limit} bytes, too large for what it should hold", path.display()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use needle_engine::settings::presets;

    fn request() -> RunRequest {
        RunRequest {
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
        let history = History::new(dir.path().to_path_buf());
        let (mut first, adapter) = history.create(&request()).unwrap();
        assert_eq!(adapter, dir.path().join(&first.entry.id).join("adapter.pkl"));
        assert!(first.entry.suggested_cact.ends_with("smart_home.cact"));
        first.entry.status = Status::Finished;
        first.curve.train.push((1, 2.5));
        history.save(&first).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let (second, _) = history.create(&request()).unwrap();
        assert_eq!(history.load(&first.entry.id).unwrap(), first);
        let listed = history.list(Some(&second.entry.id));
        assert_eq!(listed, vec![second.entry.clone(), first.entry.clone()]);
    }

    #[test]
    fn a_run_left_running_reads_as_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let history = History::new(dir.path().to_path_buf());
        let (record, _) = history.create(&request()).unwrap();
        let listed = history.list(None);
        assert_eq!(listed[0].status, Status::Interrupted);
        assert!(listed[0].message.as_deref().unwrap().contains("interrupted"));
        assert_eq!(history.load(&record.entry.id).unwrap().entry.status, Status::Running);
    }

    #[test]
    fn ids_cannot_leave_the_runs_folder() {
        let history = History::new(PathBuf::from("/tmp/needle-history-test"));
        assert_eq!(history.load("../settings").unwrap_err(), "no run \"../settings\"");
    }

    #[test]
    fn a_file_over_its_limit_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.json");
        std::fs::write(&path, vec![b' '; 2048]).unwrap();
        let error = read_limited(&path, 1024).unwrap_err();
        assert!(error.contains("run.json") && error.contains("larger than 1024 bytes"), "{error}");
        assert_eq!(read_limited(&path, 4096).unwrap().len(), 2048);
    }
}
