//! The suite file: one JSON object holding a tool surface and its acceptance cases, as
//! cactus-needle 3.x's environments hold them (`TOOLS`, `SYSTEM`, `TEST_CASES`).
//!
//! ```json
//! {"name": "smart_home",
//!  "system": "Map each explicit supported home action to exactly one declared call.",
//!  "tools": [{"name": "set_thermostat", "description": "Set the thermostat.",
//!             "parameters": {"type": "object", "required": ["temperature"],
//!                            "properties": {"temperature": {"type": "integer", "minimum": 10, "maximum": 30}}}}],
//!  "cases": [{"query": "set the thermostat to 22 degrees", "category": "positive", "critical": false,
//!             "calls": [{"name": "set_thermostat", "arguments": {"temperature": 22}}]},
//!            {"query": "set the thermostat to 40 degrees", "category": "invalid", "critical": true, "calls": []}]}
//! ```
//!
//! `system` may be left out (no system prompt), and a case's `critical` (not critical). Every
//! expected call must fit its tool's schema, as the checks a model's calls go through would let
//! it through.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::checks::schema::check_call;
use crate::checks::Call;
use crate::pyjson::kind_of;

/// What a case tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// A request a tool fits, with every value said: the calls.
    Positive,
    /// A required value not said: no call.
    Missing,
    /// No tool fits: no call.
    Irrelevant,
    /// A request the user says not to do: no call.
    Negation,
    /// A value outside the tool's bounds or set: no call.
    Invalid,
    /// Two requests at once: both calls.
    Parallel,
}

impl Category {
    pub const ALL: [Category; 6] = [
        Category::Positive,
        Category::Missing,
        Category::Irrelevant,
        Category::Negation,
        Category::Invalid,
        Category::Parallel,
    ];

    /// Its cases in every 32 of upstream's suites: 18 positive, 4 missing, 3 irrelevant, 3
    /// negation, 2 invalid, 2 parallel.
    pub fn upstream_cases(self) -> usize {
        match self {
            Category::Positive => 18,
            Category::Missing => 4,
            Category::Irrelevant => 3,
            Category::Negation => 3,
            Category::Invalid => 2,
            Category::Parallel => 2,
        }
    }

    /// Whether upstream marks its cases critical: those where a call acts on something the user
    /// did not ask (a value the user never said, an action the user forbade, a value the tool
    /// refuses).
    pub fn critical(self) -> bool {
        matches!(self, Category::Missing | Category::Negation | Category::Invalid)
    }

