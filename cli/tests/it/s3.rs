//! Files on a real S3 server (SeaweedFS, started by `.ci/services.sh`).

use crate::{basin, in_ci, scratch_dir, stderr, stdout};

struct S3Env {
    endpoint: String,
    access_key: String,
    secret_key: String,
    bucket: String,
}

fn s3_env() -> Option<S3Env> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    Some(S3Env {
        endpoint: get("BASIN_TEST_S3_ENDPOINT")?,
        access_key: get("BASIN_TEST_S3_ACCESS_KEY")?,
        secret_key: get("BASIN_TEST_S3_SECRET_KEY")?,
        bucket: get("BASIN_TEST_S3_BUCKET")?,
    })
}

fn require_s3() -> Option<S3Env> {
    match s3_env() {
        Some(env) => Some(env),
        None if in_ci() => panic!(
            "BASIN_TEST_S3_ENDPOINT etc. are not set under CI=true: start SeaweedFS with \
             .ci/services.sh start"
        ),
        None => {
            eprintln!("SKIPPED: no S3 server (run `eval \"$(.ci/services.sh start)\"` first)");
            None
        }
    }
}

#[test]
fn parquet_csv_json_on_s3() {
    let Some(env) = require_s3() else { return };
    let dir = scratch_dir("s3");
    let config = dir.join("basin.toml");
    std::fs::write(
        &config,
        format!(
            "[storage.s3]\nendpoint = \"{}\"\nregion = \"us-east-1\"\naccess_key_id = \"{}\"\n\
             secret_access_key = \"${{env:BASIN_TEST_S3_SECRET_KEY}}\"\npath_style = true\n",
            env.endpoint, env.access_key
        ),
    )
    .unwrap();
    let prefix = format!("s3://{}/cli-test-{}", env.bucket, std::process::id());
    let sql = format!(
        "COPY (SELECT * FROM tpch.tiny.nation) TO '{prefix}/nation/' STORED AS PARQUET;
         COPY (SELECT * FROM tpch.tiny.region) TO '{prefix}/region.csv' STORED AS CSV;
         COPY (SELECT * FROM tpch.tiny.region) TO '{prefix}/region.json' STORED AS JSON;
         CREATE EXTERNAL TABLE nation_s3 STORED AS PARQUET LOCATION '{prefix}/nation/';
         SELECT r.r_name, count(*) AS n
           FROM nation_s3 n JOIN read_csv('{prefix}/region.csv') r ON n.n_regionkey = r.r_regionkey
          WHERE r.r_name IN (SELECT r_name FROM read_json('{prefix}/region.json'))
          GROUP BY r.r_name ORDER BY r.r_name;
         SELECT count(*) AS n FROM read_parquet('{prefix}/nation/');"
    );
    let file = dir.join("s3.sql");
    std::fs::write(&file, sql).unwrap();
    let out = basin(
        &[
            "standalone",
            "--config",
            config.to_str().unwrap(),
            "--format",
            "csv",
            "-f",
            file.to_str().unwrap(),
        ],
        &[("BASIN_TEST_S3_SECRET_KEY", &env.secret_key)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("r_name,n\nAFRICA,5\nAMERICA,5\nASIA,5\nEUROPE,5\nMIDDLE EAST,5\n"),
        "{text}"
    );
    assert!(text.ends_with("n\n25\n"), "{text}");
}

#[test]
fn wrong_s3_credentials_are_a_clear_error() {
    let Some(env) = require_s3() else { return };
    let dir = scratch_dir("s3bad");
    let config = dir.join("basin.toml");
    std::fs::write(
        &config,
        format!(
            "[storage.s3]\nendpoint = \"{}\"\naccess_key_id = \"{}\"\n\
             secret_access_key = \"wrong-secret-1234\"\npath_style = true\n",
            env.endpoint, env.access_key
        ),
    )
    .unwrap();
    let out = basin(
        &[
            "standalone",
            "--config",
            config.to_str().unwrap(),
            "-e",
            &format!(
                "SELECT * FROM read_parquet('s3://{}/anything/')",
                env.bucket
            ),
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(!err.contains("wrong-secret-1234"), "{err}");
    assert!(err.contains("read_parquet"), "{err}");
}
