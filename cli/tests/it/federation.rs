//! PostgreSQL, MariaDB, SQL Server (Babelfish) and MongoDB (DocumentDB) sources end to end,
//! on throwaway servers that `.ci/services.sh start postgres mariadb sqlserver mongodb`
//! starts (BASIN_TEST_PG_URL/_LOG, BASIN_TEST_MYSQL_URL/_LOG, BASIN_TEST_SQLSERVER_URL/_LOG,
//! BASIN_TEST_MONGODB_URL/_LOG). Every check compares the source's answer with the answer
//! Basin computes itself over a copy of the same rows in the embedded Iceberg catalog, and
//! pushdown is asserted on what the server actually received (its statement log; DocumentDB
//! logs each pipeline as a BSON parameter of the SQL it runs).
//!
//! The conformance cases are shared by both connectors; what each connector pushes follows its
//! capability flags and per-type guards.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::{RunWithin, in_ci, scratch_dir, stderr, stdout};

pub(crate) struct Servers {
    pub(crate) pg_url: String,
    pub(crate) pg_log: PathBuf,
    pub(crate) my_url: String,
    pub(crate) my_log: PathBuf,
    pub(crate) ms_url: String,
    pub(crate) ms_log: PathBuf,
    pub(crate) mg_url: String,
    pub(crate) mg_log: PathBuf,
}

pub(crate) fn servers(test: &str) -> Option<Servers> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match (
        var("BASIN_TEST_PG_URL"),
        var("BASIN_TEST_PG_LOG"),
        var("BASIN_TEST_MYSQL_URL"),
        var("BASIN_TEST_MYSQL_LOG"),
        var("BASIN_TEST_SQLSERVER_URL"),
        var("BASIN_TEST_SQLSERVER_LOG"),
        var("BASIN_TEST_MONGODB_URL"),
        var("BASIN_TEST_MONGODB_LOG"),
    ) {
        (
            Some(pg_url),
            Some(pg_log),
            Some(my_url),
            Some(my_log),
            Some(ms_url),
            Some(ms_log),
            Some(mg_url),
            Some(mg_log),
        ) => Some(Servers {
            pg_url,
            pg_log: pg_log.into(),
            my_url,
            my_log: my_log.into(),
            ms_url,
            ms_log: ms_log.into(),
            mg_url,
            mg_log: mg_log.into(),
        }),
        _ => {
            let msg = format!(
                "{test}: skipped: BASIN_TEST_PG_URL/BASIN_TEST_MYSQL_URL/BASIN_TEST_SQLSERVER_URL/\
                 BASIN_TEST_MONGODB_URL are not set; run `eval \"$(.ci/services.sh start postgres \
                 mariadb sqlserver mongodb)\"` first"
            );
            assert!(!in_ci(), "{msg}");
            eprintln!("{msg}");
            None
        }
    }
}

/// Runs `program args` with `input` on stdin (SQL can be larger than an argument may be).
fn with_stdin(program: &str, args: &[&str], input: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// What a server wrote to its statement log `log` after byte `before`.
pub(crate) fn log_since(log: &Path, before: u64) -> String {
    let bytes = std::fs::read(log).unwrap_or_default();
    String::from_utf8_lossy(&bytes[(before as usize).min(bytes.len())..]).to_string()
}

pub(crate) fn psql(url: &str, sql: &str) -> String {
    let out = with_stdin(
        "psql",
        &[url, "-v", "ON_ERROR_STOP=1", "-q", "-A", "-t"],
        sql,
    );
    assert!(out.status.success(), "psql: {sql}\n{}", stderr(&out));
    stdout(&out)
}

/// Runs SQL on MariaDB with the `mariadb` client (URL mysql://user:pw@host:port/db).
pub(crate) fn mariadb(url: &str, sql: &str) -> String {
    let rest = url.strip_prefix("mysql://").expect("mysql URL");
    let (creds, rest) = rest.split_once('@').expect("user@host");
    let (user, password) = creds.split_once(':').unwrap_or((creds, ""));
    let (hostport, db) = rest.split_once('/').unwrap_or((rest, ""));
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "3306"));
    let out = with_stdin(
        "mariadb",
        &[
            "-h",
            host,
            "-P",
            port,
            "-u",
            user,
            &format!("-p{password}"),
            "-N",
            "-B",
            "--default-character-set=utf8mb4",
            "--max-allowed-packet=64M",
            db,
        ],
        sql,
    );
    assert!(out.status.success(), "mariadb: {sql}\n{}", stderr(&out));
    stdout(&out)
}

/// Runs a T-SQL batch on SQL Server (URL sqlserver://user:pw@host:port/db) over TDS and
/// returns the rows of every result, `|`-separated, one per line.
pub(crate) fn tsql(url: &str, sql: &str) -> String {
    use tokio_util::compat::TokioAsyncWriteCompatExt;
    let parsed = url::Url::parse(url).expect("sqlserver URL");
    let mut config = tiberius::Config::new();
    config.host(parsed.host_str().unwrap());
    config.port(parsed.port().unwrap_or(1433));
    config.database(parsed.path().trim_start_matches('/'));
    config.authentication(tiberius::AuthMethod::sql_server(
        parsed.username(),
        parsed.password().unwrap_or_default(),
    ));
    config.trust_cert();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let tcp = tokio::net::TcpStream::connect(config.get_addr())
            .await
            .unwrap();
        let mut client = tiberius::Client::connect(config, tcp.compat_write())
            .await
            .unwrap();
        let results = match client.simple_query(sql).await {
            Ok(stream) => stream.into_results().await,
            Err(e) => Err(e),
        };
        let results = results.unwrap_or_else(|e| panic!("sqlserver: {sql}\n{e}"));
        let mut out = String::new();
        for row in results.into_iter().flatten() {
            let cells: Vec<String> = row
                .cells()
                .map(|(_, v)| match v {
                    tiberius::ColumnData::String(Some(s)) => s.to_string(),
                    tiberius::ColumnData::I32(Some(v)) => v.to_string(),
                    tiberius::ColumnData::I64(Some(v)) => v.to_string(),
                    other => format!("{other:?}"),
                })
                .collect();
            out.push_str(&cells.join("|"));
            out.push('\n');
        }
        out
    })
}

/// Runs `f` with a MongoDB client of `url` and returns its result.
pub(crate) fn mongo<T, Fut>(url: &str, f: impl FnOnce(mongodb::Client) -> Fut) -> T
where
    Fut: std::future::Future<Output = T>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let client = mongodb::Client::with_uri_str(url)
            .await
            .expect("MongoDB URL");
        f(client).await
    })
}

/// The commands in DocumentDB's statement log lines (BSON parameters, `'\x…'`), as relaxed
/// extended JSON, one per line.
pub(crate) fn mongo_commands(log: &str) -> String {
    let mut out = vec![];
    for line in log.lines() {
        let mut rest = line;
        while let Some(i) = rest.find("'\\x") {
            let hex: String = rest[i + 3..]
                .chars()
                .take_while(|c| c.is_ascii_hexdigit())
                .collect();
            rest = &rest[i + 3 + hex.len()..];
            let bytes: Vec<u8> = (0..hex.len() / 2)
                .filter_map(|k| u8::from_str_radix(&hex[2 * k..2 * k + 2], 16).ok())
                .collect();
            if let Ok(raw) = bson::RawDocumentBuf::from_bytes(bytes)
                && let Ok(doc) = bson::Document::try_from(raw)
            {
                let mut text = String::new();
                basin_connectors::mongodb::exec::ordered_json(
                    &bson::Bson::Document(doc),
                    &mut text,
                );
                out.push(text);
            }
        }
    }
    out.join("\n")
}

/// A schema (PostgreSQL, SQL Server) and database (MariaDB, MongoDB) of the same name for
/// one test, dropped at the end.
pub(crate) struct Fixture {
    pub(crate) s: Servers,
    pub(crate) name: String,
    pub(crate) dir: crate::Scratch,
    pub(crate) config: PathBuf,
}

impl Fixture {
    pub(crate) fn new(test: &str) -> Option<Self> {
        let s = servers(test)?;
        let name = format!("t_{}_{test}", std::process::id());
        psql(
            &s.pg_url,
            &format!("DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"),
        );
        mariadb(
            &s.my_url,
            &format!("DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}"),
        );
        drop_tsql_schema(&s.ms_url, &name);
        tsql(&s.ms_url, &format!("CREATE SCHEMA {name}"));
        let db = name.clone();
        mongo(&s.mg_url, |c| async move {
            c.database(&db).drop().await.unwrap()
        });
        let dir = scratch_dir(test);
        let config = dir.join("basin.toml");
        std::fs::write(
            &config,
            format!(
                "[catalogs.pg]\nconnector = \"postgres\"\nurl = \"{}\"\ntls = \"disable\"\n\
                 split_size_bytes = 1048576\nmax_splits = 4\n\n\
                 [catalogs.my]\nconnector = \"mysql\"\nurl = \"{}\"\ntls = \"disable\"\n\
                 split_size_bytes = 1048576\nmax_splits = 4\n\n\
                 [catalogs.ms]\nconnector = \"sqlserver\"\nurl = \"{}\"\ntls = \"require\"\n\
                 split_size_bytes = 1048576\nmax_splits = 4\n\n\
                 [catalogs.mg]\nconnector = \"mongodb\"\nurl = \"{}\"\n\
                 split_size_bytes = 1048576\nmax_splits = 4\n",
                s.pg_url, s.my_url, s.ms_url, s.mg_url
            ),
        )
        .unwrap();
        Some(Self {
            s,
            name,
            dir,
            config,
        })
    }

