//! Test-only: the levels each quantizer picks, recorded on one compute path and followed on the
//! other, so that two paths which compute the same quantizer inputs up to float rounding can be
//! held to float rounding's tolerances under quantization-aware training.
//!
//! A quantizer turns a difference in an input's last bits into a whole level when the input sits
//! on the boundary between two levels, and no choice of data keeps every input away from one: in
//! the CPU parity tests' QAT pass some 240 000 activations are quantized, a handful of them within
//! 1e-6 of a level from a boundary (exact ties among them) and some 60 within 1e-4, while the two
//! paths' inputs differ by up to 1.5e-4 of a level. So the reference path records every row it
//! quantizes (each input in the quantizer's units, see [`Quantizer`], and the levels picked), and each row the path under test
//! quantizes is paired with the reference row nearest it in content. Its inputs must lie within
//! [`GAP`] of that row's (else the row is counted as unpaired), and where it still picks another
//! level, which can only be the neighbour across a boundary both inputs lie within [`GAP`] of, it
//! takes the reference's (a flip, counted). Everywhere else it rounds on its own.
//!
//! Only the threads of the pool [`LevelLog::recording`] builds feed the log: tests running beside
//! it are not seen, and a build other than the tests' has none of this.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The most two paired inputs may differ by, in the quantizer's units: float rounding moved them by
/// up to 1.5e-4 of an activation level on an AVX-512 Xeon (the paths' sums are taken in different
/// orders), a quantizer fed another row, or a row computed otherwise, by a good part of a level or
/// more.
pub const GAP: f32 = 1e-3;

/// Which quantizer picked the levels (rows of different quantizers are never paired), and the
/// units its inputs are logged in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quantizer {
    /// Activations to `bits`-bit integers (`fake_quant_row`), in levels (the row's absolute
    /// maximum over the largest level).
    Activations(u32),
    /// A group of weights to CQ's codebook (`quant::round_trip_row`), in units of the group's norm
    /// after its Walsh transform (the codebook's levels lie 0.023 of it apart or more).
    Cq,
}

thread_local! {
    static LOG: RefCell<Option<Arc<Mutex<LevelLog>>>> = const { RefCell::new(None) };
}

/// What the reference recorded and what the path under test was found to do.
#[derive(Default)]
pub struct LevelLog {
    following: bool,
    /// The reference's rows of each quantizer and width, ordered by their first input.
    reference: HashMap<(Quantizer, usize), Vec<Row>>,
    pub counts: Counts,
}

/// One quantized row: its inputs in level units and the levels picked.
struct Row {
    inputs: Vec<f32>,
    levels: Vec<f32>,
}

/// The path under test against the reference.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Rows paired with a reference row.
    pub paired: usize,
    /// Rows with no reference row within [`GAP`]: each one's quantizer, width and nearest gap.
    pub unpaired: Vec<(Quantizer, usize, f32)>,
    /// Inputs whose level was the reference's neighbour, taken over from the reference.
    pub flips: usize,
    /// The largest gap between paired inputs.
    pub widest_gap: f32,
}

impl LevelLog {
    /// A log in recording mode, and the pool whose threads feed it (run both paths in it).
    pub fn recording() -> (Arc<Mutex<LevelLog>>, rayon::ThreadPool) {
        let log = Arc::new(Mutex::new(LevelLog::default()));
        let fed = log.clone();
        let pool = rayon::ThreadPoolBuilder::new()
            .start_handler(move |_| LOG.with(|l| *l.borrow_mut() = Some(fed.clone())))
            .build()
            .expect("a thread pool");
        (log, pool)
    }

    /// From now on the rows quantized are paired with those recorded, not recorded.
    pub fn follow(&mut self) {
        self.reference.values_mut().for_each(|rows| rows.sort_by(|a, b| a.inputs[0].total_cmp(&b.inputs[0])));
        self.following = true;
    }

    fn observe(&mut self, quantizer: Quantizer, inputs: &[f32], levels: &mut [f32]) {
        if inputs.is_empty() || inputs.iter().all(|&u| u == 0.0) {
            return; // a row of zeros has no boundary near it
        }
        let rows = self.reference.entry((quantizer, inputs.len())).or_default();
        if !self.following {
            rows.push(Row { inputs: inputs.to_vec(), levels: levels.to_vec() });
            return;
        }
        let gap = |row: &Row| row.inputs.iter().zip(inputs).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        // Paired rows differ by less than GAP everywhere, so in their first input too.
        let first = rows.partition_point(|row| row.inputs[0] < inputs[0] - GAP);
        let nearest = rows[first..]
            .iter()
            .take_while(|row| row.inputs[0] <= inputs[0] + GAP)
            .map(|row| (gap(row), row))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let Some((widest, row)) = nearest.filter(|(gap, _)| *gap <= GAP) else {
            let nearest = rows.iter().map(gap).fold(f32::INFINITY, f32::min);
            self.counts.unpaired.push((quantizer, inputs.len(), nearest));
            return;
        };
        self.counts.paired += 1;
        self.counts.widest_gap = self.counts.widest_gap.max(widest);
        for (level, want) in levels.iter_mut().zip(&row.levels) {
            // The two inputs lie within GAP of each other, so levels that differ are neighbours
            // and the boundary between them lies between the inputs.
            if *level != *want {
                *level = *want;
                self.counts.flips += 1;
            }
        }
    }
}

/// Whether this thread feeds a log (a quantizer then computes its levels apart and calls
/// [`observe`]).
pub fn feeding() -> bool {
    LOG.with(|l| l.borrow().is_some())
}

/// A row's `inputs` (in level units) and the `levels` picked for them: recorded, or in following
/// mode replaced by the reference's where they differ by a boundary.
pub fn observe(quantizer: Quantizer, inputs: &[f32], levels: &mut [f32]) {
    LOG.with(|l| {
        if let Some(log) = l.borrow().as_ref() {
            log.lock().expect("the level log").observe(quantizer, inputs, levels);
        }
    });
}
