//! How far a model's confidence can be relied on, over answers whose exactness is known: how well it
//! tells right answers from wrong (AUROC), how close it is to the share of answers right (expected
//! calibration error, and the reliability table behind it), what a confidence gate at each
//! threshold keeps and stops (the trade-off table), and bootstrap intervals for AUROC and ECE.
//!
//! A gate acts on a turn at or above its threshold and stops it below, as [`CheckedAnswer`]'s gate
//! does, so the trade-off counts an answer at the threshold as kept.
//!
//! [`CheckedAnswer`]: crate::checks::CheckedAnswer

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Equal-width confidence bins of the reliability table and the ECE: `[0, 0.1)`, …, `[0.9, 1]`.
pub const BINS: usize = 10;
/// The trade-off table's thresholds: 0, 0.05, …, 1.
pub const THRESHOLD_STEPS: usize = 20;
/// The share of right answers a proposed threshold may stop at most.
pub const MAX_RIGHT_STOPPED: f64 = 0.10;
/// Bootstrap resamples behind each interval, the interval's coverage, and the resampling's seed
/// (fixed, so that a score reads the same each time).
pub const RESAMPLES: usize = 1000;
pub const COVERAGE: f64 = 0.90;
pub const SEED: u64 = 0;

/// One answer as the figures read it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    pub exact: bool,
    pub confidence: f64,
}

/// The figures over a set of answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reliability {
    pub answers: usize,
    /// How many are exact.
    pub right: usize,
    /// The chance that a right answer has a higher confidence than a wrong one (ties count half);
    /// `None` when the answers are all right or all wrong.
    #[serde(deserialize_with = "crate::train::events::number::optional_f64")]
    pub auroc: Option<f64>,
    /// Its bootstrap interval ([`COVERAGE`]); `None` with it.
    pub auroc_interval: Option<Interval>,
    /// Expected calibration error: over the [`BINS`], each bin's share of the answers times how far
    /// its mean confidence is from its share right.
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub ece: f64,
    pub ece_interval: Interval,
    /// The reliability table, one row per bin, empty ones too.
    pub bins: Vec<Bin>,
    /// What a gate at each threshold keeps and stops.
    pub tradeoff: Vec<Tradeoff>,
    /// The highest threshold of the table that stops at most [`MAX_RIGHT_STOPPED`] of the right
    /// answers: the gate an app is offered first.
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub proposed: f64,
}

/// A bootstrap percentile interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub low: f64,
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub high: f64,
}

/// One bin of the reliability table: confidences in `[from, to)` (the last bin closed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bin {
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub from: f64,
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub to: f64,
    pub answers: usize,
    pub right: usize,
    /// The bin's mean confidence; `None` for an empty bin.
    #[serde(deserialize_with = "crate::train::events::number::optional_f64")]
    pub confidence: Option<f64>,
}

/// A gate at `threshold`: the share of right answers it keeps (confidence ≥ threshold) and of
/// wrong ones it stops (below it); `None` where there are no such answers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tradeoff {
    #[serde(deserialize_with = "crate::train::events::number::f64")]
    pub threshold: f64,
    #[serde(deserialize_with = "crate::train::events::number::optional_f64")]
    pub kept_right: Option<f64>,
    #[serde(deserialize_with = "crate::train::events::number::optional_f64")]
    pub stopped_wrong: Option<f64>,
}

impl Reliability {
    /// The figures over `answers`, whatever their order; `None` for no answers.
    pub fn of(answers: &[Scored]) -> Option<Self> {
        if answers.is_empty() {
            return None;
        }
        // In one order (the resampling draws by position), so that the same answers read the same.
        let mut answers = answers.to_vec();
        answers.sort_by(|a, b| a.confidence.total_cmp(&b.confidence).then(a.exact.cmp(&b.exact)));
        let answers = answers.as_slice();
        let right = answers.iter().filter(|a| a.exact).count();
        let auroc = auroc(answers);
        let (auroc_interval, ece_interval) = intervals(answers);
        let tradeoff = tradeoff(answers);
        let proposed = (tradeoff.iter().rev())
            .find(|row| row.kept_right.is_none_or(|kept| kept >= 1.0 - MAX_RIGHT_STOPPED))
            .map_or(0.0, |row| row.threshold);
        Some(Self {
            answers: answers.len(),
            right,
            auroc,
            auroc_interval,
            ece: ece(answers),
            ece_interval,
            bins: bins(answers),
            tradeoff,
            proposed,
        })
    }

