#!/usr/bin/env python3
"""Generate the TPC-H SF 0.01 reference answers (sqllogictest files) from DuckDB.

What it does
------------
1. Generates the eight TPC-H tables at SF 0.01 as Parquet files in a
   temporary folder with ``tpchgen-cli`` 4.0.0 (the PyPI build of tpchgen-rs,
   the generator Basin's ``tpch`` catalog uses through the ``tpchgen`` crate
   4.0.0). DuckDB's own ``CALL dbgen`` is NOT used: its text columns (e.g.
   ``s_address``, ``s_comment``) differ from tpchgen's for the same keys.
2. Opens an in-memory DuckDB 1.5.5 database and loads every file into an
   attached in-memory catalog ``tpch``, schema ``tiny``, casting each column
   to the type Basin's catalog declares (see ``TABLE_COLUMNS``; the Parquet
   types must already be those, or the tool stops) and checking the row
   counts. Loads the ``tpch`` extension from the ``duckdb-extension-tpch``
   wheel (never downloaded at run time) only for its query texts:
   ``SELECT query_nr, query FROM tpch_queries()``.
3. Rewrites each text minimally for Basin:
   * every reference to one of the eight TPC-H base tables is qualified as
     ``tpch.tiny.<table>`` (Basin's catalog ``tpch``, schema ``tiny``). The
     positions come from DuckDB's own parser (``json_serialize_sql``), so
     column names, column aliases such as Q8/Q9's ``nation`` and CTE names
     such as Q15's ``revenue`` are never touched; the result is re-parsed
     and its syntax tree must equal the original's with only the catalog and
     schema of those table references filled in;
   * the trailing ``;`` is dropped.
   Any further, engine-compatibility rewrite would have to be listed in
   ``EXTRA_REWRITES`` below and is then named in the file's header; there
   are none today.
4. Runs the rewritten query in DuckDB (single thread, so floating-point sums
   are reproducible) and writes ``sql-tests/suites/tpch_sf001/qNN.slt``: a
   header comment and one ``query`` record whose values are printed the way
   DataFusion's sqllogictest driver prints them (see ``format_value``).
   ``rowsort`` is added unless the query's ORDER BY keys are distinct on
   every result row (a LIMIT query must also have no tie across its LIMIT
   boundary, or the tool stops with an error).

Optionally (``--verify-datafusion``) it also registers the same tpchgen-cli
Parquet files in a DataFusion ``SessionContext`` as catalog
``tpch`` / schema ``tiny`` (nothing in the default schema, so an unqualified
table name fails), runs every rewritten query there and checks column kinds
and values against DuckDB's: numbers must agree within 1e-6 relative or,
failing that, 1e-6 absolute; the latter is reported separately (it is how
Q1's AVG columns differ, DataFusion averaging DECIMAL(15,2) into a
DECIMAL(19,6) truncated to 6 places where DuckDB returns a DOUBLE).

How to run
----------
    pip install duckdb==1.5.5 duckdb-extension-tpch==1.5.5 tpchgen-cli==4.0.0
    python3 sql-tests/tools/duckdb_tpch_answers.py            # (re)write files
    python3 sql-tests/tools/duckdb_tpch_answers.py --check    # diff only

    # with the DataFusion cross-check (its own virtualenv is fine):
    pip install duckdb==1.5.5 duckdb-extension-tpch==1.5.5 tpchgen-cli==4.0.0 \\
        datafusion==53.0.0 pyarrow
    python3 sql-tests/tools/duckdb_tpch_answers.py --verify-datafusion

``--check`` exits 1 when a committed file differs from what the tool would
write. The files it writes must never be edited by hand.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import importlib.metadata
import importlib.util
import json
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

DUCKDB_VERSION = "1.5.5"
TPCHGEN_CLI_VERSION = "4.0.0"
SCALE_FACTOR = 0.01
CATALOG = "tpch"
SCHEMA = "tiny"
TPCH_TABLES = (
    "lineitem",
    "orders",
    "customer",
    "part",
    "partsupp",
    "supplier",
    "nation",
    "region",
)
QUERY_COUNT = 22

# Column types, as Basin's tpch catalog declares them (connectors/src/tpch/
# tables.rs: Int64, Int32, Decimal128(15, 2), Date32, Utf8View) and as
# tpchgen-cli's Parquet files hold them.
_MONEY = "DECIMAL(15,2)"
TABLE_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "nation": [("n_nationkey", "BIGINT"), ("n_name", "VARCHAR"),
               ("n_regionkey", "BIGINT"), ("n_comment", "VARCHAR")],
    "region": [("r_regionkey", "BIGINT"), ("r_name", "VARCHAR"), ("r_comment", "VARCHAR")],
    "part": [("p_partkey", "BIGINT"), ("p_name", "VARCHAR"), ("p_mfgr", "VARCHAR"),
             ("p_brand", "VARCHAR"), ("p_type", "VARCHAR"), ("p_size", "INTEGER"),
             ("p_container", "VARCHAR"), ("p_retailprice", _MONEY), ("p_comment", "VARCHAR")],
    "supplier": [("s_suppkey", "BIGINT"), ("s_name", "VARCHAR"), ("s_address", "VARCHAR"),
                 ("s_nationkey", "BIGINT"), ("s_phone", "VARCHAR"), ("s_acctbal", _MONEY),
                 ("s_comment", "VARCHAR")],
    "partsupp": [("ps_partkey", "BIGINT"), ("ps_suppkey", "BIGINT"), ("ps_availqty", "INTEGER"),
                 ("ps_supplycost", _MONEY), ("ps_comment", "VARCHAR")],
    "customer": [("c_custkey", "BIGINT"), ("c_name", "VARCHAR"), ("c_address", "VARCHAR"),
                 ("c_nationkey", "BIGINT"), ("c_phone", "VARCHAR"), ("c_acctbal", _MONEY),
                 ("c_mktsegment", "VARCHAR"), ("c_comment", "VARCHAR")],
    "orders": [("o_orderkey", "BIGINT"), ("o_custkey", "BIGINT"), ("o_orderstatus", "VARCHAR"),
               ("o_totalprice", _MONEY), ("o_orderdate", "DATE"),
               ("o_orderpriority", "VARCHAR"), ("o_clerk", "VARCHAR"),
               ("o_shippriority", "INTEGER"), ("o_comment", "VARCHAR")],
    "lineitem": [("l_orderkey", "BIGINT"), ("l_partkey", "BIGINT"), ("l_suppkey", "BIGINT"),
                 ("l_linenumber", "INTEGER"), ("l_quantity", _MONEY),
                 ("l_extendedprice", _MONEY), ("l_discount", _MONEY), ("l_tax", _MONEY),
                 ("l_returnflag", "VARCHAR"), ("l_linestatus", "VARCHAR"),
                 ("l_shipdate", "DATE"), ("l_commitdate", "DATE"), ("l_receiptdate", "DATE"),
                 ("l_shipinstruct", "VARCHAR"), ("l_shipmode", "VARCHAR"),
                 ("l_comment", "VARCHAR")],
}
assert sorted(TABLE_COLUMNS) == sorted(TPCH_TABLES)

# Row counts at SF 0.01 (TPC-H spec cardinalities; lineitem as generated).
EXPECTED_ROWS = {
    "nation": 25,
    "region": 5,
    "part": 2000,
    "supplier": 100,
    "partsupp": 8000,
    "customer": 1500,
    "orders": 15000,
    "lineitem": 60175,
}

# Engine-compatibility rewrites beyond table qualification, per query number:
# (old text, new text, reason). Each `old` must occur exactly once. Keep them
# minimal and semantically identical; they are named in the file header.
EXTRA_REWRITES: dict[int, list[tuple[str, str, str]]] = {}

TOOL_PATH = "sql-tests/tools/duckdb_tpch_answers.py"
DEFAULT_OUT = pathlib.Path(__file__).resolve().parent.parent / "suites" / "tpch_sf001"

REL_TOLERANCE = 1e-6
ABS_TOLERANCE = 1e-6


# --------------------------------------------------------------------------
# DuckDB setup
# --------------------------------------------------------------------------


def tpch_extension_path() -> pathlib.Path:
    """The tpch extension binary shipped inside the duckdb-extension-tpch wheel."""
    spec = importlib.util.find_spec("duckdb_extension_tpch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("duckdb-extension-tpch is not installed "
                 f"(pip install duckdb-extension-tpch=={DUCKDB_VERSION})")
    for location in spec.submodule_search_locations:
        found = sorted(pathlib.Path(location).rglob("tpch.duckdb_extension"))
        if found:
            return found[0]
    sys.exit("no tpch.duckdb_extension file inside the duckdb_extension_tpch package")


def tpchgen_cli() -> str:
    """Path of the pinned tpchgen-cli executable (the tpchgen-cli wheel's script)."""
    try:
        installed = importlib.metadata.version("tpchgen-cli")
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"tpchgen-cli is not installed (pip install tpchgen-cli=={TPCHGEN_CLI_VERSION})")
    if installed != TPCHGEN_CLI_VERSION:
        sys.exit(f"need tpchgen-cli=={TPCHGEN_CLI_VERSION}, found {installed}")
    exe = pathlib.Path(sysconfig.get_path("scripts")) / "tpchgen-cli"
    path = str(exe) if exe.is_file() else shutil.which("tpchgen-cli")
    if path is None:
        sys.exit("the tpchgen-cli executable is not in this Python's scripts folder nor on PATH")
    version = subprocess.run([path, "--version"], check=True, capture_output=True,
                             text=True).stdout.strip()
    if version != f"tpchgen-cli {TPCHGEN_CLI_VERSION}":
        sys.exit(f"{path} --version says {version!r}, need tpchgen-cli {TPCHGEN_CLI_VERSION}")
    return path


