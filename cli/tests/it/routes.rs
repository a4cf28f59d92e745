//! Queries that must run in one process, on every route a cluster can give them.

use crate::liveness::Cluster;
use crate::{basin, stderr, stdout};

/// A recursive query whose recursive term joins a table: nation 0, then each next key up
/// to 24, one row per step.
const RECURSIVE: &str = "WITH RECURSIVE chain AS ( \
     SELECT n_nationkey AS k, 0 AS depth FROM tpch.tiny.nation WHERE n_nationkey = 0 \
     UNION ALL SELECT n.n_nationkey, c.depth + 1 FROM chain c \
     JOIN tpch.tiny.nation n ON n.n_nationkey = c.k + 1 WHERE c.depth < 100) \
     SELECT count(*) AS steps, max(k) AS last, sum(depth) AS depths FROM chain";
const RECURSIVE_ROWS: &str = "steps,last,depths\n25,24,300\n";

/// `WITH RECURSIVE` runs whole on one executor (its work table lives in the process that
/// runs it): as a Ballista job it waited forever. On the route of small queries, of big
/// ones (single-node route off, streamed exchanges on), and with streamed stages off
/// (every other query a job), where it runs in the front end.
#[test]
fn recursive_queries_answer_on_every_route() {
    let out = basin(&["standalone", "--format", "csv", "-e", RECURSIVE], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), RECURSIVE_ROWS);
    // (configuration, whether it runs on an executor rather than in the front end)
    for (config, on_executor) in [
        ("", true),
        (
            "[server]\nsingle_node_max_bytes = 0\nstreamed_exchanges = true\n",
            true,
        ),
        ("[server]\nstreamed_stages = false\n", false),
    ] {
        let cluster = Cluster::start_with(2, config);
        cluster.expect(RECURSIVE, RECURSIVE_ROWS);
        let out = cluster.sql(&format!("EXPLAIN {RECURSIVE}"));
        assert!(out.status.success(), "{config}: {}", stderr(&out));
        let plan = stdout(&out);
        assert!(plan.contains("RecursiveQueryExec"), "{config}: {plan}");
        assert_eq!(
            plan.contains("StreamedStageExec: partitions=1, executors=1"),
            on_executor,
            "{config}: {plan}"
        );
    }
}
