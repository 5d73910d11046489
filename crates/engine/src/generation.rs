//! The generations of the Needle model, and everything that differs between them beyond the
//! network's parts, written once: one [`Profile`] per generation. Code asks the profile
//! (`generation.profile().cact.tag`), never compares generations, so a third generation is one
//! [`Generation`] variant, one profile and its network parts (`model::san`), and the compiler
//! points at every `match` that must learn about it.
//!
//! [`DEFAULT`] is the one place the default generation is chosen: what the CLI's `--generation`,
//! the download, the app's Model step and its dataset report fall back to when no file says
//! which generation it is. A checkpoint's own generation is always read from the file
//! ([`crate::checkpoint::file_generation`]).

use serde::{Deserialize, Serialize};

use crate::cact::format::{self, Field};
use crate::cact::layout::Layout;
use crate::cact::quant::Bits;
use crate::cact::{needle2, needle3};
use crate::config::ModelConfig;
use crate::hub::PublishedBase;
use crate::tokenizer::CHAT_MARKERS;

/// A generation of the Needle model: which network, file formats and recipe a model belongs to.
/// Told from the file itself ([`crate::checkpoint::generation`], the `.cact` tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Generation {
    /// `cactus-needle` 2.x: pickled format-v2 checkpoints, `.cact` tag `0x05E12A83`.
    Needle2,
    /// `cactus-needle` 3.x: safetensors checkpoints with the config in their metadata, `.cact` v3.
    Needle3,
}

/// The generation used where no file says which: Needle 3, upstream's current generation (its
/// `needle` CLI trains Needle 3), and what the app offers first.
pub const DEFAULT: Generation = Generation::Needle3;

impl Default for Generation {
    fn default() -> Self {
        DEFAULT
    }
}

/// What one generation is, beyond its network's parts.
pub struct Profile {
    /// How people see it: "Needle 3".
    pub name: &'static str,
    /// How a command line names it (`--generation 3`).
    pub number: u8,
    /// The Python package whose files and arithmetic it follows.
    pub package: &'static str,
    /// The file a base checkpoint of it is.
    pub checkpoint: FileKind,
    /// The file its package saves an adapter as.
    pub adapter: FileKind,
    /// Its `.cact`: tag, header and tensor layout.
    pub cact: CactFormat,
    /// How its package turns a row into the text the model reads.
    pub chat: ChatFormat,
    /// Which tokenizers fit a vocabulary of its.
    pub vocab: VocabFit,
    /// What a build of it may write and leaves out.
    pub ships: Shipping,
    /// How its package trains and scores it.
    pub recipe: Recipe,
    /// Whether the hand-written CPU path ([`crate::model::CpuNetwork`]) computes it.
    pub cpu_path: bool,
    /// Its published base model on the hub.
    pub hub: PublishedBase,
}

/// A file format a generation's package writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A Python pickle (2.x's format-v2 dicts), read without executing anything.
    Pickle,
    /// safetensors, with the package's fields in its string metadata.
    Safetensors,
}

impl FileKind {
    pub const ALL: [FileKind; 2] = [FileKind::Pickle, FileKind::Safetensors];

    /// The extension such a file is saved with.
    pub fn extension(self) -> &'static str {
        match self {
            FileKind::Pickle => "pkl",
            FileKind::Safetensors => "safetensors",
        }
    }
}

/// A generation's `.cact` container.
pub struct CactFormat {
    /// The first u32 of every file.
    pub tag: u32,
    /// The header's fields after the tag, in file order.
    pub header: &'static [Field],
    /// The tensors, in the order the runtime indexes them.
    pub layout: &'static Layout,
}

/// How a generation's `render_example` writes a row.
#[derive(Debug)]
pub struct ChatFormat {
    /// Its chat markers, which its `.cact` tokenizer blob types USER_DEFINED.
    pub markers: &'static [&'static str],
    pub think: ThinkBlock,
    /// How `tools` and `answers` that are not strings are written into the text.
    pub json: JsonStyle,
    /// How `system` and `reasoning` are read from a row.
    pub text_fields: TextFields,
    /// Whether a row may be a chat transcript (`messages`) rather than `query`/`answers`.
    pub chat_rows: bool,
    /// The `add_dummy_prefix` its `.cact` tokenizer blob states.
    pub blob_dummy_prefix: DummyPrefix,
}

