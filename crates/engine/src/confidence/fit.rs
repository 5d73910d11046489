//! Fitting a confidence head to a tuned model's own answers, and calibrating it.
//!
//! The head's inputs are the hidden cells of the shipped model (computed once, so no gradient
//! reaches the network or its adapter: the reference's `stop_gradient`), its label whether the
//! model's answer was exact. Calibration is Platt scaling on cross-fitted logits: the rows are
//! split into folds, a head is fitted on all folds but one and scores that one, so every row's
//! logit comes from a head that never saw it; `σ(a·logit + b)` is fitted on those logits, and the
//! head that ships is then fitted on every row.

use candle_core::{DType, Tensor, Var, D};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use super::head::{ConfidenceHead, Result};
use crate::calls::reliability::{auroc, Scored};
use crate::config::ModelConfig;
use crate::generation::Generation;
use crate::model::Device;
use crate::train::adamw::{AdamW, AdamWConfig};

/// Needle 2's probes (2.0.8's class constant `PROBES`).
const NEEDLE2_PROBES: usize = 8;
/// The reference's initial spread of probes, queries and the projection.
const INIT_STD: f64 = 0.02;
/// Cross-fitting folds (fewer when there are fewer rows of the rarer label).
const FOLDS: usize = 5;
/// Optimizer updates of one fit, rows per update, and its learning rate: the head has a few
/// thousand parameters and sees a few hundred rows.
const STEPS: usize = 100;
const BATCH: usize = 16;
const LEARNING_RATE: f32 = 3e-3;

/// `σ(scale · logit + shift)`: Platt scaling of the head's logit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    pub scale: f64,
    pub shift: f64,
}

impl Calibration {
    /// The uncalibrated head: its sigmoid.
    pub const IDENTITY: Self = Self { scale: 1.0, shift: 0.0 };

    /// The calibrated confidence of a logit.
    pub fn confidence(&self, logit: f64) -> f64 {
        1.0 / (1.0 + (-(self.scale * logit + self.shift)).exp())
    }

    /// Platt's fit of `σ(a·logit + b)` to the labels by Newton's method, with Platt's targets
    /// (`(n₊ + 1)/(n₊ + 2)` and `1/(n₋ + 2)` instead of 1 and 0), which keep `a` finite when the
    /// logits separate the labels. Logits that are all alike (a head whose quantized projection
    /// rounds to zero) tell nothing, and a fit that does not stay finite cannot be kept: the
    /// calibration is then the base rate, `scale` 0 (before, such a fit wrote a head file no
    /// reader could load).
    pub fn platt(logits: &[f64], labels: &[bool]) -> Self {
        let positives = labels.iter().filter(|&&right| right).count() as f64;
        let negatives = labels.len() as f64 - positives;
        let (high, low) = ((positives + 1.0) / (positives + 2.0), 1.0 / (negatives + 2.0));
        let targets: Vec<f64> = labels.iter().map(|&right| if right { high } else { low }).collect();
        let mean = targets.iter().sum::<f64>() / targets.len().max(1) as f64;
        let base_rate = Self { scale: 0.0, shift: (mean / (1.0 - mean)).ln() };
        let (lowest, highest) =
            logits.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        if (highest - lowest).is_nan() || highest - lowest <= 1e-6 {
            return base_rate;
        }
        let mut fit = Self { scale: 1.0, shift: ((positives + 1.0) / (negatives + 1.0)).ln() };
        for _ in 0..100 {
            // Gradient and Hessian of the cross-entropy in (scale, shift), a small ridge keeping
            // the Hessian invertible.
            let (mut g, mut h) = ([0.0f64; 2], [[1e-9f64; 2]; 2]);
            for (&x, &t) in logits.iter().zip(&targets) {
                let p = fit.confidence(x);
                let (d, w) = (p - t, p * (1.0 - p));
                g[0] += d * x;
                g[1] += d;
                h[0][0] += w * x * x;
                h[0][1] += w * x;
                h[1][1] += w;
            }
            let det = h[0][0] * h[1][1] - h[0][1] * h[0][1];
            let step = [(h[1][1] * g[0] - h[0][1] * g[1]) / det, (h[0][0] * g[1] - h[0][1] * g[0]) / det];
            fit = Self { scale: fit.scale - step[0], shift: fit.shift - step[1] };
            if step[0].abs().max(step[1].abs()) < 1e-10 {
                break;
            }
        }
        match fit.scale.is_finite() && fit.shift.is_finite() {
            true => fit,
            false => base_rate,
        }
    }
}

