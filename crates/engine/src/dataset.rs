//! CONTRACT placeholder: JSONL → examples → token ids + loss mask.
