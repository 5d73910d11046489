//! What a user chooses for a run and for a build, written down once.
//!
//! [`TrainSettings`] holds the fine-tuning hyper-parameters; its `Default` is the reference's recipe
//! (`needle finetune` with no flags). [`TRAIN_FIELDS`] describes each one — its key, its CLI flag, its
//! label, its range and what to say when a value is outside it — and is what every front end reads:
//! the CLI builds its flags from it, the app checks what the user typed with [`TrainSettings::from_text`],
//! builds the worker's arguments with [`TrainSettings::flags`] and hands the table to its UI. The same
//! holds for the `.cact` widths a build offers ([`BUILD_WIDTHS`], [`build_width`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use crate::cact::Bits;
use crate::lora::MAX_RANK;

/// The hyper-parameters of a fine-tuning run. The keys are [`TRAIN_FIELDS`]' names.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainSettings {
    pub epochs: usize,
    pub lr: f64,
    pub rank: usize,
    pub alpha: f64,
    pub batch_size: usize,
    pub max_len: usize,
    pub val_split: f64,
    pub seed: u64,
    /// Train quantization-aware where the generation's recipe does not (Needle 2): see the
    /// field's help. Settings recorded before it was kept read as off.
    #[serde(default)]
    pub qat: bool,
}

impl Default for TrainSettings {
    /// The reference's `needle finetune` defaults.
    fn default() -> Self {
        Self {
            epochs: 3,
            lr: 1e-4,
            rank: 16,
            alpha: 32.0,
            batch_size: 16,
            max_len: 1024,
            val_split: 0.1,
            seed: 0,
            qat: false,
        }
    }
}

/// A named set of [`TrainSettings`]: what the app's Run panel offers as one click and
/// `needle finetune --preset` fills before any flag given beside it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Preset {
    pub name: &'static str,
    pub label: &'static str,
    pub description: &'static str,
    pub settings: TrainSettings,
}

/// Quick (the first run's), Balanced (the reference's recipe) and Thorough.
pub fn presets() -> [Preset; 3] {
    let balanced = TrainSettings::default();
    [
        Preset {
            name: "quick",
            label: "Quick",
            description: "Short passes at a high learning rate with a small adapter: a first look in minutes.",
            settings: TrainSettings {
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
            settings: balanced,
        },
        Preset {
            name: "thorough",
            label: "Thorough",
            description: "More epochs at a gentler rate with a larger adapter and validation split.",
            settings: TrainSettings { epochs: 6, lr: 5e-5, rank: 32, alpha: 64.0, val_split: 0.15, ..balanced },
        },
    ]
}

/// The preset called `name`.
pub fn preset(name: &str) -> Option<Preset> {
    presets().into_iter().find(|preset| preset.name == name)
}

/// One end of a field's range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    /// The value itself is allowed.
    Closed(f64),
    /// Values up to, but not including, this one.
    Open(f64),
    None,
}

/// How one setting is named, shown and bounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    /// The key in [`TrainSettings`], the app's field id.
    pub name: &'static str,
    /// The CLI flag, without its dashes.
    pub flag: &'static str,
    pub label: &'static str,
    /// The CLI's help line.
    pub help: &'static str,
    pub kind: FieldKind,
    /// What to enter instead of a value outside the range.
    pub expected: &'static str,
}

/// What a field holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldKind {
    /// A number within `min` and `max`; with `whole`, only whole, non-negative numbers.
    Number { whole: bool, min: Bound, max: Bound },
    /// On or off: a flag the CLI takes without a value, a checkbox in a form. Not given reads as off.
    Switch,
}

/// The largest `--max-len` accepted; a run's cap is also never more than the model's `max_seq_len`.
const MAX_LEN_LIMIT: usize = 1 << 20;

