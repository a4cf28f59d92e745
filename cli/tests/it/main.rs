//! Integration tests of the `basin` binary: one test binary for the crate.

mod federation;
mod iceberg;
mod s3;
mod shell;
mod standalone;

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs `basin` with `args` and a private data directory.
pub fn basin(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let data = scratch_dir("data");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_basin"));
    cmd.args(args)
        .env_remove("BASIN_CONFIG")
        .env("BASIN_DATA_DIR", &data);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run basin");
    let _ = std::fs::remove_dir_all(&data);
    out
}

/// A fresh directory for one test.
pub fn scratch_dir(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "basin-cli-test-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// Whether a service-backed test must fail rather than skip when its service is missing.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}
