//! The learning-rate schedule: optax's `warmup_cosine_decay_schedule(0, lr, warmup, total)`.

/// Linear warmup from 0 to `peak` over `warmup` steps, then cosine decay to 0 at `total`.
///
/// Evaluated in f32 with optax's operation order, so values equal the reference's bit for bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    pub peak: f64,
    pub warmup: usize,
    pub total: usize,
}

impl Schedule {
    /// The reference's choice for a run of `total` steps: `warmup = min(max(1, total // 20), total - 1)`.
    pub fn reference(peak: f64, total: usize) -> Self {
        Self { peak, warmup: (total / 20).max(1).min(total.saturating_sub(1)), total }
    }

    /// The learning rate used by the update with optimizer count `count` (0 for the first step).
    pub fn at(&self, count: usize) -> f32 {
        let peak = self.peak as f32;
        if count < self.warmup {
            // optax's linear_schedule: (init - end) * (1 - count / steps) + end, with init = 0.
            let fraction = 1.0 - count as f32 / self.warmup as f32;
            return -peak * fraction + peak;
        }
        // Only a zero-step run has no decay steps (optax rejects it); `max(1)` keeps that case finite.
        let decay = self.total.saturating_sub(self.warmup).max(1) as f32;
        let progress = ((count - self.warmup) as f32).min(decay);
        let cosine = 0.5 * (1.0 + (std::f32::consts::PI * progress / decay).cos());
        peak * cosine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Case {
        lr: f64,
        total: usize,
        warmup: usize,
        values: Vec<f64>,
    }

    #[derive(serde::Deserialize)]
    struct Golden {
        cases: Vec<Case>,
    }

    #[test]
    fn values_equal_the_reference_schedule() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/golden/schedule.json");
        let golden: Golden = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(golden.cases.len(), 10);
        for case in golden.cases {
            let schedule = Schedule::reference(case.lr, case.total);
            assert_eq!(schedule.warmup, case.warmup, "warmup for total {}", case.total);
            for (count, want) in case.values.iter().enumerate() {
                // The goldens are f32 values widened to f64; narrowing back is exact (and immune to
                // serde_json's last-bit rounding of long decimals).
                assert_eq!(schedule.at(count), *want as f32, "lr {} total {} at {count}", case.lr, case.total);
            }
        }
    }
}
