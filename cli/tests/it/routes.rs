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

/// An in-process cluster on which every query is a Ballista job, and its data directory.
async fn jobs_cluster(name: &str) -> (basin_cli::cluster::StandaloneCluster, crate::Scratch) {
    use basin_cli::cluster::{StandaloneCluster, StandaloneOptions};
    let data_dir = crate::scratch_dir(name);
    let mut config = basin_core::BasinConfig::embedded();
    config.server.data_dir = std::path::PathBuf::from(data_dir.as_os_str());
    config.server.streamed_stages = false;
    let cluster =
        StandaloneCluster::start(std::sync::Arc::new(config), StandaloneOptions::default())
            .await
            .unwrap();
    (cluster, data_dir)
}

/// An executor that answers every launch by refusing the tasks, as one that cannot decode
/// their plan does.
struct RefusingExecutor;

#[tonic::async_trait]
impl ballista_core::serde::protobuf::executor_grpc_server::ExecutorGrpc for RefusingExecutor {
    async fn launch_task(
        &self,
        _: tonic::Request<ballista_core::serde::protobuf::LaunchTaskParams>,
    ) -> Result<tonic::Response<ballista_core::serde::protobuf::LaunchTaskResult>, tonic::Status>
    {
        Err(tonic::Status::invalid_argument("no task today"))
    }
    async fn launch_multi_task(
        &self,
        _: tonic::Request<ballista_core::serde::protobuf::LaunchMultiTaskParams>,
    ) -> Result<tonic::Response<ballista_core::serde::protobuf::LaunchMultiTaskResult>, tonic::Status>
    {
        Err(tonic::Status::invalid_argument(
            "DataFusion error: Internal error: cannot decode \"the plan\"",
        ))
    }
    async fn stop_executor(
        &self,
        _: tonic::Request<ballista_core::serde::protobuf::StopExecutorParams>,
    ) -> Result<tonic::Response<ballista_core::serde::protobuf::StopExecutorResult>, tonic::Status>
    {
        Ok(tonic::Response::new(Default::default()))
    }
    async fn cancel_tasks(
        &self,
        _: tonic::Request<ballista_core::serde::protobuf::CancelTasksParams>,
    ) -> Result<tonic::Response<ballista_core::serde::protobuf::CancelTasksResult>, tonic::Status>
    {
        Ok(tonic::Response::new(Default::default()))
    }
    async fn remove_job_data(
        &self,
        _: tonic::Request<ballista_core::serde::protobuf::RemoveJobDataParams>,
    ) -> Result<tonic::Response<ballista_core::serde::protobuf::RemoveJobDataResult>, tonic::Status>
    {
        Ok(tonic::Response::new(Default::default()))
    }
}

/// Tasks an executor refuses (it answered the launch, so it is not lost) fail their job with
/// the executor's reason, and the executor stays in the cluster. Ballista took such an
/// executor out and launched the tasks on the next one, which refused them too: one query
/// whose plan the executors could not decode left no executor, and no later job finished
/// (DataFusion's group_by.slt with every query a Ballista job).
#[test]
fn tasks_an_executor_refuses_fail_their_job_not_the_cluster() {
    use ballista_core::serde::protobuf::executor_grpc_server::ExecutorGrpcServer;
    use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
    use ballista_core::serde::protobuf::{
        ExecutorOperatingSystemSpecification, ExecutorRegistration, ExecutorResource,
        ExecutorSpecification, RegisterExecutorParams, executor_resource,
    };
    use std::time::Duration;

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        // A scheduler whose only executor is the refusing one (no cluster secret: the test
        // registers it by hand), and a front end on which every query is a Ballista job.
        let data_dir = crate::scratch_dir("refused-tasks");
        let mut config = basin_core::BasinConfig::embedded();
        config.server.data_dir = std::path::PathBuf::from(data_dir.as_os_str());
        config.server.streamed_stages = false;
        let config = std::sync::Arc::new(config);
        let scheduler_options = basin_scheduler::server::SchedulerOptions {
            port: 0,
            ..basin_scheduler::server::SchedulerOptions::from_config(&config)
        };
        let scheduler = basin_scheduler::start(config.clone(), scheduler_options)
            .await
            .unwrap();
        // The refusing executor: its gRPC port, and a Flight port that accepts connections
        // (the scheduler's liveness probe) and nothing else.
        let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc_port = grpc.local_addr().unwrap().port();
        let flight = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let flight_port = flight.local_addr().unwrap().port();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ExecutorGrpcServer::new(RefusingExecutor))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc)),
        );
        let mut client = SchedulerGrpcClient::connect(format!("http://{}", scheduler.addr))
            .await
            .unwrap();
        client
            .register_executor(RegisterExecutorParams {
                metadata: Some(ExecutorRegistration {
                    id: "refusing".into(),
                    host: Some("127.0.0.1".into()),
                    port: u32::from(flight_port),
                    grpc_port: u32::from(grpc_port),
                    specification: Some(ExecutorSpecification {
                        resources: vec![ExecutorResource {
                            resource: Some(executor_resource::Resource::TaskSlots(2)),
                        }],
                    }),
                    os_info: Some(ExecutorOperatingSystemSpecification::default()),
                }),
            })
            .await
            .unwrap();
        let view = scheduler.cluster_view();
        let ctx =
            basin_scheduler::connect(&config, &scheduler.url(), 2, Some(view.clone())).unwrap();
        for _ in 0..2 {
            let run = ctx
                .sql("SELECT n_regionkey, count(*) FROM tpch.tiny.nation GROUP BY n_regionkey")
                .await
                .unwrap()
                .collect();
            let e = tokio::time::timeout(Duration::from_secs(60), run)
                .await
                .expect("the job neither finished nor failed")
                .unwrap_err()
                .to_string();
            assert!(e.contains("refused the tasks of stage"), "{e}");
            assert!(e.contains("cannot decode \"the plan\""), "{e}");
            let executors = view.active_executors().await;
            assert_eq!(executors.len(), 1, "the executor was taken out");
        }
        drop(flight);
        server.abort();
    });
}

