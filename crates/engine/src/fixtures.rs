//! The committed fixtures (`tests/fixtures`) the unit tests read.

use std::path::{Path, PathBuf};

pub fn fixture(relative: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(relative)
}

/// The checkpoint `models/<stem>`: a Needle 3 safetensors file where there is one, else a pickle.
pub fn checkpoint_path(stem: &str) -> PathBuf {
    let needle3 = fixture(&format!("models/{stem}.safetensors"));
    if needle3.exists() {
        needle3
    } else {
        fixture(&format!("models/{stem}.pkl"))
    }
}
