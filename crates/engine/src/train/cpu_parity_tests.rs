//! The CPU path against the candle path, part by part: the loss and every LoRA factor's gradient
//! of a Needle 3 network (random weights, factors with `B ≠ 0` so that `A`'s gradients and the
//! merged kernels matter) with each Needle 3 part switched on in turn, then all of them with QAT,
//! on rows longer than the window whose shared prefix crosses it.
//!
//! They sit with training, above both the model and the adapters (`lora`) whose gradients they
//! compare: under `model` they would make the model's folder import the adapters built on it.

use std::sync::Mutex;

use candle_core::Device;

use crate::config::ModelConfig;
use crate::dataset::Encoded;
use crate::fixtures::seeded_normal;
use crate::level_log::{LevelLog, GAP};
use crate::lora::Lora;
use crate::model::linear::HostGrads;
use crate::model::packing::Packing;
use crate::model::{CpuNetwork, Network, Params, Workspace};

/// 3.2.8's tiny fixture geometry (`make_needle3_fixtures.py`) with every Needle 3 part off.
fn plain() -> ModelConfig {
    ModelConfig {
        vocab_size: 512,
        d_model: 48,
        num_heads: 4,
        num_kv_heads: 2,
        num_layers: 4,
        qk_head_dim: 12,
        v_head_dim: 16,
        max_seq_len: 256,
        engram_orders: vec![2, 3],
        engram_slots: 64,
        engram_layers: vec![0, 2],
        mhc_lanes: 2,
        ..ModelConfig::needle3_defaults()
    }
}

/// Rows of 60 to 72 tokens: three share a 40-token prompt (longer than the window of 16), one
/// shares nothing.
fn rows() -> Vec<Encoded> {
    let prompt: Vec<u32> = (0..40u32).map(|t| 4 + (7 * t + 3) % 500).collect();
    let mut rows: Vec<Encoded> = [20usize, 32, 25]
        .iter()
        .enumerate()
        .map(|(r, &tail)| {
            let own = (0..tail as u32).map(|t| 4 + (31 * r as u32 + 13 * t + 5) % 500);
            let ids: Vec<u32> = prompt.iter().copied().chain(own).collect();
            let mask = (0..ids.len()).map(|t| if t >= 30 { 1.0 } else { 0.0 }).collect();
            Encoded { ids, mask, truncated: false }
        })
        .collect();
    let ids: Vec<u32> = (0..50u32).map(|t| 4 + (11 * t + 1) % 500).collect();
    rows.push(Encoded { mask: vec![1.0; ids.len()], ids, truncated: false });
    rows
}

/// `max |got − want| / max |want|`.
fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    let diff = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let size = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    diff / size.max(f32::MIN_POSITIVE)
}

/// The loss and the factors' gradients on both paths, with the CPU path keeping every layer and
/// recomputing them: the loss within 1e-5 relative, every gradient within 1e-4 of its largest
/// entry, with QAT as without. Every draw is seeded (the weights by `random_init`, `A` by
/// `Lora::init`, `B` here), so a red run replays.
///
/// QAT is where the paths could part by more than float rounding: their last bits differ
/// (attention's softmax is taken per block here, over whole rows there), and a quantizer input on
/// a level's rounding boundary turns that into a whole level, which moves later gradients by up to
/// a few percent (unseeded draws did, now and then). Both passes run with a [`LevelLog`]: the
/// candle path's quantizers record their rows, and every row the CPU path quantizes must pair
/// with one of them, its inputs within [`GAP`] (a thousandth of a level) of the candle path's (else
/// the test fails, naming the quantizer and the gap). Where paired inputs straddle a boundary the
/// CPU path takes the candle path's level (a flip, counted, and bounded at one input per
/// [`MAX_FLIP_SHARE`] rows: 2 to 4 a pass on an AVX-512 Xeon, of 23 000 to 31 000 rows whose inputs
/// differ by 1.5e-4 of a level at most), so no
/// machine's rounding can move the comparison by a level, and anything else the CPU path computes
/// differently still shows: its output head's quantizer skipped moves the loss by 1.5e-5 relative
/// and a gradient by 2.6e-4; a block's skipped, or the queries' width changed, leaves rows unpaired.
fn check(cfg: &ModelConfig, qat: bool, what: &str) {
    let (log, pool) = LevelLog::recording();
    pool.install(|| compare(cfg, qat, what, &log));
}

/// At most one input per this many quantized rows may take the candle path's level.
const MAX_FLIP_SHARE: usize = 1000;

