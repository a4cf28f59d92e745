"""What the benchmark harnesses share (tpch.py, tpcds.py): starting and stopping Basin
deployments, the ADBC connection, timing, comparing answers with a reference, peak RSS, a
memory and time watchdog, and the result files (JSON, Markdown table, chart).

Why a watchdog: TPC-DS Q72 once took a Basin executor to 23 GB on a 24 GiB machine. A query
now runs on a thread while the harness polls the RSS of every process of the deployment
(10 times a second); a process over the limit is killed, the query reported as failed with
the figure, and the deployment restarted for the next query. `prlimit --as` is no remedy:
it caps address space, which a Rust process reserves far beyond what it touches, so it fails
allocations of healthy queries instead of stopping the one that runs away.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import multiprocessing
import os
import pathlib
import platform
import re
import signal
import socket
import subprocess
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


class ClusterError(SystemExit):
    """A Basin deployment did not start (the message has the tail of its log). A SystemExit,
    so that a harness that does not catch it ends with the message, no traceback."""


class QueryFailed(Exception):
    """A query that did not answer: `status` is "error", "timeout", "memory" or "crash"."""

    def __init__(self, status: str, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


def sf_name(sf: float) -> str:
    return ("sf" + f"{sf:g}").replace(".", "_")


def machine() -> str:
    return (f"{os.cpu_count()} cores, {platform.machine()}, "
            f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB")


def one_line(e: BaseException | str, limit: int = 600) -> str:
    """An error's text on one line, cut to `limit` characters."""
    text = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
    if isinstance(a, int) and isinstance(b, int):
        return a == b  # keys and counts: a relative tolerance would equate 1002001 and 1002002
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-2)
    return a == b


def same_row(g: tuple, w: tuple) -> bool:
    return len(g) == len(w) and all(same_value(a, b) for a, b in zip(g, w))


def _row_key(r):
    return tuple((x is None, str(x) if not isinstance(x, (int, float)) else round(x, 1)) for x in r)