    /// The trade-off table's row at `threshold` (the nearest of its thresholds).
    pub fn at(&self, threshold: f64) -> Option<&Tradeoff> {
        let step = (threshold.clamp(0.0, 1.0) * THRESHOLD_STEPS as f64).round() as usize;
        self.tradeoff.get(step)
    }
}

/// The bin a confidence falls in (the last bin closed; a confidence outside [0, 1] in the nearest).
fn bin_of(confidence: f64) -> usize {
    ((confidence * BINS as f64).floor().max(0.0) as usize).min(BINS - 1)
}

/// The reliability table.
pub fn bins(answers: &[Scored]) -> Vec<Bin> {
    let mut bins: Vec<(usize, usize, f64)> = vec![(0, 0, 0.0); BINS];
    for answer in answers {
        let bin = &mut bins[bin_of(answer.confidence)];
        bin.0 += 1;
        bin.1 += usize::from(answer.exact);
        bin.2 += answer.confidence;
    }
    (bins.into_iter().enumerate())
        .map(|(i, (n, right, sum))| Bin {
            from: i as f64 / BINS as f64,
            to: (i + 1) as f64 / BINS as f64,
            answers: n,
            right,
            confidence: (n > 0).then(|| sum / n as f64),
        })
        .collect()
}

/// Expected calibration error over the [`BINS`]; 0 for no answers.
pub fn ece(answers: &[Scored]) -> f64 {
    let total = answers.len().max(1) as f64;
    (bins(answers).iter())
        .filter_map(|bin| {
            let confidence = bin.confidence?;
            let share_right = bin.right as f64 / bin.answers as f64;
            Some(bin.answers as f64 / total * (share_right - confidence).abs())
        })
        .sum()
}

/// The area under the ROC curve of confidence as a score for exactness, from mid-ranks (the
/// Mann-Whitney statistic, ties counted half); `None` without both right and wrong answers.
pub fn auroc(answers: &[Scored]) -> Option<f64> {
    let right = answers.iter().filter(|a| a.exact).count();
    let wrong = answers.len() - right;
    if right == 0 || wrong == 0 {
        return None;
    }
    let mut sorted: Vec<&Scored> = answers.iter().collect();
    sorted.sort_by(|a, b| a.confidence.total_cmp(&b.confidence));
    // Ranks from 1; a run of equal confidences each gets the run's mean rank.
    let mut rank_sum = 0.0;
    let mut start = 0;
    while start < sorted.len() {
        let end = start + sorted[start..].iter().take_while(|a| a.confidence == sorted[start].confidence).count();
        let mean_rank = (start + 1 + end) as f64 / 2.0;
        rank_sum += mean_rank * sorted[start..end].iter().filter(|a| a.exact).count() as f64;
        start = end;
    }
    let (right, wrong) = (right as f64, wrong as f64);
    Some((rank_sum - right * (right + 1.0) / 2.0) / (right * wrong))
}

/// The trade-off table at thresholds 0, 1/[`THRESHOLD_STEPS`], …, 1.
pub fn tradeoff(answers: &[Scored]) -> Vec<Tradeoff> {
    let share = |n: usize, of: usize| (of > 0).then(|| n as f64 / of as f64);
    let right = answers.iter().filter(|a| a.exact).count();
    let wrong = answers.len() - right;
    (0..=THRESHOLD_STEPS)
        .map(|step| {
            let threshold = step as f64 / THRESHOLD_STEPS as f64;
            let kept = answers.iter().filter(|a| a.exact && a.confidence >= threshold).count();
            let stopped = answers.iter().filter(|a| !a.exact && a.confidence < threshold).count();
            Tradeoff { threshold, kept_right: share(kept, right), stopped_wrong: share(stopped, wrong) }
        })
        .collect()
}

