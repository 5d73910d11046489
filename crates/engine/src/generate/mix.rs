//! The share of the new rows each category takes, when the user sets one: rows with no call (the
//! requests a model must hold back on: a required value left out, a negated request, a value
//! outside a tool's bounds, a request no tool serves) and rows with several calls at once. A share
//! left unset leaves its category to the LLM, as the reference does; the unset categories share the
//! rows the set ones leave.

use crate::dataset::RowCategory;

use super::error::GenerateError;

/// The shares asked for, each of all the new rows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Mix {
    /// Rows answered with no call.
    pub negative: Option<f64>,
    /// Rows with two calls or more.
    pub parallel: Option<f64>,
}

impl Mix {
    /// Whether any share is set: without one, batches are asked for as the reference asks them.
    pub fn is_set(&self) -> bool {
        self.negative.is_some() || self.parallel.is_some()
    }

    /// Each share within [0, 1], together at most 1.
    pub fn check(&self) -> Result<(), GenerateError> {
        for (what, share) in [("--negative-share", self.negative), ("--parallel-share", self.parallel)] {
            if let Some(share) = share.filter(|share| !(0.0..=1.0).contains(share)) {
                return Err(GenerateError::Share { what, share });
            }
        }
        let (negative, parallel) = (self.negative.unwrap_or(0.0), self.parallel.unwrap_or(0.0));
        if negative + parallel > 1.0 {
            return Err(GenerateError::Shares { negative, parallel });
        }
        Ok(())
    }

    fn share(&self, category: RowCategory) -> Option<f64> {
        match category {
            RowCategory::Positive => None,
            RowCategory::Parallel => self.parallel,
            RowCategory::NoCall => self.negative,
        }
    }
}

/// How many of a number of rows each category may take: a set share's rounded count, and the
/// rows left to the categories whose share is unset, together.
#[derive(Debug, Clone, PartialEq)]
pub struct Quotas {
    /// Per [`RowCategory::ALL`]: the count of a category with a set share.
    fixed: [Option<usize>; 3],
    /// The rows the unset categories share.
    rest: usize,
}

impl Quotas {
    pub fn new(mix: &Mix, rows: usize) -> Self {
        let mut left = rows;
        let fixed = RowCategory::ALL.map(|category| {
            let count = (rows as f64 * mix.share(category)?).round() as usize;
            // Two halves rounded up could ask for one row more than there is.
            let count = count.min(left);
            left -= count;
            Some(count)
        });
        Self { fixed, rest: left }
    }

    /// Whether one more row of `category` fits, given the rows `kept` per category so far.
    pub fn admits(&self, category: RowCategory, kept: &[usize; 3]) -> bool {
        match self.fixed[category.index()] {
            Some(count) => kept[category.index()] < count,
            None => {
                let unset: usize = (0..3).filter(|&i| self.fixed[i].is_none()).map(|i| kept[i]).sum();
                unset < self.rest
            }
        }
    }

    /// The count set for `category`, or `None` when it shares [`Quotas::rest`] with the other unset ones.
    pub fn fixed(&self, category: RowCategory) -> Option<usize> {
        self.fixed[category.index()]
    }

    pub fn rest(&self) -> usize {
        self.rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_shares_are_counts_and_the_unset_categories_share_the_rest() {
        let mix = Mix { negative: Some(0.3), parallel: None };
        let quotas = Quotas::new(&mix, 25);
        assert_eq!(
            (quotas.fixed(RowCategory::NoCall), quotas.fixed(RowCategory::Positive), quotas.rest()),
            (Some(8), None, 17),
            "7.5 rounds up"
        );
        // 8 rows with no call, then no more; one and several calls together up to 17.
        assert!(quotas.admits(RowCategory::NoCall, &[0, 0, 7]));
        assert!(!quotas.admits(RowCategory::NoCall, &[0, 0, 8]));
        assert!(quotas.admits(RowCategory::Parallel, &[10, 6, 0]));
        assert!(!quotas.admits(RowCategory::Positive, &[11, 6, 8]));

        let both = Quotas::new(&Mix { negative: Some(0.5), parallel: Some(0.5) }, 3);
        let counts = (both.fixed(RowCategory::Parallel), both.fixed(RowCategory::NoCall), both.rest());
        assert_eq!(counts, (Some(2), Some(1), 0), "1.5 and 1.5 never ask for 4 of 3 rows");
        assert!(!both.admits(RowCategory::Positive, &[0, 0, 0]), "no row is left for single calls");
    }

    #[test]
    fn shares_outside_zero_to_one_or_over_one_together_are_errors() {
        let error = Mix { negative: Some(1.5), parallel: None }.check().unwrap_err().to_string();
        assert!(error.contains("--negative-share") && error.contains("1.5"), "{error}");
        let error = Mix { negative: Some(0.7), parallel: Some(0.4) }.check().unwrap_err().to_string();
        assert!(error.contains("0.7") && error.contains("0.4"), "{error}");
        assert!(Mix { negative: Some(f64::NAN), parallel: None }.check().is_err());
        assert!(Mix { negative: Some(0.3), parallel: Some(0.1) }.check().is_ok());
        assert!(!Mix::default().is_set());
    }
}
