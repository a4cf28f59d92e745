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
import decimal
import importlib.util
import json
import math
import os
import pathlib
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

TABLES = ["nation", "region", "part", "supplier", "partsupp", "customer", "orders", "lineitem"]
REPO = pathlib.Path(__file__).resolve().parents[1]


def sf_name(sf: float) -> str:
    return ("sf" + f"{sf:g}").replace(".", "_")


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


# ---------------------------------------------------------------- answers


def norm(v):
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, datetime.datetime):
        return v.replace(tzinfo=None).isoformat()
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, str):
        return v.rstrip()
    return v


def rows_of(table) -> list[tuple]:
    return [tuple(norm(v) for v in row.values()) for row in table.to_pylist()]


def same_value(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if a is None or b is None:
            return a is b
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-2)
    return a == b


def same_answer(got: list[tuple], want: list[tuple]) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} rows, expected {len(want)}"
    key = lambda r: tuple((x is None, str(x) if not isinstance(x, (int, float)) else round(x, 1)) for x in r)
    for g, w in zip(sorted(got, key=key), sorted(want, key=key)):
        if len(g) != len(w) or not all(same_value(a, b) for a, b in zip(g, w)):
            return f"row {g} differs from {w}"
    return None


# ---------------------------------------------------------------- engines


def timed(run, runs: int):
    """One warm-up, then `runs` timed runs: (times, last result)."""
    result = run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return times, result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, procs, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for p, log in procs:
            if p.poll() is not None:
                sys.exit(f"{p.args[:2]} exited:\n{pathlib.Path(log).read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    sys.exit(f"nothing listens on {port}")


def peak_rss_mb(pid) -> float | None:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Basin:
    """A Basin deployment reached over Flight SQL."""

    def __init__(self, binary, data_dir, workdir, executors, standalone, config=None):
        """`config`: an optional basin.toml passed to every process with `--config`."""
        self.procs = []
        self.workdir = workdir
        env = dict(os.environ)
        env.setdefault("BASIN_LOG", "warn")  # BASIN_LOG=debug python3 ... to see more
        flight = free_port()
        def spawn(name, *args):
            log = workdir / f"{name}.log"
            extra = ["--config", str(config)] if config else []
            p = subprocess.Popen([binary, *args, "--data-dir", str(data_dir), *extra], env=env,
                                 stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
            self.procs.append((p, str(log)))
            return p
        if standalone:
            self.names = ["standalone"]
            spawn("standalone", "standalone", "--executors", str(executors),
                  "--flight-sql-port", str(flight))
        else:
            sched = free_port()
            spawn("scheduler", "scheduler", "--port", str(sched), "--flight-sql-port", str(flight))
            wait_port(sched, self.procs)
            self.names = ["scheduler"]
            for i in range(executors):
                spawn(f"executor-{i}", "executor", "--scheduler", f"127.0.0.1:{sched}")
                self.names.append(f"executor-{i}")
        wait_port(flight, self.procs)
        import adbc_driver_flightsql.dbapi as fs
        self.cursor = None
        self.conn = fs.connect(f"grpc://127.0.0.1:{flight}", autocommit=True)
        deadline = time.time() + 120
        while True:  # executors register asynchronously
            try:
                self.query("SELECT count(*) FROM tpch.tiny.region")
                break
            except Exception:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        # Executors register within moments of each other; a fresh session after that sees
        # all their task slots (Basin before 2026-12-03 kept the slots a session saw first).
        time.sleep(1)
        self.close_cursor()
        self.conn.close()
        self.conn = fs.connect(f"grpc://127.0.0.1:{flight}", autocommit=True)

    def query(self, sql):
        # One cursor for all the queries of a connection, as an application keeps its
        # statement handle: the ADBC driver spends ~2 ms of the client's CPU creating and
        # closing a cursor, which the in-process peers never pay (benchmarks/README.md).
        if self.cursor is None:
            self.cursor = self.conn.cursor()
        try:
            self.cursor.execute(sql)
            return self.cursor.fetch_arrow_table()
        except Exception:
            self.close_cursor()
            raise

    def close_cursor(self):
        if self.cursor is not None:
            try:
                self.cursor.close()
            except Exception:
                pass
            self.cursor = None

    def peak_rss(self):
        return {n: peak_rss_mb(p.pid) for n, (p, _) in zip(self.names, self.procs)}

    def stop(self):
        try:
            self.close_cursor()
            self.conn.close()
        except Exception:
            pass
        for p, _ in self.procs:
            p.terminate()
        for p, _ in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def source_codec(files) -> str:
    """The compression codec of the tpchgen files (lower case, as Iceberg names it)."""
    import pyarrow.parquet as pq
    codecs = {pq.ParquetFile(f).metadata.row_group(0).column(0).compression.lower()
              for f in files.values()}
    if len(codecs) != 1:
        sys.exit(f"the tpchgen files use several codecs ({sorted(codecs)}); regenerate them")
    return codecs.pop()


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


def bytes_planned(basin: Basin, sql: str) -> int | None:
    try:
        plan = basin.query("EXPLAIN " + sql)
    except Exception:
        return None
    text = " ".join(str(v) for v in plan.column(plan.num_columns - 1).to_pylist())
    return sum(int(b) for b in re.findall(r"IcebergScanExec:[^\n]*?bytes=(\d+)", text)) or None


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


def report(out: pathlib.Path, sf, engines, results, meta):
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"tpch-{sf_name(sf)}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1,
                                                    default=str))
    lines = [f"TPC-H SF {sf:g}: seconds (best of {meta['runs']} after a warm-up; median in the "
             "JSON); ratio = engine / DuckDB. All answers checked against DuckDB's.", "",
             "| query | " + " | ".join(engines) + " | " + " | ".join(f"{e}/DuckDB" for e in engines if e != "duckdb") + " |",
             "|---|" + "---:|" * (len(engines) * 2 - 1)]
    totals = {e: 0.0 for e in engines}
    for n in sorted(results):
        r = results[n]
        cells = []
        for e in engines:
            v = r.get(e)
            cells.append("—" if v is None else f"{v['min']:.3f}" + ("" if v["valid"] else " ✗"))
            if v:
                totals[e] += v["min"]
        ratios = [f"{r[e]['min'] / r['duckdb']['min']:.2f}" if r.get(e) and r.get("duckdb") else "—"
                  for e in engines if e != "duckdb"]
        lines.append(f"| Q{n:02d} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    lines.append("| **sum** | " + " | ".join(f"**{totals[e]:.2f}**" for e in engines) + " | " +
                 " | ".join(f"**{totals[e] / totals['duckdb']:.2f}**" if totals.get('duckdb') else "—"
                            for e in engines if e != "duckdb") + " |")
    lines += ["", f"Peak RSS (MB): {json.dumps(meta.get('peak_rss_mb', {}))}",
              f"Iceberg load (CREATE TABLE and INSERT of the 8 tables, s): {meta.get('load_seconds')}, "
              f"codec {meta.get('iceberg_codec')} (the tpchgen files')",
              f"Machine: {meta['machine']}"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        qn = sorted(results)
        fig, ax = plt.subplots(figsize=(14, 5))
        width = 0.8 / len(engines)
        for i, e in enumerate(engines):
            ax.bar([q + i * width for q in qn], [results[q].get(e, {}).get("min", 0) for q in qn],
                   width, label=e)
        ax.set_xticks([q + 0.4 - width / 2 for q in qn], [f"Q{q}" for q in qn])
        ax.set_ylabel("seconds (best run)")
        ax.set_title(f"TPC-H SF {sf:g}, {meta['machine']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(stem.with_suffix(".png"), dpi=100)
    except ImportError:
        print("matplotlib missing: no chart (pip install matplotlib)")
    print("\n".join(lines))


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
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
                       f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB",
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
    # what streaming one-stage queries changes.
    for label, standalone in (("basin", False), ("basin-standalone", True), ("basin-jobs", False)):
        if label not in engines:
            continue
        workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"{label}-"))
        config = None
        if label == "basin-jobs":
            config = workdir / "basin.toml"
            config.write_text("[server]\nstreamed_stages = false\n")
        basin = Basin(args.basin, data_dir, workdir, args.executors, standalone, config=config)
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
    report(pathlib.Path(args.out), args.sf, engines, results, meta)
    if failures or missing:
        print("FAILED:", *failures, *(f"{m}: no result" for m in missing), sep="\n  ")
        sys.exit(1)


if __name__ == "__main__":
    main()
