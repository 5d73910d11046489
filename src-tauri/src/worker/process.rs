//! The worker process: the `needle` CLI run as a child of the app, speaking `--events jsonl`.
//!
//! Training and building happen there, never in the window's process: an out-of-memory kill, a driver
//! crash or a second Cancel ends the worker, and the app reports what happened. The worker is the app's
//! own binary in worker mode (`needle-studio worker finetune …`), or the `needle` a bundle ships beside
//! the app ([`super::engine`] chooses).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::time::Duration;

use crate::ground::lock;
use crate::worker::job::Job;

/// The first argument that puts the app's binary in worker mode.
pub const WORKER_ARG: &str = "worker";

/// How many of the worker's last stderr lines a crash report quotes.
const STDERR_TAIL: usize = 8;

/// A program that runs `needle` subcommands. Clones share one list of the processes they started, so
/// that the app can end every one of them when it exits.
#[derive(Debug, Clone)]
pub struct Worker {
    program: PathBuf,
    leading: Vec<OsString>,
    processes: Arc<Mutex<Processes>>,
}

/// The processes a worker's clones started, and whether the app has closed them for good.
#[derive(Debug, Default)]
struct Processes {
    running: Vec<Weak<Process>>,
    /// Set by [`Worker::kill_all`]: a process started after it would outlive the app.
    closed: bool,
}

/// What starting a worker answers once the app is closing.
const CLOSING: &str = "the app is closing, so no worker starts";

/// Where a short command runs when a newer one of its kind replaces it (see [`Worker::output_in`]).
pub type Slot = Mutex<Option<Arc<Process>>>;

/// What a short command's caller hears when a newer command in its [`Slot`] ended it.
pub const SUPERSEDED: &str = "superseded by a newer request";

/// The answer to Cancel, for a worker that stops at its next step when asked (a training, a
/// generation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelAnswer {
    /// Nothing was running any more.
    Idle,
    /// The worker stops after its current step and keeps what it has.
    Stopping,
    /// A second Cancel: the worker was ended at once.
    Killed,
}

/// One line the worker printed.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Stdout(String),
    Stderr(String),
}

/// How a worker ended, with the end of what it said on stderr.
#[derive(Debug)]
pub struct Exit {
    pub status: std::io::Result<ExitStatus>,
    pub stderr_tail: Vec<String>,
    /// The app killed it (a second Cancel).
    pub killed: bool,
}

/// What follows a running worker: every line it prints, in order, then how it ended. Both are called
/// on one thread of its own.
pub trait Watcher: Send + 'static {
    fn line(&mut self, line: Line);
    fn exit(self, exit: Exit);
}

/// A running worker: ask it to stop, or kill it.
#[derive(Debug)]
pub struct Process {
    child: Mutex<Child>,
    stdin: Mutex<Option<ChildStdin>>,
    killed: AtomicBool,
}

impl Worker {
    /// The app's own binary in worker mode.
    pub fn this_app() -> std::io::Result<Self> {
        Ok(Self::app(std::env::current_exe()?))
    }

    /// The app binary at `program` in worker mode.
    pub fn app(program: PathBuf) -> Self {
        Self { program, leading: vec![WORKER_ARG.into()], processes: Arc::default() }
    }

    /// A `needle` binary.
    pub fn needle(program: PathBuf) -> Self {
        Self { program, leading: Vec::new(), processes: Arc::default() }
    }

