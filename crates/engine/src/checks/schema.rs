//! A call checked against its tool's JSON schema before anything acts on it. The subset tool
//! schemas use: `type` (string, integer, number, boolean, array, object, null, or a list of them),
//! `enum`, `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum` (as numbers, draft 6 on),
//! `required`, `properties` (an argument not among them is refused unless `additionalProperties`
//! allows it), `items`, and `anyOf`/`oneOf` (a value that fits one variant fits). Other keywords
//! constrain nothing.
//!
//! Tools are read as a dataset row holds them (`{"name", "description", "parameters"}`), or in
//! OpenAI's wrapping (`{"type": "function", "function": {...}}`).

use serde_json::{Map, Value};

use super::reason::{Bound, Reason};
use crate::dataset::schema::{as_number, matches_type, same_value};

/// A call that can be acted on: a tool the turn offers, with arguments its schema accepts.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Call {
    pub name: String,
    pub arguments: Map<String, Value>,
}

impl Call {
    /// The call as a model writes one: `{"name", "arguments"}`.
    pub fn to_value(&self) -> Value {
        Value::Object(Map::from_iter([
            ("name".to_string(), Value::String(self.name.clone())),
            ("arguments".to_string(), Value::Object(self.arguments.clone())),
        ]))
    }
}

/// The tool named `name` among `tools`.
pub fn find_tool<'t>(tools: &'t [Value], name: &str) -> Option<&'t Map<String, Value>> {
    tools
        .iter()
        .filter_map(Value::as_object)
        .map(unwrapped)
        .find(|tool| tool.get("name").and_then(Value::as_str) == Some(name))
}

/// A tool unwrapped from OpenAI's `{"type": "function", "function": {...}}`.
fn unwrapped(tool: &Map<String, Value>) -> &Map<String, Value> {
    tool.get("function").and_then(Value::as_object).unwrap_or(tool)
}

/// A tool's `parameters` schema (`{}`, which allows anything, when it declares none).
pub fn parameters(tool: &Map<String, Value>) -> &Value {
    static ANYTHING: Value = Value::Null;
    tool.get("parameters").unwrap_or(&ANYTHING)
}

/// `call` as a call to one of `tools` whose arguments its schema accepts, or the first reason it
/// is not (boxed: a reason carries values, and most calls have none). Absent or null arguments are none.
pub fn check_call(tools: &[Value], call: &Value) -> Result<Call, Box<Reason>> {
    let name = call.get("name").and_then(Value::as_str).ok_or(Reason::NotACall)?;
    let arguments = match call.get("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(arguments)) => arguments.clone(),
        Some(_) => return Err(Box::new(Reason::NotACall)),
    };
    let tool = find_tool(tools, name).ok_or_else(|| Reason::UnknownTool { tool: name.to_string() })?;
    check_value(&Value::Object(arguments.clone()), parameters(tool), "")?;
    Ok(Call { name: name.to_string(), arguments })
}

