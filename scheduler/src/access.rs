//! Authorization: who may see and change which catalogs, schemas, tables and columns, from a
//! rules file in the spirit of Trino's file-based access control (docs/security.md).
//!
//! ```text
//!  [security] rules_file ──► AccessControl (reloaded when the file changes)
//!  Flight SQL session of user u ──► catalogs seen through GuardedCatalogList:
//!      catalogs, schemas, tables u may not use are not there (SHOW, information_schema,
//!      GetTables, queries: "not found"); a table with a row filter, denied columns or
//!      masks is a view: Filter(filter) ─ Projection(masks, allowed columns) ─ the table,
//!      inlined before the optimizer, so pushdown carries the filter and the masks to the
//!      source and a masked column is never fetched in the clear
//!  sql::plan ──► check_privileges: INSERT/UPDATE/DELETE/MERGE/DDL/procedures need theirs
//! ```
//!
//! First matching rule wins. A section that is absent allows everything it would govern; a
//! section that is present denies what none of its rules matches.

use std::any::Any;
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use basin_core::{BasinError, Result as BasinResult};
use datafusion::catalog::{CatalogProvider, CatalogProviderList, SchemaProvider, TableProvider};
use datafusion::common::{DFSchema, TableReference};
use datafusion::datasource::provider_as_source;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlanBuilder, col};
use datafusion::prelude::SessionContext;
use regex::Regex;
use serde::Deserialize;

/// What a rule may grant on a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Privilege {
    Select,
    Insert,
    Delete,
    Update,
    /// DDL and maintenance: CREATE, DROP, ALTER, procedures.
    Ownership,
}

impl Privilege {
    fn parse(text: &str) -> std::result::Result<Self, String> {
        match text.to_ascii_uppercase().as_str() {
            "SELECT" => Ok(Self::Select),
            "INSERT" => Ok(Self::Insert),
            "DELETE" => Ok(Self::Delete),
            "UPDATE" => Ok(Self::Update),
            "OWNERSHIP" => Ok(Self::Ownership),
            other => Err(format!(
                "unknown privilege `{other}` (SELECT, INSERT, DELETE, UPDATE, OWNERSHIP)"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Select => "SELECT",
            Self::Insert => "INSERT",
            Self::Delete => "DELETE",
            Self::Update => "UPDATE",
            Self::Ownership => "OWNERSHIP",
        }
    }
}

/// A user and the groups the users file gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub user: String,
    pub groups: Vec<String>,
}

/// How much of a catalog a catalog rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CatalogAccess {
    All,
    ReadOnly,
    None,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesSpec {
    catalogs: Option<Vec<CatalogRuleSpec>>,
    tables: Option<Vec<TableRuleSpec>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogRuleSpec {
    user: Option<String>,
    group: Option<String>,
    catalog: Option<String>,
    allow: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableRuleSpec {
    user: Option<String>,
    group: Option<String>,
    catalog: Option<String>,
    schema: Option<String>,
    table: Option<String>,
    #[serde(default)]
    privileges: Vec<String>,
    #[serde(default)]
    columns: Vec<ColumnRule>,
    filter: Option<String>,
}

/// A column's treatment by a table rule.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ColumnRule {
    pub name: String,
    /// `false`: the column is not there for the user.
    #[serde(default = "yes")]
    pub allow: bool,
    /// A SQL expression over the table's columns the user sees instead of the value (its
    /// result is cast to the column's type).
    pub mask: Option<String>,
}

fn yes() -> bool {
    true
}

/// Who a rule is for.
#[derive(Debug)]
struct Who {
    user: Option<Regex>,
    group: Option<Regex>,
}

impl Who {
    fn matches(&self, subject: &Subject) -> bool {
        self.user.as_ref().is_none_or(|r| r.is_match(&subject.user))
            && self
                .group
                .as_ref()
                .is_none_or(|r| subject.groups.iter().any(|g| r.is_match(g)))
    }
}

#[derive(Debug)]
struct CatalogRule {
    who: Who,
    catalog: Option<Regex>,
    allow: CatalogAccess,
}

#[derive(Debug)]
struct TableRule {
    who: Who,
    catalog: Option<Regex>,
    schema: Option<Regex>,
    table: Option<Regex>,
    privileges: BTreeSet<Privilege>,
    columns: Vec<ColumnRule>,
    filter: Option<String>,
}

fn matches(pattern: &Option<Regex>, value: &str) -> bool {
    pattern.as_ref().is_none_or(|r| r.is_match(value))
}

/// The rules of one version of the file.
#[derive(Debug, Default)]
pub struct Rules {
    catalogs: Option<Vec<CatalogRule>>,
    tables: Option<Vec<TableRule>>,
}

/// What a user may do with one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub privileges: BTreeSet<Privilege>,
    pub columns: Vec<ColumnRule>,
    pub filter: Option<String>,
}

impl Grant {
    fn all() -> Self {
        Self {
            privileges: [
                Privilege::Select,
                Privilege::Insert,
                Privilege::Delete,
                Privilege::Update,
                Privilege::Ownership,
            ]
            .into(),
            columns: vec![],
            filter: None,
        }
    }

