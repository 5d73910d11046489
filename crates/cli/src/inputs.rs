//! The inputs every model-running command takes: a dataset, a base checkpoint and its tokenizer.

use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ModelInputs {
    /// Dataset (.jsonl) in the reference's tool-call format
    pub data: PathBuf,
    /// Base checkpoint (.pkl)
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// SentencePiece model [default: tokenizer.model beside the checkpoint]
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

impl ModelInputs {
    /// The tokenizer given, or the one beside the checkpoint.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.tokenizer.clone().unwrap_or_else(|| needle_engine::tokenizer::default_path(&self.checkpoint))
    }
}
