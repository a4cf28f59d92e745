//! Commits that iceberg-rust 0.10 cannot make: a snapshot that removes data files (`DELETE`,
//! `TRUNCATE`) and moving a branch (`rollback_to_snapshot`).
//!
//! iceberg-rust commits only its own transaction actions (fast append, schema and property
//! changes, expiring snapshots): its action trait and its `TableCommit` cannot be built
//! outside the crate. So Basin writes the manifests, the manifest list and the snapshot
//! itself, and commits the metadata change as each catalog kind defines it:
//!
//! - **SQL catalog** (the embedded `lake`, or any JDBC-style `iceberg_tables` table): the new
//!   metadata file is written next to the old one, then one `UPDATE … SET metadata_location`
//!   that only succeeds while the row still names the metadata the change was made from
//!   (compare-and-swap); a lost race deletes the written file and fails as a conflict.
//! - **REST catalog**: `POST /v1/{prefix}/namespaces/{ns}/tables/{table}` with the updates and
//!   their requirements (`assert-table-uuid`, `assert-ref-snapshot-id`); the catalog checks
//!   them atomically, a 409 is a conflict.
//!
//! Every commit requires that `main` still points where it pointed when the change was
//! planned: a concurrent commit fails the statement with a conflict error naming the table
//! and nothing is half-committed (the files written for it become orphans, which
//! `remove_orphan_files` removes).

use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use datafusion::error::{DataFusionError, Result};
use iceberg::spec::{
    DataFile, FormatVersion, ManifestContentType, ManifestFile, ManifestListWriter,
    ManifestWriterBuilder, Operation, PartitionSpec, Snapshot, SnapshotReference,
    SnapshotRetention, SnapshotSummaryCollector, Summary,
};
use iceberg::table::Table;
use iceberg::{MetadataLocation, TableRequirement, TableUpdate};
use iceberg_catalog_rest::CommitTableRequest;
use tokio::sync::Mutex;

use super::catalog::error_text;

const MAIN: &str = "main";

pub(super) fn iceberg_error(e: iceberg::Error) -> DataFusionError {
    DataFusionError::Execution(error_text(&e))
}

fn conflict(table: &str, why: &str) -> DataFusionError {
    DataFusionError::Execution(format!(
        "conflict: `{table}` was changed by another commit while this statement ran ({why}); \
         nothing was committed, run the statement again"
    ))
}

/// How a catalog commits a metadata change (see the module's documentation).
pub(crate) enum Committer {
    Sql {
        uri: String,
        catalog: String,
        dollar_binds: bool,
    },
    Rest(Box<RestCommitter>),
}

impl std::fmt::Debug for Committer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // URIs and properties may hold credentials.
        match self {
            Committer::Sql { .. } => f.write_str("Committer::Sql"),
            Committer::Rest(_) => f.write_str("Committer::Rest"),
        }
    }
}

pub(crate) struct RestCommitter {
    uri: String,
    props: HashMap<String, String>,
    client: reqwest::Client,
    /// The bearer token (given, or from the OAuth2 client-credentials exchange) and the
    /// catalog's path prefix (from `GET /v1/config`), found on the first commit.
    session: Mutex<Option<(Option<String>, Option<String>)>>,
}

impl Committer {
    /// The committer of a catalog of `kind` `name` with iceberg-rust's properties `props`.
    pub(crate) fn new(
        name: &str,
        rest: bool,
        props: &HashMap<String, String>,
        client: reqwest::Client,
    ) -> Self {
        if rest {
            Committer::Rest(Box::new(RestCommitter {
                uri: props.get("uri").cloned().unwrap_or_default(),
                props: props.clone(),
                client,
                session: Mutex::new(None),
            }))
        } else {
            Committer::Sql {
                uri: props.get("uri").cloned().unwrap_or_default(),
                catalog: name.to_string(),
                dollar_binds: props
                    .get("sql_bind_style")
                    .is_some_and(|s| s == "DollarNumeric"),
            }
        }
    }

