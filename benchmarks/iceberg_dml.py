#!/usr/bin/env python3
"""Iceberg row-level changes: Basin's MERGE and DELETE against pyiceberg's upsert and delete
on the same TPC-H lineitem, and the read cost of repeated MERGEs before and after optimize.

Both engines work on their own copy of the same table state, in the same REST catalog and
S3 storage (SeaweedFS from .ci/services.sh: `bash .ci/services.sh start seaweedfs` and
`eval "$(bash .ci/services.sh env)"` first):

1. lineitem of TPC-H SF N (tpchgen-cli Parquet, cached as for tpch.py) loaded into two
   unpartitioned Iceberg tables, one by Basin (CTAS), one by pyiceberg (append).
2. MERGE: 1 % of the rows updated (l_orderkey % 100 = 7: l_quantity + 1, l_comment) and 0.1 %
   new rows inserted, keyed on (l_orderkey, l_linenumber). Basin: `MERGE INTO … WHEN MATCHED
   THEN UPDATE … WHEN NOT MATCHED THEN INSERT`; pyiceberg: `Table.upsert` with the same
   source rows. Both answers (row count, sum of l_quantity) are checked to agree.
3. DELETE of one month of l_shipdate: Basin `DELETE … WHERE`, pyiceberg `Table.delete`.
4. Basin only: TPC-H Q1 and Q6 on a fresh copy, after 10 MERGE rounds, and after
   `optimize` (copy-on-write: the cost is in the number and size of files, not in delete
   files).

Timings are the median of --runs (each run on a fresh copy for the write statements).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import harness  # noqa: E402
import tpch  # noqa: E402

Q1 = """SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty,
  sum(l_extendedprice) AS sum_base_price,
  sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
  sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
  avg(l_quantity) AS avg_qty, avg(l_extendedprice) AS avg_price, avg(l_discount) AS avg_disc,
  count(*) AS count_order
FROM {t} WHERE l_shipdate <= DATE '1998-12-01' - INTERVAL '90' DAY
GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus"""

Q6 = """SELECT sum(l_extendedprice * l_discount) AS revenue FROM {t}
WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'
  AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24"""


def env():
    keys = ["BASIN_TEST_ICEBERG_REST_URI", "BASIN_TEST_ICEBERG_WAREHOUSE",
            "BASIN_TEST_ICEBERG_CREDENTIAL", "BASIN_TEST_S3_ENDPOINT",
            "BASIN_TEST_S3_ACCESS_KEY", "BASIN_TEST_S3_SECRET_KEY"]
    missing = [k for k in keys if not os.environ.get(k)]
    if missing:
        sys.exit(f"no REST catalog ({', '.join(missing)} unset): run `bash .ci/services.sh start "
                 "seaweedfs` and `eval \"$(bash .ci/services.sh env)\"`")
    return {k: os.environ[k] for k in keys} | {
        "BASIN_TEST_S3_REGION": os.environ.get("BASIN_TEST_S3_REGION", "us-east-1")}


def basin_toml(e) -> str:
    return f"""[storage.s3]
endpoint = "{e['BASIN_TEST_S3_ENDPOINT']}"
region = "{e['BASIN_TEST_S3_REGION']}"
access_key_id = "{e['BASIN_TEST_S3_ACCESS_KEY']}"
secret_access_key = "${{env:BASIN_TEST_S3_SECRET_KEY}}"
path_style = true