    /// The binary it runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    fn command(&self, job: &Job) -> Result<Command, String> {
        let mut command = Command::new(&self.program);
        command.args(&self.leading).args(job.argv()?);
        command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        #[cfg(windows)]
        {
            // CREATE_NO_WINDOW: a console worker must not flash a console window over the app.
            use std::os::windows::process::CommandExt;
            command.creation_flags(0x0800_0000);
        }
        Ok(command)
    }

    /// Runs a short job to the end; its stdout, or its error message.
    pub fn output(&self, job: &Job) -> Result<String, String> {
        self.output_in(&Slot::default(), job)
    }

    /// [`Self::output`] as the one command of `slot`: it ends the command running there, whose
    /// caller then gets [`SUPERSEDED`].
    pub fn output_in(&self, slot: &Slot, job: &Job) -> Result<String, String> {
        let (done, ended) = mpsc::channel();
        // Spawned under the slot's lock, so the process that ends up there is the latest request's.
        let mut current = lock(slot);
        let process = self.spawn(job, Collect { stdout: String::new(), done })?;
        if let Some(older) = current.replace(process) {
            older.kill();
        }
        drop(current);
        collected(ended.recv().map_err(|_| WATCHER_GONE.to_string())?)
    }

    /// Runs a short job whose exit status is a verdict, as `needle suite`'s is (0: held, 1: not); its
    /// stdout for either, its error message for any other end.
    pub fn verdict_output(&self, job: &Job) -> Result<String, String> {
        let (done, ended) = mpsc::channel();
        let _process = self.spawn(job, Collect { stdout: String::new(), done })?;
        let (stdout, exit) = ended.recv().map_err(|_| WATCHER_GONE.to_string())?;
        match &exit.status {
            Ok(status) if status.code() == Some(1) => Ok(stdout),
            _ => collected((stdout, exit)),
        }
    }

    /// [`Self::output`] given until `deadline` to answer: one still running then is killed (a
    /// driver that never returns must not hold the app), and not waited for, since a process stuck
    /// in the kernel may outlive its kill.
    pub fn output_within(&self, job: &Job, deadline: Duration) -> Result<String, String> {
        let (done, ended) = mpsc::channel();
        let process = self.spawn(job, Collect { stdout: String::new(), done })?;
        match ended.recv_timeout(deadline) {
            Ok(answer) => collected(answer),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                process.kill();
                Err(format!("still silent after {} s, so it was stopped", deadline.as_secs_f32()))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(WATCHER_GONE.into()),
        }
    }

    /// Ends every worker still running, and starts none from now on: the app is closing.
    pub fn kill_all(&self) {
        let mut processes = lock(&self.processes);
        processes.closed = true;
        for process in processes.running.drain(..).filter_map(|process| process.upgrade()) {
            process.kill();
        }
    }

    /// Starts a long job followed by `watcher`.
    pub fn spawn(&self, job: &Job, watcher: impl Watcher) -> Result<Arc<Process>, String> {
        self.spawn_with_env(job, &[], watcher)
    }

    /// [`Self::spawn`] with these environment variables set (`Some`) or removed (`None`): how a secret
    /// such as an API key reaches the worker, never on its command line.
    pub fn spawn_with_env(
        &self,
        job: &Job,
        env: &[(&str, Option<&str>)],
        mut watcher: impl Watcher,
    ) -> Result<Arc<Process>, String> {
        let mut command = self.command(job)?;
        for (name, value) in env {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        // Started and listed under the list's lock, so that a `kill_all` comes either before (and
        // nothing starts) or after (and ends it).
        let mut processes = lock(&self.processes);
        if processes.closed {
            return Err(CLOSING.into());
        }
        let mut child = command.spawn().map_err(|error| self.start_error(&error))?;
        let (lines, received) = mpsc::channel();
        let stdout = child.stdout.take().map(|out| forward(out, lines.clone(), Line::Stdout));
        let stderr = child.stderr.take().map(|err| forward(err, lines, Line::Stderr));
        let process = Arc::new(Process {
            stdin: Mutex::new(child.stdin.take()),
            child: Mutex::new(child),
            killed: AtomicBool::new(false),
        });
        processes.running.retain(|process| process.strong_count() > 0);
        processes.running.push(Arc::downgrade(&process));
        drop(processes);
        let watched = Arc::clone(&process);
        std::thread::spawn(move || {
            let mut stderr_tail = Vec::new();
            // Ends when both pipes are closed, that is when the worker has exited.
            for line in received {
                if let Line::Stderr(text) = &line {
                    stderr_tail.push(text.clone());
                    if stderr_tail.len() > STDERR_TAIL {
                        stderr_tail.remove(0);
                    }
                }
                watcher.line(line);
            }
            for reader in [stdout, stderr].into_iter().flatten() {
                let _ = reader.join();
            }
            let status = lock(&watched.child).wait();
            watcher.exit(Exit { status, stderr_tail, killed: watched.killed.load(Ordering::Relaxed) });
        });
        Ok(process)
    }

    fn start_error(&self, error: &std::io::Error) -> String {
        format!("could not start the worker process {}: {error}", self.program.display())
    }
}

