//! Bounded memory, through a Flight SQL client: a cluster whose executor may hold 64 MiB
//! spills the sorts and aggregates that need more, fails a hash join that needs more with
//! an error naming the limit and the setting, and serves the next query.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Scratch, basin, scratch_dir, stderr, stdout};

/// A running `basin standalone` and its data directory, removed once it is stopped.
struct Server {
    child: Child,
    data: Scratch,
    url: String,
}

impl Server {
    /// What the server logged so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.data.join("basin.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `basin standalone` with one executor of two task slots and `toml` as its configuration.
fn start(toml: &str) -> Server {
    let data = scratch_dir("memory");
    let config = data.join("basin.toml");
    std::fs::write(&config, toml).expect("write basin.toml");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_basin"))
        .args(["standalone", "--executors", "1", "--task-slots", "2"])
        .args(["--flight-sql-port", &port.to_string()])
        .arg("--config")
        .arg(&config)
        .env("BASIN_DATA_DIR", data.join("data"))
        .env("BASIN_LOG_FILE", data.join("basin.log"))
        .env_remove("BASIN_EXECUTOR_MEMORY_LIMIT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start basin standalone");
    let server = Server {
        child,
        data,
        url: format!("grpc://127.0.0.1:{port}"),
    };
    let begun = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            begun.elapsed() < Duration::from_secs(60),
            "basin standalone did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

/// Runs `sql` with `basin sql` (Flight SQL); its stdout, or its error.
fn query(server: &Server, sql: &str) -> Result<String, String> {
    let out = basin(&["sql", &server.url, "--format", "csv", "-e", sql], &[]);
    if out.status.success() {
        Ok(stdout(&out))
    } else {
        Err(stderr(&out))
    }
}

/// The `spill_count` values an `EXPLAIN ANALYZE` shows on its lines that mention `operator`.
fn spills(plan: &str, operator: &str) -> Vec<u64> {
    plan.lines()
        .filter(|l| l.contains(operator))
        .filter_map(|l| l.split("spill_count=").nth(1))
        .filter_map(|v| v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .collect()
}

#[test]
fn a_small_memory_limit_spills_what_can_spill_and_fails_the_rest_plainly() {
    let server = start("[executor]\nmemory_limit = \"64MiB\"\nquery_memory_fraction = 0.5\n");

    // A grouped aggregate and a sort over more than the executor's 64 MiB (a Ballista job
    // under EXPLAIN ANALYZE): both spill and finish.
    let plan = query(
        &server,
        "EXPLAIN ANALYZE SELECT count(*) FROM \
         (SELECT l_comment, count(*) FROM tpch.sf0_1.lineitem GROUP BY l_comment)",
    )
    .unwrap_or_else(|e| panic!("the aggregate should spill and finish: {e}"));
    let aggregate = spills(&plan, "AggregateExec: mode=FinalPartitioned");
    assert!(aggregate.iter().any(|n| *n > 0), "{plan}");
    let plan = query(
        &server,
        "EXPLAIN ANALYZE SELECT count(*), max(r) FROM (SELECT row_number() OVER \
         (ORDER BY l_comment, l_orderkey) AS r FROM tpch.sf0_1.lineitem)",
    )
    .unwrap_or_else(|e| panic!("the sort should spill and finish: {e}"));
    assert!(spills(&plan, "SortExec").iter().any(|n| *n > 0), "{plan}");
    assert!(plan.contains("output_rows=600.6 K"), "{plan}");

    // The same sort planned whole for the executor (its scans' estimate fits a query's
    // share) fails there, its sorts unable to hold a batch beside the 10 MiB each reserves
    // for merging: it runs again as a Ballista job, and finishes.
    let sorted = query(
        &server,
        "SELECT count(*) AS n, max(r) AS r FROM (SELECT row_number() OVER \
         (ORDER BY l_comment, l_orderkey) AS r FROM tpch.sf0_1.lineitem)",
    )
    .unwrap_or_else(|e| panic!("the sort should finish as a Ballista job: {e}"));
    assert_eq!(sorted, "n,r\n600572,600572\n");
    let log = server.log();
    assert!(log.contains("running it as a Ballista job"), "{log}");

    // A hash join whose build side needs more than a query's 32 MiB cannot spill: it fails,
    // naming the executor's limit and the setting to raise, in one piece.
    let err = query(
        &server,
        "SET datafusion.optimizer.prefer_hash_join = true; \
         SET datafusion.execution.target_partitions = 1; \
         SELECT count(*) FROM tpch.sf0_1.lineitem a JOIN tpch.sf0_1.lineitem b \
         ON a.l_comment = b.l_comment AND a.l_shipinstruct = b.l_shipinstruct \
         AND a.l_shipmode = b.l_shipmode",
    )
    .expect_err("the hash join needs more than the limit");
    assert!(
        err.contains("query needs more memory than executor")
            && err.contains("32.0 MiB per query (0.5 of its memory_limit of 64.0 MiB)")
            && err.contains("set [executor] memory_limit higher")
            && err.contains("HashJoinInput"),
        "{err}"
    );
    assert!(
        !err.contains("\\n") && !err.contains("\\\""),
        "escaped: {err}"
    );

    // The executor goes on serving.
    let after = query(&server, "SELECT count(*) AS n FROM tpch.tiny.nation")
        .unwrap_or_else(|e| panic!("the next query failed: {e}"));
    assert_eq!(after, "n\n25\n");
}

#[test]
fn the_memory_limit_flag_overrides_the_configuration() {
    let out = basin(
        &[
            "standalone",
            "--executors",
            "1",
            "--memory-limit",
            "lots",
            "-e",
            "SELECT 1",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("`lots` is not a size"),
        "{}",
        stderr(&out)
    );

    let log = [("BASIN_LOG", "basin_executor=info")];
    let out = basin(
        &[
            "standalone",
            "--executors",
            "2",
            "--memory-limit",
            "96MiB",
            "-e",
            "SELECT 1",
        ],
        &log,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let starts: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("Basin executor starting"))
        .collect();
    assert_eq!(starts.len(), 2, "{err}");
    for line in starts {
        assert!(
            line.contains("memory_limit=96.0 MiB") && line.contains("query_memory=48.0 MiB"),
            "{line}"
        );
    }
}
