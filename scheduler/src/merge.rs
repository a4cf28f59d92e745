//! `MERGE INTO <Iceberg table> USING <any query> ON … WHEN …` planned as one query whose rows
//! the executors write (copy-on-write; see `basin_connectors::iceberg::IcebergMergeNode`):
//!
//! 1. the target, read whole file by whole file with each row's file and ordinal, outer-joined
//!    with the source on the `ON` condition (a `LEFT` join, `FULL` when the statement inserts:
//!    the target side is never filtered, so a changed file is rewritten with all its rows);
//! 2. each joined row's clause: the first `WHEN` whose kind (matched, not matched, not matched
//!    by source) and condition hold, and so its action (update, delete, insert, or none);
//! 3. the new values of the table's columns;
//! 4. windows: how many source rows matched each target row (more than one fails the
//!    statement, the SQL standard's cardinality rule), and whether its file changes;
//! 5. only the rows of changed files and the inserted rows go to the writers.

use std::sync::Arc;

use basin_connectors::iceberg::{
    IcebergMergeNode, IcebergTableProvider, MERGE_ACTION_COLUMN, MERGE_FILE_COLUMN,
    MERGE_MATCHES_COLUMN, ROW_FILE_COLUMN, ROW_POS_COLUMN,
};
use datafusion::common::{Column, DFSchema, TableReference};
use datafusion::datasource::provider_as_source;
use datafusion::error::{DataFusionError, Result};
use datafusion::functions_aggregate::min_max::max_udaf;
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::WindowFunction;
use datafusion::logical_expr::{
    Expr, ExprFunctionExt, ExprSchemable, Extension, JoinType, LogicalPlan, LogicalPlanBuilder,
    case, col, lit, when,
};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement;
use datafusion::sql::sqlparser::ast::{
    Assignment, AssignmentTarget, Expr as SqlExpr, ExprWithAlias, Ident, MergeAction,
    MergeClauseKind, MergeInsertKind, ObjectName, Statement as SqlStatement, TableFactor,
};

