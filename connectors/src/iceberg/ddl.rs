//! `CREATE TABLE` (with Trino's `WITH (partitioning = ARRAY[...], ...)` properties) and
//! `CREATE TABLE ... AS SELECT` on Iceberg catalogs. They run in the front end: the table is
//! created in the catalog, then a CTAS inserts through the distributed write path (one
//! commit). A CTAS whose insert fails drops the table it created.

use std::any::Any;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::common::{DFSchema, DFSchemaRef, TableReference};
use datafusion::datasource::provider_as_source;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, SessionState, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{
    DmlStatement, Expr, LogicalPlan, LogicalPlanBuilder, UserDefinedLogicalNodeCore, WriteOp, cast,
    col,
};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, collect,
};
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, SqlOption, Value, ValueWithSpan};
use iceberg::arrow::{arrow_schema_to_schema_auto_assign_ids, arrow_type_to_type};
use iceberg::spec::{
    FormatVersion, NullOrder, SortDirection, SortField, SortOrder, Transform, UnboundPartitionSpec,
};
use iceberg::transaction::{AddColumn, ApplyTransactionAction, Transaction};
use iceberg::{NamespaceIdent, TableCreation, TableIdent};

use super::catalog::{IcebergCatalog, error_text};
use super::parquet_props::writer_properties;
use super::table::IcebergTableProvider;
use super::write::count_schema;

/// Table properties from `WITH (...)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TableOptions {
    /// Trino partitioning expressions: `col`, `year(col)`, `month(col)`, `day(col)`,
    /// `hour(col)`, `bucket(col, N)` or `bucket(N, col)`, `truncate(col, W)` or
    /// `truncate(W, col)`.
    pub partitioning: Vec<String>,
    /// `col [ASC|DESC] [NULLS FIRST|LAST]`.
    pub sorted_by: Vec<String>,
    pub location: Option<String>,
    pub format_version: Option<u8>,
    /// Any other Iceberg table property (`"write.target-file-size-bytes" = '...'`).
    pub properties: BTreeMap<String, String>,
}

const KNOWN: &str = "partitioning, sorted_by, location, format ('PARQUET'), format_version, \
                     extra_properties, or an Iceberg property name such as \
                     \"write.target-file-size-bytes\"";

impl TableOptions {
    /// Reads `WITH (...)` options.
    pub fn from_sql(options: &[SqlOption]) -> Result<Self> {
        let mut out = TableOptions::default();
        for option in options {
            let SqlOption::KeyValue { key, value } = option else {
                return Err(DataFusionError::Plan(format!(
                    "table option `{option}` is not supported; use key = value ({KNOWN})"
                )));
            };
            let name = key.value.to_ascii_lowercase();
            match name.as_str() {
                "partitioning" | "partitioned_by" => out.partitioning = strings(&name, value)?,
                "sorted_by" => out.sorted_by = strings(&name, value)?,
                "location" => out.location = Some(string(&name, value)?),
                "format" => {
                    let f = string(&name, value)?;
                    if !f.eq_ignore_ascii_case("parquet") {
                        return Err(DataFusionError::Plan(format!(
                            "format `{f}` is not supported: Basin writes Iceberg tables as PARQUET"
                        )));
                    }
                }
                "format_version" => {
                    let v = string(&name, value)?;
                    out.format_version = Some(match v.as_str() {
                        "1" => 1,
                        "2" => 2,
                        _ => {
                            return Err(DataFusionError::Plan(format!(
                                "format_version {v} is not supported; use 1 or 2"
                            )));
                        }
                    });
                }
                _ if key.value.contains('.') => {
                    out.properties
                        .insert(key.value.clone(), string(&key.value, value)?);
                }
                _ => {
                    return Err(DataFusionError::Plan(format!(
                        "unknown table property `{}`; Basin knows {KNOWN}",
                        key.value
                    )));
                }
            }
        }
        Ok(out)
    }
}

fn string(name: &str, value: &SqlExpr) -> Result<String> {
    match value {
        SqlExpr::Value(ValueWithSpan {
            value: Value::SingleQuotedString(s) | Value::DoubleQuotedString(s),
            ..
        }) => Ok(s.clone()),
        SqlExpr::Value(ValueWithSpan {
            value: Value::Number(n, _),
            ..
        }) => Ok(n.to_string()),
        SqlExpr::Value(ValueWithSpan {
            value: Value::Boolean(b),
            ..
        }) => Ok(b.to_string()),
        SqlExpr::Identifier(i) => Ok(i.value.clone()),
        other => Err(DataFusionError::Plan(format!(
            "table property `{name}` must be a string, got `{other}`"
        ))),
    }
}

