"""Iceberg interoperability through the SeaweedFS REST catalog, both directions: pyiceberg
writes and Basin reads exactly the same rows; Basin writes and pyiceberg reads exactly the
same rows and schema; both append to one table at once and no commit is lost. Basin is the
multi-process cluster of conftest.py, reached with the ADBC Flight SQL driver."""

import datetime
import threading
import uuid

import adbc_driver_flightsql.dbapi as fs
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import EqualTo
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestampType


def sql(url, statement, params=None):
    with fs.connect(url) as conn, conn.cursor() as cur:
        cur.execute(statement, parameters=params)
        return cur.fetch_arrow_table()


@pytest.fixture()
def namespace(pyiceberg_catalog):
    name = f"it_{uuid.uuid4().hex[:8]}"
    pyiceberg_catalog.create_namespace(name)
    yield name
    for ident in pyiceberg_catalog.list_tables(name):
        pyiceberg_catalog.drop_table(ident)
    pyiceberg_catalog.drop_namespace(name)


def rows(ids):
    cities = ["ams", "ber", "cph"]
    return [
        {"id": i, "city": cities[i % 3], "amount": i * 1.5,
         "ts": datetime.datetime(2026, 1, 1 + i % 28, 12, 30)}
        for i in ids
    ]


def test_pyiceberg_writes_basin_reads(flight_url, pyiceberg_catalog, namespace):
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "city", StringType(), required=False),
        NestedField(3, "amount", DoubleType(), required=False),
        NestedField(4, "ts", TimestampType(), required=False),
    )
    spec = PartitionSpec(
        PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="city"),
        PartitionField(source_id=4, field_id=1001, transform=DayTransform(), name="ts_day"),
    )
    table = pyiceberg_catalog.create_table(f"{namespace}.sales", schema=schema, partition_spec=spec)
    arrow_schema = table.schema().as_arrow()
    table.append(pa.Table.from_pylist(rows(range(0, 30)), schema=arrow_schema))
    table.append(pa.Table.from_pylist(rows(range(30, 60)), schema=arrow_schema))
    table.delete(delete_filter=EqualTo("city", "ber"))
    expected = pyiceberg_catalog.load_table(f"{namespace}.sales").scan().to_arrow()
    expected_rows = sorted(expected.to_pylist(), key=lambda r: r["id"])
    assert len(expected_rows) == 40

    got = sql(flight_url, f"SELECT id, city, amount, ts FROM rest.{namespace}.sales ORDER BY id")
    assert got.to_pylist() == expected_rows
    # pyiceberg gives its tables a name mapping: an identity-partition column is then read by
    # field id (a file added without ids may leave it out), the others by name.
    assert reader_of(flight_url, f"SELECT city FROM rest.{namespace}.sales") == "iceberg-rust"
    assert reader_of(flight_url,
                     f"SELECT id, amount FROM rest.{namespace}.sales") == "datafusion-parquet"
    # Pruning by partition works on pyiceberg's files too.
    got = sql(flight_url,
              f"SELECT count(*) AS n FROM rest.{namespace}.sales WHERE city = 'ams' "
              "AND ts >= TIMESTAMP '2026-01-05 00:00:00'")
    assert got.column("n").to_pylist() == [
        sum(1 for r in expected_rows if r["city"] == "ams" and r["ts"] >= datetime.datetime(2026, 1, 5))
    ]
    snaps = sql(flight_url, f'SELECT operation FROM rest.{namespace}."sales$snapshots" ORDER BY committed_at')
    assert snaps.column("operation").to_pylist()[:2] == ["append", "append"]


def reader_of(flight_url, query):
    plan = sql(flight_url, "EXPLAIN " + query).column(1).to_pylist()[-1]
    return plan.split("reader=")[1].split(",")[0].split()[0]


