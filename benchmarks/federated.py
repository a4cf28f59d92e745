#!/usr/bin/env python3
"""Federated queries over PostgreSQL, side by side: Basin's postgres connector (multi-process
cluster over Flight SQL), DuckDB's postgres_scanner, and PostgreSQL alone, on TPC-H in one run.

    benchmarks/federated.sh --sf 1            # the whole run (builds Basin in release mode)
    python3 benchmarks/federated.py --sf 0.01 --runs 1 --basin target/debug/basin   # smoke

Steps:
1. tpchgen-cli writes the eight TPC-H tables as Parquet (tpch.py's `generate`, cached under
   ~/.cache/basin/tpch/sfN).
2. PostgreSQL: --pg-url, else $BASIN_TEST_PG_URL, else a running `.ci/services.sh` postgres,
   else `.ci/services.sh start postgres` (left running unless --stop-services). The tables are
   copied into `public` by DuckDB's postgres extension (CTAS from read_parquet, binary COPY;
   bigint/int keys, numeric(15,2), date, varchar), then VACUUM ANALYZE. Cached: a table is
   kept when its comment names this scale factor and its row count matches the Parquet file.
3. Measurements, each with one warm-up then --runs timed runs (best and median):
   - extract: all rows and columns of lineitem fetched as Arrow;
   - agg: SELECT sum(l_quantity), count(*) FROM lineitem;
   - TPC-H Q1, Q3, Q6 (texts from DuckDB's tpch extension), tables as pg.public.<t>.
   Engines: PostgreSQL alone (psql in one session, `\\timing`, results to /dev/null; for
   extract, `\\copy (SELECT * ...) TO /dev/null (FORMAT binary)` over one connection);
   DuckDB 1.5.5 with postgres_scanner loaded from the PyPI wheel, ATTACHed read-only as `pg`;
   Basin: `basin scheduler` + N `basin executor` processes with a basin.toml holding
   [catalogs.pg]; basin-standalone: `basin standalone --executors N`, the same cluster in one
   process; basin-jobs: the cluster with streamed stages off.
   Basin's and DuckDB's answers are checked against PostgreSQL's (run through
   postgres_query(), i.e. computed by PostgreSQL); extract is checked by row and column count.
4. Paired rounds (--paired-rounds, default 5): the two acceptance ratios again, for basin and
   basin-standalone, each alternating with its peer round by round (extract vs DuckDB, agg vs
   PostgreSQL), the peer first every other round; the median of the per-round ratios is the
   figure to quote.
Writes federated-sfN.json and federated-sfN.md into --out and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import tpch  # noqa: E402  (generate, Basin, answer comparison)

REPO = tpch.REPO
TABLES = tpch.TABLES
ENGINES = ["postgres", "basin", "basin-standalone", "basin-jobs", "duckdb"]
LABELS = {"postgres": "PostgreSQL alone", "basin": "Basin",
          "basin-standalone": "Basin standalone", "basin-jobs": "Basin, every query a job",
          "duckdb": "DuckDB postgres_scanner"}
# The Basin deployments: (standalone, streamed stages).
BASINS = {"basin": (False, True), "basin-standalone": (True, True), "basin-jobs": (False, False)}


# ---------------------------------------------------------------- PostgreSQL


class Postgres:
    def __init__(self, url: str):
        self.url = url
        self.psql_bin = shutil.which("psql") or sys.exit("psql not found (apt-get install postgresql-client)")

    def psql(self, sql: str) -> list[list[str]]:
        """Runs SQL (autocommit) and returns the rows of the last statement, as strings."""
        r = subprocess.run([self.psql_bin, "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1",
                            "-d", self.url, "-c", sql], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed: {r.stderr.strip()}\nSQL: {sql[:500]}")
        return [line.split("\t") for line in r.stdout.splitlines() if line]

    def timed(self, statement: str, runs: int) -> list[float]:
        """One psql session: a warm-up, then `runs` runs of `statement` timed by `\\timing`."""
        script = "\n".join(["\\set ON_ERROR_STOP on", "\\timing on", "\\o /dev/null"] +
                           [statement] * (runs + 1)) + "\n"
        r = subprocess.run([self.psql_bin, "-X", "-q", "-d", self.url, "-f", "-"], input=script,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed: {r.stderr.strip()}")
        times = [float(t) / 1000 for t in re.findall(r"^Time: ([\d.]+) ms", r.stdout, re.M)]
        if len(times) != runs + 1:
            raise RuntimeError(f"expected {runs + 1} timings from psql, got: {r.stdout[-500:]}")
        return times[1:]


def services(*args) -> str:
    r = subprocess.run(["bash", str(REPO / ".ci" / "services.sh"), *args], capture_output=True,
                       text=True)
    if r.returncode != 0:
        sys.exit(f".ci/services.sh {' '.join(args)} failed:\n{r.stderr}")
    return r.stdout


def exported(text: str, name: str) -> str | None:
    m = re.search(rf"^export {name}=(.*)$", text, re.M)
    return m.group(1).strip().strip("'\"") if m else None


def find_postgres(arg: str | None) -> tuple[str, bool]:
    """(url, whether this script started the server)."""
    if arg:
        return arg, False
    if os.environ.get("BASIN_TEST_PG_URL"):
        return os.environ["BASIN_TEST_PG_URL"], False
    url = exported(services("env"), "BASIN_TEST_PG_URL")
    if url:
        print(f"using the running .ci/services.sh postgres: {url}", flush=True)
        return url, False
    print("starting a throwaway PostgreSQL: .ci/services.sh start postgres", flush=True)
    url = exported(services("start", "postgres"), "BASIN_TEST_PG_URL")
    if not url:
        sys.exit(".ci/services.sh start postgres printed no BASIN_TEST_PG_URL")
    return url, True


def parquet_rows(f: pathlib.Path) -> int:
    import pyarrow.parquet as pq
    return pq.ParquetFile(f).metadata.num_rows


def load_postgres(pg: Postgres, duck, files, sf: float) -> float | None:
    """Copies the tables into PostgreSQL's `public` schema unless already there. Returns the
    load time in seconds, or None when every table was cached."""
    marker = f"basin federated benchmark: TPC-H SF {sf:g}"
    todo = []
    want = {t: parquet_rows(files[t]) for t in TABLES}
    for t in TABLES:
        found = pg.psql(f"SELECT obj_description(to_regclass('public.{t}'), 'pg_class')")
        if found and found[0] and found[0][0] == marker:
            if int(pg.psql(f"SELECT count(*) FROM public.{t}")[0][0]) == want[t]:
                continue
        todo.append(t)
    if not todo:
        print("PostgreSQL tables cached (comment and row counts match)", flush=True)
        return None
    start = time.perf_counter()
    # Drop before DuckDB attaches: tables dropped behind an attached DuckDB's back (another
    # scale factor's, say) were recreated empty, all but the first.
    for t in todo:
        pg.psql(f"DROP TABLE IF EXISTS public.{t}")
    duck.execute(f"ATTACH '{pg.url}' AS pgload (TYPE postgres)")
    try:
        for t in todo:
            print(f"loading {t} into PostgreSQL", flush=True)
            duck.execute(f"CREATE TABLE pgload.public.{t} AS "
                         f"SELECT * FROM read_parquet('{files[t].as_posix()}')")
    finally:
        duck.execute("DETACH pgload")
    for t in todo:
        got = int(pg.psql(f"SELECT count(*) FROM public.{t}")[0][0])
        if got != want[t]:
            sys.exit(f"loading {t} into PostgreSQL left {got} rows, not {want[t]}")
        pg.psql(f"COMMENT ON TABLE public.{t} IS '{marker}'")
    pg.psql("VACUUM (ANALYZE) " + ", ".join(f"public.{t}" for t in todo))
    return time.perf_counter() - start


# ---------------------------------------------------------------- DuckDB


def duckdb_connect(threads=None):
    import duckdb
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": "false",
                                             "autoload_known_extensions": "false"})
    if threads:
        con.execute(f"SET threads = {threads}")
    for module, name in (("duckdb_extension_tpch", "tpch"),
                         ("duckdb_extension_postgres_scanner", "postgres_scanner")):
        spec = importlib.util.find_spec(module)
        if spec is None:
            sys.exit(f"pip install {module.replace('_', '-')}=={duckdb.__version__}")
        ext = next(p for loc in spec.submodule_search_locations
                   for p in pathlib.Path(loc).rglob(f"{name}.duckdb_extension"))
        con.execute(f"LOAD '{ext.as_posix()}'")
    return con


def arrow(result):
    """A DuckDB result as a pyarrow Table (to_arrow_table since 1.5, fetch_arrow_table before)."""
    fetch = getattr(result, "to_arrow_table", None) or result.fetch_arrow_table
    return fetch()


def remote_sql(sql: str, prefix: str) -> str:
    """References TPC-H tables as `<prefix><table>`."""
    return re.sub(r"\b(" + "|".join(TABLES) + r")\b", lambda m: prefix + m.group(1), sql)


def pg_statement(sql: str) -> str:
    """A query over bare TPC-H table names as one psql line over `public`."""
    return " ".join(remote_sql(sql, "public.").split()) + ";"


# ---------------------------------------------------------------- Basin


def basin_config(path: pathlib.Path, url: str, options: list[str], streamed=True) -> pathlib.Path:
    lines = ["[server]", f"streamed_stages = {'true' if streamed else 'false'}",
             "[catalogs.pg]", 'connector = "postgres"', f"url = {json.dumps(url)}",
             'tls = "disable"', *options]
    path.write_text("\n".join(lines) + "\n")
    return path


def basin_query_ready(basin, sql, timeout=60):
    """The first query over the pg catalog (metadata discovery) may race executor startup."""
    deadline = time.time() + timeout
    while True:
        try:
            return basin.query(sql)
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


# ---------------------------------------------------------------- measuring


def measure(run, runs):
    times, result = tpch.timed(run, runs)
    return {"min": min(times), "median": statistics.median(times), "times": times}, result


def check_rows(table, reference) -> str | None:
    return tpch.same_answer(tpch.rows_of(table), reference)


def paired(basin_label, basin, duck, pg, pg_url, meta, rounds, lineitem_rows, extract: bool) -> dict:
    """The acceptance ratios measured in alternating rounds: Basin, then its peer, then the
    peer first in the next round, so both see the same machine (these 2 cores are shared,
    and measuring one engine minutes after the other moved a ratio by 25 %). Per pair: every
    time, the median of the per-round ratios, and the ratio of the medians."""
    pairs = []
    if extract:
        pairs.append(("extract", "duckdb"))
    pairs.append(("agg", "postgres"))
    duck.execute(f"ATTACH '{pg_url}' AS pg (TYPE postgres, READ_ONLY)")
    out = {}
    try:
        for m, peer in pairs:
            sql = meta["sql"][m]

            def run_basin(sql=sql, m=m):
                start = time.perf_counter()
                table = basin.query(sql)
                took = time.perf_counter() - start
                if m == "extract" and table.num_rows != lineitem_rows:
                    raise RuntimeError(f"Basin extracted {table.num_rows} rows, not {lineitem_rows}")
                return took

            if peer == "duckdb":
                def run_peer(sql=sql):
                    start = time.perf_counter()
                    table = arrow(duck.execute(sql))
                    took = time.perf_counter() - start
                    if table.num_rows != lineitem_rows:
                        raise RuntimeError(f"DuckDB extracted {table.num_rows} rows")
                    return took
            else:
                stmt = pg_statement(sql.replace("pg.public.", ""))

                def run_peer(stmt=stmt):
                    return pg.timed(stmt, 1)[0]  # after a warm-up in the same session

            run_basin()
            run_peer()
            times = {"basin": [], peer: []}
            for i in range(rounds):
                order = [("basin", run_basin), (peer, run_peer)]
                for name, fn in order if i % 2 == 0 else reversed(order):
                    times[name].append(fn())
            ratios = [b / p for b, p in zip(times["basin"], times[peer])]
            out[m] = {"peer": peer, "times": times,
                      "ratio_median": statistics.median(ratios),
                      "ratio_of_medians": statistics.median(times["basin"])
                      / statistics.median(times[peer]),
                      "ratio_of_best": min(times["basin"]) / min(times[peer])}
            print(f"paired    {m:8} {basin_label}/{peer} median of round ratios "
                  f"{out[m]['ratio_median']:.2f} (rounds: "
                  + ", ".join(f"{r:.2f}" for r in ratios) + ")", flush=True)
    finally:
        duck.execute("DETACH pg")
    return out


def report(out: pathlib.Path, sf, results, meta, order):
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"federated-{tpch.sf_name(sf)}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1,
                                                    default=str))

    def cell(v):
        if v is None:
            return "—"
        if "min" not in v:
            return "failed"
        return f"{v['min']:.3f} ({v['median']:.3f})" + ("" if v.get("valid", True) else " ✗")

    lines = [f"Federated TPC-H SF {sf:g} over PostgreSQL {meta.get('postgres', '?')}: seconds, best "
             f"(median) of {meta['runs']} after a warm-up. ✗ = answer differs from PostgreSQL's.",
             "", "| measurement | " + " | ".join(LABELS[e] for e in ENGINES) + " | Basin/DuckDB |",
             "|---|" + "---:|" * (len(ENGINES) + 1)]
    for m in order:
        r = results.get(m, {})
        b, d = r.get("basin") or {}, r.get("duckdb") or {}
        ratio = f"{b['min'] / d['min']:.2f}" if "min" in b and "min" in d else "—"
        lines.append(f"| {meta['descriptions'][m]} | " + " | ".join(cell(r.get(e)) for e in ENGINES)
                     + f" | {ratio} |")
    ex = results.get("extract")
    if ex:
        lines += ["", f"Extraction of lineitem ({meta.get('lineitem_rows', '?'):,} rows, all 16 columns):",
                  "", "| engine | rows/s (best) | MB/s of Arrow (best) |", "|---|---:|---:|"]
        for e in ENGINES:
            v = ex.get(e)
            if v and "min" in v:
                mbs = f"{v['arrow_bytes'] / v['min'] / 1e6:,.0f}" if v.get("arrow_bytes") else "—"
                lines.append(f"| {LABELS[e]} | {v['rows'] / v['min']:,.0f} | {mbs} |")
        lines += ["", "PostgreSQL alone for extraction: `\\copy (SELECT * FROM lineitem) TO /dev/null "
                  "(FORMAT binary)` from psql, one connection (no Arrow conversion)."]
    pr = meta.get("paired") or {}
    if pr:
        lines += ["", f"Paired rounds ({meta.get('paired_rounds')} rounds alternating a Basin "
                  "deployment with its peer, the peer first every other round): seconds per "
                  "round, median of the per-round ratios.", "",
                  "| measurement | Basin | peer | Basin's | peer's | Basin/peer (median of rounds) "
                  "| ratio of medians | ratio of best |", "|---|---|---|---|---|---:|---:|---:|"]
        fmt = lambda ts: " ".join(f"{t:.3f}" for t in ts)  # noqa: E731
        for label, measured in pr.items():
            for m, v in measured.items():
                lines.append(f"| {meta['descriptions'][m]} | {LABELS[label]} | {LABELS[v['peer']]} | "
                             f"{fmt(v['times']['basin'])} | {fmt(v['times'][v['peer']])} | "
                             f"**{v['ratio_median']:.2f}** | {v['ratio_of_medians']:.2f} | "
                             f"{v['ratio_of_best']:.2f} |")
    lines += ["", f"Basin: scheduler + {meta['executors']} executors (standalone: in one process), "
              f"{meta.get('basin_binary')}; "
              f"DuckDB {meta.get('duckdb')} threads={meta.get('duckdb_threads')}; "
              "PostgreSQL load (s): " + (str(meta["load_seconds"]) if meta.get("load_seconds") is not None
                                           else "cached"),
              f"Peak RSS (MB): {json.dumps(meta.get('peak_rss_mb', {}))}",
              f"Machine: {meta['machine']}"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sf", type=float, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--executors", type=int, default=2)
    ap.add_argument("--basin", default=str(pathlib.Path(os.environ.get(
        "CARGO_TARGET_DIR", pathlib.Path.home() / ".cache/basin/target")) / "release" / "basin"))
    ap.add_argument("--pg-url", default=None,
                    help="PostgreSQL to load into and query (default: $BASIN_TEST_PG_URL, else "
                         "a .ci/services.sh postgres, started if needed)")
    ap.add_argument("--stop-services", action="store_true",
                    help="run `.ci/services.sh stop` at the end if this script started postgres "
                         "(it stops every service that script started)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--queries", default="1,3,6", help="TPC-H queries to run federated")
    ap.add_argument("--skip-extract", action="store_true")
    ap.add_argument("--duckdb-threads", type=int, default=None)
    ap.add_argument("--paired-rounds", type=int, default=5,
                    help="rounds that alternate Basin with its peer for the two acceptance "
                         "ratios (extraction vs DuckDB, aggregate vs PostgreSQL); 0 skips them")
    ap.add_argument("--pg-option", action="append", default=[],
                    help='extra TOML line for Basin\'s [catalogs.pg], e.g. "max_splits = 8"')
    ap.add_argument("--basin-setup", action="append", default=[],
                    help="SQL run on the Basin session before the measurements")
    ap.add_argument("--cache", default=str(pathlib.Path.home() / ".cache/basin/tpch"))
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    engines = args.engines.split(",")
    unknown = set(engines) - set(ENGINES)
    if unknown:
        sys.exit(f"unknown engines {unknown}; known: {ENGINES}")

    files = tpch.generate(args.sf, pathlib.Path(args.cache))
    pg_url, started = find_postgres(args.pg_url)
    pg = Postgres(pg_url)
    duck = duckdb_connect(args.duckdb_threads)
    import duckdb
    meta = {"sf": args.sf, "runs": args.runs, "executors": args.executors,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
                       f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB",
            "duckdb": duckdb.__version__,
            "duckdb_threads": duck.execute("SELECT current_setting('threads')").fetchone()[0],
            "postgres": pg.psql("SHOW server_version")[0][0],
            "pg_url": re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", pg_url),
            "basin_binary": args.basin, "basin_pg_options": args.pg_option,
            "basin_setup": args.basin_setup, "peak_rss_mb": {}, "descriptions": {}, "sql": {}}
    try:
        load = load_postgres(pg, duck, files, args.sf)
        meta["load_seconds"] = None if load is None else round(load, 1)
        lineitem_rows = parquet_rows(files["lineitem"])
        meta["lineitem_rows"] = lineitem_rows

        # What to measure: name -> (description, SQL over `{t}`-prefixed tables).
        wanted = {int(q) for q in args.queries.split(",") if q}
        qtexts = {n: q for n, q in tpch.queries(duck) if n in wanted}
        work = {}
        if not args.skip_extract:
            work["extract"] = ("extract lineitem (all rows, all columns)", "SELECT * FROM lineitem")
        work["agg"] = ("SELECT sum(l_quantity), count(*) FROM lineitem",
                       "SELECT sum(l_quantity), count(*) FROM lineitem")
        for n in sorted(qtexts):
            work[f"q{n:02d}"] = (f"TPC-H Q{n}", qtexts[n])
        for m, (desc, sql) in work.items():
            meta["descriptions"][m] = desc
            meta["sql"][m] = remote_sql(sql, "pg.public.")

        # PostgreSQL's own answers (computed by PostgreSQL, typed through postgres_query).
        duck.execute(f"ATTACH '{pg_url}' AS pg (TYPE postgres, READ_ONLY)")
        reference = {}
        for m, (_, sql) in work.items():
            if m != "extract":
                escaped = remote_sql(sql, "public.").replace("'", "''")
                reference[m] = tpch.rows_of(
                    arrow(duck.execute(f"SELECT * FROM postgres_query('pg', '{escaped}')")))
        results: dict[str, dict] = {m: {} for m in work}
        failures_paired: list[str] = []

        def record(m, engine, fn):
            try:
                r = fn()
            except Exception as e:  # noqa: BLE001
                results[m][engine] = {"error": f"{type(e).__name__}: {e}"[:2000]}
                print(f"{engine:9} {m:8} FAILED: {e}", flush=True)
                return
            results[m][engine] = r
            status = "ok" if r.get("valid", True) else "WRONG: " + str(r.get("error"))
            print(f"{engine:9} {m:8} {r['min']:8.3f}s  {status}", flush=True)

        def arrow_result(m, table, stats):
            if m == "extract":
                err = None
                if table.num_rows != lineitem_rows or table.num_columns != 16:
                    err = f"{table.num_rows} rows x {table.num_columns} columns, expected {lineitem_rows} x 16"
                stats["arrow_bytes"] = table.nbytes
            else:
                err = check_rows(table, reference[m])
            stats.update(rows=table.num_rows, valid=err is None, error=err)
            return stats

        if "postgres" in engines:
            for m, (_, sql) in work.items():
                local = remote_sql(sql, "public.")
                if m == "extract":
                    stmt = f"\\copy ({local}) TO '/dev/null' WITH (FORMAT binary)"
                    rows = lineitem_rows
                else:
                    stmt = pg_statement(sql)
                    rows = len(reference[m])
                def run_pg(stmt=stmt, rows=rows):
                    times = pg.timed(stmt, args.runs)
                    return {"min": min(times), "median": statistics.median(times), "times": times,
                            "rows": rows}
                record(m, "postgres", run_pg)

        if "duckdb" in engines:
            for m in work:
                sql = meta["sql"][m]
                def run_duck(m=m, sql=sql):
                    stats, table = measure(lambda: arrow(duck.execute(sql)), args.runs)
                    return arrow_result(m, table, stats)
                record(m, "duckdb", run_duck)
        duck.execute("DETACH pg")

        # basin-jobs: streamed stages off, every query a Ballista job (shuffle files, then
        # the result fetched from the executors) — the difference streaming makes.
        for label, (standalone, streamed) in BASINS.items():
            if label not in engines:
                continue
            workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"{label}-federated-"))
            config = basin_config(workdir / "basin.toml", pg_url, args.pg_option,
                                  streamed=streamed)
            basin = tpch.Basin(args.basin, workdir / "data", workdir, args.executors, standalone,
                               config=config)
            try:
                basin_query_ready(basin, "SELECT count(*) FROM pg.public.region")
                for statement in args.basin_setup:
                    basin.query(statement)
                meta.setdefault("basin_explain", {})[label] = explain = {}
                for m in work:
                    sql = meta["sql"][m]
                    try:
                        plan = basin.query("EXPLAIN " + sql)
                        explain[m] = [str(v) for v in plan.column(plan.num_columns - 1).to_pylist()]
                    except Exception as e:  # noqa: BLE001
                        explain[m] = [f"EXPLAIN failed: {e}"[:500]]
                    def run_basin(m=m, sql=sql):
                        stats, table = measure(lambda: basin.query(sql), args.runs)
                        return arrow_result(m, table, stats)
                    record(m, label, run_basin)
                peers = {"postgres"} | ({"duckdb"} if not args.skip_extract else set())
                if streamed and args.paired_rounds > 0 and peers <= set(engines):
                    try:
                        meta.setdefault("paired", {})[label] = paired(
                            label, basin, duck, pg, pg_url, meta, args.paired_rounds,
                            lineitem_rows, not args.skip_extract)
                        meta["paired_rounds"] = args.paired_rounds
                    except Exception as e:  # noqa: BLE001
                        failures_paired.append(f"paired rounds: {type(e).__name__}: {e}")
                        print(f"paired rounds FAILED: {e}", flush=True)
                meta["peak_rss_mb"][label] = basin.peak_rss()
            finally:
                basin.stop()
                logs = {p.name: p.read_text()[-2000:] for p in workdir.glob("*.log")}
                if any(("min" not in r.get(label, {"min": 0})) for r in results.values()):
                    meta.setdefault("basin_logs_tail", {})[label] = logs
                shutil.rmtree(workdir, ignore_errors=True)

        report(pathlib.Path(args.out), args.sf, results, meta, list(work))
    finally:
        try:
            duck.close()
        except Exception:  # noqa: BLE001
            pass
        if started:
            if args.stop_services:
                services("stop")
                print("stopped .ci/services.sh services", flush=True)
            else:
                print("note: this run started PostgreSQL with .ci/services.sh and left it running "
                      "(`bash .ci/services.sh stop` stops it, or pass --stop-services)", flush=True)

    failures = [f"{e} {m}: {v.get('error')}" for m, r in results.items() for e, v in r.items()
                if "min" not in v or not v.get("valid", True)] + failures_paired
    missing = [f"{e} {m}: no result" for m in work for e in engines if e not in results[m]]
    if failures or missing:
        print("FAILED:", *failures, *missing, sep="\n  ")
        sys.exit(1)


if __name__ == "__main__":
    main()
