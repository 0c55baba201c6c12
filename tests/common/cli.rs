//! The built `hspack` binary, run as a user runs it.

use std::path::Path;
use std::process::{Command, Output};

/// Runs the built `hspack` with `args` in the test's working folder.
pub fn hspack(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hspack"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs the built `hspack` with `args` in `cwd`.
pub fn hspack_in(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hspack"))
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

/// What a run printed on stdout.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What a run printed on stderr.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// What a run printed: stdout, then stderr.
pub fn text(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}
