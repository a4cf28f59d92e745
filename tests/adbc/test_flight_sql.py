"""Basin's Flight SQL endpoint through clients we did not write: the ADBC Flight SQL driver
(DB-API, metadata, prepared statements, Arrow fetch) and pyarrow.flight."""

import datetime
import decimal
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as fs
import adbc_driver_manager
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import tpch_answers
from test_federation import federation  # noqa: F401 - the fixture, for the pushdown test

SQL_INFO_IDS = list(range(0, 12)) + [100, 101] + list(range(500, 577))


def connect(url, **kwargs):
    return fs.connect(url, **kwargs)


def test_query_parameters_and_arrow_fetch(flight_url):
    with connect(flight_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) AS n FROM tpch.tiny.lineitem")
        assert cur.fetchall() == [(60175,)]
        cur.execute(
            "SELECT n_name, n_regionkey FROM tpch.tiny.nation WHERE n_regionkey = $1 ORDER BY n_name",
            parameters=(3,),
        )
        rows = cur.fetchall()
        assert rows[0] == ("FRANCE", 3) and len(rows) == 5
        cur.execute(
            "SELECT o_orderkey, o_totalprice, o_orderdate FROM tpch.tiny.orders ORDER BY o_orderkey LIMIT 2"
        )
        table = cur.fetch_arrow_table()
        assert table.schema.field("o_totalprice").type == pa.decimal128(15, 2)
        assert table.schema.field("o_orderdate").type == pa.date32()
        assert table.column("o_orderkey").to_pylist() == [1, 2]
        assert table.column("o_orderdate").to_pylist()[0] == datetime.date(1996, 1, 2)
        md = table.schema.field("o_totalprice").metadata
        assert md[b"ARROW:FLIGHT:SQL:TYPE_NAME"] == b"DECIMAL(15,2)"
        assert md[b"ARROW:FLIGHT:SQL:TABLE_NAME"] == b"orders"
        assert md[b"ARROW:FLIGHT:SQL:SCHEMA_NAME"] == b"tiny"


def test_prepared_statement_reused_with_new_parameters(flight_url):
    with connect(flight_url) as conn, conn.cursor() as cur:
        sql = "SELECT count(*) FROM tpch.tiny.orders WHERE o_orderpriority = $1"
        counts = {}
        for p in ["1-URGENT", "5-LOW", "1-URGENT"]:
            cur.execute(sql, parameters=(p,))
            counts.setdefault(p, set()).add(cur.fetchone()[0])
        assert all(len(v) == 1 for v in counts.values())
        assert sum(next(iter(v)) for v in counts.values()) < 15000


def test_ddl_dml_and_session_state(flight_url):
    with connect(flight_url) as a, connect(flight_url) as b:
        ca, cb = a.cursor(), b.cursor()
        ca.execute("CREATE TABLE adbc_t AS VALUES (1, 'x'), (2, 'y')")
        ca.execute("INSERT INTO adbc_t VALUES (3, 'z')")
        ca.execute("SELECT count(*) FROM adbc_t")
        assert ca.fetchone()[0] == 3
        ca.execute("USE tpch.tiny")
        ca.execute("SELECT count(*) FROM region")
        assert ca.fetchone()[0] == 5
        # Session state belongs to one connection.
        with pytest.raises(adbc_driver_manager.ProgrammingError):
            cb.execute("SELECT count(*) FROM region")
        ca.close()
        cb.close()


def test_errors_keep_the_connection(flight_url):
    with connect(flight_url) as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.ProgrammingError) as err:
            cur.execute("SELECT * FROM tpch.tiny.no_such_table")
        assert "NOT_FOUND" in str(err.value) and "no_such_table" in str(err.value)
        with pytest.raises(adbc_driver_manager.Error) as err:
            cur.execute("SELEC 1")
        assert "INVALID_ARGUMENT" in str(err.value)
        cur.execute("SELECT 41 + 1")
        assert cur.fetchone() == (42,)


