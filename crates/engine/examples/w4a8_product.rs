//! Times the W4A8 product (`needle_engine::w4a8`) against the simulated path's f32 product of the
//! same codes dequantized, at the released Needle 3 shape's projections and output head, one row
//! (single-stream decoding) and 16 rows (a batch). Weights are random, quantized at 4 bits.
//! Run it on an idle machine and name the CPU with the figures:
//! `cargo run --release -p needle-engine --example w4a8_product`.

use std::time::Instant;

use candle_core::{Device, Tensor};
use needle_engine::config::ModelConfig;
use needle_engine::quant::{cq_decode, cq_encode, Bits};
use needle_engine::w4a8::{Activations, CqMatrix, Isa};
use rand::{Rng, SeedableRng};

/// Median seconds of `runs` calls of `f`, after one warm-up call.
fn median_seconds(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[runs / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = ModelConfig::needle3();
    let d = config.d_model;
    let shapes = [
        ("q_proj", config.num_heads * config.qk_head_dim(), d),
        ("o_proj", d, config.num_heads * config.v_head_dim()),
        ("output head", config.vocab_size, d),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    println!("kernel: {:?}", Isa::detect());
    for (name, out, in_dim) in shapes {
        let weights: Vec<f32> = (0..out * in_dim).map(|_| rng.random_range(-0.1f32..0.1)).collect();
        let blob = cq_encode(&weights, in_dim, Bits::Four);
        let m = CqMatrix::from_blob(&blob, out, in_dim, Bits::Four)?;
        let dequantized = Tensor::from_vec(cq_decode(&blob, out, in_dim, Bits::Four)?, (out, in_dim), &Device::Cpu)?;
        let transposed = dequantized.t()?;
        for rows in [1, 16] {
            let x: Vec<f32> = (0..rows * in_dim).map(|_| rng.random_range(-1f32..1.0)).collect();
            let xt = Tensor::from_vec(x.clone(), (rows, in_dim), &Device::Cpu)?;
            let runs = if out > 4096 { 21 } else { 201 };
            let w4a8 = median_seconds(runs, || {
                let a = Activations::quantize(&x, rows, in_dim).expect("the shape is right");
                std::hint::black_box(m.product(&a).expect("the widths match"));
            });
            let f32_product = median_seconds(runs, || {
                std::hint::black_box(xt.matmul(&transposed).expect("the widths match"));
            });
            println!(
                "{name} [{out}, {in_dim}] × {rows} rows: W4A8 {:.1} µs ({} KiB of weights), f32 {:.1} µs ({} KiB): {:.2}×",
                w4a8 * 1e6,
                m.bytes() / 1024,
                f32_product * 1e6,
                out * in_dim * 4 / 1024,
                f32_product / w4a8
            );
        }
    }
    Ok(())
}
