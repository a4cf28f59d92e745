#!/usr/bin/env python3
"""TPC-DS side by side: Basin (Iceberg tables, multi-process cluster), Basin standalone,
DuckDB and DataFusion, on the same dsdgen data in the same run; or, with --check-only, the
99 answers of the chosen engines checked against DuckDB's (CI).

    benchmarks/run.sh --suite tpcds --sf 1   # the whole run (builds Basin in release mode)
    python3 benchmarks/tpcds.py --sf 0.1 --check-only --engines basin,basin-standalone \\
        --basin $CARGO_TARGET_DIR/debug/basin                                  # CI

Steps:
1. DuckDB (PyPI) loads its tpcds extension from the duckdb-extension-tpcds wheel, runs
   `dsdgen` and writes the 24 tables as Parquet (cached under ~/.cache/basin/tpcds/sfN),
   and the 99 query texts to ~/.cache/basin/tpcds/queries/qNN.sql.
2. DuckDB runs the queries over the Parquet files; its answers are the reference. It sorts
   NULLs as DataFusion does (last ascending, first descending) where a query leaves it open.
3. Basin: `basin scheduler` + N `basin executor` processes; the tables are copied into the
   embedded Iceberg catalog (`CREATE TABLE lake.tpcds_sfN.t WITH (codec of the dsdgen files)
   AS SELECT * FROM read_parquet(...)`, cached in ~/.cache/basin/tpcds/basin-data); each
   query runs unmodified over Flight SQL (ADBC) after `USE lake.tpcds_sfN`.
4. Basin standalone (`basin standalone`, one process) over the same Iceberg tables.
5. DataFusion (PyPI `datafusion`) over the Parquet files, in a child process.

Every answer is compared with DuckDB's as a multiset of rows with numeric tolerance; where
the query's ORDER BY leaves ties at its LIMIT, any of the tied rows may be kept, and the rows
must come in the ORDER BY's order (checked where its keys are output columns). A query that
fails, runs past --timeout or takes a Basin process past --rss-limit-gb (the harness kills
it, harness.py says why) is reported with its error and the run goes on (the deployment is
restarted when a process is gone). Per query: min and median over --runs timed runs after a
warm-up, rows, and the peak RSS of each Basin process during that query. Writes
tpcds-sfN.json, .md and .png into --out. Exits non-zero on a wrong answer, on a failure not
in KNOWN_FAILURES, and with --check-only also on a known failure that passes (take it off
the list).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import pathlib
import re
import shutil
import statistics
import sys
import tempfile
import time

from harness import (REPO, Basin, ClusterError, QueryFailed, Worker, bytes_planned,
                     datafusion_session, guarded, machine, one_line, peak_rss_mb, report,
                     reset_peak_rss, rows_of, rss_mb, same_value, sf_name, source_codec, timed,
                     unmatched, with_server_setting)

TABLES = [
    "call_center", "catalog_page", "catalog_returns", "catalog_sales", "customer",
    "customer_address", "customer_demographics", "date_dim", "household_demographics",
    "income_band", "inventory", "item", "promotion", "reason", "ship_mode", "store",
    "store_returns", "store_sales", "time_dim", "warehouse", "web_page", "web_returns",
    "web_sales", "web_site",
]
BASIN_ENGINES = ("basin", "basin-standalone", "basin-exchanges", "basin-staged")
# Settings each Basin engine adds to --basin-config: basin-exchanges runs queries over
# `single_node_max_bytes` as streamed stages with exchanges (the default since 2026-12-07),
# basin-staged as Ballista jobs (the default before).
BASIN_SETTINGS = {"basin-exchanges": "streamed_exchanges = true",
                  "basin-staged": "streamed_exchanges = false"}


def _basin(reason: str) -> dict[str, str]:
    return {e: reason for e in BASIN_ENGINES}


# Queries that fail today, engine by engine, and why, as CI finds them (SF 0.1, debug build):
# CI reports them, fails on any failure not listed here and on a listed one that passes —
# whoever fixes one takes it off in the same commit. The aim is an empty list. Taken off
# since the list began (2026-12-06): Q9 (068d9c7), Q71 (4dc7a1c); Q1, Q14, Q24, Q95 (the
# debug-build panic on join statistics: Iceberg scans give no nonzero null counts).
KNOWN_FAILURES: dict[int, dict[str, str]] = {}


def known(n: int, engine: str) -> str | None:
    return KNOWN_FAILURES.get(n, {}).get(engine)


# ---------------------------------------------------------------- data and reference


def load_extension(con):
    spec = importlib.util.find_spec("duckdb_extension_tpcds")
    if spec is None:
        sys.exit("pip install duckdb-extension-tpcds (same version as duckdb)")
    ext = next((p for loc in spec.submodule_search_locations
                for p in pathlib.Path(loc).rglob("tpcds.duckdb_extension")), None)
    if ext is None:
        sys.exit("the duckdb-extension-tpcds wheel holds no tpcds.duckdb_extension: reinstall it")
    con.execute(f"LOAD '{ext.as_posix()}'")


def duckdb_connect():
    import duckdb
    return duckdb.connect(":memory:", config={"autoinstall_known_extensions": "false",
                                              "autoload_known_extensions": "false"})


def complete(files) -> bool:
    import pyarrow.parquet as pq
    try:
        return all(pq.ParquetFile(f).metadata.num_rows >= 0 for f in files.values())
    except Exception:  # noqa: BLE001 - missing or half-written file
        return False


def generate(sf: float, cache: pathlib.Path) -> tuple[dict[str, pathlib.Path], list[tuple[int, str]]]:
    """The tables (generated unless cached) and the 99 query texts."""
    out = cache / sf_name(sf)
    files = {t: out / f"{t}.parquet" for t in TABLES}
    qdir = cache / "queries"
    qfiles = [qdir / f"q{n:02d}.sql" for n in range(1, 100)]
    have_queries = all(f.is_file() for f in qfiles)
    if complete(files) and have_queries:
        return files, [(n, f.read_text().strip().rstrip(";")) for n, f in enumerate(qfiles, 1)]
    con = duckdb_connect()
    load_extension(con)
    if not complete(files):
        tmp = out.with_suffix(".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        print(f"generating TPC-DS SF {sf:g} with DuckDB's dsdgen into {out}", flush=True)
        start = time.perf_counter()
        con.execute(f"CALL dsdgen(sf={sf:g})")
        for t in TABLES:
            con.execute(f"COPY {t} TO '{(tmp / f'{t}.parquet').as_posix()}' (FORMAT parquet)")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
        print(f"generated in {time.perf_counter() - start:.0f} s", flush=True)
    if not have_queries:
        qdir.mkdir(parents=True, exist_ok=True)
        for n, text in con.execute("SELECT query_nr, query FROM tpcds_queries()").fetchall():
            (qdir / f"q{int(n):02d}.sql").write_text(text)
    con.close()
    return files, [(n, f.read_text().strip().rstrip(";")) for n, f in enumerate(qfiles, 1)]


def reference_connection(files):
    con = duckdb_connect()
    # DataFusion's (and so Basin's) NULL order where a query names none; DuckDB's own default
    # puts NULLs last in both directions, which changes the first 100 rows of some queries.
    con.execute("SET default_null_order = 'nulls_last_on_asc_first_on_desc'")
    for t, f in files.items():
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{f.as_posix()}')")
    return con


# ---------------------------------------------------------------- the final ORDER BY and LIMIT


def _mask(sql: str) -> str:
    """`sql` with everything inside parentheses, quotes and comments blanked out (same length),
    so that what is left is the top level of the statement."""
    out, depth, quote, i = [], 0, None, 0
    while i < len(sql):
        c = sql[i]
        if quote:
            out.append(" ")
            if c == quote:
                quote = None
        elif c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            j = len(sql) if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        elif c in "'\"":
            quote = c
            out.append(" ")
        elif c == "(":
            depth += 1
            out.append(" ")
        elif c == ")":
            depth -= 1
            out.append(" ")
        else:
            out.append(c if depth == 0 else " ")
        i += 1
    return "".join(out)


class Order:
    """The query's last top-level ORDER BY, its keys resolved to output columns where they
    name one (`keys`: (column, descending, nulls first); `complete`: every key resolved), and
    its LIMIT."""

    def __init__(self, sql: str, columns: list[str]):
        masked = _mask(sql)
        self.keys: list[tuple[int, bool, bool]] = []
        self.complete = False
        self.limit = None
        self.unlimited_sql = None
        lim = list(re.finditer(r"\blimit\s+(\d+)\s*$", masked, re.I))
        if lim:
            self.limit = int(lim[-1].group(1))
            self.unlimited_sql = sql[: lim[-1].start()]
        orders = list(re.finditer(r"\border\s+by\b", masked, re.I))
        if not orders:
            return
        start = orders[-1].end()
        end = lim[-1].start() if lim else len(sql)
        items, pos = [], start
        for m in re.finditer(",", masked[start:end]):
            items.append(sql[pos: start + m.start()])
            pos = start + m.end()
        items.append(sql[pos:end])
        lower = [c.lower() for c in columns]
        self.complete = True
        for item in items:
            m = re.fullmatch(r"\s*(.*?)(?:\s+(asc|desc))?(?:\s+nulls\s+(first|last))?\s*", item,
                             re.I | re.S)
            expr, direction, nulls = m.group(1), (m.group(2) or "asc").lower(), m.group(3)
            desc = direction == "desc"
            nulls_first = desc if nulls is None else nulls.lower() == "first"
            col = None
            if re.fullmatch(r"\d+", expr):
                col = int(expr) - 1 if 0 < int(expr) <= len(columns) else None
            else:
                name = re.fullmatch(r'(?:"?\w+"?\.)?"?([\w ]+?)"?', expr)
                if name and lower.count(name.group(1).lower()) == 1:
                    col = lower.index(name.group(1).lower())
            if col is None:
                self.complete = False
                break
            self.keys.append((col, desc, nulls_first))

    def key(self, row):
        return [row[c] for c, _, _ in self.keys]

    def misordered(self, rows) -> int | None:
        """The first i where rows[i] should come after rows[i + 1], or None."""
        for i in range(len(rows) - 1):
            for c, desc, nulls_first in self.keys:
                a, b = rows[i][c], rows[i + 1][c]
                if a == b:  # the engine's own values, sorted by itself: no tolerance
                    continue
                if a is None or b is None:
                    right = (a is None) == nulls_first
                else:
                    try:
                        right = (a > b) if desc else (a < b)
                    except TypeError:
                        return None
                if not right:
                    return i
                break
        return None


def same_keys(a, b) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None and same_value(x, y))
               for x, y in zip(a, b))


def check(got: list[tuple], want: list[tuple], order: Order, unlimited) -> str | None:
    """None when `got` is a right answer; else what is wrong. `unlimited()`: the reference's
    rows without the query's LIMIT (for ties at the limit)."""
    if len(got) != len(want):
        return f"{len(got)} rows, expected {len(want)}"
    extra, missing = unmatched(got, want)
    if extra or missing:
        tied = False
        if order.complete and order.keys and order.limit is not None and len(want) == order.limit:
            last = order.key(want[-1])
            if all(same_keys(order.key(r), last) for r in extra + missing):
                ties = [r for r in unlimited() if same_keys(order.key(r), last)]
                tied = not unmatched(extra, ties)[0]
        if not tied:
            return (f"{len(extra)} of {len(got)} rows differ, e.g. {extra[0]} where DuckDB has "
                    f"{missing[0]}" if extra and missing else f"rows differ: {extra or missing}")
    if order.keys:
        i = order.misordered(got)
        if i is not None:
            return f"rows {i + 1} and {i + 2} out of ORDER BY order: {got[i]}, {got[i + 1]}"
    return None


