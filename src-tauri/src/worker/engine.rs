//! Which engine the app trains with: the `needle` a bundle installs beside the app, or the app's own binary.
//!
//! A bundle carries one `needle`, built with the platform's GPU backend (scripts/bundle.sh): CUDA on Linux
//! and Windows, Metal on macOS. That build starts on any machine, since it loads the NVIDIA driver only when
//! asked, and it says what it found: the GPU with its memory, or why not ("CUDA: NVIDIA driver not found
//! (libcuda.so.1) — training on the CPU"). Asking it (`needle backend --json`) is the probe: it checks what a
//! `dlopen` of the driver in this process could not, that the binary and the CUDA libraries it ships with
//! load and that the driver initialises and finds a device, and a crash there costs the window nothing.
//! When it answers it is the worker for everything, on the GPU or the CPU, so that the hardware the Model
//! step shows is the hardware the training reports. The app's own binary in worker mode (a CPU build) is
//! the worker when there is none beside the app or it does not answer, and the Model step says which.
//! It has [`ANSWER_DEADLINE`] to answer: a driver that never returns (`cuInit` wedged) is killed then,
//! and the app trains on its own worker.

use std::path::Path;
use std::time::Duration;

use needle_engine::backend::{self, BackendInfo};

use crate::worker::job::Job;
use crate::worker::process::Worker;

/// The bundled engine's name beside the app's binary (plus `.exe` on Windows); it is also the command a
/// bundle installs. Tauri places it there as an external binary.
const BUNDLED_ENGINE: &str = "needle";

/// How long the bundled engine has to say what it found. Loading the CUDA libraries and initialising the
/// driver takes a second or two where they work; far longer means they never will.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(8);

/// The worker to use and the hardware it will train on: the bundled engine beside `app`'s binary, if it
/// answers within `deadline`, else `app` itself. `asking` is handed the bundled engine before it is asked,
/// so that an app closed meanwhile can end the probe ([`Worker::kill_all`]) rather than leave it running.
pub fn discover(app: Worker, deadline: Duration, asking: impl FnOnce(&Worker)) -> (Worker, BackendInfo) {
    let beside = app.program().with_file_name(format!("{BUNDLED_ENGINE}{}", std::env::consts::EXE_SUFFIX));
    let bundled = beside.is_file().then(|| Worker::needle(beside));
    let ask = |engine: &Worker| {
        asking(engine);
        engine.output_within(&Job::Hardware, deadline)
    };
    choose(app, bundled, ask, || backend::auto().info)
}

/// The choice, given how to ask the bundled engine for its backend report and this process's own
/// detection: the bundled engine when it answers, else the app with its own report and why.
fn choose(
    app: Worker,
    bundled: Option<Worker>,
    ask: impl FnOnce(&Worker) -> Result<String, String>,
    own: impl FnOnce() -> BackendInfo,
) -> (Worker, BackendInfo) {
    let Some(engine) = bundled else {
        return (app, own());
    };
    match ask(&engine).and_then(|report| parse(engine.program(), &report)) {
        Ok(info) => (engine, info),
        Err(why) => {
            let mut info = own();
            info.reason = format!("{} (the bundled engine did not answer: {why})", info.reason);
            (app, info)
        }
    }
}

fn parse(program: &Path, report: &str) -> Result<BackendInfo, String> {
    serde_json::from_str(report.trim())
        .map_err(|error| format!("`{} backend --json` printed no backend report ({error})", program.display()))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use needle_engine::backend::Backend;

    use super::*;

    /// A report as the bundled engine prints it.
    fn report(backend: Backend, device: &str, reason: &str) -> BackendInfo {
        BackendInfo {
            backend,
            device: device.into(),
            memory_bytes: Some(80 << 30),
            memory_free_bytes: Some(79 << 30),
            compiled: vec![Backend::Cuda, Backend::Cpu],
            reason: reason.into(),
        }
    }

    fn app_report() -> BackendInfo {
        BackendInfo {
            compiled: vec![Backend::Cpu],
            ..report(Backend::Cpu, "CPU", "CUDA not compiled in — training on the CPU")
        }
    }

    /// The choice with the bundled engine's answer standing in for the driver check it makes.
    fn choice(answer: Result<String, String>) -> (PathBuf, BackendInfo) {
        let app = Worker::app(PathBuf::from("/opt/studio/needle-studio"));
        let bundled = Worker::needle(PathBuf::from("/opt/studio/needle"));
        let (worker, info) = choose(app, Some(bundled), |_| answer, app_report);
        (worker.program().to_path_buf(), info)
    }

    #[test]
    fn a_bundled_engine_that_finds_the_gpu_trains_on_it() {
        let gpu = report(Backend::Cuda, "NVIDIA H100 80GB HBM3", "CUDA is the fastest backend available");
        let (program, info) = choice(Ok(serde_json::to_string(&gpu).unwrap() + "\n"));
        assert_eq!(program, PathBuf::from("/opt/studio/needle"));
        assert_eq!(info, gpu);
    }

    #[test]
    fn without_the_driver_the_bundled_engine_trains_on_the_cpu_and_says_why() {
        let reason = "CUDA: NVIDIA driver not found (libcuda.so.1) — training on the CPU";
        let cpu = report(Backend::Cpu, "AMD EPYC (2 threads)", reason);
        let (program, info) = choice(Ok(serde_json::to_string(&cpu).unwrap()));
        assert_eq!(program, PathBuf::from("/opt/studio/needle"));
        assert_eq!(info.reason, reason);
        assert_eq!(info.compiled, vec![Backend::Cuda, Backend::Cpu]);
    }

    #[test]
    fn a_bundled_engine_that_does_not_answer_leaves_the_app_training_and_says_so() {
        let crash = "the worker was killed by signal 11".to_string();
        let (program, info) = choice(Err(crash));
        assert_eq!(program, PathBuf::from("/opt/studio/needle-studio"));
        let expected = "CUDA not compiled in — training on the CPU (the bundled engine did not answer: the worker \
                        was killed by signal 11)";
        assert_eq!(info.reason, expected);

        let (program, info) = choice(Ok("error: unrecognized subcommand 'backend'\n".into()));
        assert_eq!(program, PathBuf::from("/opt/studio/needle-studio"));
        assert!(
            info.reason.contains("`/opt/studio/needle backend --json` printed no backend report"),
            "{}",
            info.reason
        );
    }

    #[test]
    fn without_a_bundled_engine_the_app_trains_itself() {
        let app = Worker::app(PathBuf::from("/opt/studio/needle-studio"));
        let (worker, info) = choose(app, None, |_| panic!("nothing to ask"), app_report);
        assert_eq!(worker.program(), Path::new("/opt/studio/needle-studio"));
        assert_eq!(info, app_report());
    }
}