/// Bootstrap percentile intervals of AUROC (over the resamples that hold both right and wrong
/// answers; `None` when none do) and of ECE: [`RESAMPLES`] draws of as many answers, with
/// replacement, seeded with [`SEED`].
fn intervals(answers: &[Scored]) -> (Option<Interval>, Interval) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(SEED);
    let (mut aurocs, mut eces) = (Vec::with_capacity(RESAMPLES), Vec::with_capacity(RESAMPLES));
    let mut drawn = Vec::with_capacity(answers.len());
    for _ in 0..RESAMPLES {
        drawn.clear();
        drawn.extend((0..answers.len()).map(|_| answers[rng.random_range(0..answers.len())]));
        aurocs.extend(auroc(&drawn));
        eces.push(ece(&drawn));
    }
    let auroc = (!aurocs.is_empty()).then(|| percentile_interval(&mut aurocs));
    (auroc, percentile_interval(&mut eces))
}

/// The central [`COVERAGE`] of `values`, each end interpolated between order statistics as
/// numpy's `percentile` does by default.
fn percentile_interval(values: &mut [f64]) -> Interval {
    values.sort_by(f64::total_cmp);
    let tail = (1.0 - COVERAGE) / 2.0;
    Interval { low: percentile(values, tail), high: percentile(values, 1.0 - tail) }
}