def generate_data(data_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    """Write the eight tables at SCALE_FACTOR as Parquet files; return table -> file."""
    subprocess.run(
        [tpchgen_cli(), "parquet", "--scale-factor", str(SCALE_FACTOR),
         "--output-dir", str(data_dir), "--num-threads", "1", "--quiet", "--no-progress"],
        check=True,
    )
    files = {}
    for table in TPCH_TABLES:
        path = data_dir / f"{table}.parquet"
        if not path.is_file():
            sys.exit(f"tpchgen-cli wrote no {path}")
        files[table] = path
    return files


def open_duckdb(files: dict[str, pathlib.Path]):
    import duckdb

    if duckdb.__version__ != DUCKDB_VERSION:
        sys.exit(f"need duckdb=={DUCKDB_VERSION}, found {duckdb.__version__}")
    con = duckdb.connect(
        ":memory:",
        config={
            "autoinstall_known_extensions": "false",
            "autoload_known_extensions": "false",
            "threads": 1,
        },
    )
    # The extension is needed only for tpch_queries(); the data is tpchgen-cli's.
    ext = tpch_extension_path()
    con.execute(f"LOAD '{ext.as_posix()}'")
    # Load the tables as tpch.tiny.<table>, as Basin names them, and keep the
    # default schema (memory.main) empty: a query that still held an
    # unqualified table name would fail to bind.
    con.execute(f"ATTACH ':memory:' AS {CATALOG}")
    con.execute(f"CREATE SCHEMA {CATALOG}.{SCHEMA}")
    for table in TPCH_TABLES:
        source = f"read_parquet('{files[table].as_posix()}')"
        found = [(r[0], r[1]) for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()]
        expected = TABLE_COLUMNS[table]
        if found != expected:
            sys.exit(f"{files[table]}: columns {found}, expected {expected}")
        # The casts are no-ops today (checked just above); they pin the types.
        columns = ", ".join(f"CAST({name} AS {ty}) AS {name}" for name, ty in expected)
        con.execute(f"CREATE TABLE {CATALOG}.{SCHEMA}.{table} AS SELECT {columns} FROM {source}")
        count = con.execute(f"SELECT count(*) FROM {CATALOG}.{SCHEMA}.{table}").fetchone()[0]
        if count != EXPECTED_ROWS[table]:
            sys.exit(f"{table}: {count} rows at SF {SCALE_FACTOR}, expected {EXPECTED_ROWS[table]}")
    print(f"tpchgen-cli {TPCHGEN_CLI_VERSION} data at SF {SCALE_FACTOR} loaded: "
          + ", ".join(f"{t} {EXPECTED_ROWS[t]}" for t in TPCH_TABLES) + " rows")
    return con


def tpch_queries(con) -> list[tuple[int, str]]:
    rows = con.execute("SELECT query_nr, query FROM tpch_queries() ORDER BY query_nr").fetchall()
    if [nr for nr, _ in rows] != list(range(1, QUERY_COUNT + 1)):
        sys.exit(f"unexpected query numbers from tpch_queries(): {[nr for nr, _ in rows]}")
    return [(int(nr), text) for nr, text in rows]


# --------------------------------------------------------------------------
# Query rewriting (driven by DuckDB's parser)
# --------------------------------------------------------------------------


def parse_tree(con, sql: str) -> dict:
    tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    if tree.get("error"):
        raise ValueError(f"DuckDB could not parse query: {tree.get('error_message')}\n{sql}")
    if len(tree["statements"]) != 1:
        raise ValueError(f"expected one statement, got {len(tree['statements'])}")
    return tree


def walk(node, visit):
    if isinstance(node, dict):
        visit(node)
        for value in node.values():
            walk(value, visit)
    elif isinstance(node, list):
        for value in node:
            walk(value, visit)


def tpch_table_refs(tree: dict) -> list[dict]:
    refs: list[dict] = []

    def visit(node):
        if node.get("type") == "BASE_TABLE" and node.get("table_name", "").lower() in TPCH_TABLES:
            refs.append(node)

    walk(tree, visit)
    return refs


def without_locations(node):
    if isinstance(node, dict):
        return {k: without_locations(v) for k, v in node.items() if k != "query_location"}
    if isinstance(node, list):
        return [without_locations(v) for v in node]
    return node


def qualify_tables(con, sql: str) -> str:
    """Prefix each TPC-H base-table reference with `tpch.tiny.`, by parser position."""
    if not sql.isascii():
        raise ValueError("query text is not ASCII; parser offsets may not be character offsets")
    tree = parse_tree(con, sql)
    refs = tpch_table_refs(tree)
    if not refs:
        raise ValueError("query references no TPC-H table")
    positions = []
    for ref in refs:
        if ref["catalog_name"] or ref["schema_name"]:
            raise ValueError(f"table {ref['table_name']} is already qualified")
        pos = ref["query_location"]
        name = ref["table_name"]
        if sql[pos:pos + len(name)].lower() != name.lower() or (
            pos + len(name) < len(sql) and re.match(r"\w", sql[pos + len(name)])
        ):
            raise ValueError(f"parser offset {pos} does not point at table {name}")
        positions.append(pos)
    out = sql
    for pos in sorted(set(positions), reverse=True):
        out = out[:pos] + f"{CATALOG}.{SCHEMA}." + out[pos:]

    # The rewritten text must parse to the same tree, except that exactly the
    # TPC-H table references now carry catalog and schema.
    expected = tree
    for ref in refs:
        ref["catalog_name"] = CATALOG
        ref["schema_name"] = SCHEMA
    if without_locations(parse_tree(con, out)) != without_locations(expected):
        raise ValueError("qualifying table names changed the query's syntax tree")
    return out


def apply_extra_rewrites(nr: int, sql: str) -> tuple[str, list[str]]:
    notes = []
    for old, new, why in EXTRA_REWRITES.get(nr, []):
        if sql.count(old) != 1:
            raise ValueError(f"Q{nr}: rewrite target {old!r} occurs {sql.count(old)} times")
        sql = sql.replace(old, new)
        notes.append(f"{old!r} -> {new!r} ({why})")
    return sql, notes


def prepare_query(con, nr: int, text: str) -> tuple[str, list[str]]:
    sql = text.strip()
    notes = []
    if sql.endswith(";"):
        sql = sql[:-1].rstrip()
        notes.append("trailing ';' dropped")
    if ";" in sql:
        raise ValueError(f"Q{nr} holds more than one statement")
    sql, extra = apply_extra_rewrites(nr, sql)
    notes.extend(extra)
    sql = qualify_tables(con, sql)
    notes.insert(0, f"table names qualified as {CATALOG}.{SCHEMA}.<table>")
    lines = [line.rstrip() for line in sql.splitlines()]
    if any(not line.strip() for line in lines):
        raise ValueError(f"Q{nr} has a blank line, which would end the sqllogictest record")
    if any(line.startswith("----") for line in lines):
        raise ValueError(f"Q{nr} has a line starting with ----")
    return "\n".join(lines), notes


# --------------------------------------------------------------------------
# Value formatting (mirrors datafusion-sqllogictest's normalize/conversion)
# --------------------------------------------------------------------------

_DEC_CTX = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_EVEN)
_TWELVE_PLACES = decimal.Decimal("1e-12")