    /// Whether `calls` expected calls fit the category: one for positive, two or more for parallel,
    /// none for the others.
    pub fn fits_calls(self, calls: usize) -> bool {
        match self {
            Category::Positive => calls == 1,
            Category::Parallel => calls >= 2,
            _ => calls == 0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Category::Positive => "positive",
            Category::Missing => "missing",
            Category::Irrelevant => "irrelevant",
            Category::Negation => "negation",
            Category::Invalid => "invalid",
            Category::Parallel => "parallel",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An acceptance suite read from its file.
#[derive(Debug, Clone, PartialEq)]
pub struct Suite {
    pub name: String,
    /// The system prompt; empty for none.
    pub system: String,
    /// The tool schemas every case offers.
    pub tools: Vec<Value>,
    pub cases: Vec<Case>,
}

/// One request and the calls it must get.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub query: String,
    /// The calls expected, in any order; none for a request that must get no call.
    pub calls: Vec<Call>,
    pub category: Category,
    /// A case the suite fails on alone when it fails.
    pub critical: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("cannot read suite {}: {source}; check the path and that the file is readable", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: not JSON at line {line}, column {column}: {message}; a suite is one JSON object", path.display())]
    Json { path: PathBuf, line: usize, column: usize, message: String },
    /// `place` is a JSON path into the file (`cases[3].category`).
    #[error("{}: {place}: {problem}", path.display())]
    Field { path: PathBuf, place: String, problem: String },
}

const TOP_FIELDS: [&str; 4] = ["name", "system", "tools", "cases"];
const CASE_FIELDS: [&str; 4] = ["query", "calls", "category", "critical"];

impl Suite {
    pub fn load(path: &Path) -> Result<Suite, SuiteError> {
        let text = std::fs::read_to_string(path).map_err(|source| SuiteError::Read { path: path.into(), source })?;
        Suite::parse(&text, path)
    }

    /// A suite from the text of `path`'s file, every field checked.
    pub fn parse(text: &str, path: &Path) -> Result<Suite, SuiteError> {
        let value: Value = serde_json::from_str(text).map_err(|error| SuiteError::Json {
            path: path.into(),
            line: error.line(),
            column: error.column(),
            message: error.to_string().split(" at line ").next().unwrap_or_default().to_string(),
        })?;
        let field =
            |place: &str, problem: String| SuiteError::Field { path: path.into(), place: place.into(), problem };
        let Value::Object(top) = value else {
            return Err(field(
                "the file",
                format!("is {}; write an object with {}", kind_of(&value), listed(&TOP_FIELDS)),
            ));
        };
        known_fields(&top, &TOP_FIELDS).map_err(|problem| field("the top level", problem))?;
        let name = string(&top, "name").map_err(|problem| field("name", problem))?;
        let system = match top.get("system") {
            None => String::new(),
            Some(_) => string(&top, "system").map_err(|problem| field("system", problem))?,
        };
        let tools = list(&top, "tools").map_err(|problem| field("tools", problem))?.clone();
        for (i, tool) in tools.iter().enumerate() {
            let named = tool.get("function").unwrap_or(tool).get("name").is_some_and(Value::is_string);
            if !named {
                return Err(field(
                    &format!("tools[{i}]"),
                    "is not a tool schema; write {\"name\": \"...\", \"description\": \"...\", \"parameters\": {...}}"
                        .into(),
                ));
            }
        }
        let cases = list(&top, "cases").map_err(|problem| field("cases", problem))?;
        if cases.is_empty() {
            return Err(field("cases", "is empty; a suite needs at least one case".into()));
        }
        let cases = (cases.iter().enumerate())
            .map(|(i, case)| {
                read_case(case, &tools).map_err(|(at, problem)| field(&format!("cases[{i}]{at}"), problem))
            })
            .collect::<Result<_, _>>()?;
        Ok(Suite { name, system, tools, cases })
    }
}

impl Suite {
    /// The suite as its file holds it (`system` left out when empty), which [`Suite::parse`] reads back.
    pub fn to_json(&self) -> Value {
        let cases: Vec<Value> = (self.cases.iter())
            .map(|case| {
                serde_json::json!({"query": case.query, "category": case.category, "critical": case.critical,
                                   "calls": case.calls})
            })
            .collect();
        let mut top = Map::new();
        top.insert("name".into(), Value::String(self.name.clone()));
        if !self.system.is_empty() {
            top.insert("system".into(), Value::String(self.system.clone()));
        }
        top.insert("tools".into(), Value::Array(self.tools.clone()));
        top.insert("cases".into(), Value::Array(cases));
        Value::Object(top)
    }
}

/// One case, or where in it (`.category`, `.calls[1]`, or nothing for the case itself) and what
/// is wrong.
fn read_case(case: &Value, tools: &[Value]) -> Result<Case, (String, String)> {
    let Value::Object(case) = case else {
        return Err((String::new(), format!("is {}; write an object with {}", kind_of(case), listed(&CASE_FIELDS))));
    };
    known_fields(case, &CASE_FIELDS).map_err(|problem| (String::new(), problem))?;
    fn at(name: &'static str) -> impl Fn(String) -> (String, String) {
        move |problem| (format!(".{name}"), problem)
    }
    let query = string(case, "query").map_err(at("query"))?;
    let calls = list(case, "calls").map_err(at("calls"))?;
    let calls = (calls.iter().enumerate())
        .map(|(i, call)| {
            check_call(tools, call).map_err(|reason| {
                let fix = "fix the call, or the tool's schema";
                (
                    format!(".calls[{i}]"),
                    format!("no model's call could match it, as the checks would withhold it: {reason}; {fix}"),
                )
            })
        })
        .collect::<Result<_, _>>()?;
    let category = match case.get("category") {
        Some(Value::String(name)) => Category::ALL.into_iter().find(|c| c.name() == name),
        _ => None,
    };
    let names: Vec<&str> = Category::ALL.iter().map(|c| c.name()).collect();
    let category = category.ok_or_else(|| {
        let given = case.get("category").map_or("missing".to_string(), |v| format!("{v}"));
        (".category".to_string(), format!("is {given}; use one of {}", names.join(", ")))
    })?;
    let critical = match case.get("critical") {
        None => false,
        Some(Value::Bool(critical)) => *critical,
        Some(other) => return Err((".critical".into(), format!("is {other}; use true or false"))),
    };
    Ok(Case { query, calls, category, critical })
}

fn known_fields(object: &Map<String, Value>, known: &[&str]) -> Result<(), String> {
    match object.keys().find(|key| !known.contains(&key.as_str())) {
        Some(unknown) => Err(format!("unknown field {unknown:?}; the fields are {}", listed(known))),
        None => Ok(()),
    }
}

fn string(object: &Map<String, Value>, name: &str) -> Result<String, String> {
    match object.get(name) {
        Some(Value::String(text)) if !text.trim().is_empty() || name == "system" => Ok(text.clone()),
        Some(Value::String(_)) => Err("is empty; write the text".into()),
        Some(other) => Err(format!("is {}; write a string", kind_of(other))),
        None => Err("is missing; write a string".into()),
    }
}

fn list<'a>(object: &'a Map<String, Value>, name: &str) -> Result<&'a Vec<Value>, String> {
    match object.get(name) {
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(format!("is {}; write a list", kind_of(other))),
        None => Err("is missing; write a list".into()),
    }
}

fn listed(names: &[&str]) -> String {
    names.iter().map(|name| format!("\"{name}\"")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn suite(cases: Value) -> Value {
        json!({"name": "home", "system": "be careful", "tools": [{"name": "set_thermostat", "parameters": {"type": "object",
            "properties": {"temperature": {"type": "integer", "minimum": 10, "maximum": 30}}, "required": ["temperature"]}}],
            "cases": cases})
    }

    fn parse(value: &Value) -> Result<Suite, String> {
        Suite::parse(&value.to_string(), Path::new("home.suite.json")).map_err(|error| error.to_string())
    }

    #[test]
    fn a_suite_reads_its_cases_with_their_calls_category_and_criticality() {
        let read = parse(&suite(json!([
            {"query": "22 degrees", "calls": [{"name": "set_thermostat", "arguments": {"temperature": 22}}], "category": "positive"},
            {"query": "40 degrees", "calls": [], "category": "invalid", "critical": true}
        ])))
        .unwrap();
        assert_eq!((read.name.as_str(), read.system.as_str(), read.tools.len()), ("home", "be careful", 1));
        assert_eq!(read.cases[0].calls[0].name, "set_thermostat");
        assert_eq!((read.cases[0].category, read.cases[0].critical), (Category::Positive, false));
        assert_eq!(
            (read.cases[1].category, read.cases[1].critical, read.cases[1].calls.len()),
            (Category::Invalid, true, 0)
        );
    }

    #[test]
    fn a_suite_written_as_json_reads_back_the_same() {
        let read = parse(&suite(json!([
            {"query": "22 degrees", "calls": [{"name": "set_thermostat", "arguments": {"temperature": 22}}], "category": "positive"},
            {"query": "40 degrees", "calls": [], "category": "invalid", "critical": true}
        ])))
        .unwrap();
        assert_eq!(parse(&read.to_json()).unwrap(), read);
        let quiet = Suite { system: String::new(), ..read };
        assert!(quiet.to_json().get("system").is_none());
        assert_eq!(parse(&quiet.to_json()).unwrap(), quiet);
    }

    #[test]
    fn upstream_proportions_make_32_cases_nine_critical() {
        let cases: usize = Category::ALL.iter().map(|c| c.upstream_cases()).sum();
        let critical: usize = Category::ALL.iter().filter(|c| c.critical()).map(|c| c.upstream_cases()).sum();
        assert_eq!((cases, critical), (32, 9));
        assert!(Category::Positive.fits_calls(1) && !Category::Positive.fits_calls(2));
        assert!(Category::Parallel.fits_calls(3) && !Category::Parallel.fits_calls(1));
        assert!(Category::Negation.fits_calls(0) && !Category::Missing.fits_calls(1));
    }

    #[test]
    fn each_mistake_is_named_with_its_file_place_and_fix() {
        let case = |case: Value| suite(json!([case]));
        let good = json!({"query": "q", "calls": [], "category": "missing"});
        let with = |key: &str, value: Value| {
            let mut case = good.clone();
            case[key] = value;
            suite(json!([case]))
        };
        let cases = [
            (json!([1]), "home.suite.json: the file: is a list; write an object with \"name\", \"system\", \"tools\", \"cases\""),
            (json!({"name": "x", "tools": [], "cases": [good], "tool": []}), "the top level: unknown field \"tool\""),
            (json!({"tools": [], "cases": [good]}), "name: is missing; write a string"),
            (json!({"name": "x", "tools": {}, "cases": [good]}), "tools: is an object; write a list"),
            (json!({"name": "x", "tools": [{"description": "no name"}], "cases": [good]}), "tools[0]: is not a tool schema"),
            (suite(json!([])), "cases: is empty"),
            (case(json!("q")), "cases[0]: is a string; write an object"),
            (with("category", json!("postive")), "cases[0].category: is \"postive\"; use one of positive, missing, irrelevant, negation, invalid, parallel"),
            (with("critical", json!("yes")), "cases[0].critical: is \"yes\"; use true or false"),
            (with("query", json!(" ")), "cases[0].query: is empty"),
            (with("calls", json!({})), "cases[0].calls: is an object; write a list"),
            (
                with("calls", json!([{"name": "set_thermostat", "arguments": {"temperature": 40}}])),
                "cases[0].calls[0]: no model's call could match it, as the checks would withhold it: temperature is 40, outside maximum 30; fix the call",
            ),
            (with("calls", json!([{"name": "open_door"}])), "cases[0].calls[0]: no model's call could match it, as the checks would withhold it: unknown tool \"open_door\""),
            (
                suite(json!([good, {"query": "q", "calls": [], "category": "negation", "critcal": true}])),
                "cases[1]: unknown field \"critcal\"; the fields are \"query\", \"calls\", \"category\", \"critical\"",
            ),
        ];
        for (value, want) in cases {
            let error = parse(&value).unwrap_err();
            assert!(error.starts_with("home.suite.json: ") && error.contains(want), "{error}\nwanted: {want}");
        }
        let broken = Suite::parse("{\"name\": \"x\",\n \"tools\": [,]}", Path::new("s.json")).unwrap_err().to_string();
        assert!(broken.starts_with("s.json: not JSON at line 2, column 12: expected value"), "{broken}");
    }
}
