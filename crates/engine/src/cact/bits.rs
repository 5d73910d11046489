//! Per-tensor bit widths: the reference's `parse_bits_map` / `_bits_for` / `canonical_tensor_name`.
//!
//! A map like `default=4,attn.q_proj=2,engram=1.58` names tensors by *canonical* names, so the same
//! spec works whether a key is written as an export name (`layer03.q_proj`), a checkpoint path
//! (`stack/layers/block/self_attn/q_proj/kernel`) or already canonical (`attn.q_proj`).

use std::sync::LazyLock;

use regex::Regex;
use thiserror::Error;

use crate::config::ModelConfig;
use crate::quant::Bits;

/// A `weight_bits` spec that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BitsMapError {
    #[error("bits map {spec:?}: entry {entry:?} has no `=`; write entries as NAME=BITS, e.g. attn.q_proj=2")]
    MissingEquals { spec: String, entry: String },
    #[error("bits map {spec:?}: entry {entry:?} has width {value:?}; supported widths are 2, 3, 4 and 1.58")]
    UnsupportedWidth { spec: String, entry: String, value: String },
    #[error("bits map {spec:?} needs a default=<b> entry (e.g. append `,default=4`)")]
    MissingDefault { spec: String },
}

static LAYER_PREFIX: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^layer\d+\.").expect("static regex"));
static ENGRAM_PREFIX: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^engrams?_?(\d+)[./]?").expect("static regex"));
static ENGRAM_TABLES: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(engram\d+\.)embedding$").expect("static regex"));

/// The reference's `canonical_tensor_name`: one spelling for a tensor however it was named.
pub fn canonical_tensor_name(name: &str) -> String {
    let n = LAYER_PREFIX.replace(name, "attn.");
    let n = ENGRAM_PREFIX.replace(&n, "engram${1}.");
    let n = n.strip_prefix("stack/").unwrap_or(&n);
    let n = n.replace("layers/block/self_attn/", "attn.").replace("mtp_block/self_attn/", "mtp.");
    let n = n.strip_suffix("/kernel").unwrap_or(&n);
    let n = if n == "embedding/embedding" { "embedding" } else { n };
    ENGRAM_TABLES.replace(n, "${1}tables").replace('/', ".")
}

/// A parsed `weight_bits` spec: canonical-name prefixes with their widths, and the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitsMap {
    /// In spec order; a repeated key keeps its last width, as a Python dict does.
    entries: Vec<(String, Bits)>,
    default: Bits,
}

fn parse_width(value: &str) -> Option<Bits> {
    let v = value.trim();
    // The reference accepts 1.58 in any float spelling, every other width only as an integer.
    if v.parse::<f64>().ok() == Some(1.58) {
        return Some(Bits::Ternary);
    }
    match v.parse::<i64>().ok()? {
        2 => Some(Bits::Two),
        3 => Some(Bits::Three),
        4 => Some(Bits::Four),
        _ => None,
    }
}

impl BitsMap {
    /// The reference's `parse_bits_map`.
    pub fn parse(spec: &str) -> Result<Self, BitsMapError> {
        let mut entries: Vec<(String, Bits)> = Vec::new();
        let mut default = None;
        for entry in spec.split(',').filter(|e| !e.trim().is_empty()) {
            let (key, value) = entry
                .split_once('=')
                .ok_or_else(|| BitsMapError::MissingEquals { spec: spec.into(), entry: entry.into() })?;
            let bits = parse_width(value).ok_or_else(|| BitsMapError::UnsupportedWidth {
                spec: spec.into(),
                entry: entry.into(),
                value: value.trim().into(),
            })?;
            if key.trim() == "default" {
                default = Some(bits);
            } else {
                let canon = canonical_tensor_name(key.trim());
                entries.retain(|(k, _)| *k != canon);
                entries.push((canon, bits));
            }
        }
        let default = default.ok_or_else(|| BitsMapError::MissingDefault { spec: spec.into() })?;
        Ok(Self { entries, default })
    }

    /// The reference's `_bits_for`: the longest key that prefixes the tensor's canonical name wins.
    pub fn bits_for(&self, tensor_name: &str) -> Bits {
        let canon = canonical_tensor_name(tensor_name);
        self.entries
            .iter()
            .filter(|(k, _)| canon.starts_with(k.as_str()))
            .max_by_key(|(k, _)| k.len())
            .map_or(self.default, |(_, b)| *b)
    }
}

