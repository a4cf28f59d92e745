//! Awkward names end to end: schemas, tables and columns whose names hold spaces, capitals,
//! double and single quotes, dots, reserved words (`select`, `order`), non-ASCII letters
//! (`Größe`, `名前`) and a backtick, in PostgreSQL, MariaDB, the embedded Iceberg catalog and
//! Parquet files. Every query shape (plain scan, filter on an odd column, GROUP BY, ORDER BY,
//! joins, an aggregate a remote source computes itself, a window, an alias, a union) runs on
//! every route a query can take — a streamed stage, a whole query on one executor, a Ballista
//! job — in the in-process cluster (`basin standalone`) and in a cluster of processes
//! (`basin scheduler` + `basin executor`, queried over Flight SQL), and its rows are checked.
//!
//! Ballista jobs are where names used to break: a job's logical plan travels to the scheduler
//! through datafusion-proto, which writes a column's table as unquoted text
//! (`connectors/src/codec.rs`, `portable_names`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::federation::{Cluster, log_since, mariadb, psql, servers};
use crate::{RunWithin, Scratch, scratch_dir, stderr, stdout};

/// The schema (PostgreSQL schema, MariaDB database) of the tables.
const SCHEMA: &str = "Odd Schema.v1";
/// The Iceberg namespace of the tables: DataFusion's `CREATE SCHEMA` splits its name at
/// every dot (`Unable to parse catalog from lake.Odd Schema.v1`), an upstream limit.
const ICEBERG_SCHEMA: &str = "Odd \"Schema\" it's";
/// The first table and its columns.
const T1: &str = "Mixed \"Case\" it's";
const T1_COLUMNS: [&str; 7] = [
    "Id",
    "select",
    "Größe",
    "名前",
    "a.b \"c\"",
    "it's",
    "back`tick",
];
/// The second table and its columns.
const T2: &str = "order.Größe";
const T2_COLUMNS: [&str; 3] = ["Id", "order", "名前"];

/// Rows of the first table, as SQL values (the same text in every SQL dialect used here).
const T1_ROWS: &str = "(1, 's1', 10, 'ann', 100, 'q1', 7), (2, 's2', 20, 'bob', 200, 'q2', 7), \
     (3, 's3', 30, 'ann', 300, 'q3', 8), (4, 's4', NULL, 'bob', 400, 'q4', 8)";
const T2_ROWS: &str = "(1, 'first', 'ann'), (2, 'second', 'bob'), (5, 'fifth', 'cid')";

