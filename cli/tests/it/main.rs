//! Integration tests of the `basin` binary: one test binary for the crate.

mod exchange;
mod federation;
mod iceberg;
mod liveness;
mod memory;
mod mongodb;
mod names;
mod oracle;
mod postgres_tls;
mod routes;
mod s3;
mod security;
mod shell;
mod standalone;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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
    cmd.run_within()
}

/// A fresh directory for one test, removed with everything in it when the value is dropped.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory for one test (see [`Scratch`]).
pub fn scratch_dir(name: &str) -> Scratch {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "basin-cli-test-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    Scratch(dir)
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

/// How long one command of a test may run (`BASIN_TEST_DEADLINE_SECS`, default 300 s) before
/// the test fails: a hang fails its test with what the process was doing instead of holding
/// the whole run until CI's own limit.
fn deadline() -> Duration {
    let secs = std::env::var("BASIN_TEST_DEADLINE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(secs)
}

pub trait RunWithin {
    /// Runs the command to its end like `Command::output` (stdin empty), failing the test if
    /// it outlives [`deadline`]: the process is killed and the failure shows its stderr, the
    /// end of Basin's log (info, in `BASIN_LOG_FILE`, which this sets unless the test did)
    /// and, where gdb is installed, its threads' stacks.
    fn run_within(&mut self) -> Output;
}

impl RunWithin for Command {
    fn run_within(&mut self) -> Output {
        let log_dir =
            (!self.get_envs().any(|(k, _)| k == "BASIN_LOG_FILE")).then(|| scratch_dir("log"));
        let log = log_dir.as_ref().map(|d| d.join("basin.log"));
        if let Some(log) = &log {
            self.env("BASIN_LOG_FILE", log);
        }
        let mut child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", self.get_program()));
        let drain = |mut pipe: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = pipe.read_to_end(&mut bytes);
                bytes
            })
        };
        let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
        let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
        let (limit, start) = (deadline(), Instant::now());
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for the command") {
                break status;
            }
            if start.elapsed() > limit {
                let stacks = stacks(child.id());
                let _ = child.kill();
                let _ = child.wait();
                let err = String::from_utf8_lossy(&err.join().unwrap_or_default()).to_string();
                let log = log
                    .as_ref()
                    .and_then(|l| std::fs::read_to_string(l).ok())
                    .unwrap_or_default();
                let log_tail: Vec<&str> = log.lines().rev().take(150).collect();
                let mut command = format!("{self:?}");
                command.truncate(600);
                panic!(
                    "{command}\ndid not finish within {limit:?} and was killed.\n\
                     --- stderr ---\n{err}\n--- the end of its log ---\n{}\n\
                     --- its threads ---\n{stacks}",
                    log_tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Output {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }
}

/// The threads' stacks of a running process, by gdb when it is installed.
fn stacks(pid: u32) -> String {
    let out = Command::new("timeout")
        .args(["60", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "set print frame-arguments none"])
        .args(["-ex", "thread apply all bt 24"])
        .stdin(Stdio::null())
        .output();
    match out {
        // One line per frame: its number and function, without addresses and sources.
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                if l.starts_with("Thread ") {
                    return Some(l.to_string());
                }
                let (frame, rest) = l.strip_prefix('#')?.split_once(' ')?;
                let function = rest.split_once(" in ").map_or(rest, |(_, f)| f);
                let function = function.split(" (").next().unwrap_or(function);
                Some(format!(
                    "  #{frame} {}",
                    function.chars().take(150).collect::<String>()
                ))
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Ok(o) => format!(
            "(gdb failed: {})",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("(no gdb: {e})"),
    }
}