/// A head fitted to a model's answers, its calibration, and how well its cross-fitted logits told
/// the right answers from the wrong ones.
#[derive(Debug, Clone)]
pub struct Fitted {
    pub head: ConfidenceHead,
    pub calibration: Calibration,
    /// The area under the ROC curve of the cross-fitted logits (`None` when every label is alike).
    pub auroc: Option<f64>,
}

impl ConfidenceHead {
    /// A new head for a model of `cfg`, initialised as the reference initialises it (probes,
    /// queries and the projection's kernel normal with std 0.02, gains 1, biases 0; Needle 3 shaped
    /// by the config's `confidence_probes` and `confidence_queries`, Needle 2 with 8 probes).
    pub fn initial(cfg: &ModelConfig, device: &Device, seed: u64) -> Result<Self> {
        let mut rng = StdRng::seed_from_u64(seed);
        let normal = Normal::new(0.0f32, INIT_STD as f32).expect("a positive spread");
        let mut random = |shape: &[usize]| -> Result<Tensor> {
            let values: Vec<f32> = (0..shape.iter().product()).map(|_| normal.sample(&mut rng)).collect();
            Ok(Tensor::from_vec(values, shape, device)?)
        };
        let (d, rows) = (cfg.d_model, cfg.num_layers + 1);
        let tensors = match cfg.generation {
            Generation::Needle2 => vec![
                random(&[NEEDLE2_PROBES, d])?,
                random(&[NEEDLE2_PROBES * d, 1])?,
                Tensor::zeros(1, DType::F32, device)?,
            ],
            Generation::Needle3 => {
                let (k, q) = (cfg.confidence_probes, cfg.confidence_queries);
                vec![
                    random(&[rows, k, d])?,
                    Tensor::ones((rows, k), DType::F32, device)?,
                    random(&[q, d])?,
                    Tensor::zeros((q, rows, k), DType::F32, device)?,
                    random(&[q * d, 1])?,
                    Tensor::zeros(1, DType::F32, device)?,
                ]
            }
        };
        Ok(Self::from_tensors(cfg.generation, tensors))
    }
}

/// Fits a head from `initial` to `labels` (whether each row's answer was exact) on `cells` (one
/// `[1, T, R, d]` per row, the first `shared` tokens of every row alike: an app's tools prompt),
/// calibrates it on cross-fitted logits, and fits the head that ships on every row. `shipped` is
/// how the head is run where it ships (the `.cact`'s CQ round trip for Needle 3): the logits
/// calibrated are those of the shipped form.
pub fn cross_fit(
    initial: &ConfidenceHead,
    cells: &[Tensor],
    shared: usize,
    labels: &[bool],
    seed: u64,
    shipped: impl Fn(ConfidenceHead) -> Result<ConfidenceHead>,
) -> Result<Fitted> {
    let padded = Padded::new(cells, shared)?;
    let folds = folds(labels, seed);
    let mut logits = vec![0.0; labels.len()];
    for (fold, held) in folds.iter().enumerate() {
        let kept: Vec<usize> = (0..labels.len()).filter(|row| !held.contains(row)).collect();
        let head = shipped(train(initial, &padded, labels, &kept, seed + fold as u64)?)?;
        for (&row, logit) in held.iter().zip(padded.logits(&head, held)?) {
            logits[row] = logit;
        }
    }
    let calibration = Calibration::platt(&logits, labels);
    let every: Vec<usize> = (0..labels.len()).collect();
    let head = train(initial, &padded, labels, &every, seed)?;
    let scored: Vec<Scored> =
        logits.iter().zip(labels).map(|(&confidence, &exact)| Scored { exact, confidence }).collect();
    Ok(Fitted { head, calibration, auroc: auroc(&scored) })
}