[catalogs.rest]
connector = "iceberg"
kind = "rest"
uri = "{e['BASIN_TEST_ICEBERG_REST_URI']}"
warehouse = "{e['BASIN_TEST_ICEBERG_WAREHOUSE']}"
credential = "${{env:BASIN_TEST_ICEBERG_CREDENTIAL}}"
"""


def pyiceberg_catalog(e):
    from pyiceberg.catalog import load_catalog
    return load_catalog("rest", **{
        "type": "rest",
        "uri": e["BASIN_TEST_ICEBERG_REST_URI"],
        "warehouse": e["BASIN_TEST_ICEBERG_WAREHOUSE"],
        "credential": e["BASIN_TEST_ICEBERG_CREDENTIAL"],
        "oauth2-server-uri": e["BASIN_TEST_ICEBERG_REST_URI"].rstrip("/") + "/v1/oauth/tokens",
        "s3.endpoint": e["BASIN_TEST_S3_ENDPOINT"],
        "s3.access-key-id": e["BASIN_TEST_S3_ACCESS_KEY"],
        "s3.secret-access-key": e["BASIN_TEST_S3_SECRET_KEY"],
        "s3.region": e["BASIN_TEST_S3_REGION"],
        "s3.path-style-access": "true",
    })


def merge_source(lineitem, round_no: int):
    """The rows of one MERGE round: 1 % of lineitem updated, 0.1 % new (keys past the
    table's), different rows each round."""
    import pyarrow as pa
    import pyarrow.compute as pc
    keys = lineitem.column("l_orderkey")
    update = lineitem.filter(pc.equal(pc.bit_wise_and(keys, pa.scalar(127, pa.int64())),
                                      pa.scalar(round_no % 128, pa.int64())))
    update = update.set_column(update.schema.get_field_index("l_quantity"), "l_quantity",
                               pc.add(update.column("l_quantity"),
                                      pa.scalar(1, update.column("l_quantity").type)))
    update = update.set_column(update.schema.get_field_index("l_comment"), "l_comment",
                               pa.array([f"merged {round_no}"] * update.num_rows))
    new = lineitem.slice(0, max(1, lineitem.num_rows // 1000))
    new = new.set_column(0, "l_orderkey",
                         pc.add(new.column("l_orderkey"),
                                pa.scalar(10_000_000_000 * (round_no + 1), pa.int64())))
    return pa.concat_tables([update.cast(lineitem.schema), new])


def merge_sql(table: str, source: str, columns: list[str]) -> str:
    keys = ("l_orderkey", "l_linenumber")
    sets = ", ".join(f"{c} = s.{c}" for c in columns if c not in keys)
    cols = ", ".join(columns)
    vals = ", ".join(f"s.{c}" for c in columns)
    return (f"MERGE INTO {table} t USING {source} s "
            "ON t.l_orderkey = s.l_orderkey AND t.l_linenumber = s.l_linenumber "
            f"WHEN MATCHED THEN UPDATE SET {sets} "
            f"WHEN NOT MATCHED THEN INSERT ({cols}) VALUES ({vals})")


def timed(fn, what=None):
    start = time.perf_counter()
    out = fn()
    secs = time.perf_counter() - start
    print(f"{secs:8.2f} s  {what or getattr(fn, '__name__', '')}", flush=True)
    return secs, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--basin", required=True, help="the basin binary (release build)")
    ap.add_argument("--sf", type=float, default=1)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10, help="MERGE rounds before optimize")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("benchmarks/results"))
    ap.add_argument("--skip-upsert", action="store_true",
                    help="do not run pyiceberg's upsert (at SF1 it had not finished after 20 "
                         "minutes)")
    ap.add_argument("--upsert-chunk", type=int, default=5000,
                    help="source rows per pyiceberg upsert call (pyiceberg 0.12 builds one "
                         "expression per row: 60k rows in one call crashed Python with SIGSEGV)")
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    e = env()
    files = tpch.generate(args.sf, pathlib.Path.home() / ".cache/basin/tpch")
    lineitem = pq.read_table(files["lineitem"])
    # As Basin's CTAS declares the table: optional columns, plain strings (pyiceberg takes
    # no string views), no field ids from the file.
    plain = pa.schema([pa.field(f.name, pa.string() if f.type == pa.string_view() else f.type)
                       for f in lineitem.schema])
    lineitem = lineitem.cast(plain)
    columns = lineitem.schema.names
    catalog = pyiceberg_catalog(e)
    ns = f"bench_{uuid.uuid4().hex[:8]}"
    catalog.create_namespace(ns)
    work = pathlib.Path(tempfile.mkdtemp(prefix="basin-bench-dml-"))
    (work / "basin.toml").write_text(basin_toml(e))
    source_dir = work / "sources"
    source_dir.mkdir()
    basin = harness.Basin(args.basin, work / "data", work, executors=2, standalone=False,
                          config=work / "basin.toml")
    results = {"machine": harness.machine(), "sf": args.sf, "rows": lineitem.num_rows,
               "date": time.strftime("%Y-%m-%d"), "runs": args.runs, "timings": {}}
    t = results["timings"]

    def fresh_basin(name):
        basin.query(f"CREATE TABLE rest.{ns}.{name} AS SELECT * FROM read_parquet('{files['lineitem']}')")
        return f"rest.{ns}.{name}"

    def fresh_pyiceberg(name):
        table = catalog.create_table(f"{ns}.{name}", schema=lineitem.schema)
        table.append(lineitem)
        return catalog.load_table(f"{ns}.{name}")

    def check(name, sql, want):
        got = basin.query(sql).to_pylist()
        if got != want:
            raise SystemExit(f"{name}: Basin {got} vs pyiceberg {want}")

    def pyiceberg_upsert(run, source, bt):
        name = f"p_merge_{run}"
        fresh_pyiceberg(name)

        def upsert():
            for at in range(0, source.num_rows, args.upsert_chunk):
                catalog.load_table(f"{ns}.{name}").upsert(
                    source.slice(at, args.upsert_chunk),
                    join_cols=["l_orderkey", "l_linenumber"])
        secs, _ = timed(upsert)
        t.setdefault("merge_pyiceberg", []).append(secs)
        after = catalog.load_table(f"{ns}.{name}").scan().to_arrow()
        want = [{"n": after.num_rows,
                 "q": float(pa.compute.sum(after.column("l_quantity")).as_py())}]
        check("MERGE", f"SELECT count(*) AS n, CAST(sum(l_quantity) AS DOUBLE) AS q FROM {bt}", want)

    try:
        source = merge_source(lineitem, 0)
        src = source_dir / "merge0.parquet"
        pq.write_table(source, src)
        for run in range(args.runs):
            # MERGE / upsert
            bt = fresh_basin(f"b_merge_{run}")
            secs, _ = timed(lambda: basin.query(merge_sql(bt, f"read_parquet('{src}')", columns)),
                            "Basin MERGE")
            t.setdefault("merge_basin", []).append(secs)
            if args.skip_upsert:
                t.setdefault("merge_pyiceberg", []).append(float("nan"))
            else:
                pyiceberg_upsert(run, source, bt)
            # DELETE of one month
            bt = fresh_basin(f"b_delete_{run}")
            secs, _ = timed(lambda: basin.query(
                f"DELETE FROM {bt} WHERE l_shipdate >= DATE '1995-03-01' AND l_shipdate < DATE '1995-04-01'"),
                "Basin DELETE")
            t.setdefault("delete_basin", []).append(secs)
            pt = fresh_pyiceberg(f"p_delete_{run}")
            secs, _ = timed(lambda: pt.delete(And(GreaterThanOrEqual("l_shipdate", "1995-03-01"),
                                                  LessThan("l_shipdate", "1995-04-01"))),
                            "pyiceberg delete")
            t.setdefault("delete_pyiceberg", []).append(secs)
            after = catalog.load_table(f"{ns}.p_delete_{run}").scan().to_arrow()
            check("DELETE", f"SELECT count(*) AS n FROM {bt}", [{"n": after.num_rows}])

        # Read cost: Q1 and Q6 fresh, after MERGE rounds, after optimize.
        rt = fresh_basin("b_reads")

        def reads(stage):
            for q, sql in (("q1", Q1), ("q6", Q6)):
                times = [timed(lambda: basin.query(sql.format(t=rt)), f"{q} {stage}")[0]
                         for _ in range(3)]
                t[f"{q}_{stage}"] = times
            files_now = basin.query(f'SELECT count(*) AS n FROM rest.{ns}."b_reads$files"')
            t[f"files_{stage}"] = files_now.column("n")[0].as_py()

        reads("fresh")
        for r in range(1, args.rounds + 1):
            s = source_dir / f"merge{r}.parquet"
            pq.write_table(merge_source(lineitem, r), s)
            secs, _ = timed(lambda: basin.query(merge_sql(rt, f"read_parquet('{s}')", columns)),
                            f"Basin MERGE round {r}")
            t.setdefault("merge_rounds_basin", []).append(secs)
        reads("after_merges")
        secs, _ = timed(lambda: basin.query(f"ALTER TABLE {rt} EXECUTE optimize"), "Basin optimize")
        t["optimize_basin"] = [secs]
        reads("after_optimize")
    finally:
        basin.stop()
        for ident in catalog.list_tables(ns):
            try:
                catalog.purge_table(ident)
            except Exception:  # noqa: BLE001 - best effort cleanup
                catalog.drop_table(ident)
        catalog.drop_namespace(ns)

    med = {k: statistics.median(v) if isinstance(v, list) else v for k, v in t.items()}
    results["median"] = med
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"iceberg_dml_{harness.sf_name(args.sf)}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2))
    lines = [
        f"# Iceberg MERGE/DELETE, TPC-H SF{args.sf:g} lineitem ({lineitem.num_rows} rows), "
        f"{results['machine']}, {results['date']}",
        "",
        "| statement | Basin (s) | pyiceberg (s) | pyiceberg / Basin |",
        "|---|---:|---:|---:|",
        f"| MERGE 1 % updated + 0.1 % inserted (pyiceberg: upsert in calls of "
        f"{args.upsert_chunk} rows) | {med['merge_basin']:.2f} | "
        f"{med['merge_pyiceberg']:.2f} | {med['merge_pyiceberg'] / med['merge_basin']:.1f}× |"
        if not args.skip_upsert else
        f"| MERGE 1 % updated + 0.1 % inserted | {med['merge_basin']:.2f} | not run "
        "(--skip-upsert) | |",
        f"| DELETE one month of l_shipdate | {med['delete_basin']:.2f} | "
        f"{med['delete_pyiceberg']:.2f} | {med['delete_pyiceberg'] / med['delete_basin']:.1f}× |",
        "",
        "| Basin reads | data files | Q1 (s) | Q6 (s) |",
        "|---|---:|---:|---:|",
    ]
    for stage, label in (("fresh", "fresh copy"),
                         ("after_merges", f"after {args.rounds} MERGE rounds"),
                         ("after_optimize", "after optimize")):
        lines.append(f"| {label} | {med[f'files_{stage}']} | {med[f'q1_{stage}']:.3f} | "
                     f"{med[f'q6_{stage}']:.3f} |")
    lines.append("")
    lines.append(f"MERGE rounds: median {med['merge_rounds_basin']:.2f} s; optimize "
                 f"{med['optimize_basin']:.2f} s.")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
