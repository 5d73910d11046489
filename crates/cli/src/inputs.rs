//! The inputs every model-running command takes: a dataset, a base checkpoint and its tokenizer.

use std::path::PathBuf;

use needle_engine::hub::BaseModel;

#[derive(Debug, clap::Args)]
pub struct ModelInputs {
    /// Dataset (.jsonl) in the reference's tool-call format
    pub data: PathBuf,
    /// Base checkpoint (.pkl) [default: Needle 2 from the Hugging Face cache, downloaded if missing]
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// SentencePiece model [default: tokenizer.model beside the checkpoint, else Needle 2's]
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

impl ModelInputs {
    /// The checkpoint and tokenizer to use, fetched from the hub when not given.
    pub fn base_model(&self) -> anyhow::Result<BaseModel> {
        crate::download::base_model(self.checkpoint.as_deref(), self.tokenizer.as_deref())
    }
}
