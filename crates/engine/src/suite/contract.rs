//! cactus-needle 3.x's acceptance rule (`needle/environments/_harness.py`): a turn's calls match
//! the expected ones when the sorted lists of their canonical JSON are equal (strings casefolded,
//! integral floats as integers, object keys sorted; so call order does not matter, a duplicated
//! call does); a suite passes when `passed >= round(0.9 * n)` (Python's `round`, halves to even)
//! with no critical case failed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checks::Call;

/// The share of cases a suite must pass, before rounding.
pub const PASS_SHARE: f64 = 0.9;

/// Whether `given` are the `expected` calls, as the reference's harness compares them.
pub fn same_calls(given: &[Call], expected: &[Call]) -> bool {
    let keys = |calls: &[Call]| {
        let mut keys: Vec<String> = calls.iter().map(canonical).collect();
        keys.sort();
        keys
    };
    keys(given) == keys(expected)
}

/// A call's canonical JSON (`_key`): keys sorted, string values casefolded (keys are not), an
/// integral float written as the integer it is.
pub fn canonical(call: &Call) -> String {
    folded(&call.to_value()).to_string()
}

/// `_fold`, with object keys sorted as `json.dumps(sort_keys=True)` sorts them.
fn folded(value: &Value) -> Value {
    match value {
        Value::String(text) => Value::String(caseless::default_case_fold_str(text)),
        Value::Number(number) => Value::Number(canonical_number(number)),
        Value::Array(items) => Value::Array(items.iter().map(folded).collect()),
        Value::Object(fields) => {
            let mut sorted: Vec<(&String, &Value)> = fields.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(sorted.into_iter().map(|(key, value)| (key.clone(), folded(value))).collect())
        }
        Value::Bool(_) | Value::Null => value.clone(),
    }
}

/// A number as one spelling per value: an integer as its digits (`-0` as `0`); a float as its
/// shortest round-trip form, or as the exact integer when it is integral (Python's
/// `int(18.0)`), so `18.0` and `18` are one key and `0.50` and `0.5` another.
fn canonical_number(number: &serde_json::Number) -> serde_json::Number {
    let text = number.as_str();
    let written_as_float = text.contains(['.', 'e', 'E']);
    let spelled = match (written_as_float, text.parse::<f64>()) {
        (true, Ok(x)) if x.fract() == 0.0 => format!("{:.0}", x + 0.0),
        (true, Ok(x)) => format!("{x:?}"),
        // An integer, whatever its size: its digits, without a sign on zero or leading zeros.
        _ => match text.trim_start_matches('-').trim_start_matches('0') {
            "" => "0".to_string(),
            digits if text.starts_with('-') => format!("-{digits}"),
            digits => digits.to_string(),
        },
    };
    spelled.parse().unwrap_or_else(|_| number.clone())
}

/// How many of `total` cases a suite must pass: `round(0.9 * total)`, halves to even.
pub fn required_passes(total: usize) -> usize {
    (PASS_SHARE * total as f64).round_ties_even() as usize
}

/// A suite's outcome over its cases' verdicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub passed: usize,
    pub total: usize,
    pub critical_failures: usize,
    /// `passed >= round(0.9 * total)` and no critical failure.
    pub contract: bool,
}

impl Tally {
    /// The outcome of cases given as `(pass, critical)`.
    pub fn of(verdicts: impl IntoIterator<Item = (bool, bool)>) -> Self {
        let (mut passed, mut total, mut critical_failures) = (0, 0, 0);
        for (pass, critical) in verdicts {
            total += 1;
            passed += usize::from(pass);
            critical_failures += usize::from(!pass && critical);
        }
        let contract = passed >= required_passes(total) && critical_failures == 0;
        Self { passed, total, critical_failures, contract }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn calls(value: Value) -> Vec<Call> {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn canonical_calls_fold_case_and_integral_floats_and_sort_keys() {
        let a = calls(json!([{"name": "Set", "arguments": {"b": "Living Room", "a": 18.0, "c": [1.50, "STRASSE"]}}]));
        let b = calls(json!([{"name": "set", "arguments": {"a": 18, "c": [1.5, "straße"], "b": "living room"}}]));
        assert!(same_calls(&a, &b));
        assert_eq!(canonical(&b[0]), r#"{"arguments":{"a":18,"b":"living room","c":[1.5,"strasse"]},"name":"set"}"#);
        // Keys are not folded; 18.5 is not 18; "18" is not 18.
        assert!(!same_calls(
            &calls(json!([{"name": "s", "arguments": {"A": 1}}])),
            &calls(json!([{"name": "s", "arguments": {"a": 1}}]))
        ));
        assert!(!same_calls(
            &calls(json!([{"name": "s", "arguments": {"t": 18.5}}])),
            &calls(json!([{"name": "s", "arguments": {"t": 18}}]))
        ));
        assert!(!same_calls(
            &calls(json!([{"name": "s", "arguments": {"t": "18"}}])),
            &calls(json!([{"name": "s", "arguments": {"t": 18}}]))
        ));
        assert!(same_calls(
            &calls(json!([{"name": "s", "arguments": {"t": -0.0, "u": 1e2}}])),
            &calls(json!([{"name": "s", "arguments": {"t": 0, "u": 100}}]))
        ));
    }

    #[test]
    fn call_order_does_not_matter_and_duplicates_do() {
        let one = json!({"name": "a", "arguments": {}});
        let two = json!({"name": "b", "arguments": {"x": 1}});
        assert!(same_calls(&calls(json!([one, two])), &calls(json!([two, one]))));
        assert!(!same_calls(&calls(json!([one, one])), &calls(json!([one]))), "a duplicated call is another answer");
        assert!(!same_calls(&calls(json!([one, one, two])), &calls(json!([one, two, two]))));
        assert!(same_calls(&[], &[]));
        assert!(!same_calls(&calls(json!([one])), &[]));
    }

    #[test]
    fn the_pass_mark_rounds_halves_to_even() {
        // 0.9 × 5 = 4.5 → 4, 0.9 × 25 = 22.5 → 22, 0.9 × 45 = 40.5 → 40 (Python's round), and no half elsewhere.
        let marks: Vec<usize> = [5, 25, 45, 32, 10, 1, 0].map(required_passes).to_vec();
        assert_eq!(marks, [4, 22, 40, 29, 9, 1, 0]);
        let tally = |passed: usize, total: usize, critical_failures: usize| {
            let verdicts = (0..total).map(|i| (i < passed, i >= passed && i < passed + critical_failures));
            Tally::of(verdicts)
        };
        for (n, mark) in [(5, 4), (25, 22), (45, 40)] {
            assert!(tally(mark, n, 0).contract, "{mark}/{n}");
            assert!(!tally(mark - 1, n, 0).contract, "{}/{n}", mark - 1);
            assert!(!tally(mark, n, 1).contract, "{mark}/{n} with a critical failure");
        }
        assert_eq!(tally(30, 32, 1), Tally { passed: 30, total: 32, critical_failures: 1, contract: false });
    }
}
