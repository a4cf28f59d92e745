//! `basin standalone` end to end: results, formats, configuration errors, bad SQL.

use crate::{Scratch, basin, scratch_dir, stderr, stdout};

/// A scratch folder holding a `basin.toml` with `toml`; returns the folder and the file.
fn config_file(name: &str, toml: &str) -> (Scratch, String) {
    let dir = scratch_dir(name);
    let file = dir.join("basin.toml");
    std::fs::write(&file, toml).unwrap();
    let file = file.to_str().unwrap().to_string();
    (dir, file)
}

#[test]
fn counts_tiny_lineitem() {
    let out = basin(
        &[
            "standalone",
            "-e",
            "SELECT count(*) FROM tpch.tiny.lineitem",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("| 60175    |"), "{}", stdout(&out));
}

#[test]
fn csv_and_json_formats_and_several_statements() {
    let sql = "SELECT n_nationkey, n_name FROM tpch.tiny.nation ORDER BY 1 LIMIT 2";
    let out = basin(&["standalone", "--format", "csv", "-e", sql], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "n_nationkey,n_name\n0,ALGERIA\n1,ARGENTINA\n");

    let out = basin(
        &[
            "standalone",
            "--executors",
            "1",
            "--format",
            "json",
            "-e",
            sql,
            "-e",
            "SELECT 1 AS one",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "{\"n_nationkey\":0,\"n_name\":\"ALGERIA\"}\n{\"n_nationkey\":1,\"n_name\":\"ARGENTINA\"}\n{\"one\":1}\n"
    );
}

#[test]
fn runs_a_file_of_statements() {
    let dir = scratch_dir("sqlfile");
    let file = dir.join("q.sql");
    std::fs::write(
        &file,
        "CREATE TABLE t AS VALUES (1), (2), (3);\n-- a comment\nSELECT sum(column1) AS s FROM t;\n",
    )
    .unwrap();
    let out = basin(
        &[
            "standalone",
            "--format",
            "csv",
            "-f",
            file.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "s\n6\n");
}

#[test]
fn unknown_table_is_a_one_line_error() {
    let out = basin(&["standalone", "-e", "SELECT * FROM tpch.tiny.nope"], &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains("nope"), "{err}");
}

#[test]
fn one_stage_queries_stream_and_their_errors_read_plainly() {
    // An ungrouped aggregate and a filtered scan: one stage, streamed from the executors.
    let sql = "SELECT count(*) AS n, sum(l_quantity) AS q FROM tpch.tiny.lineitem \
               WHERE l_shipmode = 'AIR'";
    let log = [("BASIN_LOG", "basin_executor=info")];
    let out = basin(&["standalone", "--format", "csv", "-e", sql], &log);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("streaming a stage partition"),
        "{}",
        stderr(&out)
    );
    let streamed = stdout(&out);

    // The same query as a Ballista job gives the same answer.
    let (dir, config) = config_file("nostream", "[server]\nstreamed_stages = false\n");
    let config = config.as_str();
    let out = basin(
        &[
            "standalone",
            "--config",
            config,
            "--format",
            "csv",
            "-e",
            sql,
        ],
        &log,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("streaming a stage partition"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), streamed);

    // An error on an executor reaches the client as the executor said it.
    let out = basin(
        &[
            "standalone",
            "-e",
            "SELECT 1 / (l_linenumber - l_linenumber) FROM tpch.tiny.lineitem",
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    let error: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(error.len(), 1, "{err}");
    assert!(error[0].contains("Divide by zero"), "{err}");
    assert!(!error[0].contains("stream-"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn small_queries_run_whole_on_one_executor() {
    // A join, GROUP BY and ORDER BY over tpch.tiny: small by the scans' own estimate, so it
    // runs as one task on one executor and streams back, not as a multi-stage Ballista job.
    let sql = "SELECT n_name, count(*) AS suppliers, sum(s_acctbal) AS balance \
               FROM tpch.tiny.supplier JOIN tpch.tiny.nation ON s_nationkey = n_nationkey \
               GROUP BY n_name ORDER BY suppliers DESC, n_name LIMIT 5";
    let log = [("BASIN_LOG", "basin_executor=info")];
    let out = basin(&["standalone", "--format", "csv", "-e", sql], &log);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let streamed: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("streaming a stage partition"))
        .collect();
    assert_eq!(streamed.len(), 1, "one task for the whole query: {err}");
    assert!(streamed[0].contains("partition=0"), "{err}");
    let one_node = stdout(&out);
    assert_eq!(one_node.lines().count(), 6, "{one_node}");

    // EXPLAIN shows the plan that runs: the whole query under one streamed stage.
    let out = basin(&["standalone", "-e", &format!("EXPLAIN {sql}")], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan = stdout(&out);
    assert!(
        plan.contains("StreamedStageExec: partitions=1, executors=1"),
        "{plan}"
    );
    assert!(plan.contains("HashJoinExec"), "{plan}");
    assert!(plan.contains("logical_plan"), "{plan}");
    assert!(!plan.contains("ResolvedStage"), "{plan}");

    // Above the limit the same query is a Ballista job over both executors, same answer
    // (with streamed exchanges off; `exchange.rs` tests those).
    let (dir, config) = config_file(
        "onenode",
        "[server]\nsingle_node_max_bytes = 1\nstreamed_exchanges = false\n",
    );
    let config = config.as_str();
    let out = basin(
        &[
            "standalone",
            "--config",
            config,
            "--format",
            "csv",
            "-e",
            sql,
        ],
        &log,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("streaming a stage partition"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), one_node);
    let out = basin(
        &[
            "standalone",
            "--config",
            config,
            "-e",
            &format!("EXPLAIN {sql}"),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("ResolvedStage"), "{}", stdout(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn syntax_error_exits_non_zero() {
    let out = basin(&["standalone", "-e", "SELEC 1"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("error: "), "{}", stderr(&out));
}

#[test]
fn malformed_config_names_file_line_and_key() {
    let dir = scratch_dir("badconfig");
    let file = dir.join("basin.toml");
    std::fs::write(
        &file,
        "[catalogs.gen]\nconnector = \"tpch\"\nbogus_key = 1\n",
    )
    .unwrap();
    let out = basin(
        &[
            "standalone",
            "--config",
            file.to_str().unwrap(),
            "-e",
            "SELECT 1",
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains(file.to_str().unwrap()), "{err}");
    assert!(err.contains("bogus_key"), "{err}");
    assert!(err.contains("line 3"), "{err}");
    assert!(err.contains("catalog `gen`"), "{err}");

    std::fs::write(&file, "[catalogs.gen\nconnector = \"tpch\"\n").unwrap();
    let out = basin(
        &[
            "standalone",
            "--config",
            file.to_str().unwrap(),
            "-e",
            "SELECT 1",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("line 1"), "{}", stderr(&out));

    let out = basin(
        &[
            "standalone",
            "--config",
            "/nonexistent/basin.toml",
            "-e",
            "SELECT 1",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/nonexistent/basin.toml"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn configured_catalog_and_missing_env_var() {
    let dir = scratch_dir("config");
    let file = dir.join("basin.toml");
    std::fs::write(
        &file,
        "[catalogs.gen]\nconnector = \"tpch\"\nrows_per_partition = 1000\n",
    )
    .unwrap();
    let out = basin(
        &[
            "standalone",
            "--config",
            file.to_str().unwrap(),
            "--format",
            "csv",
            "-e",
            "SELECT count(*) AS n FROM gen.tiny.orders",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "n\n15000\n");

    std::fs::write(
        &file,
        "[storage.s3]\nsecret_access_key = \"${env:BASIN_TEST_DEFINITELY_UNSET}\"\n",
    )
    .unwrap();
    let out = basin(
        &[
            "standalone",
            "--config",
            file.to_str().unwrap(),
            "-e",
            "SELECT 1",
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("BASIN_TEST_DEFINITELY_UNSET"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn secrets_stay_out_of_errors_and_plans() {
    let dir = scratch_dir("secret");
    let file = dir.join("basin.toml");
    std::fs::write(
        &file,
        "[storage.s3]\nendpoint = \"http://127.0.0.1:9\"\naccess_key_id = \"basin\"\n\
         secret_access_key = \"${env:BASIN_TEST_SECRET}\"\npath_style = true\n",
    )
    .unwrap();
    let secret = "very-secret-value-4711";
    let out = basin(
        &[
            "standalone",
            "--config",
            file.to_str().unwrap(),
            "-e",
            "SELECT * FROM read_parquet('s3://nobucket/x.parquet')",
        ],
        &[("BASIN_TEST_SECRET", secret), ("BASIN_LOG", "debug")],
    );
    assert!(!out.status.success());
    let all = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!all.contains(secret), "secret leaked: {all}");
    assert!(all.contains("nobucket"), "{all}");
}

#[test]
fn explain_shows_the_distributed_plan() {
    // A query that runs as a Ballista job (small ones run on one executor and big ones in
    // streamed stages: both turned off here).
    let (dir, config) = config_file(
        "explainjob",
        "[server]\nsingle_node_max_bytes = 0\nstreamed_exchanges = false\n",
    );
    let out = basin(
        &[
            "standalone",
            "--config",
            &config,
            "-e",
            "EXPLAIN SELECT l_returnflag, count(*) FROM tpch.tiny.lineitem GROUP BY 1",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("distributed_plan"), "{text}");
    assert!(text.contains("ShuffleWriterExec"), "{text}");
    assert!(text.contains("TpchScanExec"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);

    let out = basin(
        &[
            "standalone",
            "-e",
            "EXPLAIN ANALYZE SELECT l_returnflag, count(*) FROM tpch.tiny.lineitem GROUP BY 1",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("output_rows"), "{}", stdout(&out));
}

/// EXPLAIN ANALYZE of a job whose stage reads several files counts each file once (an
/// executor that ran several partitions from one decoded plan reported the scan's
/// counters of all of them for each).
#[test]
fn explain_analyze_counts_each_file_once() {
    let data = scratch_dir("analyzefiles");
    let out = basin(
        &[
            "standalone",
            "--data-dir",
            data.to_str().unwrap(),
            "-e",
            "CREATE SCHEMA lake.m; \
             CREATE TABLE lake.m.t AS SELECT * FROM tpch.tiny.nation; \
             INSERT INTO lake.m.t SELECT * FROM tpch.tiny.nation; \
             INSERT INTO lake.m.t SELECT * FROM tpch.tiny.nation; \
             EXPLAIN ANALYZE SELECT count(*) FROM lake.m.t WHERE n_regionkey < 3",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("files=3 of 3"), "{text}");
    assert!(text.contains("files_scanned=3"), "{text}");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn executor_without_scheduler_fails_clearly() {
    let out = basin(&["executor", "--scheduler", "127.0.0.1:1"], &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert!(
        err.lines().last().unwrap_or("").starts_with("error: "),
        "{err}"
    );
    let out = basin(&["executor", "--scheduler", "nonsense"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("HOST:PORT"), "{}", stderr(&out));
}

#[test]
fn port_in_use_is_reported() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let out = basin(
        &["standalone", "--scheduler-port", &port, "-e", "SELECT 1"],
        &[],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains(&port), "{}", stderr(&out));
}

#[test]
fn sigterm_stops_a_running_statement_with_an_error() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let data = scratch_dir("sigterm");
    let mut child = Command::new(env!("CARGO_BIN_EXE_basin"))
        .args([
            "standalone",
            "-e",
            "SELECT sum(l_extendedprice * l_discount) FROM tpch.sf100.lineitem",
        ])
        .env_remove("BASIN_CONFIG")
        .env("BASIN_DATA_DIR", &data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run basin");
    // The in-process executors take the signal for themselves; the statement must not then
    // wait for them forever.
    std::thread::sleep(Duration::from_secs(3));
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("basin standalone -e did not stop within 60 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    assert!(err.contains("interrupted (Ctrl-C or SIGTERM)"), "{err}");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn plans_deeper_than_the_codecs_default_limit_reach_the_executors() {
    // A chain of 40 joins nests a few hundred protobuf messages deep, past prost's default
    // limit of 100 (TPC-DS Q64's plan failed to decode on the executor with
    // RecursionLimitReached).
    let joins: String = (1..=40)
        .map(|i| format!(" JOIN tpch.tiny.nation n{i} ON n{i}.n_nationkey = n0.n_nationkey"))
        .collect();
    let sql = format!("SELECT count(*) AS n FROM tpch.tiny.nation n0{joins}");
    let out = basin(&["standalone", "--format", "csv", "-e", &sql], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "n\n25\n");
}
