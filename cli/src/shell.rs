//! `basin sql`: an interactive SQL shell (and `-e`/`-f` runner) over Arrow Flight SQL.
//!
//! ```text
//!  basin sql grpc://127.0.0.1:50060 --user alice      (password prompted, or BASIN_PASSWORD)
//!  basin=> SELECT count(*) FROM tpch.tiny.lineitem;
//! ```
//!
//! Statements end with `;` and may span lines; history is kept in `~/.basin_history`.
//! Ctrl-C cancels the running query and keeps the shell; Ctrl-D leaves it. Backslash
//! commands: `\l` catalogs, `\dn` schemas, `\dt [PATTERN]` tables, `\d TABLE` columns,
//! `\q` quit, `\?` help.

use std::io::Write;
use std::time::{Duration, Instant};

use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::{Action, CancelFlightInfoRequest, FlightInfo};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use futures::TryStreamExt;
use prost::Message;
use tonic::transport::{Channel, Endpoint};

use crate::output::{OutputFormat, write_result};
use crate::statements::StatementResult;

/// A Flight SQL connection.
pub struct Connection {
    client: FlightSqlServiceClient<Channel>,
}

fn err(e: impl std::fmt::Display) -> String {
    let text = e.to_string();
    // Flight errors wrap the server's message in layers of context; keep the message.
    let Some((_, rest)) = text.split_once("message: \"") else {
        return text;
    };
    let mut message = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('n') => message.push(' '),
                Some(other) => message.push(other),
                None => break,
            },
            '"' => break,
            c => message.push(c),
        }
    }
    message
}

impl Connection {
    /// Connects to `url` (`grpc://host:port` or `grpc+tls://host:port`) and authenticates.
    pub async fn connect(
        url: &str,
        user: Option<&str>,
        password: Option<&str>,
    ) -> Result<Self, String> {
        let http = url
            .replacen("grpc+tls://", "https://", 1)
            .replacen("grpc+tcp://", "http://", 1)
            .replacen("grpc://", "http://", 1);
        let endpoint = Endpoint::from_shared(http.clone())
            .map_err(|e| format!("bad Flight SQL URL {url}: {e}"))?
            .connect_timeout(Duration::from_secs(10));
        let channel = endpoint.connect().await.map_err(|e| {
            format!(
                "cannot connect to {url}: {e} (is `basin standalone` or `basin scheduler` running?)"
            )
        })?;
        let mut client = FlightSqlServiceClient::new(channel);
        client
            .handshake(user.unwrap_or(""), password.unwrap_or(""))
            .await
            .map_err(|e| format!("cannot log in to {url}: {}", err(e)))?;
        Ok(Self { client })
    }

    /// Runs one statement and collects its result; Ctrl-C cancels it.
    pub async fn run(&mut self, sql: &str) -> Result<StatementResult, String> {
        let info = self
            .client
            .execute(sql.to_string(), None)
            .await
            .map_err(err)?;
        let schema: SchemaRef = std::sync::Arc::new(info.clone().try_decode_schema().map_err(err)?);
        let fetch = fetch_all(self.client.clone(), info.clone());
        tokio::pin!(fetch);
        let batches = tokio::select! {
            r = &mut fetch => r?,
            _ = tokio::signal::ctrl_c() => {
                self.cancel(info).await;
                return Err("query cancelled".to_string());
            }
        };
        Ok(StatementResult {
            sql: sql.to_string(),
            schema,
            batches,
        })
    }

    async fn cancel(&mut self, info: FlightInfo) {
        let body = CancelFlightInfoRequest { info: Some(info) }.encode_to_vec();
        let action = Action {
            r#type: "CancelFlightInfo".to_string(),
            body: body.into(),
        };
        let _ = self.client.do_action(action).await;
    }
}