/// The planned `MERGE`, or `None` for other statements.
pub async fn plan_merge(
    ctx: &SessionContext,
    statement: &Statement,
) -> Result<Option<LogicalPlan>> {
    let Statement::Statement(inner) = statement else {
        return Ok(None);
    };
    let SqlStatement::Merge(merge) = inner.as_ref() else {
        return Ok(None);
    };
    let state = ctx.state();
    let normalize = state.config_options().sql_parser.enable_ident_normalization;
    let ident = |i: &Ident| {
        if i.quote_style.is_none() && normalize {
            i.value.to_ascii_lowercase()
        } else {
            i.value.clone()
        }
    };
    let TableFactor::Table { name, alias, .. } = &merge.table else {
        return Err(DataFusionError::Plan(format!(
            "MERGE INTO {}: the target must be a table",
            merge.table
        )));
    };
    let Some((resolved, _, catalog)) = crate::sql::iceberg_table(ctx, name)? else {
        return Err(DataFusionError::NotImplemented(format!(
            "MERGE INTO {name}: Basin merges into Iceberg tables only"
        )));
    };
    let provider = ctx
        .table_provider(TableReference::from(resolved.clone()))
        .await?;
    let table = provider
        .as_any()
        .downcast_ref::<IcebergTableProvider>()
        .ok_or_else(|| {
            DataFusionError::NotImplemented(format!(
                "MERGE INTO {name}: Basin merges into Iceberg tables only"
            ))
        })?;
    let qualified = table.spec().qualified_name();
    if table.spec().time_travel {
        return Err(DataFusionError::Plan(format!(
            "cannot write to an old version of `{qualified}`"
        )));
    }
    let columns: Vec<(String, datafusion::arrow::datatypes::DataType)> = table
        .schema_ref()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    let target_name = match alias {
        Some(a) => ident(&a.name),
        None => resolved.table.to_string(),
    };
    let target_ref = TableReference::bare(target_name.clone());
    let tcol = |name: &str| Expr::Column(Column::new(Some(target_ref.clone()), name));

    // 1. The join.
    let target = LogicalPlanBuilder::scan(
        target_ref.clone(),
        provider_as_source(Arc::new(table.with_row_identity()?)),
        None,
    )?
    .build()?;
    let mut target_exprs: Vec<Expr> = target
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    target_exprs.push(lit(true).alias_qualified(Some(target_ref.clone()), "__basin_t"));
    let target = LogicalPlanBuilder::from(target)
        .project(target_exprs)?
        .build()?;
    let source = state
        .create_logical_plan(&format!("SELECT * FROM {}", merge.source))
        .await?;
    let mut source_exprs: Vec<Expr> = source
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    source_exprs.push(lit(true).alias("__basin_s"));
    let source = LogicalPlanBuilder::from(source)
        .project(source_exprs)?
        .build()?;
    let inserts = merge.clauses.iter().any(|c| {
        matches!(
            c.clause_kind,
            MergeClauseKind::NotMatched | MergeClauseKind::NotMatchedByTarget
        )
    });
    let joined_schema = target.schema().join(source.schema())?;
    let expr = |sql: &SqlExpr, schema: &DFSchema| {
        state.create_logical_expr_from_sql_expr(
            ExprWithAlias {
                expr: sql.clone(),
                alias: None,
            },
            schema,
        )
    };
    let on = expr(&merge.on, &joined_schema)?;
    let joined = LogicalPlanBuilder::from(target)
        .join_on(
            source,
            if inserts {
                JoinType::Full
            } else {
                JoinType::Left
            },
            vec![on],
        )?
        .build()?;
    let schema = joined.schema().clone();
    let s_flag = Expr::Column(Column::from(
        schema.qualified_field_with_unqualified_name("__basin_s")?,
    ));
    let t_present = tcol("__basin_t").is_not_null();
    let s_present = s_flag.clone().is_not_null();
    let matched = t_present.clone().and(s_present.clone());

    // 2. Each row's clause, and 3. the new values.
    let mut clause: Option<datafusion::logical_expr::conditional_expressions::CaseBuilder> = None;
    let mut action = case(col("__basin_clause"));
    let mut values: Vec<_> = columns
        .iter()
        .map(|_| case(col("__basin_clause")))
        .collect();
    let mut any_clause = false;
    let mut any_value = false;
    for (i, c) in merge.clauses.iter().enumerate() {
        let k = lit(i as i64 + 1);
        let kind = match c.clause_kind {
            MergeClauseKind::Matched => matched.clone(),
            MergeClauseKind::NotMatched | MergeClauseKind::NotMatchedByTarget => {
                tcol("__basin_t").is_null()
            }
            MergeClauseKind::NotMatchedBySource => s_flag.clone().is_null(),
        };
        let holds = match &c.predicate {
            Some(p) => kind.and(expr(p, &schema)?),
            None => kind,
        };
        clause = Some(match clause {
            None => when(holds, k.clone()),
            Some(mut b) => {
                b.when(holds, k.clone());
                b
            }
        });
        any_clause = true;
        let inserting = matches!(
            c.clause_kind,
            MergeClauseKind::NotMatched | MergeClauseKind::NotMatchedByTarget
        );
        match (&c.action, inserting) {
            (MergeAction::Update(update), false) => {
                if update.update_predicate.is_some() || update.delete_predicate.is_some() {
                    return Err(DataFusionError::NotImplemented(
                        "MERGE: Oracle's UPDATE … WHERE / DELETE WHERE is not supported; \
                         put the condition in WHEN MATCHED AND …"
                            .to_string(),
                    ));
                }
                action.when(k.clone(), lit(1));
                any_value = true;
                let assigned = assignments(&update.assignments, &ident, &qualified, &columns)?;
                for (at, (name, ty)) in columns.iter().enumerate() {
                    let value = match assigned.iter().find(|(n, _)| n == name) {
                        Some((_, v)) => expr(v, &schema)?.cast_to(ty, &schema)?,
                        None => tcol(name),
                    };
                    values[at].when(k.clone(), value);
                }
            }
            (MergeAction::Delete { .. }, false) => {
                action.when(k.clone(), lit(2));
            }
            (MergeAction::Insert(insert), true) => {
                action.when(k.clone(), lit(3));
                any_value = true;
                let MergeInsertKind::Values(rows) = &insert.kind else {
                    return Err(DataFusionError::NotImplemented(
                        "MERGE: INSERT ROW is not supported; list the values".to_string(),
                    ));
                };
                let [row] = rows.rows.as_slice() else {
                    return Err(DataFusionError::Plan(
                        "MERGE: WHEN NOT MATCHED THEN INSERT takes one row of values".to_string(),
                    ));
                };
                let names: Vec<String> = if insert.columns.is_empty() {
                    columns.iter().map(|c| c.0.clone()).collect()
                } else {
                    insert
                        .columns
                        .iter()
                        .map(|c| column_name(c, &ident))
                        .collect::<Result<_>>()?
                };
                if names.len() != row.len() {
                    return Err(DataFusionError::Plan(format!(
                        "MERGE: INSERT names {} columns and gives {} values",
                        names.len(),
                        row.len()
                    )));
                }
                for n in &names {
                    if !columns.iter().any(|(c, _)| c == n) {
                        return Err(DataFusionError::Plan(format!(
                            "MERGE: `{qualified}` has no column `{n}`"
                        )));
                    }
                }
                for (at, (name, ty)) in columns.iter().enumerate() {
                    let value = match names.iter().position(|n| n == name) {
                        Some(p) => expr(&row[p], &schema)?.cast_to(ty, &schema)?,
                        None => Expr::Literal(ty.try_into()?, None),
                    };
                    values[at].when(k.clone(), value);
                }
            }
            (a, true) => {
                return Err(DataFusionError::Plan(format!(
                    "MERGE: WHEN NOT MATCHED can only INSERT, not {a}"
                )));
            }
            (a, false) => {
                return Err(DataFusionError::Plan(format!(
                    "MERGE: WHEN MATCHED and WHEN NOT MATCHED BY SOURCE can UPDATE or DELETE, \
                     not {a}"
                )));
            }
        }
    }
    if !any_clause {
        return Err(DataFusionError::Plan(
            "MERGE needs at least one WHEN clause".to_string(),
        ));
    }
    let clause = clause
        .ok_or_else(|| DataFusionError::Internal("MERGE without clauses".to_string()))?
        .otherwise(lit(0i64))?;
    let mut exprs: Vec<Expr> = schema.columns().into_iter().map(Expr::Column).collect();
    exprs.push(clause.alias("__basin_clause"));
    let with_clause = LogicalPlanBuilder::from(joined).project(exprs)?.build()?;

    let mut exprs: Vec<Expr> = Vec::new();
    for (mut value, (name, _)) in values.into_iter().zip(&columns) {
        let value = if any_value {
            value.otherwise(tcol(name))?
        } else {
            tcol(name)
        };
        exprs.push(value.alias(name));
    }
    exprs.push(tcol(ROW_FILE_COLUMN).alias(MERGE_FILE_COLUMN));
    exprs.push(tcol(ROW_POS_COLUMN).alias("__basin_pos"));
    exprs.push(action.otherwise(lit(0))?.alias(MERGE_ACTION_COLUMN));
    // Whatever the clauses: a target row met twice by the join would be written twice.
    exprs.push(
        when(matched, lit(1i64))
            .otherwise(lit(0i64))?
            .alias("__basin_m"),
    );
    let rows = LogicalPlanBuilder::from(with_clause)
        .project(exprs)?
        .build()?;

    // 4. The windows, 5. the rows written.
    let matches = window(sum_udaf(), col("__basin_m"))
        .partition_by(vec![col(MERGE_FILE_COLUMN), col("__basin_pos")])
        .build()?
        .alias(MERGE_MATCHES_COLUMN);
    let rows = LogicalPlanBuilder::from(rows)
        .window(vec![matches])?
        .build()?;
    let changes = when(
        col(MERGE_ACTION_COLUMN)
            .in_list(vec![lit(1), lit(2)], false)
            .or(col(MERGE_MATCHES_COLUMN).gt(lit(1i64))),
        lit(1i64),
    )
    .otherwise(lit(0i64))?;
    let touched = window(max_udaf(), changes)
        .partition_by(vec![col(MERGE_FILE_COLUMN)])
        .build()?
        .alias("__basin_touched");
    let rows = LogicalPlanBuilder::from(rows)
        .window(vec![touched])?
        .filter(
            col("__basin_touched")
                .eq(lit(1i64))
                .or(col(MERGE_ACTION_COLUMN).eq(lit(3))),
        )?
        .build()?;
    let mut exprs: Vec<Expr> = columns.iter().map(|(n, _)| col(n.as_str())).collect();
    exprs.push(col(MERGE_FILE_COLUMN));
    exprs.push(col(MERGE_ACTION_COLUMN));
    exprs.push(col(MERGE_MATCHES_COLUMN));
    let rows = LogicalPlanBuilder::from(rows).project(exprs)?.build()?;
    let node = IcebergMergeNode::new(catalog, table.spec().clone(), rows)?;
    Ok(Some(LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    })))
}

