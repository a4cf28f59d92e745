"""Streamed exchanges (`[server] streamed_exchanges`) under a slow reader, through the ADBC
Flight SQL driver: a multi-process cluster whose every join runs in stages that stream rows to
each other over Arrow Flight (`single_node_max_bytes = 0`). A client that stops reading must
hold the whole pipeline back (front end, consumer tasks, producer tasks) without a deadlock, a
timeout or memory growing with the rows not yet read, and the query must finish with every row
once the client reads on.
"""

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from conftest import Cluster, free_port, wait_port, wait_ready

# Every line item meets its order: as many rows as tpch.sf1.lineitem (6,001,215), about
# 300 MB as Arrow, generated on the executors while the client reads.
JOIN = ("SELECT l_orderkey, l_linenumber, l_comment FROM tpch.sf1.lineitem "
        "JOIN tpch.sf1.orders ON l_orderkey = o_orderkey")
JOIN_ROWS = 6_001_215
MEMORY_LIMIT_MB = 512


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture(scope="module")
def exchange_cluster():
    workdir = Path(tempfile.mkdtemp(prefix="basin-adbc-exchanges-"))
    cluster = Cluster(workdir)
    try:
        (workdir / "basin.toml").write_text(
            "[server]\nsingle_node_max_bytes = 0\nstreamed_exchanges = true\n"
            f'[executor]\nmemory_limit = "{MEMORY_LIMIT_MB}MiB"\n')
        config = ["--config", str(workdir / "basin.toml")]
        sched, flight = free_port(), free_port()
        cluster.spawn("scheduler", "scheduler", "--port", str(sched),
                      "--flight-sql-port", str(flight), *config)
        wait_port(sched, cluster.procs)
        executors = [
            cluster.spawn(f"executor-{i}", "executor", "--scheduler", f"127.0.0.1:{sched}",
                          "--task-slots", "2", *config)
            for i in range(2)
        ]
        wait_port(flight, cluster.procs)
        url = f"grpc://127.0.0.1:{flight}"
        wait_ready(url)
        yield url, executors, workdir
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_slow_reader_holds_the_exchanges_back_and_gets_every_row(exchange_cluster):
    import adbc_driver_flightsql.dbapi as fs

    url, executors, workdir = exchange_cluster
    with fs.connect(url) as conn, conn.cursor() as cur:
        cur.execute(f"EXPLAIN {JOIN}")
        plan = "\n".join(str(v) for row in cur.fetchall() for v in row)
        assert "ExchangeReadExec" in plan, f"the join does not run through exchanges:\n{plan}"

        before = [cpu_seconds(p.pid) for p in executors]
        cur.execute(JOIN)
        reader = cur.fetch_record_batch()
        rows = reader.read_next_batch().num_rows
        first = [cpu_seconds(p.pid) - b for p, b in zip(executors, before)]
        # The client stops reading. The rows already on their way fill the buffers between
        # the stages; then every stage must wait, not run on into memory.
        time.sleep(10)
        stalled = [cpu_seconds(p.pid) for p in executors]
        time.sleep(10)
        idle = [cpu_seconds(p.pid) - s for p, s in zip(executors, stalled)]
        for p in executors:
            assert p.poll() is None, f"an executor exited while the client waited:\n" + "\n".join(
                (workdir / f"executor-{i}.log").read_text()[-3000:] for i in range(2))
        # The client reads on, slowly at first.
        for batch in reader:
            rows += batch.num_rows
            if rows < JOIN_ROWS // 4:
                time.sleep(0.01)
        drained = [cpu_seconds(p.pid) - s - i for p, s, i in zip(executors, stalled, idle)]
    peaks = [peak_rss_mb(p.pid) for p in executors]
    print(f"\nslow reader: executors' CPU to the first batch {first} s, while the client waited {idle} s, "
          f"while it read the rest {drained} s; peak RSS {peaks} MB")
    assert rows == JOIN_ROWS
    # Waiting stages use no CPU: nothing polls in a loop while the client does not read.
    assert all(s < 1.0 for s in idle), f"executors busy while the client waited: {idle} s"
    # The stages were held back, not run to their end into buffers: most of the probe side's
    # work is done after the client reads on (debug build: 4.4 s of CPU per executor to the
    # first batch, 0.04 s while the client waited, 6.1 s after).
    assert sum(drained) > 2.0, f"no work left after the wait: {drained} s"
    # Each executor stays within its memory limit plus the process's own (a debug build's
    # code, runtime and allocator keep), far below what the rows not yet read would take.
    assert all(mb < MEMORY_LIMIT_MB + 512 for mb in peaks), f"peak RSS {peaks} MB"