def decimal_to_str(value: decimal.Decimal) -> str:
    """BigDecimal round(12) + normalized + to_plain_string, as DataFusion prints."""
    if value.as_tuple().exponent < -12:
        value = value.quantize(_TWELVE_PLACES, context=_DEC_CTX)
    value = value.normalize(_DEC_CTX)
    if value == 0:
        return "0"
    return format(value, "f")


def float_to_str(value: float) -> str:
    if value != value:
        return "NaN"
    if value == float("inf"):
        return "Infinity"
    if value == float("-inf"):
        return "-Infinity"
    # repr() gives the shortest round-trip digits, like Rust's f64 Display.
    return decimal_to_str(decimal.Decimal(repr(value)))


def format_value(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return float_to_str(value)
    if isinstance(value, decimal.Decimal):
        return decimal_to_str(value)
    if isinstance(value, datetime.datetime):
        raise TypeError("timestamps are not expected in TPC-H answers")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, str):
        if value == "":
            return "(empty)"
        return value.rstrip("\n").replace("\0", "\\0")
    raise TypeError(f"unsupported value {value!r} ({type(value).__name__})")


_INT_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT",
              "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT"}


def duckdb_type_letter(type_name: str) -> str:
    """T for text and dates, I for integers, R for floats and decimals."""
    t = type_name.upper()
    if t in _INT_TYPES:
        return "I"
    if t.startswith("DECIMAL") or t in {"DOUBLE", "FLOAT", "REAL"}:
        return "R"
    if t in {"VARCHAR", "DATE"}:
        return "T"
    if t == "BOOLEAN":
        return "B"
    raise TypeError(f"no sqllogictest type letter for DuckDB type {type_name}")