async fn fetch_all(
    mut client: FlightSqlServiceClient<Channel>,
    info: FlightInfo,
) -> Result<Vec<RecordBatch>, String> {
    let mut batches = vec![];
    for endpoint in info.endpoint {
        let Some(ticket) = endpoint.ticket else {
            continue;
        };
        let stream = client.do_get(ticket).await.map_err(err)?;
        let mut part: Vec<RecordBatch> = stream.try_collect().await.map_err(err)?;
        batches.append(&mut part);
    }
    Ok(batches)
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// SQL for a backslash command, or `None` if it is not one the shell knows.
pub fn backslash_sql(command: &str) -> Option<String> {
    let mut parts = command.split_whitespace();
    let cmd = parts.next()?;
    let arg = parts.next();
    Some(match (cmd, arg) {
        ("\\l", _) => "SELECT DISTINCT catalog_name FROM information_schema.schemata ORDER BY 1".into(),
        ("\\dn", _) => "SELECT catalog_name, schema_name FROM information_schema.schemata ORDER BY 1, 2".into(),
        ("\\dt", None) => "SELECT table_catalog, table_schema, table_name, table_type FROM information_schema.tables \
             WHERE table_schema <> 'information_schema' ORDER BY 1, 2, 3".into(),
        ("\\dt", Some(p)) => format!(
            "SELECT table_catalog, table_schema, table_name, table_type FROM information_schema.tables \
             WHERE table_name LIKE {} ORDER BY 1, 2, 3",
            quote_literal(&p.replace('*', "%"))
        ),
        ("\\d", Some(t)) => {
            let names: Vec<&str> = t.split('.').collect();
            let mut filter = format!("table_name = {}", quote_literal(names[names.len() - 1]));
            if names.len() >= 2 {
                filter.push_str(&format!(" AND table_schema = {}", quote_literal(names[names.len() - 2])));
            }
            if names.len() >= 3 {
                filter.push_str(&format!(" AND table_catalog = {}", quote_literal(names[0])));
            }
            // A partly qualified name may match tables in several schemas: say which.
            let location = if names.len() >= 3 { "" } else { "table_catalog, table_schema, " };
            format!(
                "SELECT {location}column_name, data_type, is_nullable FROM information_schema.columns \
                 WHERE {filter} ORDER BY table_catalog, table_schema, ordinal_position"
            )
        }
        ("\\d", None) => return backslash_sql("\\dt"),
        _ => return None,
    })
}

const HELP: &str = "\\l            list catalogs
\\dn           list schemas
\\dt [PATTERN] list tables (PATTERN: * and % match anything)
\\d TABLE      describe a table ([catalog.][schema.]table)
\\q            quit
Statements end with ';'. Ctrl-C cancels a running query, Ctrl-D quits.";

/// Prints one result with its row count and time (to stderr, so stdout stays data).
fn show(
    result: &StatementResult,
    format: OutputFormat,
    elapsed: Duration,
    timing: bool,
) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    write_result(&mut out, result, format).map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    if timing && !result.schema.fields().is_empty() {
        let rows: usize = result.batches.iter().map(RecordBatch::num_rows).sum();
        eprintln!(
            "({rows} row{}, {:.3} s)",
            if rows == 1 { "" } else { "s" },
            elapsed.as_secs_f64()
        );
    } else if timing {
        eprintln!("OK ({:.3} s)", elapsed.as_secs_f64());
    }
    Ok(())
}

/// Runs `sql` (one or more statements) non-interactively; stops at the first error.
pub async fn run_script(
    conn: &mut Connection,
    sql: &str,
    format: OutputFormat,
) -> Result<(), String> {
    for statement in split_statements(sql) {
        let text = match backslash_sql(&statement) {
            Some(q) => q,
            None => statement,
        };
        let result = conn.run(&text).await?;
        show(&result, format, Duration::ZERO, false)?;
    }
    Ok(())
}

/// Splits SQL text at `;` outside quotes and comments.
pub fn split_statements(sql: &str) -> Vec<String> {
    let (mut statements, rest) = scan_statements(sql);
    if !is_blank(&rest) {
        statements.push(rest.trim().to_string());
    }
    statements
}

/// Whether SQL text holds nothing but whitespace and comments.
pub fn is_blank(sql: &str) -> bool {
    let mut rest = sql.trim_start();
    loop {
        if let Some(r) = rest.strip_prefix("--") {
            rest = r
                .split_once('\n')
                .map(|(_, r)| r)
                .unwrap_or("")
                .trim_start();
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r
                .split_once("*/")
                .map(|(_, r)| r)
                .unwrap_or("")
                .trim_start();
        } else {
            return rest.is_empty();
        }
    }
}

