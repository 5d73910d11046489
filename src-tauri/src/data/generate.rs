//! More examples for the chosen dataset, from the app: `needle generate-data --augment DATA --events
//! jsonl` in the worker, its progress passed on, Cancel keeping what arrived (a second Cancel ends
//! the worker), and the new rows read back from the written file; when asked, an acceptance suite
//! for the same tools after them (`--suite`, or the suite alone with no new rows), which Evaluate's
//! Acceptance section is offered. The key reaches the worker through its environment
//! ([`crate::secrets`]). One generation at a time.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use needle_engine::generate::{
    self, DEFAULT_BATCH_SIZE, DEFAULT_ENDPOINT, DEFAULT_MODEL, DEFAULT_NUM_SAMPLES, DEFAULT_SUITE_CASES,
};
use needle_engine::suite::Category;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tauri::ipc::Channel;

use crate::ground::{ending_in, lock};
use crate::secrets::keys::{KeySource, Keys};
use crate::worker::job::{Job, SuiteOut};
use crate::worker::process::{CancelAnswer, Exit, Line, Process, Watcher, Worker};

/// How many of the new rows the window is shown (the file has them all).
const SHOWN_ROWS: usize = 50;

/// The most rows one generation may ask for.
const MAX_COUNT: usize = 100_000;

/// The most cases one suite may ask for: a bound against a slip of the keyboard (upstream's suites
/// have 32, and the LLM is asked a few times at most).
const MAX_SUITE_CASES: usize = 1_000;

/// What the window sends: each field as typed.
#[derive(Debug, Clone, Deserialize)]
pub struct GenerateRequest {
    /// The dataset to write more of: its tools are asked for, and its rows come first in the output.
    pub dataset: PathBuf,
    /// Where the originals and the new rows go [default: `DATA.augmented.jsonl`].
    pub output: PathBuf,
    pub count: String,
    /// [default: the reference's model]
    pub model: String,
    /// An OpenAI-compatible chat-completions URL [default: `OPENROUTER_URL`, else OpenRouter's].
    pub endpoint: String,
    /// The share of the new rows that must get no call (0.3 for 30%) [default, empty: the LLM's own mix].
    #[serde(default)]
    pub negative_share: String,
    /// Also write an acceptance suite for the same tools (with a count of 0, the suite alone).
    #[serde(default)]
    pub suite: bool,
    /// Where the suite goes [default, empty: beside the output, as `OUT.suite.json`].
    #[serde(default)]
    pub suite_path: PathBuf,
    /// Cases in the suite [default, empty: upstream's 32].
    #[serde(default)]
    pub suite_cases: String,
}

/// What the Generate form starts with.
#[derive(Debug, Clone, Serialize)]
pub struct GenerateSetup {
    pub count: usize,
    /// Cases in a suite, as upstream's.
    pub suite_cases: usize,
    pub model: &'static str,
    /// The endpoint used when the field is left empty.
    pub endpoint: String,
    pub key: KeySource,
    pub state: GenerationState,
}

/// The generation as the app last heard of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum GenerationState {
    Idle,
    Running {
        generated: usize,
        wanted: usize,
        failed_requests: usize,
        /// Rows not kept so far, by reason (the doctor's kinds, `duplicate_row`, ...).
        rejected: BTreeMap<String, usize>,
        /// Cancel was pressed: what arrived is being written.
        stopping: bool,
        /// The suite's cases so far, once the rows are written and the suite is being asked for.
        suite: Option<SuiteProgress>,
    },
    Written(Box<Outcome>),
    Failed {
        message: String,
    },
}

/// What a generation wrote: the rows, the suite, or both.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The dataset's file (its rows, then the new ones); none when the suite alone was asked for.
    pub data: Option<Written>,
    /// The acceptance suite, where one was asked for and written.
    pub suite: Option<SuiteWritten>,
    /// Why the suite asked for was not written, where the rows were.
    pub suite_failed: Option<String>,
}

/// The suite's cases so far (the worker's `suite_progress` line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteProgress {
    pub cases: usize,
    pub wanted: usize,
    pub failed_requests: usize,
    /// Cases not kept so far, by reason (`ungrounded`, `repeated_query`, ...).
    pub rejected: BTreeMap<String, usize>,
}

/// The suite is written (the worker's `suite_written` line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteWritten {
    pub path: PathBuf,
    pub cases: usize,
    /// Cases asked for and written, per category (no invalid one asked for when no tool has an enum
    /// or a bound).
    pub wanted: BTreeMap<Category, usize>,
    pub written: BTreeMap<Category, usize>,
    pub failed_requests: usize,
    pub rejected: BTreeMap<String, usize>,
    /// Stopped by Cancel before the suite was whole.
    pub cancelled: bool,
}