/// How each CQ tensor of an export gets its width.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BitsChoice {
    Uniform(Bits),
    Map { spec: String, map: BitsMap },
}

impl BitsChoice {
    /// `build_main`'s rule: an explicit `--bits` wins, else the checkpoint's `weight_bits`, else W4.
    pub fn resolve(cli_bits: Option<Bits>, config: &ModelConfig) -> Result<Self, BitsMapError> {
        match cli_bits {
            Some(bits) => Ok(BitsChoice::Uniform(bits)),
            None if config.weight_bits.is_empty() => Ok(BitsChoice::Uniform(Bits::Four)),
            None => Ok(BitsChoice::Map { spec: config.weight_bits.clone(), map: BitsMap::parse(&config.weight_bits)? }),
        }
    }

    pub fn bits_for(&self, tensor_name: &str) -> Bits {
        match self {
            BitsChoice::Uniform(bits) => *bits,
            BitsChoice::Map { map, .. } => map.bits_for(tensor_name),
        }
    }

    /// The scheme as the reference prints it: `W4` or `mixed[SPEC]`.
    pub fn scheme(&self) -> String {
        match self {
            BitsChoice::Uniform(bits) => format!("W{bits}"),
            BitsChoice::Map { spec, .. } => format!("mixed[{spec}]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_names_agree_across_export_names_and_checkpoint_paths() {
        let cases = [
            ("layer03.q_proj", "attn.q_proj"),
            ("stack/layers/block/self_attn/q_proj/kernel", "attn.q_proj"),
            ("embedding/embedding", "embedding"),
            ("embedding", "embedding"),
            ("engrams_0/embedding", "engram0.tables"),
            ("engram1.tables", "engram1.tables"),
            ("engrams_1/key_proj/kernel", "engram1.key_proj"),
            ("stack/mhc_phi_pre", "mhc_phi_pre"),
            ("mtp_block/self_attn/k_proj/kernel", "mtp.k_proj"),
        ];
        for (name, canon) in cases {
            assert_eq!(canonical_tensor_name(name), canon, "{name}");
        }
    }

    #[test]
    fn longest_prefix_wins_and_the_default_covers_the_rest() {
        let map = BitsMap::parse("default=4, attn=3,stack/layers/block/self_attn/q_proj/kernel=2,engram=1.58").unwrap();
        assert_eq!(map.bits_for("layer00.q_proj"), Bits::Two);
        assert_eq!(map.bits_for("layer11.k_proj"), Bits::Three);
        assert_eq!(map.bits_for("engram0.tables"), Bits::Ternary);
        assert_eq!(map.bits_for("embedding"), Bits::Four);
    }

    #[test]
    fn a_repeated_key_keeps_its_last_width() {
        let map = BitsMap::parse("attn=2,default=4,attn=3").unwrap();
        assert_eq!(map.bits_for("layer00.v_proj"), Bits::Three);
    }

    #[test]
    fn bad_specs_name_the_entry_and_the_fix() {
        assert_eq!(BitsMap::parse("attn=2"), Err(BitsMapError::MissingDefault { spec: "attn=2".into() }));
        let err = BitsMap::parse("default=4,attn=8").unwrap_err();
        assert!(err.to_string().contains("\"attn=8\"") && err.to_string().contains("1.58"), "{err}");
        assert!(matches!(BitsMap::parse("default=4.0"), Err(BitsMapError::UnsupportedWidth { .. })));
        assert!(matches!(BitsMap::parse("default=4,attn"), Err(BitsMapError::MissingEquals { .. })));
    }

    #[test]
    fn cli_bits_win_then_the_config_map_then_w4() {
        let mut cfg = ModelConfig { weight_bits: "default=2".into(), ..ModelConfig::default() };
        assert_eq!(BitsChoice::resolve(Some(Bits::Four), &cfg).unwrap().scheme(), "W4");
        assert_eq!(BitsChoice::resolve(None, &cfg).unwrap().bits_for("embedding"), Bits::Two);
        assert_eq!(BitsChoice::resolve(None, &cfg).unwrap().scheme(), "mixed[default=2]");
        cfg.weight_bits.clear();
        assert_eq!(BitsChoice::resolve(None, &cfg).unwrap(), BitsChoice::Uniform(Bits::Four));
    }
}
