//! A real multi-process cluster for tests: `basin scheduler` and `basin executor` OS
//! processes on loopback, with their logs kept for assertions.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Finds the `basin` binary next to the test binary (target/<profile>/basin), or `$BASIN_BIN`.
pub fn basin_binary() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("BASIN_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/deps/sqllogictests-… → target/<profile>/basin
    let candidate = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("basin"))
        .ok_or("cannot locate the target directory")?;
    if candidate.exists() {
        Ok(candidate)
    } else {
        Err(format!(
            "{} not found: build it first with `cargo build -p basin-cli` or set BASIN_BIN",
            candidate.display()
        ))
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// Scheduler + executors as child processes; killed on drop.
pub struct ProcessCluster {
    pub scheduler_port: u16,
    pub dir: PathBuf,
    children: Vec<(String, Child)>,
    /// The REST API's bearer token (from the cluster secret).
    token: Option<String>,
    /// The cluster's secret: a front end of this cluster needs it.
    pub secret: String,
}

impl ProcessCluster {
    pub fn start(executors: usize, task_slots: usize) -> Result<Self, String> {
        let bin = basin_binary()?;
        let dir = std::env::temp_dir().join(format!("basin-sqltest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let scheduler_port = free_port()?;
        let mut cluster = Self {
            scheduler_port,
            dir: dir.clone(),
            children: vec![],
            token: None,
            secret: String::new(),
        };
        let spawn = |name: &str, args: &[String]| -> Result<Child, String> {
            let log = std::fs::File::create(dir.join(format!("{name}.log")))
                .map_err(|e| e.to_string())?;
            Command::new(&bin)
                .args(args)
                .env("BASIN_LOG", "info,basin::task=info")
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log)
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", bin.display()))
        };
        let data = dir.join("data").display().to_string();
        // Closed as a production cluster is (a secret of its own), with Ballista's REST API
        // on for its list of executors.
        let secret = format!("sql-tests-secret-{}-{scheduler_port}", std::process::id());
        let config = dir.join("basin.toml");
        std::fs::write(
            &config,
            format!("[cluster]\nsecret = \"{secret}\"\nrest_api = true\n"),
        )
        .map_err(|e| e.to_string())?;
        let config = config.display().to_string();
        cluster.secret = secret.clone();
        cluster.token = Some(
            basin_core::cluster::ClusterKey::new(&basin_core::Secret::new(secret.clone()))
                .rest_token(),
        );
        let child = spawn(
            "scheduler",
            &[
                "scheduler".into(),
                "--port".into(),
                scheduler_port.to_string(),
                // Any free port: the tests do not use Flight SQL, and 50060 may be taken.
                "--flight-sql-port".into(),
                "0".into(),
                "--data-dir".into(),
                data.clone(),
                "--config".into(),
                config.clone(),
            ],
        )?;
        cluster.children.push(("scheduler".into(), child));
        cluster.wait_for_port(scheduler_port, Duration::from_secs(30))?;
        for i in 0..executors {
            let name = format!("executor-{i}");
            let child = spawn(
                &name,
                &[
                    "executor".into(),
                    "--scheduler".into(),
                    format!("127.0.0.1:{scheduler_port}"),
                    "--task-slots".into(),
                    task_slots.to_string(),
                    "--data-dir".into(),
                    data.clone(),
                    "--config".into(),
                    config.clone(),
                ],
            )?;
            cluster.children.push((name, child));
        }
        cluster.wait_for_executors(executors, Duration::from_secs(60))?;
        Ok(cluster)
    }

    fn wait_for_port(&mut self, port: u16, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(());
            }
            self.check_alive()?;
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("nothing listens on port {port} after {timeout:?}"))
    }

    fn check_alive(&mut self) -> Result<(), String> {
        for (name, child) in &mut self.children {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(self.dir.join(format!("{name}.log")))
                    .unwrap_or_default();
                return Err(format!("{name} exited with {status}:\n{log}"));
            }
        }
        Ok(())
    }

    /// Polls the scheduler's REST API until `n` executors are registered.
    fn wait_for_executors(&mut self, n: usize, timeout: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let body = http_get(self.scheduler_port, "/api/executors", self.token.as_deref())
                .unwrap_or_default();
            let count = body.matches("\"id\"").count();
            if count >= n {
                return Ok(());
            }
            self.check_alive()?;
            if start.elapsed() > timeout {
                return Err(format!("only {count} of {n} executors registered: {body}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The log of one process.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Names of the executor processes.
    pub fn executor_names(&self) -> Vec<String> {
        self.children
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| n.starts_with("executor"))
            .collect()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.scheduler_port)
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::env::var_os("BASIN_KEEP_TEST_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A minimal HTTP/1.1 GET on loopback.
pub fn http_get(port: u16, path: &str, token: Option<&str>) -> Result<String, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| e.to_string())?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default())
}