def test_metadata_discovery(flight_url):
    with connect(flight_url) as conn:
        objects = conn.adbc_get_objects(depth="columns", catalog_filter="tpch").read_all().to_pylist()
        assert [c["catalog_name"] for c in objects] == ["tpch"]
        schemas = {s["db_schema_name"]: s for s in objects[0]["catalog_db_schemas"]}
        assert {"tiny", "sf1", "sf10", "sf100", "sf1000", "sf0_1"} <= set(schemas)
        tables = {t["table_name"]: t for t in schemas["tiny"]["db_schema_tables"]}
        assert set(tables) == {
            "customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier"
        }
        assert tables["lineitem"]["table_type"] == "TABLE"
        columns = [c["column_name"] for c in tables["nation"]["table_columns"]]
        assert columns == ["n_nationkey", "n_name", "n_regionkey", "n_comment"]
        schema = conn.adbc_get_table_schema("lineitem", catalog_filter="tpch", db_schema_filter="tiny")
        assert schema.field("l_quantity").type == pa.decimal128(15, 2)
        assert schema.field("l_shipdate").type == pa.date32()
        assert schema.field("l_orderkey").type == pa.int64()
        types = conn.adbc_get_table_types()
        assert "TABLE" in types and "VIEW" in types
        info = conn.adbc_get_info()
        assert info["vendor_name"] == "Basin"


def _any(type_name: str, value: bytes = b"") -> bytes:
    def field(tag, data):
        n, out = len(data), bytearray([tag])
        while True:
            b = n & 0x7F
            n >>= 7
            out.append(b | (0x80 if n else 0))
            if not n:
                break
        return bytes(out) + data

    url = f"type.googleapis.com/arrow.flight.protocol.sql.{type_name}".encode()
    return field(0x0A, url) + (field(0x12, value) if value else b"")


def test_sql_info_answers_every_standard_id_pyarrow(flight_url):
    client = flight.FlightClient(flight_url)
    info = client.get_flight_info(flight.FlightDescriptor.for_command(_any("CommandGetSqlInfo")))
    table = client.do_get(info.endpoints[0].ticket).read_all()
    ids = set(table.column("info_name").to_pylist())
    missing = [i for i in SQL_INFO_IDS if i not in ids]
    assert not missing, f"GetSqlInfo lacks ids {missing}"
    values = dict(zip(table.column("info_name").to_pylist(), table.column("value").to_pylist()))
    assert values[0] == "Basin"
    assert values[504] == '"'
    assert values[563] is False  # transactions unsupported
    xdbc = client.get_flight_info(flight.FlightDescriptor.for_command(_any("CommandGetXdbcTypeInfo")))
    types = client.do_get(xdbc.endpoints[0].ticket).read_all()
    assert "BIGINT" in types.column("type_name").to_pylist()
    for cmd in ["CommandGetPrimaryKeys", "CommandGetExportedKeys", "CommandGetImportedKeys"]:
        # table = "nation" (field 3 of the command)
        fi = client.get_flight_info(
            flight.FlightDescriptor.for_command(_any(cmd, b"\x1a\x06nation"))
        )
        assert client.do_get(fi.endpoints[0].ticket).read_all().num_rows == 0


@pytest.mark.parametrize("name,sql,expected,rowsort", tpch_answers.load(), ids=lambda v: v if isinstance(v, str) and v.startswith("q") else "")
def test_tpch_reference_answers(flight_url, name, sql, expected, rowsort):
    with connect(flight_url) as conn, conn.cursor() as cur:
        cur.execute(sql)
        rows = cur.fetchall()
        assert tpch_answers.matches(rows, expected, rowsort), (
            f"{name}: got {[' '.join(tpch_answers.format_value(v) for v in r) for r in rows][:5]}"
        )


