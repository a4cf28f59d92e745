//! A cluster of processes that loses an executor: `basin scheduler` and two `basin executor`
//! processes on loopback, queried with `basin sql` over Flight SQL. One executor is killed
//! with SIGKILL (as the kernel's OOM killer does) between queries and during one, then
//! started again: the queries after the loss run on the survivor, a query running on the
//! lost executor moves when it had sent no row and fails naming the executor when it had,
//! and the restarted executor takes work again.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use basin_core::Secret;
use basin_core::cluster::ClusterKey;

use crate::{RunWithin, Scratch, scratch_dir, stderr, stdout};

/// Small queries run whole on one executor up to this many bytes (by the scans' estimates):
/// joins of `tpch.tiny` tables do, a GROUP BY over `tpch.sf0_1.lineitem` does not, and
/// runs as a Ballista job (streamed exchanges off: `exchange.rs` tests those).
const CONFIG: &str = "[server]\nsingle_node_max_bytes = 10000000\nstreamed_exchanges = false\n";

/// A join and GROUP BY over `tpch.tiny`: whole on one executor.
const ONE_EXECUTOR: &str = "SELECT n_name, count(*) AS suppliers FROM tpch.tiny.supplier \
     JOIN tpch.tiny.nation ON s_nationkey = n_nationkey GROUP BY n_name \
     ORDER BY suppliers DESC, n_name LIMIT 3";
const ONE_EXECUTOR_ROWS: &str = "n_name,suppliers\nUNITED STATES,8\nCHINA,7\nMOZAMBIQUE,7\n";

/// A filtered scan with an ungrouped aggregate: a stage streamed from both executors.
const STREAMED: &str = "SELECT count(*) AS n FROM tpch.tiny.lineitem WHERE l_quantity > 10";
const STREAMED_ROWS: &str = "n\n48177\n";

/// A GROUP BY over more than `single_node_max_bytes`: a Ballista job.
const JOB: &str = "SELECT l_returnflag, count(*) AS n FROM tpch.sf0_1.lineitem \
     GROUP BY l_returnflag ORDER BY l_returnflag";
const JOB_ROWS: &str = "l_returnflag,n\nA,147790\nN,304481\nR,148301\n";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The scheduler and the executors, killed when dropped.
pub(crate) struct Cluster {
    dir: Scratch,
    /// The REST API's bearer token (from the cluster secret).
    token: Option<String>,
    scheduler_port: u16,
    flight_sql_port: u16,
    /// Flight port of each executor (kept when it is started again).
    pub(crate) executor_ports: Vec<u16>,
    processes: Vec<(String, Child)>,
}

impl Cluster {
    fn start(executors: usize) -> Self {
        Self::start_with(executors, CONFIG)
    }

    /// A cluster of `executors` executors whose `basin.toml` is `config`, closed with a
    /// cluster secret of its own (a `[cluster]` section in `config` replaces it) and with
    /// Ballista's REST API on, for its list of executors.
    pub(crate) fn start_with(executors: usize, config: &str) -> Self {
        let dir = scratch_dir("cluster");
        let secret = format!("test-cluster-secret-{}", std::process::id());
        let config = if config.contains("[cluster]") {
            config.to_string()
        } else {
            format!("{config}\n[cluster]\nsecret = \"{secret}\"\nrest_api = true\n")
        };
        std::fs::write(dir.join("basin.toml"), &config).expect("write basin.toml");
        let token = config
            .lines()
            .find_map(|l| l.trim().strip_prefix("secret = "))
            .map(|s| ClusterKey::new(&Secret::new(s.trim_matches('"'))))
            .map(|key| key.rest_token());
        let mut cluster = Self {
            token,
            dir,
            scheduler_port: free_port(),
            flight_sql_port: free_port(),
            executor_ports: (0..executors).map(|_| free_port()).collect(),
            processes: vec![],
        };
        let args = [
            "scheduler".to_string(),
            "--port".into(),
            cluster.scheduler_port.to_string(),
            "--flight-sql-port".into(),
            cluster.flight_sql_port.to_string(),
        ];
        cluster.spawn("scheduler", &args);
        cluster.wait_for_port(cluster.flight_sql_port);
        for i in 0..executors {
            cluster.start_executor(i, &format!("executor-{i}"));
        }
        cluster.wait_for_executors(executors, Duration::from_secs(60));
        cluster
    }

