//! CONTRACT placeholder: a safe pickle reader (no code execution).
#[derive(Debug, thiserror::Error)]
#[error("pickle error")]
pub struct PickleError;
