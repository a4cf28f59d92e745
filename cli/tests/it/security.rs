//! A closed cluster (docs/security.md): `basin scheduler` and two `basin executor`
//! processes sharing `[cluster] secret`, attacked with raw gRPC and Flight clients that
//! carry hand-made plans. Every internal port refuses them; the same calls made with the
//! cluster's credentials go through, so what stops the attacker is the secret, not a
//! malformed call.

use std::sync::Arc;

use arrow_flight::Ticket;
use arrow_flight::flight_service_client::FlightServiceClient;
use ballista_core::serde::protobuf::execute_query_params::Query;
use ballista_core::serde::protobuf::executor_grpc_client::ExecutorGrpcClient;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::protobuf::{
    ExecuteQueryParams, LaunchMultiTaskParams, MultiTaskDefinition, TaskDefinition,
};
use basin_core::Secret;
use basin_core::cluster::{ClusterKey, SIGNATURE_HEADER};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{CsvReadOptions, SessionContext};
use datafusion_proto::physical_plan::AsExecutionPlan;
use datafusion_proto::protobuf::PhysicalPlanNode;
use prost::Message;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use crate::liveness::Cluster;
use crate::{RunWithin, scratch_dir};

const SECRET: &str = "closed-cluster-test-secret";

const CONFIG: &str = "[server]\nsingle_node_max_bytes = 0\n\
     [cluster]\nsecret = \"closed-cluster-test-secret\"\nrest_api = true\n";