fn strings(name: &str, value: &SqlExpr) -> Result<Vec<String>> {
    match value {
        SqlExpr::Array(array) => array.elem.iter().map(|e| string(name, e)).collect(),
        other => Ok(vec![string(name, other)?]),
    }
}

/// Parses one partitioning expression into (source column, transform).
pub fn parse_partition_field(text: &str) -> Result<(String, Transform)> {
    let bad = |why: &str| {
        DataFusionError::Plan(format!(
            "partitioning `{text}`: {why}; use col, year(col), month(col), day(col), \
             hour(col), bucket(col, N) or truncate(col, W)"
        ))
    };
    let t = text.trim();
    let Some(open) = t.find('(') else {
        return Ok((column_name(t), Transform::Identity));
    };
    if !t.ends_with(')') {
        return Err(bad("unbalanced parentheses"));
    }
    let function = t[..open].trim().to_ascii_lowercase();
    let args: Vec<&str> = t[open + 1..t.len() - 1].split(',').map(str::trim).collect();
    let (column, number) = match args.as_slice() {
        [c] => (c.to_string(), None),
        [a, b] => match (a.parse::<u32>(), b.parse::<u32>()) {
            (Ok(n), Err(_)) => (b.to_string(), Some(n)),
            (Err(_), Ok(n)) => (a.to_string(), Some(n)),
            _ => return Err(bad("expected a column and a number")),
        },
        _ => return Err(bad("wrong number of arguments")),
    };
    let column = column_name(&column);
    let transform = match (function.as_str(), number) {
        ("identity", None) => Transform::Identity,
        ("year" | "years", None) => Transform::Year,
        ("month" | "months", None) => Transform::Month,
        ("day" | "days", None) => Transform::Day,
        ("hour" | "hours", None) => Transform::Hour,
        ("bucket", Some(n)) if n > 0 => Transform::Bucket(n),
        ("truncate", Some(w)) if w > 0 => Transform::Truncate(w),
        ("bucket" | "truncate", _) => return Err(bad("needs a positive width")),
        (f, _) => return Err(bad(&format!("unsupported transform `{f}`"))),
    };
    Ok((column, transform))
}

fn column_name(text: &str) -> String {
    let t = text.trim();
    if t.len() >= 2 && t.starts_with('"') && t.ends_with('"') {
        t[1..t.len() - 1].to_string()
    } else {
        t.to_ascii_lowercase()
    }
}

fn partition_field_name(column: &str, transform: &Transform) -> String {
    match transform {
        Transform::Identity => column.to_string(),
        Transform::Year => format!("{column}_year"),
        Transform::Month => format!("{column}_month"),
        Transform::Day => format!("{column}_day"),
        Transform::Hour => format!("{column}_hour"),
        Transform::Bucket(_) => format!("{column}_bucket"),
        Transform::Truncate(_) => format!("{column}_trunc"),
        _ => format!("{column}_{transform}"),
    }
}

/// Iceberg has microsecond timestamps (UTC or none), 32/64-bit signed integers: map
/// DataFusion's types to what Iceberg stores.
pub fn iceberg_compatible(field: &Field, force_nullable: bool) -> Field {
    let ty = match field.data_type() {
        DataType::Timestamp(_, None) => DataType::Timestamp(TimeUnit::Microsecond, None),
        DataType::Timestamp(_, Some(_)) => {
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
        }
        DataType::UInt8 | DataType::UInt16 | DataType::Int8 | DataType::Int16 => DataType::Int32,
        DataType::UInt32 => DataType::Int64,
        DataType::UInt64 => DataType::Decimal128(20, 0),
        DataType::Float16 => DataType::Float32,
        DataType::LargeUtf8 | DataType::Utf8View => DataType::Utf8,
        DataType::BinaryView => DataType::LargeBinary,
        other => other.clone(),
    };
    Field::new(field.name(), ty, field.is_nullable() || force_nullable)
}

