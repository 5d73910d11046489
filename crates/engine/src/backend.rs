//! Which compute device runs the model, chosen at run time: CUDA, then Metal, then the CPU.
//!
//! The reference leaves this to `jax.default_backend()` (GPU if present, else CPU; `JAX_PLATFORMS=cpu` to
//! force). We do the same with candle, and `NEEDLE_DEVICE=auto|cpu|cuda|metal` (or `--device`) forces a
//! choice. A forced backend that this build lacks, or that has no device, is an error: never a silent
//! CPU run. candle's `cuda_is_available()`/`metal_is_available()` only say what was compiled in, so each
//! GPU backend is probed for a real device before it is chosen.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;
use serde::{Deserialize, Serialize};

/// The environment variable that forces a backend.
pub const DEVICE_ENV: &str = "NEEDLE_DEVICE";

/// A compute backend candle can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Cpu,
    Cuda,
    Metal,
}

impl Backend {
    fn label(self) -> &'static str {
        match self {
            Backend::Cpu => "CPU",
            Backend::Cuda => "CUDA",
            Backend::Metal => "Metal",
        }
    }

    /// Whether this binary was built with the backend (cargo features `cuda` / `metal`).
    pub fn is_compiled(self) -> bool {
        match self {
            Backend::Cpu => true,
            Backend::Cuda => cfg!(feature = "cuda"),
            Backend::Metal => cfg!(all(feature = "metal", target_os = "macos")),
        }
    }

    /// Whether this platform can have the backend at all: CUDA has no macOS driver, Metal exists only there.
    /// A backend that cannot exist here goes unmentioned in the reasons.
    fn exists_here(self) -> bool {
        match self {
            Backend::Cpu => true,
            Backend::Cuda => !cfg!(target_os = "macos"),
            Backend::Metal => cfg!(target_os = "macos"),
        }
    }

    /// How to get a build that has this backend.
    fn build_hint(self) -> &'static str {
        match self {
            Backend::Cpu => "",
            Backend::Cuda => {
                "use the `needle` a Needle Studio bundle installs, or build one with scripts/cuda-build.sh \
                 (see README 'GPU builds'), or set NEEDLE_DEVICE=cpu"
            }
            Backend::Metal => {
                "use a macOS build with the `metal` feature (`cargo build --release --features metal`), \
                 or set NEEDLE_DEVICE=cpu"
            }
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
            Backend::Metal => "metal",
        })
    }
}

/// What the user asked for: the best available backend, or one in particular.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    #[default]
    Auto,
    Only(Backend),
}

const CHOICES: &str = "auto, cpu, cuda, metal";

impl FromStr for DeviceRequest {
    type Err = BackendError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Only(Backend::Cpu)),
            "cuda" | "gpu" => Ok(DeviceRequest::Only(Backend::Cuda)),
            "metal" | "mps" => Ok(DeviceRequest::Only(Backend::Metal)),
            _ => Err(BackendError::Unknown { value: value.to_string() }),
        }
    }
}