/// [`check`] on the pool that feeds `log`.
fn compare(cfg: &ModelConfig, qat: bool, what: &str, log: &Mutex<LevelLog>) {
    let params = Params::random_init(&Device::Cpu);
    Network::load(cfg, &params).unwrap();
    let params = if qat { params.for_qat(cfg).unwrap() } else { params };
    let network = Network::load(cfg, &params).unwrap();
    let lora = Lora::init(&params, 4, 8.0, 7).unwrap();
    for (seed, b) in lora.factors.iter().flat_map(|factor| &factor.b).enumerate() {
        b.set(&seeded_normal(0.0, 0.05, b.dims(), seed as u64)).unwrap();
    }
    let low_rank = lora.low_rank();
    let packing = Packing::new(&rows(), true).unwrap();
    assert!(packing.len() < packing.unshared_len(), "the rows share their prompt");
    let normalizer = packing.scored().weight_sum();

    let (sum, _) = network.masked_ce_sum(&packing, Some(&low_rank)).unwrap();
    let loss = (sum / normalizer).unwrap();
    let store = loss.backward().unwrap();
    let want_loss: f32 = loss.to_scalar().unwrap();

    log.lock().unwrap().follow();
    let cpu = CpuNetwork::new(&network).unwrap();
    for recompute in [false, true] {
        let (mut ws, mut grads) = (Workspace::default(), HostGrads::new());
        let factors = cpu.factors(Some(&low_rank)).unwrap();
        let got_loss = cpu.loss_and_grads(&packing, &factors, normalizer, recompute, &mut ws, &mut grads).unwrap();
        let (forward_only, _) = cpu.masked_ce_sum(&packing, &factors, &mut ws).unwrap();
        let forward_only = (forward_only / normalizer) as f32;

        let levels = std::mem::take(&mut log.lock().unwrap().counts);
        let way = format!(
            "{what} (recompute {recompute}; {} quantized rows paired with the candle path's, their inputs within {} \
             of its, {} level flips taken from it)",
            levels.paired, levels.widest_gap, levels.flips
        );
        assert!(
            levels.unpaired.is_empty(),
            "{way}: {} rows quantized with no candle row within {GAP}; the first (quantizer, width, \
             nearest gap): {:?}",
            levels.unpaired.len(),
            &levels.unpaired[..levels.unpaired.len().min(4)]
        );
        assert_eq!(levels.paired > 0, qat, "{way}: quantized rows");
        // A flip needs two inputs within a ten-thousandth of a level of one boundary: rare by
        // nature (4 in 23 000 rows at most here). Many would mean the paths drifted apart, which
        // taking the candle path's levels would hide.
        assert!(
            levels.flips * MAX_FLIP_SHARE <= levels.paired,
            "{way}: more than one flipped input per {MAX_FLIP_SHARE} quantized rows"
        );
        assert!(((got_loss - want_loss) / want_loss).abs() <= 1e-5, "{way}: loss {got_loss} vs {want_loss}");
        assert!(
            ((forward_only - want_loss) / want_loss).abs() <= 1e-5,
            "{way}: forward-only loss {forward_only} vs {want_loss}"
        );
        let mut errors = Vec::new();
        for (path, layer, a, b) in lora.factors.iter().flat_map(|factor| {
            (factor.a.iter().zip(&factor.b).enumerate()).map(move |(layer, (a, b))| (&factor.path, layer, a, b))
        }) {
            let (got_a, got_b) = &grads[&(path.clone(), layer)];
            for (side, got, tensor) in [("A", got_a, a.as_tensor()), ("B", got_b, b.as_tensor())] {
                let want = store.get(tensor).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                errors.push((relative_error(got, &want), format!("{path} layer {layer} d{side}")));
            }
        }
        let (worst, name) = errors.iter().max_by(|a, b| a.0.total_cmp(&b.0)).unwrap();
        assert!(*worst <= 1e-4, "{way}: {name} off by {worst} relative");
    }
}

#[test]
fn monarch_mlp_and_separate_head_widths_match_the_candle_path() {
    check(&plain(), false, "monarch, qk 12 / v 16");
}

#[test]
fn windowed_and_global_layers_match_the_candle_path() {
    check(&ModelConfig { sliding_window: 16, global_layers: vec![1, 3], ..plain() }, false, "window 16");
}

#[test]
fn qkv_convolution_taps_match_the_candle_path() {
    check(&ModelConfig { qkv_conv_taps: 3, ..plain() }, false, "conv taps");
}

#[test]
fn quantization_aware_training_matches_the_candle_path() {
    check(&plain(), true, "QAT");
}

#[test]
fn every_needle3_part_under_qat_matches_the_candle_path() {
    let cfg =
        ModelConfig { sliding_window: 16, global_layers: vec![1, 3], qkv_conv_taps: 3, out_vocab: 508, ..plain() };
    check(&cfg, true, "every part, QAT");
}

/// An answer token past Needle 3's output head (`out_vocab`) is an error naming it on both paths,
/// never an index out of bounds.
#[test]
fn an_answer_token_outside_the_output_head_is_an_error_on_both_paths() {
    let cfg = ModelConfig { out_vocab: 200, ..plain() };
    let network = Network::load(&cfg, &Params::random_init(&Device::Cpu)).unwrap();
    let packing = Packing::new(&rows(), true).unwrap();
    let candle = network.masked_ce_sum(&packing, None).unwrap_err();
    let cpu = CpuNetwork::new(&network).unwrap();
    let cpu = cpu.masked_ce_sum(&packing, &cpu.factors(None).unwrap(), &mut Workspace::default()).unwrap_err();
    for err in [candle, cpu] {
        assert!(matches!(err, crate::model::ModelError::TargetOutsideHead { rows: 200, .. }), "{err}");
        assert!(err.to_string().contains("use the tokenizer that belongs to this checkpoint"), "{err}");
    }
}
