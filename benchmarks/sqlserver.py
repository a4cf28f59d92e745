#!/usr/bin/env python3
"""TPC-H lineitem in SQL Server (Babelfish, TDS), side by side: Basin's sqlserver connector
against the source's own time for the same query, in one run.

    python3 benchmarks/sqlserver.py --basin target/release/basin --sf 1 --runs 3
    python3 benchmarks/sqlserver.py --basin target/debug/basin --sf 0.01 --runs 1   # smoke

Steps:
1. tpchgen-cli writes lineitem as Parquet (tpch.py's `generate`, cached).
2. SQL Server: $BASIN_TEST_SQLSERVER_URL, else `.ci/services.sh start sqlserver` (Babelfish for
   PostgreSQL from the shared services folder; left running unless --stop-services).
   `dbo.lineitem` is created over TDS with the TPC-H types (bigint keys, decimal(15,2), date,
   varchar) and filled through Babelfish's PostgreSQL port (`\\copy` of a CSV DuckDB writes):
   over TDS row inserts would take hours. Kept when its row count matches.
3. Measurements, one warm-up then --runs timed runs:
   - extract: every row and column of lineitem. The source alone: FreeTDS `bsqldb` (C,
     db-lib, TDS 7.2) fetching `SELECT * FROM master.dbo.lineitem` to /dev/null (freebcp's
     bulk export hangs against Babelfish); Basin: the rows fetched as Arrow over Flight SQL from
     `basin standalone`.
   - agg: `SELECT sum(l_quantity), count(*) FROM lineitem`. The source alone: the query over
     TDS (python-tds); Basin: the same query, pushed into SQL Server.
   Answers are checked: row and column counts for extract, the values for agg.
Writes sqlserver-sfN.json and sqlserver-sfN.md into --out and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.parse

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402
import tpch  # noqa: E402

REPO = tpch.REPO
COLUMNS = (
    "l_orderkey bigint NOT NULL, l_partkey bigint NOT NULL, l_suppkey bigint NOT NULL, "
    "l_linenumber int NOT NULL, l_quantity decimal(15,2) NOT NULL, "
    "l_extendedprice decimal(15,2) NOT NULL, l_discount decimal(15,2) NOT NULL, "
    "l_tax decimal(15,2) NOT NULL, l_returnflag varchar(1) NOT NULL, "
    "l_linestatus varchar(1) NOT NULL, l_shipdate date NOT NULL, l_commitdate date NOT NULL, "
    "l_receiptdate date NOT NULL, l_shipinstruct varchar(25) NOT NULL, "
    "l_shipmode varchar(10) NOT NULL, l_comment varchar(44) NOT NULL"
)
AGG = "SELECT sum(l_quantity) AS q, count(*) AS n FROM {t}"


services, env_of = harness.services, harness.env_of


def tds(url: str):
    import pytds
    u = urllib.parse.urlparse(url)
    return pytds.connect(server=u.hostname, port=u.port or 1433, database=u.path.lstrip("/"),
                         user=urllib.parse.unquote(u.username),
                         password=urllib.parse.unquote(u.password or ""), autocommit=True)


def load(url: str, pg_url: str, lineitem: pathlib.Path, rows: int) -> None:
    with tds(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM INFORMATION_SCHEMA.TABLES "
                    "WHERE TABLE_SCHEMA = 'dbo' AND TABLE_NAME = 'lineitem'")
        if cur.fetchone()[0]:
            cur.execute("SELECT count_big(*) FROM dbo.lineitem")
            if cur.fetchone()[0] == rows:
                print(f"dbo.lineitem: {rows} rows already there", flush=True)
                return
            cur.execute("DROP TABLE dbo.lineitem")
        cur.execute(f"CREATE TABLE dbo.lineitem ({COLUMNS}, "
                    "PRIMARY KEY (l_orderkey, l_linenumber))")
    import duckdb
    with tempfile.TemporaryDirectory() as tmp:
        csv = pathlib.Path(tmp) / "lineitem.csv"
        duckdb.sql(f"COPY (SELECT * FROM read_parquet('{lineitem.as_posix()}')) TO "
                   f"'{csv.as_posix()}' (FORMAT csv, HEADER false)")
        print(f"loading {rows} rows into dbo.lineitem through the PostgreSQL port", flush=True)
        subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", pg_url, "-c",
                        f"\\copy master_dbo.lineitem FROM '{csv}' WITH (FORMAT csv)"], check=True)
        subprocess.run(["psql", "-X", "-q", "-d", pg_url, "-c", "ANALYZE master_dbo.lineitem"],
                       check=True)


def bsqldb_extract(url: str, workdir: pathlib.Path) -> int:
    """Rows fetched by FreeTDS bsqldb (C, db-lib; output to /dev/null): the source's own time
    for the extraction. (freebcp's bulk export hangs against Babelfish.)"""
    u = urllib.parse.urlparse(url)
    query = workdir / "extract.sql"
    query.write_text("SELECT * FROM master.dbo.lineitem\n")
    # TDS 7.2: dates travel as text, which bsqldb's db-lib needs ("type 40 not supported").
    env = dict(os.environ, TDSVER="7.2")
    r = subprocess.run(["bsqldb", "-S", f"{u.hostname}:{u.port}", "-U", urllib.parse.unquote(u.username),
                        "-P", urllib.parse.unquote(u.password or ""), "-i", str(query), "-o", "/dev/null"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"bsqldb failed: {r.stderr[-500:]}")
    for line in (r.stderr + r.stdout).splitlines():
        if "rows affected" in line:
            return int(line.split()[0])
    raise RuntimeError(f"bsqldb said: {r.stderr[-500:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--basin", required=True)
    ap.add_argument("--sf", type=float, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--executors", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results"))
    ap.add_argument("--cache", default=str(pathlib.Path.home() / ".cache/basin/tpch"))
    ap.add_argument("--stop-services", action="store_true")
    args = ap.parse_args()
    for tool, pkg in [("bsqldb", "apt-get install freetds-bin"), ("psql", "apt-get install postgresql-client")]:
        if not shutil.which(tool):
            sys.exit(f"{tool} not found ({pkg})")
    try:
        import pytds  # noqa: F401
    except ImportError:
        sys.exit("pip install python-tds==1.17.1")

    files = tpch.generate(args.sf, pathlib.Path(args.cache))
    import duckdb
    rows = duckdb.sql(f"SELECT count(*) FROM read_parquet('{files['lineitem'].as_posix()}')").fetchone()[0]
    url, pg_url = os.environ.get("BASIN_TEST_SQLSERVER_URL"), os.environ.get("BASIN_TEST_SQLSERVER_PG_URL")
    started = False
    if not url or not pg_url:
        env = env_of(services("start", "sqlserver"))
        url, pg_url, started = env["BASIN_TEST_SQLSERVER_URL"], env["BASIN_TEST_SQLSERVER_PG_URL"], True
    results: dict[str, dict[str, dict]] = {"extract": {}, "agg": {}}
    try:
        load(url, pg_url, files["lineitem"], rows)
        # The source alone.
        scratch = pathlib.Path(tempfile.mkdtemp(prefix="sqlserver-bench-"))
        times, got = harness.timed(lambda: bsqldb_extract(url, scratch), args.runs)
        shutil.rmtree(scratch, ignore_errors=True)
        assert got == rows, (got, rows)
        results["extract"]["sqlserver"] = {"min": min(times), "median": statistics.median(times)}
        with tds(url) as conn, conn.cursor() as cur:
            def agg():
                cur.execute(AGG.format(t="dbo.lineitem"))
                return cur.fetchall()
            times, want = harness.timed(agg, args.runs)
        results["agg"]["sqlserver"] = {"min": min(times), "median": statistics.median(times)}
        want = [(float(q), int(n)) for q, n in want]
        # Basin.
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="basin-sqlserver-"))
        config = workdir / "basin.toml"
        config.write_text(f'[catalogs.ms]\nconnector = "sqlserver"\nurl = "{url}"\ntls = "require"\n')
        basin = harness.Basin(args.basin, workdir / "data", workdir, args.executors, True, config=config)
        try:
            extract_sql = "SELECT * FROM ms.dbo.lineitem"
            times, table = harness.timed(lambda: basin.query(extract_sql), args.runs)
            assert table.num_rows == rows and table.num_columns == 16, (table.num_rows, table.num_columns)
            results["extract"]["basin"] = {"min": min(times), "median": statistics.median(times)}
            plan = basin.query("EXPLAIN " + extract_sql)
            results["extract"]["basin"]["plan"] = str(plan.column(plan.num_columns - 1).to_pylist())[:600]
            agg_sql = AGG.format(t="ms.dbo.lineitem")
            times, table = harness.timed(lambda: basin.query(agg_sql), args.runs)
            got = [(float(q), int(n)) for q, n in zip(table.column(0).to_pylist(), table.column(1).to_pylist())]
            assert got == want, (got, want)
            results["agg"]["basin"] = {"min": min(times), "median": statistics.median(times)}
            plan = basin.query("EXPLAIN " + agg_sql)
            results["agg"]["basin"]["plan"] = str(plan.column(plan.num_columns - 1).to_pylist())[:600]
            results["peak_rss_mb"] = basin.peak_rss()
        finally:
            basin.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    finally:
        if started and args.stop_services:
            services("stop")

    name = f"sqlserver-{harness.sf_name(args.sf)}"
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": harness.machine(), "sf": args.sf, "rows": rows, "runs": args.runs,
            "executors": args.executors, "source": "Babelfish for PostgreSQL 4.3 (TDS 7.4)"}
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    lines = [f"# TPC-H SF {args.sf:g} lineitem in SQL Server (Babelfish), {meta['date']}", "",
             f"{meta['machine']}; {rows} rows; best of {args.runs} after a warm-up.", "",
             "| query | SQL Server alone | Basin | Basin / source |", "|---|---|---|---|"]
    for q, label in [("extract", "extract (all rows, all columns)"), ("agg", "sum + count (pushed)")]:
        s, b = results[q]["sqlserver"]["min"], results[q]["basin"]["min"]
        lines.append(f"| {label} | {s:.2f} s | {b:.2f} s | {b / s:.2f}× |")
    lines += ["", "SQL Server alone: extract = FreeTDS bsqldb to /dev/null (C, db-lib, TDS 7.2), "
              "agg = the query over TDS (python-tds). Basin: `basin standalone` with "
              f"{args.executors} executors, results fetched as Arrow over Flight SQL. "
              f"Peak RSS of Basin: {results.get('peak_rss_mb')} MB."]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