/// The file is written: the originals, then the new rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Written {
    pub path: PathBuf,
    /// Rows in the file.
    pub written: usize,
    /// New rows among them (the last ones).
    pub generated: usize,
    pub wanted: usize,
    pub failed_requests: usize,
    pub rejected: BTreeMap<String, usize>,
    /// Kept rows the doctor has advice about, by kind.
    pub advice: BTreeMap<String, usize>,
    /// Stopped by Cancel before the count was reached.
    pub cancelled: bool,
    /// The first new rows, as written.
    #[serde(default)]
    pub rows: Vec<Value>,
}

/// What the window hears: each reply's progress, each failed request, then the outcome.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GenerateMessage {
    Progress { state: GenerationState },
    RequestFailed { message: String },
    Finished { state: GenerationState },
}

/// The worker's `--events jsonl` lines (`needle_engine::generate::GenerateEvent`, the CLI's `written`,
/// then with a suite the engine's `suite_progress` and the CLI's `suite_written`).
#[derive(Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Printed {
    Progress { generated: usize, wanted: usize, failed_requests: usize, rejected: BTreeMap<String, usize> },
    RequestFailed { message: String },
    Written(Box<Written>),
    SuiteProgress(SuiteProgress),
    SuiteWritten(Box<SuiteWritten>),
}

/// The one generation slot: its state and its worker.
#[derive(Default)]
pub struct Generations(Mutex<Slot>);

#[derive(Default)]
struct Slot {
    state: Option<GenerationState>,
    process: Option<Arc<Process>>,
}

impl Generations {
    pub fn state(&self) -> GenerationState {
        lock(&self.0).state.clone().unwrap_or(GenerationState::Idle)
    }

    /// First press: the worker stops asking and writes what arrived. Second press: it is ended.
    pub fn cancel(&self) -> CancelAnswer {
        let mut slot = lock(&self.0);
        let Slot { state, process: Some(process) } = &mut *slot else { return CancelAnswer::Idle };
        match state {
            Some(GenerationState::Running { stopping, .. }) => process.cancel(stopping),
            _ => {
                process.kill();
                CancelAnswer::Killed
            }
        }
    }

    /// The generation's state after `change` (a running one's `stopping` is Cancel's to set).
    fn update(&self, change: impl FnOnce(&mut GenerationState)) -> GenerationState {
        let mut slot = lock(&self.0);
        let state = slot.state.get_or_insert(GenerationState::Idle);
        change(state);
        state.clone()
    }

    fn finish(&self, state: GenerationState) {
        let mut slot = lock(&self.0);
        slot.state = Some(state);
        slot.process = None;
    }
}

/// What the Generate form starts with: the defaults, where the key comes from, and the generation
/// in progress or last finished.
pub fn setup(key: &Keys, generations: &Generations) -> GenerateSetup {
    let endpoint = std::env::var(generate::ENDPOINT_VAR)
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or(DEFAULT_ENDPOINT.into());
    GenerateSetup {
        count: DEFAULT_NUM_SAMPLES,
        suite_cases: DEFAULT_SUITE_CASES,
        model: DEFAULT_MODEL,
        endpoint,
        key: key.source(),
        state: generations.state(),
    }
}

/// The output file as the window names it: its choice (always a `.jsonl`), else beside the dataset as
/// `--augment` names it.
pub fn output_path(dataset: &Path, output: &Path) -> PathBuf {
    if output.as_os_str().is_empty() {
        return generate::augmented_path(dataset);
    }
    ending_in(output, "jsonl")
}

/// The suite file as the window names it: its choice (always a `.json`), else beside the rows'
/// file `output` as `OUT.suite.json` (never the dataset's own name: a suite hand-made for it, as the
/// bundled example's, may lie beside it).
fn suite_path(dataset: &Path, output: &Path, typed: &Path) -> PathBuf {
    if !typed.as_os_str().is_empty() {
        return ending_in(typed, "json");
    }
    let beside = output.with_extension("suite.json");
    if beside == dataset.with_extension("suite.json") {
        // The rows are written over the dataset itself: its augmented name's suite instead.
        return generate::augmented_path(dataset).with_extension("suite.json");
    }
    beside
}

/// The count of new rows as typed: from 1, or from 0 when a suite is asked for (the suite alone).
fn count(typed: &str, suite: bool) -> Result<usize, String> {
    let least = usize::from(!suite);
    match typed.trim().parse() {
        Ok(count) if (least..=MAX_COUNT).contains(&count) => Ok(count),
        _ if suite => Err(format!("Count: a whole number from 0 (the suite alone) to {MAX_COUNT}")),
        _ => Err(format!("Count: a whole number from 1 to {MAX_COUNT} (0 with a suite ticked: the suite alone)")),
    }
}

