"""Fixtures: a real multi-process Basin cluster (`basin scheduler` + 2 `basin executor`)
with its Flight SQL endpoint, and a standalone server that requires passwords.

The `basin` binary comes from $BASIN_BIN or $CARGO_TARGET_DIR/debug/basin (build it with
`cargo build -p basin-cli`). Set BASIN_FLIGHT_SQL_URL to test an already running server.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def basin_binary() -> str:
    if os.environ.get("BASIN_BIN"):
        return os.environ["BASIN_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", str(Path.home() / ".cache/basin/target"))
    path = Path(target) / "debug" / "basin"
    if not path.exists():
        pytest.fail(f"{path} not found: build it with `cargo build -p basin-cli` or set BASIN_BIN")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, procs, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for name, p, log in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{Path(log).read_text()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {timeout}s")


def wait_ready(url: str, timeout=60.0):
    """Executors register asynchronously: waits until a distributed query runs at `url`."""
    import adbc_driver_flightsql.dbapi as fs
    deadline = time.time() + timeout
    while True:
        try:
            with fs.connect(url) as conn, conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM tpch.tiny.region")
                cur.fetchall()
            return
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


class Cluster:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs = []

    def spawn(self, name, *args, env=None):
        log = self.workdir / f"{name}.log"
        e = dict(os.environ, BASIN_LOG="info", **(env or {}))
        p = subprocess.Popen(
            [basin_binary(), *args, "--data-dir", str(self.workdir / "data")],
            stdout=open(log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=e,
        )
        self.procs.append((name, p, str(log)))
        return p

    def stop(self):
        for _, p, _ in self.procs:
            p.terminate()
        for _, p, _ in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def rest_catalog_env():
    """The SeaweedFS S3 + Iceberg REST catalog of `.ci/services.sh`, if it runs."""
    keys = ["BASIN_TEST_ICEBERG_REST_URI", "BASIN_TEST_ICEBERG_WAREHOUSE",
            "BASIN_TEST_ICEBERG_CREDENTIAL", "BASIN_TEST_S3_ENDPOINT",
            "BASIN_TEST_S3_ACCESS_KEY", "BASIN_TEST_S3_SECRET_KEY"]
    if not all(os.environ.get(k) for k in keys):
        return None
    return {k: os.environ[k] for k in keys} | {
        "BASIN_TEST_S3_REGION": os.environ.get("BASIN_TEST_S3_REGION", "us-east-1")}


def rest_catalog_toml():
    e = rest_catalog_env()
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


@pytest.fixture(scope="session")
def pyiceberg_catalog():
    """pyiceberg on the same REST catalog Basin's `rest` catalog uses."""
    e = rest_catalog_env()
    if e is None:
        msg = "no Iceberg REST catalog: run `.ci/services.sh start seaweedfs` and eval its env"
        if os.environ.get("CI") in ("true", "1"):
            pytest.fail(msg)
        pytest.skip(msg)
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


@pytest.fixture(scope="session")
def flight_url():
    if os.environ.get("BASIN_FLIGHT_SQL_URL"):
        yield os.environ["BASIN_FLIGHT_SQL_URL"]
        return
    workdir = Path(tempfile.mkdtemp(prefix="basin-adbc-"))
    cluster = Cluster(workdir)
    try:
        sched, flight = free_port(), free_port()
        config = []
        if rest_catalog_env():
            (workdir / "basin.toml").write_text(rest_catalog_toml())
            config = ["--config", str(workdir / "basin.toml")]
        cluster.spawn(
            "scheduler", "scheduler", "--port", str(sched), "--flight-sql-port", str(flight), *config
        )
        wait_port(sched, cluster.procs)
        for i in range(2):
            cluster.spawn(f"executor-{i}", "executor", "--scheduler", f"127.0.0.1:{sched}", "--task-slots", "2")
        wait_port(flight, cluster.procs)
        wait_ready(f"grpc://127.0.0.1:{flight}")
        yield f"grpc://127.0.0.1:{flight}"
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def audited():
    """A standalone server with an audit log: (Flight SQL URL, path of the log)."""
    workdir = Path(tempfile.mkdtemp(prefix="basin-adbc-audit-"))
    cluster = Cluster(workdir)
    log = workdir / "audit.jsonl"
    try:
        (workdir / "basin.toml").write_text(f'[security]\naudit_log = "{log}"\n')
        flight = free_port()
        cluster.spawn(
            "audited", "standalone", "--config", str(workdir / "basin.toml"),
            "--executors", "1", "--flight-sql-port", str(flight),
        )
        wait_port(flight, cluster.procs)
        yield f"grpc://127.0.0.1:{flight}", log
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def secured_url():
    """A standalone server with a users file: alice / wonderland."""
    workdir = Path(tempfile.mkdtemp(prefix="basin-adbc-auth-"))
    cluster = Cluster(workdir)
    try:
        hashed = subprocess.run(
            [basin_binary(), "hash-password"], input="wonderland\n", capture_output=True,
            text=True, check=True,
        ).stdout.strip()
        (workdir / "users").write_text(f"# test users\nalice:{hashed}\n")
        (workdir / "basin.toml").write_text(f'[flight_sql]\nusers_file = "{workdir / "users"}"\n')
        flight = free_port()
        cluster.spawn(
            "secured", "standalone", "--config", str(workdir / "basin.toml"),
            "--executors", "1", "--flight-sql-port", str(flight),
        )
        wait_port(flight, cluster.procs)
        yield f"grpc://127.0.0.1:{flight}"
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