# --------------------------------------------------------------------------
# Sort mode
# --------------------------------------------------------------------------


def top_modifiers(tree: dict) -> list[dict]:
    return tree["statements"][0]["node"].get("modifiers", [])


def order_key_columns(tree: dict, columns: list[str]) -> list[int] | None:
    """Output-column indexes of the top-level ORDER BY keys, or None if not plain columns."""
    orders = [m for m in top_modifiers(tree) if m["type"] == "ORDER_MODIFIER"]
    if not orders:
        return None
    lowered = [c.lower() for c in columns]
    keys = []
    for order in orders[0]["orders"]:
        expr = order["expression"]
        if expr.get("class") == "COLUMN_REF" and len(expr["column_names"]) == 1:
            name = expr["column_names"][0].lower()
            if lowered.count(name) != 1:
                return None
            keys.append(lowered.index(name))
        elif expr.get("class") == "CONSTANT" and isinstance(expr["value"].get("value"), int):
            keys.append(expr["value"]["value"] - 1)
        else:
            return None
    return keys


def limit_of(tree: dict) -> int | None:
    for m in top_modifiers(tree):
        if m["type"] == "LIMIT_MODIFIER" and m.get("limit"):
            value = m["limit"].get("value", {}).get("value")
            if isinstance(value, int):
                return value
            raise ValueError("non-constant LIMIT")
    return None


