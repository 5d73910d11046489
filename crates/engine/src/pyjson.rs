//! Python's `json.dumps(value, separators=(",", ":"))`, byte for byte; and how Python sees a value
//! `json.loads` gives ([`python_truthy`], [`kind_of`]).
//!
//! The reference renders an example's `tools` and `answers` through exactly that call after
//! `json.loads`, and the model learned that text: a different spacing, escape or float spelling
//! would tokenize differently from what the base model saw. The workspace's `serde_json` keeps
//! object key order (`preserve_order`) and each number's source text (`arbitrary_precision`),
//! which is what it takes to reproduce Python's `int` (exact, any size) versus `float` (`repr`)
//! distinction. Duplicate keys behave as in a Python dict: the last value wins, at the position
//! of the first occurrence.

use serde_json::{Number, Value};
use std::fmt::Write as _;

/// Serialises `value` as `json.dumps(value, separators=(",", ":"))` does (`ensure_ascii=True`: what
/// cactus-needle 2.x renders).
pub fn dumps_compact(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, true);
    out
}

/// The same with `ensure_ascii=False` (what cactus-needle 3.x renders): text outside ASCII as is.
pub fn dumps_compact_unicode(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value, false);
    out
}

fn write_value(out: &mut String, value: &Value, ascii: bool) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => write_number(out, number),
        Value::String(text) => write_string(out, text, ascii),
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_value(out, item, ascii);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (index, (key, item)) in map.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_string(out, key, ascii);
                out.push(':');
                write_value(out, item, ascii);
            }
            out.push('}');
        }
    }
}

/// Python's `json.loads` makes a number an `int` unless its text has a fraction or an exponent;
/// an `int` prints back exactly, a `float` through `repr`.
fn write_number(out: &mut String, number: &Number) {
    let text = number.as_str();
    if text.contains(['.', 'e', 'E']) {
        // Rust's float parsing rounds correctly for any digit count, like Python's `float()`,
        // and overflows to infinity where Python does (`1e400`).
        let value: f64 = text.parse().unwrap_or(f64::NAN);
        out.push_str(&python_float_repr(value));
    } else if text == "-0" {
        // `int("-0")` is plain 0.
        out.push('0');
    } else {
        out.push_str(text);
    }
}

/// How `json.dumps` prints a float: `repr(x)` for finite values, `Infinity`/`-Infinity`/`NaN` otherwise.
///
/// `repr` uses the shortest digits that round-trip, in fixed notation when the decimal point sits
/// within 16 places of the first digit and 1e-4 <= |x| (`0.0001`, `1000000000000000.0`), else in
/// exponent notation with a signed, at least two-digit exponent (`1e-05`, `1.5e+16`).
pub fn python_float_repr(value: f64) -> String {
    if value.is_nan() {
        return "NaN".to_owned();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    let (negative, digits, exponent) = shortest_digits(value);
    // Python's `decpt`: the number of digits before the decimal point in fixed notation.
    let point = exponent + 1;
    let mut out = String::with_capacity(digits.len() + 8);
    if negative {
        out.push('-');
    }
    if (-3..=16).contains(&point) {
        write_fixed(&mut out, &digits, point);
    } else {
        write_exponent(&mut out, &digits, exponent);
    }
    out
}

/// Sign, shortest round-trip significant digits and decimal exponent of the first digit.
///
/// Rust's `{:e}` without a precision prints exactly the shortest round-tripping digits
/// (closest to the true value), the same digits Python's `repr` chooses; only the layout differs.
fn shortest_digits(value: f64) -> (bool, String, i32) {
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((scientific.as_str(), "0"));
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    (negative, digits, exponent.parse().unwrap_or(0))
}

fn write_fixed(out: &mut String, digits: &str, point: i32) {
    let integer_digits = usize::try_from(point).unwrap_or(0);
    if point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', point.unsigned_abs() as usize));
        out.push_str(digits);
    } else if integer_digits < digits.len() {
        let (whole, fraction) = digits.split_at(integer_digits);
        out.push_str(whole);
        out.push('.');
        out.push_str(fraction);
    } else {
        out.push_str(digits);
        out.extend(std::iter::repeat_n('0', integer_digits - digits.len()));
        out.push_str(".0");
    }
}

