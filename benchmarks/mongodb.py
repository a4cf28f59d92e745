#!/usr/bin/env python3
"""TPC-H lineitem in MongoDB (DocumentDB), side by side: Basin's mongodb connector against the
source's own time for the same query, in one run.

    python3 benchmarks/mongodb.py --basin target/release/basin --sf 1 --runs 3
    python3 benchmarks/mongodb.py --basin target/debug/basin --sf 0.01 --runs 1   # smoke

Steps:
1. tpchgen-cli writes lineitem as Parquet (tpch.py's `generate`, cached).
2. MongoDB: $BASIN_TEST_MONGODB_URL, else `.ci/services.sh start mongodb` (Microsoft DocumentDB
   from the shared services folder; left running unless --stop-services). `tpch.lineitem` is
   filled with one document per row (pymongo): `_id` = l_orderkey * 8 + l_linenumber (an
   integer, so scans split by `_id` ranges), int64 keys, Decimal128 amounts, dates, strings.
   Kept when its document count matches.
3. Measurements, one warm-up then --runs timed runs:
   - extract: every document, every field. The source alone: pymongo's `find_raw_batches`
     (the server's BSON batches, not decoded: a lower bound for any client); Basin: the rows
     fetched as Arrow over Flight SQL from `basin standalone`.
   - agg: `sum(l_quantity)` and `count(*)`. The source alone: the `$group` pipeline through
     pymongo; Basin: `SELECT sum(l_quantity), count(*)`, pushed into the server as `$group`.
   Answers are checked: row and column counts for extract, the values for agg.
   DuckDB has no MongoDB scanner, so it has no row here.
Writes mongodb-sfN.json and mongodb-sfN.md into --out and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402
import tpch  # noqa: E402

REPO = tpch.REPO
AGG = "SELECT sum(l_quantity) AS q, count(*) AS n FROM {t}"
PIPELINE = [{"$group": {"_id": None, "q": {"$sum": "$l_quantity"}, "n": {"$sum": 1}}}]


services, env_of = harness.services, harness.env_of


def load(coll, lineitem: pathlib.Path, rows: int) -> None:
    import bson
    import pyarrow.parquet as pq
    # (estimated_document_count comes from statistics on DocumentDB: count exactly)
    if coll.count_documents({}) == rows:
        print(f"tpch.lineitem: {rows} documents already there", flush=True)
        return
    coll.drop()
    print(f"loading {rows} documents into tpch.lineitem", flush=True)
    midnight = datetime.time()
    done = 0
    for batch in pq.ParquetFile(lineitem).iter_batches(batch_size=20_000):
        cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
        docs = []
        for i in range(batch.num_rows):
            doc = {"_id": cols["l_orderkey"][i] * 8 + cols["l_linenumber"][i]}
            for name, values in cols.items():
                v = values[i]
                if isinstance(v, decimal.Decimal):
                    v = bson.Decimal128(v)
                elif isinstance(v, datetime.date) and not isinstance(v, datetime.datetime):
                    v = datetime.datetime.combine(v, midnight)
                doc[name] = v
            docs.append(doc)
        coll.insert_many(docs, ordered=False)
        done += len(docs)
        if done % 1_000_000 < 20_000:
            print(f"  {done} documents", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--basin", required=True)
    ap.add_argument("--sf", type=float, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--executors", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results"))
    ap.add_argument("--cache", default=str(pathlib.Path.home() / ".cache/basin/tpch"))
    ap.add_argument("--max-splits", type=int, help="the catalog's max_splits (default: Basin's)")
    ap.add_argument("--stop-services", action="store_true")
    args = ap.parse_args()
    try:
        import pymongo
    except ImportError:
        sys.exit("pip install pymongo==4.20.1")

    files = tpch.generate(args.sf, pathlib.Path(args.cache))
    import duckdb
    rows = duckdb.sql(f"SELECT count(*) FROM read_parquet('{files['lineitem'].as_posix()}')").fetchone()[0]
    url = os.environ.get("BASIN_TEST_MONGODB_URL")
    started = False
    if not url:
        url, started = env_of(services("start", "mongodb"))["BASIN_TEST_MONGODB_URL"], True
    results: dict[str, dict[str, dict]] = {"extract": {}, "agg": {}}
    try:
        client = pymongo.MongoClient(url)
        coll = client.tpch.lineitem
        load(coll, files["lineitem"], rows)
        # The source alone.
        def extract():
            n = 0
            for raw in coll.find_raw_batches({}, batch_size=10_000):
                n += len(raw)
            return n
        times, size = harness.timed(extract, args.runs)
        results["extract"]["mongodb"] = {"min": min(times), "median": statistics.median(times),
                                         "bson_bytes": size}
        times, want = harness.timed(lambda: list(coll.aggregate(PIPELINE)), args.runs)
        results["agg"]["mongodb"] = {"min": min(times), "median": statistics.median(times)}
        want = [(float(str(want[0]["q"])), int(want[0]["n"]))]
        assert want[0][1] == rows, (want, rows)
        # Basin.
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="basin-mongodb-"))
        config = workdir / "basin.toml"
        splits = f"max_splits = {args.max_splits}\n" if args.max_splits else ""
        config.write_text(f'[catalogs.mg]\nconnector = "mongodb"\nurl = "{url}"\n{splits}')
        basin = harness.Basin(args.basin, workdir / "data", workdir, args.executors, True, config=config)
        try:
            extract_sql = "SELECT * FROM mg.tpch.lineitem"
            times, table = harness.timed(lambda: basin.query(extract_sql), args.runs)
            assert table.num_rows == rows and table.num_columns == 17, (table.num_rows, table.num_columns)
            results["extract"]["basin"] = {"min": min(times), "median": statistics.median(times)}
            plan = basin.query("EXPLAIN " + extract_sql)
            results["extract"]["basin"]["plan"] = str(plan.column(plan.num_columns - 1).to_pylist())[:800]
            agg_sql = AGG.format(t="mg.tpch.lineitem")
            times, table = harness.timed(lambda: basin.query(agg_sql), args.runs)
            got = [(float(q), int(n)) for q, n in zip(table.column(0).to_pylist(), table.column(1).to_pylist())]
            assert got == want, (got, want)
            results["agg"]["basin"] = {"min": min(times), "median": statistics.median(times)}
            plan = basin.query("EXPLAIN " + agg_sql)
            results["agg"]["basin"]["plan"] = str(plan.column(plan.num_columns - 1).to_pylist())[:800]
            results["peak_rss_mb"] = basin.peak_rss()
        finally:
            basin.stop()
            shutil.rmtree(workdir, ignore_errors=True)
    finally:
        if started and args.stop_services:
            services("stop")

    name = f"mongodb-{harness.sf_name(args.sf)}"
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": harness.machine(), "sf": args.sf, "rows": rows, "runs": args.runs,
            "executors": args.executors, "max_splits": args.max_splits,
            "source": "Microsoft DocumentDB 0.108 (MongoDB 7.0 protocol)"}
    (out / f"{name}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    lines = [f"# TPC-H SF {args.sf:g} lineitem in MongoDB (DocumentDB), {meta['date']}", "",
             f"{meta['machine']}; {rows} documents; best of {args.runs} after a warm-up.", "",
             "| query | MongoDB alone | Basin | Basin / source |", "|---|---|---|---|"]
    for q, label in [("extract", "extract (all documents, all fields)"), ("agg", "sum + count (pushed as $group)")]:
        s, b = results[q]["mongodb"]["min"], results[q]["basin"]["min"]
        lines.append(f"| {label} | {s:.2f} s | {b:.2f} s | {b / s:.2f}× |")
    lines += ["", "MongoDB alone: extract = pymongo `find_raw_batches` (BSON batches, not decoded), "
              "agg = the `$group` pipeline through pymongo. Basin: `basin standalone` with "
              f"{args.executors} executors, results fetched as Arrow over Flight SQL (decoded into "
              f"Arrow columns). DuckDB has no MongoDB scanner. Peak RSS of Basin: "
              f"{results.get('peak_rss_mb')} MB."]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