/// `CREATE TABLE` on an Iceberg catalog (local logical node, no inputs: a CTAS query is
/// planned as an INSERT when the node runs).
#[derive(Debug, Clone)]
pub struct IcebergCreateTable {
    pub catalog: Arc<IcebergCatalog>,
    pub namespace: NamespaceIdent,
    pub name: String,
    pub columns: SchemaRef,
    pub options: TableOptions,
    pub if_not_exists: bool,
    pub or_replace: bool,
    pub query: Option<LogicalPlan>,
    schema: DFSchemaRef,
}

impl IcebergCreateTable {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        catalog: Arc<IcebergCatalog>,
        namespace: NamespaceIdent,
        name: String,
        columns: SchemaRef,
        options: TableOptions,
        if_not_exists: bool,
        or_replace: bool,
        query: Option<LogicalPlan>,
    ) -> Result<Self> {
        Ok(Self {
            catalog,
            namespace,
            name,
            columns,
            options,
            if_not_exists,
            or_replace,
            query,
            schema: Arc::new(DFSchema::try_from(count_schema().as_ref().clone())?),
        })
    }

    fn qualified(&self) -> String {
        format!(
            "{}.{}.{}",
            self.catalog.name(),
            self.namespace.join("."),
            self.name
        )
    }

    /// The table creation request: schema with fresh field ids, partition spec, sort order.
    fn creation(&self) -> Result<TableCreation> {
        let table = self.qualified();
        // A bad `write.parquet.*` value fails the CREATE, not the first write.
        let properties: HashMap<String, String> =
            self.options.properties.clone().into_iter().collect();
        writer_properties(&table, &properties)?;
        let ctas = self.query.is_some();
        let fields: Vec<Field> = self
            .columns
            .fields()
            .iter()
            .map(|f| iceberg_compatible(f, ctas))
            .collect();
        let schema = arrow_schema_to_schema_auto_assign_ids(&Schema::new(fields)).map_err(|e| {
            DataFusionError::Plan(format!("cannot create `{table}`: {}", error_text(&e)))
        })?;
        let mut spec = UnboundPartitionSpec::builder();
        for text in &self.options.partitioning {
            let (column, transform) = parse_partition_field(text)?;
            let source = schema.field_by_name(&column).ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "cannot partition `{table}` by `{text}`: no column `{column}`"
                ))
            })?;
            if transform.result_type(&source.field_type).is_err() {
                return Err(DataFusionError::Plan(format!(
                    "cannot partition `{table}` by `{text}`: {transform} does not apply to \
                     column `{column}` of type {}",
                    source.field_type
                )));
            }
            spec = spec
                .add_partition_field(
                    source.id,
                    partition_field_name(&column, &transform),
                    transform,
                )
                .map_err(|e| {
                    DataFusionError::Plan(format!(
                        "cannot partition `{table}` by `{text}`: {}",
                        error_text(&e)
                    ))
                })?;
        }
        let mut sort = SortOrder::builder();
        for text in &self.options.sorted_by {
            let words: Vec<String> = text
                .split_whitespace()
                .map(|w| w.to_ascii_lowercase())
                .collect();
            let column = words.first().map(|c| column_name(c)).unwrap_or_default();
            let source = schema.field_by_name(&column).ok_or_else(|| {
                DataFusionError::Plan(format!(
                    "cannot sort `{table}` by `{text}`: no column `{column}`"
                ))
            })?;
            let desc = words.iter().any(|w| w == "desc");
            let nulls_last = words.windows(2).any(|w| w[0] == "nulls" && w[1] == "last")
                || (desc && !words.windows(2).any(|w| w[0] == "nulls" && w[1] == "first"));
            sort.with_sort_field(SortField {
                source_id: source.id,
                transform: Transform::Identity,
                direction: if desc {
                    SortDirection::Descending
                } else {
                    SortDirection::Ascending
                },
                null_order: if nulls_last {
                    NullOrder::Last
                } else {
                    NullOrder::First
                },
            });
        }
        let sort_order = if self.options.sorted_by.is_empty() {
            None
        } else {
            Some(
                sort.build(&schema)
                    .map_err(|e| {
                        DataFusionError::Plan(format!(
                            "bad sorted_by for `{table}`: {}",
                            error_text(&e)
                        ))
                    })?
                    .with_order_id(1),
            )
        };
        let format_version = match self.options.format_version {
            Some(1) => FormatVersion::V1,
            _ => FormatVersion::V2,
        };
        Ok(TableCreation::builder()
            .name(self.name.clone())
            .schema(schema)
            .partition_spec(spec.build())
            .sort_order_opt(sort_order)
            .location_opt(self.options.location.clone())
            .properties(self.options.properties.clone())
            .format_version(format_version)
            .build())
    }
}

