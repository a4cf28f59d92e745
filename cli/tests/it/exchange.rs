//! Streamed exchanges (`[server] streamed_exchanges`): `basin scheduler` and two `basin
//! executor` processes on loopback, with every query that needs an exchange forced onto the
//! route (`single_node_max_bytes = 0`). TPC-H queries give the rows `basin standalone` gives
//! (the whole query in one process), the executors run the exchanges' producers, no
//! Ballista task runs, and `EXPLAIN` shows the exchanges.

use crate::liveness::Cluster;
use crate::{basin, stderr, stdout};

const CONFIG: &str = "[server]\nsingle_node_max_bytes = 0\nstreamed_exchanges = true\n";

/// TPC-H Q1: a grouped aggregate (one hash exchange).
const Q1: &str = "SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, \
     sum(l_extendedprice) AS sum_base_price, \
     sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price, \
     sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge, \
     avg(l_quantity) AS avg_qty, avg(l_extendedprice) AS avg_price, \
     avg(l_discount) AS avg_disc, count(*) AS count_order \
     FROM tpch.tiny.lineitem WHERE l_shipdate <= date '1998-12-01' - interval '90' day \
     GROUP BY l_returnflag, l_linestatus ORDER BY l_returnflag, l_linestatus";

/// TPC-H Q3: joins of three tables, a grouped aggregate, a top 10.
const Q3: &str = "SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, \
     o_orderdate, o_shippriority \
     FROM tpch.tiny.customer, tpch.tiny.orders, tpch.tiny.lineitem \
     WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey AND l_orderkey = o_orderkey \
     AND o_orderdate < date '1995-03-15' AND l_shipdate > date '1995-03-15' \
     GROUP BY l_orderkey, o_orderdate, o_shippriority \
     ORDER BY revenue DESC, o_orderdate, l_orderkey LIMIT 10";

/// A join whose sides are both repartitioned by its keys, under a grouped aggregate.
const JOIN: &str = "SELECT c_mktsegment, count(*) AS orders, sum(o_totalprice) AS total \
     FROM tpch.tiny.customer JOIN tpch.tiny.orders ON c_custkey = o_custkey \
     GROUP BY c_mktsegment ORDER BY c_mktsegment";

/// What `basin standalone` (the whole query in one process) answers.
fn in_process(sql: &str) -> String {
    let out = basin(&["standalone", "--format", "csv", "-e", sql], &[]);
    assert!(out.status.success(), "{sql}\n{}", stderr(&out));
    stdout(&out)
}

const PRODUCER: &str = "starting an exchange producer";

#[test]
fn tpch_queries_stream_through_exchanges_and_give_the_in_process_rows() {
    let cluster = Cluster::start_with(2, CONFIG);
    for sql in [Q1, Q3, JOIN] {
        let expected = in_process(sql);
        assert!(expected.lines().count() > 1, "{sql}: {expected}");
        cluster.expect(sql, &expected);
    }
    for executor in ["executor-0", "executor-1"] {
        assert!(
            cluster.count(executor, PRODUCER) > 0,
            "{executor} ran no producer:\n{}",
            cluster.log_tail(executor)
        );
        assert_eq!(
            cluster.count(executor, "task finished"),
            0,
            "{executor} ran a Ballista task"
        );
    }
    let out = cluster.sql(&format!("EXPLAIN {JOIN}"));
    assert!(out.status.success(), "{}", stderr(&out));
    let plan = stdout(&out);
    assert!(
        plan.contains("ExchangeReadExec") && plan.contains("PartitionSubsetExec"),
        "{plan}"
    );
}

#[test]
fn a_killed_producer_fails_the_query_naming_its_executor_and_the_cluster_keeps_serving() {
    use crate::liveness::{finish, start_query};
    use std::time::{Duration, Instant};
    let mut cluster = Cluster::start_with(2, CONFIG);
    let port1 = format!("127.0.0.1:{}", cluster.executor_ports[1]);
    // An aggregate: no row reaches the client before its producers are done.
    let sql = "SELECT l_orderkey % 7 AS k, count(*) AS n FROM tpch.sf1.lineitem \
               GROUP BY l_orderkey % 7 ORDER BY k";
    let (query, _) = start_query(&cluster, sql);
    let start = Instant::now();
    while cluster.count("executor-1", PRODUCER) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "executor-1 started no producer:\n{}",
            cluster.log_tail("scheduler")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    cluster.kill("executor-1");
    let killed = Instant::now();
    let (ok, err) = finish(query, Duration::from_secs(120));
    let took = killed.elapsed();
    assert!(!ok, "the query succeeded without executor-1's producer");
    assert!(
        took < Duration::from_secs(30),
        "failed after {took:?}: {err}"
    );
    assert!(err.contains(&port1), "the error names {port1}: {err}");
    // The next queries run on the survivor.
    cluster.expect(JOIN, &in_process(JOIN));
}
