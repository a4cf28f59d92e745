"""Federated reads through a Flight SQL client (the ADBC driver). Cancellation reaches the
source databases: a client cancels a query, or walks away from its result, and the remote
statement that Basin's executors run on PostgreSQL / MariaDB stops too (a CancelRequest for
a split's own PostgreSQL session, `KILL QUERY`) instead of running on for nobody. A split extraction reads one snapshot while its
result streams to the client.

Needs the throwaway servers of `.ci/services.sh` (BASIN_TEST_PG_URL, BASIN_TEST_MYSQL_URL):
skipped without them locally, a failure when CI=true.
"""

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import Cluster, free_port, wait_port, wait_ready

SLEEP_SECONDS = 120
WIDE_ROWS = 20_000


def source_urls():
    pg, my = os.environ.get("BASIN_TEST_PG_URL"), os.environ.get("BASIN_TEST_MYSQL_URL")
    if not pg or not my:
        msg = ("BASIN_TEST_PG_URL/BASIN_TEST_MYSQL_URL are not set: run "
               "`eval \"$(.ci/services.sh start postgres mariadb)\"` first")
        if os.environ.get("CI") in ("true", "1"):
            pytest.fail(msg)
        pytest.skip(msg)
    return pg, my


def psql(url, sql):
    out = subprocess.run(["psql", url, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def mariadb(url, sql):
    # mysql://user:password@host:port/database
    rest = url.split("://", 1)[1]
    creds, hostpart = rest.rsplit("@", 1)
    user, password = creds.split(":", 1)
    hostport, database = hostpart.split("/", 1)
    host, port = hostport.split(":")
    out = subprocess.run(
        ["mariadb", "-h", host, "-P", port, "-u", user, f"-p{password}", "-N", "-B",
         database, "-e", sql],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(scope="module")
def federation():
    pg, my = source_urls()
    name = f"cancel_{uuid.uuid4().hex[:8]}"
    psql(pg, f"CREATE SCHEMA {name}; CREATE VIEW {name}.slow AS "
             f"SELECT g AS id FROM generate_series(1, 3) g, LATERAL pg_sleep({SLEEP_SECONDS}) s")
    psql(pg, f"CREATE TABLE {name}.wide AS SELECT g AS id, repeat('x', 200) AS pad "
             f"FROM generate_series(1, {WIDE_ROWS}) g")
    mariadb(my, f"CREATE DATABASE {name}")
    mariadb(my, f"CREATE VIEW {name}.slow AS SELECT SLEEP({SLEEP_SECONDS}) AS id")
    workdir = Path(tempfile.mkdtemp(prefix="basin-adbc-federation-"))
    cluster = Cluster(workdir)
    try:
        (workdir / "basin.toml").write_text(
            '[catalogs.pg]\nconnector = "postgres"\nurl = "${env:BASIN_TEST_PG_URL}"\n'
            'tls = "disable"\n\n'
            # Splits of 64 KiB: the `wide` table is read in several, under one snapshot.
            '[catalogs.pgsplit]\nconnector = "postgres"\nurl = "${env:BASIN_TEST_PG_URL}"\n'
            'tls = "disable"\nsplit_size_bytes = 65536\nmax_splits = 6\n\n'
            '[catalogs.my]\nconnector = "mysql"\nurl = "${env:BASIN_TEST_MYSQL_URL}"\n'
            'tls = "disable"\n')
        config = ["--config", str(workdir / "basin.toml")]
        sched, flight = free_port(), free_port()
        cluster.spawn("scheduler", "scheduler", "--port", str(sched),
                      "--flight-sql-port", str(flight), *config)
        wait_port(sched, cluster.procs)
        for i in range(2):
            cluster.spawn(f"executor-{i}", "executor", "--scheduler", f"127.0.0.1:{sched}",
                          "--task-slots", "2", *config)
        wait_port(flight, cluster.procs)
        url = f"grpc://127.0.0.1:{flight}"
        wait_ready(url)
        yield {"url": url, "schema": name, "pg": pg, "my": my, "workdir": workdir}
    finally:
        cluster.stop()
        # A statement a failed test left running would hold the DROPs up.
        psql(pg, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                 f"WHERE query LIKE '%{name}%' AND pid <> pg_backend_pid()")
        for (pid,) in [r.split("\t") for r in mariadb(
                my, "SELECT id FROM information_schema.processlist "
                    f"WHERE info LIKE '%{name}%slow%' AND info NOT LIKE '%processlist%'"
        ).splitlines() if r]:
            mariadb(my, f"KILL {pid}")
        psql(pg, f"DROP SCHEMA IF EXISTS {name} CASCADE")
        mariadb(my, f"DROP DATABASE IF EXISTS {name}")
        shutil.rmtree(workdir, ignore_errors=True)


def running_on(source, f):
    """The sleeping statements Basin runs on the source now."""
    if source == "pg":
        return int(psql(f["pg"], "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                                 "AND application_name LIKE 'basin%' AND query LIKE '%slow%'"))
    return int(mariadb(f["my"], "SELECT count(*) FROM information_schema.processlist "
                                "WHERE command = 'Query' AND info LIKE '%slow%' "
                                "AND info NOT LIKE '%processlist%'"))


def wait_for(predicate, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise AssertionError(f"{what} within {timeout}s")


def start_query(conn, sql):
    """Runs `sql` on a thread; returns (thread, outcome) where outcome gets 'rows' or 'error'."""
    outcome = {}
    cur = conn.cursor()

    def run():
        started = time.time()
        try:
            cur.execute(sql)
            outcome["rows"] = cur.fetchall()
        except Exception as e:  # the cancel surfaces as an error on the running call
            outcome["error"] = str(e)
        outcome["seconds"] = time.time() - started

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, cur, outcome


@pytest.mark.parametrize("source", ["pg", "my"])
def test_cancel_stops_the_remote_query(federation, source):
    import adbc_driver_flightsql.dbapi as fs
    f = federation
    table = f"{source}.{f['schema']}.slow"
    with fs.connect(f["url"]) as conn:
        t, cur, outcome = start_query(conn, f"SELECT * FROM {table}")
        wait_for(lambda: running_on(source, f) > 0, 60, f"the query on {source} did not start")
        cur.adbc_cancel()
        t.join(30)
        assert not t.is_alive(), "the cancelled call did not return"
        assert "error" in outcome, f"the cancelled query returned {outcome}"
        assert outcome["seconds"] < SLEEP_SECONDS / 2
        wait_for(lambda: running_on(source, f) == 0, 30,
                 f"the remote statement on {source} was not cancelled")
        # The connection and the source are still usable.
        with conn.cursor() as again:
            again.execute("SELECT count(*) FROM tpch.tiny.nation")
            assert again.fetchall() == [(25,)]


@pytest.mark.parametrize("source", ["pg", "my"])
def test_abandoned_client_stops_the_remote_query(federation, source):
    """A client that disconnects mid-query (closed connection, killed process) must not leave
    the statement running on the source."""
    f = federation
    table = f"{source}.{f['schema']}.slow"
    script = (
        "import adbc_driver_flightsql.dbapi as fs\n"
        f"conn = fs.connect({f['url']!r})\n"
        "cur = conn.cursor()\n"
        f"cur.execute('SELECT * FROM {table}')\n"
        "cur.fetchall()\n"
    )
    client = subprocess.Popen(["python3", "-c", script], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: running_on(source, f) > 0, 60, f"the query on {source} did not start")
        client.kill()
        client.wait(10)
        wait_for(lambda: running_on(source, f) == 0, 30,
                 f"the remote statement on {source} outlived its client")
    finally:
        if client.poll() is None:
            client.kill()


def test_split_extraction_streams_every_row_of_one_snapshot(federation):
    """The splits of a PostgreSQL scan join a snapshot the scheduler exported; it must stay
    open while the executors' messages are relayed to the client (a regression: the relay
    once let it go before the executors joined it)."""
    import adbc_driver_flightsql.dbapi as fs
    table = f"pgsplit.{federation['schema']}.wide"
    with fs.connect(federation["url"], autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"EXPLAIN SELECT id, pad FROM {table}")
        plan = "\n".join(str(r[-1]) for r in cur.fetchall())
        splits = re.search(r"StreamedStageExec: partitions=(\d+)", plan)
        assert splits and int(splits.group(1)) > 1, plan
        assert "one snapshot" in plan, plan
        cur.execute(f"SELECT id, pad FROM {table}")
        result = cur.fetch_arrow_table()
    ids = sorted(result.column("id").to_pylist())
    assert ids == list(range(1, WIDE_ROWS + 1))
    assert set(result.column("pad").to_pylist()) == {"x" * 200}


@pytest.mark.parametrize("shape", ["streamed", "job", "statement"])
def test_time_limit_cancels_the_query_and_its_remote_statement(federation, shape):
    """`SET basin.query_timeout_seconds`: a query that runs longer fails with an error naming
    the limit, and what it ran stops — the streamed stage on the executors, the Ballista job,
    the statement on the source — whether the limit hits a query's result (streamed or a
    job) or a statement that runs before it answers (COPY … TO)."""
    import adbc_driver_flightsql.dbapi as fs
    f = federation
    table = f"pg.{f['schema']}.slow"
    sql = {
        "streamed": f"SELECT * FROM {table}",
        "job": f"SELECT s.id, n.n_name FROM {table} s JOIN tpch.tiny.nation n "
               "ON s.id = n.n_nationkey",
        "statement": f"COPY (SELECT * FROM {table}) TO '{f['workdir']}/data/files/slow-{shape}.parquet'",
    }[shape]
    with fs.connect(f["url"], autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.execute("SET basin.query_timeout_seconds = 3")
        t, cur, outcome = start_query(conn, sql)
        t.join(60)
        assert not t.is_alive(), "the call did not return after its time limit"
        assert "error" in outcome, f"the query returned {outcome}"
        assert "time limit of 3 s" in outcome["error"], outcome["error"]
        assert "basin.query_timeout_seconds" in outcome["error"], outcome["error"]
        assert outcome["seconds"] < SLEEP_SECONDS / 4, outcome
        wait_for(lambda: running_on("pg", f) == 0, 30,
                 "the remote statement outlived the query's time limit")
        with conn.cursor() as cur:
            cur.execute("SHOW basin.query_timeout_seconds")
            assert [str(v) for v in cur.fetchall()[0]][-1] == "3"
            cur.execute("SET basin.query_timeout_seconds = 0")
            cur.execute("SELECT count(*) FROM tpch.tiny.nation")
            assert cur.fetchall() == [(25,)]


@pytest.mark.parametrize("source", ["pg", "my"])
def test_merge_from_a_remote_table_into_iceberg(federation, source):
    """Upserts from PostgreSQL and MariaDB tables into an Iceberg table of the embedded lake
    in one MERGE each: matched rows updated, new rows inserted, rows gone from the source
    deleted; the result is the source's rows."""
    import adbc_driver_flightsql.dbapi as fs

    schema = federation["schema"]
    remote = f"{schema}.src_{source}"
    if source == "pg":
        psql(federation["pg"], f"CREATE TABLE {remote} (id BIGINT PRIMARY KEY, name TEXT); "
                               f"INSERT INTO {remote} SELECT g, 'v2-' || g FROM generate_series(5, 300) g")
    else:
        mariadb(federation["my"], f"CREATE TABLE {remote} (id BIGINT PRIMARY KEY, name TEXT)")
        mariadb(federation["my"], f"INSERT INTO {remote} SELECT seq, CONCAT('v2-', seq) FROM seq_5_to_300")
    lake = f"lake.{schema}.merged_{source}"
    with fs.connect(federation["url"]) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA IF NOT EXISTS lake.{schema}")
        cur.fetchall()
        cur.execute(f"CREATE TABLE {lake} AS SELECT CAST(id AS BIGINT) AS id, "
                    f"CAST('v1' AS VARCHAR) AS name FROM (VALUES (1), (2), (3), (4), (5), (6), (7)) v(id)")
        cur.fetchall()
        cur.execute(f"MERGE INTO {lake} t USING {source}.{remote} s ON t.id = s.id "
                    "WHEN MATCHED THEN UPDATE SET name = s.name "
                    "WHEN NOT MATCHED THEN INSERT (id, name) VALUES (s.id, s.name) "
                    "WHEN NOT MATCHED BY SOURCE THEN DELETE")
        assert cur.fetchall() == [(300,)]  # 3 updated, 293 inserted, 4 deleted
        cur.execute(f"SELECT count(*), min(id), max(id), count(DISTINCT id), "
                    f"sum(CASE WHEN name = concat('v2-', CAST(id AS VARCHAR)) THEN 1 ELSE 0 END) FROM {lake}")
        assert cur.fetchall() == [(296, 5, 300, 296, 296)]
