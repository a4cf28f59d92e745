//! The committed list of where Basin answers DataFusion's own sqllogictest files
//! differently: `sql-tests/datafusion-differences.toml`.
//!
//! Each entry is either a whole file skipped on some routes, or one record (its file, line,
//! and the `.slt.part` it comes from when included) that differs on some routes, with a
//! category and the first line of what differed. The list is written by the runner
//! (`--record-differences`), never by hand; only `note`, a person's explanation, is kept
//! from the old list when the list is written again. A run fails on a record that differs
//! and is not listed (a new difference), and on a listed difference that became a wrong
//! answer; a listed record that now matches is reported ("fixed, re-record"), so the list
//! can be rewritten.
//!
//! A record whose outcome changes from run to run is listed as [`UNSTABLE`] (found by
//! recording with `--runs N`: it differed in some runs and not others, or in different
//! ways): a check accepts either outcome for it. Recording again with one run keeps such
//! records as they are (one run cannot show a record stable); recording with several runs
//! decides again.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;
use sqllogictest::TestErrorKind;

/// The list.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Differences {
    #[serde(default, rename = "file")]
    pub files: Vec<FileDifference>,
    #[serde(default, rename = "record")]
    pub records: Vec<RecordDifference>,
}

/// A file not run on `routes`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDifference {
    pub path: String,
    pub routes: Vec<String>,
    pub category: String,
    pub reason: String,
    #[serde(default)]
    pub note: Option<String>,
}

/// A record that differs on `routes`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordDifference {
    pub file: String,
    /// The included `.slt.part` the record is in, when not in `file` itself.
    #[serde(default)]
    pub part: Option<String>,
    pub line: u32,
    pub routes: Vec<String>,
    pub category: String,
    pub sql: String,
    pub reason: String,
    #[serde(default)]
    pub note: Option<String>,
}

/// Where a record is: (file run, included part, line).
pub type RecordKey = (String, Option<String>, u32);

impl RecordDifference {
    pub fn key(&self) -> RecordKey {
        (self.file.clone(), self.part.clone(), self.line)
    }
}

/// What one run saw differ.
#[derive(Debug, Clone)]
pub struct Observed {
    pub file: String,
    pub part: Option<String>,
    pub line: u32,
    pub sql: String,
    pub category: String,
    pub reason: String,
    /// The whole message, printed when the difference is new.
    pub detail: String,
}

impl Observed {
    pub fn key(&self) -> RecordKey {
        (self.file.clone(), self.part.clone(), self.line)
    }
}

/// The path of the list.
pub fn path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("datafusion-differences.toml")
}