/// A name as a double-quoted SQL identifier (DataFusion, PostgreSQL).
fn q(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A name as a MariaDB identifier.
fn bq(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// A query over `{t1}` and `{t2}` (the tables' full names), the rows it returns (CSV,
/// without the header) and whether their order is part of the answer.
struct Query {
    name: &'static str,
    sql: &'static str,
    ordered: bool,
    rows: &'static [&'static str],
}

const QUERIES: &[Query] = &[
    Query {
        name: "plain scan",
        sql: "SELECT * FROM {t1}",
        ordered: false,
        rows: &[
            "1,s1,10,ann,100,q1,7",
            "2,s2,20,bob,200,q2,7",
            "3,s3,30,ann,300,q3,8",
            "4,s4,,bob,400,q4,8",
        ],
    },
    Query {
        name: "filter on odd columns",
        sql: "SELECT \"Id\", \"back`tick\" FROM {t1} WHERE \"Größe\" > 15 AND \"名前\" = 'ann' \
              AND \"a.b \"\"c\"\"\" >= 300",
        ordered: false,
        rows: &["3,8"],
    },
    Query {
        name: "group by",
        sql: "SELECT \"名前\", count(*), sum(\"Größe\"), max(\"a.b \"\"c\"\"\") FROM {t1} \
              GROUP BY \"名前\"",
        ordered: false,
        rows: &["ann,2,40,300", "bob,2,20,400"],
    },
    Query {
        name: "order by",
        sql: "SELECT \"Id\", \"it's\" FROM {t1} ORDER BY \"a.b \"\"c\"\"\" DESC",
        ordered: true,
        rows: &["4,q4", "3,q3", "2,q2", "1,q1"],
    },
    Query {
        name: "join through aliases",
        sql: "SELECT a.\"Id\", b.\"order\" FROM {t1} a JOIN {t2} b ON a.\"Id\" = b.\"Id\"",
        ordered: false,
        rows: &["1,first", "2,second"],
    },
    Query {
        name: "join through the tables' names",
        sql: "SELECT {t1}.\"Id\", {t2}.\"order\" FROM {t1} JOIN {t2} \
              ON {t1}.\"名前\" = {t2}.\"名前\"",
        ordered: false,
        rows: &["1,first", "2,second", "3,first", "4,second"],
    },
    Query {
        name: "aggregate",
        sql: "SELECT count(*), sum(\"Größe\"), max(\"a.b \"\"c\"\"\") FROM {t1}",
        ordered: false,
        rows: &["4,60,400"],
    },
    Query {
        // `{t2}`'s names hold no quote or backtick: a remote source computes this itself
        // (names with them are only ever scanned, see the remote test).
        name: "grouped aggregate",
        sql: "SELECT \"名前\", count(*), max(\"Id\") FROM {t2} WHERE \"order\" <> 'x' \
              GROUP BY \"名前\"",
        ordered: false,
        rows: &["ann,1,1", "bob,1,2", "cid,1,5"],
    },
    Query {
        name: "filtered group by in order",
        sql: "SELECT \"back`tick\", sum(\"Id\") FROM {t1} WHERE \"select\" <> 's9' \
              GROUP BY \"back`tick\" ORDER BY \"back`tick\"",
        ordered: true,
        rows: &["7,3", "8,7"],
    },
    Query {
        name: "window",
        sql: "SELECT \"Id\", sum(\"Größe\") OVER (PARTITION BY \"名前\") FROM {t1}",
        ordered: false,
        rows: &["1,40", "2,20", "3,40", "4,20"],
    },
    Query {
        name: "awkward alias",
        sql: "SELECT \"x.y \"\"z\"\"\".\"Id\", \"x.y \"\"z\"\"\".\"it's\" FROM {t1} AS \"x.y \"\"z\"\"\" \
              WHERE \"x.y \"\"z\"\"\".\"it's\" IN ('q2', 'q4') ORDER BY 1",
        ordered: true,
        rows: &["2,q2", "4,q4"],
    },
    Query {
        name: "union",
        sql: "SELECT \"名前\" FROM {t1} UNION SELECT \"名前\" FROM {t2}",
        ordered: false,
        rows: &["ann", "bob", "cid"],
    },
];

/// The header of the plain scan: the columns' own names, in CSV.
const SCAN_HEADER: &str = "Id,select,Größe,名前,\"a.b \"\"c\"\"\",it's,back`tick";

/// Where a query runs: the configuration's `[server]` section and whether a cluster of
/// processes runs it.
struct Route {
    name: &'static str,
    server: &'static str,
    processes: bool,
}

const ROUTES: &[Route] = &[
    // One-stage queries stream, small multi-stage ones run whole on one executor, queries
    // over remote tables (of unknown size) are Ballista jobs.
    Route {
        name: "standalone",
        server: "",
        processes: false,
    },
    // Every query with an exchange runs in stages streaming to each other.
    Route {
        name: "standalone, exchanges",
        server: "single_node_max_bytes = 0\nstreamed_exchanges = true\n",
        processes: false,
    },
    // Every query with an exchange is a Ballista job.
    Route {
        name: "standalone, jobs",
        server: "single_node_max_bytes = 0\nstreamed_exchanges = false\n",
        processes: false,
    },
    // Every query is a Ballista job, scans included.
    Route {
        name: "standalone, no streaming",
        server: "streamed_stages = false\n",
        processes: false,
    },
    Route {
        name: "processes",
        server: "",
        processes: true,
    },
    Route {
        name: "processes, jobs",
        server: "single_node_max_bytes = 0\n",
        processes: true,
    },
];

/// Runs every query over `t1`/`t2` on every route, after `prelude` (statements of the same
/// session, such as `CREATE EXTERNAL TABLE`), and checks the rows. `catalogs` is the
/// configuration's catalog sections. The headers must be the same on every route.
fn check_every_route(source: &str, dir: &Path, catalogs: &str, prelude: &str, t1: &str, t2: &str) {
    let mut script = prelude.to_string();
    for (i, query) in QUERIES.iter().enumerate() {
        let sql = query.sql.replace("{t1}", t1).replace("{t2}", t2);
        script.push_str(&format!("SELECT 'query {i}' AS \"----\";\n{sql};\n"));
    }
    // The header of each query on the first route: the same on every other.
    let mut headers: Option<Vec<String>> = None;
    for route in ROUTES {
        let config = dir.join(format!(
            "basin-{}.toml",
            route.name.replace([' ', ','], "_")
        ));
        std::fs::write(&config, format!("{catalogs}\n[server]\n{}", route.server)).unwrap();
        let out = if route.processes {
            let cluster = Cluster::start(dir, &config);
            let mut out = cluster.sql(&script);
            for _ in 0..100 {
                if out.status.success() {
                    break;
                }
                // The executors may still be registering.
                std::thread::sleep(Duration::from_millis(200));
                out = cluster.sql(&script);
            }
            out
        } else {
            standalone(dir, &config, &script)
        };
        assert!(
            out.status.success(),
            "{source}, {}: {}",
            route.name,
            stderr(&out)
        );
        let results = split_results(&stdout(&out));
        assert_eq!(
            results.len(),
            QUERIES.len(),
            "{source}, {}: {}",
            route.name,
            stdout(&out)
        );
        let mut route_headers = vec![];
        for (query, (header, rows)) in QUERIES.iter().zip(results) {
            let mut got = rows.clone();
            let mut want: Vec<String> = query.rows.iter().map(|r| r.to_string()).collect();
            if !query.ordered {
                got.sort();
                want.sort();
            }
            assert_eq!(
                got, want,
                "{source}, {}, {}: {}",
                route.name, query.name, query.sql
            );
            route_headers.push(header);
        }
        assert_eq!(route_headers[0], SCAN_HEADER, "{source}, {}", route.name);
        match &headers {
            None => headers = Some(route_headers),
            Some(first) => assert_eq!(&route_headers, first, "{source}, {}", route.name),
        }
    }
}

/// Each query's header and rows from the output of a script built by [`check_every_route`].
fn split_results(out: &str) -> Vec<(String, Vec<String>)> {
    let mut results: Vec<(String, Vec<String>)> = vec![];
    let mut lines = out.lines().peekable();
    while let Some(line) = lines.next() {
        if line != "----" {
            continue;
        }
        // The marker's value, then the query's header and rows up to the next marker.
        lines.next();
        let header = lines.next().unwrap_or_default().to_string();
        let mut rows = vec![];
        while let Some(line) = lines.next_if(|l| *l != "----") {
            rows.push(line.to_string());
        }
        results.push((header, rows));
    }
    results
}

fn standalone(dir: &Path, config: &Path, sql: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_basin"))
        .args(["standalone", "--format", "csv", "--config"])
        .arg(config)
        .args(["-e", sql])
        .env_remove("BASIN_CONFIG")
        .env("BASIN_DATA_DIR", data_dir(dir))
        .run_within()
}

/// The data directory of a test's processes: the one [`Cluster`] gives its processes, so
/// that `basin standalone` and the cluster see the same Iceberg tables.
fn data_dir(dir: &Path) -> PathBuf {
    dir.join("cluster-data")
}

fn ok(dir: &Path, sql: &str) -> String {
    let config = dir.join("setup.toml");
    if !config.exists() {
        std::fs::write(&config, "").unwrap();
    }
    let out = standalone(dir, &config, sql);
    assert!(out.status.success(), "{sql}\n{}", stderr(&out));
    stdout(&out)
}

/// Column definitions `name type, ...` with `quote` for the names.
fn columns(names: &[&str], types: &[&str], quote: fn(&str) -> String) -> String {
    names
        .iter()
        .zip(types)
        .map(|(n, t)| format!("{} {t}", quote(n)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn awkward_names_in_iceberg_and_files_on_every_route() {
    let dir: Scratch = scratch_dir("names");
    let (s, t1, t2) = (q(ICEBERG_SCHEMA), q(T1), q(T2));
    // Iceberg: the names in the catalog, rows written by INSERT (a write job over the
    // awkward names) and by CREATE TABLE ... AS SELECT from an awkward table.
    ok(
        &dir,
        &format!(
            "CREATE SCHEMA lake.{s}; \
             CREATE TABLE lake.{s}.{staging} ({c1}); \
             INSERT INTO lake.{s}.{staging} VALUES {T1_ROWS}; \
             CREATE TABLE lake.{s}.{t1} AS SELECT * FROM lake.{s}.{staging}; \
             CREATE TABLE lake.{s}.{t2} ({c2}); \
             INSERT INTO lake.{s}.{t2} VALUES {T2_ROWS}",
            staging = q("staging \"t1\""),
            c1 = columns(
                &T1_COLUMNS,
                &["INT", "VARCHAR", "INT", "VARCHAR", "INT", "VARCHAR", "INT"],
                q
            ),
            c2 = columns(&T2_COLUMNS, &["INT", "VARCHAR", "VARCHAR"], q),
        ),
    );
    check_every_route(
        "iceberg",
        &dir,
        "",
        "",
        &format!("lake.{s}.{t1}"),
        &format!("lake.{s}.{t2}"),
    );

    // Files: Parquet files whose columns have the awkward names, as external tables with
    // awkward names, and one read through read_parquet().
    let files = dir.join("files");
    std::fs::create_dir_all(&files).unwrap();
    let as_columns = |names: &[&str]| {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("column{} AS {}", i + 1, q(n)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (f1, f2) = (files.join("t1.parquet"), files.join("t2.parquet"));
    ok(
        &dir,
        &format!(
            "COPY (SELECT {} FROM (VALUES {T1_ROWS})) TO '{}' STORED AS PARQUET; \
             COPY (SELECT {} FROM (VALUES {T2_ROWS})) TO '{}' STORED AS PARQUET",
            as_columns(&T1_COLUMNS),
            f1.display(),
            as_columns(&T2_COLUMNS),
            f2.display()
        ),
    );
    let prelude = format!(
        "CREATE EXTERNAL TABLE {t1} STORED AS PARQUET LOCATION '{}';\n\
         CREATE EXTERNAL TABLE {t2} STORED AS PARQUET LOCATION '{}';\n",
        f1.display(),
        f2.display()
    );
    // Over Flight SQL (the process route) files outside the data directory's user area
    // need the sandbox's leave.
    let allowed = format!("[security]\nallowed_locations = [\"{}\"]\n", dir.display());
    check_every_route("files", &dir, &allowed, &prelude, &t1, &t2);
    // read_parquet() of the same file, grouped by an awkward column: one executor, then a job.
    for route in ROUTES.iter().filter(|r| !r.processes) {
        let config = dir.join("read_parquet.toml");
        std::fs::write(&config, format!("[server]\n{}", route.server)).unwrap();
        let out = standalone(
            &dir,
            &config,
            &format!(
                "SELECT \"名前\", sum(\"Größe\") AS s FROM read_parquet('{}') GROUP BY \"名前\" \
                 ORDER BY \"名前\"",
                f1.display()
            ),
        );
        assert!(out.status.success(), "{}: {}", route.name, stderr(&out));
        assert_eq!(stdout(&out), "名前,s\nann,40\nbob,20\n", "{}", route.name);
    }
}

#[test]
fn awkward_names_in_postgres_and_mariadb_on_every_route() {
    let Some(servers) = servers("awkward_names") else {
        return;
    };
    let dir: Scratch = scratch_dir("remote-names");
    // Schemas of their own (the servers are shared by concurrent tests).
    let schema = format!("{SCHEMA} {}", std::process::id());
    let _drop = Dropper {
        pg_url: servers.pg_url.clone(),
        my_url: servers.my_url.clone(),
        schema: schema.clone(),
    };
    let types = [
        "int",
        "varchar(10)",
        "int",
        "varchar(10)",
        "int",
        "varchar(10)",
        "int",
    ];
    let t2_types = ["int", "varchar(10)", "varchar(10)"];
    let (ps, pt1, pt2) = (q(&schema), q(T1), q(T2));
    psql(
        &servers.pg_url,
        &format!(
            "DROP SCHEMA IF EXISTS {ps} CASCADE; CREATE SCHEMA {ps}; \
             CREATE TABLE {ps}.{pt1} ({}); INSERT INTO {ps}.{pt1} VALUES {T1_ROWS}; \
             CREATE TABLE {ps}.{pt2} ({}); INSERT INTO {ps}.{pt2} VALUES {T2_ROWS}; ANALYZE",
            columns(&T1_COLUMNS, &types, q),
            columns(&T2_COLUMNS, &t2_types, q),
        ),
    );
    let (ms, mt1, mt2) = (bq(&schema), bq(T1), bq(T2));
    // Text compares byte for byte, as in Basin (a case-insensitive column keeps its
    // comparisons in Basin; these names are what is tested here).
    let my_types = types.map(|t| {
        if t.starts_with("varchar") {
            "varchar(10) COLLATE utf8mb4_nopad_bin"
        } else {
            t
        }
    });
    let my_t2_types = ["int", my_types[1], my_types[1]];
    mariadb(
        &servers.my_url,
        &format!(
            "DROP DATABASE IF EXISTS {ms}; CREATE DATABASE {ms}; \
             CREATE TABLE {ms}.{mt1} ({}) DEFAULT CHARSET utf8mb4; \
             INSERT INTO {ms}.{mt1} VALUES {T1_ROWS}; \
             CREATE TABLE {ms}.{mt2} ({}) DEFAULT CHARSET utf8mb4; \
             INSERT INTO {ms}.{mt2} VALUES {T2_ROWS}",
            columns(&T1_COLUMNS, &my_types, bq),
            columns(&T2_COLUMNS, &my_t2_types, bq),
        ),
    );
    let catalogs = format!(
        "[catalogs.pg]\nconnector = \"postgres\"\nurl = \"{}\"\ntls = \"disable\"\n\n\
         [catalogs.my]\nconnector = \"mysql\"\nurl = \"{}\"\ntls = \"disable\"\n",
        servers.pg_url, servers.my_url
    );
    for (catalog, log, table, column, pushed) in [
        (
            "pg",
            &servers.pg_log,
            format!("{ps}.{pt1}"),
            q("a.b \"c\""),
            format!("FROM {ps}.{pt2}"),
        ),
        (
            "my",
            &servers.my_log,
            format!("{ms}.{mt1}"),
            bq("back`tick"),
            format!("FROM {ms}.{mt2}"),
        ),
    ] {
        let before = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
        let s = q(&schema);
        check_every_route(
            catalog,
            &dir,
            &catalogs,
            "",
            &format!("{catalog}.{s}.{}", q(T1)),
            &format!("{catalog}.{s}.{}", q(T2)),
        );
        // What the server received names the table and columns quoted in its own way.
        std::thread::sleep(Duration::from_millis(500));
        let sent = log_since(log, before);
        for want in [&table, &column] {
            assert!(
                sent.contains(want.as_str()),
                "{catalog}: `{want}` not in the statements received:\n{sent:.4000}"
            );
        }
        // The grouped aggregate over the second table was computed by the source; over the
        // first table (a quote in its name) nothing but scans was sent.
        assert!(
            sent.lines()
                .any(|l| l.contains(&pushed) && l.contains("count(") && l.contains("GROUP BY")),
            "{catalog}: the aggregate was not pushed down:\n{sent:.4000}"
        );
        assert!(
            !sent
                .lines()
                .any(|l| l.contains(&table) && (l.contains("WHERE") || l.contains("GROUP BY"))),
            "{catalog}: more than a scan pushed for a name with a quote:\n{sent:.4000}"
        );
    }
}

/// Drops the remote schemas at the end of the test, also when it fails.
struct Dropper {
    pg_url: String,
    my_url: String,
    schema: String,
}

impl Dropper {
    fn run(&self) {
        let _ = Command::new("psql")
            .args([
                self.pg_url.as_str(),
                "-q",
                "-c",
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", q(&self.schema)),
            ])
            .output();
        let _ = std::panic::catch_unwind(|| {
            mariadb(
                &self.my_url,
                &format!("DROP DATABASE IF EXISTS {}", bq(&self.schema)),
            )
        });
    }
}

impl Drop for Dropper {
    fn drop(&mut self) {
        self.run();
    }
}