# ---------------------------------------------------------------- Basin


def load_iceberg(basin: Basin, files, schema: str, codec: str) -> float:
    """Iceberg copies of the Parquet files (CTAS, so columns nullable as dsdgen's), written
    with the files' codec so that every engine decompresses the same way. A table an earlier
    run loaded in full is kept."""
    import pyarrow.parquet as pq
    basin.query(f"CREATE SCHEMA IF NOT EXISTS lake.{schema}")
    start = time.perf_counter()
    for t in TABLES:
        want = pq.ParquetFile(files[t]).metadata.num_rows
        try:
            got = basin.query(f"SELECT count(*) FROM lake.{schema}.{t}").column(0)[0].as_py()
            if got == want:
                continue
            basin.query(f"DROP TABLE lake.{schema}.{t}")
        except Exception:  # noqa: BLE001 - no such table
            pass
        print(f"loading {t} ({want} rows) into lake.{schema}", flush=True)
        basin.query(f"CREATE TABLE lake.{schema}.{t} "
                    f"WITH (\"write.parquet.compression-codec\" = '{codec}') "
                    f"AS SELECT * FROM read_parquet('{files[t].as_posix()}')")
    return time.perf_counter() - start


class Deployment:
    """A Basin deployment that is started again after a query took a process down."""

    def __init__(self, args, standalone, schema, workdir, setting=None):
        self.args, self.standalone, self.schema, self.workdir = args, standalone, schema, workdir
        self.config = args.basin_config
        if setting:
            given = pathlib.Path(self.config).read_text() if self.config else ""
            self.config = workdir / "basin.toml"
            self.config.write_text(with_server_setting(given, setting))
        self.basin = None
        self.restarts = 0
        # Deployments given up after a failure: kept, so that the ADBC handles a query
        # thread may still hold are not closed under it by the garbage collector.
        self.abandoned = []

    def start(self):
        self.basin = Basin(self.args.basin, pathlib.Path(self.args.cache) / "basin-data",
                           self.workdir, self.args.executors, self.standalone,
                           config=self.config)

    def use(self):
        self.basin.query(f"USE lake.{self.schema}")
        for statement in self.args.basin_setup:
            self.basin.query(statement)

    def restart(self):
        self.basin.kill()
        self.abandoned.append(self.basin)
        self.restarts += 1
        self.start()
        self.use()

    def stop(self):
        if self.basin is not None:
            self.basin.stop()


