#!/usr/bin/env python3
"""Where the CPU of a full extraction goes, per process: PostgreSQL's backends, Basin's
scheduler and executors, and the client (this process: the ADBC driver, or DuckDB itself).

On a machine whose cores are all busy during an extraction, the sum of these decides the
time, so this is the table to read next to `federated.py`'s seconds. Each process's
utime + stime (and its waited-for children's) is read from /proc before and after one
`SELECT * FROM lineitem`; PostgreSQL backends that exit count through the postmaster.

  eval "$(.ci/services.sh start postgres)"
  # load (results to a scratch directory: a load-only run must not replace the committed ones)
  python3 benchmarks/federated.py --sf 1 --engines postgres --skip-extract --queries "" --out /tmp/fed
  python3 benchmarks/extract_cpu.py --engine basin [--basin target/release/basin]
  python3 benchmarks/extract_cpu.py --engine duckdb
"""

import argparse
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))

HZ = os.sysconf("SC_CLK_TCK")


def cpu_by_process() -> dict[str, float]:
    """Core-seconds so far, by role: postgres, basin-<subcommand>, client, other."""
    out: dict[str, float] = {}
    for p in pathlib.Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            role = comm
            if comm == "basin":
                args = (p / "cmdline").read_bytes().split(b"\0")
                role = "basin-" + (args[1].decode() if len(args) > 1 else "?")
            elif int(p.name) == os.getpid():
                role = "client"
            elif comm != "postgres":
                role = "other"
        except (OSError, ValueError):
            continue  # the process ended meanwhile
        # utime, stime, cutime, cstime
        out[role] = out.get(role, 0.0) + sum(int(x) for x in fields[11:15]) / HZ
    return out


def measure(label, fetch, runs):
    fetch()  # warm-up, as federated.py does: caches, pools, page cache
    for i in range(runs):
        before = cpu_by_process()
        started = time.time()
        table = fetch()
        wall = time.time() - started
        after = cpu_by_process()
        used = {k: round(after.get(k, 0) - before.get(k, 0), 2) for k in after}
        used = {k: v for k, v in sorted(used.items()) if v >= 0.05}
        print(f"{label} run {i + 1}: {wall:.2f} s, {table.num_rows:,} rows, core-seconds "
              f"{used}, sum {sum(used.values()):.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["basin", "duckdb"], required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pg-url", default=os.environ.get("BASIN_TEST_PG_URL"))
    ap.add_argument("--basin", default=str(pathlib.Path(os.environ.get(
        "CARGO_TARGET_DIR", pathlib.Path.home() / ".cache/basin/target")) / "release" / "basin"))
    args = ap.parse_args()
    if not args.pg_url:
        sys.exit("no PostgreSQL: pass --pg-url or set BASIN_TEST_PG_URL "
                 "(eval \"$(.ci/services.sh start postgres)\")")
    if args.engine == "duckdb":
        import federated
        duck = federated.duckdb_connect(2)
        duck.execute(f"ATTACH '{args.pg_url}' AS pg (TYPE postgres, READ_ONLY)")
        measure("duckdb", lambda: federated.arrow(
            duck.execute("SELECT * FROM pg.public.lineitem")), args.runs)
        return
    import tpch
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="basin-extract-cpu-"))
    config = workdir / "basin.toml"
    config.write_text(f'[catalogs.pg]\nconnector = "postgres"\nurl = "{args.pg_url}"\n'
                      'tls = "disable"\n')
    basin = tpch.Basin(args.basin, workdir / "data", workdir, 2, False, config=config)
    try:
        measure("basin", lambda: basin.query("SELECT * FROM pg.public.lineitem"), args.runs)
    finally:
        basin.stop()


if __name__ == "__main__":
    main()