def sort_mode(con, nr: int, sql: str, columns: list[str], rows: list[tuple]) -> str:
    """'' when ORDER BY keys fix the row order, else 'rowsort'. Fails on LIMIT ties."""
    tree = parse_tree(con, sql)
    keys = order_key_columns(tree, columns)
    limit = limit_of(tree)
    if limit is not None:
        if keys is None:
            raise ValueError(f"Q{nr}: LIMIT without plain ORDER BY columns; answer not deterministic")
        unlimited_sql, n = re.subn(r"\bLIMIT\s+\d+\s*$", "", sql, flags=re.IGNORECASE)
        if n != 1:
            raise ValueError(f"Q{nr}: could not strip the trailing LIMIT")
        full = con.execute(unlimited_sql).fetchall()
        if len(full) > limit and [full[limit - 1][k] for k in keys] == [full[limit][k] for k in keys]:
            raise ValueError(f"Q{nr}: ORDER BY tie across the LIMIT {limit} boundary")
    if keys is None:
        return "rowsort"
    key_tuples = [tuple(row[k] for k in keys) for row in rows]
    return "" if len(set(key_tuples)) == len(key_tuples) else "rowsort"


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------


def render(nr: int, sql: str, notes: list[str], types: str, mode: str, rows: list[list[str]]) -> str:
    header = [
        f"# TPC-H Q{nr}, scale factor {SCALE_FACTOR} (tables in {CATALOG}.{SCHEMA}).",
        f"# Generated by {TOOL_PATH} with DuckDB {DUCKDB_VERSION}",
        f"# (data: tpchgen-cli {TPCHGEN_CLI_VERSION}, sf {SCALE_FACTOR};"
        " query text: tpch extension's tpch_queries()).",
        "# DO NOT EDIT BY HAND: rerun the tool instead.",
        "# Changes to DuckDB's query text: " + "; ".join(notes) + ".",
        "",
    ]
    body = [f"query {types}" + (f" {mode}" if mode else ""), sql, "----"]
    # Cells joined by one space, trailing whitespace trimmed: the line that
    # datafusion-sqllogictest's validator builds from a result row.
    body += [" ".join(row).rstrip() for row in rows]
    return "\n".join(header + body) + "\n"


