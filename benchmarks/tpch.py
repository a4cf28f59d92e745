#!/usr/bin/env python3
"""TPC-H side by side: Basin (Iceberg tables, multi-process cluster), Basin standalone,
DuckDB and DataFusion, on the same tpchgen data in the same run.

    benchmarks/run.sh --sf 1                 # the whole run (builds Basin in release mode)
    python3 benchmarks/tpch.py --sf 0.01 --runs 1 --basin target/debug/basin   # CI smoke

Steps:
1. tpchgen-cli writes the eight tables as Parquet (cached under ~/.cache/basin/tpch/sfN).
2. DuckDB (PyPI) loads its tpch extension from the duckdb-extension-tpch wheel for the 22
   query texts, runs them over the Parquet files, and its answers are the reference.
3. Basin: `basin scheduler` + N `basin executor` processes; the tables are copied into the
   embedded Iceberg catalog (`CREATE TABLE lake.tpch_sfN_<codec>.t WITH (compression codec of
   the tpchgen files) AS SELECT * FROM read_parquet(...)`, cached); each query runs over
   Flight SQL (ADBC) after `USE lake.tpch_sfN_<codec>`.
4. Basin standalone (`basin standalone`, one process) over the same Iceberg tables.
5. DataFusion (PyPI `datafusion`) single-process over the Parquet files.
Every engine's every answer is checked against DuckDB's. Per query: min and median over
--runs timed runs after one warm-up, rows returned, bytes of data files planned (Basin,
from EXPLAIN), and the Basin processes' peak RSS. Writes tpch-sfN.json, tpch-sfN.md and
tpch-sfN.png into --out.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from harness import (REPO, Basin, bytes_planned, machine, report, rows_of,
                     same_answer, sf_name, source_codec, timed, with_server_setting)

TABLES = ["nation", "region", "part", "supplier", "partsupp", "customer", "orders", "lineitem"]


# ---------------------------------------------------------------- data and reference


def generate(sf: float, cache: pathlib.Path) -> dict[str, pathlib.Path]:
    out = cache / sf_name(sf)
    files = {t: out / f"{t}.parquet" for t in TABLES}
    if all(f.is_file() for f in files.values()):
        return files
    tmp = out.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cli = shutil.which("tpchgen-cli") or sys.exit("tpchgen-cli not found: pip install tpchgen-cli==4.0.0")
    print(f"generating TPC-H SF {sf:g} with tpchgen-cli into {out}", flush=True)
    subprocess.run([cli, "parquet", "--scale-factor", f"{sf:g}", "--output-dir", str(tmp),
                    "--quiet", "--no-progress"], check=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return files


def duckdb_connect(files, threads=None):
    import duckdb
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": "false",
                                             "autoload_known_extensions": "false"})
    if threads:
        con.execute(f"SET threads = {threads}")
    spec = importlib.util.find_spec("duckdb_extension_tpch")
    if spec is None:
        sys.exit("pip install duckdb-extension-tpch (same version as duckdb)")
    ext = next(p for loc in spec.submodule_search_locations
               for p in pathlib.Path(loc).rglob("tpch.duckdb_extension"))
    con.execute(f"LOAD '{ext.as_posix()}'")
    for t, f in files.items():
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{f.as_posix()}')")
    return con


def queries(con) -> list[tuple[int, str]]:
    rows = con.execute("SELECT query_nr, query FROM tpch_queries() ORDER BY query_nr").fetchall()
    return [(int(n), q.strip().rstrip(";")) for n, q in rows]


def sql_type(t) -> str:
    """The SQL type of a column of the tpchgen files."""
    import pyarrow as pa
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    names = {pa.int32(): "INT", pa.int64(): "BIGINT", pa.date32(): "DATE",
             pa.string(): "VARCHAR", pa.string_view(): "VARCHAR", pa.large_string(): "VARCHAR"}
    if t not in names:
        sys.exit(f"the tpchgen files have a column of type {t} the harness cannot declare")
    return names[t]


def load_iceberg(basin: Basin, files, schema: str, codec: str):
    """Iceberg copies of the files with the TPC-H schema (every column NOT NULL, as in the
    specification and in the files the peers read: a CTAS would make them nullable, as in
    Trino, and cost Basin its NULL-free plans), written with the codec of the Parquet files
    the peers read, so that every engine decompresses the same way (Basin's own default,
    zstd, costs ~10% on this machine's TPC-H)."""
    import pyarrow.parquet as pq
    basin.query(f"CREATE SCHEMA IF NOT EXISTS lake.{schema}")
    start = time.perf_counter()
    for t in TABLES:
        # Loaded by an earlier run (an INSERT is one snapshot: all rows or none), with the
        # schema above (copies made before 2026-12-06 were CTAS copies, nullable).
        try:
            rows = basin.query(f"SELECT count(*) FROM lake.{schema}.{t}").column(0)[0].as_py()
            nullable = basin.query(f"DESCRIBE lake.{schema}.{t}").column("is_nullable")
            if rows and "YES" not in nullable.to_pylist():
                continue
            basin.query(f"DROP TABLE lake.{schema}.{t}")
        except Exception:  # noqa: BLE001 - no such table
            pass
        columns = ", ".join(f"{f.name} {sql_type(f.type)}{'' if f.nullable else ' NOT NULL'}"
                            for f in pq.read_schema(files[t]))
        basin.query(f"CREATE TABLE lake.{schema}.{t} ({columns}) "
                    f"WITH (\"write.parquet.compression-codec\" = '{codec}')")
        try:
            basin.query(f"INSERT INTO lake.{schema}.{t} "
                        f"SELECT * FROM read_parquet('{files[t].as_posix()}')")
        except Exception:
            basin.query(f"DROP TABLE lake.{schema}.{t}")  # loaded again next time
            raise
    return time.perf_counter() - start


def run_basin(label, basin, qs, reference, runs, schema, results, setup=()):
    basin.query(f"USE lake.{schema}")
    for statement in setup:
        basin.query(statement)
    for n, sql in qs:
        times, table = timed(lambda: basin.query(sql), runs)
        err = same_answer(rows_of(table), reference[n])
        results.setdefault(n, {})[label] = {
            "min": min(times), "median": statistics.median(times), "rows": table.num_rows,
            "valid": err is None, "error": err,
            "bytes_planned": bytes_planned(basin, sql),
        }
        print(f"{label:18} q{n:02d} {min(times):8.3f}s {'ok' if err is None else 'WRONG: ' + err}",
              flush=True)


# ---------------------------------------------------------------- report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sf", type=float, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--executors", type=int, default=2)
    ap.add_argument("--basin", default=str(pathlib.Path(os.environ.get(
        "CARGO_TARGET_DIR", pathlib.Path.home() / ".cache/basin/target")) / "release" / "basin"))
    ap.add_argument("--engines", default="basin,basin-standalone,duckdb,datafusion")
    ap.add_argument("--queries", default="", help="e.g. 1,3,6 (default all 22)")
    ap.add_argument("--cache", default=str(pathlib.Path.home() / ".cache/basin/tpch"))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--check-only", action="store_true", help="validate answers, no timings")
    ap.add_argument("--basin-setup", action="append", default=[],
                    help="SQL run on each Basin session before the queries (e.g. a SET)")
    ap.add_argument("--basin-config", default=None,
                    help="a basin.toml the basin and basin-standalone processes read "
                         "(e.g. [server] single_node_max_bytes = 0)")
    ap.add_argument("--pin-executors", action="store_true",
                    help="run executor i under `taskset -c i` (scale-out runs: one core each)")
    args = ap.parse_args()
    engines = args.engines.split(",")
    if args.check_only:
        args.runs = 1
    cache = pathlib.Path(args.cache)
    files = generate(args.sf, cache)
    con = duckdb_connect(files)
    qs = queries(con)
    if args.queries:
        wanted = {int(q) for q in args.queries.split(",")}
        qs = [(n, q) for n, q in qs if n in wanted]
    reference = {n: rows_of(con.execute(q).fetch_arrow_table()) for n, q in qs}
    results: dict[int, dict] = {}
    meta = {"sf": args.sf, "runs": args.runs, "executors": args.executors,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(),
            "peak_rss_mb": {}}
    failures = []
    if "duckdb" in engines:
        import duckdb
        meta["duckdb"] = duckdb.__version__
        for n, q in qs:
            times, table = timed(lambda: con.execute(q).fetch_arrow_table(), args.runs)
            results.setdefault(n, {})["duckdb"] = {"min": min(times), "median": statistics.median(times),
                                                   "rows": table.num_rows, "valid": True}
            print(f"{'duckdb':18} q{n:02d} {min(times):8.3f}s", flush=True)
    if "datafusion" in engines:
        import datafusion
        meta["datafusion"] = datafusion.__version__ if hasattr(datafusion, "__version__") else "?"
        ctx = datafusion.SessionContext()
        for t, f in files.items():
            ctx.register_parquet(t, str(f))
        for n, q in qs:
            try:
                times, table = timed(lambda: ctx.sql(q).to_arrow_table(), args.runs)
                err = same_answer(rows_of(table), reference[n])
                results.setdefault(n, {})["datafusion"] = {
                    "min": min(times), "median": statistics.median(times), "rows": table.num_rows,
                    "valid": err is None, "error": err}
                print(f"{'datafusion':18} q{n:02d} {min(times):8.3f}s {'ok' if err is None else 'WRONG: ' + err}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"datafusion q{n:02d} failed: {e}")
    codec = source_codec(files)
    meta["iceberg_codec"] = codec
    schema = f"tpch_{sf_name(args.sf)}_{codec}"
    data_dir = cache / "basin-data"
    # basin-jobs: the cluster with streamed stages off (every query a Ballista job), to show
    # what streaming one-stage queries changes; basin-exchanges: the cluster with queries over
    # `single_node_max_bytes` run as streamed stages with exchanges instead of Ballista jobs;
    # basin-distributed: every query with a join, GROUP BY or window on those exchanges, none
    # whole on one executor (the single-node route off); basin-staged: queries over
    # `single_node_max_bytes` as Ballista jobs (streamed exchanges off, the default before
    # 2026-12-07; basin and basin-exchanges are the same since).
    meta["pin_executors"] = args.pin_executors
    for label, standalone in (("basin", False), ("basin-standalone", True), ("basin-jobs", False),
                              ("basin-exchanges", False), ("basin-distributed", False),
                              ("basin-staged", False)):
        if label not in engines:
            continue
        workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"{label}-"))
        config = args.basin_config
        extra = {"basin-jobs": "streamed_stages = false",
                 "basin-exchanges": "streamed_exchanges = true",
                 "basin-distributed": "streamed_exchanges = true\nsingle_node_max_bytes = 0",
                 "basin-staged": "streamed_exchanges = false",
                 }.get(label)
        if extra:
            given = pathlib.Path(config).read_text() if config else ""
            config = workdir / "basin.toml"
            config.write_text(with_server_setting(given, extra))
        basin = Basin(args.basin, data_dir, workdir, args.executors, standalone, config=config,
                      pin_executors=args.pin_executors and not standalone)
        try:
            load = load_iceberg(basin, files, schema, codec)
            meta.setdefault("load_seconds", round(load, 1))
            run_basin(label, basin, qs, reference, args.runs, schema, results, args.basin_setup)
            meta["basin_setup"] = args.basin_setup
            meta["peak_rss_mb"][label] = basin.peak_rss()
        finally:
            basin.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    for n, r in results.items():
        for e, v in r.items():
            if not v.get("valid", True):
                failures.append(f"{e} q{n:02d}: {v.get('error')}")
    missing = [f"{e} q{n:02d}" for n, _ in qs for e in engines if e not in results.get(n, {})]
    report(pathlib.Path(args.out) / f"tpch-{sf_name(args.sf)}", f"TPC-H SF {args.sf:g}", engines,
           results, meta,
           [f"Iceberg load (CREATE TABLE and INSERT of the 8 tables, s): {meta.get('load_seconds')}, "
            f"codec {meta.get('iceberg_codec')} (the tpchgen files')"])
    if failures or missing:
        print("FAILED:", *failures, *(f"{m}: no result" for m in missing), sep="\n  ")
        sys.exit(1)


if __name__ == "__main__":
    main()