    /// Commits `updates` to `table` (as loaded: the change was made from it) when
    /// `requirements` hold; `qualified` names the table in errors.
    pub(crate) async fn commit(
        &self,
        table: &Table,
        qualified: &str,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<()> {
        match self {
            Committer::Sql {
                uri,
                catalog,
                dollar_binds,
            } => {
                commit_sql(
                    uri,
                    catalog,
                    *dollar_binds,
                    table,
                    qualified,
                    requirements,
                    updates,
                )
                .await
            }
            Committer::Rest(rest) => rest.commit(table, qualified, requirements, updates).await,
        }
    }
}

async fn commit_sql(
    uri: &str,
    catalog: &str,
    dollar_binds: bool,
    table: &Table,
    qualified: &str,
    requirements: Vec<TableRequirement>,
    updates: Vec<TableUpdate>,
) -> Result<()> {
    for requirement in &requirements {
        requirement
            .check(Some(table.metadata()))
            .map_err(|e| conflict(qualified, &error_text(&e)))?;
    }
    let current = table.metadata_location_result().map_err(iceberg_error)?;
    let mut builder = table
        .metadata()
        .clone()
        .into_builder(Some(current.to_string()));
    for update in updates {
        builder = update.apply(builder).map_err(iceberg_error)?;
    }
    let metadata = builder.build().map_err(iceberg_error)?.metadata;
    let location = MetadataLocation::from_str(current)
        .map_err(iceberg_error)?
        .with_next_version()
        .with_new_metadata(&metadata);
    metadata
        .write_to(table.file_io(), &location)
        .await
        .map_err(iceberg_error)?;
    let location = location.to_string();
    let ident = table.identifier();
    let sql = if dollar_binds {
        "UPDATE iceberg_tables SET metadata_location = $1, previous_metadata_location = $2 \
         WHERE catalog_name = $3 AND table_namespace = $4 AND table_name = $5 \
         AND metadata_location = $6"
    } else {
        "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
         WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? \
         AND metadata_location = ?"
    };
    sqlx::any::install_default_drivers();
    let mut conn = match <sqlx::AnyConnection as sqlx::Connection>::connect(uri).await {
        Ok(conn) => conn,
        Err(e) => {
            // Nothing was sent: the written metadata file is no one's.
            let _ = table.file_io().delete(&location).await;
            return Err(DataFusionError::Execution(format!(
                "cannot commit to `{qualified}`: cannot connect to its SQL catalog ({})",
                sql_error_kind(&e)
            )));
        }
    };
    let result = sqlx::query(sql)
        .bind(&location)
        .bind(current)
        .bind(catalog)
        .bind(ident.namespace().join("."))
        .bind(ident.name())
        .bind(current)
        .execute(&mut conn)
        .await;
    let rows = match result {
        Ok(done) => done.rows_affected(),
        Err(e) => {
            // The update may have happened: the metadata file stays (the catalog may name it).
            return Err(DataFusionError::Execution(format!(
                "cannot commit to `{qualified}`: its SQL catalog failed ({}); the commit may or \
                 may not have happened: check `{qualified}$snapshots`",
                sql_error_kind(&e)
            )));
        }
    };
    if rows == 0 {
        let _ = table.file_io().delete(&location).await;
        return Err(conflict(qualified, "its metadata location moved"));
    }
    Ok(())
}

/// What went wrong with the SQL catalog, without its URI (which may hold a password).
fn sql_error_kind(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => db.message().to_string(),
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::PoolTimedOut => "timed out".into(),
        sqlx::Error::Configuration(_) => "bad catalog URI".into(),
        other => other.to_string().chars().take(200).collect(),
    }
}

impl RestCommitter {
    fn prop(&self, key: &str) -> Option<&str> {
        self.props.get(key).map(String::as_str)
    }