impl PartialEq for IcebergCreateTable {
    fn eq(&self, other: &Self) -> bool {
        self.qualified() == other.qualified()
            && self.options == other.options
            && self.query == other.query
    }
}
impl Eq for IcebergCreateTable {}
impl Hash for IcebergCreateTable {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.qualified().hash(state);
        self.options.hash(state);
    }
}
impl PartialOrd for IcebergCreateTable {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.qualified().partial_cmp(&other.qualified())
    }
}

impl UserDefinedLogicalNodeCore for IcebergCreateTable {
    fn name(&self) -> &str {
        "IcebergCreateTable"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergCreateTable: table={}, partitioning=[{}], as_select={}",
            self.qualified(),
            self.options.partitioning.join(", "),
            self.query.is_some()
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, _inputs: Vec<LogicalPlan>) -> Result<Self> {
        Ok(self.clone())
    }
}

/// A DDL statement on an Iceberg catalog.
#[derive(Debug, Clone)]
pub enum IcebergDdl {
    CreateTable(Box<IcebergCreateTable>),
    AlterTable(IcebergAlterTable),
}

impl IcebergDdl {
    fn qualified(&self) -> String {
        match self {
            IcebergDdl::CreateTable(n) => n.qualified(),
            IcebergDdl::AlterTable(n) => n.catalog.qualified(&n.ident),
        }
    }
}

/// Runs Iceberg DDL in the front end.
#[derive(Debug)]
pub struct IcebergDdlExec {
    node: IcebergDdl,
    state: SessionState,
    properties: Arc<PlanProperties>,
}

impl IcebergDdlExec {
    pub fn new(node: IcebergDdl, state: SessionState) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(count_schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            node,
            state,
            properties,
        }
    }
}

impl DisplayAs for IcebergDdlExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "IcebergDdlExec: table={}", self.node.qualified())
    }
}

impl ExecutionPlan for IcebergDdlExec {
    fn name(&self) -> &str {
        "IcebergDdlExec"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let node = self.node.clone();
        let state = self.state.clone();
        let stream = futures::stream::once(async move {
            let rows = match &node {
                IcebergDdl::CreateTable(n) => create_table(n, &state).await?,
                IcebergDdl::AlterTable(n) => alter_table(n).await?,
            };
            let array: ArrayRef = Arc::new(UInt64Array::from(vec![rows]));
            Ok(RecordBatch::try_new(count_schema(), vec![array])?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            count_schema(),
            stream,
        )))
    }
}

async fn create_table(node: &IcebergCreateTable, state: &SessionState) -> Result<u64> {
    let table_name = node.qualified();
    let catalog = node.catalog.clone();
    let ident = TableIdent::new(node.namespace.clone(), node.name.clone());
    let creation = node.creation()?;
    let id = ident.clone();
    let exists = catalog
        .call(move |c| async move { c.table_exists(&id).await })
        .await
        .map_err(|e| catalog.table_error(&ident, "cannot look up", &e))?;
    if exists {
        if node.if_not_exists {
            return Ok(0);
        }
        if !node.or_replace {
            return Err(DataFusionError::Plan(format!(
                "table `{table_name}` already exists"
            )));
        }
        let id = ident.clone();
        catalog
            .call(move |c| async move { c.drop_table(&id).await })
            .await
            .map_err(|e| catalog.table_error(&ident, "cannot replace", &e))?;
    }
    let ns = node.namespace.clone();
    let table = catalog
        .call(move |c| async move { c.create_table(&ns, creation).await })
        .await
        .map_err(|e| catalog.table_error(&ident, "cannot create", &e))?;
    let Some(query) = &node.query else {
        return Ok(0);
    };
    let provider = Arc::new(IcebergTableProvider::new(catalog.clone(), table, None)?);
    let result = insert(provider, &table_name, query.clone(), state).await;
    if result.is_err() {
        // CREATE TABLE ... AS SELECT is one statement: no table without its rows.
        let id = ident.clone();
        if let Err(e) = catalog
            .call(move |c| async move { c.drop_table(&id).await })
            .await
        {
            tracing::warn!(table = %table_name, error = %error_text(&e), "cannot drop the table of a failed CREATE TABLE AS");
        }
    }
    result
}