/// Splits SQL text into the statements it completes (ended by `;` outside quotes and
/// comments) and the unfinished rest.
pub fn scan_statements(sql: &str) -> (Vec<String>, String) {
    #[derive(PartialEq)]
    enum State {
        Code,
        Single,
        Double,
        Line,
        Block,
    }
    let mut out = vec![];
    let mut current = String::new();
    let mut state = State::Code;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match state {
            State::Code => match c {
                '\'' => state = State::Single,
                '"' => state = State::Double,
                '-' if chars.peek() == Some(&'-') => state = State::Line,
                '/' if chars.peek() == Some(&'*') => state = State::Block,
                ';' => {
                    if !is_blank(&current) {
                        out.push(current.trim().to_string());
                    }
                    current.clear();
                    continue;
                }
                _ => {}
            },
            State::Single if c == '\'' => state = State::Code,
            State::Double if c == '"' => state = State::Code,
            State::Line if c == '\n' => state = State::Code,
            State::Block if c == '*' && chars.peek() == Some(&'/') => {
                current.push(c);
                if let Some(slash) = chars.next() {
                    current.push(slash);
                }
                state = State::Code;
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    (out, current)
}

/// The interactive loop.
pub async fn interactive(
    conn: &mut Connection,
    format: OutputFormat,
    url: &str,
) -> Result<(), String> {
    use rustyline::error::ReadlineError;
    let mut editor = rustyline::DefaultEditor::new().map_err(|e| e.to_string())?;
    let history =
        std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".basin_history"));
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    eprintln!("Connected to Basin at {url}. \\? for help, \\q to quit.");
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            "basin=> "
        } else {
            "basin-> "
        };
        let line = match editor.readline(prompt) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.to_string()),
        };
        let trimmed = line.trim();
        if buffer.is_empty() && trimmed.starts_with('\\') {
            let _ = editor.add_history_entry(trimmed);
            match trimmed {
                "\\q" => break,
                "\\?" | "\\h" => eprintln!("{HELP}"),
                _ => match backslash_sql(trimmed) {
                    Some(sql) => execute_and_show(conn, &sql, format).await,
                    None => eprintln!("unknown command {trimmed}; \\? lists the commands"),
                },
            }
            continue;
        }
        buffer.push_str(&line);
        buffer.push('\n');
        let (statements, rest) = scan_statements(&buffer);
        if statements.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(buffer.trim());
        buffer = if is_blank(&rest) { String::new() } else { rest };
        for statement in statements {
            execute_and_show(conn, &statement, format).await;
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    Ok(())
}

async fn execute_and_show(conn: &mut Connection, sql: &str, format: OutputFormat) {
    let start = Instant::now();
    let progress = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        loop {
            eprint!(
                "\rrunning… {:.0} s (Ctrl-C cancels)",
                start.elapsed().as_secs_f64()
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let result = conn.run(sql).await;
    progress.abort();
    if start.elapsed() >= Duration::from_secs(1) {
        eprint!("\r\x1b[K");
    }
    match result {
        Ok(r) => {
            if let Err(e) = show(&r, format, start.elapsed(), true) {
                eprintln!("error: {e}");
            }
        }
        Err(e) => eprintln!("error: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_comments_and_unfinished_statements() {
        assert_eq!(
            split_statements("/* don't; */ SELECT 1; SELECT 'a;b';"),
            vec!["/* don't; */ SELECT 1", "SELECT 'a;b'"]
        );
        let (done, rest) = scan_statements("SELECT 'a;\n");
        assert!(done.is_empty() && rest.contains("SELECT"));
        let (done, rest) = scan_statements("SELECT 1; -- note\n");
        assert_eq!(done, vec!["SELECT 1"]);
        assert!(rest.trim().starts_with("--"));
    }

    #[test]
    fn splits_statements_outside_quotes_and_comments() {
        assert_eq!(
            split_statements("SELECT ';' AS a; -- x; y\nSELECT 2;\n"),
            vec!["SELECT ';' AS a", "-- x; y\nSELECT 2"]
        );
        assert!(split_statements("  ;  ").is_empty());
    }

    #[test]
    fn backslash_commands_quote_their_arguments() {
        let sql = backslash_sql("\\d tpch.tiny.o'rders").unwrap();
        assert!(sql.contains("'o''rders'") && sql.contains("'tiny'") && sql.contains("'tpch'"));
        assert!(backslash_sql("\\x").is_none());
        assert!(backslash_sql("\\dt line*").unwrap().contains("'line%'"));
    }
}
