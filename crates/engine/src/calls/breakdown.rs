//! Why an answer is wrong. Each answer gets one [`Verdict`]: the first kind of mistake that
//! applies, in the order of [`AnswerKind`], with what differs (the tool, or each argument with both
//! values). Over a set of answers, a [`Breakdown`] counts the kinds, per expected tool too, and
//! which tool was called where another was expected.
//!
//! Calls are compared in the order written, as exact-call accuracy compares them: the second
//! expected call against the second given one. What is compared is what would be acted on: the
//! calls that pass the schema and grounding checks ([`CheckedAnswer`]); an answer that is wrong
//! because the checks held a call back is [`AnswerKind::Withheld`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::parse::NO_CALL;
use crate::checks::{CheckedAnswer, Withheld};

/// What an answer is. A wrong one is the first of these that applies, in this order (after
/// [`AnswerKind::Exact`], which is listed first so that tallies read from right to wrong).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerKind {
    /// The calls expected, in the order expected.
    Exact,
    /// The example's own answer is not a JSON list, so no answer matches it (the dataset doctor
    /// names such rows).
    UnreadableExpected,
    /// The answer holds no `<tool_call>` block with a JSON list.
    Unparseable,
    /// The calls acted on are not the expected ones because the checks held back a call the
    /// model wrote (unknown tool, an argument against its schema, an ungrounded year).
    Withheld,
    /// Calls where none was expected.
    FalseFire,
    /// No call where one was expected.
    FalseRefusal,
    /// Another number of calls than expected.
    WrongCount,
    /// As many calls, but one names another tool.
    WrongTool,
    /// The right tools, but an argument is missing, extra or has another value.
    WrongArguments,
}

impl AnswerKind {
    /// How tables and charts name the kind: its JSON name, in words.
    pub fn label(self) -> &'static str {
        match self {
            AnswerKind::Exact => "exact",
            AnswerKind::UnreadableExpected => "unreadable expected",
            AnswerKind::Unparseable => "unparseable",
            AnswerKind::Withheld => "withheld",
            AnswerKind::FalseFire => "false fire",
            AnswerKind::FalseRefusal => "false refusal",
            AnswerKind::WrongCount => "wrong count",
            AnswerKind::WrongTool => "wrong tool",
            AnswerKind::WrongArguments => "wrong arguments",
        }
    }
}

/// One answer judged against the expected calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    Exact,
    UnreadableExpected,
    Unparseable,
    /// The calls held back, each with why.
    Withheld {
        withheld: Vec<Withheld>,
    },
    FalseFire,
    FalseRefusal,
    WrongCount {
        expected: usize,
        given: usize,
    },
    /// The first call (from 0, in the order written) that names another tool.
    WrongTool {
        call: usize,
        expected: String,
        given: String,
    },
    /// Every difference of every call, in call order.
    WrongArguments {
        differences: Vec<ArgumentDiff>,
    },
}

/// One way a call's arguments differ from the expected ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArgumentDiff {
    /// The call's place in the answer, from 0.
    pub call: usize,
    pub tool: String,
    /// The argument's name; `None` when the arguments differ as a whole: one side's are not a
    /// JSON object, or the calls differ outside their arguments (both values are then the calls).
    pub argument: Option<String>,
    #[serde(flatten)]
    pub problem: ArgumentProblem,
}

/// Missing, extra or another value, with the values there are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum ArgumentProblem {
    Missing { expected: Value },
    Extra { given: Value },
    WrongValue { expected: Value, given: Value },
}

/// The tool a call in a confusion row or a wrong-tool verdict stands under when it names none.
pub const UNNAMED: &str = "(no name)";

/// Where an unparseable answer's calls go in the confusion: no call can be read from it.
pub const UNPARSEABLE: &str = "(unparseable)";

impl Verdict {
    /// `given` judged against `expected`; `None` for a side that is not a JSON list.
    pub fn of(expected: Option<&[Value]>, given: Option<&[Value]>) -> Verdict {
        let Some(expected) = expected else { return Verdict::UnreadableExpected };
        let Some(given) = given else { return Verdict::Unparseable };
        match (expected.is_empty(), given.is_empty()) {
            (true, false) => return Verdict::FalseFire,
            (false, true) => return Verdict::FalseRefusal,
            _ if expected.len() != given.len() => {
                return Verdict::WrongCount { expected: expected.len(), given: given.len() }
            }
            _ => {}
        }
        let pairs = expected.iter().zip(given).enumerate();
        if let Some((call, (e, g))) = pairs.clone().find(|(_, (e, g))| e.get("name") != g.get("name")) {
            return Verdict::WrongTool { call, expected: tool_of(e), given: tool_of(g) };
        }
        let differences: Vec<ArgumentDiff> = pairs.flat_map(|(call, (e, g))| differences(call, e, g)).collect();
        match differences.is_empty() {
            true => Verdict::Exact,
            false => Verdict::WrongArguments { differences },
        }
    }