    fn request(
        &self,
        method: reqwest::Method,
        url: &str,
        token: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut request = self.client.request(method, url);
        for (k, v) in &self.props {
            if let Some(header) = k.strip_prefix("header.") {
                request = request.header(header, v);
            }
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request
    }

    /// The bearer token and path prefix, found once.
    async fn session(&self) -> Result<(Option<String>, Option<String>)> {
        let mut session = self.session.lock().await;
        if let Some(found) = session.as_ref() {
            return Ok(found.clone());
        }
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            DataFusionError::Execution(format!("REST catalog at {}: {what}: {e}", self.uri))
        };
        let mut token = self.prop("token").map(str::to_string);
        if token.is_none()
            && let Some(credential) = self.prop("credential")
        {
            let (id, secret) = match credential.split_once(':') {
                Some((id, secret)) => (Some(id), secret),
                None => (None, credential),
            };
            let endpoint = self
                .prop("oauth2-server-uri")
                .map(str::to_string)
                .unwrap_or_else(|| format!("{}/v1/oauth/tokens", self.uri));
            let mut form = vec![
                ("grant_type", "client_credentials"),
                ("client_secret", secret),
                ("scope", self.prop("scope").unwrap_or("catalog")),
            ];
            if let Some(id) = id {
                form.push(("client_id", id));
            }
            let body = form
                .iter()
                .map(|(k, v)| format!("{k}={}", urlencode(v)))
                .collect::<Vec<_>>()
                .join("&");
            let request = self
                .request(reqwest::Method::POST, &endpoint, None)
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(body);
            let json = json_of(request)
                .await
                .map_err(|e| failed("the token request failed", &e))?;
            token = Some(
                json.get("access_token")
                    .and_then(|t| t.as_str())
                    .map(str::to_string)
                    .ok_or_else(|| failed("the token response", &"has no access_token"))?,
            );
        }
        let mut config_url = format!("{}/v1/config", self.uri);
        if let Some(warehouse) = self.prop("warehouse") {
            config_url.push_str(&format!("?warehouse={}", urlencode(warehouse)));
        }
        let request = self.request(reqwest::Method::GET, &config_url, token.as_deref());
        let json = json_of(request)
            .await
            .map_err(|e| failed("reading its config failed", &e))?;
        // As iceberg-rust merges them: the server's defaults, then the user's properties,
        // then the server's overrides.
        let server = |k: &str| json.get(k)?.get("prefix")?.as_str().map(str::to_string);
        let prefix = server("overrides")
            .or_else(|| self.prop("prefix").map(str::to_string))
            .or_else(|| server("defaults"));
        *session = Some((token.clone(), prefix.clone()));
        Ok((token, prefix))
    }

    async fn commit(
        &self,
        table: &Table,
        qualified: &str,
        requirements: Vec<TableRequirement>,
        updates: Vec<TableUpdate>,
    ) -> Result<()> {
        let body = CommitTableRequest {
            identifier: Some(table.identifier().clone()),
            requirements,
            updates,
        };
        let body = serde_json::to_vec(&body).map_err(|e| {
            DataFusionError::Internal(format!("cannot encode a commit of `{qualified}`: {e}"))
        })?;
        match self.post_commit(table, qualified, body.clone()).await? {
            Some(status) if status == reqwest::StatusCode::UNAUTHORIZED => {
                // An expired token: a new one, once.
                *self.session.lock().await = None;
                match self.post_commit(table, qualified, body).await? {
                    None => Ok(()),
                    Some(status) => Err(DataFusionError::Execution(format!(
                        "cannot commit to `{qualified}`: the REST catalog answered {status} \
                         (check the catalog's token or credential)"
                    ))),
                }
            }
            Some(status) => Err(DataFusionError::Execution(format!(
                "cannot commit to `{qualified}`: the REST catalog answered {status}"
            ))),
            None => Ok(()),
        }
    }

