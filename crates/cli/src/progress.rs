//! The progress bar the long commands show on a terminal (indicatif draws nothing when stderr is not
//! one), set up once: indented like every line the CLI notes, a 30-wide bar, then what it counts.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps; `counts` is the rest of its indicatif template (`{pos}/{len} steps  eta {eta}`).
pub(crate) fn bar(len: u64, counts: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let style = ProgressStyle::with_template(&format!("  {{bar:30}} {counts}"))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}