    /// A checked answer judged against `expected`: its calls acted on (`written`, the calls as the
    /// model wrote them, is `None` when it wrote no call list); when those are wrong and the checks
    /// held a call back, the answer is [`Verdict::Withheld`]. A call withheld from an answer whose
    /// acted-on calls are right harmed nothing: the answer is exact.
    pub fn of_checked(expected: Option<&[Value]>, written: Option<&[Value]>, checked: &CheckedAnswer) -> Verdict {
        if written.is_none() {
            return Verdict::of(expected, None);
        }
        let acted: Vec<Value> = checked.calls.iter().map(|call| call.to_value()).collect();
        match Verdict::of(expected, Some(&acted)) {
            Verdict::Exact => Verdict::Exact,
            Verdict::UnreadableExpected => Verdict::UnreadableExpected,
            _ if !checked.withheld.is_empty() => Verdict::Withheld { withheld: checked.withheld.clone() },
            verdict => verdict,
        }
    }

    pub fn kind(&self) -> AnswerKind {
        match self {
            Verdict::Exact => AnswerKind::Exact,
            Verdict::UnreadableExpected => AnswerKind::UnreadableExpected,
            Verdict::Unparseable => AnswerKind::Unparseable,
            Verdict::Withheld { .. } => AnswerKind::Withheld,
            Verdict::FalseFire => AnswerKind::FalseFire,
            Verdict::FalseRefusal => AnswerKind::FalseRefusal,
            Verdict::WrongCount { .. } => AnswerKind::WrongCount,
            Verdict::WrongTool { .. } => AnswerKind::WrongTool,
            Verdict::WrongArguments { .. } => AnswerKind::WrongArguments,
        }
    }
}

/// The name a call gives, as the tables show it.
fn tool_of(call: &Value) -> String {
    match call.get("name") {
        Some(Value::String(name)) => name.clone(),
        Some(other) => other.to_string(),
        None => UNNAMED.to_string(),
    }
}

/// How a given call of the expected tool differs from the expected call: argument by argument
/// when both hold an object of arguments, else as a whole.
fn differences(call: usize, expected: &Value, given: &Value) -> Vec<ArgumentDiff> {
    if expected == given {
        return Vec::new();
    }
    let diff = |argument: Option<&str>, problem| ArgumentDiff {
        call,
        tool: tool_of(expected),
        argument: argument.map(str::to_string),
        problem,
    };
    let (want, got) = (expected.get("arguments"), given.get("arguments"));
    let whole = |want: &Value, got: &Value| {
        vec![diff(None, ArgumentProblem::WrongValue { expected: want.clone(), given: got.clone() })]
    };
    let (Some(Value::Object(want)), Some(Value::Object(got))) = (want, got) else {
        return match want == got {
            true => whole(expected, given),
            false => whole(want.unwrap_or(&Value::Null), got.unwrap_or(&Value::Null)),
        };
    };
    let mut found = Vec::new();
    for (name, expected) in want {
        match got.get(name) {
            None => found.push(diff(Some(name), ArgumentProblem::Missing { expected: expected.clone() })),
            Some(given) if given != expected => found.push(diff(
                Some(name),
                ArgumentProblem::WrongValue { expected: expected.clone(), given: given.clone() },
            )),
            Some(_) => {}
        }
    }
    for (name, given) in got.iter().filter(|(name, _)| !want.contains_key(*name)) {
        found.push(diff(Some(name), ArgumentProblem::Extra { given: given.clone() }));
    }
    if found.is_empty() {
        // The arguments agree; something else in the calls does not.
        return whole(expected, given);
    }
    found
}

/// Answers by kind, per expected tool, and which tool was called where another was expected.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// How many answers are of each kind (kinds no answer has are left out); they add up to the
    /// examples.
    pub kinds: BTreeMap<AnswerKind, usize>,
    /// Per expected tool, as the per-tool accuracy names them (an example counts under each tool
    /// it expects): its answers by kind.
    pub per_tool: BTreeMap<String, BTreeMap<AnswerKind, usize>>,
    /// Expected tool → called tool → how many calls, the calls as the model wrote them (withheld
    /// ones too: what it meant to call). Calls pair in the order written; one with
    /// no partner (a false fire or refusal, more or fewer calls) pairs with `(no call)`, and an
    /// unparseable answer's expected calls with `(unparseable)`. An answer of no calls expected
    /// and none given counts once as `(no call)` → `(no call)`.
    pub confusion: BTreeMap<String, BTreeMap<String, usize>>,
}