/// Inserts the rows of `query` into `provider` (distributed write, one commit).
async fn insert(
    provider: Arc<IcebergTableProvider>,
    table_name: &str,
    query: LogicalPlan,
    state: &SessionState,
) -> Result<u64> {
    let target = provider.schema_ref();
    let source = query.schema().clone();
    if source.fields().len() != target.fields().len() {
        return Err(DataFusionError::Plan(format!(
            "cannot insert {} columns into `{table_name}`, which has {}",
            source.fields().len(),
            target.fields().len()
        )));
    }
    let exprs: Vec<Expr> = source
        .columns()
        .into_iter()
        .zip(target.fields())
        .map(|(c, f)| {
            // The table's stored type: strings are read as views but written plain.
            let stored = crate::views::plain_type(f.data_type());
            cast(col(c), stored.unwrap_or_else(|| f.data_type().clone())).alias(f.name())
        })
        .collect();
    let input = LogicalPlanBuilder::from(query).project(exprs)?.build()?;
    let plan = LogicalPlan::Dml(DmlStatement::new(
        TableReference::parse_str(table_name),
        provider_as_source(provider),
        WriteOp::Insert(InsertOp::Append),
        Arc::new(input),
    ));
    let physical = state.create_physical_plan(&plan).await?;
    let batches = collect(physical, state.task_ctx()).await?;
    Ok(batches
        .iter()
        .filter_map(|b| b.column(0).as_any().downcast_ref::<UInt64Array>())
        .map(|a| a.iter().flatten().sum::<u64>())
        .sum())
}

/// One change of `ALTER TABLE`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AlterOp {
    AddColumn {
        name: String,
        data_type: DataType,
        if_not_exists: bool,
    },
    DropColumn {
        name: String,
        if_exists: bool,
    },
    RenameColumn {
        from: String,
        to: String,
    },
    /// `ALTER COLUMN … SET DATA TYPE`: a promotion Iceberg allows.
    SetType {
        name: String,
        data_type: DataType,
    },
    /// `ALTER COLUMN … DROP NOT NULL` (`false`) or `SET NOT NULL` (`true`, refused).
    SetRequired {
        name: String,
        required: bool,
    },
}

impl AlterOp {
    /// Changes iceberg-rust 0.10's schema update cannot make: Basin commits a new schema.
    fn is_evolution(&self) -> bool {
        !matches!(self, AlterOp::AddColumn { .. } | AlterOp::DropColumn { .. })
    }
}

/// `ALTER TABLE ... ADD COLUMN / DROP COLUMN` on an Iceberg table: one schema change, one
/// commit. Columns are matched by field id, so old files read the new schema correctly.
#[derive(Debug, Clone)]
pub struct IcebergAlterTable {
    pub catalog: Arc<IcebergCatalog>,
    pub ident: TableIdent,
    pub ops: Vec<AlterOp>,
    schema: DFSchemaRef,
}

impl IcebergAlterTable {
    pub fn new(
        catalog: Arc<IcebergCatalog>,
        namespace: NamespaceIdent,
        name: String,
        ops: Vec<AlterOp>,
    ) -> Result<Self> {
        Ok(Self {
            catalog,
            ident: TableIdent::new(namespace, name),
            ops,
            schema: Arc::new(DFSchema::try_from(count_schema().as_ref().clone())?),
        })
    }
}

impl PartialEq for IcebergAlterTable {
    fn eq(&self, other: &Self) -> bool {
        self.ident == other.ident && self.ops == other.ops
    }
}
impl Eq for IcebergAlterTable {}
impl Hash for IcebergAlterTable {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.ident.to_string().hash(state);
        self.ops.hash(state);
    }
}
impl PartialOrd for IcebergAlterTable {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        self.ident.to_string().partial_cmp(&other.ident.to_string())
    }
}

impl UserDefinedLogicalNodeCore for IcebergAlterTable {
    fn name(&self) -> &str {
        "IcebergAlterTable"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergAlterTable: table={}, changes={:?}",
            self.catalog.qualified(&self.ident),
            self.ops
        )
    }

    fn with_exprs_and_inputs(&self, _exprs: Vec<Expr>, _inputs: Vec<LogicalPlan>) -> Result<Self> {
        Ok(self.clone())
    }
}