    fn none() -> Self {
        Self {
            privileges: BTreeSet::new(),
            columns: vec![],
            filter: None,
        }
    }

    /// Whether reading the table goes through a view (a filter, denied or masked columns).
    fn restricts_reads(&self) -> bool {
        self.filter.is_some() || self.columns.iter().any(|c| !c.allow || c.mask.is_some())
    }
}

impl Rules {
    fn parse(text: &str, json: bool) -> std::result::Result<Self, String> {
        let spec: RulesSpec = if json {
            serde_json::from_str(text).map_err(|e| e.to_string())?
        } else {
            toml::from_str(text).map_err(|e| e.to_string())?
        };
        let regex =
            |what: &str, p: &Option<String>| -> std::result::Result<Option<Regex>, String> {
                p.as_ref()
                    .map(|p| {
                        Regex::new(&format!("^(?:{p})$"))
                            .map_err(|e| format!("{what} pattern `{p}`: {e}"))
                    })
                    .transpose()
            };
        let who = |user: &Option<String>, group: &Option<String>| {
            Ok::<_, String>(Who {
                user: regex("user", user)?,
                group: regex("group", group)?,
            })
        };
        let catalogs = spec
            .catalogs
            .map(|rules| {
                rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let at = |e: String| format!("catalogs rule {}: {e}", i + 1);
                        Ok(CatalogRule {
                            who: who(&r.user, &r.group).map_err(at)?,
                            catalog: regex("catalog", &r.catalog).map_err(at)?,
                            allow: match r.allow.to_ascii_lowercase().as_str() {
                                "all" => CatalogAccess::All,
                                "read-only" => CatalogAccess::ReadOnly,
                                "none" => CatalogAccess::None,
                                other => {
                                    return Err(at(format!(
                                        "allow = `{other}`: use all, read-only or none"
                                    )));
                                }
                            },
                        })
                    })
                    .collect::<std::result::Result<Vec<_>, String>>()
            })
            .transpose()?;
        let tables = spec
            .tables
            .map(|rules| {
                rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let at = |e: String| format!("tables rule {}: {e}", i + 1);
                        Ok(TableRule {
                            who: who(&r.user, &r.group).map_err(at)?,
                            catalog: regex("catalog", &r.catalog).map_err(at)?,
                            schema: regex("schema", &r.schema).map_err(at)?,
                            table: regex("table", &r.table).map_err(at)?,
                            privileges: r
                                .privileges
                                .iter()
                                .map(|p| Privilege::parse(p))
                                .collect::<std::result::Result<_, _>>()
                                .map_err(at)?,
                            columns: r.columns.clone(),
                            filter: r.filter.clone(),
                        })
                    })
                    .collect::<std::result::Result<Vec<_>, String>>()
            })
            .transpose()?;
        Ok(Self { catalogs, tables })
    }

    fn catalog_access(&self, subject: &Subject, catalog: &str) -> CatalogAccess {
        match &self.catalogs {
            None => CatalogAccess::All,
            Some(rules) => rules
                .iter()
                .find(|r| r.who.matches(subject) && matches(&r.catalog, catalog))
                .map_or(CatalogAccess::None, |r| r.allow),
        }
    }

    /// What `subject` may do with `catalog.schema.table`.
    pub fn grant(&self, subject: &Subject, catalog: &str, schema: &str, table: &str) -> Grant {
        // The system's own views list only what the rules let through.
        if schema == "information_schema" {
            return Grant {
                privileges: [Privilege::Select].into(),
                ..Grant::none()
            };
        }
        let access = self.catalog_access(subject, catalog);
        if access == CatalogAccess::None {
            return Grant::none();
        }
        let mut grant = match &self.tables {
            None => Grant::all(),
            Some(rules) => rules
                .iter()
                .find(|r| {
                    r.who.matches(subject)
                        && matches(&r.catalog, catalog)
                        && matches(&r.schema, schema)
                        && matches(&r.table, table)
                })
                .map_or_else(Grant::none, |r| Grant {
                    privileges: r.privileges.clone(),
                    columns: r.columns.clone(),
                    filter: r.filter.clone(),
                }),
        };
        if access == CatalogAccess::ReadOnly {
            grant.privileges.retain(|p| *p == Privilege::Select);
        }
        grant
    }

    /// Whether some rule may give `subject` something in `catalog` (`schema`): what is shown.
    fn may_see(&self, subject: &Subject, catalog: &str, schema: Option<&str>) -> bool {
        if schema == Some("information_schema") {
            return self.catalog_access(subject, catalog) != CatalogAccess::None;
        }
        if self.catalog_access(subject, catalog) == CatalogAccess::None {
            return false;
        }
        match &self.tables {
            None => true,
            Some(rules) => rules.iter().any(|r| {
                r.who.matches(subject)
                    && !r.privileges.is_empty()
                    && matches(&r.catalog, catalog)
                    && schema.is_none_or(|s| matches(&r.schema, s))
            }),
        }
    }
}

