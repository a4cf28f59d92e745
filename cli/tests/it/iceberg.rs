//! The embedded Iceberg catalog `lake` end to end through `basin standalone`: the seed
//! walk-through with time travel, partition pruning, bad input, `NOT NULL` columns, and a
//! statement killed between its file writes and its commit.

use std::path::Path;
use std::process::{Command, Output};

use crate::{RunWithin, scratch_dir, stderr, stdout};

/// Runs `basin standalone --format csv` on a data directory that outlives the call.
fn lake(data: &Path, sql: &str, envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_basin"));
    cmd.args(["standalone", "--format", "csv", "-e", sql])
        .env_remove("BASIN_CONFIG")
        .env("BASIN_DATA_DIR", data);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.run_within()
}

fn ok(data: &Path, sql: &str) -> String {
    let out = lake(data, sql, &[]);
    assert!(out.status.success(), "{sql}\n{}", stderr(&out));
    stdout(&out)
}

fn err(data: &Path, sql: &str) -> String {
    let out = lake(data, sql, &[]);
    assert!(
        !out.status.success(),
        "{sql} should fail:\n{}",
        stdout(&out)
    );
    stderr(&out)
}

/// `lake.s.t`'s snapshot count and row count, as `ok` prints them.
fn snapshots_and_rows(data: &Path) -> String {
    ok(
        data,
        "SELECT count(*) AS snapshots FROM lake.s.\"t$snapshots\"; \
         SELECT count(*) AS n FROM lake.s.t",
    )
}

#[test]
fn seed_walk_through_with_time_travel() {
    let data = scratch_dir("lake-seed");
    ok(
        &data,
        "CREATE SCHEMA lake.shop; \
         CREATE TABLE lake.shop.orders (id BIGINT, region VARCHAR, amount DECIMAL(10,2)) \
           WITH (partitioning = ARRAY['region']); \
         INSERT INTO lake.shop.orders VALUES (1, 'east', 120), (2, 'west', 80)",
    );
    // Files A and B, one snapshot.
    assert_eq!(
        ok(
            &data,
            "SELECT count(*) AS files FROM lake.shop.\"orders$files\""
        ),
        "files\n2\n"
    );
    assert_eq!(
        ok(&data, "SELECT sum(amount) AS total FROM lake.shop.orders"),
        "total\n200.00\n"
    );
    // File C.
    assert_eq!(
        ok(&data, "INSERT INTO lake.shop.orders VALUES (3, 'east', 50)"),
        "count\n1\n"
    );
    assert_eq!(
        ok(&data, "SELECT sum(amount) AS total FROM lake.shop.orders"),
        "total\n250.00\n"
    );
    let snapshots = ok(
        &data,
        "SELECT snapshot_id FROM lake.shop.\"orders$snapshots\" ORDER BY committed_at",
    );
    let ids: Vec<&str> = snapshots.lines().skip(1).collect();
    assert_eq!(ids.len(), 2, "{snapshots}");
    assert_eq!(
        ok(
            &data,
            &format!(
                "SELECT sum(amount) AS total FROM lake.shop.orders FOR VERSION AS OF {}",
                ids[0]
            )
        ),
        "total\n200.00\n"
    );
    // The history and refs agree.
    let history = ok(
        &data,
        "SELECT snapshot_id, is_current_ancestor FROM lake.shop.\"orders$history\"",
    );
    assert!(history.contains(&format!("{},true", ids[1])), "{history}");
    let refs = ok(
        &data,
        "SELECT name, type, snapshot_id FROM lake.shop.\"orders$refs\"",
    );
    assert_eq!(
        refs,
        format!("name,type,snapshot_id\nmain,BRANCH,{}\n", ids[1])
    );
    let ddl = ok(&data, "SHOW CREATE TABLE lake.shop.orders");
    assert!(
        ddl.contains("amount\"\" DECIMAL(10, 2)") && ddl.contains("partitioning = ARRAY['region']"),
        "{ddl}"
    );
    assert!(ok(&data, "SHOW SCHEMAS FROM lake").contains("shop"));
    // Before the first snapshot there is nothing to read.
    let e = err(
        &data,
        "SELECT * FROM lake.shop.orders FOR TIMESTAMP AS OF TIMESTAMP '2000-01-01 00:00:00'",
    );
    assert!(e.contains("no snapshot at or before 2000-01-01"), "{e}");
    // UPDATE one amount: the total changes in a new snapshot; time travel still sees 200
    // and 250.
    assert_eq!(
        ok(
            &data,
            "UPDATE lake.shop.orders SET amount = 100 WHERE id = 2"
        ),
        "count\n1\n"
    );
    assert_eq!(
        ok(&data, "SELECT sum(amount) AS total FROM lake.shop.orders"),
        "total\n270.00\n"
    );
    for (id, total) in [(ids[0], "200.00"), (ids[1], "250.00")] {
        assert_eq!(
            ok(
                &data,
                &format!(
                    "SELECT sum(amount) AS total FROM lake.shop.orders FOR VERSION AS OF {id}"
                )
            ),
            format!("total\n{total}\n")
        );
    }
    let _ = std::fs::remove_dir_all(&data);
}