async fn alter_table(node: &IcebergAlterTable) -> Result<u64> {
    let catalog = node.catalog.clone();
    let table_name = catalog.qualified(&node.ident);
    let table = catalog.load_table(&node.ident).await?;
    if node.ops.iter().any(AlterOp::is_evolution) {
        if !node.ops.iter().all(AlterOp::is_evolution) {
            return Err(DataFusionError::NotImplemented(format!(
                "ALTER TABLE `{table_name}`: adding or dropping columns and renaming or \
                 retyping them in one statement is not supported yet; run them as two"
            )));
        }
        return evolve_schema(&catalog, &table, &table_name, &node.ops).await;
    }
    let schema = table.metadata().current_schema().clone();
    let spec = table.metadata().default_partition_spec().clone();
    let tx = Transaction::new(&table);
    let mut action = tx.update_schema();
    let mut changed = false;
    for op in &node.ops {
        match op {
            AlterOp::AddColumn {
                name,
                data_type,
                if_not_exists,
            } => {
                if schema.field_by_name(name).is_some() {
                    if *if_not_exists {
                        continue;
                    }
                    return Err(DataFusionError::Plan(format!(
                        "table `{table_name}` already has a column `{name}`"
                    )));
                }
                // iceberg-rust 0.10's reader matches a re-added column to the old column of
                // the same name and type in old files (its schema comparison ignores field
                // ids), which would bring dropped values back. Refuse rather than mislead.
                if table
                    .metadata()
                    .schemas_iter()
                    .any(|s| s.field_by_name(name).is_some())
                {
                    return Err(DataFusionError::NotImplemented(format!(
                        "cannot add column `{name}` to `{table_name}`: the table had a column of \
                         that name before; pick another name"
                    )));
                }
                let field = iceberg_compatible(&Field::new(name, data_type.clone(), true), true);
                let ty = arrow_type_to_type(field.data_type()).map_err(|e| {
                    DataFusionError::Plan(format!(
                        "cannot add column `{name}` to `{table_name}`: {}",
                        error_text(&e)
                    ))
                })?;
                action = action.add_column(AddColumn::optional(name, ty));
                changed = true;
            }
            AlterOp::DropColumn { name, if_exists } => {
                let Some(field) = schema.field_by_name(name) else {
                    if *if_exists {
                        continue;
                    }
                    return Err(DataFusionError::Plan(format!(
                        "table `{table_name}` has no column `{name}`"
                    )));
                };
                if spec.fields().iter().any(|p| p.source_id == field.id) {
                    return Err(DataFusionError::Plan(format!(
                        "cannot drop column `{name}` of `{table_name}`: the table is partitioned by it"
                    )));
                }
                action = action.delete_column(name);
                changed = true;
            }
            AlterOp::RenameColumn { .. }
            | AlterOp::SetType { .. }
            | AlterOp::SetRequired { .. } => {}
        }
    }
    if !changed {
        return Ok(0);
    }
    let tx = action.apply(tx).map_err(|e| {
        DataFusionError::Plan(format!("cannot alter `{table_name}`: {}", error_text(&e)))
    })?;
    catalog
        .call(move |c| async move { tx.commit(c.as_ref()).await.map(|_| ()) })
        .await
        .map_err(|e| catalog.table_error(&node.ident, "cannot alter", &e))?;
    Ok(0)
}

