//! What a turn's answer is once checked, before anything acts on it: the calls acted on, the calls
//! withheld (each with its [`Reason`]) and the turn's confidence. `needle run`, `needle suite` and
//! the app read answers through this one type.
//!
//! A call is withheld when it does not fit its tool's JSON schema ([`schema`]: unknown tool,
//! missing required argument, undeclared argument, wrong type, value outside its `enum`, number
//! outside its bounds); then, as cactus-needle 3.x's harness does, every call of a turn is
//! withheld when one carries an ungrounded year ([`grounding`]), or when the turn's confidence is
//! below the gate the caller sets (0 gates nothing; the production contract uses 0.4).
//!
//! The confidence is the answer's decode probability ([`confidence`]) until a trained confidence
//! head gives one.
//!
//! ```json
//! {"calls": [{"name": "set_thermostat", "arguments": {"temperature": 21}}],
//!  "withheld": [{"call": {"name": "control_lights", "arguments": {"room": "garage", "action": "on"}},
//!                "reason": "not_in_enum", "argument": "room",
//!                "allowed": ["kitchen", "living_room", "bedroom", "study"], "given": "garage"}],
//!  "confidence": 0.87}
//! ```

pub mod confidence;
pub mod grounding;
pub mod reason;
pub mod schema;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use reason::{Bound, Reason};
pub use schema::Call;

/// A turn's answer after the checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckedAnswer {
    /// The calls to act on, in the order the model wrote them.
    pub calls: Vec<Call>,
    /// The calls not to act on, in the order written, each with why.
    pub withheld: Vec<Withheld>,
    /// How sure the model is of the turn, in [0, 1].
    pub confidence: f64,
}

/// A call the checks hold back: the call as the model wrote it, and the first reason found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Withheld {
    pub call: Value,
    #[serde(flatten)]
    pub reason: Reason,
}

/// What a turn is asked and offered, which the checks read.
#[derive(Debug, Clone, Copy)]
pub struct Turn<'a> {
    /// The tool schemas offered.
    pub tools: &'a [Value],
    pub query: &'a str,
    /// The system prompt (empty for none).
    pub system: &'a str,
}

impl CheckedAnswer {
    /// The `given` calls of an answer (`None`: it holds no call list, which is no call) with its
    /// `confidence`, checked for `turn`, the gate at `min_confidence`.
    pub fn check(given: Option<&[Value]>, confidence: f64, turn: Turn, min_confidence: f64) -> Self {
        let mut calls = Vec::new();
        let mut withheld = Vec::new();
        for call in given.unwrap_or_default() {
            match schema::check_call(turn.tools, call) {
                Ok(checked) => calls.push((call, checked)),
                Err(reason) => withheld.push(Withheld { call: call.clone(), reason: *reason }),
            }
        }
        let acted: Vec<Call> = calls.iter().map(|(_, call)| call.clone()).collect();
        let ungrounded = grounding::ungrounded(turn.tools, &acted, turn.query, turn.system);
        let turn_reason = match (ungrounded.iter().any(Option::is_some), confidence < min_confidence) {
            (true, _) => Some(Reason::UngroundedTurn),
            (false, true) if !calls.is_empty() => Some(Reason::BelowConfidence { min_confidence }),
            _ => None,
        };
        let Some(turn_reason) = turn_reason else {
            return Self { calls: acted, withheld, confidence };
        };
        for ((written, _), ungrounded) in calls.into_iter().zip(ungrounded) {
            let reason = match ungrounded {
                Some(grounding::Ungrounded { argument, year }) => Reason::UngroundedYear { argument, year },
                None => turn_reason.clone(),
            };
            withheld.push(Withheld { call: written.clone(), reason });
        }
        Self { calls: Vec::new(), withheld, confidence }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tools() -> Vec<Value> {
        vec![
            json!({"name": "set_thermostat", "parameters": {"type": "object",
                "properties": {"temperature": {"type": "integer", "minimum": 10, "maximum": 30}}, "required": ["temperature"]}}),
            json!({"name": "book", "parameters": {"type": "object", "properties": {"day": {"type": "string", "format": "date"}}}}),
        ]
    }

    fn check(given: Value, query: &str, confidence: f64, min_confidence: f64) -> CheckedAnswer {
        let tools = tools();
        let turn = Turn { tools: &tools, query, system: "" };
        CheckedAnswer::check(given.as_array().map(Vec::as_slice), confidence, turn, min_confidence)
    }

    #[test]
    fn calls_that_fit_are_acted_on_and_the_others_withheld_in_order() {
        let given = json!([
            {"name": "set_thermostat", "arguments": {"temperature": 40}},
            {"name": "set_thermostat", "arguments": {"temperature": 21}},
            {"name": "open_door", "arguments": {}}
        ]);
        let answer = check(given.clone(), "21 degrees", 0.9, 0.0);
        assert_eq!(
            answer.calls,
            [Call {
                name: "set_thermostat".into(),
                arguments: json!({"temperature": 21}).as_object().unwrap().clone()
            }]
        );
        let reasons: Vec<&Reason> = answer.withheld.iter().map(|w| &w.reason).collect();
        assert!(matches!(reasons[..], [Reason::OutOfBounds { .. }, Reason::UnknownTool { .. }]), "{reasons:?}");
        assert_eq!(answer.withheld[0].call, given[0]);
        assert_eq!(check(json!(null), "hi", 0.2, 0.5).calls, [], "no call list is no call, and nothing to gate");
        assert_eq!(check(json!(null), "hi", 0.2, 0.5).withheld, []);
    }

    #[test]
    fn the_gate_and_an_ungrounded_year_withhold_the_whole_turn() {
        let two = json!([
            {"name": "set_thermostat", "arguments": {"temperature": 21}},
            {"name": "book", "arguments": {"day": "2024-05-01"}}
        ]);
        let gated = check(two.clone(), "21 degrees and book May 1", 0.39, 0.4);
        assert_eq!(gated.calls, []);
        assert!(gated.withheld.iter().all(|w| w.reason == Reason::BelowConfidence { min_confidence: 0.4 }));
        assert_eq!(check(two.clone(), "21 degrees and book May 1", 0.4, 0.4).calls.len(), 2, "at the gate is acted on");
        let ungrounded = check(two, "21 degrees and book May 1, 2025", 0.9, 0.0);
        assert_eq!(ungrounded.calls, []);
        let reasons: Vec<&Reason> = ungrounded.withheld.iter().map(|w| &w.reason).collect();
        assert_eq!(reasons, [&Reason::UngroundedTurn, &Reason::UngroundedYear { argument: "day".into(), year: 2024 }]);
    }

    #[test]
    fn the_answer_serialises_as_documented() {
        let answer = check(json!([{"name": "set_thermostat", "arguments": {"temperature": 9}}]), "9 degrees", 0.5, 0.0);
        let printed = serde_json::to_value(&answer).unwrap();
        assert_eq!(
            printed,
            json!({"calls": [], "confidence": 0.5, "withheld": [{"call": {"name": "set_thermostat", "arguments": {"temperature": 9}},
                "reason": "out_of_bounds", "argument": "temperature", "bound": "minimum", "limit": 10, "given": 9}]})
        );
        assert_eq!(serde_json::from_value::<CheckedAnswer>(printed).unwrap(), answer);
    }
}