impl Differences {
    /// Reads the list; a missing file is an empty list.
    pub fn load(path: &Path) -> Result<Self, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text).map_err(|e| {
                format!(
                    "{} is not a valid differences list: {e}; write it again with \
                     --record-differences",
                    path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// Whether `file` is skipped on `route`.
    pub fn skipped(&self, file: &str, route: &str) -> Option<&FileDifference> {
        self.files
            .iter()
            .find(|f| f.path == file && f.routes.iter().any(|r| r == route))
    }

    /// The listed differences of `route`, by record.
    pub fn listed(&self, route: &str) -> BTreeMap<RecordKey, &RecordDifference> {
        self.records
            .iter()
            .filter(|r| r.routes.iter().any(|x| x == route))
            .map(|r| (r.key(), r))
            .collect()
    }

    /// Replaces what `route` recorded for the files in `ran` with what was `observed`, and
    /// the whole-file skips of `route` for those files with `skipped`. Notes are kept.
    /// With `carry_unstable`, the [`UNSTABLE`] records of `route` stay listed whatever was
    /// observed (one run cannot show them stable).
    pub fn record(
        &mut self,
        route: &str,
        ran: &BTreeSet<String>,
        observed: &[Observed],
        skipped: &[FileDifference],
        carry_unstable: bool,
    ) {
        for f in &mut self.files {
            if ran.contains(&f.path) {
                f.routes.retain(|r| r != route);
            }
        }
        for s in skipped {
            match self.files.iter_mut().find(|f| f.path == s.path) {
                Some(f) => {
                    f.routes.push(route.to_string());
                    f.category = s.category.clone();
                    f.reason = s.reason.clone();
                }
                None => self.files.push(s.clone()),
            }
        }
        self.files.retain(|f| !f.routes.is_empty());
        let carried: BTreeSet<RecordKey> = self
            .records
            .iter()
            .filter(|r| {
                carry_unstable
                    && r.category == UNSTABLE
                    && ran.contains(&r.file)
                    && r.routes.iter().any(|x| x == route)
            })
            .map(RecordDifference::key)
            .collect();
        for r in &mut self.records {
            if ran.contains(&r.file) && !carried.contains(&r.key()) {
                r.routes.retain(|x| x != route);
            }
        }
        for o in observed {
            if carried.contains(&o.key()) {
                continue;
            }
            match self.records.iter_mut().find(|r| r.key() == o.key()) {
                Some(r) => {
                    r.routes.push(route.to_string());
                    // The latest run's words; an unstable record stays one (its outcome
                    // changes on some route), then a wrong answer stays one.
                    if r.routes.len() == 1
                        || o.category == UNSTABLE
                        || (o.category == WRONG_RESULT && r.category != UNSTABLE)
                    {
                        r.category = o.category.clone();
                        r.reason = o.reason.clone();
                    }
                    r.sql = o.sql.clone();
                }
                None => self.records.push(RecordDifference {
                    file: o.file.clone(),
                    part: o.part.clone(),
                    line: o.line,
                    routes: vec![route.to_string()],
                    category: o.category.clone(),
                    sql: o.sql.clone(),
                    reason: o.reason.clone(),
                    note: None,
                }),
            }
        }
        self.records.retain(|r| !r.routes.is_empty());
        for r in &mut self.records {
            r.routes.sort();
            r.routes.dedup();
        }
        for f in &mut self.files {
            f.routes.sort();
            f.routes.dedup();
        }
        self.records.sort_by_key(RecordDifference::key);
        self.files.sort_by(|a, b| a.path.cmp(&b.path));
    }

    /// The list as TOML, with a summary of its categories at the top.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "# Where Basin answers DataFusion's own sqllogictest files (datafusion-sqllogictest\n\
             # 53.1.0) differently, by route. Written by the runner, not by hand:\n\
             #   cargo test -p basin-sql-tests --test sqllogictests -- --datafusion --record-differences\n\
             # Only `note` (a person's explanation) is kept when the list is written again.\n\
             # See sql-tests/README.md.\n#\n",
        );
        let _ = writeln!(out, "# records by category and route:");
        let mut counts: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        let mut routes = BTreeSet::new();
        for r in &self.records {
            for route in &r.routes {
                routes.insert(route.as_str());
                *counts
                    .entry((r.category.as_str(), route.as_str()))
                    .or_default() += 1;
            }
        }
        let categories: BTreeSet<&str> = counts.keys().map(|(c, _)| *c).collect();
        let mut by_total: Vec<(&str, usize)> = categories
            .iter()
            .map(|c| {
                let total = routes
                    .iter()
                    .map(|r| counts.get(&(*c, *r)).copied().unwrap_or(0));
                (*c, total.sum())
            })
            .collect();
        by_total.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (category, _) in by_total {
            let per_route: Vec<String> = routes
                .iter()
                .map(|r| format!("{r} {}", counts.get(&(category, *r)).copied().unwrap_or(0)))
                .collect();
            let _ = writeln!(out, "#   {category:<28} {}", per_route.join(", "));
        }
        let _ = writeln!(out, "# whole files skipped: {}", self.files.len());
        for f in &self.files {
            out.push_str("\n[[file]]\n");
            let _ = writeln!(out, "path = {}", quote(&f.path));
            let _ = writeln!(out, "routes = {}", quote_list(&f.routes));
            let _ = writeln!(out, "category = {}", quote(&f.category));
            let _ = writeln!(out, "reason = {}", quote(&f.reason));
            if let Some(note) = &f.note {
                let _ = writeln!(out, "note = {}", quote(note));
            }
        }
        for r in &self.records {
            out.push_str("\n[[record]]\n");
            let _ = writeln!(out, "file = {}", quote(&r.file));
            if let Some(part) = &r.part {
                let _ = writeln!(out, "part = {}", quote(part));
            }
            let _ = writeln!(out, "line = {}", r.line);
            let _ = writeln!(out, "routes = {}", quote_list(&r.routes));
            let _ = writeln!(out, "category = {}", quote(&r.category));
            let _ = writeln!(out, "sql = {}", quote(&r.sql));
            let _ = writeln!(out, "reason = {}", quote(&r.reason));
            if let Some(note) = &r.note {
                let _ = writeln!(out, "note = {}", quote(note));
            }
        }
        out
    }
}

/// A TOML basic string.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn quote_list(items: &[String]) -> String {
    let items: Vec<String> = items.iter().map(|s| quote(s)).collect();
    format!("[{}]", items.join(", "))
}

/// The category of a wrong answer: a query returned rows other than DataFusion's.
pub const WRONG_RESULT: &str = "wrong-result";

/// The category of a statement that did not finish within the deadline.
pub const TIMEOUT: &str = "timeout";

/// The category of a record whose outcome changed between runs of one recording (it
/// matched DataFusion in some and differed in others, or differed in other ways): a check
/// accepts any outcome for it.
pub const UNSTABLE: &str = "unstable";