    /// Sends a commit; `None` when it was accepted, the status when it was refused as
    /// unauthorized (errors otherwise).
    async fn post_commit(
        &self,
        table: &Table,
        qualified: &str,
        body: Vec<u8>,
    ) -> Result<Option<reqwest::StatusCode>> {
        let (token, prefix) = self.session().await?;
        let ident = table.identifier();
        let bad_uri = |e: &dyn std::fmt::Display| {
            DataFusionError::Plan(format!(
                "the REST catalog's uri `{}` is not a URL: {e}",
                self.uri
            ))
        };
        let mut url = url::Url::parse(&self.uri).map_err(|e| bad_uri(&e))?;
        {
            let mut segments = url.path_segments_mut().map_err(|_| bad_uri(&"no path"))?;
            segments.pop_if_empty().push("v1");
            for part in prefix
                .iter()
                .flat_map(|p| p.split('/'))
                .filter(|p| !p.is_empty())
            {
                segments.push(part);
            }
            let namespace = ident.namespace().join("\u{1f}");
            segments.extend(["namespaces", namespace.as_str(), "tables", ident.name()]);
        }
        let url = url.to_string();
        let response = self
            .request(reqwest::Method::POST, &url, token.as_deref())
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| {
                DataFusionError::Execution(format!(
                    "cannot commit to `{qualified}`: the REST catalog did not answer ({e}); \
                     the commit may or may not have happened: check `{qualified}$snapshots`"
                ))
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(None);
        }
        if status == reqwest::StatusCode::UNAUTHORIZED {
            return Ok(Some(status));
        }
        let text: String = response
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .take(500)
            .collect();
        if status == reqwest::StatusCode::CONFLICT {
            return Err(conflict(qualified, &text));
        }
        if status.is_server_error() {
            return Err(DataFusionError::Execution(format!(
                "cannot commit to `{qualified}`: the REST catalog answered {status} ({text}); \
                 the commit may or may not have happened: check `{qualified}$snapshots`"
            )));
        }
        Err(DataFusionError::Execution(format!(
            "cannot commit to `{qualified}`: the REST catalog answered {status}: {text}"
        )))
    }
}

/// The JSON a request answers with; the error says what went wrong (never the request).
async fn json_of(
    request: reqwest::RequestBuilder,
) -> std::result::Result<serde_json::Value, String> {
    let response = request.send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(format!("answered {status}"));
    }
    serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))
}

fn urlencode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// What a snapshot that replaces files did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replaced {
    pub removed_files: usize,
    pub removed_rows: u64,
}

/// A new snapshot of `table` (as loaded) on `main` without the live data files for which
/// `remove` is true; the manifests holding them are written again with those entries marked
/// deleted (the others kept as existing), the rest are carried over. Nothing is committed
/// when nothing is removed.
pub(crate) async fn remove_files(
    committer: &Committer,
    table: &Table,
    qualified: &str,
    remove: impl Fn(&DataFile, &PartitionSpec) -> Result<bool>,
) -> Result<Replaced> {
    replace_files(committer, table, qualified, remove, Vec::new(), &[], false).await
}

/// [`remove_files`], and `added` (data files written under the table's default partition
/// spec) added in the same snapshot: an `overwrite` when both happen, an `append` when
/// nothing is removed (still only while `main` is where it was). `properties` go into the
/// snapshot's summary. `compaction`: the same rows in other files (operation `replace`).
pub(crate) async fn replace_files(
    committer: &Committer,
    table: &Table,
    qualified: &str,
    remove: impl Fn(&DataFile, &PartitionSpec) -> Result<bool>,
    added: Vec<DataFile>,
    properties: &[(&str, &str)],
    compaction: bool,
) -> Result<Replaced> {
    if table.metadata().current_snapshot().is_none() {
        return Ok(Replaced::default());
    }
    change_files(
        committer,
        table,
        qualified,
        remove,
        added,
        properties,
        compaction,
        Vec::new(),
    )
    .await
}

