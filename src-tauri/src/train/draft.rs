//! A training as the app asks for it: the draft the Train panel sends while the user types, and the
//! checked request. What each setting means, its range, its messages and the presets that fill them
//! are the engine's ([`needle_engine::settings`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use needle_engine::settings::{FieldErrors, TrainSettings};
use serde::Deserialize;

use crate::record::request::TrainingRequest;

/// A training as the UI sends it: each setting as typed (text, or a number), possibly missing or wrong.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TrainingDraft {
    pub dataset: Option<String>,
    pub checkpoint: Option<String>,
    pub tokenizer: Option<String>,
    pub device: Option<String>,
    #[serde(default)]
    pub settings: BTreeMap<String, serde_json::Value>,
}

impl TrainingDraft {
    /// The training, or every field that is wrong. `devices` are the choices the hardware offers.
    pub fn check(&self, devices: &[String]) -> Result<TrainingRequest, FieldErrors> {
        let mut errors = FieldErrors::new();
        let dataset = existing_file(&mut errors, "dataset", self.dataset.as_deref(), "choose a dataset (.jsonl)");
        let checkpoint = existing_file(
            &mut errors,
            "checkpoint",
            self.checkpoint.as_deref(),
            "choose a base checkpoint (.pkl, or .safetensors for Needle 3)",
        );
        let tokenizer =
            existing_file(&mut errors, "tokenizer", self.tokenizer.as_deref(), "choose the tokenizer (.model)");
        let device = self.device.clone().unwrap_or_else(|| "auto".into());
        if !devices.contains(&device) {
            errors.insert("device", format!("choose one of {}", devices.join(", ")));
        }
        let settings = TrainSettings::from_text(&self.settings).map_err(|problems| errors.extend(problems)).ok();
        match (dataset, checkpoint, tokenizer, settings) {
            (Some(dataset), Some(checkpoint), Some(tokenizer), Some(settings)) if errors.is_empty() => {
                Ok(TrainingRequest { dataset, checkpoint, tokenizer, device, settings })
            }
            _ => Err(errors),
        }
    }
}

fn existing_file(errors: &mut FieldErrors, field: &'static str, path: Option<&str>, missing: &str) -> Option<PathBuf> {
    match path.map(str::trim).filter(|path| !path.is_empty()) {
        None => {
            errors.insert(field, missing.to_string());
            None
        }
        Some(path) if Path::new(path).is_file() => Some(PathBuf::from(path)),
        Some(path) => {
            errors.insert(field, format!("no file at {path}"));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use needle_engine::settings::presets;

    fn draft(settings: serde_json::Value) -> TrainingDraft {
        let file = env!("CARGO_MANIFEST_PATH");
        TrainingDraft {
            dataset: Some(file.into()),
            checkpoint: Some(file.into()),
            tokenizer: Some(file.into()),
            device: Some("cpu".into()),
            settings: serde_json::from_value(settings).unwrap(),
        }
    }

    fn devices() -> Vec<String> {
        vec!["auto".into(), "cpu".into()]
    }

    #[test]
    fn every_preset_is_a_valid_run() {
        for preset in presets() {
            let value = serde_json::to_value(preset.settings).unwrap();
            let request = draft(value).check(&devices()).unwrap_or_else(|e| panic!("{}: {e:?}", preset.name));
            assert_eq!(request.settings, preset.settings);
        }
    }

    #[test]
    fn marks_every_bad_field_at_once_with_the_engines_messages() {
        let mut settings = serde_json::to_value(presets()[1].settings).unwrap();
        settings["epochs"] = "0".into();
        settings["lr"] = "fast".into();
        settings["rank"] = 2.5.into();
        let mut run = draft(settings);
        run.checkpoint = Some("/no/such/base.pkl".into());
        run.device = Some("tpu".into());
        let errors = run.check(&devices()).unwrap_err();
        assert_eq!(errors["epochs"], "use 1 to 100000");
        assert_eq!(errors["lr"], "enter a number");
        assert_eq!(errors["rank"], "use a whole number");
        assert_eq!(errors["checkpoint"], "no file at /no/such/base.pkl");
        assert_eq!(errors["device"], "choose one of auto, cpu");
        assert_eq!(errors.len(), 5);
    }
}