/// What `runs` runs of the same files on one route saw, as one list: a record that
/// differed the same way (category) in every run keeps the first run's words; one that
/// differed in some runs only, or in other ways, is [`UNSTABLE`], its reason saying what
/// each run saw.
pub fn combine_runs(runs: &[Vec<Observed>]) -> Vec<Observed> {
    // One outcome per run and record (a record of a part included twice is seen twice).
    let mut seen: BTreeMap<RecordKey, BTreeMap<usize, &Observed>> = BTreeMap::new();
    for (i, run) in runs.iter().enumerate() {
        for o in run {
            seen.entry(o.key()).or_default().entry(i).or_insert(o);
        }
    }
    seen.into_values()
        .filter_map(|per_run| {
            let all: Vec<&Observed> = per_run.into_values().collect();
            let first = (*all.first()?).clone();
            let same = all.len() == runs.len() && all.iter().all(|o| o.category == first.category);
            if same {
                return Some(first);
            }
            let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
            for o in &all {
                *outcomes.entry(o.category.as_str()).or_default() += 1;
            }
            let matched = runs.len().saturating_sub(all.len());
            if matched > 0 {
                outcomes.insert("matched", matched);
            }
            let counts: Vec<String> = outcomes.iter().map(|(c, n)| format!("{c} {n}")).collect();
            let why = all
                .iter()
                .find(|o| o.category == WRONG_RESULT)
                .unwrap_or(&all[0]);
            Some(Observed {
                category: UNSTABLE.to_string(),
                reason: truncate(
                    &format!(
                        "in {} runs: {}; {}: {}",
                        runs.len(),
                        counts.join(", "),
                        why.category,
                        why.reason
                    ),
                    REASON_CHARS,
                ),
                ..first
            })
        })
        .collect()
}

/// How long a `reason` may be.
const REASON_CHARS: usize = 240;

/// The category and the one-line reason of a record that differed. `root` (the working
/// tree) is replaced by `WORKSPACE_ROOT` so the reason does not change from run to run.
pub fn categorize(kind: &TestErrorKind, sql: &str, root: &str) -> (String, String) {
    let clean = |s: &str| -> String {
        let s = s.replace(root, "WORKSPACE_ROOT");
        let s = s
            .strip_prefix("DataFusion error: ")
            .unwrap_or(&s)
            .to_string();
        let one_line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
        truncate(&one_line, REASON_CHARS)
    };
    let head = sql.trim_start().to_ascii_lowercase();
    let (category, reason) = match kind {
        TestErrorKind::ParseError(e) => ("parse".to_string(), clean(&e.to_string())),
        TestErrorKind::Ok { .. } => (
            "missing-error".to_string(),
            "DataFusion fails this statement; Basin runs it".to_string(),
        ),
        TestErrorKind::Fail { err, .. } => {
            let text = err.to_string();
            (error_category(&text).to_string(), clean(&text))
        }
        TestErrorKind::ErrorMismatch {
            err, expected_err, ..
        } => (
            "different-error".to_string(),
            clean(&format!("expected /{expected_err}/, got: {err}")),
        ),
        TestErrorKind::StatementResultMismatch {
            expected, actual, ..
        } => (
            "statement-count".to_string(),
            format!("expected {expected} rows affected, {actual}"),
        ),
        TestErrorKind::QueryResultMismatch {
            expected, actual, ..
        } => {
            let category = if head.starts_with("explain") {
                "explain-output"
            } else if head.contains("information_schema")
                || head.starts_with("show")
                || head.starts_with("describe")
            {
                "information-schema"
            } else {
                WRONG_RESULT
            };
            (
                category.to_string(),
                clean(&first_difference(expected, actual)),
            )
        }
        TestErrorKind::QueryResultColumnsMismatch {
            expected, actual, ..
        } => (
            "column-types".to_string(),
            format!("expected column types {expected}, got {actual}"),
        ),
        other => ("other".to_string(), clean(&other.to_string())),
    };
    (category, reason)
}

/// The category of an unexpected error, by what its message says. Checked in order: the
/// first matching kind names the cause best.
fn error_category(text: &str) -> &'static str {
    let t = text.to_ascii_lowercase();
    let has = |s: &str| t.contains(s);
    if has("did not finish within") {
        TIMEOUT
    } else if has("no such file or directory")
        || (has("object at location") && has("not found"))
        || has("no files found")
    {
        "missing-data-file"
    } else if (has("table") && has("not found")) || has("no table named") {
        "missing-table"
    } else if has("configuration")
        || has("config value")
        || has("unrecognized option")
        || has("set datafusion")
    {
        "session-option"
    } else if has("invalid function") || has("no udf named") || has("function") && has("not found")
    {
        "unknown-function"
    } else if has("not implemented") || has("unsupported") || has("not supported") {
        "not-supported"
    } else if has("proto") || has("serializ") || has("codec") || has("decode") || has("encode") {
        "plan-serialization"
    } else if has("ballista") || has("job ") || has("task ") || has("executor") {
        "distributed-execution"
    } else {
        "unexpected-error"
    }
}