def run_basin(label, dep: Deployment, qs, check_answer, args, results):
    """Every query on one deployment; a failure is recorded and the run goes on."""
    timeout = args.timeout
    limit = args.rss_limit_gb * 1024
    for n, sql in qs:
        b = dep.basin
        if b is None:  # could not restart after the last failure
            results.setdefault(n, {})[label] = {"min": None, "status": "crash", "valid": False,
                                                "error": "the deployment did not start again"}
            continue
        for pid in b.pids().values():
            reset_peak_rss(pid)
        # What each process held before (the allocator keeps freed memory), as the peak
        # during the query is at least that.
        before = {name: rss_mb(pid) for name, pid in b.pids().items()}
        logs = b.log_sizes()
        entry = {"min": None, "valid": False, "rss_before_mb": before}
        try:
            times, table = timed(lambda: guarded(lambda: b.query(sql), b.pids, timeout, limit),
                                 args.runs)
            rows = rows_of(table)
            err = check_answer(n, rows)
            entry.update(min=min(times), median=statistics.median(times), rows=table.num_rows,
                         valid=err is None, status="ok" if err is None else "wrong", error=err)
        except QueryFailed as e:
            entry.update(status=e.status, error=e.text)
        except Exception as e:  # noqa: BLE001 - the query's error, reported
            time.sleep(0.3)  # a process that died as the query failed is reaped a moment later
            gone, panics, text = b.exited(), b.panics(logs), one_line(e)
            entry.update(status="crash" if gone else "error",
                         error="; ".join([*gone, *panics, f"client saw: {text}"])
                         if gone or panics else text)
        entry["peak_rss_mb"] = {name: peak_rss_mb(pid) for name, pid in b.pids().items()}
        if entry["status"] == "ok" and not args.check_only:
            entry["bytes_planned"] = bytes_planned(b, sql)
        results.setdefault(n, {})[label] = entry
        shown = f"{entry['min']:8.3f}s" if entry["min"] is not None else f"{'-':>9}"
        status = "ok" if entry["status"] == "ok" else f"{entry['status'].upper()}: {entry['error']}"
        print(f"{label:18} q{n:02d} {shown} {status}", flush=True)
        if entry["status"] in ("timeout", "memory", "crash") or b.exited():
            try:
                dep.restart()
            except (ClusterError, Exception) as e:  # noqa: BLE001 - ClusterError is a SystemExit
                print(f"{label}: could not start again: {one_line(e)}", flush=True)
                dep.basin = None


