//! Fitting a confidence head to a tuned model's own answers, and calibrating it.
//!
//! The head's inputs are the hidden cells of the shipped model (computed once, so no gradient
//! reaches the network or its adapter: the reference's `stop_gradient`), its label whether the
//! model's answer was exact. Calibration is Platt scaling on cross-fitted logits: the rows are
//! split into folds, a head is fitted on all folds but one and scores that one, so every row's
//! logit comes from a head that never saw it; `σ(a·logit + b)` is fitted on those logits, and the
//! head that ships is then fitted on every row.

use candle_core::{DType, Tensor, Var};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

use super::forward::HeadStack;
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
    let fits = fits(&folds, labels.len(), seed);
    let mut heads = train(initial, &padded, labels, &fits)?;
    let head = heads.pop().expect("the head that ships is the last fitted");
    let logits = out_of_fold(&padded, &folds, heads, shipped)?;
    let calibration = Calibration::platt(&logits, labels);
    let scored: Vec<Scored> =
        logits.iter().zip(labels).map(|(&confidence, &exact)| Scored { exact, confidence }).collect();
    Ok(Fitted { head, calibration, auroc: auroc(&scored) })
}

/// The rows one head is fitted on, and the seed of their order.
#[derive(Debug, Clone)]
struct Fit {
    rows: Vec<usize>,
    seed: u64,
}

/// The heads a cross-fit fits: one per fold, on every other fold's rows, then the head that ships,
/// on all `count` rows.
fn fits(folds: &[Vec<usize>], count: usize, seed: u64) -> Vec<Fit> {
    let mut fits: Vec<Fit> = folds
        .iter()
        .enumerate()
        .map(|(fold, held)| Fit {
            rows: (0..count).filter(|row| !held.contains(row)).collect(),
            seed: seed + fold as u64,
        })
        .collect();
    fits.push(Fit { rows: (0..count).collect(), seed });
    fits
}

/// Each row's logit from the head that did not see it: fold `i`'s rows scored by `heads[i]` as it
/// ships.
fn out_of_fold(
    padded: &Padded,
    folds: &[Vec<usize>],
    heads: Vec<ConfidenceHead>,
    shipped: impl Fn(ConfidenceHead) -> Result<ConfidenceHead>,
) -> Result<Vec<f64>> {
    let mut logits = vec![0.0; padded.keep.dim(0)?];
    for (held, head) in folds.iter().zip(heads) {
        for (&row, logit) in held.iter().zip(padded.logits(&shipped(head)?, held)?) {
            logits[row] = logit;
        }
    }
    Ok(logits)
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
/// after it padded to the longest, `[N, T, R, d]`, with the keep mask `[N, T]` and each row's own
/// length: batches are then rows picked from them, cut to their longest row, and every update
/// pools the prefix once for all of its rows and heads ([`HeadStack::logits`]).
struct Padded {
    prefix: Option<Tensor>,
    cells: Tensor,
    keep: Tensor,
    own: Vec<usize>,
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
        let own = lengths.iter().map(|t| t - shared).collect();
        Ok(Self { prefix, cells: Tensor::cat(&cells, 0)?, keep: Tensor::cat(&keep, 0)?, own })
    }

    /// The logits `[H, B]` of `stack`'s heads, head `h` reading the rows `batches[h]` (`B` each),
    /// their prefix included.
    fn forward(&self, stack: &HeadStack, batches: &[&[usize]]) -> Result<Tensor> {
        let rows = batches.iter().map(|rows| self.batch(rows)).collect::<Result<Vec<_>>>()?;
        stack.logits(self.prefix.as_ref(), &rows, None)
    }

    /// `(cells, keep)` of the rows `rows`, cut to the longest of them (a row with no token of its
    /// own keeps one padding position, masked).
    fn batch(&self, rows: &[usize]) -> Result<(Tensor, Tensor)> {
        let longest = rows.iter().map(|&row| self.own[row]).max().unwrap_or(0).max(1);
        // A row's first tokens are one contiguous block of it: each is copied once.
        let pick = |all: &Tensor| {
            let picked =
                rows.iter().map(|&row| all.get(row)?.narrow(0, 0, longest)).collect::<candle_core::Result<Vec<_>>>()?;
            Tensor::stack(&picked, 0)
        };
        Ok((pick(&self.cells)?, pick(&self.keep)?))
    }

    /// `head`'s logit of each of `rows`.
    fn logits(&self, head: &ConfidenceHead, rows: &[usize]) -> Result<Vec<f64>> {
        let stack = HeadStack::of(std::slice::from_ref(head))?;
        let mut logits = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(BATCH) {
            logits.extend(self.forward(&stack, &[chunk])?.flatten_all()?.to_vec1::<f32>()?.into_iter().map(f64::from));
        }
        Ok(logits)
    }
}

/// A head's rows in batches of [`BATCH`] (all of them when fewer), reshuffled (seeded) whenever a
/// whole batch no longer fits in what is left.
struct Batches {
    rng: StdRng,
    order: Vec<usize>,
    at: usize,
}