/// A Ballista job whose rows nobody reads any more is cancelled: a client that drops the
/// stream (a shell's Ctrl-C, a runner's deadline) used to leave its job running, holding
/// task slots that every later job waited for.
#[test]
fn a_job_nobody_reads_is_cancelled() {
    use futures::StreamExt;
    use std::time::{Duration, Instant};

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (cluster, _data_dir) = jobs_cluster("cancel-job").await;
        let view = cluster.scheduler().cluster_view();
        let ctx = cluster.connect().unwrap();
        // Minutes of work in a debug build: a self-join of 6M generated rows.
        let df = ctx
            .sql(
                "SELECT count(*) FROM tpch.sf1.lineitem a JOIN tpch.sf1.lineitem b \
                 ON a.l_orderkey = b.l_orderkey AND a.l_linenumber <> b.l_linenumber",
            )
            .await
            .unwrap();
        let mut stream = df.execute_stream().await.unwrap();
        // Polled until the scheduler runs the job, then dropped unfinished.
        let started = Instant::now();
        while view.running_jobs().is_empty() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the job never started"
            );
            let _ = tokio::time::timeout(Duration::from_millis(100), stream.next()).await;
        }
        let job = view.running_jobs();
        drop(stream);
        let dropped = Instant::now();
        while !view.running_jobs().is_empty() {
            assert!(
                dropped.elapsed() < Duration::from_secs(15),
                "job {job:?} still running 15 s after its stream was dropped"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The slots are free: the next job answers.
        let rows = ctx
            .sql("SELECT count(*) AS n FROM tpch.tiny.nation GROUP BY n_regionkey ORDER BY 1")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
    });
}

/// Rows of a Ballista job keep the plan's types: Ballista's shuffle and Flight reads hand
/// dictionary-encoded columns over as plain values, and a `CREATE TABLE … AS` of such a
/// column failed with "Mismatch between schema and batches" (DataFusion's dictionary.slt on
/// the jobs route).
#[test]
fn jobs_keep_dictionary_columns() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (cluster, _data_dir) = jobs_cluster("job-dictionaries").await;
        let ctx = cluster.connect().unwrap();
        for sql in [
            "CREATE TABLE src AS SELECT * FROM (VALUES ('foo', 'bar', 1)) \
             UNION ALL SELECT * FROM (VALUES ('foo', 'baz', 1))",
            "CREATE TABLE dict AS SELECT column1, \
             arrow_cast(column2, 'Dictionary(Int32, Utf8)') AS column2, column3 FROM src",
        ] {
            ctx.sql(sql).await.unwrap().collect().await.unwrap();
        }
        let batches = ctx
            .sql("SELECT column2, arrow_typeof(column2) AS t FROM dict ORDER BY column2")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string();
        assert!(text.contains("bar") && text.contains("baz"), "{text}");
        assert!(text.contains("Dictionary(Int32, Utf8)"), "{text}");
    });
}
