//! An OpenAI-compatible chat-completions endpoint on loopback for the generation tests, served as
//! [`crate::fake_hub`] serves the hub: each connection on its own thread, answers following a script
//! the test writes — a reply (with prose, malformed or truncated JSON, rows that break the schema,
//! repeats), a status (429, 500, 401, with `Retry-After`), a stall, or a body that is not a
//! completion at all. No test touches the internet.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::fake_hub::{lock, respond};

/// One answer of the endpoint.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A chat completion whose message is this text.
    Reply(String),
    /// This status with a short body, and `Retry-After: 0` when asked.
    Status { status: u16, retry_now: bool },
    /// Nothing for this long, then the connection closes.
    Stall(Duration),
    /// A 200 whose body is this text as is (not a chat completion).
    Body(String),
}

/// One request as the endpoint saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub authorization: Option<String>,
    pub body: Value,
}

struct State {
    script: VecDeque<Answer>,
    /// The answer once the script is used up.
    then: Answer,
    /// Answer 401 unless this bearer token is sent.
    key: Option<String>,
    seen: Vec<Seen>,
}

pub struct FakeLlm {
    url: String,
    state: Arc<Mutex<State>>,
}

impl FakeLlm {
    /// Answers `script` in order, then `then` to every further request.
    pub fn start(script: impl IntoIterator<Item = Answer>, then: Answer) -> Self {
        let state =
            Arc::new(Mutex::new(State { script: script.into_iter().collect(), then, key: None, seen: Vec::new() }));
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let url = format!("http://{}/v1/chat/completions", listener.local_addr().expect("bound address"));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = Arc::clone(&shared);
                // A client that gave up on a stall hangs up; that is the point of the stall.
                std::thread::spawn(move || {
                    let _ = serve(stream, &state);
                });
            }
        });
        Self { url, state }
    }

    /// The chat-completions URL, for `--endpoint` or `OPENROUTER_URL`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn require_key(&self, key: &str) {
        lock(&self.state).key = Some(key.into());
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.state).seen.clone()
    }
}

/// A chat completion carrying `content`, as OpenAI's API answers.
pub fn completion(content: &str) -> String {
    json!({"id": "stub", "object": "chat.completion",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]})
    .to_string()
}

fn serve(stream: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let (mut length, mut authorization) = (0, None);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "authorization" => authorization = Some(value.trim().to_owned()),
                _ => {}
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let answer = {
        let mut state = lock(state);
        let wanted = state.key.as_ref().map(|key| format!("Bearer {key}"));
        let refused = wanted.is_some() && wanted != authorization;
        state.seen.push(Seen { authorization, body: serde_json::from_slice(&body).unwrap_or(Value::Null) });
        match state.script.pop_front() {
            _ if refused => Answer::Status { status: 401, retry_now: false },
            Some(answer) => answer,
            None => state.then.clone(),
        }
    };
    let mut out = stream;
    match answer {
        Answer::Reply(content) => {
            respond(&mut out, 200, &[("Content-Type", "application/json".into())], completion(&content).as_bytes())
        }
        Answer::Body(text) => respond(&mut out, 200, &[("Content-Type", "application/json".into())], text.as_bytes()),
        Answer::Status { status, retry_now } => {
            let headers = if retry_now { vec![("Retry-After", "0".to_owned())] } else { Vec::new() };
            respond(&mut out, status, &headers, format!("{{\"error\": {{\"code\": {status}}}}}").as_bytes())
        }
        Answer::Stall(wait) => {
            std::thread::sleep(wait);
            Ok(())
        }
    }
}
