//! The app's secrets ([`Secret`]): the key to the endpoint that writes new examples, and the hub token
//! Publish uploads with. Each is read from the environment as the CLI reads it, or typed once in the
//! window and kept in the operating system's keychain (macOS Keychain, Windows Credential Manager, the
//! Secret Service on Linux). Where there is no keychain, a typed one lives in this process's memory
//! until the app closes. Never in a file of the app's, never in its history, never on a worker's
//! command line: the generation key reaches the worker through its environment.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use needle_engine::generate::KEY_VARS;
use serde::{Deserialize, Serialize};

use crate::ground::lock;

/// Where the keychain holds the secrets.
const SERVICE: &str = "needle-studio";

/// One secret the app asks for: the variables the CLI reads it from, its keychain entry, and what
/// the window says when none was typed.
#[derive(Debug)]
pub struct Secret {
    vars: &'static [&'static str],
    account: &'static str,
    missing: &'static str,
}

/// The key to the endpoint that writes new examples.
pub const GENERATE_KEY: Secret = Secret {
    vars: &KEY_VARS,
    account: "generate-data api key",
    missing: "type the key (an OpenRouter key starts with sk-or-)",
};

/// The Hugging Face token Publish uploads with.
pub const HUB_TOKEN: Secret = Secret {
    vars: &["HF_TOKEN"],
    account: "hugging face token",
    missing: "type a Hugging Face token with write access (it starts with hf_)",
};

/// Which secret the window means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecretName {
    GenerateKey,
    HubToken,
}

/// Both secrets, shared by the rooms that use them (Data's Generate, Export's Publish).
#[derive(Debug, Clone)]
pub struct Secrets {
    pub generate_key: Arc<Keys>,
    pub hub_token: Arc<Keys>,
}

impl Default for Secrets {
    fn default() -> Self {
        Self { generate_key: Arc::new(Keys::new(GENERATE_KEY)), hub_token: Arc::new(Keys::new(HUB_TOKEN)) }
    }
}

impl Secrets {
    pub fn named(&self, name: SecretName) -> &Keys {
        match name {
            SecretName::GenerateKey => &self.generate_key,
            SecretName::HubToken => &self.hub_token,
        }
    }

    /// Keys typed from now on stay in this process's memory, and the environment's keys are not
    /// read: the tests' app, which must neither use the developer's keys nor write their keychain.
    pub fn isolate(&self) {
        self.generate_key.isolate();
        self.hub_token.isolate();
    }
}

/// Where a secret comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum KeySource {
    /// The app's environment has it (the first of its variables that is set).
    Environment { variable: &'static str },
    /// Typed once, kept in the operating system's keychain.
    Keychain,
    /// Typed, kept in memory until the app closes: this system offers no keychain (`note` says why).
    Session { note: String },
    /// None yet: the window asks for one.
    None,
}

/// One secret's values: the environment's, the keychain's, and one typed this session.
#[derive(Debug)]
pub struct Keys {
    secret: Secret,
    /// Off for the tests' app, which must neither read the developer's keys nor write their keychain.
    system: AtomicBool,
    session: Mutex<Option<(String, String)>>,
}

impl Keys {
    pub fn new(secret: Secret) -> Self {
        Self { secret, system: AtomicBool::new(true), session: Mutex::new(None) }
    }

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
        self.system().then(|| self.secret.vars.iter().copied().find(set)).flatten()
    }

    pub fn source(&self) -> KeySource {
        if let Some(variable) = self.env_variable() {
            return KeySource::Environment { variable };
        }
        if let Some((_, note)) = lock(&self.session).as_ref() {
            return KeySource::Session { note: note.clone() };
        }
        if self.system() && self.entry().and_then(|entry| entry.get_password().map_err(|e| e.to_string())).is_ok() {
            return KeySource::Keychain;
        }
        KeySource::None
    }

    /// Keeps a typed key: in the keychain, or (where there is none) in memory for this session.
    pub fn remember(&self, key: &str) -> Result<KeySource, String> {
        let key = key.trim();
        if key.is_empty() {
            return Err(self.secret.missing.into());
        }
        let kept = if self.system() {
            self.entry().and_then(|entry| entry.set_password(key).map_err(|error| error.to_string()))
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
            if let Ok(entry) = self.entry() {
                let _ = entry.delete_credential();
            }
        }
        self.source()
    }

    /// The environment a worker that uses the secret gets: the typed one as the first of its
    /// variables (the others removed, so it is the one used); nothing to change when the app's
    /// environment has one; every one of its variables removed when there is none.
    pub fn worker_env(&self) -> Vec<(&'static str, Option<String>)> {
        if self.env_variable().is_some() {
            return Vec::new();
        }
        let key = self.typed();
        self.secret.vars.iter().enumerate().map(|(i, &name)| (name, key.clone().filter(|_| i == 0))).collect()
    }

    /// The secret itself, wherever it is: the environment's, else the typed one.
    pub fn value(&self) -> Option<String> {
        let from_env = self.env_variable().and_then(|name| std::env::var(name).ok());
        from_env.map(|value| value.trim().to_string()).or_else(|| self.typed())
    }

    /// The one typed this session, else the keychain's.
    fn typed(&self) -> Option<String> {
        let typed = lock(&self.session).as_ref().map(|(key, _)| key.clone());
        typed.or_else(|| self.system().then(|| self.entry().ok()?.get_password().ok()).flatten())
    }

    fn entry(&self) -> Result<keyring::Entry, String> {
        keyring::Entry::new(SERVICE, self.secret.account).map_err(|error| error.to_string())
    }
}
