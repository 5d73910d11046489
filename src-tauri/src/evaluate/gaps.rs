//! The tuned model's three rows in words: what quantizing it costs (float → simulated), and what the
//! built file adds to that (simulated → `.cact`), so the user reads a cause, not three numbers.

use needle_engine::cact::Bits;
use needle_engine::calls::QuantRows;

/// One sentence on `rows`, for a `.cact` of quantization `scheme` (`W4A8`, as the build reports it).
pub fn explain(rows: &QuantRows, scheme: &str) -> String {
    let [float, simulated, cact] = [&rows.float, &rows.simulated, &rows.cact].map(|row| row.calls.exact as i64);
    let quantizing = match float - simulated {
        0 => "costs nothing".to_string(),
        lost if lost > 0 => format!("costs {}", calls(lost)),
        won => format!("gains {}", calls(-won)),
    };
    let file = match simulated - cact {
        0 => "the file adds none".to_string(),
        lost if lost > 0 => format!("the file costs {} more", calls(lost)),
        won => format!("the file gets {} back", calls(-won)),
    };
    let simulated_width = format!("W{}A", Bits::Four);
    let width = match scheme.starts_with(&simulated_width) {
        true => String::new(),
        false => format!(
            " The simulation quantizes the weights to {} bits and this file is {scheme}, so the file's gap \
             includes the narrower weights.",
            Bits::Four
        ),
    };
    format!(
        "Quantizing the model ({}-bit weights, 8-bit activations) {quantizing}; {file}: {cact} of {} exact as \
         shipped, {float} as trained.{width}",
        Bits::Four,
        rows.cact.calls.examples
    )
}

/// `1 call`, `3 calls`.
fn calls(n: i64) -> String {
    match n {
        1 => "1 call".into(),
        n => format!("{n} calls"),
    }
}

#[cfg(test)]
mod tests {
    use needle_engine::calls::{Accuracy, ModelScore};

    use super::*;

    fn rows(float: usize, simulated: usize, cact: usize) -> QuantRows {
        let row = |exact| ModelScore {
            calls: Accuracy { examples: 24, exact, ..Accuracy::default() },
            ..ModelScore::default()
        };
        QuantRows { float: row(float), simulated: row(simulated), cact: row(cact) }
    }

    #[test]
    fn a_loss_to_quantizing_and_none_to_the_file() {
        assert_eq!(
            explain(&rows(18, 16, 16), "W4A8"),
            "Quantizing the model (4-bit weights, 8-bit activations) costs 2 calls; the file adds none: 16 of 24 \
             exact as shipped, 18 as trained."
        );
    }

    #[test]
    fn each_direction_of_each_gap_is_worded() {
        let said = explain(&rows(18, 18, 15), "W4A8");
        assert!(said.contains("costs nothing; the file costs 3 calls more: 15 of 24"), "{said}");
        let said = explain(&rows(17, 18, 19), "W4A8");
        assert!(said.contains("gains 1 call; the file gets 1 call back"), "{said}");
        let said = explain(&rows(18, 17, 18), "W4A8");
        assert!(said.contains("costs 1 call; the file gets 1 call back"), "{said}");
    }

    #[test]
    fn a_file_of_another_width_than_the_simulation_says_so() {
        let said = explain(&rows(18, 16, 9), "W2A8");
        assert!(said.ends_with("this file is W2A8, so the file's gap includes the narrower weights."), "{said}");
        assert!(!explain(&rows(18, 16, 9), "W4A8").contains("narrower"));
    }
}