    fn pg(&self, sql: &str) -> String {
        psql(
            &self.s.pg_url,
            &format!("SET search_path = {}; {sql}", self.name),
        )
    }

    fn my(&self, sql: &str) -> String {
        mariadb(&self.s.my_url, &format!("USE {}; {sql}", self.name))
    }

    /// A T-SQL batch on SQL Server; `{s}` names this test's schema.
    fn ms(&self, sql: &str) -> String {
        tsql(&self.s.ms_url, &sql.replace("{s}", &self.name))
    }

    /// Runs `f` on this test's MongoDB database.
    pub(crate) fn mg<T, Fut>(&self, f: impl FnOnce(mongodb::Database) -> Fut) -> T
    where
        Fut: std::future::Future<Output = T>,
    {
        let name = self.name.clone();
        mongo(&self.s.mg_url, |c| f(c.database(&name)))
    }

    /// Declares the columns of a MongoDB collection of this test's database in basin.toml.
    pub(crate) fn declare_mg(&self, collection: &str, columns: &[&str]) {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.config)
            .unwrap();
        let columns: Vec<String> = columns.iter().map(|c| format!("{c:?}")).collect();
        writeln!(
            file,
            "\n[catalogs.mg.collections.\"{}.{collection}\"]\ncolumns = [{}]",
            self.name,
            columns.join(", ")
        )
        .unwrap();
    }

    pub(crate) fn run(&self, sql: &str) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_basin"));
        cmd.args(["standalone", "--format", "csv", "--config"])
            .arg(&self.config);
        if sql.len() > 64 * 1024 {
            // Too long for an argument: a file of statements.
            let file = self.dir.join("statement.sql");
            std::fs::write(&file, sql).unwrap();
            cmd.arg("-f").arg(file);
        } else {
            cmd.args(["-e", sql]);
        }
        cmd.env_remove("BASIN_CONFIG")
            .env("BASIN_DATA_DIR", self.dir.join("data"))
            .run_within()
    }

    pub(crate) fn ok(&self, sql: &str) -> String {
        let out = self.run(sql);
        assert!(out.status.success(), "{sql}\n{}", stderr(&out));
        stdout(&out)
    }

    /// Runs `sql` and returns its output and the statements the source received meanwhile
    /// that mention this test's schema.
    pub(crate) fn traced(&self, log: &Path, sql: &str) -> (String, String) {
        let before = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
        let out = self.ok(sql);
        let read = || {
            log_since(log, before)
                .lines()
                .filter(|l| l.contains(&self.name) && !l.contains("information_schema"))
                .filter(|l| !l.contains("EXPLAIN"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        // Statement logs are written asynchronously by the servers (later still on a busy
        // machine): wait until this query's statements are there and no more arrive.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut mine = read();
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = read();
            if (!now.is_empty() && now == mine) || std::time::Instant::now() > deadline {
                break;
            }
            mine = now;
        }
        (out, mine)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                self.s.pg_url.as_str(),
                "-q",
                "-c",
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
            ])
            .output();
        let _ = std::panic::catch_unwind(|| {
            mariadb(
                &self.s.my_url,
                &format!("DROP DATABASE IF EXISTS {}", self.name),
            )
        });
        let _ = std::panic::catch_unwind(|| drop_tsql_schema(&self.s.ms_url, &self.name));
        let db = self.name.clone();
        let _ = std::panic::catch_unwind(|| {
            mongo(
                &self.s.mg_url,
                |c| async move { c.database(&db).drop().await },
            )
        });
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Drops a SQL Server schema and its tables, if it exists.
fn drop_tsql_schema(url: &str, name: &str) {
    let tables = tsql(
        url,
        &format!("SELECT TABLE_NAME FROM INFORMATION_SCHEMA.TABLES WHERE TABLE_SCHEMA = '{name}'"),
    );
    for t in tables.lines() {
        tsql(url, &format!("DROP TABLE {name}.[{t}]"));
    }
    if !tsql(
        url,
        &format!("SELECT name FROM sys.schemas WHERE name = '{name}'"),
    )
    .trim()
    .is_empty()
    {
        tsql(url, &format!("DROP SCHEMA {name}"));
    }
}

/// The rows every source holds for the conformance suite.
fn conformance_rows() -> Vec<String> {
    (1..=40)
        .map(|i| {
            let code = ["abc", "ABC", "Abc", "xyz"][i % 4];
            let ts = if i % 7 == 0 {
                "NULL".to_string()
            } else {
                format!("'2024-01-{:02} {:02}:30:00'", i % 28 + 1, i % 24)
            };
            format!(
                "({i}, {}, 'item {i}', '{code}', {}.{:02}, {}, {}, '2024-01-{:02}', {ts})",
                i % 4,
                i * 3,
                i % 100,
                i * 37 % 500,
                if i % 5 == 0 {
                    "NULL".to_string()
                } else {
                    format!("{}", i as f64 / 8.0)
                },
                i % 28 + 1
            )
        })
        .collect()
}

fn load_conformance(f: &Fixture) {
    let values = conformance_rows().join(", ");
    f.pg(&format!(
        "CREATE TABLE items (id int PRIMARY KEY, grp int NOT NULL, name varchar(40) NOT NULL, \
           code varchar(10) NOT NULL, price numeric(10,2) NOT NULL, qty bigint NOT NULL, \
           ratio double precision, day date NOT NULL, ts timestamp); \
         INSERT INTO items VALUES {values}; \
         CREATE TABLE cats (id int PRIMARY KEY, label text NOT NULL); \
         INSERT INTO cats VALUES (0, 'zero'), (1, 'one'), (2, 'two'); ANALYZE"
    ));
    f.my(&format!(
        "CREATE TABLE items (id int PRIMARY KEY, grp int NOT NULL, \
           name varchar(40) COLLATE utf8mb4_nopad_bin NOT NULL, code varchar(10) NOT NULL, \
           price decimal(10,2) NOT NULL, qty bigint NOT NULL, ratio double, day date NOT NULL, \
           ts datetime) DEFAULT CHARSET utf8mb4; \
         INSERT INTO items VALUES {values}; \
         CREATE TABLE cats (id int PRIMARY KEY, label varchar(20) COLLATE utf8mb4_nopad_bin NOT NULL); \
         INSERT INTO cats VALUES (0, 'zero'), (1, 'one'), (2, 'two')"
    ));
    f.ms(&format!(
        "CREATE TABLE {{s}}.items (id int PRIMARY KEY, grp int NOT NULL, \
           name varchar(40) NOT NULL, code varchar(10) NOT NULL, price decimal(10,2) NOT NULL, \
           qty bigint NOT NULL, ratio float, day date NOT NULL, ts datetime2); \
         INSERT INTO {{s}}.items VALUES {values}; \
         CREATE TABLE {{s}}.cats (id int PRIMARY KEY, label nvarchar(20) NOT NULL); \
         INSERT INTO {{s}}.cats VALUES (0, 'zero'), (1, 'one'), (2, 'two')"
    ));
    // MongoDB: the same rows as documents (`ts` missing where the others hold NULL), with
    // the columns declared so that their types are the SQL tables'.
    let docs = conformance_docs();
    f.mg(|db| async move {
        db.collection::<bson::Document>("items")
            .insert_many(docs)
            .await
            .unwrap();
        db.collection::<bson::Document>("cats")
            .insert_many([
                bson::doc! { "_id": 0, "id": 0, "label": "zero" },
                bson::doc! { "_id": 1, "id": 1, "label": "one" },
                bson::doc! { "_id": 2, "id": 2, "label": "two" },
            ])
            .await
            .unwrap();
    });
    f.declare_mg(
        "items",
        &[
            "_id int",
            "id int",
            "grp int",
            "name string",
            "code string",
            "price decimal(10,2)",
            "qty bigint",
            "ratio double",
            "day date",
            "ts timestamp",
        ],
    );
}

/// [`conformance_rows`] as MongoDB documents.
fn conformance_docs() -> Vec<bson::Document> {
    let date = |day: u32, hour: u32| {
        bson::DateTime::from_millis(
            // 2024-01-01T00:00:00Z
            (1_704_067_200_i64 + i64::from(day - 1) * 86_400 + i64::from(hour) * 3600) * 1000,
        )
    };
    (1..=40u32)
        .map(|i| {
            let code = ["abc", "ABC", "Abc", "xyz"][i as usize % 4];
            let mut d = bson::doc! {
                "_id": i as i32,
                "id": i as i32,
                "grp": (i % 4) as i32,
                "name": format!("item {i}"),
                "code": code,
                "price": format!("{}.{:02}", i * 3, i % 100).parse::<bson::Decimal128>().unwrap(),
                "qty": i64::from(i * 37 % 500),
                "ratio": if i % 5 == 0 { bson::Bson::Null } else { bson::Bson::Double(f64::from(i) / 8.0) },
                "day": date(i % 28 + 1, 0),
            };
            if i % 7 != 0 {
                d.insert("ts", bson::DateTime::from_millis(date(i % 28 + 1, i % 24).timestamp_millis() + 30 * 60_000));
            }
            d
        })
        .collect()
}

/// A conformance case: the query (`{t}` is the schema prefix), and per source the fragments
/// the received SQL must (`+`) or must not (`-`) contain.
struct Case {
    name: &'static str,
    sql: &'static str,
    pg: &'static [&'static str],
    my: &'static [&'static str],
    ms: &'static [&'static str],
    /// MongoDB: fragments of the commands it received, as relaxed extended JSON.
    mg: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "filter on integers",
        sql: "SELECT id, name FROM {t}.items WHERE grp = 2 AND id > 10 ORDER BY id",
        pg: &["+\"grp\" = 2", "+\"id\" > 10"],
        my: &["+`grp` = 2", "+`id` > 10"],
        ms: &["+[grp] = 2", "+[id] > 10"],
        mg: &["+\"grp\":{\"$eq\":2}", "+\"id\":{\"$gt\":10}"],
    },
    Case {
        name: "aggregates with group by",
        sql: "SELECT grp, count(*), sum(price), min(qty), max(qty), avg(qty), sum(qty) \
              FROM {t}.items GROUP BY grp ORDER BY grp",
        pg: &["+GROUP BY", "+sum("],
        my: &["+GROUP BY", "+sum("],
        ms: &["+GROUP BY", "+sum("],
        mg: &["+\"$group\"", "+\"$sum\":\"$price\"", "+\"$avg\":\"$qty\""],
    },
    Case {
        // DataFusion computes `price * (1 - qty)` once (`__common_expr_1`) below the aggregate:
        // the aggregate is still pushed whole, as in TPC-H Q1.
        name: "aggregates sharing a subexpression",
        sql: "SELECT grp, sum(price * (1 - qty)) AS a, sum(price * (1 - qty) * (1 + qty)) AS b, \
              count(*) AS n FROM {t}.items WHERE day <= DATE '2030-01-01' GROUP BY grp ORDER BY grp",
        pg: &["+GROUP BY", "+sum(", "-__common_expr"],
        // MariaDB: the aggregate stays in Basin (decimal times bigint is not pushed there).
        my: &["-__common_expr"],
        // SQL Server: likewise (a decimal times a bigint needs a CAST there).
        ms: &["-__common_expr"],
        mg: &["+\"$lte\":{\"$date\"", "-\"$group\""],
    },
    Case {
        name: "count distinct",
        sql: "SELECT count(DISTINCT grp) AS n FROM {t}.items",
        // DataFusion plans it as a GROUP BY below a count: the GROUP BY is pushed.
        pg: &["+GROUP BY"],
        my: &["+GROUP BY"],
        ms: &["+GROUP BY"],
        mg: &["+\"$group\""],
    },
    Case {
        name: "top-n",
        sql: "SELECT id, price FROM {t}.items ORDER BY price DESC, id LIMIT 5",
        pg: &["+LIMIT 5", "+ORDER BY"],
        my: &["+LIMIT 5", "+ORDER BY"],
        ms: &["+TOP (5)", "+ORDER BY"],
        mg: &["+\"$sort\"", "+\"$limit\":5"],
    },
    Case {
        name: "limit",
        sql: "SELECT count(*) FROM (SELECT id FROM {t}.items LIMIT 3)",
        pg: &["+LIMIT 3"],
        my: &["+LIMIT 3"],
        ms: &["+TOP (3)"],
        mg: &["+\"$limit\":3"],
    },
    Case {
        name: "join within one source",
        sql: "SELECT i.id, c.label FROM {t}.items i JOIN {t}.cats c ON i.grp = c.id \
              WHERE i.id < 12 ORDER BY i.id",
        pg: &["+JOIN"],
        my: &["+JOIN"],
        ms: &["+JOIN"],
        mg: &["+\"id\":{\"$lt\":12}", "-\"$lookup\""],
    },
    Case {
        name: "text equality on a byte-comparing column",
        sql: "SELECT id FROM {t}.items WHERE name = 'item 7'",
        pg: &["+E'item 7'"],
        my: &["+X'6974656D2037'"],
        // SQL Server ignores trailing spaces and case: pushed as a superset, checked in Basin.
        ms: &["+N'item 7'"],
        mg: &["+\"name\":{\"$eq\":\"item 7\"}"],
    },
    Case {
        name: "text equality on a case-insensitive column is pushed loosely and checked in Basin",
        sql: "SELECT id FROM {t}.items WHERE code = 'abc' ORDER BY id",
        pg: &["+E'abc'"],
        my: &["+X'616263'"],
        ms: &["+N'abc'"],
        mg: &["+\"code\":{\"$eq\":\"abc\"}"],
    },
    Case {
        name: "text ordering needs a code-point collation",
        sql: "SELECT id FROM {t}.items WHERE name < 'item 2' ORDER BY id",
        pg: &["-E'item 2'"],
        my: &["+X'6974656D2032'"],
        ms: &["-N'item 2'"],
        mg: &["+\"name\":{\"$lt\":\"item 2\"}"],
    },
    Case {
        name: "float comparisons stay in Basin",
        sql: "SELECT id FROM {t}.items WHERE ratio > 2.5 ORDER BY id",
        pg: &["-2.5"],
        my: &["-2.5"],
        ms: &["-2.5"],
        mg: &["-2.5"],
    },
    Case {
        name: "like, in, between, is null, case",
        sql: "SELECT id, CASE WHEN qty > 100 THEN 'big' ELSE 'small' END AS size \
              FROM {t}.items WHERE name LIKE 'item 1%' AND grp IN (1, 3) \
              AND day BETWEEN DATE '2024-01-05' AND DATE '2024-01-20' AND ts IS NOT NULL \
              ORDER BY id",
        pg: &["+LIKE", "+\"grp\" = 3", "+IS NOT NULL", "+CASE"],
        my: &["+LIKE", "+`grp` = 3", "+IS NOT NULL", "+CASE"],
        // LIKE on a case-insensitive column stays in Basin, and the CASE above it.
        ms: &["+[grp] = 3", "+IS NOT NULL", "-CASE"],
        mg: &[
            "+\"pattern\":\"^item\\\\ 1.*\"",
            "+\"$in\":[1,3]",
            "+\"ts\":{\"$ne\":null}",
            "-\"$cond\"",
        ],
    },
    Case {
        name: "scalar subquery",
        sql: "SELECT id FROM {t}.items WHERE price > (SELECT avg(price) FROM {t}.items) \
              ORDER BY id",
        pg: &["+avg("],
        // A decimal average: MySQL and SQL Server round it at a scale of their own.
        my: &["-avg("],
        ms: &["-avg("],
        mg: &["-\"$avg\""],
    },
    Case {
        name: "a function Basin does not push keeps the rest pushed",
        sql: "SELECT id FROM {t}.items WHERE grp = 1 AND length(name) > 6 ORDER BY id",
        pg: &["+\"grp\" = 1", "-length("],
        my: &["+`grp` = 1", "-length("],
        ms: &["+[grp] = 1", "-length("],
        mg: &["+\"grp\":{\"$eq\":1}", "-length"],
    },
    Case {
        name: "timestamps and dates",
        sql: "SELECT day, max(ts), count(*) FROM {t}.items \
              WHERE ts >= TIMESTAMP '2024-01-10 00:00:00' GROUP BY day ORDER BY day",
        pg: &["+GROUP BY"],
        my: &["+GROUP BY"],
        ms: &["+GROUP BY"],
        mg: &[
            "+\"$group\"",
            "+\"ts\":{\"$gte\":{\"$date\":\"2024-01-10T00:00:00Z\"}}",
        ],
    },
];