/// `added` (data files under the table's default partition spec, written or found elsewhere)
/// appended to `table` as loaded, in one snapshot with `updates` (e.g. a property the files
/// need), also to a table without a snapshot yet; only while `main` is where it was.
pub(crate) async fn append_files(
    committer: &Committer,
    table: &Table,
    qualified: &str,
    added: Vec<DataFile>,
    properties: &[(&str, &str)],
    updates: Vec<TableUpdate>,
) -> Result<()> {
    change_files(
        committer,
        table,
        qualified,
        |_, _| Ok(false),
        added,
        properties,
        false,
        updates,
    )
    .await
    .map(|_| ())
}

#[allow(clippy::too_many_arguments)]
async fn change_files(
    committer: &Committer,
    table: &Table,
    qualified: &str,
    remove: impl Fn(&DataFile, &PartitionSpec) -> Result<bool>,
    added: Vec<DataFile>,
    properties: &[(&str, &str)],
    compaction: bool,
    extra_updates: Vec<TableUpdate>,
) -> Result<Replaced> {
    let metadata = table.metadata();
    let base = metadata.current_snapshot();
    let v1 = match metadata.format_version() {
        FormatVersion::V1 => true,
        FormatVersion::V2 => false,
        other => {
            return Err(DataFusionError::NotImplemented(format!(
                "deleting from `{qualified}` (Iceberg format {other}) is not supported yet: \
                 Basin writes format 1 and 2 snapshots"
            )));
        }
    };
    let file_io = table.file_io();
    let schema = metadata.current_schema().clone();
    let existing: HashSet<i64> = metadata.snapshots().map(|s| s.snapshot_id()).collect();
    let snapshot_id = loop {
        let id = (uuid::Uuid::new_v4().as_u64_pair().0 & (i64::MAX as u64)) as i64;
        if id != 0 && !existing.contains(&id) {
            break id;
        }
    };
    let sequence = metadata.next_sequence_number();
    let commit_uuid = uuid::Uuid::new_v4();
    let listed: Vec<ManifestFile> = match base {
        Some(base) => table
            .manifest_list_reader(base)
            .load()
            .await
            .map_err(iceberg_error)?
            .entries()
            .to_vec(),
        None => Vec::new(),
    };
    let mut manifests: Vec<ManifestFile> = Vec::with_capacity(listed.len() + 1);
    let mut summary = SnapshotSummaryCollector::default();
    let mut replaced = Replaced::default();
    let mut removed_bytes = 0u64;
    for (n, manifest) in listed.iter().enumerate() {
        if manifest.content != ManifestContentType::Data {
            manifests.push(manifest.clone());
            continue;
        }
        let loaded = manifest
            .load_manifest(file_io)
            .await
            .map_err(iceberg_error)?;
        let spec = metadata
            .partition_spec_by_id(manifest.partition_spec_id)
            .ok_or_else(|| {
                DataFusionError::Execution(format!(
                    "`{qualified}`: manifest {} names partition spec {}, which the table does \
                     not have",
                    manifest.manifest_path, manifest.partition_spec_id
                ))
            })?;
        let mut removed = Vec::with_capacity(loaded.entries().len());
        for entry in loaded.entries() {
            removed.push(entry.is_alive() && remove(&entry.data_file, spec)?);
        }
        if !removed.contains(&true) {
            manifests.push(manifest.clone());
            continue;
        }
        let path = format!(
            "{}/metadata/{commit_uuid}-m{n}.avro",
            metadata.location().trim_end_matches('/')
        );
        let output = file_io.new_output(&path).map_err(iceberg_error)?;
        if let Err(e) = spec.partition_type(&schema) {
            return Err(DataFusionError::NotImplemented(format!(
                "`{qualified}`: files written under partition spec {} cannot be removed: its \
                 columns are no longer all in the table's schema ({})",
                spec.spec_id(),
                error_text(&e)
            )));
        }
        let builder = ManifestWriterBuilder::new(
            output,
            Some(snapshot_id),
            schema.clone(),
            spec.as_ref().clone(),
        );
        let mut writer = if v1 {
            builder.build_v1()
        } else {
            builder.build_v2_data()
        };
        for (entry, removed) in loaded.entries().iter().zip(removed) {
            if !entry.is_alive() {
                continue;
            }
            let file = entry.data_file.clone();
            let sequence_number = entry.sequence_number.unwrap_or(0);
            if removed {
                replaced.removed_files += 1;
                replaced.removed_rows += file.record_count();
                removed_bytes += file.file_size_in_bytes();
                summary.remove_file(&file, schema.clone(), spec.clone());
                writer
                    .add_delete_file(
                        file,
                        sequence_number,
                        entry.file_sequence_number.or(entry.sequence_number),
                    )
                    .map_err(iceberg_error)?;
            } else {
                writer
                    .add_existing_file(
                        file,
                        entry.snapshot_id.unwrap_or(manifest.added_snapshot_id),
                        sequence_number,
                        entry.file_sequence_number.or(entry.sequence_number),
                    )
                    .map_err(iceberg_error)?;
            }
        }
        manifests.push(writer.write_manifest_file().await.map_err(iceberg_error)?);
    }
    if replaced.removed_files == 0 && added.is_empty() {
        return Ok(replaced);
    }
    let mut added_bytes = 0u64;
    let mut added_rows = 0u64;
    let added_files = added.len() as u64;
    if !added.is_empty() {
        let spec = metadata.default_partition_spec().clone();
        let path = format!(
            "{}/metadata/{commit_uuid}-m{}.avro",
            metadata.location().trim_end_matches('/'),
            listed.len()
        );
        let output = file_io.new_output(&path).map_err(iceberg_error)?;
        let builder = ManifestWriterBuilder::new(
            output,
            Some(snapshot_id),
            schema.clone(),
            spec.as_ref().clone(),
        );
        let mut writer = if v1 {
            builder.build_v1()
        } else {
            builder.build_v2_data()
        };
        for file in added {
            added_bytes += file.file_size_in_bytes();
            added_rows += file.record_count();
            summary.add_file(&file, schema.clone(), spec.clone());
            writer
                .add_file(file, if v1 { -1 } else { sequence })
                .map_err(iceberg_error)?;
        }
        // The new files first: readers plan newer manifests first.
        manifests.insert(
            0,
            writer.write_manifest_file().await.map_err(iceberg_error)?,
        );
    }
    let list_path = format!(
        "{}/metadata/snap-{snapshot_id}-1-{commit_uuid}.avro",
        metadata.location().trim_end_matches('/')
    );
    let list_file = file_io
        .new_output(&list_path)
        .map_err(iceberg_error)?
        .writer()
        .await
        .map_err(iceberg_error)?;
    let parent = base.map(|b| b.snapshot_id());
    let mut list_writer = if v1 {
        ManifestListWriter::v1(list_file, snapshot_id, parent)
    } else {
        ManifestListWriter::v2(list_file, snapshot_id, parent, sequence)
    };
    list_writer
        .add_manifests(manifests.into_iter())
        .map_err(iceberg_error)?;
    list_writer.close().await.map_err(iceberg_error)?;

    // The summary: what changed, and the table's totals after it.
    let mut props = summary.build();
    let none = std::collections::HashMap::new();
    let previous = base.map_or(&none, |b| &b.summary().additional_properties);
    let total = |key: &str, plus: u64, minus: u64| {
        let before = match base {
            Some(_) => previous.get(key).and_then(|v| v.parse::<u64>().ok()),
            None => Some(0),
        };
        before.map(|v| (v + plus).saturating_sub(minus).to_string())
    };
    for (key, plus, minus) in [
        (
            "total-data-files",
            added_files,
            replaced.removed_files as u64,
        ),
        ("total-records", added_rows, replaced.removed_rows),
        ("total-files-size", added_bytes, removed_bytes),
        ("total-delete-files", 0, 0),
        ("total-position-deletes", 0, 0),
        ("total-equality-deletes", 0, 0),
    ] {
        if let Some(v) = total(key, plus, minus) {
            props.insert(key.to_string(), v);
        }
    }
    for (key, value) in properties {
        props.insert(key.to_string(), value.to_string());
    }
    let snapshot = Snapshot::builder()
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(parent)
        .with_sequence_number(sequence)
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
        .with_manifest_list(list_path)
        .with_summary(Summary {
            operation: match (replaced.removed_files, added_files) {
                _ if compaction => Operation::Replace,
                (0, _) => Operation::Append,
                (_, 0) => Operation::Delete,
                _ => Operation::Overwrite,
            },
            additional_properties: props,
        })
        .with_schema_id(metadata.current_schema_id())
        .build();
    let mut updates = extra_updates;
    updates.extend([
        TableUpdate::AddSnapshot { snapshot },
        TableUpdate::SetSnapshotRef {
            ref_name: MAIN.to_string(),
            reference: SnapshotReference::new(snapshot_id, main_retention(table)),
        },
    ]);
    // Test hook: die with the files and the manifests written and nothing committed, as a
    // front end killed at that moment would. The table must stay at its old snapshot.
    if std::env::var_os("BASIN_TEST_KILL_BEFORE_COMMIT").is_some() {
        tracing::error!(table = %qualified, "BASIN_TEST_KILL_BEFORE_COMMIT is set: aborting before the commit");
        std::process::abort();
    }
    committer
        .commit(table, qualified, main_unchanged(table, parent), updates)
        .await?;
    Ok(replaced)
}