/// Rows split into folds with the right and wrong answers spread evenly (stratified), seeded;
/// as many folds as the rarer label has rows, at most [`FOLDS`], and at least 2.
fn folds(labels: &[bool], seed: u64) -> Vec<Vec<usize>> {
    let rarer = labels.iter().filter(|&&right| right).count().min(labels.iter().filter(|&&right| !right).count());
    let count = rarer.clamp(2, FOLDS).min(labels.len().max(1));
    let mut rng = StdRng::seed_from_u64(seed);
    let mut folds = vec![Vec::new(); count];
    let mut next = 0;
    for label in [true, false] {
        let mut rows: Vec<usize> = (0..labels.len()).filter(|&row| labels[row] == label).collect();
        rows.shuffle(&mut rng);
        for row in rows {
            folds[next % count].push(row);
            next += 1;
        }
    }
    folds.retain(|fold| !fold.is_empty());
    folds.iter_mut().for_each(|fold| fold.sort_unstable());
    folds
}

/// The prefix every row shares, `[1, P, R, d]` (none when `P` is 0), and each row's own cells
/// after it padded to the longest, `[N, T, R, d]`, with the keep mask `[N, T]`: batches are then
/// rows picked from them, and every step pools the prefix once for all of its rows
/// ([`ConfidenceHead::logits_after`]).
struct Padded {
    prefix: Option<Tensor>,
    cells: Tensor,
    keep: Tensor,
}

impl Padded {
    fn new(rows: &[Tensor], shared: usize) -> Result<Self> {
        let lengths = rows.iter().map(|cells| cells.dim(1)).collect::<candle_core::Result<Vec<_>>>()?;
        let longest = lengths.iter().copied().max().unwrap_or(0);
        // Every row keeps the prefix, and the rows keep a token of their own between them.
        let shared = shared.min(lengths.iter().copied().min().unwrap_or(0)).min(longest.saturating_sub(1));
        let prefix = match (shared, rows.first()) {
            (0, _) | (_, None) => None,
            (_, Some(first)) => Some(first.narrow(1, 0, shared)?.to_dtype(DType::F32)?),
        };
        let own = longest - shared;
        let (mut cells, mut keep) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
        for row in rows {
            let (_, t, r, d) = row.dims4()?;
            let padding = Tensor::zeros((1, longest - t, r, d), DType::F32, row.device())?;
            cells.push(Tensor::cat(&[&row.narrow(1, shared, t - shared)?.to_dtype(DType::F32)?, &padding], 1)?);
            let mask: Vec<f32> = (shared..longest).map(|i| f32::from(u8::from(i < t))).collect();
            keep.push(Tensor::from_vec(mask, (1, own), row.device())?);
        }
        Ok(Self { prefix, cells: Tensor::cat(&cells, 0)?, keep: Tensor::cat(&keep, 0)? })
    }

    /// The head's logits `[B]` of the rows `rows`, their prefix included.
    fn forward(&self, head: &ConfidenceHead, rows: &[usize]) -> Result<Tensor> {
        let (cells, keep) = self.batch(rows)?;
        match &self.prefix {
            Some(prefix) => head.logits_after(prefix, &cells, &keep),
            None => head.logits(&cells, &keep, None),
        }
    }

    /// `(cells, keep)` of the rows `rows`.
    fn batch(&self, rows: &[usize]) -> Result<(Tensor, Tensor)> {
        let index = Tensor::from_vec(rows.iter().map(|&r| r as u32).collect(), rows.len(), self.cells.device())?;
        Ok((self.cells.index_select(&index, 0)?, self.keep.index_select(&index, 0)?))
    }

    /// The head's logit of each of `rows`.
    fn logits(&self, head: &ConfidenceHead, rows: &[usize]) -> Result<Vec<f64>> {
        let mut logits = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(BATCH) {
            logits.extend(self.forward(head, chunk)?.to_vec1::<f32>()?.into_iter().map(f64::from));
        }
        Ok(logits)
    }
}

