//! Recursive queries (`WITH RECURSIVE`) on an executor.
//!
//! datafusion-proto 53 has no encoding for `RecursiveQueryExec` and the `WorkTableExec` its
//! recursive term reads, so such a plan could not travel to an executor, and as a Ballista
//! job its recursive term was cut into stages that never see the work table: the query
//! waited forever (DataFusion's `cte.slt`: every recursive query a timeout). The front end
//! runs a recursive query whole on one executor (`scheduler/src/frontend.rs`), and Basin's
//! codec carries both nodes: the work table by its name and schema, the recursive query by
//! its name and `DISTINCT`; decoding the recursive query links its work table again, as
//! DataFusion's own planner does (`RecursiveQueryExec::try_new`).

use std::sync::Arc;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::recursive_query::RecursiveQueryExec;
use datafusion::physical_plan::work_table::WorkTableExec;
use serde::{Deserialize, Serialize};

/// A recursive query: its inputs (static term, recursive term) travel as its children.
#[derive(Serialize, Deserialize)]
pub(crate) struct RecursiveWire {
    name: String,
    distinct: bool,
}

/// A work table: the name of its recursive query and its columns.
#[derive(Serialize, Deserialize)]
pub(crate) struct WorkTableWire {
    name: String,
    /// Its schema as an Arrow IPC stream without batches.
    schema: Vec<u8>,
}

pub(crate) fn recursive_wire(plan: &RecursiveQueryExec) -> RecursiveWire {
    RecursiveWire {
        name: plan.name().to_string(),
        distinct: plan.is_distinct(),
    }
}

pub(crate) fn work_table_wire(plan: &WorkTableExec) -> Result<WorkTableWire> {
    let mut schema = vec![];
    StreamWriter::try_new(&mut schema, &plan.schema())?.finish()?;
    Ok(WorkTableWire {
        name: plan.name().to_string(),
        schema,
    })
}

/// A work table not yet linked to its recursive query (see [`recursive_query`]).
pub(crate) fn work_table(wire: WorkTableWire) -> Result<WorkTableExec> {
    let schema = StreamReader::try_new(wire.schema.as_slice(), None)?.schema();
    WorkTableExec::new(wire.name, schema, None)
}

/// The recursive query of `wire` over its decoded `inputs`, its work table linked.
pub(crate) fn recursive_query(
    wire: RecursiveWire,
    inputs: &[Arc<dyn ExecutionPlan>],
) -> Result<RecursiveQueryExec> {
    let [static_term, recursive_term] = inputs else {
        return Err(DataFusionError::Internal(format!(
            "a recursive query arrived with {} inputs instead of 2",
            inputs.len()
        )));
    };
    let rows = static_term.schema();
    // A work table the optimizer narrowed to some columns reads them out of the query's
    // rows: its projection, which the node keeps private, is found again by name.
    let recursive_term = Arc::clone(recursive_term)
        .transform_down(|node| {
            let Some(table) = node.as_any().downcast_ref::<WorkTableExec>() else {
                return Ok(Transformed::no(node));
            };
            if table.name() != wire.name {
                return Ok(Transformed::no(node));
            }
            let projection = projection_of(&table.schema(), &rows)?;
            Ok(Transformed::yes(Arc::new(WorkTableExec::new(
                wire.name.clone(),
                Arc::clone(&rows),
                projection,
            )?) as Arc<dyn ExecutionPlan>))
        })?
        .data;
    RecursiveQueryExec::try_new(
        wire.name,
        Arc::clone(static_term),
        recursive_term,
        wire.distinct,
    )
}

/// The columns of `rows` that `columns` keeps, by name; `None` when it keeps all in order.
fn projection_of(columns: &SchemaRef, rows: &Schema) -> Result<Option<Vec<usize>>> {
    let projection = columns
        .fields()
        .iter()
        .map(|f| {
            rows.index_of(f.name()).map_err(|_| {
                DataFusionError::Internal(format!(
                    "a recursive query's work table has a column {:?} its rows do not",
                    f.name()
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let all = projection.len() == rows.fields().len()
        && projection.iter().enumerate().all(|(i, &p)| i == p);
    Ok((!all).then_some(projection))
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::physical_plan::{collect, displayable};
    use datafusion::prelude::{SessionConfig, SessionContext};
    use std::sync::Arc;

    use crate::codec::through_codec;

    #[tokio::test]
    async fn recursive_queries_answer_the_same_after_the_codec() {
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
        ctx.sql("CREATE TABLE edges(a INT, b INT) AS VALUES (1, 2), (2, 3), (3, 4), (2, 5)")
            .await
            .unwrap();
        for sql in [
            "WITH RECURSIVE nodes AS (SELECT 1 AS id UNION ALL SELECT id + 1 FROM nodes \
             WHERE id < 10) SELECT * FROM nodes",
            // The recursive term reads one of two columns: a narrowed work table.
            "WITH RECURSIVE t AS (SELECT 1 AS n, 'a' AS s UNION ALL SELECT n + 1, 'b' FROM t \
             WHERE n < 5) SELECT n, s FROM t ORDER BY n",
            // A join with a table inside the recursive term, and UNION (distinct).
            "WITH RECURSIVE reach AS (SELECT 1 AS x UNION SELECT e.b FROM reach r \
             JOIN edges e ON r.x = e.a) SELECT x FROM reach ORDER BY x",
        ] {
            let direct = ctx.sql(sql).await.unwrap().collect().await.unwrap();
            let physical = ctx
                .sql(sql)
                .await
                .unwrap()
                .create_physical_plan()
                .await
                .unwrap();
            let decoded = through_codec(Arc::clone(&physical), &ctx);
            assert_eq!(
                displayable(decoded.as_ref()).indent(true).to_string(),
                displayable(physical.as_ref()).indent(true).to_string(),
                "{sql}"
            );
            let travelled = collect(decoded, ctx.task_ctx()).await.unwrap();
            let sorted = |b: &[_]| {
                let text = pretty_format_batches(b).unwrap().to_string();
                let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
                lines.sort();
                lines
            };
            assert_eq!(sorted(&direct), sorted(&travelled), "{sql}");
        }
    }
}
