//! Basin's plan codecs: how Basin's own table providers and plan nodes travel from the
//! client to the scheduler (logical plans) and from the scheduler to executors (physical
//! plans).
//!
//! Every Basin node is encoded as `BASIN` + a one-byte kind + JSON. Anything else is handed
//! to Ballista's codecs, which cover Ballista's shuffle nodes and DataFusion's file formats.

use std::sync::Arc;

use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::arrow::datatypes::{IntervalMonthDayNano, SchemaRef};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, DFSchemaRef};
use datafusion::datasource::MemTable;
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::functions_table::generate_series::{
    Empty as SeriesEmpty, GenSeriesArgs, GenerateSeriesTable, GenericSeriesState, TimestampValue,
};
use datafusion::logical_expr::expr::Alias;
use datafusion::logical_expr::{Distinct, Expr, Extension, LogicalPlan, SubqueryAlias, WindowUDF};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::work_table::WorkTableExec;
use datafusion::sql::TableReference;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;
use serde::{Deserialize, Serialize};

use crate::exchange::{ExchangeReadExec, PartitionSubsetExec};
use crate::iceberg::{
    IcebergRewriteExec, IcebergRewriteNode, IcebergScanExec, IcebergTableProvider,
    IcebergTableSpec, IcebergWriteExec, IcebergWriteNode, RewriteSpec, ScanSpec, WriteSpec,
};
use crate::mongodb::{MongoQuery, MongoQueryTable, MongoScanExec, MongoScanSpec};
use crate::remote::{RemoteQuery, RemoteQueryTable, RemoteScanExec, RemoteScanSpec};
use crate::tpch::{TpchOptions, TpchScanExec, TpchScanSpec, TpchTable, TpchTableProvider};

const MAGIC: &[u8] = b"BASIN";

/// Kinds of Basin-encoded objects.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    TpchTable = 1,
    TpchScan = 2,
    MemTable = 3,
    IcebergTable = 4,
    IcebergWrite = 5,
    IcebergScan = 6,
    IcebergWriteExec = 7,
    RemoteQueryTable = 8,
    RemoteScan = 9,
    Series = 10,
    PartitionSubset = 11,
    ExchangeRead = 12,
    WindowFunction = 13,
    RecursiveQuery = 14,
    WorkTable = 15,
    IcebergRewrite = 16,
    IcebergRewriteExec = 17,
    MongoQueryTable = 18,
    MongoScan = 19,
}

/// A `generate_series` / `range` table (a query that runs as a Ballista job sends its
/// logical plan, and datafusion-proto has no encoding for this provider). Its arguments
/// are read back from the generator it makes: the table keeps them private.
#[derive(Debug, Serialize, Deserialize)]
struct SeriesWire {
    /// `generate_series` (end included) or `range`.
    name: String,
    include_end: bool,
    /// `None`: an argument was null, the series is empty.
    values: Option<SeriesValues>,
}

#[derive(Debug, Serialize, Deserialize)]
enum SeriesValues {
    Int64 {
        start: i64,
        end: i64,
        step: i64,
    },
    /// Nanoseconds since the epoch; a step of months, days and nanoseconds. Date series
    /// run as timestamps without time zone, as DataFusion generates them.
    Timestamp {
        start: i64,
        end: i64,
        months: i32,
        days: i32,
        nanos: i64,
        tz: Option<String>,
    },
}

impl SeriesWire {
    fn of(table: &GenerateSeriesTable) -> Result<Option<Self>> {
        let generator = table.as_generator(1)?;
        let generator = generator.read();
        let any = generator.as_any();
        let (name, include_end, values) =
            if let Some(g) = any.downcast_ref::<GenericSeriesState<i64>>() {
                let (start, end, step) = (*g.start(), *g.end(), *g.step());
                (
                    g.name(),
                    g.include_end(),
                    Some(SeriesValues::Int64 { start, end, step }),
                )
            } else if let Some(g) = any.downcast_ref::<GenericSeriesState<TimestampValue>>() {
                let step = *g.step();
                let values = SeriesValues::Timestamp {
                    start: g.start().value(),
                    end: g.end().value(),
                    months: step.months,
                    days: step.days,
                    nanos: step.nanoseconds,
                    tz: g.start().tz_str().map(|tz| tz.to_string()),
                };
                (g.name(), g.include_end(), Some(values))
            } else if let Some(g) = any.downcast_ref::<SeriesEmpty>() {
                (g.name(), false, None)
            } else {
                return Ok(None);
            };
        Ok(Some(Self {
            name: name.to_string(),
            include_end,
            values,
        }))
    }

    fn into_args(self) -> GenSeriesArgs {
        let name = if self.name == "range" {
            "range"
        } else {
            "generate_series"
        };
        let include_end = self.include_end;
        match self.values {
            None => GenSeriesArgs::ContainsNull { name },
            Some(SeriesValues::Int64 { start, end, step }) => GenSeriesArgs::Int64Args {
                start,
                end,
                step,
                include_end,
                name,
            },
            Some(SeriesValues::Timestamp {
                start,
                end,
                months,
                days,
                nanos,
                tz,
            }) => GenSeriesArgs::TimestampArgs {
                start,
                end,
                step: IntervalMonthDayNano::new(months, days, nanos),
                tz: tz.map(Arc::from),
                include_end,
                name,
            },
        }
    }
}