/// The `q` quantile of sorted `values` (numpy's linear method).
fn percentile(values: &[f64], q: f64) -> f64 {
    let at = q * (values.len() - 1) as f64;
    let (below, above) = (at.floor() as usize, at.ceil() as usize);
    values[below] + (values[above] - values[below]) * (at - below as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scored(pairs: &[(bool, f64)]) -> Vec<Scored> {
        pairs.iter().map(|&(exact, confidence)| Scored { exact, confidence }).collect()
    }

    /// Right at 0.9, 0.8, 0.6, 0.4; wrong at 0.7, 0.4, 0.2.
    fn seven() -> Vec<Scored> {
        scored(&[(true, 0.9), (true, 0.8), (false, 0.7), (true, 0.6), (true, 0.4), (false, 0.4), (false, 0.2)])
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn auroc_counts_the_pairs_a_right_answer_wins_and_ties_half() {
        // By hand over the 4 × 3 pairs: 0.9 and 0.8 beat all three wrong (3 + 3), 0.6 beats 0.4 and
        // 0.2 (2), 0.4 ties 0.4 and beats 0.2 (0.5 + 1): 9.5 / 12. (sklearn's roc_auc_score agrees.)
        assert!(close(auroc(&seven()).unwrap(), 9.5 / 12.0));
        let separated = scored(&[(true, 0.9), (false, 0.1), (true, 0.5), (false, 0.4)]);
        assert_eq!(auroc(&separated), Some(1.0));
        let reversed = scored(&[(true, 0.1), (false, 0.9)]);
        assert_eq!(auroc(&reversed), Some(0.0));
        let all_tied = scored(&[(true, 0.5), (false, 0.5), (true, 0.5)]);
        assert_eq!(auroc(&all_tied), Some(0.5));
        assert_eq!(auroc(&scored(&[(true, 0.5), (true, 0.2)])), None, "no wrong answer to rank against");
    }

    #[test]
    fn ece_weighs_each_bins_gap_by_its_answers() {
        // Bins 9, 8, 7, 6 hold one answer each (gaps 0.1, 0.2, 0.7, 0.4), bin 4 two (half right at
        // 0.4: gap 0.1, twice), bin 2 one (0.2): (0.1 + 0.2 + 0.7 + 0.4 + 0.2 + 0.2) / 7.
        assert!(close(ece(&seven()), 1.8 / 7.0));
        let table = bins(&seven());
        assert_eq!(table.len(), BINS);
        assert_eq!((table[4].answers, table[4].right, table[4].confidence), (2, 1, Some(0.4)));
        assert_eq!((table[0].answers, table[0].confidence), (0, None));
        assert!(close(table[3].from, 0.3) && close(table[3].to, 0.4));
        // The last bin is closed: a confidence of 1 is in it, as is 0.9; 0.1 opens the second bin.
        let edges = bins(&scored(&[(true, 1.0), (true, 0.9), (false, 0.1), (false, 0.0)]));
        assert_eq!([edges[9].answers, edges[1].answers, edges[0].answers], [2, 1, 1]);
        // Perfectly calibrated: half right at 0.5.
        assert_eq!(ece(&scored(&[(true, 0.5), (false, 0.5)])), 0.0);
    }

    #[test]
    fn the_tradeoff_keeps_an_answer_at_the_threshold_and_the_proposal_stops_few_right_ones() {
        let table = tradeoff(&seven());
        assert_eq!(table.len(), THRESHOLD_STEPS + 1);
        assert_eq!(table[0], Tradeoff { threshold: 0.0, kept_right: Some(1.0), stopped_wrong: Some(0.0) });
        // At 0.4 the right 0.4 is kept and the wrong 0.4 not stopped; at 0.5 both go.
        let at = |t: f64| *Reliability::of(&seven()).unwrap().at(t).unwrap();
        assert_eq!((at(0.4).kept_right, at(0.4).stopped_wrong), (Some(1.0), Some(1.0 / 3.0)));
        assert_eq!((at(0.5).kept_right, at(0.5).stopped_wrong), (Some(0.75), Some(2.0 / 3.0)));
        assert_eq!((at(1.0).kept_right, at(1.0).stopped_wrong), (Some(0.0), Some(1.0)));
        // 0.45 would stop a quarter of the right answers: 0.4 is the highest that stops at most 10%.
        assert_eq!(Reliability::of(&seven()).unwrap().proposed, 0.4);
        let no_wrong = tradeoff(&scored(&[(true, 0.3)]));
        assert_eq!((no_wrong[10].kept_right, no_wrong[10].stopped_wrong), (Some(0.0), None));
    }

    #[test]
    fn the_intervals_are_seeded_and_hold_the_figures_of_a_clear_case() {
        let figures = Reliability::of(&seven()).unwrap();
        let reversed: Vec<Scored> = seven().into_iter().rev().collect();
        assert_eq!(Reliability::of(&reversed).unwrap(), figures, "the same answers, in any order, the same intervals");
        let (auroc, ece) = (figures.auroc_interval.unwrap(), figures.ece_interval);
        assert!(0.0 <= auroc.low && auroc.low < figures.auroc.unwrap() && figures.auroc.unwrap() <= auroc.high);
        assert!(auroc.high <= 1.0 && ece.low <= ece.high && ece.low >= 0.0 && ece.high <= 1.0, "{figures:?}");
        // Confidence that separates perfectly stays perfect in every resample with both kinds.
        let separated: Vec<Scored> =
            (0..20).map(|i| Scored { exact: i % 2 == 0, confidence: if i % 2 == 0 { 0.95 } else { 0.05 } }).collect();
        let figures = Reliability::of(&separated).unwrap();
        assert_eq!(figures.auroc_interval, Some(Interval { low: 1.0, high: 1.0 }));
        assert!(close(figures.ece, 0.05));
        assert_eq!(Reliability::of(&[]), None);
        let all_right = Reliability::of(&scored(&[(true, 0.9), (true, 0.7)])).unwrap();
        assert_eq!((all_right.auroc, all_right.auroc_interval), (None, None));
    }

    #[test]
    fn the_percentiles_interpolate_as_numpy() {
        // numpy.percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 95]) == [1.45, 9.55]
        let mut values: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let interval = percentile_interval(&mut values);
        assert!(close(interval.low, 1.45) && close(interval.high, 9.55), "{interval:?}");
    }

    #[test]
    fn the_figures_read_back_from_json() {
        let figures = Reliability::of(&seven()).unwrap();
        let line = serde_json::to_string(&figures).unwrap();
        assert_eq!(serde_json::from_str::<Reliability>(&line).unwrap(), figures);
    }
}
