//! The inputs every model-running command takes: a dataset, a base checkpoint and its tokenizer.

use std::path::PathBuf;

use needle_engine::calls::Precision;
use needle_engine::generation::Generation;
use needle_engine::hub::BaseModel;

#[derive(Debug, clap::Args, serde::Serialize)]
pub struct ModelInputs {
    /// Dataset (.jsonl) in the reference's tool-call format
    pub data: PathBuf,
    /// Base checkpoint (.pkl, or a Needle 3 .safetensors) [default: the --generation's base model from the
    /// Hugging Face cache, downloaded if missing]
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// SentencePiece model [default: tokenizer.model beside the checkpoint, else the --generation's]
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The published base model used without --checkpoint (a given checkpoint's generation is read
    /// from the file): 3 (Cactus-Compute/needle3, as cactus-needle 3.x) or 2 (Cactus-Compute/needle2)
    #[arg(long, default_value = Generation::default().number().to_string())]
    #[serde(serialize_with = "as_number")]
    pub generation: Generation,
}

/// A generation as the command line names it: its number.
pub fn as_number<S: serde::Serializer>(generation: &Generation, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u8(generation.number())
}

impl ModelInputs {
    /// The checkpoint and tokenizer to use, fetched from the hub when not given.
    pub fn base_model(&self) -> anyhow::Result<BaseModel> {
        crate::download::base_model_of(self.generation, self.checkpoint.as_deref(), self.tokenizer.as_deref())
    }
}

/// The weights a command that answers prompts runs: a published base model or a given checkpoint, with an adapter,
/// or a built `.cact` (what ships).
#[derive(Debug, clap::Args, serde::Serialize)]
pub struct WeightsInputs {
    /// Base checkpoint (.pkl, or a Needle 3 .safetensors) [default: the --generation's base model from the
    /// Hugging Face cache, downloaded if missing]
    #[arg(long, conflicts_with = "weights")]
    pub checkpoint: Option<PathBuf>,
    /// LoRA adapter (.pkl or .safetensors) to merge into the checkpoint
    #[arg(long, conflicts_with = "weights")]
    pub lora: Option<PathBuf>,
    /// A built .cact to run instead, from its own codes as the Needle engine runs it (W4A8: its attention
    /// projections and output head multiplied from the CQ codes with 8-bit activations, on the CPU), with
    /// the tokenizer and the confidence head it carries
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// SentencePiece model [default: the .cact's own; else tokenizer.model beside the checkpoint, else the
    /// --generation's]
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The published base model used without --checkpoint or --weights: 3 (Cactus-Compute/needle3, as
    /// cactus-needle 3.x) or 2 (Cactus-Compute/needle2)
    #[arg(long, default_value = Generation::default().number().to_string(), conflicts_with = "weights")]
    #[serde(serialize_with = "as_number")]
    pub generation: Generation,
}

/// A network and the tokenizer that goes with it.
pub struct Model {
    pub network: needle_engine::model::Network,
    pub tokenizer: needle_engine::tokenizer::Tokenizer,
    /// The confidence head that reads every answer, when there is one: the trained head kept beside
    /// the adapter (`ADAPTER.head.safetensors`), or the head a `.cact` carries.
    pub head: Option<needle_engine::confidence::TurnHead>,
    /// What was loaded, for messages: the checkpoint (and adapter) or the `.cact`.
    pub label: String,
}

impl WeightsInputs {
    /// Loads the weights on `device`, and the tokenizer they need; checks the two belong together.
    /// A `.cact` runs as the Needle engine runs it, from its own codes ([`Precision::W4a8`], on
    /// the CPU); a checkpoint as stored.
    pub fn load(&self, device: &needle_engine::model::Device) -> anyhow::Result<Model> {
        let precision = if self.weights.is_some() { Precision::W4a8 } else { Precision::Float };
        self.load_as(device, precision)
    }

    /// [`WeightsInputs::load`], the weights run at `precision`.
    pub fn load_as(&self, device: &needle_engine::model::Device, precision: Precision) -> anyhow::Result<Model> {
        use needle_engine::calls::Weights;
        use needle_engine::tokenizer::Tokenizer;
        let (weights, tokenizer_path) = match &self.weights {
            Some(cact) => (Weights::Cact(cact.clone()), self.tokenizer.clone()),
            None => {
                let base = crate::download::base_model_of(
                    self.generation,
                    self.checkpoint.as_deref(),
                    self.tokenizer.as_deref(),
                )?;
                (Weights::Checkpoint { checkpoint: base.checkpoint, lora: self.lora.clone() }, Some(base.tokenizer))
            }
        };
        // Every error of the load names its file: the checkpoint, the adapter or the `.cact`.
        let loaded = weights.load_as(device, precision)?;
        let (tokenizer, tokenizer_label) = match (tokenizer_path, loaded.tokenizer) {
            (Some(path), _) => (Tokenizer::load(&path)?, path),
            (None, Some(carried)) => (carried, weights.path().to_path_buf()),
            (None, None) => anyhow::bail!("{} carries no tokenizer; pass --tokenizer", weights.path().display()),
        };
        loaded.network.check_tokenizer_vocab(tokenizer.vocab_size(), &tokenizer_label)?;
        let head = match &self.lora {
            Some(lora) => needle_engine::confidence::TurnHead::beside(lora, loaded.network.config())?,
            None => loaded.head,
        };
        let label = match (&weights, &self.lora) {
            (Weights::Checkpoint { checkpoint, .. }, Some(lora)) => {
                format!("{} + {}", checkpoint.display(), lora.display())
            }
            _ => weights.path().display().to_string(),
        };
        Ok(Model { network: loaded.network, tokenizer, head, label })
    }
}