/// The statement text of server log lines, without their timestamps and thread ids
/// (`15:04:32.598` contains `2.5`).
fn statements_only(log: &str) -> String {
    log.lines()
        .map(|line| {
            if let Some((_, rest)) = line.split_once("LOG:  ") {
                rest
            } else if let Some((_, rest)) = line.split_once("DETAIL:  ") {
                rest
            } else {
                // MariaDB's general log: `time<TAB>id Command<TAB>text`.
                line.rsplit('\t').next().unwrap_or(line)
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn check_fragments(case: &Case, source: &str, sent: &str, fragments: &[&str]) {
    let statements = statements_only(sent);
    for f in fragments {
        let (want, text) = f.split_at(1);
        let present = statements.contains(text);
        assert_eq!(
            present,
            want == "+",
            "{source}, case `{}`: expected the received SQL {} `{text}`; received:\n{sent}",
            case.name,
            if want == "+" {
                "to contain"
            } else {
                "not to contain"
            }
        );
    }
}

#[test]
fn conformance_suite_on_postgres_mariadb_sqlserver_and_mongodb() {
    let Some(f) = Fixture::new("conformance") else {
        return;
    };
    load_conformance(&f);
    let n = &f.name;
    // Basin's own answers: the same rows copied into Iceberg (a plain scan of each source).
    f.ok(&format!(
        "CREATE SCHEMA lake.{n}; \
         CREATE TABLE lake.{n}.items AS SELECT * FROM pg.{n}.items; \
         CREATE TABLE lake.{n}.cats AS SELECT * FROM pg.{n}.cats"
    ));
    assert_eq!(
        f.ok(&format!(
            "SELECT count(*) FROM lake.{n}.items UNION ALL SELECT count(*) FROM my.{n}.items"
        )),
        "count(*)\n40\n40\n"
    );
    for case in CASES {
        let want = f
            .ok(&case.sql.replace("{t}", &format!("lake.{n}")))
            .replace(&format!("lake.{n}."), "lake.");
        for (catalog, log, fragments) in [
            ("pg", &f.s.pg_log, case.pg),
            ("my", &f.s.my_log, case.my),
            ("ms", &f.s.ms_log, case.ms),
            ("mg", &f.s.mg_log, case.mg),
        ] {
            let sql = case.sql.replace("{t}", &format!("{catalog}.{n}"));
            let (got, sent) = f.traced(log, &sql);
            let sent = if catalog == "mg" {
                mongo_commands(&sent)
            } else {
                sent
            };
            let got = got.replace(&format!("{catalog}.{n}."), "lake.");
            assert_eq!(got, want, "{catalog}, case `{}`: {sql}", case.name);
            check_fragments(case, catalog, &sent, fragments);
        }
    }
}

#[test]
fn aggregate_is_one_remote_query_and_explain_shows_it() {
    let Some(f) = Fixture::new("aggregate") else {
        return;
    };
    load_conformance(&f);
    let n = &f.name;
    let (out, sent) = f.traced(
        &f.s.pg_log,
        &format!("SELECT sum(qty), count(*) FROM pg.{n}.items"),
    );
    assert_eq!(out, format!("sum(pg.{n}.items.qty),count(*)\n10340,40\n"));
    let copies: Vec<&str> = sent.lines().filter(|l| l.contains("COPY")).collect();
    assert_eq!(copies.len(), 1, "{sent}");
    assert!(
        copies[0].contains("sum(\"items\".\"qty\")") && copies[0].contains("count(1)"),
        "{sent}"
    );
    let plan = f.ok(&format!(
        "EXPLAIN SELECT sum(qty) FROM pg.{n}.items WHERE grp = 3"
    ));
    assert!(
        plan.contains("RemoteScanExec: source=pg")
            && plan.contains(&format!("FROM \"\"{n}\"\".\"\"items\"\"")),
        "{plan}"
    );
}

#[test]
fn hostile_strings_are_literals_everywhere() {
    let Some(f) = Fixture::new("hostile") else {
        return;
    };
    let n = &f.name;
    let hostile: Vec<String> = vec![
        "x\\' OR 1=1) --".into(),
        "' OR '1'='1".into(),
        "'; DROP TABLE h; --".into(),
        "\\".into(),
        "\\\\'".into(),
        "a''b".into(),
        "/* open comment".into(),
        "-- dash comment".into(),
        "# hash comment".into(),
        "$$dollar$$".into(),
        "\"double\" `back`".into(),
        "ünï¢ødé 🦀 \u{202e}rtl".into(),
        "new\nline\ttab\r".into(),
        "%_\\%".into(),
        "x".repeat(1 << 20),
    ];
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let pg_values: Vec<String> = hostile
        .iter()
        .enumerate()
        .map(|(i, s)| format!("({i}, convert_from(decode('{}', 'hex'), 'UTF8'))", hex(s)))
        .collect();
    f.pg(&format!(
        "CREATE TABLE h (id int PRIMARY KEY, s text NOT NULL); INSERT INTO h VALUES {}",
        pg_values.join(", ")
    ));
    let my_values: Vec<String> = hostile
        .iter()
        .enumerate()
        .map(|(i, s)| format!("({i}, CONVERT(X'{}' USING utf8mb4))", hex(s)))
        .chain(std::iter::once(format!(
            "({}, CONVERT(X'610062' USING utf8mb4))",
            hostile.len()
        )))
        .collect();
    f.my(&format!(
        "CREATE TABLE h (id int PRIMARY KEY, s longtext COLLATE utf8mb4_nopad_bin NOT NULL) \
         DEFAULT CHARSET utf8mb4; INSERT INTO h VALUES {}",
        my_values.join(", ")
    ));
    let ms_values: Vec<String> = hostile
        .iter()
        .enumerate()
        .map(|(i, s)| format!("({i}, N'{}')", s.replace('\'', "''")))
        .collect();
    f.ms(&format!(
        "CREATE TABLE {{s}}.h (id int PRIMARY KEY, s nvarchar(max) NOT NULL); \
         INSERT INTO {{s}}.h VALUES {}",
        ms_values.join(", ")
    ));
    let docs: Vec<bson::Document> = hostile
        .iter()
        .enumerate()
        .map(|(i, s)| bson::doc! { "_id": i as i64, "id": i as i32, "s": s.as_str() })
        .collect();
    f.mg(|db| async move {
        db.collection::<bson::Document>("h")
            .insert_many(docs)
            .await
            .unwrap()
    });
    f.declare_mg("h", &["_id bigint", "id int", "s string"]);
    f.ok(&format!(
        "CREATE SCHEMA lake.{n}; CREATE TABLE lake.{n}.h AS SELECT * FROM my.{n}.h"
    ));
    let lit = |s: &str| format!("'{}'", s.replace('\'', "''"));
    let mut queries: Vec<String> = hostile
        .iter()
        .flat_map(|s| {
            [
                format!("SELECT id FROM {{t}}.h WHERE s = {} ORDER BY id", lit(s)),
                format!(
                    "SELECT id FROM {{t}}.h WHERE s IN ({}, 'zz') OR s <> s ORDER BY id",
                    lit(s)
                ),
            ]
        })
        .collect();
    queries.push("SELECT id FROM {t}.h WHERE s LIKE '%OR%' ORDER BY id".into());
    queries.push("SELECT id FROM {t}.h WHERE s LIKE '\\%%' ORDER BY id".into());
    queries.push(format!(
        "SELECT count(*) FROM {{t}}.h WHERE s = {}",
        lit(&"ab'c".repeat(300_000))
    ));
    // All statements in one run per catalog; the outputs must be identical.
    let script = |t: &str| {
        queries
            .iter()
            .map(|q| q.replace("{t}", t))
            .collect::<Vec<_>>()
            .join(";\n")
    };
    let want = f.ok(&script(&format!("lake.{n}")));
    for (catalog, log, marker) in [
        ("pg", &f.s.pg_log, "E'x\\\\'' OR 1=1) --'"),
        ("my", &f.s.my_log, "X'785C27204F5220313D3129202D2D'"),
        // SQL Server's equality is looser (padding, case): pushed, and checked in Basin.
        ("ms", &f.s.ms_log, "N'x\\'' OR 1=1) --'"),
        // MongoDB: values travel as BSON strings, never as text to parse.
        ("mg", &f.s.mg_log, "\"s\":{\"$eq\":\"x\\\\' OR 1=1) --\"}"),
    ] {
        let (got, sent) = f.traced(log, &script(&format!("{catalog}.{n}")));
        let sent = if catalog == "mg" {
            mongo_commands(&sent)
        } else {
            sent
        };
        assert_eq!(got, want, "{catalog}");
        // The predicates were pushed, with the literals rendered safely.
        assert!(
            sent.contains(marker),
            "{catalog}: {marker} not in\n{sent:.3000}"
        );
    }
    // NUL: PostgreSQL cannot hold it (the predicate stays in Basin); MariaDB can.
    let nul = "SELECT id FROM {t}.h WHERE s = 'a' || chr(0) || 'b' ORDER BY id";
    assert_eq!(f.ok(&nul.replace("{t}", &format!("pg.{n}"))), "id\n");
    assert_eq!(f.ok(&nul.replace("{t}", &format!("ms.{n}"))), "id\n");
    assert_eq!(f.ok(&nul.replace("{t}", &format!("mg.{n}"))), "id\n");
    assert_eq!(
        f.ok(&nul.replace("{t}", &format!("my.{n}"))),
        format!("id\n{}\n", hostile.len())
    );
    // No side effects: the tables are whole and alone.
    assert_eq!(
        f.pg("SELECT count(*) FROM h").trim(),
        hostile.len().to_string()
    );
    assert_eq!(
        f.pg(&format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{n}'"
        ))
        .trim(),
        "1"
    );
    assert_eq!(
        f.my("SELECT count(*) FROM h").trim(),
        (hostile.len() + 1).to_string()
    );
    assert_eq!(
        f.ms("SELECT count(*) FROM {s}.h").trim(),
        hostile.len().to_string()
    );
    let (count, collections) = f.mg(|db| async move {
        let count = db
            .collection::<bson::Document>("h")
            .count_documents(bson::doc! {})
            .await
            .unwrap();
        (count, db.list_collection_names().await.unwrap())
    });
    assert_eq!(count as usize, hostile.len());
    assert_eq!(collections, ["h"]);
    assert_eq!(
        f.my(&format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{n}'"
        ))
        .trim(),
        "1"
    );
}

#[test]
fn postgres_type_matrix() {
    let Some(f) = Fixture::new("pgtypes") else {
        return;
    };
    let n = &f.name;
    f.pg("CREATE TYPE mood AS ENUM ('sad', 'happy'); \
         CREATE TABLE t (i2 smallint, i4 int, i8 bigint, n numeric(12,3), nu numeric, \
           r real, d double precision, b boolean, tx text, vc varchar(5), ch char(3), \
           by bytea, dt date, tm time, ts timestamp, tz timestamptz, iv interval, u uuid, \
           js json, jb jsonb, ai int[], at text[], e mood, ip inet, m money); \
         INSERT INTO t VALUES (-2, 4, 8000000000, 12345.678, 1.5, 1.25, -2.5, true, 'tëxt', \
           'vc', 'ab', '\\x00ff', '2024-02-29', '13:14:15.5', '2024-02-29 13:14:15.123456', \
           '2024-02-29 13:14:15+02', '1 mon 2 days 03:00:00', \
           'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"a\": 1}', '{\"b\": 2}', '{1,NULL,3}', \
           '{x,y}', 'happy', '10.0.0.1/8', 12.34); \
         INSERT INTO t DEFAULT VALUES");
    let out = f.ok(&format!(
        "SELECT i2, i4, i8, n, nu, r, d, b, tx, vc, ch, by, dt, tm, ts, tz, iv, u, js, jb, \
           e, ip, m \
         FROM pg.{n}.t ORDER BY i2 NULLS LAST"
    ));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "i2,i4,i8,n,nu,r,d,b,tx,vc,ch,by,dt,tm,ts,tz,iv,u,js,jb,e,ip,m"
    );
    assert_eq!(
        lines[1],
        "-2,4,8000000000,12345.678,1.5000000000,1.25,-2.5,true,tëxt,vc,ab,00ff,2024-02-29,\
         13:14:15.500,2024-02-29T13:14:15.123456,2024-02-29T11:14:15Z,\
         1 mons 2 days 3 hours,a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,\"{\"\"a\"\": 1}\",\
         \"{\"\"b\"\": 2}\",happy,10.0.0.1/8,12.34"
    );
    assert_eq!(lines[2], ",".repeat(22));
    // Arrays become lists (CSV cannot print them: JSON).
    let out = Command::new(env!("CARGO_BIN_EXE_basin"))
        .args(["standalone", "--format", "json", "--config"])
        .arg(&f.config)
        .args([
            "-e",
            &format!("SELECT ai, at FROM pg.{n}.t ORDER BY i2 NULLS LAST"),
        ])
        .env("BASIN_DATA_DIR", f.dir.join("data"))
        .run_within();
    let json = stdout(&out);
    assert!(
        json.contains("[1,null,3]") && json.contains("[\"x\",\"y\"]"),
        "{json}{}",
        stderr(&out)
    );
    let schema = f.ok(&format!("DESCRIBE pg.{n}.t"));
    for want in [
        "n,\"Decimal128(12, 3)\"",
        "nu,\"Decimal128(38, 10)\"",
        "tz,\"Timestamp(µs, \"\"UTC\"\")\"",
        "ai,List(Int32)",
        "iv,Interval(MonthDayNano)",
    ] {
        assert!(schema.contains(want), "{want} not in\n{schema}");
    }
}

#[test]
fn mysql_type_matrix() {
    let Some(f) = Fixture::new("mytypes") else {
        return;
    };
    let n = &f.name;
    f.my(
        "CREATE TABLE t (ti tinyint, tu tinyint unsigned, b1 tinyint(1), si smallint, \
           mi mediumint, i int, iu int unsigned, bi bigint, bu bigint unsigned, \
           de decimal(10,4), f float, d double, bt bit(4), ch char(3), vc varchar(10), \
           tx text, bn binary(2), vb varbinary(4), bl blob, dt date, dtm datetime(6), \
           tsp timestamp(3) NULL, tm time, y year, e enum('s','m'), st set('a','b'), j json); \
         SET time_zone = '+00:00'; \
         INSERT INTO t VALUES (-1, 255, 1, -300, 70000, -5, 4000000000, -9000000000, \
           18446744073709551615, 123.4567, 1.5, -2.25, b'1010', 'ab', 'vc', 'tëxt', \
           X'00FF', X'0102', X'03', '2024-02-29', '2024-02-29 13:14:15.123456', \
           '2024-02-29 13:14:15.123', '13:14:15', 2024, 'm', 'a,b', '{\"a\": 1}'); \
         INSERT INTO t () VALUES ()",
    );
    let out = f.ok(&format!("SELECT * FROM my.{n}.t ORDER BY ti NULLS LAST"));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1],
        "-1,255,true,-300,70000,-5,4000000000,-9000000000,18446744073709551615,123.4567,1.5,\
         -2.25,10,ab,vc,tëxt,00ff,0102,03,2024-02-29,2024-02-29T13:14:15.123456,\
         2024-02-29T13:14:15.123Z,13:14:15,2024,m,\"a,b\",\"{\"\"a\"\": 1}\"",
        "{out}"
    );
    assert_eq!(lines[2], ",".repeat(26), "{out}");
}