/// `expected N rows, got M`, and the first pair of rows that differ.
fn first_difference(expected: &str, actual: &str) -> String {
    let e: Vec<&str> = expected.lines().collect();
    let a: Vec<&str> = actual.lines().collect();
    let mut text = format!("expected {} rows, got {}", e.len(), a.len());
    let at = e
        .iter()
        .zip(&a)
        .position(|(x, y)| x.trim_end() != y.trim_end());
    let at = at.unwrap_or(e.len().min(a.len()));
    let _ = write!(
        text,
        "; row {}: expected `{}`, got `{}`",
        at + 1,
        e.get(at).unwrap_or(&"(none)"),
        a.get(at).unwrap_or(&"(none)")
    );
    text
}

fn truncate(s: &str, chars: usize) -> String {
    match s.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// The SQL of a record as listed: whitespace runs made one space, at most 600 characters.
pub fn listed_sql(sql: &str) -> String {
    let one_line: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    truncate(&one_line, 600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_reads_back_what_it_writes() {
        let mut list = Differences::default();
        let observed = Observed {
            file: "a.slt".into(),
            part: Some("b.slt.part".into()),
            line: 7,
            sql: "SELECT '\"x\"\\\n'".into(),
            category: WRONG_RESULT.into(),
            reason: "expected 1 rows, got 2".into(),
            detail: String::new(),
        };
        let ran = BTreeSet::from(["a.slt".to_string(), "c.slt".to_string()]);
        let skip = FileDifference {
            path: "c.slt".into(),
            routes: vec!["inprocess".into()],
            category: "parse".into(),
            reason: "r".into(),
            note: None,
        };
        list.record(
            "inprocess",
            &ran,
            std::slice::from_ref(&observed),
            &[skip],
            true,
        );
        list.record("cluster", &ran, &[observed], &[], true);
        let text = list.to_toml();
        let back: Differences = toml::from_str(&text).unwrap();
        assert_eq!(back.records.len(), 1);
        assert_eq!(back.records[0].sql, "SELECT '\"x\"\\\n'");
        assert_eq!(back.records[0].routes, vec!["cluster", "inprocess"]);
        assert_eq!(back.files[0].routes, vec!["inprocess"]);
        assert!(back.skipped("c.slt", "inprocess").is_some());
        assert!(back.skipped("c.slt", "cluster").is_none());
        assert!(text.contains("#   wrong-result"));
    }

    fn seen(line: u32, category: &str) -> Observed {
        Observed {
            file: "a.slt".into(),
            part: None,
            line,
            sql: "SELECT 1".into(),
            category: category.into(),
            reason: format!("{category} at {line}"),
            detail: String::new(),
        }
    }

    #[test]
    fn a_record_that_changes_between_runs_is_unstable_and_stays_listed() {
        let runs = vec![
            vec![
                seen(1, WRONG_RESULT),
                seen(1, WRONG_RESULT),
                seen(2, TIMEOUT),
                seen(3, WRONG_RESULT),
            ],
            vec![seen(1, WRONG_RESULT), seen(3, "unexpected-error")],
        ];
        let combined = combine_runs(&runs);
        let by_line: BTreeMap<u32, &Observed> = combined.iter().map(|o| (o.line, o)).collect();
        assert_eq!(by_line[&1].category, WRONG_RESULT);
        assert_eq!(by_line[&2].category, UNSTABLE);
        assert!(
            by_line[&2].reason.contains("matched 1"),
            "{}",
            by_line[&2].reason
        );
        assert_eq!(by_line[&3].category, UNSTABLE);

        let ran = BTreeSet::from(["a.slt".to_string()]);
        let mut list = Differences::default();
        list.record("inprocess", &ran, &combined, &[], true);
        // One later run that matched on line 2 and differed on line 1: the unstable
        // records stay as they were.
        list.record("inprocess", &ran, &[seen(1, WRONG_RESULT)], &[], true);
        let lines: Vec<(u32, &str)> = list
            .records
            .iter()
            .map(|r| (r.line, r.category.as_str()))
            .collect();
        assert_eq!(lines, vec![(1, WRONG_RESULT), (2, UNSTABLE), (3, UNSTABLE)]);
        // Several runs decide again: line 2 matched every time.
        list.record("inprocess", &ran, &[seen(1, WRONG_RESULT)], &[], false);
        assert_eq!(list.records.len(), 1);
    }
}