impl DeviceRequest {
    /// The request from `--device` when given, else from `NEEDLE_DEVICE`, else automatic.
    pub fn resolve(flag: Option<&str>) -> Result<Self, BackendError> {
        match flag {
            Some(value) => value.parse(),
            None => match std::env::var(DEVICE_ENV) {
                Ok(value) => value.parse().map_err(|e| match e {
                    BackendError::Unknown { value } => BackendError::UnknownEnv { value },
                    other => other,
                }),
                Err(_) => Ok(DeviceRequest::Auto),
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("unknown device '{value}': choose one of {CHOICES}")]
    Unknown { value: String },
    #[error("unknown device '{value}' in {DEVICE_ENV}: choose one of {CHOICES}")]
    UnknownEnv { value: String },
    #[error("{} was requested but this build of needle has no {} support: {}", .0.label(), .0.label(), .0.build_hint())]
    NotCompiled(Backend),
    #[error("{} was requested but no {} device could be opened ({detail}); check the driver, or set {DEVICE_ENV}=cpu", .backend.label(), .backend.label())]
    NoDevice { backend: Backend, detail: String },
}

/// The facts shown to the user about the chosen backend (`needle backend --json`, the app's badge,
/// training's `started` event).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendInfo {
    pub backend: Backend,
    /// Human-readable device name (GPU model, or CPU brand).
    pub device: String,
    /// Memory the device can use: GPU memory, or system RAM for the CPU. `None` where it cannot tell.
    pub memory_bytes: Option<u64>,
    /// Free memory where the backend reports it.
    pub memory_free_bytes: Option<u64>,
    /// Backends this binary was built with.
    pub compiled: Vec<Backend>,
    /// Why this backend, and why no faster one.
    pub reason: String,
}

/// A selected device and what to tell the user about it.
pub struct Selected {
    pub device: Device,
    pub info: BackendInfo,
}

/// Backends compiled into this binary, fastest first.
pub fn compiled() -> Vec<Backend> {
    [Backend::Cuda, Backend::Metal, Backend::Cpu].into_iter().filter(|b| b.is_compiled()).collect()
}

/// Picks the device for a request: the forced backend or an error; or CUDA, then Metal, then the CPU,
/// the first that opens.
pub fn select(request: DeviceRequest) -> Result<Selected, BackendError> {
    match request {
        DeviceRequest::Only(backend) => {
            if !backend.is_compiled() {
                return Err(BackendError::NotCompiled(backend));
            }
            let (device, probe) = open(backend).map_err(|detail| BackendError::NoDevice { backend, detail })?;
            Ok(Selected { device, info: info(backend, probe, format!("{DEVICE_ENV}/--device asked for {backend}")) })
        }
        DeviceRequest::Auto => Ok(auto()),
    }
}

/// The fastest backend that opens: CUDA, then Metal, then the CPU, which always does.
/// On the CPU, the reason names each GPU backend this platform can have and why it was not used, e.g.
/// "CUDA: NVIDIA driver not found (libcuda.so.1) — training on the CPU".
pub fn auto() -> Selected {
    let mut skipped = Vec::new();
    for backend in [Backend::Cuda, Backend::Metal].into_iter().filter(|b| b.exists_here()) {
        if !backend.is_compiled() {
            skipped.push(format!("{} not compiled in", backend.label()));
            continue;
        }
        match open(backend) {
            Ok((device, probe)) => {
                let reason = format!("{} is the fastest backend available", backend.label());
                return Selected { device, info: info(backend, probe, reason) };
            }
            Err(detail) => skipped.push(format!("{}: {detail}", backend.label())),
        }
    }
    skipped.push("training on the CPU".into());
    Selected { device: Device::Cpu, info: info(Backend::Cpu, probe_cpu(), skipped.join(" — ")) }
}

/// Name and memory (total, free) of an opened device.
struct Probe {
    name: String,
    total: Option<u64>,
    free: Option<u64>,
}

fn info(backend: Backend, probe: Probe, reason: String) -> BackendInfo {
    BackendInfo {
        backend,
        device: probe.name,
        memory_bytes: probe.total,
        memory_free_bytes: probe.free,
        compiled: compiled(),
        reason,
    }
}

fn open(backend: Backend) -> Result<(Device, Probe), String> {
    match backend {
        Backend::Cpu => Ok((Device::Cpu, probe_cpu())),
        Backend::Cuda => open_cuda(),
        Backend::Metal => open_metal(),
    }
}

/// The CPU's brand and thread count, as benchmark reports name the machine.
pub fn cpu_name() -> String {
    probe_cpu().name
}

fn probe_cpu() -> Probe {
    use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};
    let refresh =
        RefreshKind::nothing().with_cpu(CpuRefreshKind::nothing()).with_memory(MemoryRefreshKind::nothing().with_ram());
    match System::new_with_specifics(refresh) {
        Ok(system) => {
            let brand = system.cpus().first().map(|c| c.brand().trim().to_string()).unwrap_or_default();
            let threads = system.cpus().len();
            let name = match (brand.is_empty(), threads) {
                (true, _) => format!("CPU ({threads} threads)"),
                (false, _) => format!("{brand} ({threads} threads)"),
            };
            Probe { name, total: Some(system.total_memory()), free: Some(system.available_memory()) }
        }
        Err(_) => Probe { name: "CPU".into(), total: None, free: None },
    }
}

