//! What the app remembers between launches: the base model (its files, and the published generation
//! chosen in the Model step), the device choice, the preset, and how long a training must take before
//! its end is worth a desktop notification.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use needle_engine::generation::Generation;
use needle_engine::hub::{BaseModel, Hub};
use needle_engine::settings::preset;
use serde::{Deserialize, Serialize};

use crate::ground::{lock, read_limited};

/// The most a preferences file may hold; it is a few paths and names.
const SETTINGS_LIMIT: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Preferences {
    pub checkpoint: Option<PathBuf>,
    pub tokenizer: Option<PathBuf>,
    /// The published base model chosen by Download or Use (the default generation until one is); the
    /// window's own save leaves it out.
    #[serde(default)]
    pub generation: Generation,
    /// `auto`, or a backend forced by the user.
    pub device: String,
    pub preset: String,
    /// A training that took at least this many seconds ends with a desktop notification: the user
    /// has probably looked away. Kept in the file, not a field of the window.
    #[serde(default = "notify_after_s")]
    pub notify_after_s: u64,
}

/// [`Preferences::notify_after_s`] until the file says otherwise.
pub const NOTIFY_AFTER_S: u64 = 30;

fn notify_after_s() -> u64 {
    NOTIFY_AFTER_S
}

impl Default for Preferences {
    fn default() -> Self {
        Self {
            checkpoint: None,
            tokenizer: None,
            generation: Generation::default(),
            device: "auto".into(),
            preset: "balanced".into(),
            notify_after_s: NOTIFY_AFTER_S,
        }
    }
}

impl Preferences {
    /// The saved preferences (a few paths and names); the defaults when there are none or the file is unreadable (it is only a
    /// convenience, and the next save replaces it).
    pub fn load(path: &Path) -> Self {
        let bytes = read_limited(path, SETTINGS_LIMIT).ok();
        bytes.and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default()
    }

    pub fn save(&self, path: &Path) -> Result<(), String> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        needle_engine::atomic::write_atomically(path, &json)
            .map_err(|error| format!("could not save the preferences to {}: {error}", path.display()))
    }
}

/// The preferences as the app holds them: their current value, and the file each change is saved to.
#[derive(Debug)]
pub struct Remembered {
    path: PathBuf,
    current: Mutex<Preferences>,
}

impl Remembered {
    /// The preferences kept in `data_dir`; a checkpoint, tokenizer or preset given at launch replaces
    /// the remembered one, and with no base model at all, the chosen generation's (Needle 3 unless
    /// another was chosen) from the hub cache is used when it is there.
    pub fn open(
        data_dir: &Path,
        hub: &Hub,
        checkpoint: Option<PathBuf>,
        tokenizer: Option<PathBuf>,
        preset_name: Option<String>,
    ) -> Self {
        // Named before the preferences had their name; kept so that earlier choices still load.
        let path = data_dir.join("settings.json");
        let mut preferences = Preferences::load(&path);
        if let Some(checkpoint) = checkpoint {
            preferences.tokenizer = Some(needle_engine::tokenizer::default_path(&checkpoint));
            preferences.checkpoint = Some(checkpoint);
        }
        if let Some(tokenizer) = tokenizer {
            preferences.tokenizer = Some(tokenizer);
        }
        if let Some(name) = preset_name.filter(|name| preset(name).is_some()) {
            preferences.preset = name;
        }
        if preferences.checkpoint.is_none() {
            // Both files of one model: a remembered tokenizer may belong to another.
            if let Some(base) = needle_engine::hub::cached_base_model(hub, preferences.generation) {
                preferences.tokenizer = Some(base.tokenizer);
                preferences.checkpoint = Some(base.checkpoint);
            }
        }
        Self { path, current: Mutex::new(preferences) }
    }

    pub fn get(&self) -> Preferences {
        lock(&self.current).clone()
    }

    /// The published base model's generation chosen by Download or Use.
    pub fn generation(&self) -> Generation {
        lock(&self.current).generation
    }

    /// Remembers what the window's fields say. The base model's generation is not a field: it stays
    /// as Download and Use chose it ([`Self::use_base_model`]); nor is the notification's threshold.
    pub fn save_window(&self, preferences: Preferences) -> Result<(), String> {
        let Preferences { generation, notify_after_s, .. } = self.get();
        self.remember(Preferences { generation, notify_after_s, ..preferences })
    }

    /// Makes `base`, the published base model of `generation`, the remembered one (Download, Use).
    pub fn use_base_model(&self, generation: Generation, base: &BaseModel) -> Result<(), String> {
        let mut preferences = self.get();
        preferences.generation = generation;
        preferences.checkpoint = Some(base.checkpoint.clone());
        preferences.tokenizer = Some(base.tokenizer.clone());
        self.remember(preferences)
    }

    fn remember(&self, preferences: Preferences) -> Result<(), String> {
        preferences.save(&self.path)?;
        *lock(&self.current) = preferences;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_falls_back_to_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.json");
        assert_eq!(Preferences::load(&path), Preferences::default());
        let preferences = Preferences {
            checkpoint: Some("/m/base.pkl".into()),
            generation: Generation::Needle2,
            device: "cpu".into(),
            ..Preferences::default()
        };
        preferences.save(&path).unwrap();
        assert_eq!(Preferences::load(&path), preferences);
        // A file from before the choice of generation: the app's default, Needle 3.
        std::fs::write(&path, r#"{"checkpoint": "/m/base.pkl", "device": "cpu"}"#).unwrap();
        assert_eq!(Preferences::load(&path), Preferences { generation: Generation::Needle3, ..preferences });
        std::fs::write(&path, "{not json").unwrap();
        assert_eq!(Preferences::load(&path), Preferences::default());
    }
}