/// Starts `basin scheduler` and two `basin executor` processes with `config`.
pub(crate) struct Cluster {
    children: Vec<Child>,
    flight: u16,
}

impl Cluster {
    pub(crate) fn start(dir: &Path, config: &Path) -> Self {
        let port = |_: ()| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (scheduler, flight) = (port(()), port(()));
        let bin = env!("CARGO_BIN_EXE_basin");
        let data = dir.join("cluster-data");
        let spawn = |args: Vec<String>, log: &str| {
            let log = std::fs::File::create(dir.join(log)).unwrap();
            Command::new(bin)
                .args(args)
                .arg("--config")
                .arg(config)
                .arg("--data-dir")
                .arg(&data)
                .env_remove("BASIN_CONFIG")
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("start basin")
        };
        let mut children = vec![spawn(
            vec![
                "scheduler".into(),
                "--port".into(),
                scheduler.to_string(),
                "--flight-sql-port".into(),
                flight.to_string(),
            ],
            "scheduler.log",
        )];
        for i in 0..2 {
            children.push(spawn(
                vec![
                    "executor".into(),
                    "--scheduler".into(),
                    format!("127.0.0.1:{scheduler}"),
                    "--task-slots".into(),
                    "2".into(),
                ],
                &format!("executor-{i}.log"),
            ));
        }
        Self { children, flight }
    }