/// Runs candle's CPU element-wise ops on the calling thread unless `CANDLE_NUM_THREADS` says
/// otherwise. candle hands them to a pool of threads that spin while they wait; on a machine with
/// few cores those spinning threads take the cores the matrix multiplies and the fused kernels
/// (both on rayon) need: on 2 cores a Needle 2 training step took 3× longer with the pool. Call it
/// first thing in `main`, before any thread or tensor exists.
pub fn keep_elementwise_ops_on_the_calling_thread() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // The process has no other thread yet, so nothing reads the environment concurrently.
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}

/// Keeps the memory the process frees for its own later allocations instead of handing it back to
/// the system (glibc's malloc: no `mmap` of its own for big blocks, no trimming of its heap). A run
/// frees big buffers as it goes (a checkpoint's weights as their CQ round trips replace them, a
/// step's scratch) and allocates as many again, and each page the system hands out anew is a fault
/// that zeroes it: two steps of `needle bench --preset needle3 --batch 4 --seq 1024` took 490 k of
/// them on a 2-core Zen 4 KVM guest, 380 k with the freed memory kept (0.2–0.5 s less system time,
/// the same peak RSS). A `needle` command, and the app's worker, gives all of it back when its job
/// ends and it exits. Call it first thing in `main`, before any thread exists.
pub fn keep_freed_memory_for_reuse() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets malloc's parameters, and no other thread allocates yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Free and total bytes of `device`'s own GPU memory, where the driver says; `None` on the CPU and
/// on Metal (whose memory is the system's).
fn gpu_memory(device: &Device) -> Option<(u64, u64)> {
    #[cfg(feature = "cuda")]
    if let Ok(cuda) = device.as_cuda_device() {
        let (free, total) = cuda.cuda_stream().context().mem_get_info().ok()?;
        return Some((free as u64, total as u64));
    }
    let _ = device;
    None
}

/// Bytes in use on `device`'s GPU (by every process), where the driver says; `None` on the CPU.
pub fn device_memory_used(device: &Device) -> Option<u64> {
    gpu_memory(device).map(|(free, total)| total.saturating_sub(free))
}

/// Bytes free on `device`'s GPU, where the driver says; `None` on the CPU and on Metal.
pub fn device_memory_free(device: &Device) -> Option<u64> {
    gpu_memory(device).map(|(free, _)| free)
}

/// The machine's memory: `(total, available to this process now)` in bytes, where the system says.
pub fn system_memory() -> Option<(u64, u64)> {
    use sysinfo::{MemoryRefreshKind, RefreshKind, System};
    let refresh = RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram());
    let system = System::new_with_specifics(refresh).ok()?;
    Some((system.total_memory(), system.available_memory())).filter(|&(total, _)| total > 0)
}

/// The NVIDIA driver's library, which the driver installs and no build of needle ships.
#[cfg(feature = "cuda")]
const CUDA_DRIVER_LIBRARY: &str = if cfg!(windows) { "nvcuda.dll" } else { "libcuda.so.1" };