def generate(con) -> dict[int, dict]:
    results = {}
    for nr, text in tpch_queries(con):
        sql, notes = prepare_query(con, nr, text)
        rel = con.sql(sql)
        columns = list(rel.columns)
        types = "".join(duckdb_type_letter(str(t)) for t in rel.types)
        raw_rows = rel.fetchall()
        if not raw_rows:
            raise ValueError(f"Q{nr} returned no rows at SF {SCALE_FACTOR}")
        mode = sort_mode(con, nr, sql, columns, raw_rows)
        rows = [[format_value(v) for v in row] for row in raw_rows]
        if mode == "rowsort":
            # Rows as lists of cells, compared lexicographically: the order the
            # sqllogictest runner sorts into for rowsort.
            rows.sort()
        results[nr] = {
            "sql": sql,
            "types": types,
            "mode": mode,
            "rows": rows,
            "text": render(nr, sql, notes, types, mode, rows),
        }
    return results


# --------------------------------------------------------------------------
# Optional DataFusion cross-check
# --------------------------------------------------------------------------


def arrow_type_letter(dtype) -> str:
    import pyarrow as pa

    if pa.types.is_integer(dtype):
        return "I"
    if pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "R"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or \
            pa.types.is_string_view(dtype) or pa.types.is_date(dtype):
        return "T"
    if pa.types.is_boolean(dtype):
        return "B"
    raise TypeError(f"no sqllogictest type letter for Arrow type {dtype}")


def compare_tokens(expected: list[list[str]], actual: list[list[str]]) -> str:
    """Compare two answers token by token (whitespace split).

    Returns "identical", "relative" (every number within REL_TOLERANCE
    relative), "absolute" (some number only within ABS_TOLERANCE absolute;
    e.g. DataFusion's AVG over DECIMAL(15,2) returns DECIMAL(19,6), truncated
    to 6 decimal places, where DuckDB returns a DOUBLE) or "different".
    """
    if expected == actual:
        return "identical"
    exp_tokens = " ".join(" ".join(r) for r in expected).split()
    act_tokens = " ".join(" ".join(r) for r in actual).split()
    if len(exp_tokens) != len(act_tokens):
        return "different"
    verdict = "relative"
    for e, a in zip(exp_tokens, act_tokens):
        if e == a:
            continue
        try:
            fe, fa = float(e), float(a)
        except ValueError:
            return "different"
        diff = abs(fe - fa)
        if diff <= REL_TOLERANCE * max(abs(fe), abs(fa)):
            continue
        if diff <= ABS_TOLERANCE:
            verdict = "absolute"
            continue
        return "different"
    return verdict


