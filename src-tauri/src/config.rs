//! A run's configuration: the editable settings, the presets that fill them, and the checks that mark
//! bad values before Start. The ranges are the engine's (`needle finetune` applies the same).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use needle_engine::train::{out_of_range, FinetuneOptions};
use serde::{Deserialize, Serialize};

/// The fields of the Run panel: `needle finetune`'s hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSettings {
    pub epochs: usize,
    pub lr: f64,
    pub rank: usize,
    pub alpha: f64,
    pub batch_size: usize,
    pub max_len: usize,
    pub val_split: f64,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Preset {
    pub name: &'static str,
    pub label: &'static str,
    pub description: &'static str,
    pub settings: RunSettings,
}

/// Quick, Balanced (the reference's defaults) and Thorough.
pub fn presets() -> Vec<Preset> {
    let balanced = RunSettings {
        epochs: 3,
        lr: 1e-4,
        rank: 16,
        alpha: 32.0,
        batch_size: 16,
        max_len: 1024,
        val_split: 0.1,
        seed: 0,
    };
    vec![
        Preset {
            name: "quick",
            label: "Quick",
            description: "Short passes at a high learning rate with a small adapter: a first look in minutes.",
            settings: RunSettings {
                epochs: 6,
                lr: 2e-3,
                rank: 8,
                alpha: 16.0,
                batch_size: 4,
                max_len: 512,
                val_split: 0.2,
                ..balanced
            },
        },
        Preset {
            name: "balanced",
            label: "Balanced",
            description: "The recipe of the reference's `needle finetune`: three epochs, rank 16.",
            settings: balanced.clone(),
        },
        Preset {
            name: "thorough",
            label: "Thorough",
            description: "More epochs at a gentler rate with a larger adapter and validation split.",
            settings: RunSettings { epochs: 6, lr: 5e-5, rank: 32, alpha: 64.0, val_split: 0.15, ..balanced },
        },
    ]
}

/// A run as the UI sends it: fields may be missing or not numbers while the user types.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RunDraft {
    pub dataset: Option<String>,
    pub checkpoint: Option<String>,
    pub tokenizer: Option<String>,
    pub device: Option<String>,
    #[serde(default)]
    pub settings: BTreeMap<String, serde_json::Value>,
}

/// A checked run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    pub dataset: PathBuf,
    pub checkpoint: PathBuf,
    pub tokenizer: PathBuf,
    pub device: String,
    pub settings: RunSettings,
}

/// Field name → what is wrong with it and how to fix it.
pub type FieldErrors = BTreeMap<&'static str, String>;

impl RunDraft {
    /// The run, or every field that is wrong. `devices` are the choices the hardware offers.
    pub fn check(&self, devices: &[String]) -> Result<RunRequest, FieldErrors> {
        let mut errors = FieldErrors::new();
        let dataset = existing_file(&mut errors, "dataset", self.dataset.as_deref(), "choose a dataset (.jsonl)");
        let checkpoint =
            existing_file(&mut errors, "checkpoint", self.checkpoint.as_deref(), "choose a base checkpoint (.pkl)");
        let tokenizer =
            existing_file(&mut errors, "tokenizer", self.tokenizer.as_deref(), "choose the tokenizer (.model)");
        let device = self.device.clone().unwrap_or_else(|| "auto".into());
        if !devices.contains(&device) {
            errors.insert("device", format!("choose one of {}", devices.join(", ")));
        }
        let settings = self.settings(&mut errors);
        match (dataset, checkpoint, tokenizer, settings) {
            (Some(dataset), Some(checkpoint), Some(tokenizer), Some(settings)) if errors.is_empty() => {
                let request = RunRequest { dataset, checkpoint, tokenizer, device, settings };
                for problem in out_of_range(&request.finetune_options(Path::new("adapter.pkl"))) {
                    errors.insert(field_of_flag(problem.flag), problem.expected.to_string());
                }
                if errors.is_empty() {
                    Ok(request)
                } else {
                    Err(errors)
                }
            }
            _ => Err(errors),
        }
    }

    fn settings(&self, errors: &mut FieldErrors) -> Option<RunSettings> {
        let mut number = |field: &'static str| match self.settings.get(field).and_then(serde_json::Value::as_f64) {
            Some(value) if value.is_finite() => Some(value),
            _ => {
                errors.insert(field, "enter a number".into());
                None
            }
        };
        let (epochs, lr, rank, alpha) = (number("epochs"), number("lr"), number("rank"), number("alpha"));
        let (batch_size, max_len, val_split, seed) =
            (number("batch_size"), number("max_len"), number("val_split"), number("seed"));
        let mut whole = |field: &'static str, value: Option<f64>| match value {
            Some(value) if value >= 0.0 && value.fract() == 0.0 => Some(value as u64),
            Some(_) => {
                errors.insert(field, "use a whole number".into());
                None
            }
            None => None,
        };
        // Every field is checked before any is given up on, so all the bad ones are marked at once.
        let (epochs, rank) = (whole("epochs", epochs), whole("rank", rank));
        let (batch_size, max_len, seed) =
            (whole("batch_size", batch_size), whole("max_len", max_len), whole("seed", seed));
        Some(RunSettings {
            epochs: epochs? as usize,
            lr: lr?,
            rank: rank? as usize,
            alpha: alpha?,
            batch_size: batch_size? as usize,
            max_len: max_len? as usize,
            val_split: val_split?,
            seed: seed?,
        })
    }
}