/// The rules file, read again when it changes.
pub struct AccessControl {
    path: PathBuf,
    loaded: Mutex<(Option<SystemTime>, Arc<Rules>)>,
}

impl fmt::Debug for AccessControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AccessControl({})", self.path.display())
    }
}

impl AccessControl {
    /// Reads the rules file (JSON when its name ends in `.json`, else TOML).
    pub fn load(path: &Path) -> BasinResult<Self> {
        let (modified, rules) = read_rules(path).map_err(BasinError::Invalid)?;
        Ok(Self {
            path: path.to_path_buf(),
            loaded: Mutex::new((modified, Arc::new(rules))),
        })
    }

    /// The rules as last read (no file access: for lookups below a catalog).
    pub fn rules(&self) -> Arc<Rules> {
        self.loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// The rules now: read again when the file changed. A file that no longer parses keeps
    /// the last good rules (and says why in the log). One `stat` per call: called where a
    /// statement or a listing starts looking up catalogs, not per table.
    pub fn current(&self) -> Arc<Rules> {
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if modified.is_some() && modified != loaded.0 {
            match read_rules(&self.path) {
                Ok((m, rules)) => {
                    tracing::info!(file = %self.path.display(), "access rules reloaded");
                    *loaded = (m, Arc::new(rules));
                }
                Err(why) => {
                    tracing::error!(%why, "access rules file changed but cannot be read; the previous rules stay");
                    loaded.0 = modified;
                }
            }
        }
        loaded.1.clone()
    }
}

fn read_rules(path: &Path) -> std::result::Result<(Option<SystemTime>, Rules), String> {
    let bad = |e: &dyn fmt::Display| format!("access rules file {}: {e}", path.display());
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map_err(|e| bad(&e))?;
    let text = std::fs::read_to_string(path).map_err(|e| bad(&e))?;
    let json = path.extension().is_some_and(|e| e == "json");
    let rules = Rules::parse(&text, json).map_err(|e| bad(&e))?;
    Ok((Some(modified), rules))
}

/// The access of one session's user.
#[derive(Debug, Clone)]
pub struct SessionAccess {
    pub control: Arc<AccessControl>,
    pub subject: Subject,
}

impl SessionAccess {
    pub fn grant(&self, catalog: &str, schema: &str, table: &str) -> Grant {
        self.control
            .rules()
            .grant(&self.subject, catalog, schema, table)
    }

