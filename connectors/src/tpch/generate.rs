//! Row generation: one part of one table into Arrow record batches, building only the
//! projected columns.

use std::fmt::{Display, Write};
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayBuilder, ArrayRef, Date32Builder, Decimal128Builder, Int32Builder, Int64Builder,
    StringViewBuilder,
};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::error::Result;
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator,
    PartSuppGenerator, RegionGenerator, SupplierGenerator,
};

use super::scan::TpchScanSpec;
use super::tables::TpchTable;

/// One generated value.
enum V<'a> {
    I64(i64),
    I32(i32),
    /// Hundredths (DECIMAL(15,2)).
    Dec(i64),
    /// Days since the Unix epoch.
    Date(i32),
    Str(&'a str),
    Fmt(&'a dyn Display),
}

enum ColumnBuilder {
    I64(Int64Builder),
    I32(Int32Builder),
    Dec(Decimal128Builder),
    Date(Date32Builder),
    Str(StringViewBuilder),
}

impl ColumnBuilder {
    fn new(ty: &DataType, capacity: usize) -> Result<Self> {
        Ok(match ty {
            DataType::Int64 => Self::I64(Int64Builder::with_capacity(capacity)),
            DataType::Int32 => Self::I32(Int32Builder::with_capacity(capacity)),
            DataType::Decimal128(p, s) => Self::Dec(
                Decimal128Builder::with_capacity(capacity).with_precision_and_scale(*p, *s)?,
            ),
            DataType::Date32 => Self::Date(Date32Builder::with_capacity(capacity)),
            _ => Self::Str(StringViewBuilder::with_capacity(capacity)),
        })
    }

    fn append(&mut self, value: &V<'_>, scratch: &mut String) {
        match (self, value) {
            (Self::I64(b), V::I64(v)) => b.append_value(*v),
            (Self::I32(b), V::I32(v)) => b.append_value(*v),
            (Self::Dec(b), V::Dec(v)) => b.append_value(i128::from(*v)),
            (Self::Date(b), V::Date(v)) => b.append_value(*v),
            (Self::Str(b), V::Str(v)) => b.append_value(v),
            (Self::Str(b), V::Fmt(v)) => {
                scratch.clear();
                // Writing to a String cannot fail.
                let _ = write!(scratch, "{v}");
                b.append_value(scratch.as_str());
            }
            // The schema and the value lists below are written together; a mismatch is a
            // bug caught by the tests that generate every table.
            (b, _) => unreachable_mismatch(b),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Self::I64(b) => Arc::new(b.finish()),
            Self::I32(b) => Arc::new(b.finish()),
            Self::Dec(b) => Arc::new(b.finish()),
            Self::Date(b) => Arc::new(b.finish()),
            Self::Str(b) => Arc::new(b.finish()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::I64(b) => b.len(),
            Self::I32(b) => b.len(),
            Self::Dec(b) => b.len(),
            Self::Date(b) => b.len(),
            Self::Str(b) => b.len(),
        }
    }
}

#[cold]
fn unreachable_mismatch(_b: &mut ColumnBuilder) {
    debug_assert!(false, "tpch column type and generated value disagree");
}

/// Collects rows into batches of the projected columns.
struct BatchSink<'f> {
    schema: SchemaRef,
    projection: Vec<usize>,
    builders: Vec<ColumnBuilder>,
    batch_size: usize,
    remaining: usize,
    scratch: String,
    emit: &'f mut dyn FnMut(Result<RecordBatch>) -> bool,
    stopped: bool,
    /// Rows counted while no column is projected.
    empty_rows: usize,
}

impl BatchSink<'_> {
    /// Adds one row; returns false when generation should stop.
    fn push(&mut self, row: &[V<'_>]) -> bool {
        if self.remaining == 0 {
            return false;
        }
        for (builder, &col) in self.builders.iter_mut().zip(&self.projection) {
            builder.append(&row[col], &mut self.scratch);
        }
        self.remaining -= 1;
        if self.rows() >= self.batch_size || self.remaining == 0 {
            return self.flush();
        }
        true
    }

    fn rows(&self) -> usize {
        self.builders.first().map(ColumnBuilder::len).unwrap_or(0)
    }

    fn flush(&mut self) -> bool {
        if self.stopped {
            return false;
        }
        let columns: Vec<ArrayRef> = self.builders.iter_mut().map(|b| b.finish()).collect();
        let batch = if columns.is_empty() {
            // count(*)-style scans project no column: emit row counts only.
            let options = datafusion::arrow::record_batch::RecordBatchOptions::new()
                .with_row_count(Some(self.pending_rows_without_columns()));
            RecordBatch::try_new_with_options(self.schema.clone(), columns, &options)
        } else {
            RecordBatch::try_new(self.schema.clone(), columns)
        };
        let keep_going = (self.emit)(batch.map_err(Into::into));
        if !keep_going {
            self.stopped = true;
        }
        keep_going
    }

    fn pending_rows_without_columns(&mut self) -> usize {
        std::mem::take(&mut self.empty_rows)
    }
}

/// Generates partition `partition` (0-based) of the scan `spec`.
///
/// Batches hold the projected columns, at most `batch_size` rows each, and at most the
/// spec's limit in total. Each batch is handed to `emit`, which returns false to stop
/// generation early.
pub fn generate(
    spec: &TpchScanSpec,
    partition: usize,
    batch_size: usize,
    emit: &mut dyn FnMut(Result<RecordBatch>) -> bool,
) {
    let (table, sf, limit) = (spec.table, spec.scale_factor, spec.limit);
    let part = partition as i32 + 1;
    let parts = spec.parts.max(1) as i32;
    let projection = spec.projection.as_deref();
    let full = table.schema();
    let projection: Vec<usize> = projection
        .map(<[usize]>::to_vec)
        .unwrap_or_else(|| (0..full.fields().len()).collect());
    let schema = match full.project(&projection) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            emit(Err(e.into()));
            return;
        }
    };
    let batch_size = batch_size.max(1);
    let mut builders = Vec::with_capacity(projection.len());
    for field in schema.fields() {
        match ColumnBuilder::new(field.data_type(), batch_size) {
            Ok(b) => builders.push(b),
            Err(e) => {
                emit(Err(e));
                return;
            }
        }
    }
    let mut sink = BatchSink {
        schema,
        projection,
        builders,
        batch_size,
        remaining: limit.unwrap_or(usize::MAX),
        scratch: String::with_capacity(128),
        emit,
        stopped: false,
        empty_rows: 0,
    };
    let no_columns = sink.builders.is_empty();
    macro_rules! rows {
        ($iter:expr, |$r:ident| $values:expr) => {{
            for $r in $iter {
                let values = $values;
                if no_columns {
                    sink.empty_rows += 1;
                    sink.remaining = sink.remaining.saturating_sub(1);
                    if sink.empty_rows >= sink.batch_size || sink.remaining == 0 {
                        if !sink.flush() {
                            return;
                        }
                        if sink.remaining == 0 {
                            return;
                        }
                    }
                } else if !sink.push(&values) {
                    return;
                }
            }
        }};
    }
    match table {
        TpchTable::Nation => rows!(NationGenerator::new(sf, part, parts).iter(), |r| [
            V::I64(r.n_nationkey),
            V::Str(r.n_name),
            V::I64(r.n_regionkey),
            V::Str(r.n_comment),
        ]),
        TpchTable::Region => rows!(RegionGenerator::new(sf, part, parts).iter(), |r| [
            V::I64(r.r_regionkey),
            V::Str(r.r_name),
            V::Str(r.r_comment),
        ]),
        TpchTable::Part => rows!(PartGenerator::new(sf, part, parts).iter(), |r| [
            V::I64(r.p_partkey),
            V::Fmt(&r.p_name),
            V::Fmt(&r.p_mfgr),
            V::Fmt(&r.p_brand),
            V::Str(r.p_type),
            V::I32(r.p_size),
            V::Str(r.p_container),
            V::Dec(r.p_retailprice.0),
            V::Str(r.p_comment),
        ]),
        TpchTable::Supplier => rows!(SupplierGenerator::new(sf, part, parts).iter(), |r| [
            V::I64(r.s_suppkey),
            V::Fmt(&r.s_name),
            V::Fmt(&r.s_address),
            V::I64(r.s_nationkey),
            V::Fmt(&r.s_phone),
            V::Dec(r.s_acctbal.0),
            V::Str(&r.s_comment),
        ]),
        TpchTable::PartSupp => rows!(PartSuppGenerator::new(sf, part, parts).iter(), |r| [
            V::I64(r.ps_partkey),
            V::I64(r.ps_suppkey),
            V::I32(r.ps_availqty),
            V::Dec(r.ps_supplycost.0),
            V::Str(r.ps_comment),
        ]),
        TpchTable::Customer => rows!(CustomerGenerator::new(sf, part, parts).iter(), |r| [
            V::I64(r.c_custkey),
            V::Fmt(&r.c_name),
            V::Fmt(&r.c_address),
            V::I64(r.c_nationkey),
            V::Fmt(&r.c_phone),
            V::Dec(r.c_acctbal.0),
            V::Str(r.c_mktsegment),
            V::Str(r.c_comment),
        ]),
        TpchTable::Orders => rows!(OrderGenerator::new(sf, part, parts).iter(), |r| [
            V::I64(r.o_orderkey),
            V::I64(r.o_custkey),
            V::Str(r.o_orderstatus.as_str()),
            V::Dec(r.o_totalprice.0),
            V::Date(r.o_orderdate.to_unix_epoch()),
            V::Str(r.o_orderpriority),
            V::Fmt(&r.o_clerk),
            V::I32(r.o_shippriority),
            V::Str(r.o_comment),
        ]),
        TpchTable::LineItem => rows!(LineItemGenerator::new(sf, part, parts).iter(), |r| [
            V::I64(r.l_orderkey),
            V::I64(r.l_partkey),
            V::I64(r.l_suppkey),
            V::I32(r.l_linenumber),
            V::Dec(r.l_quantity * 100),
            V::Dec(r.l_extendedprice.0),
            V::Dec(r.l_discount.0),
            V::Dec(r.l_tax.0),
            V::Str(r.l_returnflag),
            V::Str(r.l_linestatus),
            V::Date(r.l_shipdate.to_unix_epoch()),
            V::Date(r.l_commitdate.to_unix_epoch()),
            V::Date(r.l_receiptdate.to_unix_epoch()),
            V::Str(r.l_shipinstruct),
            V::Str(r.l_shipmode),
            V::Str(r.l_comment),
        ]),
    }
    if no_columns {
        if sink.empty_rows > 0 {
            sink.flush();
        }
    } else if sink.rows() > 0 {
        sink.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(
        table: TpchTable,
        part: i32,
        parts: i32,
        projection: Option<&[usize]>,
        limit: Option<usize>,
    ) -> Vec<RecordBatch> {
        let mut out = vec![];
        let spec = TpchScanSpec {
            table,
            scale_factor: 0.01,
            parts: parts as usize,
            projection: projection.map(<[usize]>::to_vec),
            limit,
        };
        generate(&spec, part as usize - 1, 1000, &mut |b| {
            out.push(b.unwrap());
            true
        });
        out
    }

    fn rows(batches: &[RecordBatch]) -> usize {
        batches.iter().map(RecordBatch::num_rows).sum()
    }

    #[test]
    fn tiny_row_counts_match_dbgen() {
        let expected = [
            (TpchTable::Nation, 25),
            (TpchTable::Region, 5),
            (TpchTable::Part, 2000),
            (TpchTable::Supplier, 100),
            (TpchTable::PartSupp, 8000),
            (TpchTable::Customer, 1500),
            (TpchTable::Orders, 15000),
            (TpchTable::LineItem, 60175),
        ];
        for (table, n) in expected {
            let batches = collect(table, 1, 1, None, None);
            assert_eq!(rows(&batches), n, "{}", table.name());
            assert_eq!(batches[0].schema(), table.schema());
        }
    }

    #[test]
    fn parts_add_up_and_projection_limit_work() {
        let total: usize = (1..=3)
            .map(|p| rows(&collect(TpchTable::LineItem, p, 3, Some(&[0, 4]), None)))
            .sum();
        assert_eq!(total, 60175);
        let b = collect(TpchTable::Orders, 1, 1, Some(&[4]), Some(10));
        assert_eq!(rows(&b), 10);
        assert_eq!(b[0].num_columns(), 1);
        let counted = collect(TpchTable::Customer, 1, 1, Some(&[]), None);
        assert_eq!(rows(&counted), 1500);
    }
}