impl RunRequest {
    /// The engine's options for this run, writing its adapter to `out`.
    fn finetune_options(&self, out: &Path) -> FinetuneOptions {
        let s = &self.settings;
        FinetuneOptions {
            data: self.dataset.clone(),
            checkpoint: self.checkpoint.clone(),
            tokenizer: self.tokenizer.clone(),
            epochs: s.epochs,
            batch_size: s.batch_size,
            lr: s.lr,
            rank: s.rank,
            alpha: s.alpha,
            max_len: s.max_len,
            val_split: s.val_split,
            seed: s.seed,
            out: out.to_path_buf(),
            resume: false,
        }
    }

    /// `needle finetune …` for this run, with progress as JSON lines and the flags in `mode`
    /// (`--dry-run`, `--resume`). The dataset comes last, after `--`, so that no file name is
    /// ever read as a flag.
    pub fn finetune_args(&self, out: &Path, mode: &[&str]) -> Vec<OsString> {
        let o = self.finetune_options(out);
        let mut args: Vec<OsString> = vec!["finetune".into(), "--checkpoint".into(), o.checkpoint.into()];
        args.extend(["--tokenizer".into(), o.tokenizer.into(), "--out".into(), o.out.into()]);
        let flags = [
            ("--epochs", o.epochs.to_string()),
            ("--batch-size", o.batch_size.to_string()),
            ("--lr", o.lr.to_string()),
            ("--lora-rank", o.rank.to_string()),
            ("--lora-alpha", o.alpha.to_string()),
            ("--max-len", o.max_len.to_string()),
            ("--val-split", o.val_split.to_string()),
            ("--seed", o.seed.to_string()),
            ("--device", self.device.clone()),
            ("--events", "jsonl".into()),
        ];
        for (flag, value) in flags {
            args.extend([flag.into(), value.into()]);
        }
        args.extend(mode.iter().map(OsString::from));
        args.extend(["--".into(), o.data.into()]);
        args
    }
}

/// The Run panel's field for an engine flag.
fn field_of_flag(flag: &str) -> &'static str {
    match flag {
        "epochs" => "epochs",
        "batch-size" => "batch_size",
        "lr" => "lr",
        "lora-rank" => "rank",
        "lora-alpha" => "alpha",
        "val-split" => "val_split",
        "max-len" => "max_len",
        _ => "settings",
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

    fn draft(settings: serde_json::Value) -> RunDraft {
        let file = env!("CARGO_MANIFEST_PATH");
        RunDraft {
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
            let value = serde_json::to_value(&preset.settings).unwrap();
            let request = draft(value).check(&devices()).unwrap_or_else(|e| panic!("{}: {e:?}", preset.name));
            assert_eq!(request.settings, preset.settings);
        }
    }

    #[test]
    fn marks_every_bad_field_at_once() {
        let mut settings = serde_json::to_value(&presets()[1].settings).unwrap();
        settings["epochs"] = 0.into();
        settings["lr"] = "fast".into();
        settings["rank"] = 2.5.into();
        settings["val_split"] = 1.0.into();
        let mut run = draft(settings);
        run.checkpoint = Some("/no/such/base.pkl".into());
        run.device = Some("tpu".into());
        let errors = run.check(&devices()).unwrap_err();
        assert_eq!(errors["lr"], "enter a number");
        assert_eq!(errors["rank"], "use a whole number");
        assert_eq!(errors["checkpoint"], "no file at /no/such/base.pkl");
        assert_eq!(errors["device"], "choose one of auto, cpu");
        // Ranges are checked once every field is a number.
        assert!(!errors.contains_key("epochs"));
    }

    #[test]
    fn ranges_come_from_the_engine() {
        let mut settings = serde_json::to_value(&presets()[1].settings).unwrap();
        settings["epochs"] = 0.into();
        settings["val_split"] = 1.0.into();
        let errors = draft(settings).check(&devices()).unwrap_err();
        assert_eq!(errors.keys().copied().collect::<Vec<_>>(), ["epochs", "val_split"]);
        assert_eq!(errors["epochs"], "use 1 to 100000");
    }

    #[test]
    fn finetune_arguments_carry_every_setting() {
        let request = draft(serde_json::to_value(&presets()[0].settings).unwrap()).check(&devices()).unwrap();
        let args: Vec<String> = request
            .finetune_args(Path::new("/runs/a.pkl"), &["--resume"])
            .iter()
            .map(|a| a.to_string_lossy().into())
            .collect();
        let joined = args.join(" ");
        for expected in
            ["--epochs 6", "--lr 0.002", "--lora-rank 8", "--lora-alpha 16", "--batch-size 4", "--val-split 0.2"]
        {
            assert!(joined.contains(expected), "{expected} missing from {joined}");
        }
        assert!(joined.contains("--out /runs/a.pkl --epochs"), "{joined}");
        assert!(joined.ends_with(&format!("--device cpu --events jsonl --resume -- {}", request.dataset.display())));
    }
}
