//! The `hspack` command.

mod cli;

fn main() -> std::process::ExitCode {
    // `hspack ls | head` closes stdout early; end quietly, as other Unix tools do.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
    // A shard cut short in place by another program while it is mapped kills the process
    // with SIGBUS: said first, naming the file.
    hspack::io::mmap::explain_write_faults();
    // Crash points for tests, set by the FAILPOINTS variable (feature `failpoints` only).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    cli::main()
}