def test_concurrent_clients(flight_url):
    seconds = float(os.environ.get("BASIN_ADBC_SOAK_SECONDS", "60"))
    clients = int(os.environ.get("BASIN_ADBC_SOAK_CLIENTS", "16"))
    queries = [q for q in tpch_answers.load() if q[0] in {"q01", "q03", "q05", "q06", "q10", "q12", "q14", "q19"}]
    errors, runs = [], [0] * clients
    deadline = time.time() + seconds

    def worker(i):
        try:
            with connect(flight_url) as conn, conn.cursor() as cur:
                k = i
                while time.time() < deadline:
                    name, sql, expected, rowsort = queries[k % len(queries)]
                    cur.execute(sql)
                    if not tpch_answers.matches(cur.fetchall(), expected, rowsort):
                        errors.append(f"client {i}: wrong answer for {name}")
                    runs[i] += 1
                    k += 1
        except Exception as e:  # noqa: BLE001 - every failure counts
            errors.append(f"client {i}: {e}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=seconds + 300)
    print(f"{clients} clients, {seconds:.0f}s: {sum(runs)} queries, {len(errors)} errors")
    assert not errors, errors[:5]
    assert all(r > 0 for r in runs)


def test_authentication(secured_url):
    with fs.connect(secured_url, db_kwargs={"username": "alice", "password": "wonderland"}) as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM tpch.tiny.nation")
            assert cur.fetchone() == (25,)
    with pytest.raises(adbc_driver_manager.Error) as err:
        with fs.connect(secured_url, db_kwargs={"username": "alice", "password": "wrong"}) as conn:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
    assert "UNAUTHENTICATED" in str(err.value).upper()
    # No token at all: every call, metadata included, is refused.
    client = flight.FlightClient(secured_url)
    with pytest.raises(flight.FlightUnauthenticatedError):
        client.get_flight_info(flight.FlightDescriptor.for_command(_any("CommandGetCatalogs")))
    with pytest.raises(flight.FlightUnauthenticatedError):
        client.get_flight_info(flight.FlightDescriptor.for_command(_any("CommandGetSqlInfo")))


def test_get_schema_pyarrow(flight_url):
    client = flight.FlightClient(flight_url)
    query = b"SELECT n_nationkey, n_name FROM tpch.tiny.nation"
    cmd = _any("CommandStatementQuery", b"\x0a" + bytes([len(query)]) + query)
    schema = client.get_schema(flight.FlightDescriptor.for_command(cmd)).schema
    assert schema.names == ["n_nationkey", "n_name"]
    assert schema.field("n_nationkey").type == pa.int64()
    tables = client.get_schema(flight.FlightDescriptor.for_command(_any("CommandGetTables"))).schema
    assert "table_name" in tables.names


def test_executemany_runs_every_row(flight_url):
    with connect(flight_url) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE many_t (id BIGINT, name VARCHAR)")
        cur.executemany("INSERT INTO many_t VALUES ($1, $2)", [(1, "a"), (2, "b"), (3, "c")])
        cur.execute("SELECT count(*), sum(id) FROM many_t")
        assert cur.fetchone() == (3, 6)


# --- `?` parameters (JDBC's way, and ADBC's when the user writes them) ---------------------


def one(cur, sql, parameters=None):
    cur.execute(sql, parameters=parameters)
    return cur.fetchall()


def test_question_mark_parameters_of_every_type(flight_url):
    with connect(flight_url) as conn, conn.cursor() as cur:
        # The query of the issue: "Failed to parse placeholder id" before.
        sql = "SELECT count(*) FROM tpch.tiny.orders WHERE o_orderkey < ?"
        assert one(cur, sql, (5,)) == one(cur, sql.replace("?", "5"))
        assert one(cur, "SELECT n_nationkey FROM tpch.tiny.nation WHERE n_name = ?", ("FRANCE",)) == [(6,)]
        # Dates and decimals (a Python Decimal arrives as decimal(5,2), the column is (15,2)).
        sql = ("SELECT o_orderkey FROM tpch.tiny.orders WHERE o_orderdate = ? "
               "AND o_totalprice > ? ORDER BY o_orderkey")
        expected = one(cur, sql.replace("= ?", "= DATE '1996-01-02'").replace("> ?", "> 100.50"))
        assert expected
        assert one(cur, sql, (datetime.date(1996, 1, 2), decimal.Decimal("100.50"))) == expected
        # NULL: a typed parameter takes it as a NULL of its type, an untyped one as NULL.
        assert one(cur, "SELECT count(*) FROM tpch.tiny.nation WHERE n_regionkey = ?", (None,)) == [(0,)]
        assert one(cur, "SELECT ? IS NULL, ? AS v", (None, 7)) == [(True, 7)]
        # Several, in a CTE, a subquery, an IN list, CASE, LIMIT and OFFSET, numbered in order.
        sql = ("WITH r AS (SELECT r_regionkey FROM tpch.tiny.region WHERE r_name <> ?) "
               "SELECT n_name, CASE WHEN n_nationkey > ? THEN ? ELSE 'low' END AS level "
               "FROM tpch.tiny.nation WHERE n_regionkey IN (SELECT r_regionkey FROM r) "
               "AND n_nationkey IN (?, ?, ?) ORDER BY n_name LIMIT ? OFFSET ?")
        literal = ("WITH r AS (SELECT r_regionkey FROM tpch.tiny.region WHERE r_name <> 'ASIA') "
                   "SELECT n_name, CASE WHEN n_nationkey > 5 THEN 'high' ELSE 'low' END AS level "
                   "FROM tpch.tiny.nation WHERE n_regionkey IN (SELECT r_regionkey FROM r) "
                   "AND n_nationkey IN (3, 6, 7) ORDER BY n_name LIMIT 2 OFFSET 1")
        expected = one(cur, literal)
        assert len(expected) == 2
        assert one(cur, sql, ("ASIA", 5, "high", 3, 6, 7, 2, 1)) == expected
        # `$n` still works, and a `?` in a string or a quoted identifier is not a parameter.
        assert one(cur, "SELECT $2 - $1", (1, 10)) == [(9,)]
        cur.execute("SELECT '?' AS \"what?\", ? AS v -- why?", parameters=(7,))
        assert cur.fetchall() == [("?", 7)]
        assert [d[0] for d in cur.description] == ["what?", "v"]


def test_question_mark_parameter_schema(flight_url):
    with connect(flight_url) as conn, conn.cursor() as cur:
        schema = cur.adbc_prepare(
            "SELECT o_orderkey FROM tpch.tiny.orders WHERE o_orderkey < ? AND o_orderdate > ? "
            "AND o_totalprice > ? AND o_orderpriority = ? LIMIT ?"
        )
        assert schema.names == ["$1", "$2", "$3", "$4", "$5"]
        assert schema.types == [pa.int64(), pa.date32(), pa.decimal128(15, 2), pa.string(), pa.int64()]
        # A parameter nothing gives a type to is ADBC's "unknown": null.
        assert cur.adbc_prepare("SELECT ?").types == [pa.null()]


def test_question_mark_statement_reexecuted_with_new_values(flight_url):
    with connect(flight_url) as conn, conn.cursor() as cur, conn.cursor() as other:
        sql = "SELECT count(*) FROM tpch.tiny.lineitem WHERE l_orderkey < ? AND l_returnflag = ?"
        seen = {}
        for key, flag in [(100, "R"), (1000, "N"), (100, "R"), (50000, "A")]:
            seen.setdefault((key, flag), set()).add(one(cur, sql, (key, flag))[0][0])
        assert all(len(v) == 1 for v in seen.values()), seen
        for (key, flag), (n,) in seen.items():
            assert one(other, f"SELECT count(*) FROM tpch.tiny.lineitem WHERE l_orderkey < {key} AND l_returnflag = '{flag}'") == [(n,)]
        # The prepared statement reads the table as it is when it runs, not as it was prepared.
        schema = f"lake.p{os.getpid()}"
        other.execute(f"CREATE SCHEMA {schema}")
        other.execute(f"CREATE TABLE {schema}.counts (id BIGINT)")
        other.execute(f"INSERT INTO {schema}.counts VALUES (1), (2)")
        sql = f"SELECT count(*) FROM {schema}.counts WHERE id > ?"
        assert one(cur, sql, (0,)) == [(2,)]
        other.execute(f"INSERT INTO {schema}.counts VALUES (3)")
        assert one(cur, sql, (0,)) == [(3,)]
        assert one(cur, sql, (2,)) == [(1,)]


def test_question_mark_insert_into_iceberg(flight_url):
    table = f"lake.ins{os.getpid()}.items"
    hostile = "x'); DROP TABLE " + table + "; --"
    with connect(flight_url) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA lake.ins{os.getpid()}")
        cur.execute(f"CREATE TABLE {table} (id BIGINT, name VARCHAR, price DECIMAL(10, 2), day DATE)")
        sql = f"INSERT INTO {table} VALUES (?, ?, ?, ?)"
        cur.execute(sql, parameters=(1, "one", decimal.Decimal("1.5"), datetime.date(2024, 1, 31)))
        assert cur.fetchall() == [(1,)]
        # Re-executed (the same prepared statement) and run once per row.
        cur.execute(sql, parameters=(2, hostile, decimal.Decimal("20.25"), datetime.date(2024, 2, 29)))
        cur.executemany(sql, [(3, None, None, None), (4, "four", decimal.Decimal("4"), None)])
        cur.execute(f"SELECT id, name, price, day FROM {table} ORDER BY id")
        assert cur.fetchall() == [
            (1, "one", decimal.Decimal("1.50"), datetime.date(2024, 1, 31)),
            (2, hostile, decimal.Decimal("20.25"), datetime.date(2024, 2, 29)),
            (3, None, None, None),
            (4, "four", decimal.Decimal("4.00"), None),
        ]
        assert one(cur, f"SELECT id FROM {table} WHERE name = ?", (hostile,)) == [(2,)]


def test_question_mark_hostile_values_are_values(flight_url):
    with connect(flight_url) as conn, conn.cursor() as cur:
        for hostile in ["FRANCE' OR '1'='1", "x'; DROP TABLE t; --", "?", "$1", "'", "\\", "\"", "é\x00"]:
            assert one(cur, "SELECT count(*) FROM tpch.tiny.nation WHERE n_name = ?", (hostile,)) == [(0,)]
            assert one(cur, "SELECT ? AS v", (hostile,)) == [(hostile,)]
        assert one(cur, "SELECT count(*) FROM tpch.tiny.nation WHERE n_name = ?", ("FRANCE",)) == [(1,)]


def test_question_mark_errors_name_the_counts(flight_url):
    with connect(flight_url) as conn, conn.cursor() as cur:
        with pytest.raises(adbc_driver_manager.Error) as err:
            cur.execute("SELECT ? + ?", parameters=(1,))
        assert "the statement has 2 parameters but 1 value was bound" in str(err.value)
        with pytest.raises(adbc_driver_manager.Error) as err:
            cur.execute("SELECT count(*) FROM tpch.tiny.nation WHERE n_nationkey < ?")
        assert "the statement has 1 parameter but 0 values were bound" in str(err.value)
        with pytest.raises(adbc_driver_manager.Error) as err:
            cur.execute("SELECT 1", parameters=(1,))
        assert "the statement has 0 parameters but 1 value was bound" in str(err.value)
        with pytest.raises(adbc_driver_manager.Error) as err:
            cur.execute("SELECT ?, $1", parameters=(1,))
        assert "mixes `?` parameters with `$1`" in str(err.value)
        with pytest.raises(adbc_driver_manager.Error) as err:
            cur.execute("SELECT count(*) FROM tpch.tiny.nation WHERE n_nationkey < ?", parameters=("five",))
        assert "parameter 1 takes Int64" in str(err.value)
        # The connection goes on.
        assert one(cur, "SELECT ? * 2", (21,)) == [(42,)]


# A join with GROUP BY: small, so the cluster runs it whole on one executor.
JOIN_SQL = (
    "SELECT n_name, count(*) AS suppliers FROM tpch.tiny.supplier "
    "JOIN tpch.tiny.nation ON s_nationkey = n_nationkey "
    "WHERE s_acctbal > ? AND n_regionkey = ? GROUP BY n_name ORDER BY n_name"
)
JOIN_VALUES = (decimal.Decimal("1000"), 1)
JOIN_LITERAL = JOIN_SQL.replace("> ?", "> 1000").replace("= ?", "= 1")


@pytest.fixture(scope="module")
def job_url():
    """A standalone server where every query is a Ballista job: nothing streams."""
    from conftest import Cluster, free_port, wait_port
    workdir = Path(tempfile.mkdtemp(prefix="basin-adbc-jobs-"))
    cluster = Cluster(workdir)
    try:
        (workdir / "basin.toml").write_text("[server]\nstreamed_stages = false\nsingle_node_max_bytes = 0\n")
        flight = free_port()
        cluster.spawn("jobs", "standalone", "--config", str(workdir / "basin.toml"),
                      "--executors", "1", "--flight-sql-port", str(flight))
        wait_port(flight, cluster.procs)
        yield f"grpc://127.0.0.1:{flight}"
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def explain(cur, sql, parameters):
    cur.execute("EXPLAIN " + sql, parameters=parameters)
    return "\n".join(row[1] for row in cur.fetchall())


def test_question_mark_parameters_on_every_route(flight_url, job_url):
    with connect(flight_url) as conn, conn.cursor() as cur:
        # A scan and filter: one stage, streamed from the executors.
        scan = "SELECT l_orderkey, l_linenumber FROM tpch.tiny.lineitem WHERE l_orderkey < ? AND l_quantity > ?"
        values = (200, decimal.Decimal("45"))
        literal = scan.replace("< ?", "< 200").replace("> ?", "> 45")
        plan = explain(cur, scan, values)
        assert "StreamedStageExec" in plan and "200" in plan, plan
        expected = sorted(one(cur, literal))
        assert expected and sorted(one(cur, scan, values)) == expected
        # A join: whole on one executor.
        plan = explain(cur, JOIN_SQL, JOIN_VALUES)
        assert "StreamedStageExec: partitions=1, executors=1" in plan, plan
        joined = one(cur, JOIN_LITERAL)
        assert joined and one(cur, JOIN_SQL, JOIN_VALUES) == joined
    with connect(job_url) as conn, conn.cursor() as cur:
        # The same as a Ballista job.
        plan = explain(cur, JOIN_SQL, JOIN_VALUES)
        assert "ShuffleWriterExec" in plan and "StreamedStageExec" not in plan, plan
        assert one(cur, JOIN_SQL, JOIN_VALUES) == joined
        assert sorted(one(cur, scan, values)) == expected


def test_question_mark_hostile_values_pushed_to_sources(federation):
    """A filter on a bound string is pushed to PostgreSQL and MariaDB as a literal Basin
    writes for each (MariaDB reads a backslash in a quoted string as an escape). MariaDB
    gets string filters only on binary collations."""
    from test_federation import mariadb, psql
    name = federation["schema"]
    rows = "(1, 'O''Brien'), (2, 'a\\b'), (3, 'x')"  # a\b: one backslash
    psql(federation["pg"], f"CREATE TABLE {name}.people (id int, name text); "
                           f"INSERT INTO {name}.people VALUES {rows}")
    # MariaDB reads a backslash in a quoted string as an escape: doubled here.
    mariadb(federation["my"], f"CREATE TABLE {name}.people (id int, name varchar(40) COLLATE utf8mb4_nopad_bin); "
                              f"INSERT INTO {name}.people VALUES {rows.replace(chr(92), chr(92) * 2)}")
    with connect(federation["url"]) as conn, conn.cursor() as cur:
        for source in ["pg", "my"]:
            sql = f"SELECT id FROM {source}.{name}.people WHERE name = ? ORDER BY id"
            # The filter with its value runs on the source.
            literal = {"pg": "E'O''Brien'", "my": "X'" + b"O'Brien".hex().upper() + "'"}[source]
            plan = explain(cur, sql, ("O'Brien",))
            assert f"{literal})" in plan, plan
            assert one(cur, sql, ("O'Brien",)) == [(1,)], source
            assert one(cur, sql, ("a\\b",)) == [(2,)], source
            for hostile in ["x' OR '1'='1", "x\\' OR 1=1 -- ", "\\", "'; DROP TABLE people; --"]:
                assert one(cur, sql, (hostile,)) == [], (source, hostile)
            assert one(cur, f"SELECT count(*) FROM {source}.{name}.people") == [(3,)]


def test_prepared_statements_are_audited_once(audited):
    """JDBC and ADBC prepare every statement with parameters: a statement refused while it is
    prepared is audited (it was not), and a prepared change is audited once, when it runs
    (at GetFlightInfo), not again when its count is fetched."""
    import json

    url, log = audited
    with fs.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT n_name FROM tpch.tiny.nation WHERE n_nationkey = ?", parameters=(3,))
        assert cur.fetchall() == [("CANADA",)]
        with pytest.raises(Exception, match="no_such_table"):
            cur.execute("SELECT * FROM no_such_table WHERE x = ?", parameters=(1,))
        cur.execute("CREATE TABLE audited_m (x INT)")
        cur.execute("INSERT INTO audited_m VALUES (?)", parameters=(7,))
        cur.fetchall()
    deadline = time.time() + 10
    while True:
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        statements = [line["statement"] for line in lines]
        if any("INSERT INTO audited_m" in s for s in statements) or time.time() > deadline:
            break
        time.sleep(0.2)

    def of(text):
        return [line for line in lines if text in line["statement"]]

    [select] = of("WHERE n_nationkey = ?")
    assert select["outcome"] == "ok" and select["rows"] == 1, select
    [refused] = of("no_such_table")
    assert refused["outcome"] == "error", refused
    [insert] = of("INSERT INTO audited_m")
    assert insert["outcome"] == "ok" and insert["rows"] == 1, insert
