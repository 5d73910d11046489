//! `cargo +nightly fuzz run safetensors_adapter`: the body is shared with the regression replay (see ../bodies.rs).
#![no_main]

const REPO_ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
include!("../bodies.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = fuzz_safetensors_adapter(data);
});