/// MERGE into a partitioned table from VALUES: updates (one moving its row to another
/// partition), deletes and inserts in one snapshot; only the files with changed rows are
/// rewritten; mistakes are refused before anything runs.
#[test]
fn merge_updates_deletes_and_inserts_in_one_snapshot() {
    let data = scratch_dir("lake-merge");
    ok(
        &data,
        "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.t (id BIGINT, region VARCHAR, amount DOUBLE) \
           WITH (partitioning = ARRAY['region']); \
         INSERT INTO lake.s.t VALUES (1, 'east', 1.0), (2, 'west', 2.0), (3, 'east', 3.0), \
           (4, 'north', 4.0)",
    );
    let merge = "MERGE INTO lake.s.t AS t \
         USING (VALUES (1, 'south', 10.0), (3, 'east', 0.0), (5, 'west', 5.0), \
           (NULL, 'east', 6.0)) AS s(id, region, amount) \
         ON t.id = s.id \
         WHEN MATCHED AND s.amount = 0 THEN DELETE \
         WHEN MATCHED THEN UPDATE SET region = s.region, amount = t.amount + s.amount \
         WHEN NOT MATCHED THEN INSERT (id, region, amount) VALUES (s.id, s.region, s.amount)";
    assert_eq!(ok(&data, merge), "count\n4\n");
    assert_eq!(
        ok(
            &data,
            "SELECT id, region, amount FROM lake.s.t ORDER BY id NULLS LAST"
        ),
        "id,region,amount\n1,south,11.0\n2,west,2.0\n4,north,4.0\n5,west,5.0\n,east,6.0\n"
    );
    assert_eq!(
        ok(
            &data,
            "SELECT operation, summary['deleted-data-files'] AS removed \
             FROM lake.s.\"t$snapshots\" ORDER BY committed_at"
        ),
        "operation,removed\nappend,\noverwrite,1\n"
    );
    // Nothing matches and nothing is inserted: no snapshot.
    assert_eq!(
        ok(
            &data,
            "MERGE INTO lake.s.t t USING (SELECT 99 AS id) s ON t.id = s.id \
             WHEN MATCHED THEN DELETE"
        ),
        "count\n0\n"
    );
    assert_eq!(snapshots_and_rows(&data).lines().nth(1), Some("2"));
    // WHEN NOT MATCHED BY SOURCE: the rows the source lacks.
    assert_eq!(
        ok(
            &data,
            "MERGE INTO lake.s.t t USING (SELECT 2 AS id) s ON t.id = s.id \
             WHEN NOT MATCHED BY SOURCE AND t.region = 'west' THEN DELETE \
             WHEN NOT MATCHED BY SOURCE THEN UPDATE SET amount = 0"
        ),
        "count\n4\n"
    );
    assert_eq!(
        ok(
            &data,
            "SELECT id, amount FROM lake.s.t ORDER BY id NULLS LAST"
        ),
        "id,amount\n1,0.0\n2,2.0\n4,0.0\n,0.0\n"
    );
    // Refused, naming the problem.
    let e = err(
        &data,
        "MERGE INTO lake.s.t t USING (SELECT 1 AS id) s ON t.id = s.id \
         WHEN MATCHED THEN INSERT VALUES (1, 'x', 1.0)",
    );
    assert!(e.contains("INSERT is not allowed in a MATCHED"), "{e}");
    let e = err(
        &data,
        "MERGE INTO lake.s.t t USING (SELECT 1 AS id) s ON t.id = s.id \
         WHEN MATCHED THEN UPDATE SET nope = 1",
    );
    assert!(e.contains("no column `nope`"), "{e}");
    let e = err(
        &data,
        "MERGE INTO tpch.tiny.nation t USING (SELECT 1 AS id) s ON t.n_nationkey = s.id \
         WHEN MATCHED THEN DELETE",
    );
    assert!(e.contains("Iceberg tables only"), "{e}");
    let e = err(
        &data,
        "MERGE INTO lake.s.t t USING (VALUES (1), (1)) s(id) ON t.id = s.id \
         WHEN MATCHED THEN UPDATE SET amount = 7",
    );
    assert!(e.contains("more than one source row"), "{e}");
    // Also with no WHEN MATCHED clause: the row would be written twice.
    let e = err(
        &data,
        "MERGE INTO lake.s.t t USING (VALUES (1), (1)) s(id) ON t.id = s.id \
         WHEN NOT MATCHED BY SOURCE THEN DELETE",
    );
    assert!(e.contains("more than one source row"), "{e}");
    assert_eq!(
        ok(&data, "SELECT sum(amount) AS s FROM lake.s.t"),
        "s\n2.0\n"
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn one_day_filter_prunes_all_other_files() {
    let data = scratch_dir("lake-prune");
    ok(
        &data,
        "CREATE SCHEMA lake.t; \
         CREATE TABLE lake.t.lineitem WITH (partitioning = ARRAY['day(l_shipdate)']) \
           AS SELECT * FROM tpch.tiny.lineitem",
    );
    let plan = ok(
        &data,
        "EXPLAIN SELECT count(*) FROM lake.t.lineitem WHERE l_shipdate = DATE '1995-06-17'",
    );
    let files = plan
        .split("files=")
        .nth(1)
        .and_then(|rest| rest.split(" (").next())
        .unwrap_or_default()
        .to_string();
    let (planned, total) = files.split_once(" of ").expect("files=N of M in EXPLAIN");
    let planned: u64 = planned.parse().unwrap();
    let total: u64 = total.parse().unwrap();
    assert_eq!(planned, 1, "{plan}");
    assert!(total > 2000, "{plan}");
    assert_eq!(
        ok(
            &data,
            "SELECT count(*) AS n FROM lake.t.lineitem WHERE l_shipdate = DATE '1995-06-17'"
        ),
        ok(
            &data,
            "SELECT count(*) AS n FROM tpch.tiny.lineitem WHERE l_shipdate = DATE '1995-06-17'"
        )
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn bad_input_names_the_table_and_leaves_it_unchanged() {
    let data = scratch_dir("lake-bad");
    ok(
        &data,
        "CREATE SCHEMA lake.s; CREATE TABLE lake.s.t (id BIGINT, name VARCHAR); \
         INSERT INTO lake.s.t VALUES (1, 'a')",
    );
    let e = err(&data, "SELECT * FROM lake.nope.t");
    assert!(e.contains("nope"), "{e}");
    let e = err(&data, "SELECT * FROM lake.s.nope");
    assert!(e.contains("nope"), "{e}");
    let e = err(&data, "INSERT INTO lake.s.t VALUES (1, 'a', 3)");
    assert!(e.contains("lake.s.t") && e.contains("3 values"), "{e}");
    let e = err(&data, "INSERT INTO lake.s.t VALUES ('not a number', 'a')");
    assert!(e.contains("not a number"), "{e}");
    let e = err(
        &data,
        "CREATE TABLE lake.s.u (id BIGINT) WITH (partitioning = ARRAY['zorder(id)'])",
    );
    assert!(e.contains("zorder") && e.contains("partitioning"), "{e}");
    let e = err(
        &data,
        "CREATE TABLE lake.s.u (id BIGINT) WITH (partitioning = ARRAY['day(id)'])",
    );
    assert!(e.contains("lake.s.u") && e.contains("day"), "{e}");
    let e = err(
        &data,
        "CREATE TABLE lake.s.u (id BIGINT) WITH (colour = 'red')",
    );
    assert!(e.contains("colour"), "{e}");
    // Nothing changed.
    assert_eq!(snapshots_and_rows(&data), "snapshots\n1\nn\n1\n");
    let e = err(&data, "SELECT count(*) FROM lake.s.u");
    assert!(e.contains("lake.s.u"), "{e}");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn not_null_columns_stay_required_and_refuse_nulls() {
    let data = scratch_dir("lake-not-null");
    ok(
        &data,
        "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.t (id BIGINT NOT NULL, name VARCHAR); \
         CREATE TABLE lake.s.n (id BIGINT, name VARCHAR); \
         INSERT INTO lake.s.t VALUES (1, 'a'), (2, 'b'); \
         INSERT INTO lake.s.n VALUES (1, 'a'), (2, 'b')",
    );
    assert_eq!(
        ok(&data, "DESCRIBE lake.s.t"),
        "column_name,data_type,is_nullable\nid,Int64,NO\nname,Utf8View,YES\n"
    );
    // A NULL into the required column fails, names the table and the column, commits nothing.
    for insert in [
        "INSERT INTO lake.s.t VALUES (NULL, 'c')",
        "INSERT INTO lake.s.t SELECT CASE WHEN n_nationkey = 7 THEN NULL \
         ELSE n_nationkey END, n_name FROM tpch.tiny.nation",
    ] {
        let e = err(&data, insert);
        assert!(e.contains("lake.s.t") && e.contains("'id'"), "{e}");
    }
    assert_eq!(snapshots_and_rows(&data), "snapshots\n1\nn\n2\n");
    // Without NULLs to rule out, NOT IN is a plain anti join; over the nullable copy the
    // planner adds the subquery's counts (scheduler/src/notin.rs).
    let not_in = |t: &str| {
        format!(
            "SELECT name FROM lake.s.{t} WHERE id NOT IN (SELECT id FROM lake.s.{t} WHERE name = 'b')"
        )
    };
    let plan = ok(&data, &format!("EXPLAIN {}", not_in("t")));
    assert!(!plan.contains("__basin_not_in"), "{plan}");
    let plan = ok(&data, &format!("EXPLAIN {}", not_in("n")));
    assert!(plan.contains("__basin_not_in"), "{plan}");
    assert_eq!(ok(&data, &not_in("t")), "name\na\n");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn parquet_properties_choose_how_files_are_written() {
    let data = scratch_dir("lake-parquet-props");
    ok(
        &data,
        "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.zstd AS SELECT * FROM tpch.tiny.lineitem; \
         CREATE TABLE lake.s.snappy WITH (\"write.parquet.compression-codec\" = 'snappy') \
           AS SELECT * FROM tpch.tiny.lineitem; \
         CREATE TABLE lake.s.raw WITH (\"write.parquet.compression-codec\" = 'uncompressed', \
           \"write.parquet.row-group-size-bytes\" = '1048576') \
           AS SELECT * FROM tpch.tiny.lineitem",
    );
    let bytes = |table: &str| -> u64 {
        let out = ok(
            &data,
            &format!("SELECT sum(file_size_in_bytes) AS b FROM lake.s.\"{table}$files\""),
        );
        out.lines().nth(1).unwrap().parse().unwrap()
    };
    let (zstd, snappy, raw) = (bytes("zstd"), bytes("snappy"), bytes("raw"));
    assert!(
        zstd < snappy && snappy < raw,
        "zstd {zstd}, snappy {snappy}, raw {raw}"
    );
    // Same rows whichever way they were written.
    assert_eq!(
        ok(
            &data,
            "SELECT count(*) AS n FROM (SELECT * FROM lake.s.zstd EXCEPT ALL \
             SELECT * FROM lake.s.raw)"
        ),
        "n\n0\n"
    );
    for (property, value, needle) in [
        ("write.parquet.compression-codec", "lzo", "use zstd, snappy"),
        (
            "write.parquet.compression-level",
            "99",
            "zstd takes 1 to 22",
        ),
        (
            "write.parquet.row-group-size-bytes",
            "big",
            "positive whole number",
        ),
    ] {
        let e = err(
            &data,
            &format!("CREATE TABLE lake.s.bad WITH (\"{property}\" = '{value}') AS SELECT 1 AS x"),
        );
        assert!(
            e.contains("lake.s.bad") && e.contains(property) && e.contains(needle),
            "{e}"
        );
    }
    let e = err(&data, "SELECT * FROM lake.s.bad");
    assert!(e.contains("lake.s.bad"), "{e}");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_one_file_table_is_read_by_row_group_in_several_slots() {
    let data = scratch_dir("lake-row-groups");
    // One file (a sorted CTAS writes from one partition) of 7 row groups of at most 10,000
    // rows; `tags` is a list, which only iceberg-rust's reader reads.
    ok(
        &data,
        "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.one WITH (\"write.parquet.row-group-limit\" = '10000') AS \
           SELECT *, make_array(l_linenumber) AS tags FROM tpch.tiny.lineitem \
           ORDER BY l_orderkey, l_linenumber",
    );
    assert_eq!(
        ok(&data, "SELECT count(*) AS files FROM lake.s.\"one$files\""),
        "files\n1\n"
    );
    let plan = ok(&data, "EXPLAIN SELECT sum(l_quantity) FROM lake.s.one");
    assert!(
        plan.contains("files=1 of 1") && !plan.contains("partitions=1,"),
        "{plan}"
    );
    // Every row exactly once, through either reader, with and without a filter.
    let same = |sql: &str| {
        let ours = sql.replace("FROM t", "FROM lake.s.one");
        let theirs = sql
            .replace("FROM t", "FROM tpch.tiny.lineitem")
            .replace("tags[1]", "l_linenumber");
        assert_eq!(ok(&data, &ours), ok(&data, &theirs), "{sql}");
    };
    same(
        "SELECT count(*) AS n, sum(l_quantity) AS q, sum(l_orderkey * 7 + l_linenumber) AS k FROM t",
    );
    same("SELECT count(*) AS n, sum(l_orderkey * 7 + tags[1]) AS k FROM t");
    same(
        "SELECT count(*) AS n, sum(l_extendedprice) AS p FROM t \
         WHERE l_quantity > 30 AND l_shipdate < DATE '1995-01-01'",
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn killed_before_commit_leaves_the_old_snapshot() {
    let data = scratch_dir("lake-kill");
    ok(
        &data,
        "CREATE SCHEMA lake.s; CREATE TABLE lake.s.t AS SELECT * FROM tpch.tiny.nation",
    );
    let before = ok(&data, "SELECT snapshot_id FROM lake.s.\"t$snapshots\"");
    let out = lake(
        &data,
        "INSERT INTO lake.s.t SELECT * FROM tpch.tiny.nation",
        &[("BASIN_TEST_KILL_BEFORE_COMMIT", "1")],
    );
    assert!(
        !out.status.success(),
        "the statement should have been killed"
    );
    assert_eq!(
        ok(&data, "SELECT snapshot_id FROM lake.s.\"t$snapshots\""),
        before
    );
    assert_eq!(ok(&data, "SELECT count(*) AS n FROM lake.s.t"), "n\n25\n");
    let _ = std::fs::remove_dir_all(&data);
}

/// UPDATE, DELETE and MERGE killed between writing their files and committing: the table is
/// unchanged, and `remove_orphan_files` removes what they wrote.
#[test]
fn row_changes_killed_before_commit_change_nothing() {
    let data = scratch_dir("lake-kill-rows");
    ok(
        &data,
        "CREATE SCHEMA lake.s; CREATE TABLE lake.s.t AS SELECT * FROM tpch.tiny.nation",
    );
    let before = ok(&data, "SELECT snapshot_id FROM lake.s.\"t$snapshots\"");
    let parquet = |n: &str| n.ends_with(".parquet");
    let files = count_files(&data, &parquet);
    for statement in [
        "UPDATE lake.s.t SET n_name = lower(n_name) WHERE n_regionkey = 1",
        "DELETE FROM lake.s.t WHERE n_nationkey < 3",
        "MERGE INTO lake.s.t t USING (SELECT 1 AS k) s ON t.n_nationkey = s.k \
         WHEN MATCHED THEN DELETE",
    ] {
        let out = lake(&data, statement, &[("BASIN_TEST_KILL_BEFORE_COMMIT", "1")]);
        assert!(!out.status.success(), "{statement} should have been killed");
        assert_eq!(
            ok(&data, "SELECT snapshot_id FROM lake.s.\"t$snapshots\""),
            before
        );
        assert_eq!(
            ok(
                &data,
                "SELECT count(*) AS n, min(n_name) AS m FROM lake.s.t"
            ),
            "n,m\n25,ALGERIA\n"
        );
    }
    assert!(count_files(&data, &parquet) > files);
    ok(
        &data,
        "ALTER TABLE lake.s.t EXECUTE remove_orphan_files(retention_threshold => '0s', \
         allow_short_retention => true)",
    );
    assert_eq!(count_files(&data, &parquet), files);
    assert_eq!(ok(&data, "SELECT count(*) AS n FROM lake.s.t"), "n\n25\n");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn schema_evolution_by_field_id() {
    let data = scratch_dir("lake-alter");
    ok(
        &data,
        "CREATE SCHEMA lake.s; CREATE TABLE lake.s.t (id BIGINT, name VARCHAR); \
         INSERT INTO lake.s.t VALUES (1, 'a'); \
         ALTER TABLE lake.s.t ADD COLUMN score DOUBLE; \
         INSERT INTO lake.s.t VALUES (2, 'b', 2.5); \
         ALTER TABLE lake.s.t DROP COLUMN name; \
         ALTER TABLE lake.s.t ADD COLUMN label VARCHAR; \
         INSERT INTO lake.s.t VALUES (3, 4.5, 'c')",
    );
    // Old files have no `score` and no `label`: they read as NULL (matched by field id).
    assert_eq!(
        ok(&data, "SELECT id, score, label FROM lake.s.t ORDER BY id"),
        "id,score,label\n1,,\n2,2.5,\n3,4.5,c\n"
    );
    // Re-adding a dropped name would bring old values back in iceberg-rust 0.10: refused.
    let e = err(&data, "ALTER TABLE lake.s.t ADD COLUMN name VARCHAR");
    assert!(e.contains("had a column of that name"), "{e}");
    // So is renaming a column to it; a fresh name is fine, old files read under it.
    let e = err(&data, "ALTER TABLE lake.s.t RENAME COLUMN score TO name");
    assert!(e.contains("had a column of that name"), "{e}");
    ok(&data, "ALTER TABLE lake.s.t RENAME COLUMN score TO points");
    assert_eq!(
        ok(&data, "SELECT id, points FROM lake.s.t ORDER BY id"),
        "id,points\n1,\n2,2.5\n3,4.5\n"
    );
    let e = err(&data, "ALTER TABLE lake.s.t DROP COLUMN nope");
    assert!(e.contains("lake.s.t") && e.contains("nope"), "{e}");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn scans_carry_column_bounds_from_the_manifests() {
    let data = scratch_dir("lake-stats");
    let plan = ok(
        &data,
        "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.n AS SELECT * FROM tpch.tiny.nation; \
         INSERT INTO lake.s.n SELECT n_nationkey + 100, n_name, n_regionkey, n_comment \
           FROM tpch.tiny.nation WHERE n_nationkey < 3; \
         SET datafusion.explain.show_statistics = true; \
         EXPLAIN SELECT n_nationkey, n_name FROM lake.s.n",
    );
    // Over both files: the planner sees the key's range and the names' bounds (strings are
    // read as views).
    assert!(
        plan.contains("Min=Inexact(Int64(0)) Max=Inexact(Int64(102))"),
        "{plan}"
    );
    assert!(
        plan.contains("ALGERIA")
            && plan.contains("Max=Inexact(Utf8View(")
            && plan.contains("VIETNAM"),
        "{plan}"
    );
    let _ = std::fs::remove_dir_all(&data);
}

/// `bytes=` and `column_bytes=` of the first Iceberg scan in an EXPLAIN.
fn scan_bytes(plan: &str) -> (u64, u64) {
    let number = |key: &str| -> u64 {
        let at = plan.find(key).unwrap_or_else(|| panic!("{key} in {plan}")) + key.len();
        let digits: String = plan[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().expect(plan)
    };
    (number(" bytes="), number("column_bytes="))
}

#[test]
fn scans_are_sized_by_the_columns_they_read() {
    // The route choice (`[server] single_node_max_bytes`) reads a scan's size: the bytes of
    // its columns in the manifests, not its whole files (TPC-DS Q14 read 122 MB of 2 GB).
    let data = scratch_dir("lake-column-bytes");
    let one = ok(
        &data,
        "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.o AS SELECT * FROM tpch.tiny.orders; \
         EXPLAIN SELECT sum(o_totalprice) FROM lake.s.o",
    );
    let all = ok(&data, "EXPLAIN SELECT * FROM lake.s.o");
    let (files, price) = scan_bytes(&one);
    let (same_files, every_column) = scan_bytes(&all);
    assert_eq!(files, same_files, "{one}\n{all}");
    assert!(0 < price && price < every_column / 3, "{one}\n{all}");
    assert!(every_column <= files, "{all}");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn unreachable_rest_catalog_is_a_clear_error() {
    let data = scratch_dir("lake-unreachable");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let config = data.join("basin.toml");
    std::fs::write(
        &config,
        format!(
            "[catalogs.remote]\nconnector = \"iceberg\"\nkind = \"rest\"\n\
             uri = \"http://127.0.0.1:{port}\"\ncredential = \"id:topsecret\"\n"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_basin"))
        .args(["standalone", "--config", config.to_str().unwrap()])
        .args(["-e", "SELECT * FROM remote.s.t"])
        .env("BASIN_DATA_DIR", &data)
        .run_within();
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(e.contains("remote.s") || e.contains("remote"), "{e}");
    assert!(!e.contains("topsecret"), "{e}");
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_union_of_columns_from_different_tables_joins_a_dimension() {
    // TPC-DS Q71's shape: the same measure from three tables (different field ids), under one
    // alias, joined with a dimension; the physical planner once refused the plan because the
    // union's columns carried the first table's field id only physically. A script that
    // starts with `USE` runs its other statements too.
    let data = scratch_dir("lake-union");
    ok(
        &data,
        "CREATE SCHEMA lake.u; \
         CREATE TABLE lake.u.web (item BIGINT, price DECIMAL(7,2)); \
         CREATE TABLE lake.u.store (note VARCHAR, item BIGINT, price DECIMAL(7,2)); \
         CREATE TABLE lake.u.item (id BIGINT, brand VARCHAR); \
         INSERT INTO lake.u.web VALUES (1, 1.50), (2, 2.25); \
         INSERT INTO lake.u.store VALUES ('x', 1, 10.00), ('y', 3, 4.00); \
         INSERT INTO lake.u.item VALUES (1, 'a'), (2, 'b'), (3, 'c')",
    );
    assert_eq!(
        ok(
            &data,
            "USE lake.u; \
             SELECT brand, sum(ext_price) AS total \
             FROM item, (SELECT price AS ext_price, item AS sold_item FROM web \
                         UNION ALL SELECT price AS ext_price, item AS sold_item FROM store) s \
             WHERE sold_item = id GROUP BY brand ORDER BY brand",
        ),
        "brand,total\na,11.50\nb,2.25\nc,4.00\n"
    );
}

#[test]
fn joins_above_a_join_estimated_empty_are_planned() {
    // TPC-DS Q94's shape: the sites are filtered to no file, so the first join is estimated
    // at no rows, which DataFusion 53 makes an exact 0 (apache/datafusion#22413); the joins
    // above it once subtracted the sales keys' null counts from that 0 and the planner
    // panicked ("attempt to subtract with overflow" in debug builds).
    let data = scratch_dir("lake-empty-join");
    ok(
        &data,
        "CREATE SCHEMA lake.z; \
         CREATE TABLE lake.z.sales (site BIGINT, day BIGINT, item BIGINT, amount BIGINT); \
         CREATE TABLE lake.z.site (id BIGINT, name VARCHAR); \
         CREATE TABLE lake.z.day (id BIGINT); \
         CREATE TABLE lake.z.item (id BIGINT); \
         INSERT INTO lake.z.sales VALUES (1, 10, 1, 5), (1, NULL, 2, 7), (1, 11, NULL, 3); \
         INSERT INTO lake.z.site VALUES (1, 'abc'); \
         INSERT INTO lake.z.day VALUES (10), (11); \
         INSERT INTO lake.z.item VALUES (1), (2)",
    );
    let joins = "FROM sales, site, day, item WHERE sales.site = site.id \
                 AND sales.day = day.id AND sales.item = item.id";
    for (name, rows) in [("pri", "0,\n"), ("abc", "1,5\n")] {
        assert_eq!(
            ok(
                &data,
                &format!(
                    "USE lake.z; SELECT count(*) AS n, sum(amount) AS total {joins} \
                     AND site.name = '{name}'"
                ),
            ),
            format!("n,total\n{rows}"),
            "{name}"
        );
    }
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_count_over_a_semi_join_is_counted() {
    // The semi join's first columns do not meet (`a.x` 100..200, `b.k` 1..2): DataFusion 53
    // estimates no rows from that (apache/datafusion#22673), made the estimate exact, and
    // answered the count from it: 0.
    let data = scratch_dir("lake-semi-count");
    ok(
        &data,
        "CREATE SCHEMA lake.t; \
         CREATE TABLE lake.t.a AS SELECT * FROM (VALUES (100, 1), (150, 2), (200, 3)) AS v(x, k); \
         CREATE TABLE lake.t.b AS SELECT * FROM (VALUES (1), (2)) AS v(k)",
    );
    assert_eq!(
        ok(
            &data,
            "SELECT count(*) AS n FROM \
             (SELECT DISTINCT x FROM lake.t.a WHERE k IN (SELECT k FROM lake.t.b))",
        ),
        "n\n2\n"
    );
    let _ = std::fs::remove_dir_all(&data);
}

/// A join's keys (DataFusion's dynamic filter) reach the Iceberg scan of its probe side,
/// whose row groups they prune on the executor that runs the query; the answers are the
/// same in `basin standalone` and on a scheduler with an executor, and what the generated
/// table gives.
#[test]
fn a_joins_keys_reach_the_scan_of_its_probe_side() {
    const SETUP: &str = "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.o WITH (\"write.parquet.row-group-limit\" = '1000') AS \
           SELECT o_orderkey, o_custkey, o_totalprice FROM tpch.tiny.orders ORDER BY o_orderkey; \
         CREATE TABLE lake.s.pick AS SELECT o_orderkey AS k FROM tpch.tiny.orders \
           WHERE o_orderkey < 100";
    const JOIN: &str = "SELECT count(*) AS n, sum(o_totalprice) AS total \
         FROM lake.s.o JOIN lake.s.pick ON o_orderkey = k";
    let data = scratch_dir("lake-dynamic-filter");
    ok(&data, SETUP);
    let plan = ok(&data, &format!("EXPLAIN {JOIN}"));
    let probe = plan
        .lines()
        .find(|l| l.contains("IcebergScanExec: table=lake.s.o,"))
        .unwrap_or_else(|| panic!("no scan of lake.s.o in {plan}"));
    assert!(probe.contains("pruning_filters=[DynamicFilter"), "{plan}");
    let want = ok(
        &data,
        "SELECT count(*) AS n, sum(o_totalprice) AS total FROM tpch.tiny.orders \
         WHERE o_orderkey < 100",
    );
    assert!(want.starts_with("n,total\n27,"), "{want}");
    assert_eq!(ok(&data, JOIN), want);
    let _ = std::fs::remove_dir_all(&data);

    let cluster = crate::liveness::Cluster::start_with(1, "[server]\n");
    let out = cluster.sql(SETUP);
    assert!(out.status.success(), "{}", stderr(&out));
    cluster.expect(JOIN, &want);
}

/// Files under `dir` whose names satisfy `pick`.
fn count_files(dir: &Path, pick: &dyn Fn(&str) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                count_files(&path, pick)
            } else {
                usize::from(pick(&e.file_name().to_string_lossy()))
            }
        })
        .sum()
}

#[test]
fn expire_snapshots_and_remove_orphan_files() {
    let data = scratch_dir("lake-maintenance");
    ok(
        &data,
        "CREATE SCHEMA lake.s; CREATE TABLE lake.s.t AS SELECT * FROM tpch.tiny.nation; \
         INSERT INTO lake.s.t SELECT * FROM tpch.tiny.nation; \
         INSERT INTO lake.s.t SELECT * FROM tpch.tiny.nation",
    );
    let first = ok(
        &data,
        "SELECT snapshot_id FROM lake.s.\"t$snapshots\" ORDER BY committed_at LIMIT 1",
    );
    let first = first.lines().nth(1).unwrap_or_default().to_string();
    // Debris: the data files of a statement killed before its commit.
    let out = lake(
        &data,
        "INSERT INTO lake.s.t SELECT * FROM tpch.tiny.nation",
        &[("BASIN_TEST_KILL_BEFORE_COMMIT", "1")],
    );
    assert!(
        !out.status.success(),
        "the statement should have been killed"
    );
    let parquet = |n: &str| n.ends_with(".parquet");
    let data_files = count_files(&data, &parquet);
    assert!(data_files >= 4, "{data_files} data files");

    // A threshold under a day needs saying so; unknown procedures and arguments are named.
    let e = err(
        &data,
        "ALTER TABLE lake.s.t EXECUTE remove_orphan_files(retention_threshold => '1h')",
    );
    assert!(e.contains("allow_short_retention"), "{e}");
    let e = err(&data, "ALTER TABLE lake.s.t EXECUTE vacuum");
    assert!(e.contains("unknown table procedure `vacuum`"), "{e}");
    let e = err(
        &data,
        "ALTER TABLE lake.s.t EXECUTE expire_snapshots(keep => 1)",
    );
    assert!(e.contains("no argument `keep`"), "{e}");

    // A dry run lists the debris and deletes nothing.
    let now = "retention_threshold => '0s', allow_short_retention => true";
    let listed = ok(
        &data,
        &format!("ALTER TABLE lake.s.t EXECUTE remove_orphan_files({now}, dry_run => true)"),
    );
    let orphans: Vec<&str> = listed.lines().skip(1).collect();
    assert!(!orphans.is_empty(), "{listed}");
    assert!(orphans.iter().all(|l| l.contains(".parquet,")), "{listed}");
    assert_eq!(count_files(&data, &parquet), data_files);
    // Spark's form deletes them; the table reads as before.
    let removed = ok(
        &data,
        &format!("CALL lake.system.remove_orphan_files(table => 's.t', {now})"),
    );
    assert!(
        removed.contains(&format!("deleted_files_count,{}", orphans.len())),
        "{removed}"
    );
    assert_eq!(count_files(&data, &parquet), data_files - orphans.len());
    assert_eq!(ok(&data, "SELECT count(*) AS n FROM lake.s.t"), "n\n75\n");

    // Expiring all but the newest snapshot deletes their manifest lists, no data file (each
    // append's files are still read), and time travel to them ends.
    let lists = |n: &str| n.starts_with("snap-") && n.ends_with(".avro");
    assert_eq!(count_files(&data, &lists), 3);
    let e = err(
        &data,
        "ALTER TABLE lake.s.t EXECUTE expire_snapshots(retention_threshold => '0s')",
    );
    assert!(e.contains("allow_short_retention"), "{e}");
    let expired = ok(
        &data,
        "ALTER TABLE lake.s.t EXECUTE expire_snapshots(retention_threshold => '0s', \
         retain_last => 1, allow_short_retention => true)",
    );
    assert!(expired.contains("expired_snapshots_count,2"), "{expired}");
    assert!(
        expired.contains("deleted_manifest_lists_count,2"),
        "{expired}"
    );
    assert!(expired.contains("deleted_data_files_count,0"), "{expired}");
    assert_eq!(count_files(&data, &lists), 1);
    assert_eq!(snapshots_and_rows(&data), "snapshots\n1\nn\n75\n");
    let e = err(
        &data,
        &format!("SELECT count(*) FROM lake.s.t FOR VERSION AS OF {first}"),
    );
    assert!(e.contains(&first), "{e}");
    // Nothing is left over.
    let listed = ok(
        &data,
        &format!("ALTER TABLE lake.s.t EXECUTE remove_orphan_files({now}, dry_run => true)"),
    );
    assert_eq!(listed.lines().count(), 1, "{listed}");
    // Once no retained snapshot reads them, deleted rows' files go too.
    let files = count_files(&data, &parquet);
    assert_eq!(ok(&data, "DELETE FROM lake.s.t"), "count\n75\n");
    assert_eq!(count_files(&data, &parquet), files);
    let expired = ok(
        &data,
        "ALTER TABLE lake.s.t EXECUTE expire_snapshots(retention_threshold => '0s', \
         retain_last => 1, allow_short_retention => true)",
    );
    assert!(
        expired.contains(&format!("deleted_data_files_count,{files}")),
        "{expired}"
    );
    assert_eq!(count_files(&data, &parquet), 0);
    assert_eq!(snapshots_and_rows(&data), "snapshots\n1\nn\n0\n");
    let _ = std::fs::remove_dir_all(&data);
}

/// `DELETE` by any condition and `UPDATE` rewrite the files holding matched rows
/// (copy-on-write): files without a match stay, the rest are replaced in one snapshot.
#[test]
fn delete_and_update_rewrite_the_files_they_change() {
    let data = scratch_dir("lake-rewrite");
    // Three inserts: three files.
    ok(
        &data,
        "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.t (id BIGINT, name VARCHAR, amount DOUBLE); \
         INSERT INTO lake.s.t VALUES (1, 'a', 1.0), (2, 'b', 2.0), (3, 'c', NULL); \
         INSERT INTO lake.s.t VALUES (4, 'd', 4.0), (5, 'e', 5.0); \
         INSERT INTO lake.s.t VALUES (6, 'f', 6.0)",
    );
    let files = |data: &Path| {
        ok(
            data,
            "SELECT file_path FROM lake.s.\"t$files\" ORDER BY file_path",
        )
        .lines()
        .skip(1)
        .map(str::to_string)
        .collect::<Vec<_>>()
    };
    let before = files(&data);
    assert_eq!(before.len(), 3);
    // Rows where the condition is NULL stay; only the file of ids 1..3 holds matches.
    assert_eq!(
        ok(&data, "DELETE FROM lake.s.t WHERE amount < 5 AND id <> 4"),
        "count\n2\n"
    );
    assert_eq!(
        ok(&data, "SELECT id, name, amount FROM lake.s.t ORDER BY id"),
        "id,name,amount\n3,c,\n4,d,4.0\n5,e,5.0\n6,f,6.0\n"
    );
    let after = files(&data);
    assert_eq!(after.len(), 3, "{after:?}");
    let kept: Vec<&String> = after.iter().filter(|f| before.contains(f)).collect();
    assert_eq!(kept.len(), 2, "files without a match stay: {after:?}");
    assert_eq!(
        ok(
            &data,
            "SELECT operation, summary['deleted-records'] AS deleted, \
             summary['added-records'] AS added, summary['total-records'] AS total \
             FROM lake.s.\"t$snapshots\" ORDER BY committed_at"
        ),
        "operation,deleted,added,total\nappend,,3,3\nappend,,2,5\nappend,,1,6\n\
         overwrite,3,1,4\n"
    );
    // UPDATE: new values computed for matched rows only (no division by zero for id 4).
    assert_eq!(
        ok(
            &data,
            "UPDATE lake.s.t SET amount = 1 / (id - 4), name = upper(name) WHERE id <> 4"
        ),
        "count\n3\n"
    );
    assert_eq!(
        ok(&data, "SELECT id, name, amount FROM lake.s.t ORDER BY id"),
        "id,name,amount\n3,C,-1.0\n4,d,4.0\n5,E,1.0\n6,F,0.0\n"
    );
    // Every row; a constant false condition changes nothing and commits nothing.
    assert_eq!(ok(&data, "UPDATE lake.s.t SET amount = 0"), "count\n4\n");
    assert_eq!(
        ok(&data, "UPDATE lake.s.t SET amount = 1 WHERE 1 = 2"),
        "count\n0\n"
    );
    assert_eq!(snapshots_and_rows(&data), "snapshots\n6\nn\n4\n");
    // Time travel still sees the first version.
    let first = ok(
        &data,
        "SELECT snapshot_id FROM lake.s.\"t$snapshots\" ORDER BY committed_at LIMIT 1",
    );
    let first = first.lines().nth(1).unwrap_or_default().to_string();
    assert_eq!(
        ok(
            &data,
            &format!("SELECT sum(amount) AS s FROM lake.s.t FOR VERSION AS OF {first}")
        ),
        "s\n3.0\n"
    );
    // A cast that merges values (5.3 → 5) does not prune files: the file of 5.3 is read.
    ok(
        &data,
        "CREATE TABLE lake.s.c (x DOUBLE); INSERT INTO lake.s.c VALUES (5.3), (5.4); \
         INSERT INTO lake.s.c VALUES (7.0)",
    );
    assert_eq!(
        ok(
            &data,
            "SELECT count(*) AS n FROM lake.s.c WHERE CAST(x AS INT) = 5"
        ),
        "n\n2\n"
    );
    assert_eq!(
        ok(&data, "DELETE FROM lake.s.c WHERE CAST(x AS INT) = 5"),
        "count\n2\n"
    );
    assert_eq!(ok(&data, "SELECT x FROM lake.s.c"), "x\n7.0\n");
    // A subquery in the condition is refused, saying so; nothing changes.
    let e = err(
        &data,
        "DELETE FROM lake.s.t WHERE id IN (SELECT id FROM lake.s.t WHERE id > 4)",
    );
    assert!(e.contains("not supported yet"), "{e}");
    assert_eq!(snapshots_and_rows(&data), "snapshots\n6\nn\n4\n");

    // A partitioned table: an UPDATE of the partition column moves rows between partitions;
    // a DELETE on a non-partition column rewrites only the partitions it matches in.
    ok(
        &data,
        "CREATE TABLE lake.s.p (id BIGINT, region VARCHAR, amount DOUBLE) \
           WITH (partitioning = ARRAY['region']); \
         INSERT INTO lake.s.p VALUES (1, 'east', 1.0), (2, 'west', 2.0), (3, 'east', 3.0), \
           (4, NULL, 4.0)",
    );
    assert_eq!(
        ok(&data, "UPDATE lake.s.p SET region = 'north' WHERE id = 3"),
        "count\n1\n"
    );
    assert_eq!(
        ok(
            &data,
            "DELETE FROM lake.s.p WHERE amount >= 2 AND region <> 'north'"
        ),
        "count\n1\n"
    );
    assert_eq!(
        ok(&data, "SELECT id, region FROM lake.s.p ORDER BY id"),
        "id,region\n1,east\n3,north\n4,\n"
    );
    let _ = std::fs::remove_dir_all(&data);
}

/// `INSERT OVERWRITE`: a partitioned table's partitions that get rows are replaced, the others
/// stay (dynamic partition overwrite); an unpartitioned table is replaced whole.
#[test]
fn insert_overwrite_replaces_partitions_or_the_table() {
    let data = scratch_dir("lake-overwrite");
    ok(
        &data,
        "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.p (id BIGINT, region VARCHAR) WITH (partitioning = ARRAY['region']); \
         INSERT INTO lake.s.p VALUES (1, 'east'), (2, 'west'), (3, 'east'), (4, 'north'); \
         CREATE TABLE lake.s.u (id BIGINT); \
         INSERT INTO lake.s.u VALUES (1), (2)",
    );
    assert_eq!(
        ok(
            &data,
            "INSERT OVERWRITE lake.s.p VALUES (10, 'east'), (11, 'south')"
        ),
        "count\n2\n"
    );
    assert_eq!(
        ok(&data, "SELECT id, region FROM lake.s.p ORDER BY id"),
        "id,region\n2,west\n4,north\n10,east\n11,south\n"
    );
    assert_eq!(
        ok(
            &data,
            "INSERT OVERWRITE lake.s.u SELECT id * 100 FROM lake.s.u"
        ),
        "count\n2\n"
    );
    assert_eq!(
        ok(&data, "SELECT id FROM lake.s.u ORDER BY id"),
        "id\n100\n200\n"
    );
    assert_eq!(
        ok(
            &data,
            "SELECT operation FROM lake.s.\"u$snapshots\" ORDER BY committed_at"
        ),
        "operation\nappend\noverwrite\n"
    );
    // Overwriting with no rows: no partition of `p` is touched; `u` is emptied.
    assert_eq!(
        ok(
            &data,
            "INSERT OVERWRITE lake.s.p SELECT * FROM lake.s.p WHERE id < 0"
        ),
        "count\n0\n"
    );
    assert_eq!(ok(&data, "SELECT count(*) AS n FROM lake.s.p"), "n\n4\n");
    assert_eq!(
        ok(
            &data,
            "INSERT OVERWRITE lake.s.u SELECT * FROM lake.s.u WHERE id < 0"
        ),
        "count\n0\n"
    );
    assert_eq!(ok(&data, "SELECT count(*) AS n FROM lake.s.u"), "n\n0\n");
    let _ = std::fs::remove_dir_all(&data);
}

/// Renames, type promotions and DROP NOT NULL: a new schema, same field ids; old files read
/// under the new names and types; history keeps the old schemas.
#[test]
fn schema_evolution_renames_and_widens_columns() {
    let data = scratch_dir("lake-evolve");
    ok(
        &data,
        "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.t (id INT NOT NULL, price REAL, amount DECIMAL(10, 2), note VARCHAR) \
           WITH (partitioning = ARRAY['note']); \
         INSERT INTO lake.s.t VALUES (1, 1.5, 10.25, 'a'), (2, 2.5, 20.50, 'b')",
    );
    ok(
        &data,
        "ALTER TABLE lake.s.t RENAME COLUMN note TO label; \
         ALTER TABLE lake.s.t ALTER COLUMN id SET DATA TYPE BIGINT; \
         ALTER TABLE lake.s.t ALTER COLUMN price SET DATA TYPE DOUBLE; \
         ALTER TABLE lake.s.t ALTER COLUMN amount SET DATA TYPE DECIMAL(20, 2); \
         ALTER TABLE lake.s.t ALTER COLUMN id DROP NOT NULL",
    );
    // Old files under the new names and types; new rows beside them.
    ok(
        &data,
        "INSERT INTO lake.s.t VALUES (NULL, 3.5, CAST('123456789012345.67' AS DECIMAL(20, 2)), 'c')",
    );
    assert_eq!(
        ok(
            &data,
            "SELECT id, price, amount, label, arrow_typeof(id) AS t, arrow_typeof(amount) AS a \
             FROM lake.s.t ORDER BY label"
        ),
        "id,price,amount,label,t,a\n1,1.5,10.25,a,Int64,\"Decimal128(20, 2)\"\n\
         2,2.5,20.50,b,Int64,\"Decimal128(20, 2)\"\n,3.5,123456789012345.67,c,Int64,\
         \"Decimal128(20, 2)\"\n"
    );
    // Pruning by the renamed partition column still works, and so does a DELETE by it.
    assert_eq!(
        ok(&data, "DELETE FROM lake.s.t WHERE label = 'a'"),
        "count\n1\n"
    );
    assert_eq!(ok(&data, "SELECT count(*) AS n FROM lake.s.t"), "n\n2\n");
    // What Iceberg does not allow is refused, naming the column; nothing changes.
    let e = err(
        &data,
        "ALTER TABLE lake.s.t ALTER COLUMN id SET DATA TYPE INT",
    );
    assert!(e.contains("`id`") && e.contains("Iceberg allows"), "{e}");
    let e = err(
        &data,
        "ALTER TABLE lake.s.t ALTER COLUMN price SET NOT NULL",
    );
    assert!(e.contains("NOT NULL"), "{e}");
    let e = err(&data, "ALTER TABLE lake.s.t RENAME COLUMN price TO amount");
    assert!(e.contains("already has a column `amount`"), "{e}");
    let e = err(&data, "ALTER TABLE lake.s.t RENAME COLUMN nothing TO x");
    assert!(e.contains("no column `nothing`"), "{e}");
    ok(
        &data,
        "CREATE TABLE lake.s.p (k INT, v INT) WITH (partitioning = ARRAY['k']); \
         INSERT INTO lake.s.p VALUES (1, 1)",
    );
    let e = err(
        &data,
        "ALTER TABLE lake.s.p ALTER COLUMN k SET DATA TYPE BIGINT",
    );
    assert!(e.contains("partitioned by it"), "{e}");
    ok(
        &data,
        "ALTER TABLE lake.s.p ALTER COLUMN v SET DATA TYPE BIGINT",
    );
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn delete_by_partition_truncate_and_rollback() {
    let data = scratch_dir("lake-delete");
    ok(
        &data,
        "CREATE SCHEMA lake.s; \
         CREATE TABLE lake.s.t (id BIGINT, region VARCHAR, amount DOUBLE) \
           WITH (partitioning = ARRAY['region']); \
         INSERT INTO lake.s.t VALUES (1, 'east', 1.0), (2, 'west', 2.0), (3, 'east', 3.0), \
           (4, NULL, 4.0)",
    );
    let first = ok(&data, "SELECT snapshot_id FROM lake.s.\"t$snapshots\"");
    let first = first.lines().nth(1).unwrap_or_default().to_string();
    // By partition: whole files go, in one `delete` snapshot.
    assert_eq!(
        ok(&data, "DELETE FROM lake.s.t WHERE region = 'east'"),
        "count\n2\n"
    );
    assert_eq!(
        ok(&data, "SELECT id FROM lake.s.t ORDER BY id"),
        "id\n2\n4\n"
    );
    assert_eq!(
        ok(
            &data,
            "SELECT operation, summary['deleted-records'] AS deleted, \
             summary['total-records'] AS total \
             FROM lake.s.\"t$snapshots\" ORDER BY committed_at"
        ),
        "operation,deleted,total\nappend,,4\ndelete,2,2\n"
    );
    // Nothing matches: no snapshot. NULL partitions are matched by IS NULL only.
    assert_eq!(
        ok(&data, "DELETE FROM lake.s.t WHERE region = 'north'"),
        "count\n0\n"
    );
    assert_eq!(
        ok(&data, "DELETE FROM lake.s.t WHERE region IS NULL"),
        "count\n1\n"
    );
    assert_eq!(snapshots_and_rows(&data), "snapshots\n3\nn\n1\n");
    // Time travel still reads the first version.
    assert_eq!(
        ok(
            &data,
            &format!("SELECT count(*) AS n FROM lake.s.t FOR VERSION AS OF {first}")
        ),
        "n\n4\n"
    );
    // TRUNCATE empties it; a rollback brings the first version back.
    assert_eq!(ok(&data, "TRUNCATE TABLE lake.s.t"), "count\n1\n");
    assert_eq!(snapshots_and_rows(&data), "snapshots\n4\nn\n0\n");
    let moved = ok(
        &data,
        &format!("ALTER TABLE lake.s.t EXECUTE rollback_to_snapshot(snapshot_id => {first})"),
    );
    assert!(moved.ends_with(&format!(",{first}\n")), "{moved}");
    assert_eq!(ok(&data, "SELECT count(*) AS n FROM lake.s.t"), "n\n4\n");
    let e = err(
        &data,
        "ALTER TABLE lake.s.t EXECUTE rollback_to_snapshot(snapshot_id => 42)",
    );
    assert!(
        e.contains("no snapshot 42") || e.contains("not an ancestor"),
        "{e}"
    );
    // Format 1 tables get format 1 manifests: two deletes in a row read back.
    ok(
        &data,
        "CREATE TABLE lake.s.v1 (id BIGINT, region VARCHAR) \
           WITH (partitioning = ARRAY['region'], format_version = 1); \
         INSERT INTO lake.s.v1 VALUES (1, 'a'), (2, 'b'), (3, 'c')",
    );
    assert_eq!(
        ok(&data, "DELETE FROM lake.s.v1 WHERE region = 'a'"),
        "count\n1\n"
    );
    assert_eq!(
        ok(&data, "DELETE FROM lake.s.v1 WHERE region = 'b'"),
        "count\n1\n"
    );
    assert_eq!(ok(&data, "SELECT id FROM lake.s.v1"), "id\n3\n");
    let _ = std::fs::remove_dir_all(&data);
}