/// `value` at `path` against `schema`: the first reason it does not fit.
fn check_value(value: &Value, schema: &Value, path: &str) -> Result<(), Box<Reason>> {
    let Some(schema) = schema.as_object() else { return Ok(()) };
    if let Some(Value::Array(variants)) = schema.get("anyOf").or_else(|| schema.get("oneOf")) {
        let checked: Vec<Result<(), Box<Reason>>> = variants.iter().map(|v| check_value(value, v, path)).collect();
        if checked.iter().any(Result::is_ok) {
            return Ok(());
        }
        // The variant it came closest to is unknown; the first one's reason says enough.
        if let Some(Err(first)) = checked.into_iter().next() {
            return Err(first);
        }
    }
    if let Some(expected) = schema.get("type") {
        if !matches_type(value, Some(expected)) {
            return Err(Box::new(Reason::WrongType {
                argument: path.into(),
                expected: expected.clone(),
                given: value.clone(),
            }));
        }
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        if !allowed.iter().any(|option| same_value(option, value)) {
            return Err(Box::new(Reason::NotInEnum {
                argument: path.into(),
                allowed: allowed.clone(),
                given: value.clone(),
            }));
        }
    }
    if let Some(number) = as_number(value) {
        for bound in [Bound::Minimum, Bound::Maximum, Bound::ExclusiveMinimum, Bound::ExclusiveMaximum] {
            let Some(limit) = schema.get(bound.keyword()) else { continue };
            if as_number(limit).is_some_and(|limit| !bound.holds(number, limit)) {
                return Err(Box::new(Reason::OutOfBounds {
                    argument: path.into(),
                    bound,
                    limit: limit.clone(),
                    given: value.clone(),
                }));
            }
        }
    }
    match value {
        Value::Object(fields) => check_fields(fields, schema, path),
        Value::Array(items) => match schema.get("items") {
            Some(item_schema) => items
                .iter()
                .enumerate()
                .try_for_each(|(i, item)| check_value(item, item_schema, &format!("{path}[{i}]"))),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// An object's fields: the required ones present, none undeclared, each fitting its schema.
fn check_fields(fields: &Map<String, Value>, schema: &Map<String, Value>, path: &str) -> Result<(), Box<Reason>> {
    let at = |name: &str| if path.is_empty() { name.to_string() } else { format!("{path}.{name}") };
    let required = schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
    if let Some(missing) = required.into_iter().find(|name| !fields.contains_key(*name)) {
        return Err(Box::new(Reason::MissingArgument { argument: at(missing) }));
    }
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Ok(()) };
    let additional = schema.get("additionalProperties");
    for (name, field) in fields {
        match (properties.get(name), additional) {
            (Some(field_schema), _) => check_value(field, field_schema, &at(name))?,
            (None, None | Some(Value::Bool(false))) => {
                return Err(Box::new(Reason::UnknownArgument { argument: at(name) }))
            }
            (None, Some(extra)) => check_value(field, extra, &at(name))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tools() -> Vec<Value> {
        let lights = json!({"name": "control_lights", "parameters": {"type": "object", "properties": {
            "room": {"type": "string", "enum": ["kitchen", "study"]},
            "brightness": {"type": "integer", "minimum": 0, "maximum": 100},
            "level": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "on": {"type": "boolean"},
            "scenes": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
            "color": {"anyOf": [{"type": "string", "enum": ["red", "blue"]}, {"type": "null"}]}
        }, "required": ["room"]}});
        // OpenAI's wrapping; no parameters at all.
        let wrapped = json!({"type": "function", "function": {"name": "ping"}});
        vec![lights, wrapped]
    }

    fn check(call: Value) -> Result<Call, Box<Reason>> {
        check_call(&tools(), &call)
    }

    fn lights(arguments: Value) -> Result<Call, Box<Reason>> {
        check(json!({"name": "control_lights", "arguments": arguments}))
    }

    #[test]
    fn a_call_that_fits_its_schema_is_acted_on() {
        let ok = lights(json!({"room": "kitchen", "brightness": 100, "level": 0.5, "on": true,
            "scenes": [{"name": "x"}], "color": null}));
        assert_eq!(ok.unwrap().name, "control_lights");
        assert!(lights(json!({"room": "study", "brightness": 0, "color": "red"})).is_ok(), "bounds are inclusive");
        assert!(lights(json!({"room": "study", "brightness": 40.0})).is_ok(), "40.0 is an integer");
        let ping = check(json!({"name": "ping"})).unwrap();
        assert_eq!(ping, Call { name: "ping".into(), arguments: Map::new() }, "absent arguments are none");
        assert!(check(json!({"name": "ping", "arguments": {"anything": 1}})).is_ok(), "no schema, no constraint");
    }

    #[test]
    fn each_rule_withholds_with_its_reason() {
        let argument = |name: &str| name.to_string();
        let cases = [
            (json!({"name": "unlock_door", "arguments": {}}), Reason::UnknownTool { tool: "unlock_door".into() }),
            (json!({"arguments": {}}), Reason::NotACall),
            (json!({"name": "ping", "arguments": "{}"}), Reason::NotACall),
            (
                json!({"name": "control_lights", "arguments": {"brightness": 5}}),
                Reason::MissingArgument { argument: argument("room") },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "garage"}}),
                Reason::NotInEnum {
                    argument: argument("room"),
                    allowed: vec![json!("kitchen"), json!("study")],
                    given: json!("garage"),
                },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "Kitchen"}}),
                Reason::NotInEnum {
                    argument: argument("room"),
                    allowed: vec![json!("kitchen"), json!("study")],
                    given: json!("Kitchen"),
                },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "brightness": 150}}),
                Reason::OutOfBounds {
                    argument: argument("brightness"),
                    bound: Bound::Maximum,
                    limit: json!(100),
                    given: json!(150),
                },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "brightness": -1}}),
                Reason::OutOfBounds {
                    argument: argument("brightness"),
                    bound: Bound::Minimum,
                    limit: json!(0),
                    given: json!(-1),
                },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "level": 1}}),
                Reason::OutOfBounds {
                    argument: argument("level"),
                    bound: Bound::ExclusiveMaximum,
                    limit: json!(1),
                    given: json!(1),
                },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "level": 0.0}}),
                Reason::OutOfBounds {
                    argument: argument("level"),
                    bound: Bound::ExclusiveMinimum,
                    limit: json!(0),
                    given: json!(0.0),
                },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "brightness": 40.5}}),
                Reason::WrongType { argument: argument("brightness"), expected: json!("integer"), given: json!(40.5) },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "brightness": "40"}}),
                Reason::WrongType { argument: argument("brightness"), expected: json!("integer"), given: json!("40") },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "on": "yes"}}),
                Reason::WrongType { argument: argument("on"), expected: json!("boolean"), given: json!("yes") },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": 3}}),
                Reason::WrongType { argument: argument("room"), expected: json!("string"), given: json!(3) },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "scenes": [{"name": "a"}, {}]}}),
                Reason::MissingArgument { argument: argument("scenes[1].name") },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "scenes": {"name": "a"}}}),
                Reason::WrongType {
                    argument: argument("scenes"),
                    expected: json!("array"),
                    given: json!({"name": "a"}),
                },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "color": "green"}}),
                Reason::NotInEnum {
                    argument: argument("color"),
                    allowed: vec![json!("red"), json!("blue")],
                    given: json!("green"),
                },
            ),
            (
                json!({"name": "control_lights", "arguments": {"room": "study", "speed": "high"}}),
                Reason::UnknownArgument { argument: argument("speed") },
            ),
        ];
        for (call, reason) in cases {
            assert_eq!(check(call.clone()), Err(Box::new(reason)), "{call}");
        }
    }
}