/// Every fine-tuning setting, in the order the CLI checks them and the app shows them.
pub static TRAIN_FIELDS: [Field; 9] = [
    Field {
        name: "epochs",
        flag: "epochs",
        label: "Epochs",
        help: "Passes over the training examples",
        kind: FieldKind::Number { whole: true, min: Bound::Closed(1.0), max: Bound::Closed(100_000.0) },
        expected: "use 1 to 100000",
    },
    Field {
        name: "lr",
        flag: "lr",
        label: "Learning rate",
        help: "Peak learning rate, after a linear warmup and before the cosine decay",
        kind: FieldKind::Number { whole: false, min: Bound::Open(0.0), max: Bound::Closed(1.0) },
        expected: "use a learning rate in (0, 1], e.g. 1e-4",
    },
    Field {
        name: "rank",
        flag: "lora-rank",
        label: "LoRA rank",
        help: "Rank of each adapter pair A·B",
        kind: FieldKind::Number { whole: true, min: Bound::Closed(1.0), max: Bound::Closed(MAX_RANK as f64) },
        expected: "use 1 to 4096",
    },
    Field {
        name: "alpha",
        flag: "lora-alpha",
        label: "LoRA alpha",
        help: "Adapter scale numerator: the update is scaled by alpha / rank",
        kind: FieldKind::Number { whole: false, min: Bound::Open(0.0), max: Bound::None },
        expected: "use a positive number, e.g. 2 × rank",
    },
    Field {
        name: "batch_size",
        flag: "batch-size",
        label: "Batch size",
        help: "Examples per optimizer step",
        kind: FieldKind::Number { whole: true, min: Bound::Closed(1.0), max: Bound::Closed(65_536.0) },
        expected: "use 1 to 65536",
    },
    Field {
        name: "max_len",
        flag: "max-len",
        label: "Max length (tokens)",
        help: "Longest sequence length; rows use the reference's fit_max_len bucket under it",
        kind: FieldKind::Number { whole: true, min: Bound::Closed(2.0), max: Bound::Closed(MAX_LEN_LIMIT as f64) },
        expected: "use 2 (a token and its successor) to 1048576; a run never uses more than the model's max_seq_len",
    },
    Field {
        name: "val_split",
        flag: "val-split",
        label: "Validation split",
        help: "Fraction of examples held out for the per-epoch validation loss",
        kind: FieldKind::Number { whole: false, min: Bound::Closed(0.0), max: Bound::Open(1.0) },
        expected: "use a fraction in [0, 1)",
    },
    Field {
        name: "seed",
        flag: "seed",
        label: "Seed",
        help: "Seeds the validation split, the per-epoch shuffles and the LoRA initialisation",
        kind: FieldKind::Number { whole: true, min: Bound::Closed(0.0), max: Bound::None },
        expected: "use a whole number",
    },
    Field {
        name: "qat",
        flag: "qat",
        label: "Quantization-aware",
        help: "Train as the .cact computes: weights through 4-bit CQ and activations, queries, keys and values \
               at 8 bits, straight through (Needle 3's recipe always does; Needle 2's 2.0.8 recipe does not)",
        kind: FieldKind::Switch,
        expected: "use true or false",
    },
];

/// A setting outside what a run accepts, named by its CLI flag.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("--{} {value} is out of range: {}", field.flag, field.expected)]
pub struct OutOfRange {
    pub field: &'static Field,
    pub value: String,
}

/// Field name → what is wrong with what was typed there, and how to fix it.
pub type FieldErrors = BTreeMap<&'static str, String>;

