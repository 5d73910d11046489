//! What one generation is, in one place for a reader and for the app: each part asked of the module
//! that owns it (the `.cact` container of [`crate::cact::format`], the chat template of
//! [`crate::dataset`], the build's widths of [`crate::cact::export::Shipping`], …) and assembled here.
//! It sits above every module it asks, and none of them imports it: a format answers for a
//! generation itself.

use crate::cact::export::Shipping;
use crate::cact::format::{self, Field};
use crate::cact::layout::Layout;
use crate::checkpoint::FileKind;
use crate::config::{ModelConfig, Recipe};
use crate::dataset::ChatFormat;
use crate::generation::Generation;
use crate::hub::PublishedBase;
use crate::lora::adapter_kind;
use crate::quant::Bits;
use crate::tokenizer::{chat_markers, VocabFit};

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
    /// Its chat markers, which its `.cact` tokenizer blob types USER_DEFINED.
    pub markers: &'static [&'static str],
    /// Which tokenizers fit a vocabulary of its.
    pub vocab: VocabFit,
    /// What a build of it may write and leaves out.
    pub ships: &'static Shipping,
    /// How its package trains and scores it.
    pub recipe: Recipe,
    /// The config a saved model's missing keys take.
    pub config_defaults: ModelConfig,
    /// Its published base model on the hub.
    pub hub: &'static PublishedBase,
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

impl Generation {
    /// What this generation is.
    pub fn profile(self) -> Profile {
        Profile {
            name: self.name(),
            number: self.number(),
            package: self.package(),
            checkpoint: FileKind::of_checkpoint(self),
            adapter: adapter_kind(self),
            cact: CactFormat { tag: format::tag(self), header: format::fields(self), layout: format::layout(self) },
            chat: ChatFormat::of(self),
            markers: chat_markers(self),
            vocab: VocabFit::of(self),
            ships: Shipping::of(self),
            recipe: Recipe::of(self),
            config_defaults: ModelConfig::defaults_for(self),
            hub: PublishedBase::of(self),
        }
    }

    /// Why a build at `bits` is refused, if it is: a generation ships only the widths its package builds.
    pub fn refuses_bits(self, bits: Bits) -> Option<String> {
        Shipping::of(self).refuses(self, bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_is_its_own() {
        let tags: std::collections::BTreeSet<u32> = Generation::ALL.iter().map(|g| g.profile().cact.tag).collect();
        assert_eq!(tags.len(), Generation::ALL.len());
        for generation in Generation::ALL {
            let profile = generation.profile();
            assert_eq!(format::generation_of_tag(profile.cact.tag), Some(generation));
            assert_eq!(profile.config_defaults.generation, generation);
            assert_eq!(profile.hub.generation, generation);
            // The default width is one the generation ships.
            assert_eq!(generation.refuses_bits(profile.ships.bits[0]), None);
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
        use crate::tokenizer::fits;
        assert!(fits(Generation::Needle2, 512, 512));
        assert!(!fits(Generation::Needle2, 500, 512));
        assert!(fits(Generation::Needle3, 500, 512));
        assert!(!fits(Generation::Needle3, 513, 512));
    }
}