impl Batches {
    fn new(fit: &Fit) -> Self {
        Self { rng: StdRng::seed_from_u64(fit.seed), order: fit.rows.clone(), at: fit.rows.len() }
    }

    fn next(&mut self) -> &[usize] {
        if self.at + BATCH > self.order.len() {
            self.order.shuffle(&mut self.rng);
            self.at = 0;
        }
        let start = self.at;
        self.at += BATCH;
        &self.order[start..self.at.min(self.order.len())]
    }
}

/// Heads fitted from `initial`, one per entry of `fits` (in order), all at once: Adam on the binary
/// cross-entropy of their logits, each head on its own batches of its own rows, each label weighted
/// so that right and wrong answers count alike in it (a tuned model gets most of its training rows
/// right). The heads run as one stack, and the loss is the sum of each head's mean over its batch,
/// so each head's gradient is its own fit's; clipping is per head, and Adam's moments are per
/// parameter, so each head is fitted as if it were fitted alone (up to rounding).
fn train(initial: &ConfidenceHead, padded: &Padded, labels: &[bool], fits: &[Fit]) -> Result<Vec<ConfidenceHead>> {
    let stack = HeadStack::of(&vec![initial.clone(); fits.len()])?;
    let vars = stack.tensors().iter().map(Var::from_tensor).collect::<candle_core::Result<Vec<_>>>()?;
    let config = AdamWConfig { weight_decay: 0.0, ..AdamWConfig::default() };
    let mut optimizer = AdamW::new(config, &vars)?;
    // Each head's weight of a right and of a wrong answer, divided by its batches' size: the sum
    // over a batch is then the head's weighted mean.
    let weights: Vec<(f32, f32)> = fits
        .iter()
        .map(|fit| {
            let rows = fit.rows.len() as f64;
            let positives = fit.rows.iter().filter(|&&row| labels[row]).count().max(1) as f64;
            let negatives = (rows - positives).max(1.0);
            let batch = fit.rows.len().min(BATCH) as f64;
            ((rows / (2.0 * positives) / batch) as f32, (rows / (2.0 * negatives) / batch) as f32)
        })
        .collect();
    let width = fits.iter().map(|fit| fit.rows.len().min(BATCH)).max().unwrap_or(0);
    let mut batches: Vec<Batches> = fits.iter().map(Batches::new).collect();
    let device = padded.cells.device();
    for _ in 0..STEPS {
        // A head with fewer rows than the widest batch fills it with a row weighted 0.
        let (mut rows, mut targets, mut scales) = (Vec::new(), Vec::new(), Vec::new());
        for (batch, &(right, wrong)) in batches.iter_mut().zip(&weights) {
            let batch = batch.next();
            let mut filled = Vec::with_capacity(width);
            for slot in 0..width {
                let row = batch.get(slot).copied();
                let label = labels[row.unwrap_or(batch[0])];
                filled.push(row.unwrap_or(batch[0]));
                targets.push(f32::from(u8::from(label)));
                scales.push(match (row, label) {
                    (None, _) => 0.0,
                    (Some(_), true) => right,
                    (Some(_), false) => wrong,
                });
            }
            rows.push(filled);
        }
        let stack = stack.with_tensors(vars.iter().map(|v| v.as_tensor().clone()).collect());
        let logits = padded.forward(&stack, &rows.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
        let targets = Tensor::from_vec(targets, logits.shape(), device)?;
        let scales = Tensor::from_vec(scales, logits.shape(), device)?;
        let loss = (binary_cross_entropy(&logits, &targets)? * scales)?.sum_all()?;
        let grads = loss.backward()?;
        let grads = vars
            .iter()
            .map(|v| grads.get(v.as_tensor()).map_or_else(|| v.zeros_like(), |g| Ok(g.clone())))
            .collect::<candle_core::Result<Vec<_>>>()?;
        optimizer.update(&vars, &clip_each(&grads, config.max_grad_norm)?, LEARNING_RATE)?;
    }
    stack.with_tensors(vars.iter().map(|v| v.as_tensor().detach()).collect()).heads()
}

/// Stacked gradients `[H, …]` clipped head by head to a global norm of at most `limit` over that
/// head's own parameters: optax's `clip_by_global_norm` of each head's separate fit.
fn clip_each(grads: &[Tensor], limit: f64) -> Result<Vec<Tensor>> {
    let heads = grads[0].dim(0)?;
    let mut squares = Tensor::zeros(heads, DType::F32, grads[0].device())?;
    for grad in grads {
        squares = (squares + grad.sqr()?.reshape((heads, ()))?.sum(1)?)?;
    }
    let norm = squares.sqrt()?;
    // Unchanged below the limit, else scaled to it.
    let factor = norm.ge(limit)?.where_cond(&(norm.recip()? * limit)?, &norm.ones_like()?)?;
    grads
        .iter()
        .map(|grad| {
            let mut shape = vec![1; grad.rank()];
            shape[0] = heads;
            Ok(grad.broadcast_mul(&factor.reshape(shape)?)?)
        })
        .collect()
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

    /// 60 rows of cells `[1, 3 + 5…8, 3, 16]` beginning with the same 3 tokens, as rows share an
    /// app's tools prompt, and their labels: the right answers' cells carry a direction the wrong
    /// ones lack.
    fn separable_rows(device: &Device) -> (Vec<Tensor>, Vec<bool>) {
        let mut rng = StdRng::seed_from_u64(3);
        let noise = Normal::new(0.0f32, 1.0).unwrap();
        let labels: Vec<bool> = (0..60).map(|i| i % 3 != 0).collect();
        let prefix: Vec<f32> = (0..3 * 3 * 16).map(|_| noise.sample(&mut rng)).collect();
        let prefix = Tensor::from_vec(prefix, (1, 3, 3, 16), device).unwrap();
        let cells = labels
            .iter()
            .enumerate()
            .map(|(i, &right)| {
                let t = 5 + i % 4;
                let mut values: Vec<f32> = (0..t * 3 * 16).map(|_| noise.sample(&mut rng)).collect();
                if right {
                    values.iter_mut().step_by(16).for_each(|v| *v += 1.5);
                }
                let own = Tensor::from_vec(values, (1, t, 3, 16), device).unwrap();
                Tensor::cat(&[&prefix, &own], 1).unwrap()
            })
            .collect();
        (cells, labels)
    }

    /// A head fitted from the reference's initialisation learns to tell right from wrong answers on
    /// rows it never saw.
    #[test]
    fn a_cross_fitted_head_learns_what_tells_right_from_wrong() {
        for generation in [Generation::Needle2, Generation::Needle3] {
            let cfg = ModelConfig { d_model: 16, num_layers: 2, generation, ..ModelConfig::defaults_for(generation) };
            let device = Device::Cpu;
            let initial = ConfidenceHead::initial(&cfg, &device, 1).unwrap();
            let (cells, labels) = separable_rows(&device);
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
            let stack = HeadStack::of(std::slice::from_ref(&head)).unwrap();
            let pooled =
                padded.forward(&stack, &[&[0, 1, 2, 3]]).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (row, cells) in rows.iter().enumerate() {
                let keep = Tensor::ones((1, cells.dim(1).unwrap()), DType::F32, &device).unwrap();
                let whole = head.logits(cells, &keep, None).unwrap().to_vec1::<f32>().unwrap()[0];
                assert!((pooled[row] - whole).abs() < 1e-5, "{generation:?} row {row}: {} vs {whole}", pooled[row]);
            }
        }
    }

    /// The heads of a cross-fit fitted at once, as one stack, are the heads fitted one at a time:
    /// the same out-of-fold logits (through CQ for Needle 3, as they are calibrated), the same
    /// calibration, the same head shipped. A fold that keeps fewer rows than a batch (fitted beside
    /// heads with more) is among them.
    #[test]
    fn heads_fitted_together_are_the_heads_fitted_one_at_a_time() {
        for generation in [Generation::Needle2, Generation::Needle3] {
            let cfg = ModelConfig { d_model: 16, num_layers: 2, generation, ..ModelConfig::defaults_for(generation) };
            let device = Device::Cpu;
            let initial = ConfidenceHead::initial(&cfg, &device, 1).unwrap();
            let (cells, labels) = separable_rows(&device);
            let padded = Padded::new(&cells, 3).unwrap();
            let folds = folds(&labels, 0);
            let mut fits = fits(&folds, labels.len(), 0);
            fits.push(Fit { rows: (0..BATCH - 5).collect(), seed: 9 });
            let together = train(&initial, &padded, &labels, &fits).unwrap();
            let alone: Vec<ConfidenceHead> = fits
                .iter()
                .map(|fit| train(&initial, &padded, &labels, std::slice::from_ref(fit)).unwrap().remove(0))
                .collect();
            let shipped = |head: ConfidenceHead| head.through_cq();
            let oof = |heads: &[ConfidenceHead]| out_of_fold(&padded, &folds, heads.to_vec(), shipped).unwrap();
            let (a, b) = (oof(&together), oof(&alone));
            let apart = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
            assert!(apart < 1e-4, "{generation:?}: out-of-fold logits {apart} apart");
            let (ca, cb) = (Calibration::platt(&a, &labels), Calibration::platt(&b, &labels));
            assert!((ca.scale - cb.scale).abs() < 1e-3 && (ca.shift - cb.shift).abs() < 1e-3, "{ca:?} vs {cb:?}");
            for (fit, (x, y)) in together.iter().zip(&alone).enumerate() {
                for (p, q) in x.tensors().iter().zip(y.tensors()) {
                    let (p, q) = (
                        p.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        q.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    );
                    let apart = p.iter().zip(&q).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
                    assert!(apart < 1e-4, "{generation:?}: head {fit}'s parameters {apart} apart");
                }
            }
            // The heads did learn apart from one another: the stack does not tie them.
            let probes = |head: &ConfidenceHead| head.tensors()[0].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_ne!(probes(&together[0]), probes(&together[1]));
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