/// A head fitted from `initial` on `rows`: Adam on the binary cross-entropy of its logits, each
/// label weighted so that right and wrong answers count alike (a tuned model gets most of its
/// training rows right).
fn train(
    initial: &ConfidenceHead,
    padded: &Padded,
    labels: &[bool],
    rows: &[usize],
    seed: u64,
) -> Result<ConfidenceHead> {
    let vars = initial.tensors().into_iter().map(|t| Var::from_tensor(&t)).collect::<candle_core::Result<Vec<_>>>()?;
    let config = AdamWConfig { weight_decay: 0.0, ..AdamWConfig::default() };
    let mut optimizer = AdamW::new(config, &vars)?;
    let positives = rows.iter().filter(|&&row| labels[row]).count().max(1) as f64;
    let negatives = (rows.len() as f64 - positives).max(1.0);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut order = rows.to_vec();
    let mut at = order.len();
    for _ in 0..STEPS {
        if at + BATCH > order.len() {
            order.shuffle(&mut rng);
            at = 0;
        }
        let batch = &order[at..(at + BATCH).min(order.len())];
        at += BATCH;
        let head = initial.with_tensors(vars.iter().map(|v| v.as_tensor().clone()).collect());
        let logits = padded.forward(&head, batch)?;
        let (targets, weights): (Vec<f32>, Vec<f32>) = batch
            .iter()
            .map(|&row| match labels[row] {
                true => (1.0, (rows.len() as f64 / (2.0 * positives)) as f32),
                false => (0.0, (rows.len() as f64 / (2.0 * negatives)) as f32),
            })
            .unzip();
        let device = logits.device();
        let (targets, weights) = (Tensor::new(targets, device)?, Tensor::new(weights, device)?);
        let loss = (binary_cross_entropy(&logits, &targets)? * weights)?.mean(D::Minus1)?;
        let grads = loss.backward()?;
        let grads = vars
            .iter()
            .map(|v| grads.get(v.as_tensor()).map_or_else(|| v.zeros_like(), |g| Ok(g.clone())))
            .collect::<candle_core::Result<Vec<_>>>()?;
        optimizer.step(&vars, &grads, LEARNING_RATE)?;
    }
    Ok(initial.with_tensors(vars.iter().map(|v| v.as_tensor().detach()).collect()))
}