/// Renames, type promotions and `DROP NOT NULL`: a new schema with the same field ids, made
/// current in one commit that requires the table's current schema to be the one changed.
/// Files are untouched: readers match columns by field id, and read old files' narrower
/// types promoted.
async fn evolve_schema(
    catalog: &Arc<IcebergCatalog>,
    table: &iceberg::table::Table,
    table_name: &str,
    ops: &[AlterOp],
) -> Result<u64> {
    use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
    let metadata = table.metadata();
    let current = metadata.current_schema();
    let mut fields: Vec<NestedField> = current
        .as_struct()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    let position = |fields: &[NestedField], name: &str| {
        fields.iter().position(|f| f.name == name).ok_or_else(|| {
            DataFusionError::Plan(format!("table `{table_name}` has no column `{name}`"))
        })
    };
    for op in ops {
        match op {
            AlterOp::RenameColumn { from, to } => {
                let at = position(&fields, from)?;
                if from == to {
                    continue;
                }
                if fields.iter().any(|f| &f.name == to) {
                    return Err(DataFusionError::Plan(format!(
                        "cannot rename `{from}` of `{table_name}` to `{to}`: the table already \
                         has a column `{to}`"
                    )));
                }
                // As for ADD COLUMN: iceberg-rust 0.10's reader would match the name to the
                // old column's values in old files.
                if metadata
                    .schemas_iter()
                    .any(|s| s.field_by_name(to).is_some_and(|f| f.id != fields[at].id))
                {
                    return Err(DataFusionError::NotImplemented(format!(
                        "cannot rename `{from}` of `{table_name}` to `{to}`: the table had a \
                         column of that name before; pick another name"
                    )));
                }
                fields[at].name = to.clone();
            }
            AlterOp::SetType { name, data_type } => {
                let at = position(&fields, name)?;
                let field = iceberg_compatible(&Field::new(name, data_type.clone(), true), true);
                let wanted = arrow_type_to_type(field.data_type()).map_err(|e| {
                    DataFusionError::Plan(format!(
                        "cannot change the type of `{name}` of `{table_name}`: {}",
                        error_text(&e)
                    ))
                })?;
                let from = fields[at].field_type.as_ref().clone();
                if from != wanted
                    && metadata
                        .partition_specs_iter()
                        .any(|spec| spec.fields().iter().any(|p| p.source_id == fields[at].id))
                {
                    // Old manifests keep the old type's partition values, which iceberg-rust
                    // 0.10 then never matches against the new type's: files would be skipped.
                    return Err(DataFusionError::NotImplemented(format!(
                        "cannot change the type of `{name}` of `{table_name}`: the table is \
                         partitioned by it"
                    )));
                }
                let allowed = match (&from, &wanted) {
                    (a, b) if a == b => true,
                    (Type::Primitive(PrimitiveType::Int), Type::Primitive(PrimitiveType::Long))
                    | (
                        Type::Primitive(PrimitiveType::Float),
                        Type::Primitive(PrimitiveType::Double),
                    ) => true,
                    (
                        Type::Primitive(PrimitiveType::Decimal {
                            precision: p1,
                            scale: s1,
                        }),
                        Type::Primitive(PrimitiveType::Decimal {
                            precision: p2,
                            scale: s2,
                        }),
                    ) => s1 == s2 && p2 >= p1,
                    _ => false,
                };
                if !allowed {
                    return Err(DataFusionError::Plan(format!(
                        "cannot change column `{name}` of `{table_name}` from {from} to \
                         {wanted}: Iceberg allows int to bigint, float to double and a decimal \
                         to a wider precision of the same scale"
                    )));
                }
                *fields[at].field_type = wanted;
            }
            AlterOp::SetRequired { name, required } => {
                let at = position(&fields, name)?;
                if *required && !fields[at].required {
                    return Err(DataFusionError::NotImplemented(format!(
                        "cannot make column `{name}` of `{table_name}` NOT NULL: its files may \
                         hold NULLs, and Iceberg only allows a required column to become \
                         optional (DROP NOT NULL)"
                    )));
                }
                if !*required && current.identifier_field_ids().any(|id| id == fields[at].id) {
                    return Err(DataFusionError::Plan(format!(
                        "column `{name}` of `{table_name}` is an identifier field and must \
                         stay NOT NULL"
                    )));
                }
                fields[at].required = *required;
            }
            AlterOp::AddColumn { .. } | AlterOp::DropColumn { .. } => {}
        }
    }
    if fields
        .iter()
        .zip(current.as_struct().fields())
        .all(|(a, b)| a == b.as_ref())
    {
        return Ok(0);
    }
    let schema_id = metadata
        .schemas_iter()
        .map(|s| s.schema_id())
        .max()
        .unwrap_or(0)
        + 1;
    let schema = Schema::builder()
        .with_schema_id(schema_id)
        .with_fields(fields.into_iter().map(Arc::new))
        .with_identifier_field_ids(current.identifier_field_ids())
        .build()
        .map_err(|e| {
            DataFusionError::Plan(format!("cannot alter `{table_name}`: {}", error_text(&e)))
        })?;
    let requirements = vec![
        iceberg::TableRequirement::UuidMatch {
            uuid: metadata.uuid(),
        },
        iceberg::TableRequirement::CurrentSchemaIdMatch {
            current_schema_id: metadata.current_schema_id(),
        },
    ];
    let updates = vec![
        iceberg::TableUpdate::AddSchema { schema },
        iceberg::TableUpdate::SetCurrentSchema { schema_id: -1 },
    ];
    catalog
        .committer()
        .commit(table, table_name, requirements, updates)
        .await?;
    Ok(0)
}