/// The suite's cases as typed: empty for upstream's size, else a whole number from 1.
fn suite_cases(typed: &str) -> Result<usize, String> {
    let typed = typed.trim();
    if typed.is_empty() {
        return Ok(DEFAULT_SUITE_CASES);
    }
    typed
        .parse()
        .ok()
        .filter(|n| (1..=MAX_SUITE_CASES).contains(n))
        .ok_or_else(|| format!("Suite cases: a whole number from 1 to {MAX_SUITE_CASES} (upstream's suites have 32)"))
}

/// The no-call share as typed: empty for none, else a number from 0 to 1.
fn negative_share(typed: &str) -> Result<Option<f64>, String> {
    let typed = typed.trim();
    if typed.is_empty() {
        return Ok(None);
    }
    match typed.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(Some(share)),
        _ => Err("No-call share: a share from 0 to 1 (0.3 for 30%), or empty for the model's own mix".into()),
    }
}

/// A generation as asked: the worker's job, the new rows it wants and the suite's cases, if any.
struct Asked {
    job: Job,
    count: usize,
    suite_cases: Option<usize>,
}

/// What `request` asks of the worker, each field checked; a field that does not read is named.
fn asked(request: &GenerateRequest) -> Result<Asked, String> {
    let count = count(&request.count, request.suite)?;
    let negative_share = negative_share(&request.negative_share)?;
    let suite_cases = request.suite.then(|| suite_cases(&request.suite_cases)).transpose()?;
    if request.dataset.as_os_str().is_empty() {
        return Err("choose a dataset first: its tools are what the new examples call".into());
    }
    let output = output_path(&request.dataset, &request.output);
    let suite =
        suite_cases.map(|cases| SuiteOut { path: suite_path(&request.dataset, &output, &request.suite_path), cases });
    let model = Some(request.model.trim()).filter(|m| !m.is_empty()).unwrap_or(DEFAULT_MODEL);
    let job = Job::Generate {
        dataset: request.dataset.clone(),
        count,
        // A few rows are asked for in batches of that few: no request writes rows nobody keeps, and
        // the bar moves with each reply. (No rows, the suite alone: the batch is never asked.)
        batch_size: DEFAULT_BATCH_SIZE.min(count.max(1)),
        negative_share,
        model: model.into(),
        endpoint: Some(request.endpoint.trim()).filter(|url| !url.is_empty()).map(Into::into),
        output,
        suite,
    };
    Ok(Asked { job, count, suite_cases })
}

/// A suite none of whose cases has arrived yet.
fn suite_begun(wanted: usize) -> SuiteProgress {
    SuiteProgress { cases: 0, wanted, failed_requests: 0, rejected: BTreeMap::new() }
}

/// Starts writing `request.count` more rows of `request.dataset`, then the suite when one is asked
/// for; the outcome comes on `channel`.
pub fn start(
    worker: &Worker,
    key: &Keys,
    generations: &Arc<Generations>,
    request: &GenerateRequest,
    channel: Channel<GenerateMessage>,
) -> Result<(), String> {
    let Asked { job, count, suite_cases } = asked(request)?;
    let env = key.worker_env();
    let env: Vec<(&str, Option<&str>)> = env.iter().map(|(name, value)| (*name, value.as_deref())).collect();

    let mut slot = lock(&generations.0);
    if slot.process.is_some() {
        return Err("examples are already being generated: cancel that or wait for it".into());
    }
    let running = GenerationState::Running {
        generated: 0,
        wanted: count,
        failed_requests: 0,
        rejected: BTreeMap::new(),
        stopping: false,
        // No rows asked for: the suite is asked for at once.
        suite: suite_cases.filter(|_| count == 0).map(suite_begun),
    };
    let watcher =
        GenerateWatcher { generations: Arc::clone(generations), channel, suite_cases, written: None, suite: None };
    // Spawned under the slot's lock: the watcher's first update waits until the process is in the slot.
    let process = worker.spawn_with_env(&job, &env, watcher)?;
    *slot = Slot { state: Some(running), process: Some(process) };
    Ok(())
}

struct GenerateWatcher {
    generations: Arc<Generations>,
    channel: Channel<GenerateMessage>,
    /// The suite's cases asked for, where a suite was.
    suite_cases: Option<usize>,
    written: Option<Box<Written>>,
    suite: Option<Box<SuiteWritten>>,
}

