#!/usr/bin/env python3
"""Streams a large result through Basin's Flight SQL endpoint and records the scheduler's
peak memory: the scheduler must pass results on, not hold them.

Starts `basin scheduler` + N `basin executor` processes on loopback, fetches
`SELECT * FROM tpch.<schema>.lineitem` with the ADBC driver batch by batch (discarding
each), and prints rows, seconds, rows/s and the peak RSS (VmHWM) of every process as JSON.

  python3 benchmarks/flight_stream.py --schema sf1 [--basin target/release/basin]
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


def peak_rss_mb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schema", default="sf1")
    ap.add_argument("--executors", type=int, default=2)
    ap.add_argument("--basin", default=os.environ.get("BASIN_BIN", str(Path.home() / ".cache/basin/target/debug/basin")))
    args = ap.parse_args()

    import adbc_driver_flightsql.dbapi as fs

    work = Path(tempfile.mkdtemp(prefix="basin-stream-"))
    procs = {}
    try:
        sched, flight = free_port(), free_port()
        log = open(work / "log", "w")
        common = ["--data-dir", str(work / "data")]
        procs["scheduler"] = subprocess.Popen(
            [args.basin, "scheduler", "--port", str(sched), "--flight-sql-port", str(flight), *common],
            stdout=log, stderr=log)
        wait_port(sched)
        for i in range(args.executors):
            procs[f"executor-{i}"] = subprocess.Popen(
                [args.basin, "executor", "--scheduler", f"127.0.0.1:{sched}", *common],
                stdout=log, stderr=log)
        wait_port(flight)
        time.sleep(2)
        with fs.connect(f"grpc://127.0.0.1:{flight}") as conn, conn.cursor() as cur:
            start = time.time()
            cur.execute(f"SELECT * FROM tpch.{args.schema}.lineitem")
            reader = cur.fetch_record_batch()
            rows = 0
            for batch in reader:
                rows += batch.num_rows
            seconds = time.time() - start
        result = {
            "query": f"SELECT * FROM tpch.{args.schema}.lineitem",
            "rows": rows,
            "seconds": round(seconds, 2),
            "rows_per_second": round(rows / seconds),
            "peak_rss_mb": {name: round(peak_rss_mb(p.pid), 1) for name, p in procs.items()},
            "binary": args.basin,
        }
        print(json.dumps(result, indent=2))
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