/// A users file in `dir` where each of `users` has the password `pw`, with its groups
/// (`"alice:analysts"`).
fn users_file(dir: &std::path::Path, users: &[&str]) -> std::path::PathBuf {
    let hash = bcrypt::hash("pw", 4).unwrap();
    let lines: String = users
        .iter()
        .map(|u| match u.split_once(':') {
            Some((user, groups)) => format!("{user}:{hash}:{groups}\n"),
            None => format!("{u}:{hash}\n"),
        })
        .collect();
    let path = dir.join("users");
    std::fs::write(&path, lines).unwrap();
    path
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

async fn channel(port: u16, agent: Option<String>) -> Channel {
    let mut endpoint = Endpoint::from_shared(format!("http://127.0.0.1:{port}")).unwrap();
    if let Some(agent) = agent {
        endpoint = endpoint.user_agent(agent).unwrap();
    }
    endpoint.connect().await.expect("connect")
}

/// A plan that reads `path` (a file of the executor's machine), as a streamed-stage
/// ticket would carry it.
async fn plan_reading(path: &std::path::Path) -> Vec<u8> {
    let ctx = SessionContext::new();
    ctx.register_csv("loot", path.to_str().unwrap(), CsvReadOptions::new())
        .await
        .unwrap();
    let plan: Arc<dyn ExecutionPlan> = ctx
        .sql("SELECT * FROM loot")
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    let codec = basin_connectors::codec::physical_codec();
    PhysicalPlanNode::try_from_physical_plan(plan, codec.as_ref())
        .unwrap()
        .encode_to_vec()
}

/// DoGet of `ticket` on the executor's Flight port; the rows' text or the refusal.
async fn do_get(
    port: u16,
    ticket: &[u8],
    agent: Option<String>,
    signature: Option<String>,
) -> Result<usize, tonic::Status> {
    let mut client = FlightServiceClient::new(channel(port, agent).await);
    let mut request = tonic::Request::new(Ticket::new(ticket.to_vec()));
    if let Some(signature) = signature {
        request
            .metadata_mut()
            .insert(SIGNATURE_HEADER, signature.parse().unwrap());
    }
    let mut stream = client.do_get(request).await?.into_inner();
    let mut messages = 0;
    while stream.message().await?.is_some() {
        messages += 1;
    }
    Ok(messages)
}

#[test]
fn internal_ports_refuse_plans_without_the_cluster_secret() {
    let cluster = Cluster::start_with(2, CONFIG);
    // The cluster itself works closed: a streamed stage, exchanges between the executors
    // (single_node_max_bytes = 0) and a Ballista job's tasks are all signed.
    cluster.expect(
        "SELECT count(*) AS n FROM tpch.tiny.lineitem WHERE l_quantity > 10",
        "n\n48177\n",
    );
    cluster.expect(
        "SELECT n_name, count(*) AS suppliers FROM tpch.tiny.supplier \
         JOIN tpch.tiny.nation ON s_nationkey = n_nationkey GROUP BY n_name \
         ORDER BY suppliers DESC, n_name LIMIT 2",
        "n_name,suppliers\nUNITED STATES,8\nCHINA,7\n",
    );

    let key = ClusterKey::new(&Secret::new(SECRET));
    let wrong = ClusterKey::new(&Secret::new("a guess"));
    let loot = scratch_dir("loot");
    let file = loot.join("secret.csv");
    std::fs::write(&file, "a,b\n1,private\n").unwrap();

    runtime().block_on(async {
        // --- an executor's Flight port: a streamed-stage ticket with a hand-made plan.
        let flight = cluster.executor_ports[0];
        let task = TaskDefinition {
            job_id: "crafted".into(),
            partition_id: 0,
            plan: plan_reading(&file).await,
            session_id: "attacker".into(),
            ..Default::default()
        };
        let ticket = basin_connectors::codec::encode_stage_ticket(&task);
        let signed = || Some(key.sign("flight-ticket", &[&ticket]));
        for (what, agent, signature) in [
            ("no credential", None, None),
            ("a guessed user agent", Some(wrong.user_agent()), None),
            (
                "the user agent without a signature",
                Some(key.user_agent()),
                None,
            ),
            (
                "a signature made with another secret",
                Some(key.user_agent()),
                Some(wrong.sign("flight-ticket", &[&ticket])),
            ),
            (
                "a signature of another ticket",
                Some(key.user_agent()),
                Some(key.sign("flight-ticket", &[b"BASIN-STAGE\0other"])),
            ),
            ("a signature without the user agent", None, signed()),
        ] {
            let refused = do_get(flight, &ticket, agent, signature)
                .await
                .expect_err(what);
            assert_eq!(refused.code(), Code::Unauthenticated, "{what}: {refused}");
            assert!(!refused.message().contains(SECRET), "{refused}");
        }
        // Shuffle fetches, actions and listings need the credential too.
        let mut bare = FlightServiceClient::new(channel(flight, None).await);
        let refused = bare
            .do_action(arrow_flight::Action::new("basin.query_memory", ""))
            .await
            .expect_err("an action without a credential");
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused}");
        let refused = bare
            .list_flights(arrow_flight::Criteria::default())
            .await
            .expect_err("a listing without a credential");
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused}");
        // The same ticket, signed with the cluster's secret, runs: the plan was a good one.
        let messages = do_get(flight, &ticket, Some(key.user_agent()), signed())
            .await
            .expect("the signed ticket runs");
        assert!(messages >= 2, "schema and a batch: {messages}");

        // --- the scheduler's gRPC port: a job with a hand-made logical plan.
        let scheduler = cluster.scheduler_port();
        let params = ExecuteQueryParams {
            query: Some(Query::LogicalPlan(b"not even a plan".to_vec())),
            session_id: "attacker".into(),
            ..Default::default()
        };
        for (what, agent) in [
            ("no credential", None),
            ("a guessed user agent", Some(wrong.user_agent())),
        ] {
            let mut client = SchedulerGrpcClient::new(channel(scheduler, agent).await);
            let refused = client.execute_query(params.clone()).await.expect_err(what);
            assert_eq!(refused.code(), Code::Unauthenticated, "{what}: {refused}");
        }
        // With the credential the scheduler reads the request (and finds no plan in it).
        let mut client = SchedulerGrpcClient::new(channel(scheduler, Some(key.user_agent())).await);
        let answer = client.execute_query(params).await;
        assert!(
            answer
                .as_ref()
                .map_or_else(|s| s.code() != Code::Unauthenticated, |_| true),
            "{answer:?}"
        );
    });

    // --- an executor's task port (Ballista's, which checks nothing itself): a task with a
    // hand-made plan that would write a file. The executor decodes it and refuses to run
    // it without the scheduler's signature.
    let log = cluster.log("executor-1");
    let grpc: u16 = log
        .split("grpc=127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("the executor's gRPC port in its log:\n{log}"));
    let target = loot.join("written-by-attacker");
    runtime().block_on(async {
        let ctx = SessionContext::new();
        let copy = format!(
            "COPY (SELECT 1 AS a) TO '{}' STORED AS CSV",
            target.display()
        );
        let plan = ctx
            .sql(&copy)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let codec = basin_connectors::codec::physical_codec();
        let plan = PhysicalPlanNode::try_from_physical_plan(plan, codec.as_ref())
            .unwrap()
            .encode_to_vec();
        let forged = ballista_core::serde::protobuf::KeyValuePair {
            key: basin_connectors::cluster::TASK_TOKEN_KEY.into(),
            value: Some(wrong.sign("ballista-task", &[b"crafted", &1u32.to_le_bytes()])),
        };
        for props in [vec![], vec![forged]] {
            let task = MultiTaskDefinition {
                task_ids: vec![ballista_core::serde::protobuf::TaskId {
                    task_id: 1,
                    partition_id: 0,
                    ..Default::default()
                }],
                job_id: "crafted".into(),
                stage_id: 1,
                plan: plan.clone(),
                session_id: "attacker".into(),
                props,
                ..Default::default()
            };
            let mut client = ExecutorGrpcClient::new(channel(grpc, None).await);
            // Ballista's port answers; the task does not run.
            let _ = client
                .launch_multi_task(LaunchMultiTaskParams {
                    multi_tasks: vec![task],
                    scheduler_id: format!("127.0.0.1:{}", cluster.scheduler_port()),
                })
                .await;
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while cluster.log("executor-1").matches("refused a task").count() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the executor did not refuse both tasks:\n{}",
            cluster.log_tail("executor-1")
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        !target.exists(),
        "a refused task wrote {}",
        target.display()
    );

    // --- the REST API: refused without the token, served with it.
    let port = cluster.scheduler_port();
    let (status, _) = crate::liveness::http_status(port, "/api/executors", None);
    assert_eq!(status, 401);
    // The call proof is not the REST token.
    let call = &key.user_agent()[basin_core::cluster::USER_AGENT_PREFIX.len()..];
    let (status, _) = crate::liveness::http_status(port, "/api/executors", Some(call));
    assert_eq!(status, 401);
    let token = key.rest_token();
    let (status, body) = crate::liveness::http_status(port, "/api/executors", Some(&token));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.matches("\"id\"").count(), 2, "{body}");

    // The executors said why, without the secret.
    let logs = cluster.log("executor-0");
    assert!(logs.contains("refused a Flight call"), "{logs}");
    assert!(!logs.contains(SECRET));
    assert!(!cluster.log("scheduler").contains(SECRET));
}

#[test]
fn a_cluster_on_the_network_needs_a_secret() {
    let out = crate::basin(
        &[
            "scheduler",
            "--bind-host",
            "0.0.0.0",
            "--port",
            "0",
            "--flight-sql-port",
            "0",
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = crate::stderr(&out);
    assert!(err.contains("[cluster] secret"), "{err}");
    assert!(err.contains("BASIN_CLUSTER_SECRET"), "{err}");
}

/// A Flight SQL user tries every way out of the file sandbox; each is refused before
/// anything is read or written, and the same statements inside it work.
#[test]
fn sql_users_reach_only_the_sandbox() {
    let root = scratch_dir("sandbox");
    let allowed = root.join("allowed");
    let outside = root.join("outside");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.csv"), "a,b\n1,private\n").unwrap();
    std::fs::write(allowed.join("ok.csv"), "a,b\n1,fine\n").unwrap();
    std::os::unix::fs::symlink(&outside, allowed.join("link")).unwrap();
    let config = format!(
        "[server]\n[security]\nallowed_locations = [\"{}\"]\n",
        allowed.display()
    );
    let cluster = Cluster::start_with(1, &config);
    let data = cluster.data_dir();
    let (a, o, d) = (allowed.display(), outside.display(), data.display());

    // Inside: read, write, register, read back.
    cluster.expect(
        &format!("SELECT b FROM read_csv('{a}/ok.csv')"),
        "b\nfine\n",
    );
    cluster.expect(
        &format!("COPY (SELECT 7 AS n) TO '{a}/out.csv' STORED AS CSV"),
        "count\n1\n",
    );
    cluster.expect(
        &format!(
            "CREATE EXTERNAL TABLE mine STORED AS CSV LOCATION '{a}/out.csv' \
             OPTIONS ('format.has_header' 'true'); SELECT n FROM mine"
        ),
        "n\n7\n",
    );
    cluster.expect(
        &format!("COPY (SELECT 8 AS n) TO '{d}/files/mine.csv' STORED AS CSV"),
        "count\n1\n",
    );

    for (statement, why) in [
        (
            "SELECT * FROM read_csv('/etc/passwd')".to_string(),
            "outside",
        ),
        (
            format!("SELECT * FROM read_csv('{o}/secret.csv')"),
            "outside",
        ),
        (
            format!("SELECT * FROM read_csv('file://{o}/secret.csv')"),
            "outside",
        ),
        (
            format!("SELECT * FROM read_csv('{a}/../outside/secret.csv')"),
            "`..`",
        ),
        (
            format!("SELECT * FROM read_csv('{a}/%2e%2e/outside/secret.csv')"),
            "`..`",
        ),
        (
            format!("SELECT * FROM read_csv('file://{o}/secret.csv#/../..{a}/ok.csv')"),
            "`#`",
        ),
        (
            format!("SELECT * FROM read_csv('file://{a}/..\\..\\outside\\secret.csv')"),
            "`#`",
        ),
        (
            format!("SELECT * FROM read_csv('file:{o}/secret.csv')"),
            "outside",
        ),
        (
            format!("SELECT * FROM read_csv('{a}/nope/../link/secret.csv')"),
            "`..`",
        ),
        (
            format!("SELECT * FROM read_csv('{a}/link/secret.csv')"),
            "outside",
        ),
        (
            format!("SELECT * FROM read_parquet('{a}*/x.parquet')"),
            "outside",
        ),
        (
            "SELECT * FROM read_parquet('s3://other-bucket/x/')".to_string(),
            "outside",
        ),
        (
            format!("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '{o}/'"),
            "outside",
        ),
        (
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://other-bucket/t/'".to_string(),
            "outside",
        ),
        (
            "COPY (SELECT 1) TO '/root/x.csv' STORED AS CSV".to_string(),
            "outside",
        ),
        (
            format!("COPY (SELECT 1) TO '{o}/x.csv' STORED AS CSV"),
            "outside",
        ),
        (
            format!("COPY (SELECT 1) TO '{a}/link/x.csv' STORED AS CSV"),
            "outside",
        ),
        (
            format!("EXPLAIN ANALYZE COPY (SELECT 1) TO '{o}/y.csv' STORED AS CSV"),
            "outside",
        ),
        (
            format!("COPY (SELECT 1) TO '{d}/lake/x.csv' STORED AS CSV"),
            "Basin's data directory",
        ),
        (
            format!("COPY (SELECT 1) TO '{d}/files/../x.csv' STORED AS CSV"),
            "`..`",
        ),
        (
            format!(
                "CREATE SCHEMA IF NOT EXISTS lake.s; CREATE TABLE lake.s.t2 (a INT) \
                 WITH (\"write.data.path\" = '{o}/data')"
            ),
            "outside",
        ),
        (
            "SET datafusion.runtime.temp_directory = '/tmp/elsewhere'".to_string(),
            "runtime settings",
        ),
        (
            format!(
                "CREATE SCHEMA IF NOT EXISTS lake.s; \
                 CREATE TABLE lake.s.t (a INT) WITH (location = '{o}/t')"
            ),
            "outside",
        ),
    ] {
        let out = cluster.sql(&statement);
        let err = crate::stderr(&out);
        assert!(
            !out.status.success(),
            "{statement}: {}",
            crate::stdout(&out)
        );
        assert!(err.contains(why), "{statement}: {err}");
        assert!(
            err.contains("allowed_locations")
                || err.contains("runtime settings")
                || err.contains("`files/`"),
            "{statement}: {err}"
        );
        assert!(
            !err.contains("private"),
            "{statement} leaked the file: {err}"
        );
    }
    assert!(!outside.join("x.csv").exists());
    assert!(!outside.join("y.csv").exists());
    assert!(!data.join("lake/x.csv").exists());
    assert!(!data.join("x.csv").exists());
}

/// Access rules for Flight SQL users: tables and columns a user may not use are not there
/// (queries, SHOW, information_schema), a row filter and masks apply however the table is
/// read, changes need their privilege, and a changed rules file holds at once.
#[test]
fn access_rules_hide_filter_and_mask() {
    let dir = scratch_dir("access");
    let users = users_file(&dir, &["admin", "alice:analysts", "bob"]);
    let rules = dir.join("rules.toml");
    let alice_rule = r#"
[[tables]]
group = "analysts"
catalog = "lake"
schema = "hr"
table = "people"
privileges = ["SELECT"]
filter = "region = 'EU'"
columns = [{ name = "ssn", allow = false }, { name = "email", mask = "'***' || substr(email, strpos(email, '@'))" }]
"#;
    let rules_text = |extra: &str| {
        format!(
            "[[tables]]\nuser = \"admin\"\nprivileges = [\"SELECT\", \"INSERT\", \"DELETE\", \
             \"UPDATE\", \"OWNERSHIP\"]\n{extra}{alice_rule}\n[[tables]]\nuser = \"bob\"\n\
             catalog = \"tpch\"\nprivileges = [\"SELECT\"]\n\
             [[tables]]\nuser = \"alice\"\ncatalog = \"lake\"\nschema = \"hr\"\n\
             table = \"inbox|copy\"\nprivileges = [\"INSERT\", \"OWNERSHIP\"]\n"
        )
    };
    std::fs::write(&rules, rules_text("")).unwrap();
    let audit = dir.join("audit").join("audit.jsonl");
    let config = format!(
        "[server]\n[flight_sql]\nusers_file = \"{}\"\n[security]\nrules_file = \"{}\"\n\
         audit_log = \"{}\"\n",
        users.display(),
        rules.display(),
        audit.display()
    );
    let cluster = Cluster::start_with(1, &config);
    let run = |user: &str, sql: &str| {
        let out = cluster.sql_as(user, "pw", sql);
        (
            out.status.success(),
            crate::stdout(&out),
            crate::stderr(&out),
        )
    };
    let ok = |user: &str, sql: &str, want: &str| {
        let (success, out, err) = run(user, sql);
        assert!(success, "{user}: {sql}: {err}");
        assert_eq!(out, want, "{user}: {sql}");
    };
    let refused = |user: &str, sql: &str, why: &str| {
        let (success, out, err) = run(user, sql);
        assert!(!success, "{user}: {sql} answered {out}");
        assert!(err.contains(why), "{user}: {sql}: {err}");
        for secret in ["123-45", "US", "ann@"] {
            assert!(
                !err.contains(secret),
                "{user}: {sql} leaked {secret}: {err}"
            );
        }
    };

    ok(
        "admin",
        "CREATE SCHEMA lake.hr; \
         CREATE TABLE lake.hr.people (id INT, region VARCHAR, ssn VARCHAR, email VARCHAR); \
         INSERT INTO lake.hr.people VALUES (1, 'EU', '123-45-0001', 'ann@eu.example'), \
           (2, 'US', '123-45-0002', 'ann@us.example'), (3, 'EU', '123-45-0003', 'cy@eu.example'); \
         CREATE TABLE lake.hr.salaries (id INT, amount INT); \
         INSERT INTO lake.hr.salaries VALUES (1, 100); \
         CREATE TABLE lake.hr.inbox (msg VARCHAR)",
        "count\n0\ncount\n3\ncount\n0\ncount\n1\ncount\n0\n",
    );
    // alice: EU rows, no ssn, masked emails — through every shape of query.
    let people = "id,region,email\n1,EU,***@eu.example\n3,EU,***@eu.example\n";
    ok("alice", "SELECT * FROM lake.hr.people ORDER BY id", people);
    ok(
        "alice",
        "SELECT * FROM (SELECT * FROM lake.hr.people) t ORDER BY id",
        people,
    );
    ok(
        "alice",
        "SELECT region, count(*) AS n, min(email) AS e FROM lake.hr.people GROUP BY region",
        "region,n,e\nEU,2,***@eu.example\n",
    );
    ok(
        "alice",
        "SELECT a.email FROM lake.hr.people a JOIN lake.hr.people b ON a.id = b.id \
         WHERE a.email LIKE 'ann%' OR a.email LIKE '***%' ORDER BY a.id LIMIT 1",
        "email\n***@eu.example\n",
    );
    ok(
        "alice",
        "SELECT table_catalog, table_schema, table_name FROM information_schema.tables \
         WHERE table_schema <> 'information_schema' ORDER BY 1, 2, 3",
        "table_catalog,table_schema,table_name\nlake,hr,inbox\nlake,hr,people\n",
    );
    ok(
        "alice",
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'people' \
         ORDER BY ordinal_position",
        "column_name\nid\nregion\nemail\n",
    );
    ok(
        "alice",
        "SHOW GRANTS",
        "user,table_catalog,table_schema,table_name,privileges,row_filter,hidden_columns,\
         masked_columns\nalice,lake,hr,inbox,\"INSERT, OWNERSHIP\",,,\n\
         alice,lake,hr,people,SELECT,region = 'EU',ssn,email\n",
    );
    refused("alice", "SELECT ssn FROM lake.hr.people", "ssn");
    // Write-only: alice may put rows in, not read them out — not even by copying them.
    ok(
        "alice",
        "INSERT INTO lake.hr.inbox VALUES ('hello')",
        "count\n1\n",
    );
    refused("alice", "SELECT * FROM lake.hr.inbox", "may not SELECT");
    refused(
        "alice",
        "CREATE TABLE lake.hr.copy AS SELECT * FROM lake.hr.inbox",
        "may not SELECT",
    );
    refused(
        "alice",
        "SHOW CREATE TABLE lake.hr.people",
        "definition is not shown",
    );
    refused("alice", "SELECT * FROM lake.hr.salaries", "salaries");
    refused("alice", "SELECT * FROM tpch.tiny.nation", "tpch");
    refused(
        "alice",
        "INSERT INTO lake.hr.people VALUES (4, 'EU', 'x', 'y')",
        "people",
    );
    refused("alice", "DELETE FROM lake.hr.people", "people");
    refused("alice", "DROP TABLE lake.hr.people", "people");
    refused(
        "alice",
        "CREATE TABLE lake.hr.mine (a INT)",
        "access denied",
    );
    // bob: the tpch catalog only.
    ok(
        "bob",
        "SELECT count(*) AS n FROM tpch.tiny.region",
        "n\n5\n",
    );
    refused("bob", "SELECT * FROM lake.hr.people", "lake");

    // The rules file changes: alice may read salaries, at once.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let salaries = "[[tables]]\nuser = \"alice\"\ncatalog = \"lake\"\nschema = \"hr\"\n\
                    table = \"salaries\"\nprivileges = [\"SELECT\"]\n";
    std::fs::write(&rules, rules_text(salaries)).unwrap();
    ok(
        "alice",
        "SELECT amount FROM lake.hr.salaries",
        "amount\n100\n",
    );
    // The admin still sees everything.
    ok(
        "admin",
        "SELECT ssn FROM lake.hr.people WHERE id = 2",
        "ssn\n123-45-0002\n",
    );

    // The audit log: a line per statement, with who, what, how many rows and how it ended.
    let lines = std::fs::read_to_string(&audit).expect("the audit log");
    let line = |user: &str, statement: &str| {
        lines
            .lines()
            .find(|l| {
                l.contains(&format!("\"user\":\"{user}\""))
                    && l.contains(&format!("\"statement\":\"{statement}"))
            })
            .unwrap_or_else(|| panic!("no line of {user} for {statement}:\n{lines}"))
            .to_string()
    };
    let select = line("alice", "SELECT * FROM lake.hr.people ORDER BY id");
    for part in [
        "\"read\":[\"lake.hr.people\"]",
        "\"rows\":2",
        "\"outcome\":\"ok\"",
        "\"client\":\"127.0.0.1:",
        "\"duration_ms\":",
        "\"time\":\"20",
    ] {
        assert!(select.contains(part), "{part} in {select}");
    }
    let insert = line("admin", "INSERT INTO lake.hr.people VALUES");
    assert!(
        insert.contains("\"written\":[\"lake.hr.people\"]") && insert.contains("\"rows\":3"),
        "{insert}"
    );
    let denied = line("alice", "DROP TABLE lake.hr.people");
    assert!(
        denied.contains("\"outcome\":\"error\"") && denied.contains("access denied"),
        "{denied}"
    );
    let hidden = line("alice", "SELECT * FROM lake.hr.salaries");
    assert!(hidden.contains("\"outcome\":\"error\""), "{hidden}");
}

/// A row filter and a column mask on PostgreSQL and MariaDB tables travel in the SQL the
/// source receives (its statement log): the filtered-out rows and the clear values of a
/// masked column never leave the source. (A mask the source cannot compute exactly as
/// Basin would — one with functions — is computed by Basin: docs/security.md.)
#[test]
fn filters_and_masks_are_pushed_into_the_sources() {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(pg_url), Some(pg_log), Some(my_url), Some(my_log)) = (
        var("BASIN_TEST_PG_URL"),
        var("BASIN_TEST_PG_LOG"),
        var("BASIN_TEST_MYSQL_URL"),
        var("BASIN_TEST_MYSQL_LOG"),
    ) else {
        let msg = "filters_and_masks_are_pushed_into_the_sources: skipped: BASIN_TEST_PG_URL/\
                   BASIN_TEST_MYSQL_URL are not set; run `eval \"$(.ci/services.sh start \
                   postgres mariadb)\"` first";
        assert!(!crate::in_ci(), "{msg}");
        eprintln!("{msg}");
        return;
    };
    let name = format!("acl_{}", std::process::id());
    let rows = "(1, 'EU', '123-45-0001', 'ann@eu.example'), \
                (2, 'US', '123-45-0002', 'bo@us.example'), \
                (3, 'EU', '123-45-0003', 'cy@eu.example')";
    crate::federation::psql(
        &pg_url,
        &format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}; \
             CREATE TABLE {name}.people (id int, region text, ssn text, email text); \
             INSERT INTO {name}.people VALUES {rows};"
        ),
    );
    crate::federation::mariadb(
        &my_url,
        &format!(
            "DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}; \
             CREATE TABLE {name}.people (id int, region varchar(8), ssn varchar(16), \
             email varchar(64)); INSERT INTO {name}.people VALUES {rows};"
        ),
    );
    let dir = scratch_dir("access-pushdown");
    let users = users_file(&dir, &["alice:analysts"]);
    std::fs::write(
        dir.join("rules.json"),
        format!(
            r#"{{"tables": [{{"group": "analysts", "catalog": "pg|my", "schema": "{name}",
                "table": "people", "privileges": ["SELECT"], "filter": "region = 'EU'",
                "columns": [{{"name": "ssn",
                              "mask": "CASE WHEN ssn IS NULL THEN NULL ELSE 'xxx' END"}},
                            {{"name": "email", "allow": false}}]}}]}}"#
        ),
    )
    .unwrap();
    let config = format!(
        "[server]\n[flight_sql]\nusers_file = \"{}\"\n[security]\nrules_file = \"{}\"\n\
         [catalogs.pg]\nconnector = \"postgres\"\nurl = \"{pg_url}\"\ntls = \"disable\"\n\
         [catalogs.my]\nconnector = \"mysql\"\nurl = \"{my_url}\"\ntls = \"disable\"\n",
        users.display(),
        dir.join("rules.json").display()
    );
    let cluster = Cluster::start_with(1, &config);
    for (catalog, log) in [("pg", &pg_log), ("my", &my_log)] {
        let before = std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
        let out = cluster.sql_as(
            "alice",
            "pw",
            &format!("SELECT * FROM {catalog}.{name}.people ORDER BY id"),
        );
        assert!(out.status.success(), "{catalog}: {}", crate::stderr(&out));
        assert_eq!(
            crate::stdout(&out),
            "id,region,ssn\n1,EU,xxx\n3,EU,xxx\n",
            "{catalog}"
        );
        let sent = crate::federation::log_since(std::path::Path::new(log), before);
        let query = sent
            .lines()
            .filter(|l| l.contains("people") && l.contains("SELECT"))
            .collect::<Vec<_>>()
            .join("\n");
        // MariaDB's strings travel as hex: 'EU' is X'4555'.
        assert!(
            query.contains("'EU'") || query.contains("X'4555'"),
            "{catalog}: the filter was not sent:\n{sent}"
        );
        let explain = cluster.sql_as(
            "alice",
            "pw",
            &format!("EXPLAIN SELECT * FROM {catalog}.{name}.people ORDER BY id"),
        );
        assert!(
            query.contains("CASE") && (query.contains("'xxx'") || query.contains("X'787878'")),
            "{catalog}: the mask was not sent:\n{sent}\n{}",
            crate::stdout(&explain)
        );
        assert!(
            !query.contains("email"),
            "{catalog}: a denied column was read:\n{query}"
        );
    }
}