def unmatched(got: list[tuple], want: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """The rows of each side without a counterpart on the other (a multiset comparison with
    numeric tolerance): both sorted and compared pairwise, then what is left over matched
    one by one (a value that rounds differently sorts differently)."""
    g_sorted, w_sorted = sorted(got, key=_row_key), sorted(want, key=_row_key)
    if len(got) == len(want) and all(same_row(g, w) for g, w in zip(g_sorted, w_sorted)):
        return [], []
    left_w = list(w_sorted)
    left_g = []
    for g in g_sorted:
        for i, w in enumerate(left_w):
            if same_row(g, w):
                del left_w[i]
                break
        else:
            left_g.append(g)
    return left_g, left_w


def same_answer(got: list[tuple], want: list[tuple]) -> str | None:
    """None when `got` holds the rows of `want`, in any order; else what differs."""
    if len(got) != len(want):
        return f"{len(got)} rows, expected {len(want)}"
    extra, missing = unmatched(got, want)
    if extra or missing:
        return f"row {extra[0]} differs from {missing[0]}"
    return None


# ---------------------------------------------------------------- timing and processes


def timed(run, runs: int):
    """One warm-up, then `runs` timed runs: (times, last result). With `runs` 0, one run,
    timed (answers only)."""
    if runs <= 0:
        start = time.perf_counter()
        result = run()
        return [time.perf_counter() - start], result
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
                raise ClusterError(f"{p.args[:2]} exited:\n{pathlib.Path(log).read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise ClusterError(f"nothing listens on {port}")


def _status_mb(pid, field: str) -> float | None:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_mb(pid) -> float | None:
    return _status_mb(pid, "VmHWM:")


def rss_mb(pid) -> float | None:
    return _status_mb(pid, "VmRSS:")


def reset_peak_rss(pid) -> None:
    """Starts a process's VmHWM afresh (Linux: `5` into /proc/PID/clear_refs), so that the
    peak read after a query is that query's own."""
    try:
        pathlib.Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass


def guarded(fn, watched, timeout: float, rss_limit_mb: float | None, poll: float = 0.1):
    """Runs `fn()` on a thread and returns its value, raising what it raised. Meanwhile
    `watched()` (name → pid) is polled: a process above `rss_limit_mb` is killed and
    QueryFailed("memory") raised; after `timeout` seconds QueryFailed("timeout"). The thread
    of a failed call is left behind (a daemon): the caller stops the deployment it waits on."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while True:
        thread.join(poll)
        if not thread.is_alive():
            break
        if rss_limit_mb:
            for name, pid in watched().items():
                rss = rss_mb(pid)
                if rss is not None and rss > rss_limit_mb:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                    raise QueryFailed("memory", f"{name} reached {rss:.0f} MB RSS (limit "
                                                f"{rss_limit_mb:.0f} MB): killed by the harness")
        if time.monotonic() > deadline:
            raise QueryFailed("timeout", f"no answer after {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class Basin:
    """A Basin deployment reached over Flight SQL."""

    def __init__(self, binary, data_dir, workdir, executors, standalone, config=None,
                 pin_executors=False):
        """`config`: an optional basin.toml passed to every process with `--config`.
        `pin_executors`: executor i runs under `taskset -c i` (one core each), for scale-out
        runs; the scheduler is not pinned."""
        self.procs = []
        self.workdir = workdir
        # The benchmarks load their Parquet files over Flight SQL, whose sessions may read
        # only where [security] allowed_locations says (docs/security.md): anywhere here.
        text = pathlib.Path(config).read_text() if config else ""
        if "[security]" not in text:
            text += '\n[security]\nallowed_locations = ["/", "s3://"]\n'
        config = pathlib.Path(workdir) / f"basin-harness-{free_port()}.toml"
        config.write_text(text)
        env = dict(os.environ)
        env.setdefault("BASIN_LOG", "warn")  # BASIN_LOG=debug python3 ... to see more
        flight = free_port()
        def spawn(name, *args, prefix=()):
            log = workdir / f"{name}.log"
            extra = ["--config", str(config)] if config else []
            p = subprocess.Popen([*prefix, binary, *args, "--data-dir", str(data_dir), *extra], env=env,
                                 stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
            self.procs.append((p, str(log)))
            return p
        try:
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
                    pin = ("taskset", "-c", str(i % os.cpu_count())) if pin_executors else ()
                    spawn(f"executor-{i}", "executor", "--scheduler", f"127.0.0.1:{sched}",
                          prefix=pin)
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
        except BaseException:
            self.kill()
            raise

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

    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, (p, _) in zip(self.names, self.procs) if p.poll() is None}

    def exited(self) -> list[str]:
        """The processes that are gone, each with its exit status and the end of its log."""
        out = []
        for n, (p, log) in zip(self.names, self.procs):
            if p.poll() is not None:
                how = f"signal {-p.returncode}" if p.returncode < 0 else f"exit code {p.returncode}"
                try:
                    tail = " | ".join(pathlib.Path(log).read_text().strip().splitlines()[-3:])
                except OSError:
                    tail = ""
                out.append(f"{n} exited ({how}){': ' + tail if tail else ''}")
        return out

    def log_sizes(self) -> list[int]:
        """Where each process's log ends now (for `panics`)."""
        return [pathlib.Path(log).stat().st_size if pathlib.Path(log).exists() else 0
                for _, log in self.procs]

    def panics(self, since: list[int]) -> list[str]:
        """The panics the processes logged after `since` (from `log_sizes`), each as
        "name: message at file:line": a panic in a query's task reaches the client only as
        a cancelled stream."""
        found = []
        for n, (_, log), start in zip(self.names, self.procs, since):
            try:
                with open(log, "rb") as f:
                    f.seek(start)
                    lines = f.read().decode("utf-8", "replace").splitlines()
            except OSError:
                continue
            for i, line in enumerate(lines):
                m = re.search(r"panicked at (\S+?):?$", line.strip())
                if m:
                    crate = re.search(r"/registry/src/[^/]+/(.+)$", m.group(1))
                    where = crate.group(1) if crate else m.group(1).replace(f"{REPO}/", "")
                    message = lines[i + 1].strip() if i + 1 < len(lines) else ""
                    found.append(f"{n}: panic '{message}' at {where}")
        return list(dict.fromkeys(found))

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
                p.wait()

    def kill(self):
        """Stops every process at once, without waiting for a query on the connection."""
        for p, _ in self.procs:
            if p.poll() is None:
                p.kill()
        for p, _ in self.procs:
            p.wait()


def with_server_setting(toml: str, line: str) -> str:
    """`toml` with `line` added to its `[server]` table (the table added when it has none)."""
    lines = toml.splitlines()
    if "[server]" in (l.strip() for l in lines):
        at = [l.strip() for l in lines].index("[server]")
        lines.insert(at + 1, line)
    else:
        lines = ["[server]", line, *lines]
    return "\n".join(lines) + "\n"


def source_codec(files, what="tpchgen") -> str:
    """The compression codec of the generated Parquet files (lower case, as Iceberg names it)."""
    import pyarrow.parquet as pq
    codecs = {pq.ParquetFile(f).metadata.row_group(0).column(0).compression.lower()
              for f in files.values()}
    if len(codecs) != 1:
        raise SystemExit(f"the {what} files use several codecs ({sorted(codecs)}); regenerate them")
    return codecs.pop()


def bytes_planned(basin: Basin, sql: str) -> int | None:
    try:
        plan = basin.query("EXPLAIN " + sql)
    except Exception:
        return None
    text = " ".join(str(v) for v in plan.column(plan.num_columns - 1).to_pylist())
    return sum(int(b) for b in re.findall(r"IcebergScanExec:[^\n]*?bytes=(\d+)", text)) or None


# ---------------------------------------------------------------- an engine in a child process


def _worker_main(conn, factory, factory_args):
    run_sql = factory(*factory_args)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        sql, runs = msg
        try:
            times, table = timed(lambda: run_sql(sql), runs)
            conn.send(("ok", times, rows_of(table), table.num_rows))
        except Exception as e:  # noqa: BLE001 - reported to the parent
            conn.send(("error", one_line(e)))


def datafusion_session(files):
    """DataFusion (PyPI `datafusion`) over the Parquet files, for a Worker."""
    import datafusion
    ctx = datafusion.SessionContext()
    for t, f in files.items():
        ctx.register_parquet(t, str(f))
    return lambda sql: ctx.sql(sql).to_arrow_table()


class Worker:
    """An in-process engine (DataFusion's Python bindings) run in a child process, so that a
    query that hangs or runs away with memory can be stopped without stopping the harness:
    `factory(*factory_args)` (a module-level function) returns `run(sql) -> pyarrow.Table`."""

    def __init__(self, name, factory, factory_args, timeout, rss_limit_mb):
        self.name, self.factory, self.factory_args = name, factory, factory_args
        self.timeout, self.rss_limit_mb = timeout, rss_limit_mb
        self.proc = None

    def _start(self):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, self.factory, self.factory_args),
                                daemon=True)
        self.proc.start()
        child.close()

    def run(self, sql, runs):
        """(times, rows, row count, peak RSS MB of the query) or QueryFailed."""
        if self.proc is None or not self.proc.is_alive():
            self._start()
        reset_peak_rss(self.proc.pid)
        self.conn.send((sql, runs))
        deadline = time.monotonic() + self.timeout * (max(runs, 0) + 1)
        failure = None
        while failure is None:
            try:
                if self.conn.poll(0.1):
                    msg = self.conn.recv()
                    break
            except (EOFError, OSError):
                failure = QueryFailed("crash", f"{self.name} exited (exit code {self.proc.exitcode})")
                break
            if not self.proc.is_alive():
                failure = QueryFailed("crash", f"{self.name} exited (exit code {self.proc.exitcode})")
            rss = rss_mb(self.proc.pid)
            if self.rss_limit_mb and rss is not None and rss > self.rss_limit_mb:
                failure = QueryFailed("memory", f"{self.name} reached {rss:.0f} MB RSS (limit "
                                                f"{self.rss_limit_mb:.0f} MB): killed by the harness")
            elif time.monotonic() > deadline:
                failure = QueryFailed("timeout", f"no answer after {self.timeout:g} s a run")
        if failure is not None:
            self.stop()
            raise failure
        if msg[0] == "error":
            raise QueryFailed("error", msg[1])
        _, times, rows, num_rows = msg
        return times, rows, num_rows, peak_rss_mb(self.proc.pid)

    def stop(self):
        if self.proc is None:
            return
        if self.proc.is_alive():
            try:
                self.conn.send(None)
                self.proc.join(5)
            except OSError:
                pass
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.proc = None