def test_renamed_readded_and_sanitized_columns_read_by_field_id(flight_url, pyiceberg_catalog,
                                                                namespace):
    """Basin reads most tables with DataFusion's Parquet reader, matching columns by name; a
    table whose history renamed a column or re-used a name, or whose names a writer rewrites
    in its files (pyiceberg stores `unit-price` as `unit_x2Dprice`), is read by field id."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "name", StringType(), required=False),
        NestedField(3, "score", DoubleType(), required=False),
    )
    table = pyiceberg_catalog.create_table(f"{namespace}.evolved", schema=schema)
    table.append(pa.Table.from_pylist([{"id": 1, "name": "a", "score": 1.5}],
                                      schema=table.schema().as_arrow()))
    plain = f"SELECT id, name, score FROM rest.{namespace}.evolved"
    assert reader_of(flight_url, plain) == "datafusion-parquet"
    assert sql(flight_url, plain).to_pylist() == [{"id": 1, "name": "a", "score": 1.5}]

    with table.update_schema() as update:
        update.rename_column("score", "points")
    with table.update_schema() as update:
        update.delete_column("name")
    with table.update_schema() as update:
        update.add_column("name", StringType())
    table = pyiceberg_catalog.load_table(f"{namespace}.evolved")
    table.append(pa.Table.from_pylist([{"id": 2, "points": 2.5, "name": "b"}],
                                      schema=table.schema().as_arrow()))
    query = f"SELECT id, points, name FROM rest.{namespace}.evolved ORDER BY id"
    assert reader_of(flight_url, query) == "iceberg-rust"
    # The first file's `name` is another field: the new column reads as NULL there.
    assert sql(flight_url, query).to_pylist() == [
        {"id": 1, "points": 1.5, "name": None},
        {"id": 2, "points": 2.5, "name": "b"},
    ]
    # A filter on a renamed column prunes and filters by field id too.
    got = sql(flight_url, f"SELECT id FROM rest.{namespace}.evolved WHERE points > 2")
    assert got.column("id").to_pylist() == [2]
    # `id` alone was never renamed: read by name.
    assert reader_of(flight_url, f"SELECT id FROM rest.{namespace}.evolved") == "datafusion-parquet"

    odd = pyiceberg_catalog.create_table(
        f"{namespace}.odd_names",
        schema=Schema(NestedField(1, "id", LongType(), required=False),
                      NestedField(2, "unit-price", DoubleType(), required=False)))
    odd.append(pa.Table.from_pylist([{"id": 1, "unit-price": 9.75}],
                                    schema=odd.schema().as_arrow()))
    query = f'SELECT id, "unit-price" FROM rest.{namespace}.odd_names'
    assert reader_of(flight_url, query) == "iceberg-rust"
    assert sql(flight_url, query).to_pylist() == [{"id": 1, "unit-price": 9.75}]


def test_basin_writes_pyiceberg_reads(flight_url, pyiceberg_catalog, namespace):
    sql(flight_url,
        f"CREATE TABLE rest.{namespace}.orders WITH (partitioning = ARRAY['month(o_orderdate)']) "
        "AS SELECT o_orderkey, o_custkey, o_orderstatus, o_totalprice, o_orderdate "
        "FROM tpch.tiny.orders WHERE o_orderkey < 1000")
    sql(flight_url,
        f"INSERT INTO rest.{namespace}.orders SELECT o_orderkey, o_custkey, o_orderstatus, "
        "o_totalprice, o_orderdate FROM tpch.tiny.orders WHERE o_orderkey >= 1000 AND o_orderkey < 2000")
    expected = sql(flight_url,
                   "SELECT o_orderkey, o_custkey, o_orderstatus, o_totalprice, o_orderdate "
                   "FROM tpch.tiny.orders WHERE o_orderkey < 2000 ORDER BY o_orderkey")

    table = pyiceberg_catalog.load_table(f"{namespace}.orders")
    assert [f.name for f in table.schema().fields] == [
        "o_orderkey", "o_custkey", "o_orderstatus", "o_totalprice", "o_orderdate"]
    assert [str(f.field_type) for f in table.schema().fields] == [
        "long", "long", "string", "decimal(15, 2)", "date"]
    assert [str(f.transform) for f in table.spec().fields] == ["month"]
    assert len(table.snapshots()) == 2
    got = table.scan().to_arrow().sort_by("o_orderkey")
    assert got.to_pylist() == expected.to_pylist()
    # Partition pruning in pyiceberg over Basin's files.
    got = table.scan(row_filter="o_orderdate >= '1998-01-01'").to_arrow()
    assert sorted(got.column("o_orderkey").to_pylist()) == [
        r["o_orderkey"] for r in expected.to_pylist() if r["o_orderdate"] >= datetime.date(1998, 1, 1)]


def test_basin_deletes_by_partition_pyiceberg_reads(flight_url, pyiceberg_catalog, namespace):
    """Basin's own commits through the REST catalog: a DELETE of whole partitions, a
    rollback and a TRUNCATE, each read back by pyiceberg."""
    sql(flight_url,
        f"CREATE TABLE rest.{namespace}.orders WITH (partitioning = ARRAY['o_orderstatus']) "
        "AS SELECT o_orderkey, o_orderstatus FROM tpch.tiny.orders WHERE o_orderkey < 3000")
    everything = sql(flight_url, f"SELECT count(*) AS n FROM rest.{namespace}.orders")["n"][0].as_py()
    kept = sql(flight_url, f"SELECT o_orderkey FROM rest.{namespace}.orders "
               "WHERE o_orderstatus <> 'F' ORDER BY o_orderkey")["o_orderkey"].to_pylist()
    deleted = sql(flight_url, f"DELETE FROM rest.{namespace}.orders WHERE o_orderstatus = 'F'")
    assert deleted["count"][0].as_py() == everything - len(kept)

    table = pyiceberg_catalog.load_table(f"{namespace}.orders")
    assert [s.summary.operation.value for s in table.snapshots()] == ["append", "delete"]
    got = sorted(table.scan().to_arrow().column("o_orderkey").to_pylist())
    assert got == kept
    first = table.snapshots()[0].snapshot_id
    # Time travel in pyiceberg still sees every row.
    assert table.scan(snapshot_id=first).to_arrow().num_rows == everything

    sql(flight_url, f"TRUNCATE TABLE rest.{namespace}.orders")
    assert pyiceberg_catalog.load_table(f"{namespace}.orders").scan().to_arrow().num_rows == 0
    sql(flight_url, f"ALTER TABLE rest.{namespace}.orders EXECUTE "
        f"rollback_to_snapshot(snapshot_id => {first})")
    table = pyiceberg_catalog.load_table(f"{namespace}.orders")
    assert table.current_snapshot().snapshot_id == first
    assert table.scan().to_arrow().num_rows == everything


def test_basin_updates_and_deletes_rows_pyiceberg_reads(flight_url, pyiceberg_catalog, namespace):
    """UPDATE and DELETE by any condition (files rewritten, copy-on-write) through the REST
    catalog; pyiceberg reads the same rows, and reads the old version by time travel. Basin
    also updates a table whose last change pyiceberg made (its own delete)."""
    sql(flight_url,
        f"CREATE TABLE rest.{namespace}.orders WITH (partitioning = ARRAY['o_orderstatus']) "
        "AS SELECT o_orderkey, o_orderstatus, o_totalprice FROM tpch.tiny.orders "
        "WHERE o_orderkey < 3000")
    before = sql(flight_url, f"SELECT sum(o_totalprice) AS s FROM rest.{namespace}.orders")["s"][0].as_py()
    updated = sql(flight_url, f"UPDATE rest.{namespace}.orders SET o_totalprice = o_totalprice * 2 "
                  "WHERE o_orderkey % 7 = 0")
    changed = sql(flight_url, f"SELECT count(*) AS n FROM rest.{namespace}.orders "
                  "WHERE o_orderkey % 7 = 0")["n"][0].as_py()
    assert updated["count"][0].as_py() == changed > 0
    deleted = sql(flight_url, f"DELETE FROM rest.{namespace}.orders WHERE o_totalprice > 300000")
    expected = sql(flight_url, f"SELECT o_orderkey, o_totalprice FROM rest.{namespace}.orders "
                   "ORDER BY o_orderkey").to_pylist()
    assert deleted["count"][0].as_py() > 0

    table = pyiceberg_catalog.load_table(f"{namespace}.orders")
    assert [s.summary.operation.value for s in table.snapshots()] == ["append", "overwrite", "overwrite"]
    got = table.scan(selected_fields=("o_orderkey", "o_totalprice")).to_arrow().sort_by("o_orderkey")
    assert [{"o_orderkey": r["o_orderkey"], "o_totalprice": float(r["o_totalprice"])} for r in got.to_pylist()] \
        == [{"o_orderkey": r["o_orderkey"], "o_totalprice": float(r["o_totalprice"])} for r in expected]
    first = table.snapshots()[0].snapshot_id
    old = table.scan(snapshot_id=first).to_arrow()
    assert abs(float(pc.sum(old.column("o_totalprice")).as_py()) - float(before)) < 0.01

    # pyiceberg deletes (its own commit), then Basin updates what is left.
    table.delete(EqualTo("o_orderstatus", "F"))
    left = sql(flight_url, f"SELECT count(*) AS n FROM rest.{namespace}.orders")["n"][0].as_py()
    assert left == len(pyiceberg_catalog.load_table(f"{namespace}.orders").scan().to_arrow())
    touched = sql(flight_url, f"UPDATE rest.{namespace}.orders SET o_orderstatus = 'X' "
                  "WHERE o_orderstatus = 'O'")["count"][0].as_py()
    statuses = pyiceberg_catalog.load_table(f"{namespace}.orders").scan().to_arrow().column("o_orderstatus")
    assert statuses.to_pylist().count("X") == touched > 0
    assert "O" not in statuses.to_pylist() and "F" not in statuses.to_pylist()


def test_basin_evolves_schema_pyiceberg_reads(flight_url, pyiceberg_catalog, namespace):
    """RENAME COLUMN, a type promotion and DROP NOT NULL committed by Basin through the REST
    catalog: pyiceberg sees the new schema (same field ids) and reads old files under it."""
    sql(flight_url, f"CREATE TABLE rest.{namespace}.m (id INT NOT NULL, price REAL, note VARCHAR)")
    sql(flight_url, f"INSERT INTO rest.{namespace}.m VALUES (1, 1.5, 'a'), (2, 2.5, 'b')")
    before = pyiceberg_catalog.load_table(f"{namespace}.m").schema()
    for statement in ("RENAME COLUMN note TO label", "ALTER COLUMN id SET DATA TYPE BIGINT",
                      "ALTER COLUMN price SET DATA TYPE DOUBLE", "ALTER COLUMN id DROP NOT NULL"):
        sql(flight_url, f"ALTER TABLE rest.{namespace}.m {statement}")
    table = pyiceberg_catalog.load_table(f"{namespace}.m")
    after = table.schema()
    assert [(f.field_id, f.name, str(f.field_type), f.required) for f in after.fields] == [
        (before.find_field("id").field_id, "id", "long", False),
        (before.find_field("price").field_id, "price", "double", False),
        (before.find_field("note").field_id, "label", "string", False),
    ]
    got = table.scan().to_arrow().sort_by("id").to_pylist()
    assert got == [{"id": 1, "price": 1.5, "label": "a"}, {"id": 2, "price": 2.5, "label": "b"}]
    assert sql(flight_url, f"SELECT label FROM rest.{namespace}.m ORDER BY id")["label"].to_pylist() == ["a", "b"]


def race_updates_with_appends(flight_url, pyiceberg_catalog, table, update, first_id, rounds):
    """Runs `rounds` Basin `update`s while pyiceberg appends `rounds` batches of 10 rows
    (ids from `first_id`, source 'pyiceberg', v 0); returns (committed, conflicts)."""
    arrow_schema = pyiceberg_catalog.load_table(table).schema().as_arrow()
    errors, conflicts, successes = [], [], []

    def pyiceberg_writer():
        try:
            for i in range(rounds):
                batch = pa.Table.from_pylist(
                    [{"id": first_id + i * 10 + k, "source": "pyiceberg", "v": 0} for k in range(10)],
                    schema=arrow_schema)
                for attempt in range(30):
                    try:
                        pyiceberg_catalog.load_table(table).append(batch)
                        break
                    except CommitFailedException:
                        if attempt == 29:
                            raise
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def basin_updater():
        for _ in range(rounds):
            try:
                sql(flight_url, update)
                successes.append(1)
            except Exception as e:  # noqa: BLE001 - classified below
                if "conflict" in str(e) and table in str(e):
                    conflicts.append(e)
                else:
                    errors.append(e)

    threads = [threading.Thread(target=pyiceberg_writer), threading.Thread(target=basin_updater)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    print(f"{update}: {len(successes)} committed, {len(conflicts)} conflicts")
    return len(successes), len(conflicts)


def test_update_racing_appends_loses_nothing(flight_url, pyiceberg_catalog, namespace):
    """Basin UPDATEs while pyiceberg appends to the same table (serializable isolation):
    appends of rows the UPDATE's condition cannot match are committed past automatically;
    appends it may match fail the UPDATE as a conflict naming the table, never half. No
    appended row is lost or duplicated, and updated rows carry exactly the committed UPDATEs."""
    table = f"{namespace}.events"
    sql(flight_url, f"CREATE TABLE rest.{table} (id BIGINT, source VARCHAR, v BIGINT)")
    sql(flight_url, f"INSERT INTO rest.{table} VALUES (1, 'seed', 0), (2, 'seed', 0)")
    rounds = 8
    # Appends elsewhere (their files' bounds exclude 'seed'): every UPDATE commits.
    committed, conflicts = race_updates_with_appends(
        flight_url, pyiceberg_catalog, table,
        f"UPDATE rest.{table} SET v = v + 1 WHERE source = 'seed'", 1000, rounds)
    assert (committed, conflicts) == (rounds, 0)
    counts = sql(flight_url,
                 f"SELECT source, count(*) AS n, count(DISTINCT id) AS d, min(v) AS lo, max(v) AS hi "
                 f"FROM rest.{table} GROUP BY source ORDER BY source").to_pylist()
    assert counts == [{"source": "pyiceberg", "n": rounds * 10, "d": rounds * 10, "lo": 0, "hi": 0},
                      {"source": "seed", "n": 2, "d": 2, "lo": rounds, "hi": rounds}]
    # Appends the condition matches: conflicts, reported as such; nothing lost or doubled.
    committed, conflicts = race_updates_with_appends(
        flight_url, pyiceberg_catalog, table,
        f"UPDATE rest.{table} SET v = v + 1 WHERE v >= 0", 5000, rounds)
    assert committed + conflicts == rounds and committed > 0
    counts = sql(flight_url,
                 f"SELECT source, count(*) AS n, count(DISTINCT id) AS d, max(v) AS hi "
                 f"FROM rest.{table} GROUP BY source ORDER BY source").to_pylist()
    assert counts == [{"source": "pyiceberg", "n": rounds * 20, "d": rounds * 20, "hi": committed},
                      {"source": "seed", "n": 2, "d": 2, "hi": rounds + committed}]
    assert len(pyiceberg_catalog.load_table(table).scan().to_arrow()) == rounds * 20 + 2


def test_concurrent_appends_lose_nothing(flight_url, pyiceberg_catalog, namespace):
    sql(flight_url, f"CREATE TABLE rest.{namespace}.events (id BIGINT, source VARCHAR)")
    table = pyiceberg_catalog.load_table(f"{namespace}.events")
    arrow_schema = table.schema().as_arrow()
    rounds = 8
    errors = []

    def pyiceberg_writer():
        try:
            for i in range(rounds):
                batch = pa.Table.from_pylist(
                    [{"id": 1000 + i * 10 + k, "source": "pyiceberg"} for k in range(10)],
                    schema=arrow_schema)
                for attempt in range(20):
                    try:
                        pyiceberg_catalog.load_table(f"{namespace}.events").append(batch)
                        break
                    except CommitFailedException:
                        if attempt == 19:
                            raise
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def basin_writer():
        try:
            for i in range(rounds):
                sql(flight_url,
                    f"INSERT INTO rest.{namespace}.events "
                    f"SELECT {i * 10} + n_nationkey, 'basin' FROM tpch.tiny.nation WHERE n_nationkey < 10")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=pyiceberg_writer), threading.Thread(target=basin_writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    counts = sql(flight_url,
                 f"SELECT source, count(*) AS n, count(DISTINCT id) AS d FROM rest.{namespace}.events "
                 "GROUP BY source ORDER BY source").to_pylist()
    assert counts == [{"source": "basin", "n": rounds * 10, "d": rounds * 10},
                      {"source": "pyiceberg", "n": rounds * 10, "d": rounds * 10}]
    snaps = sql(flight_url,
                f'SELECT count(*) AS n FROM rest.{namespace}."events$snapshots"').column("n").to_pylist()
    assert snaps == [2 * rounds]
    table = pyiceberg_catalog.load_table(f"{namespace}.events")
    assert len(table.scan().to_arrow()) == 2 * rounds * 10


def test_s3_access_denied_names_the_table(pyiceberg_catalog, namespace, tmp_path):
    """A catalog whose S3 secret is wrong: the REST catalog answers, S3 refuses. The error
    names the table and the cause; the secret appears nowhere; the table is unchanged."""
    import os
    import subprocess
    from conftest import basin_binary, rest_catalog_toml

    schema = Schema(NestedField(1, "id", LongType(), required=False))
    table = pyiceberg_catalog.create_table(f"{namespace}.guarded", schema=schema)
    table.append(pa.Table.from_pylist([{"id": 1}], schema=table.schema().as_arrow()))
    config = tmp_path / "basin.toml"
    config.write_text(rest_catalog_toml())
    env = dict(os.environ, BASIN_TEST_S3_SECRET_KEY="wrong-secret-value", BASIN_DATA_DIR=str(tmp_path))
    for statement in (f"SELECT * FROM rest.{namespace}.guarded",
                      f"INSERT INTO rest.{namespace}.guarded VALUES (2)"):
        out = subprocess.run([basin_binary(), "standalone", "--config", str(config), "-e", statement],
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode != 0, out.stdout
        assert f"{namespace}.guarded" in out.stderr, out.stderr
        assert "wrong-secret-value" not in out.stderr + out.stdout
    assert len(pyiceberg_catalog.load_table(f"{namespace}.guarded").snapshots()) == 1


MERGE_SQL = """
MERGE INTO {target} t USING {source} s ON t.k = s.k
WHEN MATCHED AND s.op = 'd' THEN DELETE
WHEN MATCHED AND s.v > t.v THEN UPDATE SET v = s.v, note = 'up'
WHEN MATCHED THEN UPDATE SET note = 'seen'
WHEN NOT MATCHED AND s.op <> 'skip' THEN INSERT (k, v, note) VALUES (s.k, s.v, 'new')
WHEN NOT MATCHED BY SOURCE AND t.v < 100 THEN DELETE
WHEN NOT MATCHED BY SOURCE THEN UPDATE SET note = 'orphan'
"""


def merge_data():
    """10,000 target rows (NULL keys, duplicated keys) and 5,000 source rows (NULL keys,
    duplicated keys that match no target row)."""
    target = [{"k": None if i % 97 == 0 else i, "v": (i * 7) % 1000, "note": "orig"} for i in range(10_000)]
    target += [{"k": i, "v": 500, "note": "twin"} for i in range(6_000, 6_050)]
    source = [{"k": None if i % 50 == 0 else k, "v": (k * 13) % 1000,
               "op": "d" if k % 10 == 0 else ("skip" if k % 7 == 0 else "u")}
              for i, k in enumerate(range(5_000, 15_000, 2))]
    source += [{"k": k, "v": 1, "op": "u"} for k in range(20_001, 20_100, 3)] * 2
    return target, source


def test_merge_matches_duckdb(flight_url, pyiceberg_catalog, namespace):
    """MERGE with every clause kind over Iceberg tables (source: another Iceberg table) gives
    DuckDB's MERGE rows and count; a target row matched by two source rows fails the statement
    and Basin commits nothing (DuckDB 1.5 does not enforce the SQL standard's cardinality rule:
    it applies both)."""
    import duckdb

    target, source = merge_data()
    schema_t = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("note", pa.string())])
    schema_s = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("op", pa.string())])
    t_arrow = pa.Table.from_pylist(target, schema=schema_t)
    s_arrow = pa.Table.from_pylist(source, schema=schema_s)
    for name, data in (("target", t_arrow), ("source", s_arrow)):
        table = pyiceberg_catalog.create_table(f"{namespace}.{name}", schema=data.schema)
        table.append(data)

    duck = duckdb.connect()
    duck.register("t_arrow", t_arrow)
    duck.register("s_arrow", s_arrow)
    duck.execute("CREATE TABLE target AS SELECT * FROM t_arrow; CREATE TABLE source AS SELECT * FROM s_arrow")
    expected_count = duck.execute(MERGE_SQL.format(target="target", source="source")).fetchall()[0][0]
    expected = sorted(duck.execute("SELECT k, v, note FROM target").fetchall(),
                      key=lambda r: (r[0] is None, r[0] or 0, r[1], r[2]))

    got_count = sql(flight_url, MERGE_SQL.format(target=f"rest.{namespace}.target",
                                                 source=f"rest.{namespace}.source"))["count"][0].as_py()
    got = sql(flight_url, f"SELECT k, v, note FROM rest.{namespace}.target").to_pylist()
    got = sorted(((r["k"], r["v"], r["note"]) for r in got), key=lambda r: (r[0] is None, r[0] or 0, r[1], r[2]))
    assert got_count == expected_count
    assert len(got) == len(expected)
    assert got == expected
    # pyiceberg reads the same rows.
    read_back = pyiceberg_catalog.load_table(f"{namespace}.target").scan().to_arrow().to_pylist()
    assert sorted(((r["k"], r["v"], r["note"]) for r in read_back),
                  key=lambda r: (r[0] is None, r[0] or 0, r[1], r[2])) == expected

    # Cardinality: a source key twice, matching a target row.
    dup = "(SELECT * FROM (VALUES (6001, 5, 'u'), (6001, 6, 'u')) AS d(k, v, op))"
    snapshots = len(pyiceberg_catalog.load_table(f"{namespace}.target").snapshots())
    with pytest.raises(Exception, match="more than one source row"):
        sql(flight_url, MERGE_SQL.format(target=f"rest.{namespace}.target", source=dup))
    assert len(pyiceberg_catalog.load_table(f"{namespace}.target").snapshots()) == snapshots


def s3_filesystem():
    import os
    from pyarrow import fs as pafs
    endpoint = os.environ["BASIN_TEST_S3_ENDPOINT"]
    return pafs.S3FileSystem(
        access_key=os.environ["BASIN_TEST_S3_ACCESS_KEY"],
        secret_key=os.environ["BASIN_TEST_S3_SECRET_KEY"],
        endpoint_override=endpoint, scheme=endpoint.split("://")[0],
        region=os.environ["BASIN_TEST_S3_REGION"], force_virtual_addressing=False)


def test_add_files_checks_each_file(flight_url, pyiceberg_catalog, namespace):
    """`add_files` over a folder of Parquet files (Hive-style partition folders), each checked
    before anything is committed: good files land (one with an int id promoted to the table's
    bigint, one without the partition column, whose folder gives it), and a file of the wrong
    type, one with nulls in a required column, one whose rows span two partitions, one in the
    folder of another partition and a copy of a good file are each rejected with the reason.
    A dry run commits nothing; a second run finds them all in the table already; pyiceberg
    reads exactly what Basin reads."""
    import os
    import pyarrow.parquet as pq

    bucket = os.environ["BASIN_TEST_S3_BUCKET"]
    folder = f"{bucket}/{namespace}/import"
    s3 = s3_filesystem()

    def put(name, table):
        pq.write_table(table, f"{folder}/{name}", filesystem=s3)

    schema = pa.schema([("id", pa.int64()), ("city", pa.string()), ("amount", pa.float64())])
    good = pa.table({"id": [1, 2], "city": ["ams", "ams"], "amount": [1.0, 2.0]}, schema=schema)
    put("city=ams/a_good.parquet", good)
    put("city=ams/b_int_id.parquet", pa.table({
        "id": pa.array([4], pa.int32()), "city": ["ams"], "amount": [4.0]}))
    put("city=ber/c_no_city.parquet", pa.table({"id": [3], "amount": [3.0]}))
    put("city=ams/d_amount_text.parquet", pa.table({"id": [5], "city": ["ams"], "amount": ["5"]}))
    put("city=ams/e_null_id.parquet", pa.table(
        {"id": [6, None], "city": ["ams", "ams"], "amount": [6.0, 7.0]}, schema=schema))
    put("city=ams/f_two_cities.parquet", pa.table(
        {"id": [8, 9], "city": ["ams", "cph"], "amount": [8.0, 9.0]}, schema=schema))
    put("city=ams/g_other_city.parquet", pa.table(
        {"id": [10], "city": ["cph"], "amount": [10.0]}, schema=schema))
    put("city=ams/h_copy.parquet", good)
    with s3.open_output_stream(f"{folder}/city=ams/_SUCCESS") as out:
        out.write(b"")

    table = f"rest.{namespace}.events"
    sql(flight_url, f"CREATE TABLE {table} (id BIGINT NOT NULL, city VARCHAR, amount DOUBLE) "
                    "WITH (partitioning = ARRAY['city'])")
    location = f"s3://{folder}"

    with pytest.raises(Exception, match="recursive_directory"):
        sql(flight_url, f"ALTER TABLE {table} EXECUTE add_files(location => '{location}')")

    def outcomes(dry_run):
        out = sql(flight_url, f"ALTER TABLE {table} EXECUTE add_files(location => '{location}', "
                              f"recursive_directory => 'true', dry_run => {str(dry_run).lower()})")
        return {r["file_path"].rsplit("/", 1)[1]: (r["outcome"], r["reason"] or "")
                for r in out.to_pylist()}

    def check(got, added):
        assert set(got) == {"a_good.parquet", "b_int_id.parquet", "c_no_city.parquet",
                            "d_amount_text.parquet", "e_null_id.parquet", "f_two_cities.parquet",
                            "g_other_city.parquet", "h_copy.parquet"}, got
        for name in ("a_good.parquet", "b_int_id.parquet", "c_no_city.parquet"):
            assert got[name] == (added, ""), (name, got[name])
        reasons = {
            "d_amount_text.parquet": "column `amount` is string in the file",
            "e_null_id.parquet": "required column `id` has 1 nulls",
            "f_two_cities.parquet": "several partitions of `city`",
            "g_other_city.parquet": "its folder says `city` is",
            "h_copy.parquet": "same content as",
        }
        for name, reason in reasons.items():
            assert got[name][0] == "rejected" and reason in got[name][1], (name, got[name])

    check(outcomes(dry_run=True), "would add")
    assert pyiceberg_catalog.load_table(f"{namespace}.events").current_snapshot() is None
    check(outcomes(dry_run=False), "added")

    expected = [(1, "ams", 1.0), (2, "ams", 2.0), (3, "ber", 3.0), (4, "ams", 4.0)]
    got = sql(flight_url, f"SELECT id, city, amount FROM {table} ORDER BY id").to_pylist()
    assert [(r["id"], r["city"], r["amount"]) for r in got] == expected
    got = sql(flight_url, f"SELECT count(*) AS n FROM {table} WHERE city = 'ber'").to_pylist()
    assert got == [{"n": 1}]
    py = pyiceberg_catalog.load_table(f"{namespace}.events")
    assert len(py.snapshots()) == 1
    assert "schema.name-mapping.default" in py.properties
    read = py.scan().to_arrow().sort_by("id").to_pylist()
    assert [(r["id"], r["city"], r["amount"]) for r in read] == expected

    again = outcomes(dry_run=False)
    for name in ("a_good.parquet", "b_int_id.parquet", "c_no_city.parquet"):
        assert again[name][0] == "rejected" and "already in the table" in again[name][1], again
    assert len(pyiceberg_catalog.load_table(f"{namespace}.events").snapshots()) == 1

    # A row of the file without the partition column changes: its rewritten file keeps the
    # row's partition value. Expiring the snapshot that read the original leaves the original
    # where it was (it is the importer's, not the table's).
    sql(flight_url, f"UPDATE {table} SET amount = amount + 10 WHERE id = 3")
    expected[2] = (3, "ber", 13.0)
    got = sql(flight_url, f"SELECT id, city, amount FROM {table} ORDER BY id").to_pylist()
    assert [(r["id"], r["city"], r["amount"]) for r in got] == expected
    read = pyiceberg_catalog.load_table(f"{namespace}.events").scan().to_arrow().sort_by("id")
    assert [(r["id"], r["city"], r["amount"]) for r in read.to_pylist()] == expected
    out = sql(flight_url, f"ALTER TABLE {table} EXECUTE expire_snapshots(retention_threshold => "
                          "'0s', allow_short_retention => true, retain_last => 1)").to_pylist()
    metrics = {r["metric_name"]: r["metric_value"] for r in out}
    assert metrics["expired_snapshots_count"] == 1, metrics
    assert s3.get_file_info(f"{folder}/city=ber/c_no_city.parquet").size > 0