/// The `<think>` block before the calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkBlock {
    /// `<think>{reasoning}</think>\n`, empty reasoning included (2.x).
    Always,
    /// `<think>\n{reasoning}\n</think>\n`, left out when there is no reasoning (3.x).
    WhenReasoning,
}

/// `json.dumps` as a generation's template calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonStyle {
    /// Non-ASCII escaped as `\uXXXX` (2.x).
    Ascii,
    /// `ensure_ascii=False` (3.x).
    Unicode,
}

/// How `system` and `reasoning` are read from a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFields {
    /// As written: a false-y non-string `system` is ignored, a true-y one is refused (2.x).
    AsWritten,
    /// `(row.get(field) or "").strip()` (3.x).
    Stripped,
}

/// The `add_dummy_prefix` a `.cact` tokenizer blob states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DummyPrefix {
    /// Always 1, whatever the model says (2.x).
    Always,
    /// The tokenizer model's own (3.x).
    Model,
}

/// Which tokenizers fit a vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabFit {
    /// A row per piece (2.x).
    Exact,
    /// At most a row per piece: the vocabulary may hold rows past the tokenizer's pieces (3.x's
    /// code embeddings past the text slice).
    AtMost,
}

/// What a generation's build writes.
#[derive(Debug)]
pub struct Shipping {
    /// The weight widths its package builds, the default first.
    pub bits: &'static [Bits],
    /// Whether every depth of the model is a smaller model (`needle build --layers`).
    pub depth_ladder: bool,
    /// Parameter prefixes a build with an adapter leaves out: a probe head the adapter did not
    /// train would judge the tuned model's answers with the base's judgement.
    pub dropped_on_merge: &'static [&'static str],
}

/// How a generation's package trains and scores.
#[derive(Debug)]
pub struct Recipe {
    /// Training sees the weights and activations as the `.cact` quantizes them.
    pub quantization_aware: bool,
    /// The end-of-run scores answer with the weights a `.cact` ships (W4), not the float ones.
    pub scores_shipped_weights: bool,
    /// The config a saved model's missing keys take.
    pub config_defaults: fn() -> ModelConfig,
}

static NEEDLE2: Profile = Profile {
    name: "Needle 2",
    number: 2,
    package: "cactus-needle 2.x",
    checkpoint: FileKind::Pickle,
    adapter: FileKind::Pickle,
    cact: CactFormat { tag: format::TAG, header: &format::FIELDS_V2, layout: &needle2::LAYOUT },
    chat: ChatFormat {
        markers: CHAT_MARKERS.split_at(10).0,
        think: ThinkBlock::Always,
        json: JsonStyle::Ascii,
        text_fields: TextFields::AsWritten,
        chat_rows: false,
        blob_dummy_prefix: DummyPrefix::Always,
    },
    vocab: VocabFit::Exact,
    ships: Shipping { bits: &[Bits::Four, Bits::Two], depth_ladder: false, dropped_on_merge: &[] },
    recipe: Recipe { quantization_aware: false, scores_shipped_weights: false, config_defaults: ModelConfig::default },
    cpu_path: true,
    hub: PublishedBase {
        generation: Generation::Needle2,
        repo: "Cactus-Compute/needle2",
        checkpoint: "checkpoints/needle2.pkl",
        tokenizer: "tokenizer/tokenizer.model",
    },
};

static NEEDLE3: Profile = Profile {
    name: "Needle 3",
    number: 3,
    package: "cactus-needle 3.x",
    checkpoint: FileKind::Safetensors,
    adapter: FileKind::Safetensors,
    cact: CactFormat { tag: format::TAG_V3, header: &format::FIELDS_V3, layout: &needle3::LAYOUT },
    chat: ChatFormat {
        markers: &CHAT_MARKERS,
        think: ThinkBlock::WhenReasoning,
        json: JsonStyle::Unicode,
        text_fields: TextFields::Stripped,
        chat_rows: true,
        blob_dummy_prefix: DummyPrefix::Model,
    },
    vocab: VocabFit::AtMost,
    ships: Shipping { bits: &[Bits::Four], depth_ladder: true, dropped_on_merge: &["confidence_head/"] },
    recipe: Recipe {
        quantization_aware: true,
        scores_shipped_weights: true,
        config_defaults: ModelConfig::needle3_defaults,
    },
    cpu_path: true,
    hub: PublishedBase {
        generation: Generation::Needle3,
        repo: "Cactus-Compute/needle3",
        checkpoint: "checkpoints/needle3.safetensors",
        tokenizer: "tokenizer/tokenizer.model",
    },
};