impl Watcher for GenerateWatcher {
    fn line(&mut self, line: Line) {
        // Stderr only matters if the worker fails; `Exit` keeps its tail.
        let Line::Stdout(text) = line else { return };
        let Ok(printed) = serde_json::from_str::<Printed>(&text) else { return };
        match printed {
            Printed::RequestFailed { message } => self.send(GenerateMessage::RequestFailed { message }),
            Printed::Written(written) => {
                // The rows are written; the suite, when one was asked for, is asked for next.
                if let Some(cases) = self.suite_cases.filter(|_| !written.cancelled) {
                    self.progress(|suite| *suite = Some(suite_begun(cases)));
                }
                self.written = Some(written);
            }
            Printed::SuiteWritten(suite) => self.suite = Some(suite),
            Printed::Progress { generated, wanted, failed_requests, rejected } => {
                let state = self.generations.update(|state| {
                    if let GenerationState::Running {
                        generated: g, wanted: w, failed_requests: f, rejected: r, ..
                    } = state
                    {
                        (*g, *w, *f, *r) = (generated, wanted, failed_requests, rejected);
                    }
                });
                self.send(GenerateMessage::Progress { state });
            }
            Printed::SuiteProgress(progress) => self.progress(|suite| *suite = Some(progress)),
        }
    }

    fn exit(mut self, exit: Exit) {
        let data = self.written.take().map(|mut written| {
            written.rows = new_rows(&written.path, written.written.saturating_sub(written.generated));
            *written
        });
        let failure =
            |what: &str| if exit.killed { format!("{what} was ended by a second Cancel") } else { exit.describe(what) };
        let state = outcome(data, self.suite.take().map(|suite| *suite), self.suite_cases.is_some(), failure);
        self.generations.finish(state.clone());
        self.send(GenerateMessage::Finished { state });
    }
}

impl GenerateWatcher {
    fn send(&self, message: GenerateMessage) {
        // A closed window drops its channel; the file is written all the same.
        let _ = self.channel.send(message);
    }

    /// The suite's progress changed: the window hears the running state.
    fn progress(&self, change: impl FnOnce(&mut Option<SuiteProgress>)) {
        let state = self.generations.update(|state| {
            if let GenerationState::Running { suite, .. } = state {
                change(suite);
            }
        });
        self.send(GenerateMessage::Progress { state });
    }
}

/// How a generation ended: what it wrote, or, where it wrote nothing, why (`failure` says why the
/// worker stopped, of what it names). A suite asked for and not written, after the rows were, says
/// why beside them.
fn outcome(
    data: Option<Written>,
    suite: Option<SuiteWritten>,
    suite_asked: bool,
    failure: impl Fn(&str) -> String,
) -> GenerationState {
    if data.is_none() && suite.is_none() {
        return GenerationState::Failed {
            message: format!("{}; nothing was written", failure("the generation worker")),
        };
    }
    let suite_failed = (suite_asked && suite.is_none()).then(|| match &data {
        Some(data) if data.cancelled => "no suite was written: Cancel stopped the generation".into(),
        _ => failure("the suite's generation"),
    });
    GenerationState::Written(Box::new(Outcome { data, suite, suite_failed }))
}