fn encode_json<T: Serialize>(kind: Kind, value: &T, buf: &mut Vec<u8>) -> Result<()> {
    buf.extend_from_slice(MAGIC);
    buf.push(kind as u8);
    serde_json::to_writer(buf, value)
        .map_err(|e| DataFusionError::Internal(format!("cannot encode Basin plan node: {e}")))
}

/// Splits a Basin-encoded buffer into its kind and payload, or `None` for foreign bytes.
fn basin_payload(buf: &[u8]) -> Option<(u8, &[u8])> {
    let rest = buf.strip_prefix(MAGIC)?;
    let (&kind, payload) = rest.split_first()?;
    Some((kind, payload))
}

/// A window function that carries Basin's flags (`crate::windows`) as `BASIN` + its kind
/// + JSON; any other one as `otherwise` writes it.
fn encode_window_function(
    node: &WindowUDF,
    buf: &mut Vec<u8>,
    otherwise: impl FnOnce(&WindowUDF, &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    let mut payload = vec![];
    if !crate::windows::encode(node, &mut payload)? {
        return otherwise(node, buf);
    }
    buf.extend_from_slice(MAGIC);
    buf.push(Kind::WindowFunction as u8);
    buf.extend_from_slice(&payload);
    Ok(())
}

/// The window function [`encode_window_function`] wrote; any other one as `otherwise`
/// reads it.
fn decode_window_function(
    name: &str,
    buf: &[u8],
    otherwise: impl FnOnce(&str, &[u8]) -> Result<Arc<WindowUDF>>,
) -> Result<Arc<WindowUDF>> {
    match basin_payload(buf) {
        Some((k, payload)) if k == Kind::WindowFunction as u8 => crate::windows::decode(payload),
        _ => otherwise(name, buf),
    }
}

fn decode_json<'a, T: Deserialize<'a>>(payload: &'a [u8]) -> Result<T> {
    serde_json::from_slice(payload).map_err(|e| {
        DataFusionError::Internal(format!(
            "cannot decode Basin plan node (are scheduler and executors the same Basin \
             version?): {e}"
        ))
    })
}

#[derive(Serialize, Deserialize)]
struct TpchTableWire {
    table: TpchTable,
    scale_factor: f64,
    rows_per_partition: usize,
    min_partitions: usize,
}

/// Memory tables (`CREATE TABLE … AS`, `VALUES`) travel with their data: each partition
/// as an Arrow IPC stream, preceded by its length.
fn encode_mem_table(table: &MemTable, buf: &mut Vec<u8>) -> Result<()> {
    buf.extend_from_slice(MAGIC);
    buf.push(Kind::MemTable as u8);
    buf.extend_from_slice(&(table.batches.len() as u32).to_le_bytes());
    for partition in &table.batches {
        let batches = partition.try_read().map_err(|_| {
            DataFusionError::Execution(
                "a memory table is being written while a query reads it; retry".to_string(),
            )
        })?;
        let mut bytes = vec![];
        {
            let mut writer = StreamWriter::try_new(&mut bytes, &table.schema())?;
            for batch in batches.iter() {
                writer.write(batch)?;
            }
            writer.finish()?;
        }
        buf.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        buf.extend_from_slice(&bytes);
    }
    Ok(())
}

fn decode_mem_table(payload: &[u8], schema: SchemaRef) -> Result<MemTable> {
    let corrupt = || DataFusionError::Internal("corrupt memory table in plan".to_string());
    let (count, mut rest) = payload.split_first_chunk::<4>().ok_or_else(corrupt)?;
    // The count comes from the wire: never allocate more than the payload could hold.
    let mut partitions =
        Vec::with_capacity((u32::from_le_bytes(*count) as usize).min(rest.len() / 8));
    for _ in 0..u32::from_le_bytes(*count) {
        let (len, tail) = rest.split_first_chunk::<8>().ok_or_else(corrupt)?;
        let len = usize::try_from(u64::from_le_bytes(*len)).map_err(|_| corrupt())?;
        if tail.len() < len {
            return Err(corrupt());
        }
        let (bytes, tail) = tail.split_at(len);
        let reader = StreamReader::try_new(bytes, None)?;
        partitions.push(reader.collect::<std::result::Result<Vec<_>, _>>()?);
        rest = tail;
    }
    MemTable::try_new(schema, partitions)
}

/// Logical codec: Basin's table providers, then Ballista's.
#[derive(Debug, Default)]
pub struct BasinLogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for BasinLogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> Result<Extension> {
        match basin_payload(buf) {
            Some((k, payload)) if k == Kind::IcebergWrite as u8 => {
                let spec: WriteSpec = decode_json(payload)?;
                let input = inputs.first().cloned().ok_or_else(|| {
                    DataFusionError::Internal("IcebergWrite arrived without its input".into())
                })?;
                Ok(Extension {
                    node: Arc::new(IcebergWriteNode::new(spec, input)?),
                })
            }
            Some((k, payload)) if k == Kind::IcebergRewrite as u8 => {
                let spec: RewriteSpec = decode_json(payload)?;
                Ok(Extension {
                    node: Arc::new(IcebergRewriteNode::new(spec)?),
                })
            }
            Some((k, _)) => Err(DataFusionError::Internal(format!(
                "unknown Basin logical node kind {k}"
            ))),
            None => self.inner.try_decode(buf, inputs, ctx),
        }
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        if let Some(write) = node.node.as_any().downcast_ref::<IcebergWriteNode>() {
            return encode_json(Kind::IcebergWrite, &write.spec, buf);
        }
        if let Some(rewrite) = node.node.as_any().downcast_ref::<IcebergRewriteNode>() {
            return encode_json(Kind::IcebergRewrite, &rewrite.spec, buf);
        }
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        match basin_payload(buf) {
            Some((k, payload)) if k == Kind::TpchTable as u8 => {
                let wire: TpchTableWire = decode_json(payload)?;
                Ok(Arc::new(TpchTableProvider::new(
                    wire.table,
                    wire.scale_factor,
                    TpchOptions {
                        rows_per_partition: wire.rows_per_partition,
                        min_partitions: wire.min_partitions,
                    },
                )))
            }
            Some((k, payload)) if k == Kind::MemTable as u8 => {
                Ok(Arc::new(decode_mem_table(payload, schema)?))
            }
            Some((k, payload)) if k == Kind::IcebergTable as u8 => {
                let spec: IcebergTableSpec = decode_json(payload)?;
                Ok(Arc::new(IcebergTableProvider::from_spec(spec)?))
            }
            Some((k, payload)) if k == Kind::RemoteQueryTable as u8 => {
                let query: RemoteQuery = decode_json(payload)?;
                Ok(Arc::new(RemoteQueryTable::new(query, schema)))
            }
            Some((k, payload)) if k == Kind::MongoQueryTable as u8 => {
                let query: MongoQuery = decode_json(payload)?;
                Ok(Arc::new(MongoQueryTable::new(query, schema)))
            }
            Some((k, payload)) if k == Kind::Series as u8 => {
                let wire: SeriesWire = decode_json(payload)?;
                Ok(Arc::new(GenerateSeriesTable::new(schema, wire.into_args())))
            }
            Some((k, _)) => Err(DataFusionError::Internal(format!(
                "unknown Basin table provider kind {k} for {table_ref}"
            ))),
            None => self
                .inner
                .try_decode_table_provider(buf, table_ref, schema, ctx),
        }
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        if let Some(t) = node.as_any().downcast_ref::<TpchTableProvider>() {
            let options = t.options();
            return encode_json(
                Kind::TpchTable,
                &TpchTableWire {
                    table: t.table(),
                    scale_factor: t.scale_factor(),
                    rows_per_partition: options.rows_per_partition,
                    min_partitions: options.min_partitions,
                },
                buf,
            );
        }
        if let Some(t) = node.as_any().downcast_ref::<MemTable>() {
            return encode_mem_table(t, buf);
        }
        if let Some(t) = node.as_any().downcast_ref::<IcebergTableProvider>() {
            return encode_json(Kind::IcebergTable, t.spec(), buf);
        }
        if let Some(t) = node.as_any().downcast_ref::<RemoteQueryTable>() {
            return encode_json(Kind::RemoteQueryTable, t.query(), buf);
        }
        if let Some(t) = node.as_any().downcast_ref::<MongoQueryTable>() {
            return encode_json(Kind::MongoQueryTable, t.query(), buf);
        }
        if let Some(t) = node.as_any().downcast_ref::<GenerateSeriesTable>()
            && let Some(wire) = SeriesWire::of(t)?
        {
            return encode_json(Kind::Series, &wire, buf);
        }
        self.inner.try_encode_table_provider(table_ref, node, buf)
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        encode_window_function(node, buf, |node, buf| self.inner.try_encode_udwf(node, buf))
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> Result<Arc<WindowUDF>> {
        decode_window_function(name, buf, |name, buf| self.inner.try_decode_udwf(name, buf))
    }
}

/// Physical codec: Basin's execution plans, then Ballista's.
#[derive(Debug, Default)]
pub struct BasinPhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for BasinPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match basin_payload(buf) {
            Some((k, payload)) if k == Kind::TpchScan as u8 => {
                let spec: TpchScanSpec = decode_json(payload)?;
                Ok(Arc::new(TpchScanExec::try_new(spec)?))
            }
            Some((k, payload)) if k == Kind::IcebergScan as u8 => {
                let spec: ScanSpec = decode_json(payload)?;
                Ok(Arc::new(IcebergScanExec::try_new(spec)?))
            }
            Some((k, payload)) if k == Kind::RemoteScan as u8 => {
                let spec: RemoteScanSpec = decode_json(payload)?;
                Ok(Arc::new(RemoteScanExec::try_new(spec)?))
            }
            Some((k, payload)) if k == Kind::MongoScan as u8 => {
                let spec: MongoScanSpec = decode_json(payload)?;
                Ok(Arc::new(MongoScanExec::try_new(spec)?))
            }
            Some((k, payload)) if k == Kind::IcebergWriteExec as u8 => {
                let spec: WriteSpec = decode_json(payload)?;
                let input = inputs.first().cloned().ok_or_else(|| {
                    DataFusionError::Internal("IcebergWriteExec arrived without its input".into())
                })?;
                Ok(Arc::new(IcebergWriteExec::new(spec, input)))
            }
            Some((k, payload)) if k == Kind::IcebergRewriteExec as u8 => {
                let spec: RewriteSpec = decode_json(payload)?;
                Ok(Arc::new(IcebergRewriteExec::new(spec)))
            }
            Some((k, payload)) if k == Kind::PartitionSubset as u8 => {
                let (tasks, task): (usize, usize) = decode_json(payload)?;
                let input = inputs.first().cloned().ok_or_else(|| {
                    DataFusionError::Internal(
                        "PartitionSubsetExec arrived without its input".into(),
                    )
                })?;
                Ok(Arc::new(PartitionSubsetExec::try_new(input, tasks, task)?))
            }
            Some((k, payload)) if k == Kind::ExchangeRead as u8 => Ok(Arc::new(
                crate::exchange::decode_exchange_read(payload, ctx, self)?,
            )),
            Some((k, payload)) if k == Kind::RecursiveQuery as u8 => Ok(Arc::new(
                crate::recursive::recursive_query(decode_json(payload)?, inputs)?,
            )),
            Some((k, payload)) if k == Kind::WorkTable as u8 => Ok(Arc::new(
                crate::recursive::work_table(decode_json(payload)?)?,
            )),
            Some((k, _)) => Err(DataFusionError::Internal(format!(
                "unknown Basin execution plan kind {k}"
            ))),
            None => self.inner.try_decode(buf, inputs, ctx),
        }
    }

    fn try_encode(&self, node: Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> Result<()> {
        if let Some(scan) = node.as_any().downcast_ref::<TpchScanExec>() {
            return encode_json(Kind::TpchScan, scan.spec(), buf);
        }
        if let Some(scan) = node.as_any().downcast_ref::<IcebergScanExec>() {
            return encode_json(Kind::IcebergScan, scan.spec(), buf);
        }
        if let Some(write) = node.as_any().downcast_ref::<IcebergWriteExec>() {
            return encode_json(Kind::IcebergWriteExec, write.spec(), buf);
        }
        if let Some(rewrite) = node.as_any().downcast_ref::<IcebergRewriteExec>() {
            return encode_json(Kind::IcebergRewriteExec, rewrite.spec(), buf);
        }
        if let Some(scan) = node.as_any().downcast_ref::<RemoteScanExec>() {
            return encode_json(Kind::RemoteScan, scan.spec(), buf);
        }
        if let Some(scan) = node.as_any().downcast_ref::<MongoScanExec>() {
            return encode_json(Kind::MongoScan, scan.spec(), buf);
        }
        if let Some(subset) = node.as_any().downcast_ref::<PartitionSubsetExec>() {
            return encode_json(Kind::PartitionSubset, &(subset.tasks(), subset.task()), buf);
        }
        if let Some(recursive) = node.as_any().downcast_ref::<RecursiveQueryExec>() {
            return encode_json(
                Kind::RecursiveQuery,
                &crate::recursive::recursive_wire(recursive),
                buf,
            );
        }
        if let Some(table) = node.as_any().downcast_ref::<WorkTableExec>() {
            return encode_json(
                Kind::WorkTable,
                &crate::recursive::work_table_wire(table)?,
                buf,
            );
        }
        if let Some(read) = node.as_any().downcast_ref::<ExchangeReadExec>() {
            buf.extend_from_slice(MAGIC);
            buf.push(Kind::ExchangeRead as u8);
            return crate::exchange::encode_exchange_read(read, buf);
        }
        self.inner.try_encode(node, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        encode_window_function(node, buf, |node, buf| self.inner.try_encode_udwf(node, buf))
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> Result<Arc<WindowUDF>> {
        decode_window_function(name, buf, |name, buf| self.inner.try_decode_udwf(name, buf))
    }
}

/// The logical codec, shared.
pub fn logical_codec() -> Arc<dyn LogicalExtensionCodec> {
    Arc::new(BasinLogicalCodec::default())
}

/// The physical codec, shared.
pub fn physical_codec() -> Arc<dyn PhysicalExtensionCodec> {
    Arc::new(BasinPhysicalCodec::default())
}

/// Prefix of a table-reference part that [`portable_names`] rewrote.
const PORTABLE_PREFIX: &str = "basin_q_";

/// A logical plan whose table references all survive datafusion-proto, for a query that
/// travels to the scheduler as a Ballista job.
///
/// datafusion-proto 53 writes the table of a column reference as its unquoted text
/// (`Column::relation.to_string()`) and reads it back with `TableReference::parse_str`,
/// while a scan's or an alias's name travels as its parts. A part the SQL parser does not
/// read back as itself (`"Odd Schema"`, `"a.b"`, `"it's"`) breaks the pair:
/// `pg."Odd Schema"."Mixed Case"` comes back as one bare name, and the scheduler fails with
/// `No field named "pg.Odd Schema.Mixed Case"."Id"`. Here each such part is spelled with
/// letters, digits and `_` only (`Odd Schema` → `basin_q_Odd_20_Schema`: a character other
/// than an ASCII letter or digit as `_<hex code point>_`, `_` as `__`), and a part that
/// already starts with the prefix is spelled out too, so two names never meet. Expressions
/// whose output name shows a rewritten table (`max(pg.Odd Schema.T.Id)`) are aliased to
/// their old name, so the scheduler's plan produces the columns the client was promised.
/// Column names are never rewritten: datafusion-proto keeps them as they are.
///
/// A plan whose names are all portable is returned as it is.
pub fn portable_names(plan: LogicalPlan) -> Result<LogicalPlan> {
    if !has_unportable_names(&plan) {
        return Ok(plan);
    }
    plan.transform_up_with_subqueries(|node| portable_node(node).map(Transformed::yes))
        .map(|t| t.data)
}

/// Whether one part of a table reference is read back as itself: a single unquoted word
/// of DataFusion's parser (`parse_str` keeps its case), and not a rewritten one.
fn portable_part(part: &str) -> bool {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    if part.starts_with(PORTABLE_PREFIX) {
        return false;
    }
    match Tokenizer::new(&GenericDialect {}, part).tokenize() {
        Ok(tokens) => {
            matches!(tokens.as_slice(), [Token::Word(w)] if w.quote_style.is_none() && w.value == part)
        }
        Err(_) => false,
    }
}

/// `part` spelled with ASCII letters, digits and `_` (see [`portable_names`]).
fn portable_spelling(part: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(PORTABLE_PREFIX.len() + part.len() * 2);
    out.push_str(PORTABLE_PREFIX);
    for c in part.chars() {
        match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' => out.push(c),
            '_' => out.push_str("__"),
            _ => {
                let _ = write!(out, "_{:x}_", u32::from(c));
            }
        }
    }
    out
}

/// The portable form of `r`, or `None` when `r` is portable already.
fn portable_ref(r: &TableReference) -> Option<TableReference> {
    let part = |p: &Arc<str>| -> Arc<str> {
        if portable_part(p) {
            Arc::clone(p)
        } else {
            portable_spelling(p).into()
        }
    };
    let portable = match r {
        TableReference::Bare { table } => TableReference::Bare { table: part(table) },
        TableReference::Partial { schema, table } => TableReference::Partial {
            schema: part(schema),
            table: part(table),
        },
        TableReference::Full {
            catalog,
            schema,
            table,
        } => TableReference::Full {
            catalog: part(catalog),
            schema: part(schema),
            table: part(table),
        },
    };
    (&portable != r).then_some(portable)
}

fn portable(r: TableReference) -> TableReference {
    portable_ref(&r).unwrap_or(r)
}

fn has_unportable_names(plan: &LogicalPlan) -> bool {
    let mut found = false;
    let _ = plan.apply_with_subqueries(|node| {
        let named = match node {
            LogicalPlan::TableScan(scan) => Some(&scan.table_name),
            LogicalPlan::SubqueryAlias(alias) => Some(&alias.alias),
            _ => None,
        };
        found = named.is_some_and(|r| portable_ref(r).is_some())
            || node
                .schema()
                .iter()
                .any(|(q, _)| q.is_some_and(|q| portable_ref(q).is_some()));
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    found
}

fn portable_column(c: Column) -> Column {
    Column {
        relation: c.relation.map(portable),
        ..c
    }
}

/// `expr` with its column and alias tables portable.
fn portable_expr(expr: Expr) -> Result<Expr> {
    expr.transform(|e| {
        Ok(match e {
            Expr::Column(c) => Transformed::yes(Expr::Column(portable_column(c))),
            Expr::OuterReferenceColumn(field, c) => {
                Transformed::yes(Expr::OuterReferenceColumn(field, portable_column(c)))
            }
            Expr::Alias(alias) if alias.relation.is_some() => {
                Transformed::yes(Expr::Alias(Alias {
                    relation: alias.relation.map(portable),
                    ..alias
                }))
            }
            e => Transformed::no(e),
        })
    })
    .map(|t| t.data)
}

/// The names of the output expressions of a node that names its outputs after them.
fn output_names(node: &LogicalPlan) -> Vec<String> {
    let exprs: Vec<&Expr> = match node {
        LogicalPlan::Projection(p) => p.expr.iter().collect(),
        LogicalPlan::Aggregate(a) => a.group_expr.iter().chain(&a.aggr_expr).collect(),
        LogicalPlan::Window(w) => w.window_expr.iter().collect(),
        LogicalPlan::Distinct(Distinct::On(d)) => d.select_expr.iter().collect(),
        _ => vec![],
    };
    exprs.iter().map(|e| e.schema_name().to_string()).collect()
}

/// Output expressions under their old names: a computed expression's name shows the
/// tables of its columns (`max(pg.Odd Schema.T.Id)`), and the nodes above refer to it by
/// that name. A column keeps its name (its table is its qualifier), as does an alias.
fn keep_names(exprs: Vec<Expr>, names: &mut impl Iterator<Item = String>) -> Vec<Expr> {
    exprs
        .into_iter()
        .map(|e| {
            let Some(name) = names.next() else {
                return e;
            };
            let keeps_name = matches!(
                e,
                Expr::Column(_)
                    | Expr::OuterReferenceColumn(..)
                    | Expr::Alias(_)
                    | Expr::GroupingSet(_)
            );
            if keeps_name || e.schema_name().to_string() == name {
                e
            } else {
                e.alias(name)
            }
        })
        .collect()
}

/// `schema` with its qualifiers portable.
fn portable_schema(schema: &DFSchemaRef) -> Result<DFSchemaRef> {
    let fields = schema
        .iter()
        .map(|(q, f)| (q.cloned().map(portable), Arc::clone(f)))
        .collect();
    Ok(Arc::new(
        DFSchema::new_with_metadata(fields, schema.metadata().clone())?
            .with_functional_dependencies(schema.functional_dependencies().clone())?,
    ))
}

/// One node made portable; its inputs already are.
fn portable_node(node: LogicalPlan) -> Result<LogicalPlan> {
    let names = output_names(&node);
    let mut names = names.into_iter();
    let node = match node.map_expressions(portable_expr_transformed)?.data {
        LogicalPlan::Projection(mut p) => {
            p.expr = keep_names(p.expr, &mut names);
            LogicalPlan::Projection(p)
        }
        LogicalPlan::Aggregate(mut a) => {
            a.group_expr = keep_names(a.group_expr, &mut names);
            a.aggr_expr = keep_names(a.aggr_expr, &mut names);
            LogicalPlan::Aggregate(a)
        }
        LogicalPlan::Window(mut w) => {
            w.window_expr = keep_names(w.window_expr, &mut names);
            LogicalPlan::Window(w)
        }
        LogicalPlan::Distinct(Distinct::On(mut d)) => {
            d.select_expr = keep_names(d.select_expr, &mut names);
            LogicalPlan::Distinct(Distinct::On(d))
        }
        other => other,
    };
    Ok(match node {
        LogicalPlan::TableScan(mut scan) => {
            scan.table_name = portable(scan.table_name);
            scan.projected_schema = portable_schema(&scan.projected_schema)?;
            LogicalPlan::TableScan(scan)
        }
        LogicalPlan::SubqueryAlias(a) => {
            LogicalPlan::SubqueryAlias(SubqueryAlias::try_new(a.input, portable(a.alias))?)
        }
        LogicalPlan::Unnest(mut u) => {
            u.exec_columns = u.exec_columns.into_iter().map(portable_column).collect();
            for (_, list) in &mut u.list_type_columns {
                list.output_column = portable_column(list.output_column.clone());
            }
            u.schema = portable_schema(&u.schema)?;
            LogicalPlan::Unnest(u)
        }
        LogicalPlan::Union(mut u) => {
            u.schema = portable_schema(&u.schema)?;
            LogicalPlan::Union(u)
        }
        LogicalPlan::EmptyRelation(mut e) => {
            e.schema = portable_schema(&e.schema)?;
            LogicalPlan::EmptyRelation(e)
        }
        LogicalPlan::Values(mut v) => {
            v.schema = portable_schema(&v.schema)?;
            LogicalPlan::Values(v)
        }
        other => other.recompute_schema()?,
    })
}

fn portable_expr_transformed(expr: Expr) -> Result<Transformed<Expr>> {
    portable_expr(expr).map(Transformed::yes)
}

/// Marks a Flight ticket that asks an executor to run one partition of a plan and stream
/// its batches back (a streamed stage), instead of fetching a shuffle file.
const STAGE_TICKET: &[u8] = b"BASIN-STAGE\0";

/// A Flight ticket for one partition of a streamed stage: [`STAGE_TICKET`] + a Ballista
/// `TaskDefinition` (plan encoded with [`physical_codec`], partition, session settings).
pub fn encode_stage_ticket(task: &ballista_core::serde::protobuf::TaskDefinition) -> Vec<u8> {
    encode_ticket(STAGE_TICKET, task)
}

/// `prefix` and `task`: a Flight ticket executors tell from Ballista's shuffle fetches by its
/// prefix.
pub(crate) fn encode_ticket(
    prefix: &[u8],
    task: &ballista_core::serde::protobuf::TaskDefinition,
) -> Vec<u8> {
    use prost::Message;
    let mut buf = prefix.to_vec();
    buf.extend_from_slice(&task.encode_to_vec());
    buf
}

/// The task of a ticket made by [`encode_ticket`] with `prefix`; `None` when `ticket` has
/// another prefix. `kind` names the ticket in the error of a corrupt one.
pub(crate) fn decode_ticket(
    prefix: &[u8],
    kind: &str,
    ticket: &[u8],
) -> Option<Result<ballista_core::serde::protobuf::TaskDefinition>> {
    use prost::Message;
    let payload = ticket.strip_prefix(prefix)?;
    Some(
        ballista_core::serde::protobuf::TaskDefinition::decode(payload).map_err(|e| {
            DataFusionError::Internal(format!(
                "corrupt {kind} ticket (are scheduler and executors the same Basin version?): {e}"
            ))
        }),
    )
}

/// The task of a streamed-stage ticket; `None` when `ticket` is not one (a shuffle fetch).
pub fn decode_stage_ticket(
    ticket: &[u8],
) -> Option<Result<ballista_core::serde::protobuf::TaskDefinition>> {
    decode_ticket(STAGE_TICKET, "streamed-stage", ticket)
}

/// `plan` after a trip through Basin's physical codec, as an executor decodes it.
#[cfg(test)]
pub(crate) fn through_codec(
    plan: Arc<dyn ExecutionPlan>,
    ctx: &datafusion::prelude::SessionContext,
) -> Arc<dyn ExecutionPlan> {
    use datafusion_proto::physical_plan::AsExecutionPlan;
    use datafusion_proto::protobuf::PhysicalPlanNode;
    let codec = BasinPhysicalCodec::default();
    PhysicalPlanNode::try_from_physical_plan(plan, &codec)
        .unwrap()
        .try_into_physical_plan(&ctx.task_ctx(), &codec)
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    /// Each kind of series (integers, timestamps with a time zone, dates, a null
    /// argument) makes the same rows after a trip through the logical codec.
    #[tokio::test]
    async fn series_round_trip() {
        use datafusion::arrow::util::pretty::pretty_format_batches;
        use datafusion::common::ScalarValue;
        use datafusion::physical_plan::collect;
        use datafusion::prelude::{Expr, lit};
        let ctx = SessionContext::new();
        let codec = logical_codec();
        let ts = |v: i64| {
            lit(ScalarValue::TimestampNanosecond(
                Some(v),
                Some("+01:00".into()),
            ))
        };
        let step = |months: i32, days: i32, nanos: i64| {
            lit(ScalarValue::IntervalMonthDayNano(Some(
                IntervalMonthDayNano::new(months, days, nanos),
            )))
        };
        let date = |d: i32| lit(ScalarValue::Date32(Some(d)));
        for args in [
            vec![lit(1i64), lit(20i64), lit(3i64)],
            vec![lit(5i64)],
            vec![
                ts(1_585_350_000_000_000_000),
                ts(1_585_782_000_000_000_000),
                step(0, 1, 7_200_000_000_000),
            ],
            vec![date(18_292), date(18_443), step(1, 0, 0)],
            vec![lit(1i64), lit(ScalarValue::Null), lit(1i64)],
        ] {
            for function in ["generate_series", "range"] {
                let exprs: Vec<Expr> = args.clone();
                let table = ctx
                    .table_function(function)
                    .unwrap()
                    .create_table_provider(&exprs)
                    .unwrap();
                let mut buf = Vec::new();
                codec
                    .try_encode_table_provider(&"t".into(), Arc::clone(&table), &mut buf)
                    .unwrap();
                let back = codec
                    .try_decode_table_provider(&buf, &"t".into(), table.schema(), &ctx.task_ctx())
                    .unwrap();
                let mut shown = Vec::new();
                for t in [table, back] {
                    let scan = t.scan(&ctx.state(), None, &[], None).await.unwrap();
                    let rows = collect(scan, ctx.task_ctx()).await.unwrap();
                    shown.push(pretty_format_batches(&rows).unwrap().to_string());
                }
                assert_eq!(shown[0], shown[1], "{function}({args:?})");
            }
        }
    }

    /// Awkward names for schemas, tables and columns (the `names` suite of the CLI tests
    /// runs the same over every source and route).
    const AWKWARD: &[&str] = &[
        "Mixed Case",
        "Odd Schema.v1",
        "say \"hi\"",
        "it's",
        "a.b",
        "select",
        "order",
        "Größe",
        "名前",
        "back`tick",
        "basin_q_Mixed_20_Case",
        "_",
        "1st",
        "",
    ];

    /// Every part comes back as itself through datafusion-proto's column text, and no two
    /// parts (one of them spelled like a rewritten other) share a spelling.
    #[test]
    fn portable_parts_read_back_as_themselves_and_never_meet() {
        let mut spelled = std::collections::HashSet::new();
        for name in AWKWARD.iter().copied().chain(["id", "Id", "lineitem"]) {
            let r = TableReference::full("pg", name, name);
            let p = portable(r.clone());
            assert_eq!(
                TableReference::parse_str_normalized(&p.to_string(), true),
                p,
                "{name:?} as {p}"
            );
            assert!(
                spelled.insert(p.table().to_string()),
                "{name:?} meets another"
            );
            if portable_part(name) {
                assert_eq!(p, r, "a portable name is kept: {name:?}");
            }
        }
        assert_eq!(
            portable_spelling("Odd Schema.v1"),
            "basin_q_Odd_20_Schema_2e_v1"
        );
    }

    /// Queries over a table with awkward schema, table and column names, and aliases, read
    /// the same rows after a trip through the logical codec (as a Ballista job's plan
    /// travels) as before; without the rewrite the trip fails.
    #[tokio::test]
    async fn awkward_names_survive_the_logical_codec() {
        use datafusion::arrow::util::pretty::pretty_format_batches;
        use datafusion::catalog::{MemorySchemaProvider, SchemaProvider};
        use datafusion_proto::bytes::{
            logical_plan_from_bytes_with_extension_codec,
            logical_plan_to_bytes_with_extension_codec,
        };
        let ctx = SessionContext::new();
        ctx.sql(
            "CREATE TABLE datafusion.public.tmp AS SELECT * FROM (VALUES \
             (1, 'a', 10.0, 'x'), (2, 'b', 20.0, 'y'), (3, 'a', 30.0, 'x'), (4, NULL, 5.0, 'z')) \
             AS v(\"Id\", \"名前\", \"Größe\", \"it's \"\"q\"\"\")",
        )
        .await
        .unwrap();
        let table = ctx.table_provider("tmp").await.unwrap();
        let schema = Arc::new(MemorySchemaProvider::new());
        schema
            .register_table("Mixed \"Case\" it's".into(), Arc::clone(&table))
            .unwrap();
        schema.register_table("select".into(), table).unwrap();
        ctx.catalog("datafusion")
            .unwrap()
            .register_schema("Odd Schema.v1", schema)
            .unwrap();
        let t = "\"Odd Schema.v1\".\"Mixed \"\"Case\"\" it's\"";
        let codec = BasinLogicalCodec::default();
        for sql in [
            format!("SELECT * FROM {t}"),
            format!("SELECT \"Id\", \"Größe\" FROM {t} WHERE \"名前\" = 'a'"),
            format!(
                "SELECT \"名前\", count(*), sum(\"Größe\"), max(\"Id\") FROM {t} GROUP BY \"名前\""
            ),
            format!("SELECT \"Id\" FROM {t} ORDER BY \"Größe\" DESC"),
            format!(
                "SELECT a.\"Id\", b.\"it's \"\"q\"\"\" FROM {t} a JOIN \"Odd Schema.v1\".\"select\" b \
                 ON a.\"Id\" = b.\"Id\" + 1"
            ),
            format!(
                "SELECT x.\"Id\", \"y.z \"\"w\"\"\".\"Id\" FROM {t} x JOIN {t} AS \"y.z \"\"w\"\"\" \
                 ON x.\"名前\" = \"y.z \"\"w\"\"\".\"名前\""
            ),
            format!("SELECT upper(\"名前\"), sum(\"Id\" * 2) FROM {t} GROUP BY upper(\"名前\")"),
            format!("SELECT \"Id\", sum(\"Größe\") OVER (PARTITION BY \"名前\") FROM {t}"),
            format!(
                "SELECT DISTINCT ON (\"名前\") \"名前\", \"Id\" + 1 FROM {t} ORDER BY \"名前\", \"Id\""
            ),
            format!(
                "SELECT \"Id\" FROM {t} UNION ALL SELECT \"Id\" + 10 FROM \"Odd Schema.v1\".\"select\""
            ),
        ] {
            let df = ctx.sql(&sql).await.unwrap();
            let plan = df.clone().into_optimized_plan().unwrap();
            let want = pretty_format_batches(&df.collect().await.unwrap())
                .unwrap()
                .to_string();
            let mut want: Vec<&str> = want.lines().collect();
            want.sort();

            let portable = portable_names(plan.clone()).unwrap();
            assert_eq!(
                portable.schema().as_arrow(),
                plan.schema().as_arrow(),
                "{sql}"
            );
            let bytes = logical_plan_to_bytes_with_extension_codec(&portable, &codec).unwrap();
            let back =
                logical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &codec)
                    .unwrap_or_else(|e| panic!("{sql}: {e}\n{}", portable.display_indent()));
            let got = ctx.execute_logical_plan(back).await.unwrap();
            let got = pretty_format_batches(&got.collect().await.unwrap())
                .unwrap()
                .to_string();
            let mut got: Vec<&str> = got.lines().collect();
            got.sort();
            assert_eq!(got, want, "{sql}");
        }
        // The upstream gap this works around (docs/architecture.md): when this decodes,
        // datafusion-proto keeps table references and the rewrite can go.
        let plan = ctx
            .sql(&format!("SELECT \"Id\" FROM {t} ORDER BY \"Id\""))
            .await
            .unwrap()
            .into_optimized_plan()
            .unwrap();
        let bytes = logical_plan_to_bytes_with_extension_codec(&plan, &codec).unwrap();
        let planned =
            match logical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &codec) {
                Ok(back) => ctx.state().create_physical_plan(&back).await.map(|_| ()),
                Err(e) => Err(e),
            };
        let err = planned.unwrap_err();
        assert!(err.to_string().contains("No field named"), "{err}");
    }

    #[test]
    fn tpch_scan_round_trips() {
        let spec = TpchScanSpec {
            table: TpchTable::LineItem,
            scale_factor: 0.01,
            parts: 3,
            projection: Some(vec![0, 4]),
            limit: Some(7),
        };
        let exec: Arc<dyn ExecutionPlan> = Arc::new(TpchScanExec::try_new(spec.clone()).unwrap());
        let codec = BasinPhysicalCodec::default();
        let mut buf = vec![];
        codec.try_encode(exec, &mut buf).unwrap();
        let ctx = SessionContext::new();
        let back = codec.try_decode(&buf, &[], &ctx.task_ctx()).unwrap();
        let back = back.as_any().downcast_ref::<TpchScanExec>().unwrap();
        assert_eq!(back.spec(), &spec);
    }

    #[test]
    fn foreign_bytes_go_to_ballista() {
        let codec = BasinPhysicalCodec::default();
        let ctx = SessionContext::new();
        assert!(codec.try_decode(b"garbage", &[], &ctx.task_ctx()).is_err());
    }

    #[test]
    fn stage_tickets_round_trip_and_shuffle_tickets_are_not_stage_tickets() {
        let task = ballista_core::serde::protobuf::TaskDefinition {
            job_id: "stream-1".to_string(),
            partition_id: 3,
            plan: vec![1, 2, 3],
            session_id: "s".to_string(),
            ..Default::default()
        };
        let ticket = encode_stage_ticket(&task);
        assert_eq!(decode_stage_ticket(&ticket).unwrap().unwrap(), task);
        // A Ballista shuffle fetch is a protobuf action: never mistaken for a stage.
        assert!(decode_stage_ticket(&[0x0a, 0x02, 0x08, 0x01]).is_none());
        let mut corrupt = ticket.clone();
        corrupt.truncate(STAGE_TICKET.len() + 2);
        corrupt.push(0xff);
        let err = decode_stage_ticket(&corrupt).unwrap().unwrap_err();
        assert!(err.to_string().contains("streamed-stage ticket"), "{err}");
    }
}