impl Field {
    /// Reads what was typed into this field: a number, whole where the field wants one. The value is
    /// kept exact (a seed above 2^53 stays itself); its range is checked by [`Field::admits`].
    pub fn parse(&self, text: &str) -> Result<Value, &'static str> {
        let text = text.trim();
        let whole = match self.kind {
            FieldKind::Number { whole, .. } => whole,
            FieldKind::Switch => return text.parse::<bool>().map(Value::Bool).map_err(|_| self.expected),
        };
        if whole {
            if let Ok(whole) = text.parse::<u64>() {
                return Ok(whole.into());
            }
        }
        let number = text.parse::<f64>().ok().filter(|n| n.is_finite()).ok_or("enter a number")?;
        match whole {
            // `3.0` is three; `2.5` and `-1` are not counts.
            true if number >= 0.0 && number.fract() == 0.0 && number < u64::MAX as f64 => Ok((number as u64).into()),
            true => Err("use a whole number"),
            false => Number::from_f64(number).map(Value::Number).ok_or("enter a number"),
        }
    }

    /// What was typed into this field (text, a number or a boolean; missing reads as empty, and a
    /// switch left empty as off), parsed and held to the range: the value, or what to do instead.
    pub fn read(&self, typed: Option<&Value>) -> Result<Value, &'static str> {
        let text = match typed {
            Some(Value::String(text)) => text.clone(),
            Some(value @ (Value::Number(_) | Value::Bool(_))) => as_typed(value),
            _ => String::new(),
        };
        if self.kind == FieldKind::Switch && text.trim().is_empty() {
            return Ok(Value::Bool(false));
        }
        let value = self.parse(&text)?;
        match self.admits(&value) {
            true => Ok(value),
            false => Err(self.expected),
        }
    }

    /// The field named `name`.
    pub fn named(name: &str) -> Option<&'static Field> {
        TRAIN_FIELDS.iter().find(|field| field.name == name)
    }

    /// Whether `value` is of the field's kind, and within its range.
    pub fn admits(&self, value: &Value) -> bool {
        let (min, max) = match self.kind {
            FieldKind::Number { min, max, .. } => (min, max),
            FieldKind::Switch => return value.is_boolean(),
        };
        let Some(value) = value.as_f64() else { return false };
        let above = match min {
            Bound::Closed(min) => value >= min,
            Bound::Open(min) => value > min,
            Bound::None => true,
        };
        let below = match max {
            Bound::Closed(max) => value <= max,
            Bound::Open(max) => value < max,
            Bound::None => true,
        };
        value.is_finite() && above && below
    }
}

/// A value as a user writes it: `0.0001`, `16`, never `16.0`; `true`.
fn as_typed(value: &Value) -> String {
    match (value.as_u64(), value.as_f64()) {
        (Some(whole), _) => whole.to_string(),
        (None, Some(number)) => number.to_string(),
        _ => value.to_string(),
    }
}

/// A field as a form shows it: its bounds as an input's `min` and `max` (open ends included: the
/// range check says the rest), its step and its default.
#[derive(Debug, Clone, Serialize)]
pub struct FormField {
    pub name: &'static str,
    pub label: &'static str,
    /// `number`, or `switch` (a checkbox; its bounds are null).
    pub kind: FormKind,
    pub whole: bool,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// An `<input type="number">` step: `1` for whole numbers, else `any`.
    pub step: &'static str,
    pub default: Value,
}

/// The input a form shows for a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FormKind {
    Number,
    Switch,
}

/// Every fine-tuning field as a form shows it, with the reference's recipe as the defaults.
pub fn form_fields() -> Vec<FormField> {
    let edge = |bound| match bound {
        Bound::Closed(value) | Bound::Open(value) => Some(value),
        Bound::None => None,
    };
    TrainSettings::default()
        .values()
        .map(|(field, default)| {
            let (kind, whole, min, max) = match field.kind {
                FieldKind::Number { whole, min, max } => (FormKind::Number, whole, edge(min), edge(max)),
                FieldKind::Switch => (FormKind::Switch, false, None, None),
            };
            FormField {
                name: field.name,
                label: field.label,
                kind,
                whole,
                min,
                max,
                step: if whole { "1" } else { "any" },
                default,
            }
        })
        .collect()
}

impl TrainSettings {
    /// Every value as written on a command line (`0.0001`, `16`), in [`TRAIN_FIELDS`] order.
    pub fn written(&self) -> impl Iterator<Item = (&'static Field, String)> {
        self.values().map(|(field, value)| (field, as_typed(&value)))
    }

    /// Every value as `(field, value)`, in [`TRAIN_FIELDS`] order.
    fn values(&self) -> impl Iterator<Item = (&'static Field, Value)> {
        let Ok(Value::Object(mut map)) = serde_json::to_value(self) else {
            unreachable!("a struct of numbers serialises to a JSON object")
        };
        TRAIN_FIELDS.iter().map(move |field| (field, map.remove(field.name).unwrap_or(Value::Null)))
    }