    fn spawn(&mut self, name: &str, args: &[String]) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).expect("log file");
        let config = self.dir.join("basin.toml");
        let child = Command::new(env!("CARGO_BIN_EXE_basin"))
            .args(args)
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .env_remove("BASIN_CONFIG")
            .env("BASIN_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        self.processes.push((name.to_string(), child));
    }

    /// Starts executor `i` on its Flight port, logging to `<name>.log`.
    fn start_executor(&mut self, i: usize, name: &str) {
        let args = [
            "executor".to_string(),
            "--scheduler".into(),
            format!("127.0.0.1:{}", self.scheduler_port),
            "--flight-port".into(),
            self.executor_ports[i].to_string(),
            "--task-slots".into(),
            "2".into(),
        ];
        self.spawn(name, &args);
    }

    /// Kills process `name` with SIGKILL.
    pub(crate) fn kill(&mut self, name: &str) {
        let at = self
            .processes
            .iter()
            .position(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no process {name}"));
        let (_, mut child) = self.processes.remove(at);
        child.kill().expect("kill");
        child.wait().expect("wait");
    }

    fn wait_for_port(&mut self, port: u16) {
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            self.check_alive();
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "nothing listens on {port}:\n{}",
                self.log("scheduler")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn check_alive(&mut self) {
        for (name, child) in &mut self.processes {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(self.dir.join(format!("{name}.log")));
                panic!("{name} exited with {status}:\n{}", log.unwrap_or_default());
            }
        }
    }

    /// Executors registered with the scheduler (its REST API).
    fn registered(&self) -> usize {
        http_get(self.scheduler_port, "/api/executors", self.token.as_deref())
            .unwrap_or_default()
            .matches("\"id\"")
            .count()
    }

    /// Starts again, on a new port, an executor that lost the race for its Flight port
    /// (another process bound it between `free_port()` and the executor's start; seen in CI).
    fn restart_port_races(&mut self) {
        let dir = &self.dir;
        let lost: Vec<String> = self
            .processes
            .iter_mut()
            .filter_map(|(name, child)| {
                let lost = name.starts_with("executor-")
                    && matches!(child.try_wait(), Ok(Some(_)))
                    && std::fs::read_to_string(dir.join(format!("{name}.log")))
                        .is_ok_and(|log| log.contains("Address already in use"));
                lost.then(|| name.clone())
            })
            .collect();
        for name in lost {
            let Some(i) = name
                .strip_prefix("executor-")
                .and_then(|i| i.parse::<usize>().ok())
            else {
                continue;
            };
            self.processes.retain(|(n, _)| n != &name);
            self.executor_ports[i] = free_port();
            self.start_executor(i, &name);
        }
    }

    /// Waits until `n` executors are registered; returns how long it took.
    fn wait_for_executors(&mut self, n: usize, timeout: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let registered = self.registered();
            if registered == n {
                return start.elapsed();
            }
            self.restart_port_races();
            self.check_alive();
            assert!(
                start.elapsed() < timeout,
                "{registered} executors registered, not {n}, after {timeout:?}:\n{}",
                self.log("scheduler")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The processes' `--data-dir`.
    pub(crate) fn data_dir(&self) -> std::path::PathBuf {
        self.dir.join("data")
    }

    pub(crate) fn flight_sql_port(&self) -> u16 {
        self.flight_sql_port
    }

    pub(crate) fn scheduler_port(&self) -> u16 {
        self.scheduler_port
    }

    pub(crate) fn url(&self) -> String {
        format!("grpc://127.0.0.1:{}", self.flight_sql_port)
    }

    /// Runs `sql` with `basin sql`, results as CSV.
    pub(crate) fn sql(&self, sql: &str) -> Output {
        Command::new(env!("CARGO_BIN_EXE_basin"))
            .args(["sql", &self.url(), "--format", "csv", "-e", sql])
            .run_within()
    }

    /// Runs `sql` as `user` (password from BASIN_PASSWORD), results as CSV.
    pub(crate) fn sql_as(&self, user: &str, password: &str, sql: &str) -> Output {
        Command::new(env!("CARGO_BIN_EXE_basin"))
            .args(["sql", &self.url(), "-u", user, "--format", "csv", "-e", sql])
            .env("BASIN_PASSWORD", password)
            .run_within()
    }

    /// Runs `sql`, which must return `expected`, and says how long it took.
    pub(crate) fn expect(&self, sql: &str, expected: &str) -> Duration {
        let start = Instant::now();
        let out = self.sql(sql);
        let took = start.elapsed();
        assert!(
            out.status.success(),
            "{sql}\nfailed after {took:?}: {}\n--- scheduler ---\n{}",
            stderr(&out),
            self.log_tail("scheduler")
        );
        assert_eq!(stdout(&out), expected, "{sql}");
        took
    }

    pub(crate) fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    pub(crate) fn log_tail(&self, name: &str) -> String {
        let log = self.log(name);
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// The job directories (shuffle files) in the executors' work directories.
    pub(crate) fn job_dirs(&self) -> Vec<std::path::PathBuf> {
        let executors = self.dir.join("data").join("executor");
        let mut dirs = vec![];
        for work in std::fs::read_dir(executors).into_iter().flatten().flatten() {
            for entry in std::fs::read_dir(work.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = entry.file_name().to_string_lossy().to_string();
                // DataFusion's spill directory is not a job's.
                if entry.path().is_dir() && !name.starts_with("datafusion-") {
                    dirs.push(entry.path());
                }
            }
        }
        dirs
    }

    /// How many lines of `name`'s log contain `what`.
    pub(crate) fn count(&self, name: &str, what: &str) -> usize {
        self.log(name).lines().filter(|l| l.contains(what)).count()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, child) in &mut self.processes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A minimal HTTP/1.1 GET on loopback.
fn http_get(port: u16, path: &str, token: Option<&str>) -> Option<String> {
    http_response(port, path, token).map(|(_, body)| body)
}

/// The status code and body of a GET of `path`.
pub(crate) fn http_status(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let (head, body) = http_response(port, path, token).expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body)
}

fn http_response(port: u16, path: &str, token: Option<&str>) -> Option<(String, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response
        .split_once("\r\n\r\n")
        .map(|(h, b)| (h.to_string(), b.to_string()))
}

/// Task and stage lines of an executor's log.
const STREAMED_PARTITION: &str = "streaming a stage partition";
const JOB_TASK: &str = "task finished";

/// Ballista removes a job's shuffle files an hour after the job ends (a client may still be
/// reading its last stage); the end of the result stream removes them at once, or a workload
/// of large queries fills the disk first.
#[test]
fn a_jobs_shuffle_files_go_once_its_client_has_read_the_result() {
    let cluster = Cluster::start(2);
    cluster.expect(JOB, JOB_ROWS);
    let tasks: usize = ["executor-0", "executor-1"]
        .iter()
        .map(|e| cluster.count(e, "task finished"))
        .sum();
    assert!(tasks > 0, "the query ran no Ballista task");
    let start = Instant::now();
    loop {
        let left = cluster.job_dirs();
        if left.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "shuffle files left 15 s after the client read the result: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_executor_killed_between_queries_is_passed_over_and_used_again_once_restarted() {
    let mut cluster = Cluster::start(2);
    // Both executors warm (the streamed stage runs on both); the small query goes to one of
    // them and stays there while it is warm: kill that one.
    cluster.expect(STREAMED, STREAMED_ROWS);
    let streamed = |c: &Cluster, e: &str| c.count(e, STREAMED_PARTITION);
    let before = [
        streamed(&cluster, "executor-0"),
        streamed(&cluster, "executor-1"),
    ];
    cluster.expect(ONE_EXECUTOR, ONE_EXECUTOR_ROWS);
    let warm = ["executor-0", "executor-1"]
        .into_iter()
        .zip(before)
        .find(|(e, before)| streamed(&cluster, e) > *before)
        .map(|(e, _)| e)
        .expect("an executor ran the small query");
    let survivor = if warm == "executor-0" {
        "executor-1"
    } else {
        "executor-0"
    };
    cluster.kill(warm);
    // Meanwhile: how soon the scheduler forgets the killed executor.
    let port = cluster.scheduler_port;
    let token = cluster.token.clone();
    let forgotten = std::thread::spawn(move || {
        let lost = Instant::now();
        while lost.elapsed() < Duration::from_secs(60) {
            let registered = http_get(port, "/api/executors", token.as_deref()).unwrap_or_default();
            if registered.matches("\"id\"").count() == 1 {
                return Some(lost.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    });

    // At once: none of these is placed on the dead executor.
    for (sql, rows) in [
        (ONE_EXECUTOR, ONE_EXECUTOR_ROWS),
        (STREAMED, STREAMED_ROWS),
        (JOB, JOB_ROWS),
        (ONE_EXECUTOR, ONE_EXECUTOR_ROWS),
    ] {
        let took = cluster.expect(sql, rows);
        assert!(took < Duration::from_secs(30), "{sql} took {took:?}");
        eprintln!("after the kill: {took:?} for {sql}");
    }
    assert!(
        cluster.count(survivor, JOB_TASK) > 0,
        "the Ballista job ran on {survivor}"
    );
    // The scheduler's view converged within seconds (Ballista's heartbeats alone: 60 s).
    let forgotten = forgotten.join().expect("poll the scheduler");
    eprintln!("the scheduler forgot the killed executor after {forgotten:?}");
    assert!(
        forgotten.is_some_and(|t| t < Duration::from_secs(10)),
        "{forgotten:?}"
    );

    // Started again (on its old port, a new executor id), it takes work again.
    let i = if warm == "executor-0" { 0 } else { 1 };
    cluster.start_executor(i, "restarted");
    cluster.wait_for_executors(2, Duration::from_secs(60));
    for _ in 0..5 {
        cluster.expect(STREAMED, STREAMED_ROWS);
        if cluster.count("restarted", STREAMED_PARTITION) > 0 {
            break;
        }
    }
    assert!(
        cluster.count("restarted", STREAMED_PARTITION) > 0,
        "the restarted executor streamed no partition:\n{}",
        cluster.log_tail("scheduler")
    );
    cluster.expect(JOB, JOB_ROWS);
    assert!(cluster.count("restarted", JOB_TASK) > 0);
}

/// Runs `sql` in the background: returns the process and a thread counting the lines of
/// its output (which is dropped).
pub(crate) fn start_query(cluster: &Cluster, sql: &str) -> (Child, std::thread::JoinHandle<usize>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_basin"))
        .args(["sql", &cluster.url(), "--format", "csv", "-e", sql])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start basin sql");
    let mut out = child.stdout.take().expect("piped stdout");
    let lines = std::thread::spawn(move || {
        let (mut buffer, mut lines) = (vec![0u8; 1 << 16], 0);
        while let Ok(n) = out.read(&mut buffer) {
            if n == 0 {
                break;
            }
            lines += buffer[..n].iter().filter(|b| **b == b'\n').count();
        }
        lines
    });
    (child, lines)
}

/// Waits for `child` to end, at most `limit`; returns its stderr and whether it succeeded.
pub(crate) fn finish(mut child: Child, limit: Duration) -> (bool, String) {
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the query did not end within {limit:?} of the kill");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut err);
    }
    (status.success(), err)
}

/// Waits until `cluster`'s executor `name` logs a streamed partition more than `before`.
fn wait_for_partition(cluster: &Cluster, name: &str, before: usize) {
    let start = Instant::now();
    while cluster.count(name, STREAMED_PARTITION) <= before {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{name} streamed no partition"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_executor_killed_during_a_query_moves_it_or_fails_it_naming_the_executor() {
    let mut cluster = Cluster::start(2);
    let port = |i: usize| format!("127.0.0.1:{}", cluster.executor_ports[i]);
    let (port0, port1) = (port(0), port(1));

    // An aggregate sends no row before its partitions end: the lost executor's partitions
    // run again on the other one, and the answer is whole.
    let count = "SELECT count(*) AS n, sum(l_linenumber) AS s FROM tpch.sf1.lineitem";
    let before = cluster.count("executor-0", STREAMED_PARTITION);
    let (query, _) = start_query(&cluster, count);
    wait_for_partition(&cluster, "executor-0", before);
    std::thread::sleep(Duration::from_millis(300));
    cluster.kill("executor-0");
    let (ok, err) = finish(query, Duration::from_secs(60));
    assert!(
        ok,
        "{err}\n--- scheduler ---\n{}",
        cluster.log_tail("scheduler")
    );
    cluster.expect(count, "n,s\n6001215,18007100\n");
    assert!(
        cluster.log("scheduler").contains("running it on another"),
        "{}",
        cluster.log_tail("scheduler")
    );

    // Rows already on their way: the query fails within 30 s naming the executor (or, when
    // the lost executor's partitions had sent nothing yet, completes with every row once).
    cluster.start_executor(0, "restarted");
    cluster.wait_for_executors(2, Duration::from_secs(60));
    let rows = "SELECT l_orderkey, l_linenumber FROM tpch.sf1.lineitem";
    let before = cluster.count("executor-1", STREAMED_PARTITION);
    let (query, lines) = start_query(&cluster, rows);
    wait_for_partition(&cluster, "executor-1", before);
    // Its partitions have sent rows by then (a batch takes milliseconds), which the
    // scheduler passed on to the client (`basin sql` prints them only at the end).
    std::thread::sleep(Duration::from_secs(1));
    cluster.kill("executor-1");
    let killed = Instant::now();
    let (ok, err) = finish(query, Duration::from_secs(120));
    let took = killed.elapsed();
    if ok {
        let lines = lines.join().expect("count the rows");
        assert_eq!(lines, 6_001_215 + 1, "every row once");
        eprintln!("the query lost no row: it moved, {took:?} after the kill");
    } else {
        eprintln!("the query failed {took:?} after the kill: {err}");
        assert!(
            took < Duration::from_secs(30),
            "failed after {took:?}: {err}"
        );
        assert!(err.contains(&port1), "the error names {port1}: {err}");
        assert!(!err.contains(&port0), "{err}");
    }
    // The cluster keeps serving.
    cluster.expect(ONE_EXECUTOR, ONE_EXECUTOR_ROWS);
    cluster.expect(STREAMED, STREAMED_ROWS);
    cluster.expect(JOB, JOB_ROWS);
}
