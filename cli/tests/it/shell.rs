//! `basin sql` against a running `basin standalone` (Flight SQL).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Scratch, basin, scratch_dir, stderr, stdout};

/// A running server and its data directory, removed once the server is stopped.
struct Server {
    child: std::process::Child,
    _data: Scratch,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> (Server, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let data = scratch_dir("server");
    let child = Command::new(env!("CARGO_BIN_EXE_basin"))
        .args([
            "standalone",
            "--executors",
            "1",
            "--flight-sql-port",
            &port.to_string(),
        ])
        .env("BASIN_DATA_DIR", &data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start basin standalone");
    let server = Server { child, _data: data };
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, format!("grpc://127.0.0.1:{port}"))
}

#[test]
fn sql_shell_runs_statements_and_reports_errors() {
    let (_server, url) = start_server();
    let out = basin(
        &[
            "sql",
            &url,
            "--format",
            "csv",
            "-e",
            "USE tpch.tiny; SELECT n_name FROM nation ORDER BY n_nationkey LIMIT 2",
            "-e",
            "\\d tpch.tiny.region",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "n_name\nALGERIA\nARGENTINA\ncolumn_name,data_type,is_nullable\n\
         r_regionkey,Int64,NO\nr_name,Utf8View,NO\nr_comment,Utf8View,NO\n"
    );
    let out = basin(&["sql", &url, "-e", "SELECT * FROM tpch.tiny.missing"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("missing"), "{}", stderr(&out));
    let out = basin(&["sql", "grpc://127.0.0.1:1", "-e", "SELECT 1"], &[]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("cannot connect"), "{}", stderr(&out));
}