# ---------------------------------------------------------------- report


def report(stem: pathlib.Path, title: str, engines, results, meta, notes=()):
    """Writes `stem`.json, .md and .png: per query each engine's best time and its ratio to
    DuckDB's. A cell holds the time, `✗` after it for a wrong answer, or the failure's kind
    (error, timeout, memory, crash) when there was no answer. `notes`: lines printed under
    the table, before the machine."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1,
                                                    default=str))

    def timing(n, e):
        v = results[n].get(e)
        return v["min"] if v and v.get("min") is not None else None

    runs = (f"best of {meta['runs']} after a warm-up; median in the JSON" if meta["runs"] > 0
            else "one run each, no warm-up: answers checked, times only indicative")
    lines = [f"{title}: seconds ({runs}); ratio = engine / DuckDB. All answers checked against "
             "DuckDB's.", "",
             "| query | " + " | ".join(engines) + " | " + " | ".join(f"{e}/DuckDB" for e in engines if e != "duckdb") + " |",
             "|---|" + "---:|" * (len(engines) * 2 - 1)]
    # Sums over the queries every engine answered, so that the ratios compare like with like.
    summed = [n for n in sorted(results) if all(timing(n, e) is not None for e in engines)]
    totals = {e: sum(timing(n, e) for n in summed) for e in engines}
    for n in sorted(results):
        r = results[n]
        cells = []
        for e in engines:
            v = r.get(e)
            if v is None:
                cells.append("—")
            elif v.get("min") is None:
                cells.append(v.get("status", "error"))
            else:
                cells.append(f"{v['min']:.3f}" + ("" if v["valid"] else " ✗"))
        ratios = [f"{timing(n, e) / timing(n, 'duckdb'):.2f}"
                  if timing(n, e) is not None and timing(n, "duckdb") else "—"
                  for e in engines if e != "duckdb"]
        lines.append(f"| Q{n:02d} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    label = "**sum**" if len(summed) == len(results) else f"**sum ({len(summed)} queries)**"
    lines.append(f"| {label} | " + " | ".join(f"**{totals[e]:.2f}**" for e in engines) + " | " +
                 " | ".join(f"**{totals[e] / totals['duckdb']:.2f}**" if totals.get('duckdb') else "—"
                            for e in engines if e != "duckdb") + " |")
    lines += ["", f"Peak RSS (MB): {json.dumps(meta.get('peak_rss_mb', {}))}", *notes,
              f"Machine: {meta['machine']}"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        qn = sorted(results)
        fig, ax = plt.subplots(figsize=(max(14, 0.3 * len(qn)), 5))
        width = 0.8 / len(engines)
        for i, e in enumerate(engines):
            ax.bar([q + i * width for q in qn], [timing(q, e) or 0 for q in qn], width, label=e)
        ax.set_xticks([q + 0.4 - width / 2 for q in qn], [f"Q{q}" for q in qn],
                      rotation=90 if len(qn) > 30 else 0)
        ax.set_ylabel("seconds (best run)")
        ax.set_title(f"{title}, {meta['machine']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(stem.with_suffix(".png"), dpi=100)
        plt.close(fig)
    except ImportError:
        print("matplotlib missing: no chart (pip install matplotlib)")
    print("\n".join(lines))


def services(*args) -> str:
    """Runs `.ci/services.sh ARGS` (start, env, stop) and returns what it printed."""
    return subprocess.run(["bash", str(REPO / ".ci/services.sh"), *args], capture_output=True, text=True,
                          check=True).stdout


def env_of(exports: str) -> dict[str, str]:
    """The variables of `export K=V` lines (what `.ci/services.sh start` prints)."""
    out = {}
    for line in exports.splitlines():
        if line.startswith("export ") and "=" in line:
            k, v = line[len("export "):].split("=", 1)
            out[k] = v.strip("'\"")
    return out