/// An aggregate over a window (its `OVER` clause added by the caller).
fn window(fun: Arc<datafusion::logical_expr::AggregateUDF>, arg: Expr) -> Expr {
    Expr::from(WindowFunction::new(fun, vec![arg]))
}

/// `SET a = …, b = …` as (column, value); a column named twice or not in the table fails.
fn assignments(
    list: &[Assignment],
    ident: &impl Fn(&Ident) -> String,
    qualified: &str,
    columns: &[(String, datafusion::arrow::datatypes::DataType)],
) -> Result<Vec<(String, SqlExpr)>> {
    let mut out: Vec<(String, SqlExpr)> = Vec::new();
    for a in list {
        let AssignmentTarget::ColumnName(name) = &a.target else {
            return Err(DataFusionError::NotImplemented(
                "MERGE: tuple assignments are not supported".to_string(),
            ));
        };
        let name = column_name(name, ident)?;
        if !columns.iter().any(|(c, _)| c == &name) {
            return Err(DataFusionError::Plan(format!(
                "MERGE: `{qualified}` has no column `{name}`"
            )));
        }
        if out.iter().any(|(n, _)| n == &name) {
            return Err(DataFusionError::Plan(format!(
                "MERGE: column `{name}` is assigned twice"
            )));
        }
        out.push((name, a.value.clone()));
    }
    Ok(out)
}

/// The column an (optionally qualified) name names: its last part.
fn column_name(name: &ObjectName, ident: &impl Fn(&Ident) -> String) -> Result<String> {
    name.0
        .last()
        .and_then(|p| p.as_ident())
        .map(ident)
        .ok_or_else(|| DataFusionError::Plan(format!("MERGE: bad column name {name}")))
}