impl Process {
    /// Asks the worker to stop after its current step (it saves what it learned).
    pub fn ask_to_stop(&self) {
        if let Some(stdin) = lock(&self.stdin).as_mut() {
            // A worker that already exited has closed the pipe; then there is nothing to stop.
            let _ = writeln!(stdin, "{}", needle_cli::CANCEL_LINE).and_then(|()| stdin.flush());
        }
    }

    /// Ends the worker now.
    pub fn kill(&self) {
        self.killed.store(true, Ordering::Relaxed);
        let _ = lock(&self.child).kill();
    }

    /// Cancel pressed on a worker that stops at its next step: the first press (`stopping` still
    /// false) asks it to stop and keep what it has, a second ends it at once.
    pub fn cancel(&self, stopping: &mut bool) -> CancelAnswer {
        if *stopping {
            self.kill();
            return CancelAnswer::Killed;
        }
        *stopping = true;
        self.ask_to_stop();
        CancelAnswer::Stopping
    }
}

/// What a short command's caller hears if its watcher thread died (it panicked).
const WATCHER_GONE: &str = "the worker's watcher stopped unexpectedly";

/// A short command's stdout when it succeeded, else why not.
fn collected((stdout, exit): (String, Exit)) -> Result<String, String> {
    match exit.status {
        Ok(status) if status.success() => Ok(stdout),
        _ if exit.killed => Err(SUPERSEDED.into()),
        _ => Err(exit.describe("the worker")),
    }
}

/// Gathers a short command's stdout for [`Worker::output_in`].
struct Collect {
    stdout: String,
    done: mpsc::Sender<(String, Exit)>,
}

impl Watcher for Collect {
    fn line(&mut self, line: Line) {
        if let Line::Stdout(text) = line {
            self.stdout.push_str(&text);
            self.stdout.push('\n');
        }
    }

    fn exit(self, exit: Exit) {
        // The caller waits for this; it can only be gone if its thread panicked.
        let _ = self.done.send((self.stdout, exit));
    }
}

impl Exit {
    /// A sentence for the user about a worker that ended without reporting on stdout why. A clean
    /// failure is the CLI's own `error: …` sentence, which already names the file and the fix.
    pub fn describe(&self, what: &str) -> String {
        let last = self.stderr_tail.iter().rev().map(|line| line.trim()).find(|line| !line.is_empty());
        if let (Ok(status), Some(line)) = (&self.status, last) {
            if let (Some(_), Some(message)) = (status.code(), line.strip_prefix("error: ")) {
                return message.to_string();
            }
        }
        let how = match &self.status {
            Ok(status) => exit_reason(*status),
            Err(error) => format!("could not be waited for ({error})"),
        };
        match last {
            Some(line) => format!("{what} {how}; its last words: {line}"),
            None => format!("{what} {how}"),
        }
    }
}

#[cfg(unix)]
fn exit_reason(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(9) => "was killed (signal 9; without a Cancel this usually means the system ran out of memory)".into(),
        Some(signal) => format!("was killed by signal {signal}"),
        None => format!("stopped with exit code {}", status.code().unwrap_or(-1)),
    }
}

#[cfg(not(unix))]
fn exit_reason(status: ExitStatus) -> String {
    format!("stopped with exit code {}", status.code().unwrap_or(-1))
}

