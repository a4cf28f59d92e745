//! The audit log: one JSON line per statement a Flight SQL client runs, written by the
//! scheduler (`[security] audit_log`).
//!
//! ```json
//! {"time":"2026-12-07T17:40:00.123Z","user":"alice","client":"10.0.0.7:51234",
//!  "statement":"SELECT * FROM lake.hr.people","read":["lake.hr.people"],"written":[],
//!  "rows":2,"outcome":"ok","error":null,"duration_ms":41}
//! ```
//!
//! `outcome` is `ok`, `error` (with `error`: the message the client got), or `abandoned` (the
//! client went away before the last row). `rows` is the rows sent (queries) or changed
//! (INSERT, UPDATE, DELETE, MERGE, COPY), `null` when not known. Values of options whose
//! names speak of secrets (`'…secret…' 'value'`, passwords, tokens, keys) are written as
//! `'***'`. Lines are appended to the file opened anew for each (log rotation may move it).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use basin_core::{BasinError, Result};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::logical_expr::{DdlStatement, LogicalPlan};

/// Where the audit lines go.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    lock: Mutex<()>,
}

impl AuditLog {
    /// The audit log at `path`, which must be writable now (a server that cannot audit does
    /// not start).
    pub fn open(path: &Path) -> Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| BasinError::Invalid(format!("audit log {}: {e}", path.display())))?;
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| BasinError::Invalid(format!("audit log {}: {e}", path.display())))?;
        Ok(Self {
            path: path.to_path_buf(),
            lock: Mutex::new(()),
        })
    }

    fn write(&self, line: &str) {
        let _one_at_a_time = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            tracing::error!(file = %self.path.display(), error = %e, "cannot write the audit log");
        }
    }
}

/// One statement being audited: written once, when it ends (or is dropped unfinished).
pub struct Audited {
    log: Arc<AuditLog>,
    started: Instant,
    time: chrono::DateTime<chrono::Utc>,
    user: String,
    client: String,
    statement: String,
    read: Vec<String>,
    written: Vec<String>,
    rows: Arc<AtomicU64>,
    rows_known: bool,
    outcome: Option<std::result::Result<(), String>>,
}

impl Audited {
    pub fn new(log: Arc<AuditLog>, user: &str, client: &str, statement: &str) -> Self {
        Self {
            log,
            started: Instant::now(),
            time: chrono::Utc::now(),
            user: user.to_string(),
            client: client.to_string(),
            statement: redact(statement),
            read: vec![],
            written: vec![],
            rows: Arc::new(AtomicU64::new(0)),
            rows_known: false,
            outcome: None,
        }
    }

    /// The tables `plan` reads and writes.
    pub fn objects(&mut self, plan: &LogicalPlan) {
        let (read, written) = objects(plan);
        self.read = read;
        self.written = written;
    }

    /// A counter of the rows sent, for the result stream to add to.
    pub fn row_counter(&mut self) -> Arc<AtomicU64> {
        self.rows_known = true;
        self.rows.clone()
    }

    /// The rows a change reports.
    pub fn rows(&mut self, rows: u64) {
        self.rows_known = true;
        self.rows.store(rows, Ordering::Relaxed);
    }

    /// How the statement ended.
    pub fn ended(&mut self, outcome: std::result::Result<(), String>) {
        self.outcome.get_or_insert(outcome);
    }
}

impl Drop for Audited {
    fn drop(&mut self) {
        let (outcome, error) = match self.outcome.take() {
            Some(Ok(())) => ("ok", None),
            Some(Err(e)) => ("error", Some(e)),
            None => ("abandoned", None),
        };
        let line = serde_json::json!({
            "time": self.time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "user": self.user,
            "client": self.client,
            "statement": self.statement,
            "read": self.read,
            "written": self.written,
            "rows": self.rows_known.then(|| self.rows.load(Ordering::Relaxed)),
            "outcome": outcome,
            "error": error,
            "duration_ms": self.started.elapsed().as_millis() as u64,
        });
        self.log.write(&line.to_string());
    }
}

/// The tables a plan reads (scans, subqueries included) and writes (DML, DDL, Iceberg
/// changes), each once, in order.
pub fn objects(plan: &LogicalPlan) -> (Vec<String>, Vec<String>) {
    let mut read: Vec<String> = Vec::new();
    let mut written: Vec<String> = Vec::new();
    let add = |list: &mut Vec<String>, name: String| {
        if !list.contains(&name) {
            list.push(name);
        }
    };
    let _ = plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::TableScan(scan) => add(&mut read, scan.table_name.to_string()),
            LogicalPlan::Dml(dml) => add(&mut written, dml.table_name.to_string()),
            LogicalPlan::Copy(copy) => add(&mut written, copy.output_url.clone()),
            LogicalPlan::Ddl(ddl) => {
                let name = match ddl {
                    DdlStatement::CreateExternalTable(c) => Some(c.name.to_string()),
                    DdlStatement::CreateMemoryTable(c) => Some(c.name.to_string()),
                    DdlStatement::CreateView(c) => Some(c.name.to_string()),
                    DdlStatement::DropTable(d) => Some(d.name.to_string()),
                    DdlStatement::DropView(d) => Some(d.name.to_string()),
                    DdlStatement::CreateCatalogSchema(c) => Some(c.schema_name.clone()),
                    _ => None,
                };
                if let Some(name) = name {
                    add(&mut written, name);
                }
            }
            LogicalPlan::Extension(e) => {
                if let Some(change) = crate::access::iceberg_change(e.node.as_ref()) {
                    for name in change.query.map(|q| objects(q).0).unwrap_or_default() {
                        add(&mut read, name);
                    }
                    add(&mut written, change.table.to_string());
                }
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    });
    (read, written)
}

/// `sql` with the values of secret-looking options replaced by `'***'`: a quoted key that
/// names a secret, password, token, credential or key, then (after whitespace or `=`) a
/// quoted value.
pub fn redact(sql: &str) -> String {
    static PATTERN: std::sync::LazyLock<Option<regex::Regex>> = std::sync::LazyLock::new(|| {
        regex::Regex::new(
            r#"(?i)((?:'[^']*(?:secret|password|passwd|token|credential|key)[^']*'|"[^"]*(?:secret|password|passwd|token|credential|key)[^"]*"|[\w.\-]*(?:secret|password|passwd|token|credential|key)[\w.\-]*)\s*=?\s*)(?:[eE]?'(?:[^']|'')*'|"[^"]*")"#,
        )
        .ok()
    });
    match PATTERN.as_ref() {
        Some(pattern) => pattern.replace_all(sql, "$1'***'").into_owned(),
        None => sql.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_options_are_redacted() {
        let sql = "COPY t TO 's3://b/x' OPTIONS ('aws.secret_access_key' 'abc''d', \
                   'aws.access_key_id' = 'AKIA', 'format.has_header' 'true')";
        let out = redact(sql);
        assert!(!out.contains("abc") && !out.contains("AKIA"), "{out}");
        assert!(out.contains("'format.has_header' 'true'"), "{out}");
        for sql in [
            "CREATE TABLE t WITH (\"s3.secret-access-key\" = 'abc') AS SELECT 1",
            "COPY t TO 'x' OPTIONS (aws.secret_access_key 'abc')",
            "COPY t TO 'x' OPTIONS ('aws.session_token' E'abc')",
            "COPY t TO 'x' OPTIONS ('password' \"abc\")",
        ] {
            let out = redact(sql);
            assert!(!out.contains("abc"), "{out}");
        }
        assert_eq!(redact("SELECT 'password'"), "SELECT 'password'");
    }
}
