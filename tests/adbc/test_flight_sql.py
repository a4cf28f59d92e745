"""Basin's Flight SQL endpoint through clients we did not write: the ADBC Flight SQL driver
(DB-API, metadata, prepared statements, Arrow fetch) and pyarrow.flight."""

import datetime
import decimal
import os
import threading
import time

import adbc_driver_flightsql.dbapi as fs
import adbc_driver_manager
import pyarrow as pa
import pyarrow.flight as flight
import pytest

import tpch_answers

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
