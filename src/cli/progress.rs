//! Progress bars on stderr, hidden when stderr is not a terminal or output is JSON.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte-counting bar with rate and ETA.
pub fn bytes_bar(total: u64, message: &str, hidden: bool) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if hidden {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    bar.set_message(message.to_string());
    bar
}