impl Breakdown {
    /// Counts one answer, whose expected tools are `tools` (as the per-tool accuracy names them).
    pub fn add(&mut self, tools: &[String], expected: Option<&[Value]>, given: Option<&[Value]>, verdict: &Verdict) {
        let kind = verdict.kind();
        *self.kinds.entry(kind).or_default() += 1;
        for tool in tools {
            *self.per_tool.entry(tool.clone()).or_default().entry(kind).or_default() += 1;
        }
        let Some(expected) = expected else { return };
        let names = |calls: &[Value]| -> Vec<String> {
            match calls.is_empty() {
                true => vec![NO_CALL.to_string()],
                false => calls.iter().map(tool_of).collect(),
            }
        };
        let wanted = names(expected);
        let called = match given {
            Some(given) => names(given),
            None => vec![UNPARSEABLE.to_string(); wanted.len()],
        };
        for i in 0..wanted.len().max(called.len()) {
            let pick = |names: &[String]| names.get(i).map_or(NO_CALL.to_string(), Clone::clone);
            *self.confusion.entry(pick(&wanted)).or_default().entry(pick(&called)).or_default() += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::calls::parse::{parse_calls, tool_names, UNREADABLE};
    use crate::checks::{Reason, Turn};

    const WEATHER: &str = r#"[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}]"#;

    /// A hand-written model answer around `calls` (as the model writes them, or anything else).
    fn answer(calls: &str) -> String {
        format!("<think></think>\n<tool_call>{calls}</tool_call><|im_end|>")
    }

    /// The verdict on the answer `text` to an example whose file answer is `expected`, checked
    /// against exact-call accuracy's own rule: exact exactly when the lists are equal.
    fn judge(expected: &str, text: &str) -> Verdict {
        let (expected, given) = (serde_json::from_str::<Vec<Value>>(expected).ok(), parse_calls(text));
        let verdict = Verdict::of(expected.as_deref(), given.as_deref());
        assert_eq!(verdict == Verdict::Exact, given.is_some() && given == expected, "{text}: {verdict:?}");
        verdict
    }

    #[test]
    fn the_same_calls_are_exact() {
        assert_eq!(
            judge(WEATHER, &answer(r#"[{"name":"get_weather","arguments":{"city":"Paris","unit":"C"}}]"#)),
            Verdict::Exact
        );
        assert_eq!(judge("[]", &answer("[]")), Verdict::Exact);
    }

    #[test]
    fn an_answer_without_a_call_list_is_unparseable_whatever_was_expected() {
        for text in ["<think></think>\n<tool_call>[{\"name\": \"get_weather\"", "Paris is sunny.", &answer("{}")] {
            assert_eq!(judge(WEATHER, text), Verdict::Unparseable, "{text}");
            assert_eq!(judge("[]", text), Verdict::Unparseable, "{text}");
        }
    }

    #[test]
    fn an_expected_answer_that_is_not_a_list_comes_first() {
        assert_eq!(judge(r#"{"name": "get_weather"}"#, "no call list at all"), Verdict::UnreadableExpected);
    }

    #[test]
    fn calls_where_none_was_expected_are_a_false_fire() {
        let text = answer(r#"[{"name":"get_weather","arguments":{"city":"Paris"}}]"#);
        assert_eq!(judge("[]", &text), Verdict::FalseFire);
    }

    #[test]
    fn no_call_where_one_was_expected_is_a_false_refusal() {
        assert_eq!(judge(WEATHER, &answer("[]")), Verdict::FalseRefusal);
    }

    #[test]
    fn another_number_of_calls_is_a_wrong_count_before_any_tool_is_compared() {
        let expected = r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]"#;
        let text = answer(r#"[{"name":"c","arguments":{}}]"#);
        assert_eq!(judge(expected, &text), Verdict::WrongCount { expected: 2, given: 1 });
    }

    #[test]
    fn the_first_call_naming_another_tool_is_a_wrong_tool_even_if_only_the_order_differs() {
        let text = answer(r#"[{"name":"get_time","arguments":{"city":"Paris","unit":"C"}}]"#);
        let wrong = Verdict::WrongTool { call: 0, expected: "get_weather".into(), given: "get_time".into() };
        assert_eq!(judge(WEATHER, &text), wrong);
        let expected = r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]"#;
        let swapped = answer(r#"[{"name":"b","arguments":{}},{"name":"a","arguments":{}}]"#);
        assert_eq!(judge(expected, &swapped), Verdict::WrongTool { call: 0, expected: "a".into(), given: "b".into() });
        let unnamed = answer(r#"[{"tool":"get_weather"}]"#);
        assert!(matches!(judge(WEATHER, &unnamed), Verdict::WrongTool { given, .. } if given == UNNAMED));
    }

    #[test]
    fn wrong_arguments_name_each_missing_extra_and_wrong_value_with_both_values() {
        let text = answer(r#"[{"name":"get_weather","arguments":{"city":"Lyon","days":2.5}}]"#);
        let Verdict::WrongArguments { differences } = judge(WEATHER, &text) else { panic!("not wrong arguments") };
        let found: Vec<(Option<&str>, &ArgumentProblem)> =
            differences.iter().map(|d| (d.argument.as_deref(), &d.problem)).collect();
        assert_eq!(
            found,
            [
                (Some("city"), &ArgumentProblem::WrongValue { expected: json!("Paris"), given: json!("Lyon") }),
                (Some("unit"), &ArgumentProblem::Missing { expected: json!("C") }),
                (Some("days"), &ArgumentProblem::Extra { given: serde_json::from_str("2.5").unwrap() }),
            ]
        );
        assert!(differences.iter().all(|d| d.call == 0 && d.tool == "get_weather"));

        // The second of two calls; arguments that are not an object, and calls that differ
        // outside their arguments, differ as a whole.
        let two = r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"n": 1}}]"#;
        let text = answer(r#"[{"name":"a","arguments":{}},{"name":"b","arguments":"{\"n\": 1}"}]"#);
        let Verdict::WrongArguments { differences } = judge(two, &text) else { panic!("not wrong arguments") };
        assert_eq!((differences.len(), differences[0].call, &differences[0].argument), (1, 1, &None));
        let text = answer(r#"[{"name":"get_weather","arguments":{"city":"Paris","unit":"C"},"id":7}]"#);
        let Verdict::WrongArguments { differences } = judge(WEATHER, &text) else { panic!("not wrong arguments") };
        assert!(matches!(&differences[0].problem, ArgumentProblem::WrongValue { given, .. } if given["id"] == 7));
    }

    #[test]
    fn the_kinds_add_up_to_the_answers_and_the_confusion_pairs_calls_in_order() {
        let two = r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]"#;
        let cases = [
            (WEATHER, answer(r#"[{"name":"get_weather","arguments":{"city":"Paris","unit":"C"}}]"#)),
            (WEATHER, answer(r#"[{"name":"get_time","arguments":{}}]"#)),
            (WEATHER, answer("[]")),
            (WEATHER, "cut off".to_string()),
            ("[]", answer(r#"[{"name":"get_weather","arguments":{}}]"#)),
            ("[]", answer("[]")),
            (two, answer(r#"[{"name":"b","arguments":{}}]"#)),
            ("not json", answer("[]")),
        ];
        let mut breakdown = Breakdown::default();
        for (expected, text) in &cases {
            let (expected, given) = (serde_json::from_str::<Vec<Value>>(expected).ok(), parse_calls(text));
            let tools = tool_names(expected.as_deref());
            breakdown.add(
                &tools,
                expected.as_deref(),
                given.as_deref(),
                &Verdict::of(expected.as_deref(), given.as_deref()),
            );
        }
        assert_eq!(breakdown.kinds.values().sum::<usize>(), cases.len());
        assert_eq!(breakdown.kinds.len(), 7, "every kind but wrong arguments: {:?}", breakdown.kinds);
        let weather = &breakdown.per_tool["get_weather"];
        assert_eq!(weather.values().sum::<usize>(), 4);
        assert_eq!(
            [weather[&AnswerKind::Exact], weather[&AnswerKind::WrongTool], weather[&AnswerKind::FalseRefusal]],
            [1, 1, 1]
        );
        assert_eq!(breakdown.per_tool["a"], breakdown.per_tool["b"], "a two-tool answer counts under both");
        let row = |tool: &str| -> Vec<(&str, usize)> {
            breakdown.confusion[tool].iter().map(|(called, n)| (called.as_str(), *n)).collect()
        };
        assert_eq!(row("get_weather"), [(NO_CALL, 1), (UNPARSEABLE, 1), ("get_time", 1), ("get_weather", 1)]);
        assert_eq!(row(NO_CALL), [(NO_CALL, 1), ("get_weather", 1)]);
        assert_eq!((row("a"), row("b")), (vec![("b", 1)], vec![(NO_CALL, 1)]));
        assert!(!breakdown.confusion.contains_key(UNREADABLE), "an unreadable row has no calls to pair");
    }

    #[test]
    fn a_wrong_answer_whose_call_the_checks_held_back_is_withheld_and_a_harmless_one_exact() {
        let tools = [json!({"name": "set_thermostat", "parameters": {"type": "object",
            "properties": {"temperature": {"type": "integer", "minimum": 10, "maximum": 30}},
            "required": ["temperature"]}})];
        let turn = Turn { tools: &tools, query: "make it 21 degrees", system: "" };
        let judge = |expected: &str, written: &str| {
            let expected: Vec<Value> = serde_json::from_str(expected).unwrap();
            let written: Option<Vec<Value>> = serde_json::from_str(written).ok();
            let checked = CheckedAnswer::check(written.as_deref(), 0.9, turn, 0.0);
            Verdict::of_checked(Some(&expected), written.as_deref(), &checked)
        };
        let want = r#"[{"name": "set_thermostat", "arguments": {"temperature": 21}}]"#;
        // Out of bounds: held back, so nothing is acted on where a call was expected.
        let Verdict::Withheld { withheld } =
            judge(want, r#"[{"name": "set_thermostat", "arguments": {"temperature": 40}}]"#)
        else {
            panic!("not withheld")
        };
        assert!(matches!(withheld[..], [Withheld { reason: Reason::OutOfBounds { .. }, .. }]), "{withheld:?}");
        // A required argument left out, a wrong type: withheld too, before any count or tool is compared.
        for written in [
            r#"[{"name": "set_thermostat", "arguments": {}}]"#,
            r#"[{"name": "set_thermostat", "arguments": {"temperature": "21"}}]"#,
        ] {
            assert_eq!(judge(want, written).kind(), AnswerKind::Withheld, "{written}");
        }
        // The right call beside one to a tool the turn does not offer: the right one is acted on.
        let extra =
            r#"[{"name": "set_thermostat", "arguments": {"temperature": 21}}, {"name": "open_door", "arguments": {}}]"#;
        assert_eq!(judge(want, extra), Verdict::Exact);
        // A call held back where none was expected: nothing is acted on, which is right.
        assert_eq!(judge("[]", r#"[{"name": "open_door", "arguments": {}}]"#), Verdict::Exact);
        // A call that fits its schema but says another value is still a wrong argument.
        let other = judge(want, r#"[{"name": "set_thermostat", "arguments": {"temperature": 22}}]"#);
        assert_eq!(other.kind(), AnswerKind::WrongArguments);
        assert_eq!(judge(want, "not a list"), Verdict::Unparseable);
        let line =
            serde_json::to_string(&judge(want, r#"[{"name": "set_thermostat", "arguments": {"temperature": 9}}]"#))
                .unwrap();
        assert!(line.starts_with(r#"{"kind":"withheld","withheld":[{"call":{"name":"set_thermostat""#), "{line}");
        assert!(line.contains(r#""reason":"out_of_bounds""#), "{line}");
    }

    #[test]
    fn a_kinds_label_is_its_json_name_in_words() {
        let kinds = [
            AnswerKind::Exact,
            AnswerKind::UnreadableExpected,
            AnswerKind::Unparseable,
            AnswerKind::Withheld,
            AnswerKind::FalseFire,
            AnswerKind::FalseRefusal,
            AnswerKind::WrongCount,
            AnswerKind::WrongTool,
            AnswerKind::WrongArguments,
        ];
        for kind in kinds {
            assert_eq!(serde_json::to_value(kind).unwrap(), json!(kind.label().replace(' ', "_")));
        }
    }

    #[test]
    fn a_breakdown_and_a_verdict_read_back_from_json() {
        let verdict = judge(WEATHER, &answer(r#"[{"name":"get_weather","arguments":{"city":0.5}}]"#));
        let line = serde_json::to_string(&verdict).unwrap();
        assert!(line.starts_with(r#"{"kind":"wrong_arguments","differences":[{"call":0"#), "{line}");
        assert_eq!(serde_json::from_str::<Verdict>(&line).unwrap(), verdict);
        let mut breakdown = Breakdown::default();
        breakdown.add(&["get_weather".into()], None, None, &verdict);
        let line = serde_json::to_string(&breakdown).unwrap();
        assert!(line.contains(r#""kinds":{"wrong_arguments":1}"#), "{line}");
        assert_eq!(serde_json::from_str::<Breakdown>(&line).unwrap(), breakdown);
    }
}
