//! The key to the endpoint that writes new examples: read from the environment as the CLI reads it
//! ([`KEY_VARS`]), or typed once in the window and kept in the operating system's keychain (macOS
//! Keychain, Windows Credential Manager, the Secret Service on Linux). Where there is no keychain, a
//! typed key lives in this process's memory until the app closes. Never in a file of the app's, never
//! in its history, never on a worker's command line: it reaches the worker through its environment.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use needle_engine::generate::KEY_VARS;
use serde::Serialize;

use crate::lock;

/// Where the keychain holds the key.
const SERVICE: &str = "needle-studio";
const ACCOUNT: &str = "generate-data api key";

/// Where the key the worker will use comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum KeySource {
    /// The app's environment has it (the first of [`KEY_VARS`] that is set).
    Environment { variable: &'static str },
    /// Typed once, kept in the operating system's keychain.
    Keychain,
    /// Typed, kept in memory until the app closes: this system offers no keychain (`note` says why).
    Session { note: String },
    /// None yet: the window asks for one.
    None,
}

/// The keys: the environment's, the keychain's, and one typed this session.
#[derive(Debug)]
pub struct Keys {
    /// Off for the tests' app, which must neither read the developer's keys nor write their keychain.
    system: AtomicBool,
    session: Mutex<Option<(String, String)>>,
}

impl Default for Keys {
    fn default() -> Self {
        Self { system: AtomicBool::new(true), session: Mutex::new(None) }
    }
}

impl Keys {
    /// From now on, only keys typed in this process count: the environment and the keychain are left
    /// alone.
    pub fn isolate(&self) {
        self.system.store(false, Ordering::Relaxed);
    }

    fn system(&self) -> bool {
        self.system.load(Ordering::Relaxed)
    }

    fn env_variable(&self) -> Option<&'static str> {
        let set = |name: &&str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
        self.system().then(|| KEY_VARS.iter().copied().find(set)).flatten()
    }

    pub fn source(&self) -> KeySource {
        if let Some(variable) = self.env_variable() {
            return KeySource::Environment { variable };
        }
        if let Some((_, note)) = lock(&self.session).as_ref() {
            return KeySource::Session { note: note.clone() };
        }
        if self.system() && entry().and_then(|entry| entry.get_password().map_err(|e| e.to_string())).is_ok() {
            return KeySource::Keychain;
        }
        KeySource::None
    }

    /// Keeps a typed key: in the keychain, or (where there is none) in memory for this session.
    pub fn remember(&self, key: &str) -> Result<KeySource, String> {
        let key = key.trim();
        if key.is_empty() {
            return Err("type the key (an OpenRouter key starts with sk-or-)".into());
        }
        let kept = if self.system() {
            entry().and_then(|entry| entry.set_password(key).map_err(|error| error.to_string()))
        } else {
            Err("the keychain is not used here".to_owned())
        };
        *lock(&self.session) = match kept {
            Ok(()) => None,
            Err(why) => Some((key.to_owned(), format!("kept until the app closes: no keychain ({why})"))),
        };
        Ok(self.source())
    }

    /// Forgets the typed key, in the keychain too.
    pub fn forget(&self) -> KeySource {
        *lock(&self.session) = None;
        if self.system() {
            if let Ok(entry) = entry() {
                let _ = entry.delete_credential();
            }
        }
        self.source()
    }

    /// The environment a worker that asks the endpoint gets: the typed key as the first of
    /// [`KEY_VARS`] (the others removed, so it is the one used); nothing to change when the app's
    /// environment has one; every key variable removed when there is no key.
    pub fn worker_env(&self) -> Vec<(&'static str, Option<String>)> {
        if self.env_variable().is_some() {
            return Vec::new();
        }
        let typed = lock(&self.session).as_ref().map(|(key, _)| key.clone());
        let key = typed.or_else(|| self.system().then(|| entry().ok()?.get_password().ok()).flatten());
        KEY_VARS.iter().enumerate().map(|(i, &name)| (name, key.clone().filter(|_| i == 0))).collect()
    }
}

fn entry() -> Result<keyring::Entry, String> {
    keyring::Entry::new(SERVICE, ACCOUNT).map_err(|error| error.to_string())
}
