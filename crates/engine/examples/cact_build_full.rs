//! Times `needle build`'s work on a random-init full-size float16 Needle 2 (d_model 768, 27 layers,
//! 12/6 heads, engram sites [2, 15], vocab 8192, 4 mHC lanes). The reference takes 8.0 s.
//! Run through `bench/build_full.sh` (release build).

use std::time::Instant;

use needle_engine::cact::{build_cact, synthetic, Bits, BitsChoice, CactFile};
use needle_engine::config::ModelConfig;

/// CPU seconds (user + system, all threads) this process has used: on a shared machine wall time
/// mostly measures the neighbours.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct we pass.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = ModelConfig { dtype: "float16".into(), ..ModelConfig::needle2() };
    let t = Instant::now();
    let ckpt = synthetic::random_checkpoint(&config, true, 0)?;
    let params: usize = ckpt.params.values().map(|a| a.shape.iter().product::<usize>()).sum();
    println!("random init: {params} params in {:.2} s", t.elapsed().as_secs_f64());
    let tokenizer = synthetic::placeholder_tokenizer_blob(config.vocab_size);
    for bits in [Bits::Four, Bits::Two] {
        let (t, cpu) = (Instant::now(), cpu_seconds());
        let built = build_cact(&ckpt, &BitsChoice::Uniform(bits), &tokenizer)?;
        let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds() - cpu);
        println!(
            "W{bits}: {} tensors, {:.2} MB in {secs:.3} s wall, {cpu:.3} s CPU on {} threads (reference: 8.0 s)",
            built.num_tensors,
            built.bytes.len() as f64 / 1e6,
            rayon::current_num_threads()
        );
        let t = Instant::now();
        let report = CactFile::parse(built.bytes)?.verify()?;
        println!(
            "  verify: {} tensors, {} CQ groups in {:.3} s",
            report.tensors,
            report.cq_groups,
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
