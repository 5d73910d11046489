//! What generation tells as it goes: after every reply, and when a request fails.

use std::collections::BTreeMap;

use serde::Serialize;

/// Progress, after every reply.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum GenerateEvent {
    Progress {
        generated: usize,
        wanted: usize,
        failed_requests: usize,
        /// Rows not kept, by reason (a doctor's finding, `duplicate_row`, `not_an_example`, `share_full`; a
        /// reply with no readable JSON array counts once as `unreadable_reply`).
        rejected: BTreeMap<&'static str, usize>,
    },
    RequestFailed {
        message: String,
    },
    /// The suite's cases, after every reply to a suite request.
    SuiteProgress {
        cases: usize,
        wanted: usize,
        failed_requests: usize,
        /// Cases not kept, by reason.
        rejected: BTreeMap<&'static str, usize>,
    },
}
