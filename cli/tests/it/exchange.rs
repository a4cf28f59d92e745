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

/// TPC-H Q5: six tables joined; the small sides are collected build sides (broadcast).
const Q5: &str = "SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue \
     FROM tpch.tiny.customer, tpch.tiny.orders, tpch.tiny.lineitem, tpch.tiny.supplier, \
     tpch.tiny.nation, tpch.tiny.region \
     WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey \
     AND c_nationkey = s_nationkey AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey \
     AND r_name = 'ASIA' AND o_orderdate >= CAST('1994-01-01' AS date) \
     AND o_orderdate < CAST('1995-01-01' AS date) GROUP BY n_name ORDER BY revenue DESC";

/// TPC-H Q7: the nation table twice, an OR across both.
const Q7: &str = "SELECT supp_nation, cust_nation, l_year, sum(volume) AS revenue FROM ( \
     SELECT n1.n_name AS supp_nation, n2.n_name AS cust_nation, \
     extract(year FROM l_shipdate) AS l_year, l_extendedprice * (1 - l_discount) AS volume \
     FROM tpch.tiny.supplier, tpch.tiny.lineitem, tpch.tiny.orders, tpch.tiny.customer, \
     tpch.tiny.nation n1, tpch.tiny.nation n2 \
     WHERE s_suppkey = l_suppkey AND o_orderkey = l_orderkey AND c_custkey = o_custkey \
     AND s_nationkey = n1.n_nationkey AND c_nationkey = n2.n_nationkey \
     AND ((n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') \
     OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE')) \
     AND l_shipdate BETWEEN CAST('1995-01-01' AS date) AND CAST('1996-12-31' AS date)) AS shipping \
     GROUP BY supp_nation, cust_nation, l_year ORDER BY supp_nation, cust_nation, l_year";

/// TPC-H Q9: six tables, a LIKE on part.
const Q9: &str = "SELECT nation, o_year, sum(amount) AS sum_profit FROM ( \
     SELECT n_name AS nation, extract(year FROM o_orderdate) AS o_year, \
     l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity AS amount \
     FROM tpch.tiny.part, tpch.tiny.supplier, tpch.tiny.lineitem, tpch.tiny.partsupp, \
     tpch.tiny.orders, tpch.tiny.nation \
     WHERE s_suppkey = l_suppkey AND ps_suppkey = l_suppkey AND ps_partkey = l_partkey \
     AND p_partkey = l_partkey AND o_orderkey = l_orderkey AND s_nationkey = n_nationkey \
     AND p_name LIKE '%green%') AS profit \
     GROUP BY nation, o_year ORDER BY nation, o_year DESC";

/// TPC-H Q10: four tables, a top 20.
const Q10: &str = "SELECT c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) AS revenue, \
     c_acctbal, n_name, c_address, c_phone, c_comment \
     FROM tpch.tiny.customer, tpch.tiny.orders, tpch.tiny.lineitem, tpch.tiny.nation \
     WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey \
     AND o_orderdate >= CAST('1993-10-01' AS date) AND o_orderdate < CAST('1994-01-01' AS date) \
     AND l_returnflag = 'R' AND c_nationkey = n_nationkey \
     GROUP BY c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment \
     ORDER BY revenue DESC, c_custkey LIMIT 20";

/// TPC-H Q18: an IN over a grouped subquery, a top 100.
const Q18: &str = "SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, \
     sum(l_quantity) FROM tpch.tiny.customer, tpch.tiny.orders, tpch.tiny.lineitem \
     WHERE o_orderkey IN (SELECT l_orderkey FROM tpch.tiny.lineitem GROUP BY l_orderkey \
     HAVING sum(l_quantity) > 300) AND c_custkey = o_custkey AND o_orderkey = l_orderkey \
     GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice \
     ORDER BY o_totalprice DESC, o_orderdate, o_orderkey LIMIT 100";