/// Sends each line of `pipe` to `lines`, wrapped by `kind`, from a thread of its own.
fn forward(
    pipe: impl Read + Send + 'static,
    lines: mpsc::Sender<Line>,
    kind: fn(String) -> Line,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut bytes = Vec::new();
        // Lossy: a line that is not UTF-8 must not stop the reading, or the worker would block on
        // a full pipe.
        while reader.read_until(b'\n', &mut bytes).is_ok_and(|read| read > 0) {
            let line = String::from_utf8_lossy(&bytes).trim_end_matches(['\n', '\r']).to_string();
            bytes.clear();
            if lines.send(kind(line)).is_err() {
                return;
            }
        }
    })
}

#[cfg(all(test, unix))]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Hands the worker's exit to the test.
    struct Ended(mpsc::Sender<Exit>);

    impl Watcher for Ended {
        fn line(&mut self, _: Line) {}

        fn exit(self, exit: Exit) {
            let _ = self.0.send(exit);
        }
    }

    /// A worker that runs the shell `script` (its job's arguments ignored), and its exit to come.
    fn worker(script: &str) -> (Arc<Process>, mpsc::Receiver<Exit>) {
        let shell = Worker {
            program: "/bin/sh".into(),
            leading: vec!["-c".into(), script.into(), "worker".into()],
            processes: Arc::default(),
        };
        let (sender, ended) = mpsc::channel();
        (shell.spawn(&Job::Hardware, Ended(sender)).unwrap(), ended)
    }

    #[test]
    fn a_short_command_past_its_deadline_is_killed_and_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!("echo $$ > {}; exec sleep 60", pid_file.display());
        let silent =
            Worker { program: "/bin/sh".into(), leading: vec!["-c".into(), script.into()], processes: Arc::default() };
        let start = std::time::Instant::now();
        let error = silent.output_within(&Job::Hardware, Duration::from_millis(500)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5), "waited {:?}", start.elapsed());
        assert_eq!(error, "still silent after 0.5 s, so it was stopped");
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        // Killed, then reaped by its watcher once its pipes close.
        let gone = || !Command::new("kill").args(["-0", pid.trim()]).status().unwrap().success();
        let start = std::time::Instant::now();
        while !gone() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(gone(), "the silent worker {} still runs", pid.trim());

        let answering = Worker { program: "/bin/echo".into(), leading: Vec::new(), processes: Arc::default() };
        assert_eq!(answering.output_within(&Job::Hardware, Duration::from_secs(30)).unwrap(), "backend --json\n");
    }

    /// Once the app closes its workers, a clone asked to start one (a probe that had not begun yet)
    /// starts nothing.
    #[test]
    fn a_worker_closed_by_the_app_starts_no_process() {
        let answering = Worker { program: "/bin/echo".into(), leading: Vec::new(), processes: Arc::default() };
        answering.clone().kill_all();
        assert_eq!(answering.output_within(&Job::Hardware, Duration::from_secs(30)).unwrap_err(), CLOSING);
    }

    #[test]
    fn a_first_cancel_asks_the_worker_to_stop_and_a_second_ends_it() {
        // One that stops when asked, as a training does after its step.
        let obliging =
            format!("while read line; do [ \"$line\" = {} ] && exit 0; done; exit 3", needle_cli::CANCEL_LINE);
        let (process, ended) = worker(&obliging);
        let mut stopping = false;
        assert_eq!(process.cancel(&mut stopping), CancelAnswer::Stopping);
        let exit = ended.recv_timeout(Duration::from_secs(30)).expect("the worker stopped when asked");
        assert!(exit.status.unwrap().success() && !exit.killed);

        // One that goes on regardless: the second press ends it.
        let (process, ended) = worker("while read line; do :; done");
        let mut stopping = false;
        assert_eq!(process.cancel(&mut stopping), CancelAnswer::Stopping);
        assert_eq!(process.cancel(&mut stopping), CancelAnswer::Killed);
        let exit = ended.recv_timeout(Duration::from_secs(30)).expect("the second Cancel ended the worker");
        assert!(exit.killed && !exit.status.unwrap().success());
    }
}