    pub(crate) fn sql(&self, sql: &str) -> Output {
        Command::new(env!("CARGO_BIN_EXE_basin"))
            .args([
                "sql",
                &format!("grpc://127.0.0.1:{}", self.flight),
                "--format",
                "csv",
                "-e",
                sql,
            ])
            .run_within()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn sqlserver_type_matrix() {
    let Some(f) = Fixture::new("mstypes") else {
        return;
    };
    let n = &f.name;
    f.ms(
        "CREATE TABLE {s}.t (k int PRIMARY KEY, b bit, ti tinyint, si smallint, i int, \
           bi bigint, de decimal(12,4), nu numeric(38,0), mo money, sm smallmoney, fl float, \
           re real, dt date, tm time(3), dtm datetime, dt2 datetime2(6), sdt smalldatetime, \
           dto datetimeoffset(3), ch char(3), vc varchar(10), nc nchar(2), nv nvarchar(max), \
           bn binary(2), vb varbinary(max), u uniqueidentifier, x xml); \
         INSERT INTO {s}.t VALUES (1, 1, 255, -300, -5, -9000000000, 123.4567, \
           12345678901234567890123456789012345678, 922337203685477.5807, -214748.3648, -2.25, \
           1.5, '2024-02-29', '13:14:15.123', '2024-02-29 13:14:15.120', \
           '2024-02-29 13:14:15.123456', '2024-02-29 13:14', '2024-02-29 13:14:15.123 +02:00', \
           'ab', 'vc', N'ñ', N'tëxt 🦀', 0x00FF, 0x0102, \
           '6F9619FF-8B86-D011-B42D-00C04FC964FF', '<a>1</a>'); \
         INSERT INTO {s}.t (k) VALUES (2)",
    );
    let out = f.ok(&format!("SELECT * FROM ms.{n}.t ORDER BY k"));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1],
        "1,true,255,-300,-5,-9000000000,123.4567,12345678901234567890123456789012345678,\
         922337203685477.5807,-214748.3648,-2.25,1.5,2024-02-29,13:14:15.123,\
         2024-02-29T13:14:15.120,2024-02-29T13:14:15.123456,2024-02-29T13:14:00,\
         2024-02-29T11:14:15.123Z,ab ,vc,ñ ,tëxt 🦀,00ff,0102,\
         6F9619FF-8B86-D011-B42D-00C04FC964FF,<a>1</a>",
        "{out}"
    );
    assert_eq!(lines[2], format!("2{}", ",".repeat(25)), "{out}");
    // The schema Basin reports, and a key-range split read giving the same rows.
    let described = f.ok(&format!("DESCRIBE ms.{n}.t"));
    for (column, arrow) in [
        ("mo", "Decimal128(19, 4)"),
        ("dto", "Timestamp(µs, \"\"UTC\"\")"),
        ("u", "Utf8"),
    ] {
        assert!(
            described
                .lines()
                .any(|l| l.starts_with(&format!("{column},")) && l.contains(arrow)),
            "{column} as {arrow}:\n{described}"
        );
    }
}