# ---------------------------------------------------------------- summary


def summarize(engines, qs, results, strict: bool) -> bool:
    """Prints each engine's passes and failures against KNOWN_FAILURES; True when nothing
    failed that is not listed and, if `strict` (CI), no listed failure passed."""
    fine = True
    lines = []
    for e in engines:
        if e == "duckdb":
            continue
        passed, known_failed, unexpected, fixed = [], [], [], []
        for n, _ in qs:
            v = results.get(n, {}).get(e)
            ok = v is not None and v.get("valid")
            reason = known(n, e)
            if ok:
                (fixed if reason else passed).append(n)
            elif reason:
                known_failed.append((n, reason))
            else:
                unexpected.append((n, v))
        lines.append(f"{e}: {len(passed)} passed, {len(known_failed) + len(unexpected)} failed "
                     f"({len(known_failed)} known, {len(unexpected)} new)"
                     + (f", {len(fixed)} known failures pass now" if fixed else ""))
        for n, reason in known_failed:
            lines.append(f"  known    q{n:02d}: {reason}")
        for n, v in unexpected:
            what = "no result" if v is None else f"{v.get('status', 'error').upper()}: {v.get('error')}"
            lines.append(f"  NEW      q{n:02d}: {what}")
        for n in fixed:
            lines.append(f"  PASSES   q{n:02d}: take it off KNOWN_FAILURES in benchmarks/tpcds.py")
        fine = fine and not unexpected and not (strict and fixed)
    print("\n".join(["", "TPC-DS answers against DuckDB's:", *lines]), flush=True)
    return fine