fn write_exponent(out: &mut String, digits: &str, exponent: i32) {
    let (first, rest) = digits.split_at(1.min(digits.len()));
    out.push_str(first);
    if !rest.is_empty() {
        out.push('.');
        out.push_str(rest);
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    // Writing to a String cannot fail.
    let _ = write!(out, "e{sign}{:02}", exponent.unsigned_abs());
}

/// `ensure_ascii` string escaping: printable ASCII as is, Python's short escapes, every other
/// character as lowercase `\uXXXX` (UTF-16 surrogate pairs beyond the BMP).
fn write_string(out: &mut String, text: &str, ascii: bool) {
    out.push('"');
    for character in text.chars() {
        match character {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(character),
            // Only the control characters are escaped when non-ASCII text may stay as it is.
            _ if !ascii && character >= ' ' => out.push(character),
            _ => {
                let mut units = [0u16; 2];
                for unit in character.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
        }
    }
    out.push('"');
}

/// Python's `bool()` of the value `json.loads` would produce.
pub fn python_truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(flag) => *flag,
        Value::Number(number) => number.as_str().parse::<f64>().is_ok_and(|x| x != 0.0),
        Value::String(text) => !text.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Object(map) => !map.is_empty(),
    }
}

/// Python's name for the kind of a JSON value, for messages.
pub fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(source text, json.dumps(json.loads(source), separators=(",", ":")))`, produced by
    /// CPython 3.11 from the reference venv.
    const PYTHON_CASES: &[(&str, &str)] = &[
        (r#"0"#, r#"0"#),
        (r#"-0"#, r#"0"#),
        (r#"7"#, r#"7"#),
        (r#"-12"#, r#"-12"#),
        (r#"123456789012345678901234567890"#, r#"123456789012345678901234567890"#),
        (r#"-98765432109876543210987654321"#, r#"-98765432109876543210987654321"#),
        (r#"0.0"#, r#"0.0"#),
        (r#"-0.0"#, r#"-0.0"#),
        (r#"2.50"#, r#"2.5"#),
        (r#"1E5"#, r#"100000.0"#),
        (r#"1e5"#, r#"100000.0"#),
        (r#"1e+5"#, r#"100000.0"#),
        (r#"1e-5"#, r#"1e-05"#),
        (r#"1.5e-7"#, r#"1.5e-07"#),
        (r#"2.5e-07"#, r#"2.5e-07"#),
        (r#"1e16"#, r#"1e+16"#),
        (r#"1e15"#, r#"1000000000000000.0"#),
        (r#"9999999999999998.0"#, r#"9999999999999998.0"#),
        (r#"12345678901234567.0"#, r#"1.2345678901234568e+16"#),
        (r#"0.0001"#, r#"0.0001"#),
        (r#"0.00001"#, r#"1e-05"#),
        (r#"0.00012345"#, r#"0.00012345"#),
        (r#"1e400"#, r#"Infinity"#),
        (r#"-1e400"#, r#"-Infinity"#),
        (r#"1e-400"#, r#"0.0"#),
        (r#"-1e-400"#, r#"-0.0"#),
        (r#"0.1"#, r#"0.1"#),
        (r#"0.30000000000000004"#, r#"0.30000000000000004"#),
        (r#"1.7976931348623157e308"#, r#"1.7976931348623157e+308"#),
        (r#"5e-324"#, r#"5e-324"#),
        (r#"2.2250738585072014e-308"#, r#"2.2250738585072014e-308"#),
        (r#"9007199254740993"#, r#"9007199254740993"#),
        (r#"9007199254740993.0"#, r#"9007199254740992.0"#),
        (r#"123.456"#, r#"123.456"#),
        (r#"-1.0"#, r#"-1.0"#),
        (r#"1.0000000000000002"#, r#"1.0000000000000002"#),
        (r#"100.0"#, r#"100.0"#),
        (r#"1e22"#, r#"1e+22"#),
        (r#"1e21"#, r#"1e+21"#),
        (r#"123456789.123456789"#, r#"123456789.12345679"#),
        (r#"3.141592653589793238462643383279"#, r#"3.141592653589793"#),
        (r#"0.1e1"#, r#"1.0"#),
        (r#"10E-1"#, r#"1.0"#),
        (r#"4.35"#, r#"4.35"#),
        (r#"1e0"#, r#"1.0"#),
        (r#"0e10"#, r#"0.0"#),
        (r#"-0e-3"#, r#"-0.0"#),
        (r#"true"#, r#"true"#),
        (r#"false"#, r#"false"#),
        (r#"null"#, r#"null"#),
        (r#"[]"#, r#"[]"#),
        (r#"{}"#, r#"{}"#),
        (r#"[1,[2,[3,{}]]]"#, r#"[1,[2,[3,{}]]]"#),
        (r#"{"b":1,"a":2}"#, r#"{"b":1,"a":2}"#),
        (r#"{"a":1,"b":2,"a":3}"#, r#"{"a":3,"b":2}"#),
        (r#"{"a":{"x":1},"a":[2]}"#, r#"{"a":[2]}"#),
        (r#""plain""#, r#""plain""#),
        (r#""quote \" backslash \\ slash \/""#, r#""quote \" backslash \\ slash /""#),
        (r#""\n\r\t\b\f""#, r#""\n\r\t\b\f""#),
        (r#""\u0000\u0001\u001f\u007f""#, r#""\u0000\u0001\u001f\u007f""#),
        (r#""café ü 中文""#, r#""caf\u00e9 \u00fc \u4e2d\u6587""#),
        (r#""\u00e9""#, r#""\u00e9""#),
        (r#""emoji 😀 clef 𝄞""#, r#""emoji \ud83d\ude00 clef \ud834\udd1e""#),
        (r#""\ud83d\ude00""#, r#""\ud83d\ude00""#),
        (r#""\u0080\u00a0\u2028\uffff""#, r#""\u0080\u00a0\u2028\uffff""#),
        (r#"-5e-324"#, r#"-5e-324"#),
        (r#"1e308"#, r#"1e+308"#),
        (r#"1234.5e-10"#, r#"1.2345e-07"#),
        (r#"1.5"#, r#"1.5"#),
        (r#""~ ` {}[]""#, r#""~ ` {}[]""#),
        (r#"{"café":"é","k\n":1}"#, r#"{"caf\u00e9":"\u00e9","k\n":1}"#),
        (
            r#" { "name" : "get_weather" , "arguments" : { "city" : "Paris" , "days" : 3 , "temp" : 21.50 } } "#,
            r#"{"name":"get_weather","arguments":{"city":"Paris","days":3,"temp":21.5}}"#,
        ),
    ];

    #[test]
    fn without_ensure_ascii_only_control_characters_are_escaped() {
        // Printed by CPython 3.11: json.dumps(["\x01é\x7f\n\"", {"ü": 1.5}], separators=(",", ":"), ensure_ascii=False)
        let value: Value = serde_json::from_str("[\"\\u0001é\\u007f\\n\\\"\", {\"ü\": 1.5}]").unwrap();
        assert_eq!(dumps_compact_unicode(&value), "[\"\\u0001é\u{7f}\\n\\\"\",{\"ü\":1.5}]");
        assert_eq!(dumps_compact(&value), "[\"\\u0001\\u00e9\\u007f\\n\\\"\",{\"\\u00fc\":1.5}]");
    }

    #[test]
    fn matches_python_json_dumps() {
        for (source, expected) in PYTHON_CASES {
            let value: Value = serde_json::from_str(source).expect("test source is valid JSON");
            assert_eq!(dumps_compact(&value), *expected, "source {source}");
        }
    }

    #[test]
    fn non_finite_floats_use_json_dumps_spelling() {
        assert_eq!(python_float_repr(f64::INFINITY), "Infinity");
        assert_eq!(python_float_repr(f64::NEG_INFINITY), "-Infinity");
        assert_eq!(python_float_repr(f64::NAN), "NaN");
    }

    #[test]
    fn numbers_built_in_rust_print_as_python_floats_and_ints() {
        let value = serde_json::json!([1.0, 0.5, 1e16, 42, -3]);
        assert_eq!(dumps_compact(&value), "[1.0,0.5,1e+16,42,-3]");
    }
}
