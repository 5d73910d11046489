//! What the app remembers between launches: the base model (its files, and the published generation
//! chosen in the Model step), the device choice and the preset.

use std::path::{Path, PathBuf};

use needle_engine::generation::Generation;
use serde::{Deserialize, Serialize};

/// The most a preferences file may hold; it is a few paths and names.
const SETTINGS_LIMIT: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Preferences {
    pub checkpoint: Option<PathBuf>,
    pub tokenizer: Option<PathBuf>,
    /// The published base model chosen by Download or Use (the default generation until one is).
    pub generation: Generation,
    /// `auto`, or a backend forced by the user.
    pub device: String,
    pub preset: String,
}

impl Default for Preferences {
    fn default() -> Self {
        Self {
            checkpoint: None,
            tokenizer: None,
            generation: Generation::default(),
            device: "auto".into(),
            preset: "balanced".into(),
        }
    }
}

impl Preferences {
    /// The saved preferences (a few paths and names); the defaults when there are none or the file is unreadable (it is only a
    /// convenience, and the next save replaces it).
    pub fn load(path: &Path) -> Self {
        let bytes = crate::history::read_limited(path, SETTINGS_LIMIT).ok();
        bytes.and_then(|bytes| serde_json::from_slice(&bytes).ok()).unwrap_or_default()
    }

    pub fn save(&self, path: &Path) -> Result<(), String> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        needle_engine::atomic::write_atomically(path, &json)
            .map_err(|error| format!("could not save the preferences to {}: {error}", path.display()))
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