impl Generation {
    /// Every generation, oldest first.
    pub const ALL: [Generation; 2] = [Generation::Needle2, Generation::Needle3];

    /// What this generation is.
    pub fn profile(self) -> &'static Profile {
        match self {
            Generation::Needle2 => &NEEDLE2,
            Generation::Needle3 => &NEEDLE3,
        }
    }

    /// Whether a tokenizer of `pieces` pieces serves a vocabulary of `vocab_size` rows.
    pub fn tokenizer_fits(self, pieces: usize, vocab_size: usize) -> bool {
        match self.profile().vocab {
            VocabFit::Exact => pieces == vocab_size,
            VocabFit::AtMost => pieces <= vocab_size,
        }
    }

    /// Why a build at `bits` is refused, if it is: a generation ships only the widths its package builds.
    pub fn refuses_bits(self, bits: Bits) -> Option<String> {
        let profile = self.profile();
        (!profile.ships.bits.contains(&bits)).then(|| {
            let offered: Vec<String> = profile.ships.bits.iter().map(|b| format!("W{}", b.record_bits())).collect();
            format!(
                "a {} .cact is {} only (as {} builds it), not W{}",
                profile.name,
                offered.join(" or "),
                profile.package,
                bits.record_bits()
            )
        })
    }

    /// The generation whose `.cact` files start with `tag`.
    pub fn of_cact_tag(tag: u32) -> Option<Generation> {
        Generation::ALL.into_iter().find(|g| g.profile().cact.tag == tag)
    }
}

impl std::fmt::Display for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.profile().name)
    }
}

/// The generation as a command line names it: its number (`2`, `3`), or as it is displayed
/// (`Needle 3`, `needle3`).
impl std::str::FromStr for Generation {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        let lower = name.trim().to_ascii_lowercase();
        let number = lower.strip_prefix("needle").unwrap_or(&lower).trim();
        Generation::ALL.into_iter().find(|g| g.profile().number.to_string() == number).ok_or_else(|| {
            let numbers: Vec<String> = Generation::ALL.iter().map(|g| g.profile().number.to_string()).collect();
            format!("{name:?} is not a Needle generation; use {}", numbers.join(" or "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_an_unknown_one_lists_the_known() {
        for generation in Generation::ALL {
            assert_eq!(generation.to_string().parse::<Generation>(), Ok(generation));
            assert_eq!(generation.profile().number.to_string().parse::<Generation>(), Ok(generation));
        }
        assert_eq!("needle2".parse::<Generation>(), Ok(Generation::Needle2));
        assert!("4".parse::<Generation>().unwrap_err().contains("use 2 or 3"));
    }

    #[test]
    fn the_default_is_needle3_and_every_profile_is_its_own() {
        assert_eq!(Generation::default(), Generation::Needle3);
        let tags: std::collections::BTreeSet<u32> = Generation::ALL.iter().map(|g| g.profile().cact.tag).collect();
        assert_eq!(tags.len(), Generation::ALL.len());
        for generation in Generation::ALL {
            assert_eq!(Generation::of_cact_tag(generation.profile().cact.tag), Some(generation));
            assert_eq!((generation.profile().recipe.config_defaults)().generation, generation);
            assert_eq!(generation.profile().hub.generation, generation);
            // The default width is one the generation ships.
            assert_eq!(generation.refuses_bits(generation.profile().ships.bits[0]), None);
        }
    }

    #[test]
    fn a_generation_ships_only_its_widths_and_says_which() {
        assert_eq!(Generation::Needle2.refuses_bits(Bits::Two), None);
        let refusal = Generation::Needle3.refuses_bits(Bits::Two).unwrap();
        assert!(refusal.contains("W4 only") && refusal.contains("not W2"), "{refusal}");
    }

    #[test]
    fn tokenizers_fit_as_each_package_allows() {
        assert!(Generation::Needle2.tokenizer_fits(512, 512));
        assert!(!Generation::Needle2.tokenizer_fits(500, 512));
        assert!(Generation::Needle3.tokenizer_fits(500, 512));
        assert!(!Generation::Needle3.tokenizer_fits(513, 512));
    }
}