/// A statement's handle belongs to the session that made it: another user can neither
/// fetch its rows nor cancel it.
#[test]
fn another_users_statement_is_not_theirs() {
    use arrow_flight::sql::client::FlightSqlServiceClient;
    use futures::TryStreamExt;
    let dir = scratch_dir("handles");
    let users = users_file(&dir, &["alice", "bob"]);
    let config = format!(
        "[server]\n[flight_sql]\nusers_file = \"{}\"\n",
        users.display()
    );
    let cluster = Cluster::start_with(1, &config);
    let port = cluster.flight_sql_port();
    runtime().block_on(async {
        let login = |user: &'static str| async move {
            let mut client = FlightSqlServiceClient::new(channel(port, None).await);
            client.handshake(user, "pw").await.expect("login");
            client
        };
        let mut alice = login("alice").await;
        let mut bob = login("bob").await;
        let info = alice
            .execute("SELECT count(*) AS n FROM tpch.tiny.nation".into(), None)
            .await
            .expect("alice's statement");
        let ticket = info.endpoint[0].ticket.clone().expect("a ticket");

        // bob fetches alice's rows: refused.
        let stolen = match bob.do_get(ticket.clone()).await {
            Ok(stream) => stream.try_collect::<Vec<_>>().await.map(|b| b.len()),
            Err(e) => Err(e),
        };
        assert!(stolen.is_err(), "bob read alice's statement: {stolen:?}");
        // bob cancels it: nothing happens.
        let request = arrow_flight::CancelFlightInfoRequest {
            info: Some(info.clone()),
        };
        let mut raw = FlightServiceClient::new(channel(port, None).await);
        let mut action = tonic::Request::new(arrow_flight::Action::new(
            "CancelFlightInfo",
            request.encode_to_vec(),
        ));
        let token = bob.token().cloned().expect("bob's token");
        action
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let mut results = raw
            .do_action(action)
            .await
            .expect("cancel answered")
            .into_inner();
        let result = results.message().await.unwrap().expect("a result");
        let status = arrow_flight::CancelFlightInfoResult::decode(result.body).unwrap();
        assert_eq!(
            status.status,
            arrow_flight::CancelStatus::NotCancellable as i32,
            "bob cancelled alice's statement"
        );
        // alice still reads her rows.
        let batches: Vec<_> = alice
            .do_get(ticket)
            .await
            .expect("alice's rows")
            .try_collect()
            .await
            .expect("alice's rows");
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(rows, 1);
    });
}