def verify_datafusion(files: dict[str, pathlib.Path], results: dict[int, dict]) -> bool:
    import datafusion
    from datafusion import SessionContext
    from datafusion.catalog import Catalog, Schema, Table

    print(f"DataFusion {datafusion.__version__} cross-check")
    ok = True
    ctx = SessionContext()
    catalog = Catalog.memory_catalog()
    schema = Schema.memory_schema()
    for table in TPCH_TABLES:
        # The very files tpchgen-cli wrote (and DuckDB loaded).
        schema.register_table(table, Table(ctx.read_parquet(str(files[table]))))
    catalog.register_schema(SCHEMA, schema)
    ctx.register_catalog_provider(CATALOG, catalog)

    for nr, res in results.items():
        try:
            df = ctx.sql(res["sql"])
            arrow = df.to_arrow_table()
        except Exception as exc:  # noqa: BLE001 - report every failure
            print(f"  Q{nr:02d}: FAILED in DataFusion: {exc}")
            ok = False
            continue
        types = "".join(arrow_type_letter(f.type) for f in arrow.schema)
        rows = [[format_value(v) for v in row.values()] for row in arrow.to_pylist()]
        if res["mode"] == "rowsort":
            rows.sort()
        problems = []
        if types != res["types"]:
            problems.append(f"types {types} != {res['types']}")
        verdict = compare_tokens(res["rows"], rows)
        if verdict == "different":
            problems.append("values differ")
        if problems:
            ok = False
            print(f"  Q{nr:02d}: MISMATCH ({', '.join(problems)})")
            for r in rows[:5]:
                print("      datafusion:", " ".join(r))
            for r in res["rows"][:5]:
                print("      duckdb:    ", " ".join(r))
        else:
            how = {
                "identical": "identical text",
                "relative": f"equal within {REL_TOLERANCE:g} relative",
                "absolute": f"NOT within {REL_TOLERANCE:g} relative; "
                            f"within {ABS_TOLERANCE:g} absolute",
            }[verdict]
            print(f"  Q{nr:02d}: ok ({len(rows)} rows, {how})")
            if verdict == "absolute":
                for d, e in zip(rows, res["rows"]):
                    if d != e:
                        print("      datafusion:", " ".join(d))
                        print("      duckdb:    ", " ".join(e))
    return ok


# --------------------------------------------------------------------------


def write_or_check(out: pathlib.Path, check: bool, results: dict[int, dict]) -> int:
    status = 0
    if check:
        for nr, res in results.items():
            path = out / f"q{nr:02d}.slt"
            if not path.exists() or path.read_text() != res["text"]:
                print(f"{path}: differs from generated answer")
                status = 1
        if status == 0:
            print(f"all {len(results)} files in {out} are up to date")
    else:
        out.mkdir(parents=True, exist_ok=True)
        for nr, res in results.items():
            path = out / f"q{nr:02d}.slt"
            path.write_text(res["text"])
            print(f"wrote {path} ({len(res['rows'])} rows, query {res['types']}"
                  f"{' ' + res['mode'] if res['mode'] else ''})")
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                        help=f"output folder (default: {DEFAULT_OUT})")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a file differs from what would be written")
    parser.add_argument("--verify-datafusion", action="store_true",
                        help="also run every query in DataFusion (python package) and compare")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tpchgen-") as tmp:
        files = generate_data(pathlib.Path(tmp))
        con = open_duckdb(files)
        results = generate(con)
        status = write_or_check(args.out, args.check, results)
        if args.verify_datafusion and not verify_datafusion(files, results):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