/// `SHOW CREATE TABLE` for an Iceberg table, in Trino's form.
pub fn create_table_text(qualified: &str, table: &iceberg::table::Table) -> String {
    use iceberg::spec::{PrimitiveType, Type};
    let m = table.metadata();
    let schema = m.current_schema();
    let sql_type = |t: &Type| -> String {
        match t {
            Type::Primitive(p) => match p {
                PrimitiveType::Boolean => "BOOLEAN".into(),
                PrimitiveType::Int => "INTEGER".into(),
                PrimitiveType::Long => "BIGINT".into(),
                PrimitiveType::Float => "REAL".into(),
                PrimitiveType::Double => "DOUBLE".into(),
                PrimitiveType::Decimal { precision, scale } => {
                    format!("DECIMAL({precision}, {scale})")
                }
                PrimitiveType::Date => "DATE".into(),
                PrimitiveType::Time => "TIME(6)".into(),
                PrimitiveType::Timestamp => "TIMESTAMP(6)".into(),
                PrimitiveType::Timestamptz => "TIMESTAMP(6) WITH TIME ZONE".into(),
                PrimitiveType::TimestampNs => "TIMESTAMP(9)".into(),
                PrimitiveType::TimestamptzNs => "TIMESTAMP(9) WITH TIME ZONE".into(),
                PrimitiveType::String => "VARCHAR".into(),
                PrimitiveType::Uuid => "UUID".into(),
                PrimitiveType::Fixed(_) | PrimitiveType::Binary => "VARBINARY".into(),
            },
            other => other.to_string(),
        }
    };
    let columns: Vec<String> = schema
        .as_struct()
        .fields()
        .iter()
        .map(|f| {
            format!(
                "   \"{}\" {}{}",
                f.name.replace('"', "\"\""),
                sql_type(&f.field_type),
                if f.required { " NOT NULL" } else { "" }
            )
        })
        .collect();
    let mut props = vec![
        "   format = 'PARQUET'".to_string(),
        format!("   format_version = {}", m.format_version() as u8),
        format!("   location = '{}'", m.location().replace('\'', "''")),
    ];
    let spec = m.default_partition_spec();
    if !spec.is_unpartitioned() {
        let fields: Vec<String> = spec
            .fields()
            .iter()
            .map(|p| {
                let column = schema
                    .field_by_id(p.source_id)
                    .map(|f| f.name.clone())
                    .unwrap_or_else(|| format!("#{}", p.source_id));
                let text = match p.transform {
                    Transform::Identity => column,
                    Transform::Bucket(n) => format!("bucket({column}, {n})"),
                    Transform::Truncate(w) => format!("truncate({column}, {w})"),
                    other => format!("{other}({column})"),
                };
                format!("'{}'", text.replace('\'', "''"))
            })
            .collect();
        props.push(format!("   partitioning = ARRAY[{}]", fields.join(", ")));
    }
    let order = m.default_sort_order();
    if !order.is_unsorted() {
        let fields: Vec<String> = order
            .fields
            .iter()
            .filter_map(|f| schema.field_by_id(f.source_id).map(|c| (c, f)))
            .map(|(c, f)| {
                let dir = match f.direction {
                    SortDirection::Ascending => "ASC",
                    SortDirection::Descending => "DESC",
                };
                let nulls = match f.null_order {
                    NullOrder::First => "NULLS FIRST",
                    NullOrder::Last => "NULLS LAST",
                };
                format!("'{} {dir} {nulls}'", c.name.replace('\'', "''"))
            })
            .collect();
        props.push(format!("   sorted_by = ARRAY[{}]", fields.join(", ")));
    }
    format!(
        "CREATE TABLE {qualified} (\n{}\n)\nWITH (\n{}\n)",
        columns.join(",\n"),
        props.join(",\n")
    )
}