#[test]
fn sqlserver_large_scans_split_by_key_and_aggregate_in_the_source() {
    let Some(f) = Fixture::new("mssplits") else {
        return;
    };
    let n = &f.name;
    f.ms(
        "CREATE TABLE {s}.o (id bigint PRIMARY KEY, nation int NOT NULL, amount decimal(10,2) NOT NULL); \
         WITH d AS (SELECT 0 AS x UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
           UNION ALL SELECT 8 UNION ALL SELECT 9), \
         g AS (SELECT a.x + 10 * b.x + 100 * c.x + 1000 * e.x + 10000 * h.x AS v \
           FROM d a, d b, d c, d e, d h) \
         INSERT INTO {s}.o SELECT v + 1, v % 25, (v % 1000) * 1.25 FROM g",
    );
    let (out, sent) = f.traced(
        &f.s.ms_log,
        &format!(
            "SELECT count(*) AS n, sum(amount) AS s, min(id) AS lo, max(id) AS hi \
             FROM ms.{n}.o WHERE nation <> 3"
        ),
    );
    // Python: sum((v % 1000) * 1.25 for v in range(100000) if v % 25 != 3)
    assert_eq!(out, "n,s,lo,hi\n96000,59985000.00,1,100000\n", "{out}");
    assert!(
        statements_only(&sent).contains("sum([o].[amount])"),
        "the aggregate runs in SQL Server: {sent}"
    );
    // A plain scan reads in key ranges, one statement per split.
    let plan = f.ok(&format!("EXPLAIN SELECT id, amount FROM ms.{n}.o"));
    assert!(plan.contains("ranges of id"), "{plan}");
    let (out, sent) = f.traced(
        &f.s.ms_log,
        // length() is not pushed: the table is read whole, in key ranges.
        &format!(
            "SELECT count(*) AS n, count(DISTINCT id) AS d FROM ms.{n}.o \
             WHERE length(CAST(amount AS VARCHAR)) > 0"
        ),
    );
    assert_eq!(out, "n,d\n100000,100000\n");
    let ranged = statements_only(&sent)
        .lines()
        .filter(|l| l.contains("[id] >=") || l.contains("[id] <"))
        .count();
    assert!(ranged >= 2, "{sent}");
}

#[test]
fn sqlserver_tls_modes() {
    let Some(f) = Fixture::new("mstls") else {
        return;
    };
    let n = &f.name;
    let Some(ca) = std::env::var("BASIN_TEST_SQLSERVER_CA")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        assert!(!in_ci(), "BASIN_TEST_SQLSERVER_CA is not set");
        eprintln!("sqlserver_tls_modes: skipped: BASIN_TEST_SQLSERVER_CA is not set");
        return;
    };
    f.ms("CREATE TABLE {s}.t (id int PRIMARY KEY); INSERT INTO {s}.t VALUES (1), (2)");
    let run = |tls: &str, extra: &str| {
        let config = f.dir.join(format!("tls-{tls}.toml"));
        std::fs::write(
            &config,
            format!(
                "[catalogs.ms]\nconnector = \"sqlserver\"\nurl = \"{}\"\ntls = \"{tls}\"\n{extra}",
                f.s.ms_url
            ),
        )
        .unwrap();
        Command::new(env!("CARGO_BIN_EXE_basin"))
            .args(["standalone", "--format", "csv", "--config"])
            .arg(&config)
            .args(["-e", &format!("SELECT count(*) AS n FROM ms.{n}.t")])
            .env_remove("BASIN_CONFIG")
            .env("BASIN_DATA_DIR", f.dir.join("data"))
            .run_within()
    };
    for (tls, extra) in [
        ("disable", String::new()),
        ("require", String::new()),
        ("verify-full", format!("tls_ca_file = \"{ca}\"\n")),
    ] {
        let out = run(tls, &extra);
        assert!(out.status.success(), "tls = {tls}: {}", stderr(&out));
        assert_eq!(stdout(&out), "n\n2\n", "tls = {tls}");
    }
    // A certificate no trusted CA signed fails, naming the source and never the password.
    let out = run("verify-full", "");
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("sqlserver source `ms`"), "{err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    assert!(!err.contains("Basin-Passw0rd"), "{err}");
}

/// Unquoted names are folded to lower case by SQL: each source's own spelling is found when
/// exactly one name matches ignoring case (Oracle's upper-case catalogs, SQL Server's and
/// MongoDB's mixed-case names), and two that differ only in case must be quoted.
#[test]
fn unquoted_names_find_each_sources_spelling() {
    let Some(f) = Fixture::new("folding") else {
        return;
    };
    let n = &f.name;
    f.pg(
        "CREATE TABLE \"Orders\" (id int); INSERT INTO \"Orders\" VALUES (1), (2); \
         CREATE TABLE \"Dup\" (id int); CREATE TABLE \"DUP\" (id int)",
    );
    f.ms("CREATE TABLE {s}.LineItems (id int PRIMARY KEY); INSERT INTO {s}.LineItems VALUES (7)");
    f.mg(|db| async move {
        db.collection::<bson::Document>("orderItems")
            .insert_one(bson::doc! { "_id": 1, "qty": 3 })
            .await
            .unwrap()
    });
    assert_eq!(
        f.ok(&format!(
            "SELECT * FROM (SELECT count(*) AS c FROM pg.{n}.orders UNION ALL \
             SELECT sum(id) FROM ms.{n}.lineitems UNION ALL \
             SELECT sum(qty) FROM mg.{n}.orderitems) ORDER BY c"
        )),
        "c\n2\n3\n7\n"
    );
    // The quoted spelling still names exactly one table; an ambiguous one names none.
    assert_eq!(
        f.ok(&format!("SELECT count(*) AS c FROM pg.{n}.\"DUP\"")),
        "c\n0\n"
    );
    let out = f.run(&format!("SELECT count(*) FROM pg.{n}.dup"));
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
}