    /// Fails unless the user has `privilege` on the table: the error says what was refused
    /// and on what, as the user named it.
    pub fn require(
        &self,
        privilege: Privilege,
        table: &TableReference,
        defaults: (&str, &str),
    ) -> Result<()> {
        let resolved = table.clone().resolve(defaults.0, defaults.1);
        let name = strip_version(&resolved.table);
        let grant = self.grant(&resolved.catalog, &resolved.schema, name);
        // A table seen through a filter or column rules is not the user's to reshape (a
        // renamed hidden column would be seen).
        if privilege == Privilege::Ownership && grant.restricts_reads() {
            return Err(DataFusionError::Plan(format!(
                "access denied: user `{}` sees `{table}` through a row filter or column rules \
                 and may not change its definition ([security] rules_file)",
                self.subject.user
            )));
        }
        if grant.privileges.contains(&privilege) {
            return Ok(());
        }
        Err(DataFusionError::Plan(format!(
            "access denied: user `{}` may not {} {} `{table}` ([security] rules_file)",
            self.subject.user,
            privilege.name(),
            match privilege {
                Privilege::Select => "from",
                Privilege::Insert => "into",
                Privilege::Ownership => "change",
                _ => "rows of",
            }
        )))
    }

    /// Fails unless the user may read all of the table (no filter, no column rules): for
    /// what shows its whole definition. A table the user may not read is "not found".
    pub fn require_whole(&self, table: &TableReference) -> Result<()> {
        let grant = self.grant(
            table.catalog().unwrap_or_default(),
            table.schema().unwrap_or_default(),
            strip_version(table.table()),
        );
        if !grant.privileges.contains(&Privilege::Select) {
            return Err(DataFusionError::Plan(format!("table `{table}` not found")));
        }
        if grant.restricts_reads() {
            return Err(DataFusionError::Plan(format!(
                "access denied: user `{}` sees `{table}` through a row filter or column rules; \
                 its definition is not shown ([security] rules_file)",
                self.subject.user
            )));
        }
        Ok(())
    }