/// The first [`SHOWN_ROWS`] rows of `path` after its first `originals` lines: the new ones.
fn new_rows(path: &Path, originals: usize) -> Vec<Value> {
    let Ok(file) = std::fs::File::open(path) else { return Vec::new() };
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    let mut rows = Vec::new();
    let mut number = 0;
    while rows.len() < SHOWN_ROWS && reader.read_until(b'\n', &mut line).is_ok_and(|read| read > 0) {
        number += 1;
        if number > originals {
            rows.extend(serde_json::from_slice::<Value>(&line).ok());
        }
        line.clear();
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(count: &str, suite: bool) -> GenerateRequest {
        GenerateRequest {
            dataset: "/data/smart_home.jsonl".into(),
            output: PathBuf::new(),
            count: count.into(),
            model: String::new(),
            endpoint: String::new(),
            negative_share: String::new(),
            suite,
            suite_path: PathBuf::new(),
            suite_cases: String::new(),
        }
    }

    /// The rows and the suite the worker is asked for.
    fn asks(request: &GenerateRequest) -> Result<(usize, Option<SuiteOut>), String> {
        match asked(request)?.job {
            Job::Generate { count, suite, .. } => Ok((count, suite)),
            other => panic!("a generation asked for {other:?}"),
        }
    }

    #[test]
    fn no_new_rows_are_the_suite_alone_and_without_a_suite_an_error_naming_the_count() {
        let alone = asks(&request("0", true)).unwrap();
        let beside = PathBuf::from("/data/smart_home.augmented.suite.json");
        assert_eq!(alone, (0, Some(SuiteOut { path: beside, cases: DEFAULT_SUITE_CASES })));
        let error = asks(&request("0", false)).unwrap_err();
        assert!(error.starts_with("Count:") && error.contains("suite alone"), "{error}");
        assert_eq!(asks(&request(" 6 ", false)).unwrap(), (6, None));
        for typed in ["-1", "six", "100001"] {
            for suite in [false, true] {
                let error = asks(&request(typed, suite)).unwrap_err();
                assert!(error.starts_with("Count:"), "{typed}: {error}");
            }
        }
    }

    #[test]
    fn the_suite_goes_beside_the_rows_file_unless_chosen_and_its_cases_are_checked() {
        let chosen = GenerateRequest {
            output: "/out/more".into(),
            suite_path: "/suites/home".into(),
            suite_cases: "8".into(),
            ..request("6", true)
        };
        let (_, suite) = asks(&chosen).unwrap();
        assert_eq!(suite, Some(SuiteOut { path: "/suites/home.json".into(), cases: 8 }), "a .json, as chosen");
        let beside = GenerateRequest { output: "/out/more.jsonl".into(), ..request("6", true) };
        assert_eq!(asks(&beside).unwrap().1.map(|suite| suite.path), Some("/out/more.suite.json".into()));
        // Rows written over the dataset leave the suite hand-made for it alone.
        let over = GenerateRequest { output: "/data/smart_home.jsonl".into(), ..request("6", true) };
        let suite = asks(&over).unwrap().1.map(|suite| suite.path);
        assert_eq!(suite, Some("/data/smart_home.augmented.suite.json".into()));
        for typed in ["0", "x", "1001"] {
            let error = asks(&GenerateRequest { suite_cases: typed.into(), ..request("6", true) }).unwrap_err();
            assert!(error.starts_with("Suite cases:"), "{typed}: {error}");
        }
        // Unticked, the suite's fields are not read.
        let unticked = GenerateRequest { suite_cases: "x".into(), ..request("6", false) };
        assert_eq!(asks(&unticked).unwrap(), (6, None));
    }

    /// The worker's last lines for rows and a suite, as `needle generate-data --events jsonl` prints them.
    fn printed() -> (Written, SuiteWritten) {
        let rows = r#"{"event":"written","path":"/d/more.jsonl","written":30,"generated":6,"wanted":6,
            "failed_requests":0,"rejected":{},"advice":{},"cancelled":false}"#;
        let suite = r#"{"event":"suite_written","path":"/d/more.suite.json","cases":3,
            "wanted":{"positive":2,"missing":1},"written":{"positive":2,"missing":1},"failed_requests":0,
            "rejected":{"ungrounded":1},"cancelled":false}"#;
        match (serde_json::from_str(rows), serde_json::from_str(suite)) {
            (Ok(Printed::Written(rows)), Ok(Printed::SuiteWritten(suite))) => (*rows, *suite),
            _ => panic!("the worker's lines are not read as written rows and suite"),
        }
    }

    #[test]
    fn the_outcome_holds_what_was_written_and_why_a_suite_was_not() {
        let (rows, suite) = printed();
        assert_eq!(suite.written.get(&Category::Missing), Some(&1));
        let failure = |what: &str| format!("{what} failed");
        let ended =
            |data: Option<Written>, suite: Option<SuiteWritten>, asked| match outcome(data, suite, asked, failure) {
                GenerationState::Written(outcome) => Ok(*outcome),
                GenerationState::Failed { message } => Err(message),
                other => panic!("a generation ended {other:?}"),
            };
        let both = ended(Some(rows.clone()), Some(suite.clone()), true).unwrap();
        assert_eq!((both.data.as_ref(), both.suite.as_ref(), both.suite_failed), (Some(&rows), Some(&suite), None));
        let alone = ended(None, Some(suite.clone()), true).unwrap();
        assert!(alone.data.is_none() && alone.suite.is_some());
        let broke = ended(Some(rows.clone()), None, true).unwrap();
        assert_eq!(broke.suite_failed.as_deref(), Some("the suite's generation failed"));
        let cancelled = Written { cancelled: true, ..rows.clone() };
        let stopped = ended(Some(cancelled), None, true).unwrap();
        assert!(stopped.suite_failed.is_some_and(|why| why.contains("Cancel")));
        assert_eq!(ended(Some(rows), None, false).unwrap().suite_failed, None, "no suite was asked for");
        let nothing = ended(None, None, true).unwrap_err();
        assert_eq!(nothing, "the generation worker failed; nothing was written");
    }
}