/// The places where a pushed query used to answer differently from Basin (issue 33): each
/// query is answered by the source and by Basin over an Iceberg copy, and must agree.
#[test]
fn pushed_queries_answer_as_basin_does() {
    let Some(f) = Fixture::new("exact") else {
        return;
    };
    let n = &f.name;
    f.pg(
        "CREATE TABLE pad (id int PRIMARY KEY, name text NOT NULL, v numeric(12,2) NOT NULL, a int NOT NULL); \
         INSERT INTO pad VALUES (1, 'abc', 1.00, 50000), (2, 'abc ', 2.00, 3), (3, 'ABC', 2.00, 7)",
    );
    f.my(
        "CREATE TABLE pad (id int PRIMARY KEY, name varchar(10) COLLATE utf8mb4_bin NOT NULL, \
           v decimal(12,2) NOT NULL, a int NOT NULL) DEFAULT CHARSET utf8mb4; \
         INSERT INTO pad VALUES (1, 'abc', 1.00, 50000), (2, 'abc ', 2.00, 3), (3, 'ABC', 2.00, 7)",
    );
    f.ms(
        "CREATE TABLE {s}.pad (id int PRIMARY KEY, name varchar(10) NOT NULL, \
           v decimal(12,2) NOT NULL, a int NOT NULL); \
         INSERT INTO {s}.pad VALUES (1, 'abc', 1.00, 50000), (2, 'abc ', 2.00, 3), (3, 'ABC', 2.00, 7)",
    );
    f.mg(|db| async move {
        let dec = |s: &str| s.parse::<bson::Decimal128>().unwrap();
        db.collection::<bson::Document>("pad")
            .insert_many([
                bson::doc! { "_id": 1, "id": 1, "name": "abc", "v": dec("1.00"), "a": 50000 },
                bson::doc! { "_id": 2, "id": 2, "name": "abc ", "v": dec("2.00"), "a": 3 },
                bson::doc! { "_id": 3, "id": 3, "name": "ABC", "v": dec("2.00"), "a": 7 },
            ])
            .await
            .unwrap()
    });
    f.declare_mg(
        "pad",
        &[
            "_id int",
            "id int",
            "name string",
            "v decimal(12,2)",
            "a int",
        ],
    );
    f.ok(&format!(
        "CREATE SCHEMA lake.{n}; CREATE TABLE lake.{n}.pad AS SELECT * FROM pg.{n}.pad"
    ));
    for sql in [
        "SELECT id FROM {t}.pad WHERE name = 'abc' ORDER BY id",
        "SELECT name, count(*) AS c FROM {t}.pad GROUP BY name ORDER BY name",
        "SELECT count(DISTINCT name) AS d FROM {t}.pad",
        "SELECT max(name) AS m, min(name) AS l FROM {t}.pad",
        "SELECT avg(v) AS a FROM {t}.pad",
        "SELECT sum(v) / count(*) AS a FROM {t}.pad",
        "SELECT sum(a) AS s, avg(a) AS m FROM {t}.pad",
        "SELECT id FROM {t}.pad WHERE name <> 'abc' ORDER BY id",
    ] {
        let want = f.ok(&sql.replace("{t}", &format!("lake.{n}")));
        for catalog in ["pg", "my", "ms", "mg"] {
            let got = f.ok(&sql.replace("{t}", &format!("{catalog}.{n}")));
            assert_eq!(got, want, "{catalog}: {sql}");
        }
    }
    // NOT IN over a remote subquery reads the source once: two reads are two statements
    // that could see different rows (no snapshot is shared between them).
    let (got, sent) = f.traced(
        &f.s.pg_log,
        &format!(
            "SELECT id FROM pg.{n}.pad WHERE a NOT IN (SELECT a FROM pg.{n}.pad WHERE id > 1) \
             ORDER BY id"
        ),
    );
    assert_eq!(got, "id\n1\n");
    let reads = statements_only(&sent)
        .lines()
        .filter(|l| l.contains("COPY ("))
        .count();
    assert_eq!(
        reads, 2,
        "the subquery and the outer scan, once each:\n{sent}"
    );
    // A product that overflows a 4-byte integer at the source is computed by Basin.
    let sql = "SELECT CAST(a AS BIGINT) * a AS p FROM {t}.pad ORDER BY id";
    let want = f.ok(&sql.replace("{t}", &format!("lake.{n}")));
    assert_eq!(want, "p\n2500000000\n9\n49\n");
    for catalog in ["pg", "my", "ms"] {
        let got = f.ok(&sql.replace("{t}", &format!("{catalog}.{n}")));
        assert_eq!(got, want, "{catalog}: {sql}");
    }
}

#[test]
fn cross_source_join_runs_on_the_executors() {
    let Some(f) = Fixture::new("cluster") else {
        return;
    };
    let n = &f.name;
    // Enough PostgreSQL rows for several ctid splits (split_size_bytes = 1 MiB).
    f.pg(
        "CREATE TABLE orders AS SELECT g AS id, g % 25 AS nation, (g % 1000)::numeric(10,2) AS amount \
         FROM generate_series(1, 200000) g; ANALYZE orders",
    );
    f.my(
        "CREATE TABLE nations (id int PRIMARY KEY, label varchar(20)); \
         INSERT INTO nations VALUES (0, 'n0'), (1, 'n1'), (2, 'n2'), (3, 'n3'), (24, 'n24')",
    );
    let cluster = Cluster::start(&f.dir, &f.config);
    let sql = format!(
        "SELECT t.n_name, m.label, count(*) AS orders, sum(o.amount) AS total \
         FROM pg.{n}.orders o JOIN my.{n}.nations m ON o.nation = m.id \
         JOIN tpch.tiny.nation t ON t.n_nationkey = m.id \
         GROUP BY t.n_name, m.label ORDER BY t.n_name"
    );
    let before = std::fs::metadata(&f.s.pg_log).map(|m| m.len()).unwrap_or(0);
    let mut out = cluster.sql(&sql);
    for _ in 0..100 {
        if out.status.success() {
            break;
        }
        // The executors may still be registering.
        std::thread::sleep(Duration::from_millis(200));
        out = cluster.sql(&sql);
    }
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "n_name,label,orders,total\n\
         ALGERIA,n0,8000,3900000.00\n\
         ARGENTINA,n1,8000,3908000.00\n\
         BRAZIL,n2,8000,3916000.00\n\
         CANADA,n3,8000,3924000.00\n\
         UNITED STATES,n24,8000,4092000.00\n"
    );
    std::thread::sleep(Duration::from_millis(300));
    let log = log_since(&f.s.pg_log, before);
    let copies: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("COPY") && l.contains(n.as_str()))
        .collect();
    assert!(copies.len() >= 2, "expected ctid splits:\n{log}");
    assert!(
        copies.iter().all(|l| l.contains("basin executor: ")),
        "splits not read by executors:\n{}",
        copies.join("\n")
    );
    assert!(
        copies.iter().all(|l| l.contains("ctid")),
        "{}",
        copies.join("\n")
    );

    // One stage (a full extraction): the ctid splits run on both executors and stream back
    // over Flight as they are read, without a Ballista job or shuffle files.
    let before = std::fs::metadata(&f.s.pg_log).map(|m| m.len()).unwrap_or(0);
    let out = cluster.sql(&format!("SELECT id, amount FROM pg.{n}.orders"));
    assert!(out.status.success(), "{}", stderr(&out));
    let rows = stdout(&out);
    assert_eq!(rows.lines().count(), 200_001, "header + 200000 rows");
    assert!(rows.lines().any(|l| l == "200000,0.00"), "last row missing");
    std::thread::sleep(Duration::from_millis(300));
    let log = log_since(&f.s.pg_log, before);
    let copies: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("COPY") && l.contains("ctid") && l.contains(n.as_str()))
        .collect();
    assert!(
        copies.len() >= 2 && copies.iter().all(|l| l.contains("basin executor: ")),
        "expected ctid splits read by executors:\n{log}"
    );
    for i in 0..2 {
        let log = std::fs::read_to_string(f.dir.join(format!("executor-{i}.log"))).unwrap();
        assert!(
            log.contains("streaming a stage partition"),
            "executor {i} streamed no partition:\n{log}"
        );
    }

    // MariaDB: a table larger than split_size_bytes is read in primary-key ranges.
    f.my(
        "CREATE TABLE events (id int PRIMARY KEY, nation int, pad varchar(64)); \
         INSERT INTO events SELECT seq, seq % 25, repeat('x', 60) FROM seq_1_to_60000; \
         ANALYZE TABLE events",
    );
    let before = std::fs::metadata(&f.s.my_log).map(|m| m.len()).unwrap_or(0);
    let out = cluster.sql(&format!(
        "SELECT count(*) AS n, sum(e.nation) AS s FROM my.{n}.events e \
         JOIN tpch.tiny.nation t ON t.n_nationkey = e.nation"
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "n,s\n60000,720000\n");
    // The general log is written asynchronously: wait for the splits' statements.
    let range_lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("events") && (l.contains("`id` >=") || l.contains("`id` <")))
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut log = log_since(&f.s.my_log, before);
    while range_lines(&log) < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        log = log_since(&f.s.my_log, before);
    }
    let ranges = range_lines(&log);
    assert!(ranges >= 2, "expected primary-key range splits:\n{log}");

    // SQL Server beside PostgreSQL, MariaDB and an Iceberg table, in one distributed query.
    f.ms(
        "CREATE TABLE {s}.regions (nation int PRIMARY KEY, region nvarchar(20) NOT NULL); \
         INSERT INTO {s}.regions VALUES (0, N'africa'), (1, N'america'), (2, N'america'), \
           (3, N'america'), (24, N'america')",
    );
    for sql in [
        format!("CREATE SCHEMA lake.{n}"),
        format!(
            "CREATE TABLE lake.{n}.weights AS SELECT * FROM (VALUES ('africa', 2), ('america', 3)) \
             AS v(region, w)"
        ),
    ] {
        let out = cluster.sql(&sql);
        assert!(out.status.success(), "{sql}: {}", stderr(&out));
    }
    let before = std::fs::metadata(&f.s.ms_log).map(|m| m.len()).unwrap_or(0);
    let out = cluster.sql(&format!(
        "SELECT r.region, count(*) AS orders, sum(o.amount * w.w) AS weighted \
         FROM pg.{n}.orders o JOIN ms.{n}.regions r ON o.nation = r.nation \
         JOIN my.{n}.nations m ON m.id = r.nation JOIN lake.{n}.weights w ON w.region = r.region \
         GROUP BY r.region ORDER BY r.region"
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "region,orders,weighted\nafrica,8000,7800000.00\namerica,32000,47520000.00\n"
    );
    std::thread::sleep(Duration::from_millis(300));
    let log = log_since(&f.s.ms_log, before);
    assert!(
        log.lines()
            .any(|l| l.contains("sql_batch") && l.contains("[regions]")),
        "SQL Server was not read:\n{log}"
    );

    // MongoDB joins them too: its pipeline runs on an executor (the command's comment names
    // the Basin process that sent it).
    f.mg(|db| async move {
        db.collection::<bson::Document>("targets")
            .insert_many([
                bson::doc! { "_id": "africa", "target": 5000 },
                bson::doc! { "_id": "america", "target": 40000 },
            ])
            .await
            .unwrap()
    });
    let before = std::fs::metadata(&f.s.mg_log).map(|m| m.len()).unwrap_or(0);
    let out = cluster.sql(&format!(
        "SELECT r.region, count(*) AS orders, max(t.target) AS target, sum(w.w) AS w \
         FROM pg.{n}.orders o JOIN ms.{n}.regions r ON o.nation = r.nation \
         JOIN mg.{n}.targets t ON t._id = r.region JOIN lake.{n}.weights w ON w.region = r.region \
         GROUP BY r.region ORDER BY r.region"
    ));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "region,orders,target,w\nafrica,8000,5000,16000\namerica,32000,40000,96000\n"
    );
    std::thread::sleep(Duration::from_millis(300));
    let commands = mongo_commands(&log_since(&f.s.mg_log, before));
    assert!(
        commands
            .lines()
            .any(|l| l.contains("\"aggregate\":\"targets\"") && l.contains("basin executor split")),
        "MongoDB was not read by an executor:\n{commands}"
    );
}

