//! Why a call is withheld: the one list of reasons the schema check, the grounding check and the
//! confidence gate give, as the JSON of an answer names them.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The first reason found not to act on a call. `argument` is a path into the call's arguments:
/// `room`, `items[0].name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Reason {
    /// Not `{"name": "...", "arguments": {...}}`.
    NotACall,
    /// A tool the turn does not offer.
    UnknownTool { tool: String },
    /// An argument its tool requires is left out.
    MissingArgument { argument: String },
    /// An argument its tool does not declare (a tool's function would refuse it).
    UnknownArgument { argument: String },
    /// A value not of the declared `type`.
    WrongType { argument: String, expected: Value, given: Value },
    /// A value outside the declared `enum`.
    NotInEnum { argument: String, allowed: Vec<Value>, given: Value },
    /// A number outside `minimum`, `maximum`, `exclusiveMinimum` or `exclusiveMaximum`.
    OutOfBounds { argument: String, bound: Bound, limit: Value, given: Value },
    /// A date whose year neither the query nor the system prompt licenses (cactus-needle 3.x's
    /// `_annotate_ungrounded`).
    UngroundedYear { argument: String, year: i64 },
    /// Withheld with its turn: another call of it carries an ungrounded year, and the reference's
    /// harness then acts on no call of the turn.
    UngroundedTurn,
    /// The turn's confidence is below the gate, so no call of it is acted on.
    BelowConfidence { min_confidence: f64 },
}

/// Which JSON Schema bound a number breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Bound {
    Minimum,
    Maximum,
    ExclusiveMinimum,
    ExclusiveMaximum,
}

impl Bound {
    pub fn keyword(self) -> &'static str {
        match self {
            Bound::Minimum => "minimum",
            Bound::Maximum => "maximum",
            Bound::ExclusiveMinimum => "exclusiveMinimum",
            Bound::ExclusiveMaximum => "exclusiveMaximum",
        }
    }

    /// Whether `value` keeps to this bound at `limit`.
    pub fn holds(self, value: f64, limit: f64) -> bool {
        match self {
            Bound::Minimum => value >= limit,
            Bound::Maximum => value <= limit,
            Bound::ExclusiveMinimum => value > limit,
            Bound::ExclusiveMaximum => value < limit,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NotACall => write!(f, "not a call: it needs a \"name\" string and an \"arguments\" object"),
            Reason::UnknownTool { tool } => write!(f, "unknown tool {tool:?}"),
            Reason::MissingArgument { argument } => write!(f, "missing required argument {argument:?}"),
            Reason::UnknownArgument { argument } => write!(f, "argument {argument:?} is not declared by the tool"),
            Reason::WrongType { argument, expected, given } => {
                write!(f, "{argument} is {given}, not of type {expected}")
            }
            Reason::NotInEnum { argument, allowed, given } => {
                let allowed: Vec<String> = allowed.iter().map(Value::to_string).collect();
                write!(f, "{argument} is {given}, not one of {}", allowed.join(", "))
            }
            Reason::OutOfBounds { argument, bound, limit, given } => {
                write!(f, "{argument} is {given}, outside {} {limit}", bound.keyword())
            }
            Reason::UngroundedYear { argument, year } => {
                write!(f, "{argument} has the year {year}, which neither the query nor the system prompt says")
            }
            Reason::UngroundedTurn => write!(f, "another call of the turn has an ungrounded year"),
            Reason::BelowConfidence { min_confidence } => write!(f, "the turn's confidence is below {min_confidence}"),
        }
    }
}