/// Password logins: repeated failures lock the client's address out for a while, and a
/// password never crosses the network in the clear — over plain TCP only loopback clients
/// may send one.
#[test]
fn logins_are_rate_limited_and_need_tls_from_other_machines() {
    let dir = scratch_dir("logins");
    let users = users_file(&dir, &["alice"]);
    // Every address of the machine, so that a client may come from a non-loopback one.
    let config = format!(
        "[server]\nbind_host = \"0.0.0.0\"\n[flight_sql]\nusers_file = \"{}\"\n",
        users.display()
    );
    let cluster = Cluster::start_with(1, &config);
    let count = "SELECT count(*) AS n FROM tpch.tiny.region";
    let out = cluster.sql_as("alice", "pw", count);
    assert!(out.status.success(), "{}", crate::stderr(&out));

    // From another address of this machine (when it has one): refused before any check.
    let other = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find(|a| {
                    a.parse::<std::net::Ipv4Addr>()
                        .is_ok_and(|ip| !ip.is_loopback())
                })
                .map(str::to_string)
        });
    match other {
        Some(ip) => {
            let url = cluster.url().replace("127.0.0.1", &ip);
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_basin"))
                .args(["sql", &url, "-u", "alice", "-e", count])
                .env("BASIN_PASSWORD", "pw")
                .run_within();
            let err = crate::stderr(&out);
            assert!(
                !out.status.success(),
                "a password over plain TCP from {ip} was taken"
            );
            assert!(
                err.contains("plain TCP") && err.contains("tls_cert"),
                "{err}"
            );
        }
        None => eprintln!("no non-loopback address on this machine: plain-TCP refusal not tried"),
    }

    // Five wrong passwords from loopback: locked out, even with the right one.
    for _ in 0..5 {
        let out = cluster.sql_as("alice", "wrong", count);
        assert!(crate::stderr(&out).contains("wrong user name or password"));
    }
    let out = cluster.sql_as("alice", "pw", count);
    let err = crate::stderr(&out);
    assert!(
        !out.status.success() && err.contains("too many failed logins"),
        "{err}"
    );
}

