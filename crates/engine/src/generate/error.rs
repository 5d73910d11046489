//! Why generation stopped without rows, or could not start.

use super::client::{ENDPOINT_VAR, KEY_VARS};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(
        "no API key for {url}: set {} (or {}) to your OpenRouter key; for another OpenAI-compatible server \
         pass --endpoint URL or set {ENDPOINT_VAR} (a server that needs no key then gets none)",
        KEY_VARS[0], KEY_VARS[1]
    )]
    NoKey { url: String },
    #[error(
        "{url} refused the key ({status}: {body}); check {} (or {}), and that it is a key for this endpoint",
        KEY_VARS[0], KEY_VARS[1]
    )]
    Refused { url: String, status: u16, body: String },
    #[error("no example was generated: {failed} request(s) failed, the last with: {last}")]
    NothingGenerated { failed: usize, last: String },
    #[error("no case of the suite was kept ({}); check the model and the tool schemas", rejected.join(", "))]
    NoCase { rejected: Vec<String> },
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    #[error("{what} is {share}; write a share of the new rows between 0 and 1 (0.3 for 30%)")]
    Share { what: &'static str, share: f64 },
    #[error(
        "--negative-share {negative} and --parallel-share {parallel} ask for more than all the rows; together \
         they must be at most 1"
    )]
    Shares { negative: f64, parallel: f64 },
    #[error("no tool schemas found in {path}: no row has a \"tools\" list with a named tool")]
    NoTools { path: String },
}