    /// Every setting outside what a run accepts, in field order: the CLI stops at the first, the app
    /// marks them all before Start.
    pub fn out_of_range(&self) -> Vec<OutOfRange> {
        self.values()
            .filter(|(field, value)| !field.admits(value))
            .map(|(field, value)| OutOfRange { field, value: as_typed(&value) })
            .collect()
    }

    /// The settings from what was typed into each field (text, or numbers), or what is wrong with
    /// every field that is wrong — all at once, so each bad field is marked together.
    pub fn from_text(typed: &BTreeMap<String, Value>) -> Result<Self, FieldErrors> {
        let mut errors = FieldErrors::new();
        let mut values = Map::new();
        for field in &TRAIN_FIELDS {
            match field.read(typed.get(field.name)) {
                Ok(value) => {
                    values.insert(field.name.into(), value);
                }
                Err(problem) => {
                    errors.insert(field.name, problem.into());
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        serde_json::from_value(Value::Object(values))
            .map_err(|e| FieldErrors::from([("settings", format!("cannot read the settings: {e}"))]))
    }

    /// `--flag value` for every setting, and `--flag` for each switch that is on, as `needle
    /// finetune` takes them.
    pub fn flags(&self) -> Vec<String> {
        self.values()
            .flat_map(|(field, value)| match (field.kind, value) {
                (FieldKind::Switch, Value::Bool(on)) => on.then(|| format!("--{}", field.flag)).into_iter().collect(),
                (_, value) => vec![format!("--{}", field.flag), as_typed(&value)],
            })
            .collect()
    }
}

/// A `.cact` width a build offers.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BuildWidth {
    pub bits: u8,
    pub label: &'static str,
    /// The width chosen unless the user picks another.
    pub default: bool,
}

/// The widths `needle build --bits` and the app's Build offer, the recommended one first.
pub const BUILD_WIDTHS: [BuildWidth; 2] = [
    BuildWidth { bits: 4, label: "4-bit (recommended)", default: true },
    BuildWidth { bits: 2, label: "2-bit (smaller, less accurate)", default: false },
];

/// The width `bits` names, if a build offers it.
pub fn build_width(bits: u8) -> Result<Bits, String> {
    BUILD_WIDTHS
        .iter()
        .find(|width| width.bits == bits)
        .and_then(|width| Bits::from_record_bits(width.bits.into()))
        .ok_or_else(|| not_offered(bits))
}

/// The width typed as `text` (`needle build --bits`), if a build offers it.
pub fn parse_build_width(text: &str) -> Result<Bits, String> {
    text.trim().parse().map_err(|_| not_offered(text)).and_then(build_width)
}

fn not_offered(bits: impl std::fmt::Display) -> String {
    let offered: Vec<String> = BUILD_WIDTHS.iter().map(|width| width.bits.to_string()).collect();
    format!("{bits}-bit is not a .cact width; choose {}", offered.join(" or "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
        let mut map: BTreeMap<String, Value> =
            TrainSettings::default().values().map(|(f, v)| (f.name.to_string(), v)).collect();
        map.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())));
        map
    }

    #[test]
    fn the_table_names_every_setting_once_and_the_default_is_in_range() {
        let Value::Object(keys) = serde_json::to_value(TrainSettings::default()).unwrap() else { panic!() };
        let names: Vec<_> = TRAIN_FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(names.len(), keys.len());
        assert!(keys.keys().all(|key| names.contains(&key.as_str())));
        assert_eq!(TrainSettings::default().out_of_range(), []);
        assert!(BUILD_WIDTHS.iter().all(|w| build_width(w.bits).is_ok()));
        assert_eq!(BUILD_WIDTHS.iter().filter(|w| w.default).count(), 1);
    }