/// `softplus(x) − t·x`: the cross-entropy of `σ(x)` against targets `t`, stable for large `|x|`.
fn binary_cross_entropy(logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    // softplus(x) = max(x, 0) + ln(1 + e^(−|x|))
    let softplus = (logits.relu()? + (logits.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
    softplus - (targets * logits)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::Generation;

    #[test]
    fn logits_all_alike_calibrate_to_the_base_rate() {
        // What the head that ships reads as: a finite calibration that says the share right.
        let labels = [true, true, true, false];
        let fit = Calibration::platt(&[0.25; 4], &labels);
        assert_eq!(fit.scale, 0.0);
        let (high, low) = (4.0 / 5.0, 1.0 / 3.0);
        assert!((fit.confidence(0.25) - (3.0 * high + low) / 4.0).abs() < 1e-12, "{fit:?}");
    }

    #[test]
    fn platt_scaling_recovers_a_known_sigmoid() {
        // Labels drawn from σ(2x − 1): the fit comes back near (2, −1).
        let mut rng = StdRng::seed_from_u64(7);
        let uniform = rand_distr::Uniform::new(0.0f64, 1.0).unwrap();
        let logits: Vec<f64> = (0..4000).map(|i| -3.0 + 6.0 * (i as f64) / 4000.0).collect();
        let truth = Calibration { scale: 2.0, shift: -1.0 };
        let labels: Vec<bool> = logits.iter().map(|&x| uniform.sample(&mut rng) < truth.confidence(x)).collect();
        let fit = Calibration::platt(&logits, &labels);
        assert!((fit.scale - 2.0).abs() < 0.2 && (fit.shift + 1.0).abs() < 0.15, "{fit:?}");
    }

    /// Rows whose right answers carry a direction in their cells that the wrong ones lack: a head
    /// fitted from the reference's initialisation learns to tell them apart on rows it never saw.
    #[test]
    fn a_cross_fitted_head_learns_what_tells_right_from_wrong() {
        for generation in [Generation::Needle2, Generation::Needle3] {
            let cfg = ModelConfig { d_model: 16, num_layers: 2, generation, ..ModelConfig::defaults_for(generation) };
            let device = Device::Cpu;
            let initial = ConfidenceHead::initial(&cfg, &device, 1).unwrap();
            let mut rng = StdRng::seed_from_u64(3);
            let noise = Normal::new(0.0f32, 1.0).unwrap();
            let labels: Vec<bool> = (0..60).map(|i| i % 3 != 0).collect();
            // Every row begins with the same 3 tokens, as rows share an app's tools prompt.
            let prefix: Vec<f32> = (0..3 * 3 * 16).map(|_| noise.sample(&mut rng)).collect();
            let prefix = Tensor::from_vec(prefix, (1, 3, 3, 16), &device).unwrap();
            let cells: Vec<Tensor> = labels
                .iter()
                .enumerate()
                .map(|(i, &right)| {
                    let t = 5 + i % 4;
                    let mut values: Vec<f32> = (0..t * 3 * 16).map(|_| noise.sample(&mut rng)).collect();
                    if right {
                        values.iter_mut().step_by(16).for_each(|v| *v += 1.5);
                    }
                    let own = Tensor::from_vec(values, (1, t, 3, 16), &device).unwrap();
                    Tensor::cat(&[&prefix, &own], 1).unwrap()
                })
                .collect();
            let fitted = cross_fit(&initial, &cells, 3, &labels, 0, Ok).unwrap();
            let auroc = fitted.auroc.unwrap();
            assert!(auroc > 0.9, "{generation:?}: cross-fitted AUROC {auroc}");
            assert!(fitted.calibration.scale > 0.0, "{:?}", fitted.calibration);
            // The shipped head is fitted on every row and keeps the initial head's shapes.
            let shapes = |head: &ConfidenceHead| head.tensors().iter().map(|t| t.dims().to_vec()).collect::<Vec<_>>();
            assert_eq!(shapes(&fitted.head), shapes(&initial));
            let probes = |head: &ConfidenceHead| head.tensors()[0].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_ne!(probes(&fitted.head), probes(&initial), "the probes moved");
            // Pooling the prefix once per step fits the head that pooling whole rows fits.
            let whole = cross_fit(&initial, &cells, 0, &labels, 0, Ok).unwrap();
            let apart =
                probes(&fitted.head).iter().zip(probes(&whole.head)).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(apart < 1e-4, "{generation:?}: probes {apart} apart");
            assert!((fitted.auroc.unwrap() - whole.auroc.unwrap()).abs() < 0.01, "{generation:?}");
            assert!((fitted.calibration.scale - whole.calibration.scale).abs() < 1e-3, "{generation:?}");
        }
    }

    /// Rows sharing a prefix, pooled with the prefix once: the logits of the whole rows, for both
    /// generations, rows with no token of their own among them.
    #[test]
    fn pooling_a_shared_prefix_once_gives_the_whole_rows_logits() {
        for generation in [Generation::Needle2, Generation::Needle3] {
            let cfg = ModelConfig { d_model: 16, num_layers: 2, generation, ..ModelConfig::defaults_for(generation) };
            let device = Device::Cpu;
            let head = ConfidenceHead::initial(&cfg, &device, 4).unwrap();
            let mut rng = StdRng::seed_from_u64(9);
            let noise = Normal::new(0.0f32, 3.0).unwrap();
            let mut random = |t: usize| {
                let values: Vec<f32> = (0..t * 3 * 16).map(|_| noise.sample(&mut rng)).collect();
                Tensor::from_vec(values, (1, t, 3, 16), &device).unwrap()
            };
            let prefix = random(7);
            let rows: Vec<Tensor> =
                [5, 0, 2, 9].iter().map(|&own| Tensor::cat(&[&prefix, &random(own)], 1).unwrap()).collect();
            let padded = Padded::new(&rows, 7).unwrap();
            assert!(padded.prefix.is_some());
            let pooled = padded.forward(&head, &[0, 1, 2, 3]).unwrap().to_vec1::<f32>().unwrap();
            for (row, cells) in rows.iter().enumerate() {
                let keep = Tensor::ones((1, cells.dim(1).unwrap()), DType::F32, &device).unwrap();
                let whole = head.logits(cells, &keep, None).unwrap().to_vec1::<f32>().unwrap()[0];
                assert!((pooled[row] - whole).abs() < 1e-5, "{generation:?} row {row}: {} vs {whole}", pooled[row]);
            }
        }
    }

    #[test]
    fn folds_spread_both_labels_and_cover_every_row_once() {
        let labels: Vec<bool> = (0..23).map(|i| i % 4 == 0).collect();
        let folds = folds(&labels, 5);
        assert_eq!(folds.len(), FOLDS);
        let mut every: Vec<usize> = folds.concat();
        every.sort_unstable();
        assert_eq!(every, (0..23).collect::<Vec<_>>());
        assert!(folds.iter().all(|fold| fold.iter().any(|&row| labels[row])), "{folds:?}");
        // Only two wrong answers: two folds.
        assert_eq!(super::folds(&[true, true, false, true, false, true], 0).len(), 2);
    }
}