/// Whether the driver and the toolkit libraries that cudarc loads on first use are there: cudarc panics
/// when one is missing, so ask before anything calls it. The toolkit's ship with needle (beside it, or in
/// `../lib/needle-studio/cuda` through its rpath), so a missing one means a broken install.
#[cfg(feature = "cuda")]
fn cuda_libraries_load() -> Result<(), String> {
    use cudarc::{cublas, curand, driver};
    // SAFETY: each only tries to load (and unloads) a library by its usual names.
    if !unsafe { driver::sys::is_culib_present() } {
        return Err(format!("NVIDIA driver not found ({CUDA_DRIVER_LIBRARY})"));
    }
    // cuBLAS loads its own cuBLASLt; candle opens no other (it never compiles kernels at run time).
    let toolkit: [(&str, unsafe fn() -> bool); 2] =
        [("cuBLAS", cublas::sys::is_culib_present), ("cuRAND", curand::sys::is_culib_present)];
    for (name, present) in toolkit {
        // SAFETY: as above.
        if !unsafe { present() } {
            return Err(format!(
                "the {name} library that ships with needle did not load; reinstall needle, or set {DEVICE_ENV}=cpu"
            ));
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn open_cuda() -> Result<(Device, Probe), String> {
    cuda_libraries_load()?;
    let count = cudarc::driver::CudaContext::device_count().map_err(|e| format!("CUDA driver: {e}"))?;
    if count < 1 {
        return Err("the CUDA driver reports no GPU".into());
    }
    let device = Device::new_cuda(0).map_err(|e| e.to_string())?;
    let context = device.as_cuda_device().map_err(|e| e.to_string())?.cuda_stream().context().clone();
    let name = context.name().unwrap_or_else(|_| "NVIDIA GPU".into());
    let (free, total) = context.mem_get_info().map(|(f, t)| (Some(f as u64), Some(t as u64))).unwrap_or((None, None));
    Ok((device, Probe { name, total, free }))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda() -> Result<(Device, Probe), String> {
    Err("not compiled in".into())
}

#[cfg(all(feature = "metal", target_os = "macos"))]
fn open_metal() -> Result<(Device, Probe), String> {
    use objc2_metal::MTLDevice;
    // candle's MetalDevice::new indexes the device list without checking it and panics on a Mac with no
    // usable GPU, so look for one first.
    let Some(gpu) = objc2_metal::MTLCreateSystemDefaultDevice() else {
        return Err("macOS reports no Metal GPU".into());
    };
    let device = Device::new_metal(0).map_err(|e| e.to_string())?;
    // Apple Silicon shares system memory; this is how much of it Metal recommends a process use.
    let total = Some(gpu.recommendedMaxWorkingSetSize());
    Ok((device, Probe { name: gpu.name().to_string(), total, free: None }))
}

#[cfg(not(all(feature = "metal", target_os = "macos")))]
fn open_metal() -> Result<(Device, Probe), String> {
    Err("not compiled in".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_unknown_values_list_the_choices() {
        assert_eq!("auto".parse::<DeviceRequest>().unwrap(), DeviceRequest::Auto);
        assert_eq!("CPU".parse::<DeviceRequest>().unwrap(), DeviceRequest::Only(Backend::Cpu));
        assert_eq!("cuda".parse::<DeviceRequest>().unwrap(), DeviceRequest::Only(Backend::Cuda));
        assert_eq!("metal".parse::<DeviceRequest>().unwrap(), DeviceRequest::Only(Backend::Metal));
        let err = "tpu".parse::<DeviceRequest>().unwrap_err().to_string();
        assert!(err.contains("'tpu'") && err.contains("auto, cpu, cuda, metal"), "{err}");
    }

    #[test]
    fn automatic_selection_opens_a_device_and_says_why() {
        let selected = select(DeviceRequest::Auto).unwrap();
        assert!(selected.info.compiled.contains(&Backend::Cpu));
        assert!(!selected.info.reason.is_empty());
        assert!(!selected.info.device.is_empty());
        if !cfg!(any(feature = "cuda", feature = "metal")) {
            assert_eq!(selected.info.backend, Backend::Cpu);
            let gpu = if Backend::Cuda.exists_here() { "CUDA" } else { "Metal" };
            let expected = format!("{gpu} not compiled in — training on the CPU");
            assert_eq!(selected.info.reason, expected);
            assert!(selected.info.memory_bytes.unwrap_or(0) > 0);
        }
    }

    #[test]
    fn a_forced_backend_that_is_not_built_is_an_error_naming_it() {
        for backend in [Backend::Cuda, Backend::Metal] {
            if backend.is_compiled() {
                continue;
            }
            let err = select(DeviceRequest::Only(backend)).err().expect("must not fall back to the CPU");
            let text = err.to_string();
            assert!(text.contains(backend.label()) && text.contains("NEEDLE_DEVICE=cpu"), "{text}");
        }
    }
}
