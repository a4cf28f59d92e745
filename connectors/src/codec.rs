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
use datafusion::datasource::MemTable;
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::functions_table::generate_series::{
    Empty as SeriesEmpty, GenSeriesArgs, GenerateSeriesTable, GenericSeriesState, TimestampValue,
};
use datafusion::logical_expr::{Extension, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::TableReference;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;
use serde::{Deserialize, Serialize};

use crate::iceberg::{
    IcebergScanExec, IcebergTableProvider, IcebergTableSpec, IcebergWriteExec, IcebergWriteNode,
    ScanSpec, WriteSpec,
};
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
            Some((k, payload)) if k == Kind::IcebergWriteExec as u8 => {
                let spec: WriteSpec = decode_json(payload)?;
                let input = inputs.first().cloned().ok_or_else(|| {
                    DataFusionError::Internal("IcebergWriteExec arrived without its input".into())
                })?;
                Ok(Arc::new(IcebergWriteExec::new(spec, input)))
            }
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
        if let Some(scan) = node.as_any().downcast_ref::<RemoteScanExec>() {
            return encode_json(Kind::RemoteScan, scan.spec(), buf);
        }
        self.inner.try_encode(node, buf)
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

/// Marks a Flight ticket that asks an executor to run one partition of a plan and stream
/// its batches back (a streamed stage), instead of fetching a shuffle file.
const STAGE_TICKET: &[u8] = b"BASIN-STAGE\0";

/// A Flight ticket for one partition of a streamed stage: [`STAGE_TICKET`] + a Ballista
/// `TaskDefinition` (plan encoded with [`physical_codec`], partition, session settings).
pub fn encode_stage_ticket(task: &ballista_core::serde::protobuf::TaskDefinition) -> Vec<u8> {
    use prost::Message;
    let mut buf = Vec::with_capacity(STAGE_TICKET.len() + task.encoded_len());
    buf.extend_from_slice(STAGE_TICKET);
    task.encode(&mut buf)
        .expect("a Vec grows to hold any message");
    buf
}

/// The task of a streamed-stage ticket; `None` when `ticket` is not one (a shuffle fetch).
pub fn decode_stage_ticket(
    ticket: &[u8],
) -> Option<Result<ballista_core::serde::protobuf::TaskDefinition>> {
    use prost::Message;
    let payload = ticket.strip_prefix(STAGE_TICKET)?;
    Some(
        ballista_core::serde::protobuf::TaskDefinition::decode(payload).map_err(|e| {
            DataFusionError::Internal(format!(
                "corrupt streamed-stage ticket (are scheduler and executors the same Basin \
                 version?): {e}"
            ))
        }),
    )
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