#[test]
fn splits_log_in_with_cleartext_md5_and_scram_passwords() {
    let Some(f) = Fixture::new("logins") else {
        return;
    };
    let n = &f.name;
    // Several ctid splits (split_size_bytes = 1 MiB): one snapshot, sessions of their own.
    f.pg(
        "CREATE TABLE t AS SELECT g AS id, repeat(chr(65 + g % 26), g % 64) AS s \
         FROM generate_series(1, 60000) g; ANALYZE t",
    );
    let expected = f.pg("SELECT count(*), sum(id), sum(length(s)) FROM t");
    let expected = expected.trim().replace('|', ",");
    let trusted = std::fs::read_to_string(&f.config).unwrap();
    let sql = format!("SELECT count(*), sum(id), sum(length(s)) FROM (SELECT * FROM pg.{n}.t)");
    // The splits of a second query reuse the first one's sessions: server processes of the
    // first (all of them only when both ran their splits equally many at a time, which a
    // busy machine changes).
    let (out, sent) = f.traced(&f.s.pg_log, &format!("{sql}; {sql}"));
    assert_eq!(out.matches(expected.as_str()).count(), 2, "{out}");
    let pids: Vec<&str> = sent
        .lines()
        .filter(|l| l.contains("COPY"))
        .filter_map(|l| l.split('[').nth(1)?.split(']').next())
        .collect();
    let (first, second) = pids.split_at(pids.len() / 2);
    assert!(first.len() >= 2 && first.len() == second.len(), "{sent}");
    assert!(second.iter().any(|p| first.contains(p)), "{sent}");
    std::fs::write(&f.config, trusted).unwrap();
    let password = "p@ss w0rd:/%'#";
    let (_, host) = f.s.pg_url.split_once('@').expect("user@host in the URL");
    // (role, how the server stores its password, password in the URL or in `password`)
    let logins = [
        ("basin_plain", "scram-sha-256", false),
        ("basin_md5", "md5", true),
        ("basin_scram", "scram-sha-256", false),
        ("basin_scram", "scram-sha-256", true),
    ];
    for (role, stored, in_url) in logins {
        psql(
            &f.s.pg_url,
            &format!(
                "SET password_encryption = '{stored}'; \
                 DO $$ BEGIN CREATE ROLE {role} LOGIN; \
                 EXCEPTION WHEN duplicate_object THEN NULL; END $$; \
                 ALTER ROLE {role} PASSWORD '{}'; GRANT USAGE ON SCHEMA {n} TO {role}; \
                 GRANT SELECT ON {n}.t TO {role}",
                password.replace('\'', "''")
            ),
        );
        let url = if in_url {
            let encoded: String = password
                .bytes()
                .map(|b| match b {
                    b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
                    _ => format!("%{b:02X}"),
                })
                .collect();
            format!("postgres://{role}:{encoded}@{host}")
        } else {
            format!("postgres://{role}@{host}\"\npassword = \"{password}")
        };
        let config = format!(
            "[catalogs.pg]\nconnector = \"postgres\"\nurl = \"{url}\"\ntls = \"prefer\"\n\
             split_size_bytes = 1048576\nmax_splits = 4\n"
        );
        std::fs::write(&f.config, &config).unwrap();
        let (out, sent) = f.traced(&f.s.pg_log, &sql);
        assert_eq!(out.lines().nth(1), Some(expected.as_str()), "{role}: {out}");
        // The splits ran in sessions of their own: the snapshot and the COPY in one query.
        let copies: Vec<&str> = sent.lines().filter(|l| l.contains("COPY")).collect();
        assert!(
            copies.len() >= 2,
            "{role}: expected several splits:\n{sent}"
        );
        assert!(
            copies
                .iter()
                .all(|l| l.contains("SET TRANSACTION SNAPSHOT")),
            "{role}: splits did not read over their own sessions:\n{sent}"
        );
        // A wrong password is the server's refusal, naming the source, never the password.
        std::fs::write(&f.config, config.replace("w0rd", "nope")).unwrap();
        let out = f.run(&sql);
        let e = stderr(&out);
        assert!(
            !out.status.success(),
            "{role}: a wrong password was accepted (a PostgreSQL started by an older \
             .ci/services.sh trusts every role: `.ci/services.sh stop`, then start it again)"
        );
        assert!(
            e.contains("source `pg`")
                && e.contains(&format!("authentication failed for user \"{role}\"")),
            "{role}: {e}"
        );
        assert!(!e.contains("nope") && !e.contains("p%40ss"), "{role}: {e}");
    }
}

#[test]
fn unreachable_source_and_unknown_table_are_clear_errors() {
    let dir = scratch_dir("unreachable");
    let config = dir.join("basin.toml");
    std::fs::write(
        &config,
        "[catalogs.pg]\nconnector = \"postgres\"\nurl = \"postgres://u:sekrit@127.0.0.1:1/db\"\n\
         tls = \"disable\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_basin"))
        .args(["standalone", "--config"])
        .arg(&config)
        .args(["-e", "SELECT * FROM pg.public.t"])
        .env("BASIN_DATA_DIR", dir.join("data"))
        .run_within();
    assert!(!out.status.success());
    let e = stderr(&out);
    // The connection's failure, not "table not found"; never the password.
    assert!(
        e.contains("source `pg`") && e.contains("127.0.0.1:1") && !e.contains("sekrit"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn statement_timeout_stops_a_slow_remote_query_with_an_error_that_names_it() {
    let Some(f) = Fixture::new("timeout") else {
        return;
    };
    f.pg("CREATE VIEW slow AS SELECT 1 AS id FROM pg_sleep(30)");
    f.my("CREATE VIEW slow AS SELECT SLEEP(30) AS id");
    let config = std::fs::read_to_string(&f.config).unwrap().replace(
        "max_splits = 4\n",
        "max_splits = 4\nstatement_timeout_secs = 1\n",
    );
    std::fs::write(&f.config, config).unwrap();
    let n = &f.name;
    for catalog in ["pg", "my"] {
        let started = std::time::Instant::now();
        let out = f.run(&format!("SELECT * FROM {catalog}.{n}.slow"));
        let e = stderr(&out);
        assert!(!out.status.success(), "{catalog}: {}", stdout(&out));
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{catalog}: the limit did not stop the query ({:?})",
            started.elapsed()
        );
        assert!(
            e.contains(&format!("source `{catalog}`"))
                && e.contains(&format!(
                    "statement_timeout_secs = 1 in [catalogs.{catalog}]"
                )),
            "{catalog}: {e}"
        );
    }
    // Quick statements are not affected.
    f.pg("CREATE TABLE quick AS SELECT 7 AS id");
    f.my("CREATE TABLE quick AS SELECT 7 AS id");
    for catalog in ["pg", "my"] {
        assert_eq!(
            f.ok(&format!("SELECT id FROM {catalog}.{n}.quick")),
            "id\n7\n"
        );
    }
}
