//! One chat completion from an OpenAI-compatible endpoint (OpenRouter by default): a POST with a
//! time limit, retried with backoff while the server says it is busy (429) or failing (5xx).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use ureq::http::Response;
use ureq::Body;

/// Tries of one request while the server answers 429 or 5xx.
const ATTEMPTS: u32 = 4;
/// The first wait before a retry, doubled each time, unless the server says (`Retry-After`).
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest `Retry-After` obeyed.
const LONGEST_BACKOFF: Duration = Duration::from_secs(60);
/// How often a wait looks at the cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// The reference's endpoint and the environment variables it reads.
pub const DEFAULT_ENDPOINT: &str = "https://openrouter.ai/api/v1/chat/completions";
pub const ENDPOINT_VAR: &str = "OPENROUTER_URL";
/// Read in this order; the first set one is the key.
pub const KEY_VARS: [&str; 2] = ["OPENROUTER_API_KEY", "OPENAI_API_KEY"];

/// Where the requests go and what they carry.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The chat-completions URL.
    pub url: String,
    /// Sent as a bearer token when there is one.
    pub key: Option<String>,
}

/// Why a request gave no reply.
#[derive(Debug)]
pub(super) enum RequestError {
    /// 401 or 403: the key is wrong, so every request would fail the same way.
    Refused {
        status: u16,
        body: String,
    },
    /// Anything else (after the retries): counted, and the next request tried.
    Failed(String),
    Cancelled,
}

pub(super) fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .user_agent(concat!("needle-studio/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// The text of the first choice of a chat completion for `messages`.
pub(super) fn complete(
    agent: &ureq::Agent,
    endpoint: &Endpoint,
    model: &str,
    messages: &Value,
    cancel: &AtomicBool,
) -> Result<String, RequestError> {
    // The reference's temperature, for varied batches.
    let body = json!({"model": model, "messages": messages, "temperature": 0.9}).to_string();
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1..=ATTEMPTS {
        let mut request = agent
            .post(&endpoint.url)
            .header("Content-Type", "application/json")
            .header("HTTP-Referer", "https://github.com/cactus-compute/needle")
            .header("X-Title", "needle");
        if let Some(key) = &endpoint.key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        let mut response = request.send(body.as_str()).map_err(|error| transport(endpoint, &error))?;
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            let text = response
                .body_mut()
                .read_to_string()
                .map_err(|error| RequestError::Failed(format!("reading the reply: {error}")))?;
            return reply_text(&text);
        }
        let body = response.body_mut().read_to_string().unwrap_or_default();
        let body: String = body.chars().take(300).collect();
        match status {
            401 | 403 => return Err(RequestError::Refused { status, body }),
            429 | 500..=599 if attempt < ATTEMPTS => {
                let wait = retry_after(&response).unwrap_or(backoff);
                sleep_unless_cancelled(wait, cancel)?;
                backoff *= 2;
            }
            _ => return Err(RequestError::Failed(format!("{} answered {status}: {body}", endpoint.url))),
        }
    }
    // The last attempt returned above, whatever its status.
    Err(RequestError::Failed(format!("{} kept failing after {ATTEMPTS} tries", endpoint.url)))
}

fn transport(endpoint: &Endpoint, error: &ureq::Error) -> RequestError {
    RequestError::Failed(match error {
        ureq::Error::Timeout(_) => format!("{} did not answer in time ({error}); raise --timeout", endpoint.url),
        _ => format!(
            "cannot reach {} ({error}); check the network, or point --endpoint (or OPENROUTER_URL) at a reachable \
             OpenAI-compatible server",
            endpoint.url
        ),
    })
}

/// `choices[0].message.content` of an OpenAI chat completion.
fn reply_text(text: &str) -> Result<String, RequestError> {
    let reply: Value = serde_json::from_str(text)
        .map_err(|error| RequestError::Failed(format!("the reply is not a chat completion ({error})")))?;
    match reply.pointer("/choices/0/message/content").and_then(Value::as_str) {
        Some(content) => Ok(content.to_owned()),
        None => Err(RequestError::Failed("the reply has no choices[0].message.content".into())),
    }
}

/// `Retry-After` in seconds, capped.
fn retry_after(response: &Response<Body>) -> Option<Duration> {
    let seconds: f64 = response.headers().get("retry-after")?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs_f64(seconds.max(0.0)).min(LONGEST_BACKOFF))
}

fn sleep_unless_cancelled(wait: Duration, cancel: &AtomicBool) -> Result<(), RequestError> {
    let deadline = std::time::Instant::now() + wait;
    while std::time::Instant::now() < deadline {
        if cancel.load(Ordering::Relaxed) {
            return Err(RequestError::Cancelled);
        }
        std::thread::sleep(CANCEL_POLL.min(deadline.saturating_duration_since(std::time::Instant::now())));
    }
    Ok(())
}