    #[test]
    fn typed_text_and_numbers_read_the_same() {
        let from_text =
            typed(&[("epochs", "6".into()), ("lr", " 2e-3 ".into()), ("seed", "18446744073709551615".into())]);
        let from_numbers = typed(&[("epochs", 6.0.into()), ("lr", 0.002.into()), ("seed", u64::MAX.into())]);
        let a = TrainSettings::from_text(&from_text).unwrap();
        assert_eq!(a, TrainSettings::from_text(&from_numbers).unwrap());
        assert_eq!((a.epochs, a.lr, a.seed), (6, 2e-3, u64::MAX));
    }

    #[test]
    fn every_bad_field_is_marked_at_once_with_its_fix() {
        let bad = typed(&[
            ("epochs", "0".into()),
            ("lr", "fast".into()),
            ("rank", "2.5".into()),
            ("val_split", 1.0.into()),
            ("batch_size", "".into()),
            ("seed", "-1".into()),
        ]);
        let errors = TrainSettings::from_text(&bad).unwrap_err();
        assert_eq!(errors["epochs"], "use 1 to 100000");
        assert_eq!(errors["lr"], "enter a number");
        assert_eq!(errors["rank"], "use a whole number");
        assert_eq!(errors["val_split"], "use a fraction in [0, 1)");
        assert_eq!(errors["batch_size"], "enter a number");
        assert_eq!(errors["seed"], "use a whole number");
        assert_eq!(errors.len(), 6);
    }

    #[test]
    fn out_of_range_names_the_flag() {
        let settings = TrainSettings { rank: 0, val_split: -0.5, ..TrainSettings::default() };
        let problems: Vec<String> = settings.out_of_range().iter().map(ToString::to_string).collect();
        assert_eq!(
            problems,
            [
                "--lora-rank 0 is out of range: use 1 to 4096",
                "--val-split -0.5 is out of range: use a fraction in [0, 1)"
            ]
        );
    }

    #[test]
    fn flags_carry_every_setting_in_a_form_the_fields_read_back() {
        for qat in [false, true] {
            let settings = TrainSettings { lr: 2e-3, alpha: 16.0, seed: 7, qat, ..TrainSettings::default() };
            let mut flags = settings.flags().into_iter();
            let mut read = BTreeMap::new();
            while let Some(flag) = flags.next() {
                let field = TRAIN_FIELDS.iter().find(|f| flag == format!("--{}", f.flag)).unwrap();
                // A switch is on where its flag stands alone.
                let value = match field.kind {
                    FieldKind::Switch => "true".to_string(),
                    FieldKind::Number { .. } => flags.next().unwrap(),
                };
                read.insert(field.name.to_string(), Value::String(value));
            }
            assert_eq!(read.len(), TRAIN_FIELDS.len() - usize::from(!qat), "{read:?}");
            assert_eq!(TrainSettings::from_text(&read).unwrap(), settings);
        }
    }

    #[test]
    fn a_switch_is_off_unless_turned_on_and_reads_only_true_or_false() {
        let qat = Field::named("qat").unwrap();
        assert_eq!(qat.read(None), Ok(Value::Bool(false)), "a checkbox left alone sends nothing");
        assert_eq!(qat.read(Some(&"".into())), Ok(Value::Bool(false)));
        assert_eq!(qat.read(Some(&Value::Bool(true))), Ok(Value::Bool(true)));
        assert_eq!(qat.read(Some(&"true".into())), Ok(Value::Bool(true)));
        assert_eq!(qat.read(Some(&"maybe".into())), Err("use true or false"));
        assert_eq!(qat.read(Some(&1.0.into())), Err("use true or false"));
        // Settings recorded before the switch read as off, the recipe they ran.
        let mut recorded = serde_json::to_value(TrainSettings::default()).unwrap();
        recorded.as_object_mut().unwrap().remove("qat");
        assert_eq!(serde_json::from_value::<TrainSettings>(recorded).unwrap(), TrainSettings::default());
        let form = form_fields();
        let switch = form.iter().find(|field| field.name == "qat").unwrap();
        assert_eq!((switch.kind, &switch.default), (FormKind::Switch, &Value::Bool(false)));
    }
}