def quiet_abandoned_cursors():
    """The cursor of a query given up (timeout, process killed) is closed twice, by its thread
    and by the garbage collector, and the ADBC driver prints a traceback for the second
    ("Underflow in closing this AdbcStatement") amid the results: that one is dropped."""
    default = sys.unraisablehook

    def hook(u):
        if not (isinstance(u.exc_value, RuntimeError) and "Underflow in closing" in str(u.exc_value)):
            default(u)
    sys.unraisablehook = hook


def main():
    quiet_abandoned_cursors()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sf", type=float, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--executors", type=int, default=2)
    ap.add_argument("--basin", default=str(pathlib.Path(os.environ.get(
        "CARGO_TARGET_DIR", pathlib.Path.home() / ".cache/basin/target")) / "release" / "basin"))
    ap.add_argument("--engines", default="basin,basin-standalone,duckdb,datafusion",
                    help="of basin (scheduler + executors), basin-standalone, duckdb, datafusion")
    ap.add_argument("--queries", default="", help="e.g. 1,3,6 (default all 99)")
    ap.add_argument("--cache", default=str(pathlib.Path.home() / ".cache/basin/tpcds"))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--check-only", action="store_true",
                    help="answers only: each query runs once, untimed")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a query may run")
    ap.add_argument("--rss-limit-gb", type=float, default=8,
                    help="a Basin or DataFusion process above this RSS is killed")
    ap.add_argument("--basin-setup", action="append", default=[],
                    help="SQL run on each Basin session before the queries (e.g. a SET)")
    ap.add_argument("--basin-config", default=None,
                    help="a basin.toml every Basin process reads (e.g. [server] settings)")
    args = ap.parse_args()
    engines = args.engines.split(",")
    unknown = set(engines) - {*BASIN_ENGINES, "duckdb", "datafusion"}
    if unknown:
        sys.exit(f"unknown engines {sorted(unknown)}: use {', '.join(BASIN_ENGINES)}, duckdb, datafusion")
    if args.check_only:
        args.runs = 0
    cache = pathlib.Path(args.cache)
    files, qs = generate(args.sf, cache)
    if args.queries:
        wanted = {int(q) for q in args.queries.split(",")}
        qs = [(n, q) for n, q in qs if n in wanted]

    con = reference_connection(files)
    reference, orders, unlimited = {}, {}, {}
    start = time.perf_counter()
    for n, q in qs:
        table = con.execute(q).to_arrow_table()
        reference[n] = rows_of(table)
        orders[n] = Order(q, table.column_names)
    print(f"DuckDB's answers to {len(qs)} queries in {time.perf_counter() - start:.1f} s", flush=True)

    def rows_without_limit(n):
        if n not in unlimited:
            sql = orders[n].unlimited_sql
            unlimited[n] = rows_of(con.execute(sql).to_arrow_table()) if sql else reference[n]
        return unlimited[n]

    def check_answer(n, rows):
        return check(rows, reference[n], orders[n], lambda: rows_without_limit(n))

    results: dict[int, dict] = {}
    meta = {"suite": "tpcds", "sf": args.sf, "runs": args.runs, "executors": args.executors,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "timeout_s": args.timeout, "rss_limit_gb": args.rss_limit_gb,
            "peak_rss_mb": {}}
    if "duckdb" in engines:
        import duckdb
        meta["duckdb"] = duckdb.__version__
        for n, q in qs:
            times, table = timed(lambda: con.execute(q).to_arrow_table(), args.runs)
            results.setdefault(n, {})["duckdb"] = {
                "min": min(times), "median": statistics.median(times), "rows": table.num_rows,
                "valid": True, "status": "ok"}
            print(f"{'duckdb':18} q{n:02d} {min(times):8.3f}s", flush=True)
    if "datafusion" in engines:
        import datafusion
        meta["datafusion"] = getattr(datafusion, "__version__", "?")
        worker = Worker("datafusion", datafusion_session, (files,), args.timeout,
                        args.rss_limit_gb * 1024)
        try:
            for n, q in qs:
                entry = {"min": None, "valid": False}
                try:
                    times, rows, num_rows, peak = worker.run(q, args.runs)
                    err = check_answer(n, rows)
                    entry.update(min=min(times), median=statistics.median(times), rows=num_rows,
                                 valid=err is None, status="ok" if err is None else "wrong",
                                 error=err, peak_rss_mb=peak)
                except QueryFailed as e:
                    entry.update(status=e.status, error=e.text)
                results.setdefault(n, {})["datafusion"] = entry
                shown = f"{entry['min']:8.3f}s" if entry["min"] is not None else f"{'-':>9}"
                status = "ok" if entry["status"] == "ok" else f"{entry['status'].upper()}: {entry['error']}"
                print(f"{'datafusion':18} q{n:02d} {shown} {status}", flush=True)
        finally:
            worker.stop()

    codec = source_codec(files, "dsdgen")
    schema = f"tpcds_{sf_name(args.sf)}"
    meta["iceberg_codec"] = codec
    for label in engines:
        if label not in BASIN_ENGINES:
            continue
        workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"{label}-"))
        dep = Deployment(args, label == "basin-standalone", schema, workdir,
                         BASIN_SETTINGS.get(label))
        try:
            dep.start()
            load = load_iceberg(dep.basin, files, schema, codec)
            meta.setdefault("load_seconds", round(load, 1))
            dep.use()
            run_basin(label, dep, qs, check_answer, args, results)
            peaks: dict[str, float] = {}
            for r in results.values():
                for name, mb in (r.get(label, {}).get("peak_rss_mb") or {}).items():
                    if mb is not None:
                        peaks[name] = max(peaks.get(name, 0), round(mb))
            meta["peak_rss_mb"][label] = peaks
            meta.setdefault("restarts", {})[label] = dep.restarts
            meta["basin_setup"] = args.basin_setup
        except ClusterError as e:
            print(f"{label} did not start: {e}", flush=True)
            for n, _ in qs:
                results.setdefault(n, {})[label] = {"min": None, "valid": False, "status": "crash",
                                                    "error": f"did not start: {one_line(str(e))}"}
        finally:
            dep.stop()
            shutil.rmtree(workdir, ignore_errors=True)

    notes = [f"Iceberg load (CREATE TABLE AS SELECT of the 24 tables, s; 0 when cached): "
             f"{meta.get('load_seconds')}, codec {codec} (the dsdgen files')",
             f"Query timeout {args.timeout:g} s, RSS limit {args.rss_limit_gb:g} GB; restarts "
             f"after a lost process: {meta.get('restarts', {})}"]
    failures = [f"- {e} q{n:02d}: {v.get('status')}: {v.get('error')}"
                + (" (known)" if known(n, e) else "")
                for n in sorted(results) for e, v in results[n].items() if not v.get("valid", True)]
    if failures:
        notes += ["", "Failures (answers that differ from DuckDB's, errors):", "", *failures]
    report(pathlib.Path(args.out) / f"tpcds-{sf_name(args.sf)}", f"TPC-DS SF {args.sf:g}",
           engines, results, meta, notes)
    if not summarize(engines, qs, results, strict=args.check_only):
        sys.exit(1)


if __name__ == "__main__":
    main()