/// A top-N of lineitem's partitions (a merge inside the plan: a gather) as the build side
/// of a join under a grouped aggregate.
const GATHER: &str = "SELECT o_orderpriority, count(*) AS n, sum(l_quantity) AS q FROM ( \
     SELECT l_orderkey, l_quantity FROM tpch.tiny.lineitem \
     ORDER BY l_quantity DESC, l_orderkey, l_linenumber LIMIT 5000) l \
     JOIN tpch.tiny.orders ON l_orderkey = o_orderkey \
     GROUP BY o_orderpriority ORDER BY o_orderpriority";

/// A right semi join whose probe side's partitions are one row each: every partition is
/// sorted and DataFusion merges them in order without a sort, so the gather under the
/// broadcast join must keep each partition's order too.
const ORDERED_PARTITIONS: &str = "SELECT * FROM ( \
     WITH t1 AS (SELECT 11 a, 12 b UNION ALL SELECT 11 a, 13 b UNION ALL SELECT 12 a, 14 b), \
     t2 AS (SELECT 11 a, 12 b UNION ALL SELECT 11 a, 14 b UNION ALL SELECT 12 a, 15 b) \
     SELECT t2.* FROM t1 RIGHT SEMI JOIN t2 ON t1.a = t2.a AND t1.b != t2.b) ORDER BY 1, 2";

/// Dictionary-encoded keys through a hash exchange (grouping encodes them as rows).
const DICTIONARY: &str = "SELECT k, count(*) AS n, min(l_quantity) AS q FROM ( \
     SELECT arrow_cast(l_shipmode, 'Dictionary(Int32, Utf8)') AS k, l_quantity \
     FROM tpch.tiny.lineitem) GROUP BY k ORDER BY k";

/// What `basin standalone` (the whole query in one process) answers.
fn in_process(sql: &str) -> String {
    let out = basin(&["standalone", "--format", "csv", "-e", sql], &[]);
    assert!(out.status.success(), "{sql}\n{}", stderr(&out));
    stdout(&out)
}

const PRODUCER: &str = "starting an exchange producer";

/// Each of `queries` gives the rows `basin standalone` gives, both executors ran producers
/// and neither ran a Ballista task.
fn streams_as_in_process(cluster: &Cluster, queries: &[&str]) {
    for sql in queries {
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
}

#[test]
fn tpch_queries_stream_through_exchanges_and_give_the_in_process_rows() {
    let cluster = Cluster::start_with(2, CONFIG);
    streams_as_in_process(&cluster, &[Q1, Q3, JOIN]);
    let out = cluster.sql(&format!("EXPLAIN {JOIN}"));
    assert!(out.status.success(), "{}", stderr(&out));
    let plan = stdout(&out);
    assert!(
        plan.contains("ExchangeReadExec") && plan.contains("PartitionSubsetExec"),
        "{plan}"
    );
}

#[test]
fn collected_build_sides_are_broadcast_and_merges_gathered() {
    let cluster = Cluster::start_with(2, CONFIG);
    streams_as_in_process(&cluster, &[Q5, Q7, Q9, Q10, Q18, GATHER]);
    assert_eq!(
        cluster.count("scheduler", "streamed exchanges not used"),
        0,
        "{}",
        cluster.log_tail("scheduler")
    );
    for (sql, kind) in [(Q5, "broadcast to 2 readers"), (GATHER, "gather")] {
        let out = cluster.sql(&format!("EXPLAIN {sql}"));
        assert!(out.status.success(), "{}", stderr(&out));
        let plan = stdout(&out);
        assert!(plan.contains(kind), "{kind}: {plan}");
    }
}

#[test]
fn dictionaries_and_the_order_of_gathered_partitions_survive_exchanges() {
    let cluster = Cluster::start_with(2, CONFIG);
    cluster.expect(ORDERED_PARTITIONS, "a,b\n11,12\n11,14\n12,15\n");
    streams_as_in_process(&cluster, &[DICTIONARY]);
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
