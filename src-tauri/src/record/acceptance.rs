//! What an acceptance run keeps with its training: the suite, the confidence gate it ran at, and per
//! model (base, tuned, the built `.cact`) the contract's verdict, each category's passes and the
//! critical cases failed, with the answer given.

use std::path::PathBuf;

use needle_engine::checks::Call;
use needle_engine::suite::Category;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Acceptance {
    pub suite: PathBuf,
    /// The suite's own name.
    pub name: String,
    /// The gate: a turn below this confidence is no call.
    pub min_confidence: f64,
    /// In the order scored: base, tuned, then the `.cact` when one is built.
    pub models: Vec<SuiteScore>,
}

/// One model on the suite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteScore {
    /// `Base`, `Tuned` or `.cact`.
    pub model: String,
    pub passed: usize,
    pub total: usize,
    /// The passes the contract needs: `round(0.9 × total)`.
    pub required: usize,
    pub critical_failures: usize,
    /// Enough passes and no critical failure.
    pub contract: bool,
    /// Each category the suite has, in the categories' order.
    pub categories: Vec<CategoryScore>,
    /// The critical cases failed, in file order.
    pub critical: Vec<FailedCase>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CategoryScore {
    pub category: Category,
    pub passed: usize,
    pub total: usize,
}

/// A case failed, with what was expected and what the model's answer acted on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedCase {
    pub query: String,
    pub category: Category,
    pub expected: Vec<Call>,
    /// The calls acted on, after the checks and the gate.
    pub calls: Vec<Call>,
    /// The turn's confidence; `None` for a case never answered.
    pub confidence: Option<f64>,
    /// Why it failed before its calls were compared (`prompt too long`, `answer cut off`).
    pub reason: Option<String>,
    /// The model's whole answer.
    pub text: String,
}