/// JWT bearer tokens of an identity provider: a token signed with the provider's key (from
/// its JWKS) names the user and groups the access rules see; expired, foreign, tampered,
/// unsigned tokens and tokens for another audience are refused, saying why.
#[test]
fn jwt_bearer_tokens_from_an_identity_provider() {
    use arrow_flight::sql::client::FlightSqlServiceClient;
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use futures::TryStreamExt;
    let dir = scratch_dir("jwt");
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&*dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            crate::stderr(&out)
        );
        out.stdout
    };
    for key in ["idp.pem", "other.pem"] {
        openssl(&["genrsa", "-out", key, "2048"]);
    }
    let modulus =
        String::from_utf8(openssl(&["rsa", "-in", "idp.pem", "-noout", "-modulus"])).unwrap();
    let hex = modulus.trim().trim_start_matches("Modulus=");
    let n: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    std::fs::write(
        dir.join("jwks.json"),
        format!(
            r#"{{"keys": [{{"kty": "RSA", "kid": "k1", "alg": "RS256", "n": "{}", "e": "AQAB"}}]}}"#,
            B64.encode(&n)
        ),
    )
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let sign = |key: &str, header: &str, claims: &str| {
        let message = format!("{}.{}", B64.encode(header), B64.encode(claims));
        std::fs::write(dir.join("message"), &message).unwrap();
        let signature = openssl(&["dgst", "-sha256", "-sign", key, "message"]);
        format!("{message}.{}", B64.encode(signature))
    };
    let header = r#"{"alg":"RS256","kid":"k1","typ":"JWT"}"#;
    let claims = |sub: &str, aud: &str, exp: u64| {
        format!(
            r#"{{"sub":"{sub}","iss":"https://idp.test","aud":["{aud}"],"exp":{exp},"groups":["analysts"]}}"#
        )
    };
    std::fs::write(
        dir.join("rules.toml"),
        "[[tables]]\ngroup = \"analysts\"\ncatalog = \"tpch\"\nprivileges = [\"SELECT\"]\n",
    )
    .unwrap();
    let config = format!(
        "[server]\n[security]\nrules_file = \"{}\"\n[flight_sql.jwt]\njwks_file = \"{}\"\n\
         issuer = \"https://idp.test\"\naudience = \"basin\"\ngroups_claim = \"groups\"\n",
        dir.join("rules.toml").display(),
        dir.join("jwks.json").display()
    );
    let cluster = Cluster::start_with(1, &config);
    let port = cluster.flight_sql_port();
    let good = sign("idp.pem", header, &claims("carol", "basin", now + 600));
    let cases = [
        (
            "expired",
            sign("idp.pem", header, &claims("carol", "basin", now - 3600)),
            "expired",
        ),
        (
            "another audience",
            sign("idp.pem", header, &claims("carol", "other", now + 600)),
            "audience",
        ),
        (
            "another key",
            sign("other.pem", header, &claims("carol", "basin", now + 600)),
            "does not verify",
        ),
        (
            "unsigned",
            format!(
                "{}.{}.",
                B64.encode(r#"{"alg":"none"}"#),
                B64.encode(claims("carol", "basin", now + 600))
            ),
            "algorithm",
        ),
        (
            "tampered",
            {
                let mut parts: Vec<String> = good.split('.').map(str::to_string).collect();
                parts[1] = B64.encode(claims("admin", "basin", now + 600));
                parts.join(".")
            },
            "does not verify",
        ),
    ];
    runtime().block_on(async {
        let query = |token: String| async move {
            let mut client = FlightSqlServiceClient::new(channel(port, None).await);
            client.set_token(token);
            let info = client.execute("SHOW GRANTS".into(), None).await?;
            let ticket = info.endpoint[0].ticket.clone().expect("a ticket");
            let batches: Vec<_> = client.do_get(ticket).await?.try_collect().await?;
            Ok::<_, arrow_flight::error::FlightError>(
                datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                    .unwrap()
                    .to_string(),
            )
        };
        let grants = query(good.clone()).await.expect("a good token");
        assert!(
            grants.contains("carol") && grants.contains("tpch"),
            "{grants}"
        );
        assert!(!grants.contains("lake"), "{grants}");
        for (what, token, why) in cases {
            let err = query(token).await.expect_err(what).to_string();
            assert!(err.contains(why), "{what}: {err}");
            assert!(err.contains("refused"), "{what}: {err}");
        }
    });
}
