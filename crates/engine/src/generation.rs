//! The generations of the Needle model: which one a model belongs to, and how people and command
//! lines name it. Ground floor: it imports nothing of the crate. What differs between generations is
//! answered by the module that owns each part (`cact::format::tag`, `cact::format::layout`,
//! `config::ModelConfig::defaults_for`, `tokenizer::chat_markers`, `hub::PublishedBase::of`, …), so
//! a third generation is one [`Generation`] variant and the compiler points at every `match` that
//! must learn about it; [`crate::profile`] assembles those answers into one summary for the app.
//!
//! [`DEFAULT`] is the one place the default generation is chosen: what the CLI's `--generation`,
//! the download, the app's Model step and its dataset report fall back to when no file says
//! which generation it is. A checkpoint's own generation is always read from the file
//! ([`crate::checkpoint::file_generation`]).

use serde::{Deserialize, Serialize};

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

impl Generation {
    /// Every generation, oldest first.
    pub const ALL: [Generation; 2] = [Generation::Needle2, Generation::Needle3];

    /// How people see it: "Needle 3".
    pub const fn name(self) -> &'static str {
        match self {
            Generation::Needle2 => "Needle 2",
            Generation::Needle3 => "Needle 3",
        }
    }

    /// How a command line names it (`--generation 3`).
    pub const fn number(self) -> u8 {
        match self {
            Generation::Needle2 => 2,
            Generation::Needle3 => 3,
        }
    }

    /// The Python package whose files and arithmetic it follows.
    pub const fn package(self) -> &'static str {
        match self {
            Generation::Needle2 => "cactus-needle 2.x",
            Generation::Needle3 => "cactus-needle 3.x",
        }
    }
}

impl std::fmt::Display for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The generation as a command line names it: its number (`2`, `3`), or as it is displayed
/// (`Needle 3`, `needle3`).
impl std::str::FromStr for Generation {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        let lower = name.trim().to_ascii_lowercase();
        let number = lower.strip_prefix("needle").unwrap_or(&lower).trim();
        Generation::ALL.into_iter().find(|g| g.number().to_string() == number).ok_or_else(|| {
            let numbers: Vec<String> = Generation::ALL.iter().map(|g| g.number().to_string()).collect();
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
            assert_eq!(generation.number().to_string().parse::<Generation>(), Ok(generation));
        }
        assert_eq!("needle2".parse::<Generation>(), Ok(Generation::Needle2));
        assert!("4".parse::<Generation>().unwrap_err().contains("use 2 or 3"));
    }

    #[test]
    fn the_default_is_needle3() {
        assert_eq!(Generation::default(), Generation::Needle3);
    }
}