/// `main`'s retention settings, kept when `main` moves (iceberg-rust 0.10 does not expose
/// the refs but through the metadata's JSON form).
fn main_retention(table: &Table) -> SnapshotRetention {
    serde_json::to_value(table.metadata())
        .ok()
        .and_then(|m| m.get("refs")?.get(MAIN).cloned())
        .and_then(|r| serde_json::from_value::<SnapshotReference>(r).ok())
        .map(|r| r.retention)
        .unwrap_or_else(|| SnapshotRetention::branch(None, None, None))
}

/// The requirements of a change made from `table` as loaded: the same table, `main` at `at`.
fn main_unchanged(table: &Table, at: Option<i64>) -> Vec<TableRequirement> {
    vec![
        TableRequirement::UuidMatch {
            uuid: table.metadata().uuid(),
        },
        TableRequirement::RefSnapshotIdMatch {
            r#ref: MAIN.to_string(),
            snapshot_id: at,
        },
    ]
}

/// Points `main` of `table` (as loaded) at `snapshot_id`, one of its snapshots.
pub(crate) async fn set_main(
    committer: &Committer,
    table: &Table,
    qualified: &str,
    snapshot_id: i64,
) -> Result<()> {
    if table.metadata().snapshot_by_id(snapshot_id).is_none() {
        return Err(DataFusionError::Plan(format!(
            "`{qualified}` has no snapshot {snapshot_id} (see `{qualified}$snapshots`)"
        )));
    }
    let at = table.metadata().current_snapshot().map(|s| s.snapshot_id());
    let updates = vec![TableUpdate::SetSnapshotRef {
        ref_name: MAIN.to_string(),
        reference: SnapshotReference::new(snapshot_id, main_retention(table)),
    }];
    committer
        .commit(table, qualified, main_unchanged(table, at), updates)
        .await
}

/// Whether `ancestor` is `snapshot_id` or one of its ancestors in `table`.
pub(crate) fn is_ancestor(table: &Table, snapshot_id: i64, ancestor: i64) -> bool {
    let mut at = Some(snapshot_id);
    let mut steps = 0;
    while let Some(id) = at {
        if id == ancestor {
            return true;
        }
        steps += 1;
        if steps > table.metadata().snapshots().len() {
            return false;
        }
        at = table
            .metadata()
            .snapshot_by_id(id)
            .and_then(|s| s.parent_snapshot_id());
    }
    false
}