    /// `inner`, seen by this user.
    pub fn guard(
        self: &Arc<Self>,
        inner: Arc<dyn CatalogProviderList>,
    ) -> Arc<dyn CatalogProviderList> {
        Arc::new(GuardedCatalogList {
            inner,
            access: self.clone(),
        })
    }
}

/// Checks that the session's user may run `plan`: SELECT on every table it reads, and the
/// privilege of every change it makes (INSERT, UPDATE, DELETE; MERGE needs all three;
/// OWNERSHIP for DDL and procedures). Tables the user may not use at all were never found.
pub fn check_plan(
    access: &SessionAccess,
    plan: &datafusion::logical_expr::LogicalPlan,
    defaults: (&str, &str),
) -> Result<()> {
    use datafusion::common::tree_node::TreeNodeRecursion;
    use datafusion::logical_expr::{DdlStatement, LogicalPlan, WriteOp};
    let iceberg = |catalog: &str, namespace: &[String], name: &str| {
        TableReference::full(catalog, namespace.join("."), name)
    };
    let mut targets: Vec<TableReference> = Vec::new();
    let check =
        |privilege: Privilege, table: &TableReference| access.require(privilege, table, defaults);
    plan.apply_with_subqueries(|node| {
        match node {
            LogicalPlan::Dml(dml) => {
                let privilege = match &dml.op {
                    WriteOp::Insert(_) => Privilege::Insert,
                    WriteOp::Delete => Privilege::Delete,
                    WriteOp::Update => Privilege::Update,
                    WriteOp::Ctas | WriteOp::Truncate => Privilege::Ownership,
                };
                check(privilege, &dml.table_name)?;
                targets.push(dml.table_name.clone());
            }
            LogicalPlan::Ddl(ddl) => {
                let object = match ddl {
                    DdlStatement::CreateExternalTable(c) => Some(c.name.clone()),
                    DdlStatement::CreateMemoryTable(c) => Some(c.name.clone()),
                    DdlStatement::CreateView(c) => Some(c.name.clone()),
                    DdlStatement::DropTable(d) => Some(d.name.clone()),
                    DdlStatement::DropView(d) => Some(d.name.clone()),
                    DdlStatement::CreateCatalogSchema(c) => {
                        let (catalog, schema) = c
                            .schema_name
                            .split_once('.')
                            .unwrap_or((defaults.0, c.schema_name.as_str()));
                        Some(TableReference::full(catalog, schema, ""))
                    }
                    DdlStatement::DropCatalogSchema(d) => {
                        let (catalog, schema) = match &d.name {
                            datafusion::common::SchemaReference::Bare { schema } => {
                                (defaults.0.to_string(), schema.to_string())
                            }
                            datafusion::common::SchemaReference::Full { catalog, schema } => {
                                (catalog.to_string(), schema.to_string())
                            }
                        };
                        Some(TableReference::full(catalog, schema, ""))
                    }
                    _ => None,
                };
                match object {
                    Some(object) => check(Privilege::Ownership, &object)?,
                    None => {
                        return Err(DataFusionError::Plan(format!(
                            "access denied: user `{}` may not run this statement while access \
                             rules are configured",
                            access.subject.user
                        )));
                    }
                }
            }
            LogicalPlan::Extension(e) => {
                if let Some(change) = iceberg_change(e.node.as_ref()) {
                    for privilege in change.privileges {
                        check(*privilege, &change.table)?;
                    }
                    // CREATE TABLE … AS reads its query (not an input of the node).
                    if let Some(query) = change.query {
                        check_plan(access, query, defaults)?;
                    }
                    if change.reads_target {
                        targets.push(change.table);
                    }
                }
            }
            LogicalPlan::TableScan(scan) => {
                let own = |t: &TableReference| {
                    t.clone().resolve(defaults.0, defaults.1)
                        == scan.table_name.clone().resolve(defaults.0, defaults.1)
                };
                // A MERGE reads its target under its alias, with each row's identity: known
                // by the table it reads, not by the name.
                let merge_target = datafusion::datasource::source_as_provider(&scan.source)
                    .ok()
                    .and_then(|p| {
                        p.as_any()
                            .downcast_ref::<basin_connectors::iceberg::IcebergTableProvider>()
                            .filter(|t| t.spec().row_identity)
                            .map(|t| {
                                let spec = t.spec();
                                iceberg(&spec.catalog, &spec.namespace, &spec.name)
                            })
                    });
                // A change's own target is read to find its rows.
                let is_target = match &merge_target {
                    Some(target) => targets.contains(target),
                    None => targets.iter().any(own),
                };
                if !is_target {
                    check(Privilege::Select, &scan.table_name)?;
                }
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map(|_| ())
}

/// `SHOW GRANTS`: what the session's user may do with each table they can see — one row per
/// table: catalog, schema, table, privileges, the row filter, the columns hidden from them
/// and the masked ones. Without access rules every user may do everything.
pub async fn show_grants(ctx: &SessionContext) -> Result<datafusion::logical_expr::LogicalPlan> {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let access = ctx
        .state_ref()
        .read()
        .config()
        .get_extension::<SessionAccess>();
    let user = access
        .as_ref()
        .map_or_else(|| "anonymous".to_string(), |a| a.subject.user.clone());
    let mut rows: Vec<[String; 8]> = Vec::new();
    let mut catalogs = ctx.catalog_names();
    catalogs.sort();
    for catalog in catalogs {
        let Some(provider) = ctx.catalog(&catalog) else {
            continue;
        };
        let mut schemas = provider.schema_names();
        schemas.sort();
        for schema in schemas.into_iter().filter(|s| s != "information_schema") {
            let Some(tables) = provider.schema(&schema) else {
                continue;
            };
            let mut names = tables.table_names();
            names.sort();
            for table in names {
                let grant = match &access {
                    Some(access) => access.grant(&catalog, &schema, &table),
                    None => Grant::all(),
                };
                if grant.privileges.is_empty() {
                    continue;
                }
                let list = |pick: &dyn Fn(&ColumnRule) -> bool| {
                    grant
                        .columns
                        .iter()
                        .filter(|c| pick(c))
                        .map(|c| c.name.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                rows.push([
                    user.clone(),
                    catalog.clone(),
                    schema.clone(),
                    table,
                    grant
                        .privileges
                        .iter()
                        .map(|p| p.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                    grant.filter.clone().unwrap_or_default(),
                    list(&|c| !c.allow),
                    list(&|c| c.allow && c.mask.is_some()),
                ]);
            }
        }
    }
    let names = [
        "user",
        "table_catalog",
        "table_schema",
        "table_name",
        "privileges",
        "row_filter",
        "hidden_columns",
        "masked_columns",
    ];
    // A VALUES plan (no table to scan, so no privilege to check for it).
    if rows.is_empty() {
        let schema = Schema::new(
            names
                .iter()
                .map(|n| Field::new(*n, DataType::Utf8, false))
                .collect::<Vec<_>>(),
        );
        return Ok(datafusion::logical_expr::LogicalPlan::EmptyRelation(
            datafusion::logical_expr::EmptyRelation {
                produce_one_row: false,
                schema: Arc::new(DFSchema::try_from(schema)?),
            },
        ));
    }
    let values: Vec<Vec<Expr>> = rows
        .into_iter()
        .map(|row| row.into_iter().map(datafusion::logical_expr::lit).collect())
        .collect();
    let columns: Vec<Expr> = names
        .iter()
        .enumerate()
        .map(|(i, name)| col(format!("column{}", i + 1)).alias(*name))
        .collect();
    LogicalPlanBuilder::values(values)?
        .project(columns)?
        .build()
}

/// What one of Basin's Iceberg change nodes changes.
pub(crate) struct IcebergChange<'a> {
    pub table: TableReference,
    /// What the user needs on `table`.
    pub privileges: &'static [Privilege],
    /// The query a `CREATE TABLE … AS` reads (not an input of its node).
    pub query: Option<&'a datafusion::logical_expr::LogicalPlan>,
    /// The change reads its target's rows itself (MERGE).
    pub reads_target: bool,
}

/// The table an Iceberg DDL, procedure or MERGE node changes; `None` for other nodes.
pub(crate) fn iceberg_change(
    node: &dyn datafusion::logical_expr::UserDefinedLogicalNode,
) -> Option<IcebergChange<'_>> {
    use basin_connectors::iceberg::{
        IcebergAlterTable, IcebergCreateTable, IcebergMergeNode, IcebergProcedure,
    };
    let reference = |catalog: &str, namespace: Vec<String>, name: &str| {
        TableReference::full(catalog, namespace.join("."), name)
    };
    let owner = |table, query| IcebergChange {
        table,
        privileges: &[Privilege::Ownership],
        query,
        reads_target: false,
    };
    let any = node.as_any();
    if let Some(c) = any.downcast_ref::<IcebergCreateTable>() {
        let table = reference(c.catalog.name(), c.namespace.clone().inner(), &c.name);
        return Some(owner(table, c.query.as_ref()));
    }
    if let Some(a) = any.downcast_ref::<IcebergAlterTable>() {
        let table = reference(
            a.catalog.name(),
            a.ident.namespace.clone().inner(),
            &a.ident.name,
        );
        return Some(owner(table, None));
    }
    if let Some(p) = any.downcast_ref::<IcebergProcedure>() {
        let table = reference(
            p.catalog.name(),
            p.ident.namespace.clone().inner(),
            &p.ident.name,
        );
        return Some(owner(table, None));
    }
    let m = any.downcast_ref::<IcebergMergeNode>()?;
    Some(IcebergChange {
        table: reference(
            &m.target.catalog,
            m.target.namespace.clone(),
            &m.target.name,
        ),
        privileges: &[Privilege::Insert, Privilege::Update, Privilege::Delete],
        query: None,
        reads_target: true,
    })
}

/// The table name without the time-travel suffix the parser put there.
fn strip_version(table: &str) -> &str {
    table
        .split_once(basin_connectors::iceberg::VERSION_MARKER)
        .map_or(table, |(name, _)| name)
}

#[derive(Debug)]
struct GuardedCatalogList {
    inner: Arc<dyn CatalogProviderList>,
    access: Arc<SessionAccess>,
}

impl CatalogProviderList for GuardedCatalogList {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn register_catalog(
        &self,
        name: String,
        catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        self.inner.register_catalog(name, catalog)
    }

    fn catalog_names(&self) -> Vec<String> {
        let rules = self.access.control.current();
        self.inner
            .catalog_names()
            .into_iter()
            .filter(|c| rules.may_see(&self.access.subject, c, None))
            .collect()
    }

    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        let rules = self.access.control.current();
        if !rules.may_see(&self.access.subject, name, None) {
            return None;
        }
        let inner = self.inner.catalog(name)?;
        Some(Arc::new(GuardedCatalog {
            name: name.to_string(),
            inner,
            access: self.access.clone(),
        }))
    }
}

#[derive(Debug)]
struct GuardedCatalog {
    name: String,
    inner: Arc<dyn CatalogProvider>,
    access: Arc<SessionAccess>,
}

impl CatalogProvider for GuardedCatalog {
    /// The catalog itself, for the code that needs its kind (Iceberg DDL): what it may do
    /// there is checked by privilege when the statement is planned.
    fn as_any(&self) -> &dyn Any {
        self.inner.as_any()
    }

    fn schema_names(&self) -> Vec<String> {
        let rules = self.access.control.rules();
        self.inner
            .schema_names()
            .into_iter()
            .filter(|s| rules.may_see(&self.access.subject, &self.name, Some(s)))
            .collect()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let rules = self.access.control.rules();
        if !rules.may_see(&self.access.subject, &self.name, Some(name)) {
            return None;
        }
        let inner = self.inner.schema(name)?;
        Some(Arc::new(GuardedSchema {
            catalog: self.name.clone(),
            schema: name.to_string(),
            inner,
            access: self.access.clone(),
        }))
    }

    fn register_schema(
        &self,
        name: &str,
        schema: Arc<dyn SchemaProvider>,
    ) -> Result<Option<Arc<dyn SchemaProvider>>> {
        self.inner.register_schema(name, schema)
    }

    fn deregister_schema(
        &self,
        name: &str,
        cascade: bool,
    ) -> Result<Option<Arc<dyn SchemaProvider>>> {
        self.inner.deregister_schema(name, cascade)
    }
}

#[derive(Debug)]
struct GuardedSchema {
    catalog: String,
    schema: String,
    inner: Arc<dyn SchemaProvider>,
    access: Arc<SessionAccess>,
}

impl GuardedSchema {
    fn grant(&self, table: &str) -> Grant {
        self.access
            .grant(&self.catalog, &self.schema, strip_version(table))
    }
}

#[async_trait]
impl SchemaProvider for GuardedSchema {
    fn as_any(&self) -> &dyn Any {
        self.inner.as_any()
    }

    fn table_names(&self) -> Vec<String> {
        self.inner
            .table_names()
            .into_iter()
            .filter(|t| !self.grant(t).privileges.is_empty())
            .collect()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let grant = self.grant(name);
        if grant.privileges.is_empty() {
            return Ok(None);
        }
        let Some(table) = self.inner.table(name).await? else {
            return Ok(None);
        };
        if !grant.restricts_reads() {
            return Ok(Some(table));
        }
        let reference = TableReference::full(self.catalog.as_str(), self.schema.as_str(), name);
        restricted_view(reference, table, &grant).map(Some)
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        self.inner.register_table(name, table)
    }

    fn deregister_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        self.inner.deregister_table(name)
    }

    fn table_exist(&self, name: &str) -> bool {
        !self.grant(name).privileges.is_empty() && self.inner.table_exist(name)
    }
}

/// `table` as the user may read it: its rows that pass the filter, its allowed columns, the
/// masked ones masked (same names and types).
fn restricted_view(
    reference: TableReference,
    table: Arc<dyn TableProvider>,
    grant: &Grant,
) -> Result<Arc<dyn TableProvider>> {
    let schema = table.schema();
    let df_schema = DFSchema::try_from_qualified_schema(reference.clone(), &schema)?;
    // Expressions are read by a plain session (built-in functions only), made once: a
    // session registers every function, and tables are looked up on every statement.
    static PARSER: std::sync::LazyLock<SessionContext> =
        std::sync::LazyLock::new(SessionContext::new);
    let parser = &*PARSER;
    let bad = |what: &str, text: &str, e: DataFusionError| {
        DataFusionError::Plan(format!(
            "the access rules' {what} `{text}` for `{reference}` cannot be used: {}",
            e.message()
        ))
    };
    let filter = grant
        .filter
        .as_ref()
        .map(|f| {
            parser
                .parse_sql_expr(f, &df_schema)
                .map_err(|e| bad("filter", f, e))
        })
        .transpose()?;
    let mut columns: Vec<Expr> = Vec::new();
    let mut masked: Vec<String> = Vec::new();
    for field in schema.fields() {
        let rule = grant.columns.iter().find(|c| c.name == *field.name());
        match rule {
            Some(rule) if !rule.allow => {}
            Some(ColumnRule {
                mask: Some(mask), ..
            }) => {
                let expr = parser
                    .parse_sql_expr(mask, &df_schema)
                    .map_err(|e| bad("mask", mask, e))?;
                columns.push(
                    expr.cast_to(field.data_type(), &df_schema)?
                        .alias_qualified(Some(reference.clone()), field.name()),
                );
                masked.push(field.name().clone());
            }
            _ => columns.push(col(datafusion::common::Column::new(
                Some(reference.clone()),
                field.name(),
            ))),
        }
    }
    let scan = LogicalPlanBuilder::scan(reference.clone(), provider_as_source(table), None)?;
    // Masks right on the scan, where the pushdown can hand them to the source with it (a
    // source whose comparisons Basin re-checks keeps the filter above here) — unless the
    // filter reads a masked or hidden column: then it sees the values first.
    let filter_reads_clear = filter.as_ref().is_some_and(|f| {
        f.column_refs().iter().any(|c| {
            masked.contains(&c.name) || grant.columns.iter().any(|r| !r.allow && r.name == c.name)
        })
    });
    let plan = match filter {
        Some(filter) if filter_reads_clear => scan.filter(filter)?.project(columns)?,
        Some(filter) => scan.project(columns)?.filter(filter)?,
        None => scan.project(columns)?,
    }
    .build()?;
    Ok(Arc::new(datafusion::catalog::view::ViewTable::new(
        plan, None,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Subject {
        Subject {
            user: "alice".into(),
            groups: vec!["analysts".into()],
        }
    }

    #[test]
    fn first_matching_rule_wins_and_present_sections_deny_the_rest() {
        let rules = Rules::parse(
            r#"
            [[catalogs]]
            user = "admin"
            allow = "all"
            [[catalogs]]
            group = "analysts"
            catalog = "pg|lake"
            allow = "read-only"

            [[tables]]
            user = "alice"
            catalog = "pg"
            schema = "s"
            table = "orders"
            privileges = ["SELECT", "INSERT"]
            filter = "region = 'EU'"
            columns = [{ name = "ssn", allow = false }, { name = "email", mask = "'***'" }]
            [[tables]]
            group = "analysts"
            catalog = "lake"
            privileges = ["SELECT"]
            "#,
            false,
        )
        .unwrap();
        let a = alice();
        let orders = rules.grant(&a, "pg", "s", "orders");
        // read-only catalog: INSERT dropped.
        assert_eq!(orders.privileges, [Privilege::Select].into());
        assert_eq!(orders.filter.as_deref(), Some("region = 'EU'"));
        assert!(orders.restricts_reads());
        assert!(rules.grant(&a, "pg", "s", "other").privileges.is_empty());
        assert!(!rules.grant(&a, "lake", "x", "y").privileges.is_empty());
        assert!(
            rules
                .grant(&a, "tpch", "tiny", "nation")
                .privileges
                .is_empty()
        );
        assert!(rules.may_see(&a, "pg", Some("s")));
        assert!(!rules.may_see(&a, "pg", Some("t")));
        assert!(!rules.may_see(&a, "tpch", None));
        let admin = Subject {
            user: "admin".into(),
            groups: vec![],
        };
        // admin's catalog rule allows all, but no table rule matches admin.
        assert!(
            rules
                .grant(&admin, "pg", "s", "orders")
                .privileges
                .is_empty()
        );
    }

    #[test]
    fn bad_rules_name_the_rule() {
        let err = Rules::parse(r#"{"tables": [{"privileges": ["READ"]}]}"#, true).unwrap_err();
        assert!(
            err.contains("tables rule 1") && err.contains("READ"),
            "{err}"
        );
        let err = Rules::parse(r#"{"catalogs": [{"allow": "most"}]}"#, true).unwrap_err();
        assert!(err.contains("catalogs rule 1"), "{err}");
        let err = Rules::parse(r#"{"tables": [{"table": "("}]}"#, true).unwrap_err();
        assert!(err.contains("table pattern"), "{err}");
        assert!(Rules::parse(r#"{"other": 1}"#, true).is_err());
    }
}
