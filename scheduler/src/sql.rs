//! Basin's SQL front: DataFusion's parser and planner, plus what Basin adds to them.
//!
//! - Trino's time travel, `t FOR VERSION AS OF <snapshot id | 'branch or tag'>` and
//!   `t FOR TIMESTAMP AS OF TIMESTAMP '...'`, which DataFusion's parser does not know: the
//!   clause is moved into the table name before parsing, and the Iceberg catalog reads it
//!   from there.
//! - `CREATE TABLE` / `CREATE TABLE ... AS SELECT` on Iceberg catalogs, with Trino's
//!   `WITH (partitioning = ARRAY[...], sorted_by = ARRAY[...], location = '...', ...)`.

use std::sync::Arc;

use basin_connectors::iceberg::{
    AlterOp, IcebergAlterTable, IcebergCatalog, IcebergCatalogProvider, IcebergCreateTable,
    IcebergMergeNode, IcebergProcedure, Procedure, TableOptions, TableVersion, VERSION_MARKER,
    create_table_text, namespace_ident, parse_timestamp,
};
use basin_core::sandbox::Sandbox;
use datafusion::catalog::CatalogProvider;
use datafusion::common::ResolvedTableReference;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{DdlStatement, Extension, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::{DFParser, Statement};
use datafusion::sql::planner::object_name_to_table_reference;
use datafusion::sql::sqlparser::ast::{
    AlterColumnOperation, AlterTableOperation, CreateTableOptions, Expr as SqlExpr, FunctionArg,
    FunctionArgExpr, FunctionArguments, Ident, ObjectName, ObjectNamePart,
    Statement as SqlStatement, Value,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::{Keyword, RESERVED_FOR_TABLE_ALIAS};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};

/// Parses SQL text into statements, with Basin's extensions.
pub fn parse(sql: &str) -> Result<Vec<Statement>> {
    let sql = rewrite_alter_execute(sql)?;
    let sql = rewrite_time_travel(&sql)?;
    Ok(DFParser::parse_sql(&sql)?.into_iter().collect())
}

/// Plans one parsed statement. In a sandboxed session ([`Sandbox`], Flight SQL clients),
/// a statement that names a location outside the sandbox fails here, before it runs.
pub async fn plan(ctx: &SessionContext, statement: Statement) -> Result<LogicalPlan> {
    let plan = plan_statement(ctx, statement).await?;
    let sandbox = ctx.state_ref().read().config().get_extension::<Sandbox>();
    if let Some(sandbox) = sandbox {
        check_locations(&sandbox, &plan)?;
    }
    let access = ctx
        .state_ref()
        .read()
        .config()
        .get_extension::<crate::access::SessionAccess>();
    if let Some(access) = access {
        let state = ctx.state();
        let options = &state.config_options().catalog;
        crate::access::check_plan(
            &access,
            &plan,
            (&options.default_catalog, &options.default_schema),
        )?;
    }
    Ok(plan)
}

/// Checks the locations a statement writes or registers, wherever it sits in the plan
/// (`EXPLAIN ANALYZE COPY …` runs the copy). Reads by `read_*()` are checked by the
/// functions themselves, before they read.
fn check_locations(sandbox: &Sandbox, plan: &LogicalPlan) -> Result<()> {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let check =
        |what: &str, location: &str| sandbox.check(what, location).map_err(DataFusionError::Plan);
    let check_table = |what: &str, location: &str| {
        sandbox
            .check_table_location(what, location)
            .map_err(DataFusionError::Plan)
    };
    plan.apply(|node| {
        match node {
            LogicalPlan::Ddl(DdlStatement::CreateExternalTable(create)) => {
                check("CREATE EXTERNAL TABLE", &create.location)?
            }
            LogicalPlan::Copy(copy) => check("COPY … TO", &copy.output_url)?,
            LogicalPlan::Extension(e) => {
                // Files registered where they are: the session must be allowed to read
                // them (each listed file is checked again when the procedure runs).
                if let Some(procedure) = e.node.as_any().downcast_ref::<IcebergProcedure>()
                    && let Procedure::AddFiles { location, .. } = &procedure.procedure
                {
                    check("add_files", location)?
                }
                if let Some(create) = e.node.as_any().downcast_ref::<IcebergCreateTable>() {
                    if let Some(location) = create.options.location.as_deref() {
                        check_table("CREATE TABLE … WITH (location)", location)?
                    }
                    // Where a table's files go (iceberg-rust's location generator reads
                    // these): the same places as its location.
                    for (key, value) in &create.options.properties {
                        let key = key.to_ascii_lowercase();
                        if key.ends_with(".path") || key.contains("location") {
                            check_table(&format!("CREATE TABLE … WITH (\"{key}\")"), value)?
                        }
                    }
                }
            }
            // Runtime settings reach the process itself (spill directory, memory pool).
            LogicalPlan::Statement(datafusion::logical_expr::Statement::SetVariable(set))
                if set
                    .variable
                    .to_ascii_lowercase()
                    .starts_with("datafusion.runtime.") =>
            {
                return Err(DataFusionError::Plan(format!(
                    "SET {}: runtime settings are the server's; an administrator sets them \
                     in basin.toml",
                    set.variable
                )));
            }
            _ => {}
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map(|_| ())
}

async fn plan_statement(ctx: &SessionContext, statement: Statement) -> Result<LogicalPlan> {
    if let Some(plan) = plan_iceberg_create_table(ctx, &statement).await? {
        return Ok(plan);
    }
    if let Some(plan) = plan_iceberg_alter_table(ctx, &statement).await? {
        return Ok(plan);
    }
    if let Some(plan) = plan_procedure(ctx, &statement).await? {
        return Ok(plan);
    }
    if let Some(plan) = crate::merge::plan_merge(ctx, &statement).await? {
        return Ok(plan);
    }
    if let Some(plan) = plan_show(ctx, &statement).await? {
        return Ok(plan);
    }
    // Errors of an INSERT name its table.
    let target = match &statement {
        Statement::Statement(s) => match s.as_ref() {
            SqlStatement::Insert(insert) => Some(insert.table.to_string()),
            _ => None,
        },
        _ => None,
    };
    let plan = ctx
        .state()
        .statement_to_plan(statement)
        .await
        .map_err(|e| match target {
            Some(table) => e.context(format!("cannot insert into `{table}`")),
            None => e,
        })?;
    if is_command(&plan) {
        return Ok(plan);
    }
    // Iceberg strings are read as views; clients get plain strings.
    basin_connectors::views::plain_strings_at_output(plan)
}

/// Parses and plans SQL text that holds exactly one statement.
pub async fn plan_one(ctx: &SessionContext, sql: &str) -> Result<LogicalPlan> {
    plan(ctx, parse_one(sql)?).await
}

/// Parses SQL text that holds exactly one statement.
pub fn parse_one(sql: &str) -> Result<Statement> {
    let mut statements = parse(sql)?;
    match statements.len() {
        0 => Err(DataFusionError::Plan("no SQL statement given".to_string())),
        1 => Ok(statements.remove(0)),
        n => Err(DataFusionError::Plan(format!(
            "expected one SQL statement, got {n}"
        ))),
    }
}

/// True for plans that change something (DDL, DML, Basin's Iceberg DDL): they run when
/// submitted, whether or not a client fetches their result.
pub fn is_command(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Ddl(_)
        | LogicalPlan::Dml(_)
        | LogicalPlan::Copy(_)
        | LogicalPlan::Statement(_) => true,
        LogicalPlan::Extension(e) => {
            e.node.as_any().is::<IcebergCreateTable>()
                || e.node.as_any().is::<IcebergAlterTable>()
                || e.node.as_any().is::<IcebergProcedure>()
                || e.node.as_any().is::<IcebergMergeNode>()
        }
        _ => false,
    }
}

/// A resolved table name, its catalog, and that catalog as an Iceberg catalog.
type IcebergTarget = (
    ResolvedTableReference,
    Arc<dyn CatalogProvider>,
    Arc<IcebergCatalog>,
);

/// Resolves a table name against the session's defaults; `Some` when its catalog is an
/// Iceberg catalog.
pub(crate) fn iceberg_table(
    ctx: &SessionContext,
    name: &ObjectName,
) -> Result<Option<IcebergTarget>> {
    let state = ctx.state();
    let options = state.config_options();
    let resolved = object_name_to_table_reference(
        name.clone(),
        options.sql_parser.enable_ident_normalization,
    )?
    .resolve(
        &options.catalog.default_catalog,
        &options.catalog.default_schema,
    );
    let Some(catalog) = ctx.catalog(&resolved.catalog) else {
        return Ok(None);
    };
    let Some(iceberg) = catalog
        .as_any()
        .downcast_ref::<IcebergCatalogProvider>()
        .map(|p| p.catalog().clone())
    else {
        return Ok(None);
    };
    Ok(Some((resolved, catalog, iceberg)))
}

async fn plan_iceberg_create_table(
    ctx: &SessionContext,
    statement: &Statement,
) -> Result<Option<LogicalPlan>> {
    let Statement::Statement(inner) = statement else {
        return Ok(None);
    };
    let SqlStatement::CreateTable(create) = inner.as_ref() else {
        return Ok(None);
    };
    let Some((resolved, catalog, iceberg)) = iceberg_table(ctx, &create.name)? else {
        return Ok(None);
    };
    let state = ctx.state();
    let table_options = match &create.table_options {
        CreateTableOptions::None => TableOptions::default(),
        CreateTableOptions::With(options) => TableOptions::from_sql(options)?,
        other => {
            return Err(DataFusionError::Plan(format!(
                "table options `{other}` are not supported; use WITH (partitioning = ARRAY[...], ...)"
            )));
        }
    };
    if catalog.schema(&resolved.schema).is_none() {
        return Err(DataFusionError::Plan(format!(
            "schema `{}.{}` does not exist; CREATE SCHEMA {}.{} creates it",
            resolved.catalog, resolved.schema, resolved.catalog, resolved.schema
        )));
    }
    // DataFusion plans the columns and the query; Basin creates the table.
    let mut plain = create.clone();
    plain.table_options = CreateTableOptions::None;
    let planned = state
        .statement_to_plan(Statement::Statement(Box::new(SqlStatement::CreateTable(
            plain,
        ))))
        .await?;
    let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) = planned else {
        return Err(DataFusionError::Plan(format!(
            "CREATE TABLE {} is not supported on an Iceberg catalog",
            create.name
        )));
    };
    if cmd.temporary {
        return Err(DataFusionError::Plan(
            "Iceberg tables cannot be TEMPORARY".to_string(),
        ));
    }
    let query = create.query.is_some().then(|| cmd.input.as_ref().clone());
    let node = IcebergCreateTable::new(
        iceberg,
        namespace_ident(&resolved.schema)?,
        resolved.table.to_string(),
        Arc::clone(cmd.input.schema().inner()),
        table_options,
        cmd.if_not_exists,
        cmd.or_replace,
        query,
    )?;
    Ok(Some(LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    })))
}

/// `SHOW SCHEMAS [FROM catalog]` (DataFusion has no plan for it) and `SHOW CREATE TABLE` of
/// Iceberg tables (their DDL, with the `WITH (...)` properties).
async fn plan_show(ctx: &SessionContext, statement: &Statement) -> Result<Option<LogicalPlan>> {
    let Statement::Statement(inner) = statement else {
        return Ok(None);
    };
    let state = ctx.state();
    let options = state.config_options().clone();
    match inner.as_ref() {
        SqlStatement::ShowVariable { variable }
            if variable.len() == 1 && variable[0].value.eq_ignore_ascii_case("grants") =>
        {
            Ok(Some(crate::access::show_grants(ctx).await?))
        }
        SqlStatement::ShowSchemas { show_options, .. } => {
            let catalog = match show_options
                .show_in
                .as_ref()
                .and_then(|i| i.parent_name.as_ref())
            {
                Some(name) => object_name_to_table_reference(
                    name.clone(),
                    options.sql_parser.enable_ident_normalization,
                )?
                .table()
                .to_string(),
                None => options.catalog.default_catalog.clone(),
            };
            if ctx.catalog(&catalog).is_none() {
                return Err(DataFusionError::Plan(format!(
                    "catalog `{catalog}` not found; SHOW CATALOGS lists the catalogs"
                )));
            }
            let sql = format!(
                "SELECT schema_name AS \"Schema\" FROM information_schema.schemata \
                 WHERE catalog_name = '{}' ORDER BY schema_name",
                catalog.replace('\'', "''")
            );
            Ok(Some(state.create_logical_plan(&sql).await?))
        }
        SqlStatement::ShowCreate { obj_type, obj_name }
            if *obj_type == datafusion::sql::sqlparser::ast::ShowCreateObject::Table =>
        {
            let Some((resolved, _, iceberg)) = iceberg_table(ctx, obj_name)? else {
                return Ok(None);
            };
            // The whole definition: only for a user who may read the whole table.
            if let Some(access) = state
                .config()
                .get_extension::<crate::access::SessionAccess>()
            {
                let table = datafusion::common::TableReference::full(
                    resolved.catalog.as_ref(),
                    resolved.schema.as_ref(),
                    resolved.table.as_ref(),
                );
                access.require_whole(&table)?;
            }
            let ident = basin_connectors::iceberg::table_ident(
                namespace_ident(&resolved.schema)?,
                resolved.table.to_string(),
            );
            let table = iceberg.load_table(&ident).await?;
            let qualified = iceberg.qualified(&ident);
            let text = create_table_text(&qualified, &table);
            let literal = |s: &str| datafusion::logical_expr::lit(s.to_string());
            let plan = datafusion::logical_expr::LogicalPlanBuilder::values(vec![vec![
                literal(&resolved.catalog),
                literal(&resolved.schema),
                literal(&resolved.table),
                literal(&text),
            ]])?
            .project(vec![
                datafusion::prelude::col("column1").alias("table_catalog"),
                datafusion::prelude::col("column2").alias("table_schema"),
                datafusion::prelude::col("column3").alias("table_name"),
                datafusion::prelude::col("column4").alias("definition"),
            ])?
            .build()?;
            Ok(Some(plan))
        }
        _ => Ok(None),
    }
}

async fn plan_iceberg_alter_table(
    ctx: &SessionContext,
    statement: &Statement,
) -> Result<Option<LogicalPlan>> {
    let Statement::Statement(inner) = statement else {
        return Ok(None);
    };
    let SqlStatement::AlterTable(alter) = inner.as_ref() else {
        return Ok(None);
    };
    let Some((resolved, _, iceberg)) = iceberg_table(ctx, &alter.name)? else {
        return Ok(None);
    };
    let state = ctx.state();
    let normalize = state.config_options().sql_parser.enable_ident_normalization;
    let ident_name = |i: &Ident| {
        if i.quote_style.is_none() && normalize {
            i.value.to_ascii_lowercase()
        } else {
            i.value.clone()
        }
    };
    let mut ops = Vec::new();
    for op in &alter.operations {
        match op {
            AlterTableOperation::AddColumn {
                if_not_exists,
                column_def,
                ..
            } => {
                // DataFusion's own type mapping, through a cast.
                let probe = state
                    .create_logical_plan(&format!(
                        "SELECT CAST(NULL AS {}) AS c",
                        column_def.data_type
                    ))
                    .await?;
                ops.push(AlterOp::AddColumn {
                    name: ident_name(&column_def.name),
                    data_type: probe.schema().field(0).data_type().clone(),
                    if_not_exists: *if_not_exists,
                });
            }
            AlterTableOperation::DropColumn {
                column_names,
                if_exists,
                ..
            } => {
                for name in column_names {
                    ops.push(AlterOp::DropColumn {
                        name: ident_name(name),
                        if_exists: *if_exists,
                    });
                }
            }
            AlterTableOperation::RenameColumn {
                old_column_name,
                new_column_name,
            } => ops.push(AlterOp::RenameColumn {
                from: ident_name(old_column_name),
                to: ident_name(new_column_name),
            }),
            AlterTableOperation::AlterColumn {
                column_name,
                op:
                    AlterColumnOperation::SetDataType {
                        data_type,
                        using: None,
                        ..
                    },
            } => {
                let probe = state
                    .create_logical_plan(&format!("SELECT CAST(NULL AS {data_type}) AS c"))
                    .await?;
                ops.push(AlterOp::SetType {
                    name: ident_name(column_name),
                    data_type: probe.schema().field(0).data_type().clone(),
                });
            }
            AlterTableOperation::AlterColumn {
                column_name,
                op: op @ (AlterColumnOperation::SetNotNull | AlterColumnOperation::DropNotNull),
            } => ops.push(AlterOp::SetRequired {
                name: ident_name(column_name),
                required: matches!(op, AlterColumnOperation::SetNotNull),
            }),
            other => {
                return Err(DataFusionError::NotImplemented(format!(
                    "ALTER TABLE {} {other}: Basin supports ADD COLUMN, DROP COLUMN, RENAME \
                     COLUMN, ALTER COLUMN … SET DATA TYPE (a widening) and ALTER COLUMN … DROP \
                     NOT NULL on Iceberg tables",
                    alter.name
                )));
            }
        }
    }
    let node = IcebergAlterTable::new(
        iceberg,
        namespace_ident(&resolved.schema)?,
        resolved.table.to_string(),
        ops,
    )?;
    Ok(Some(LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    })))
}

/// Trino's `ALTER TABLE t EXECUTE procedure[(argument => value, ...)]` as Spark's `CALL
/// system.procedure(table => 't', argument => value, ...)`, which the parser knows (the table
/// name kept as written, quotes and all). Other text is returned as it is.
pub fn rewrite_alter_execute(sql: &str) -> Result<String> {
    let upper = sql.to_ascii_uppercase();
    if !(upper.trim_start().starts_with("ALTER") && upper.contains("EXECUTE")) {
        return Ok(sql.to_string());
    }
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize_with_location() else {
        return Ok(sql.to_string()); // the parser says what is wrong
    };
    let offsets = LineOffsets::new(sql);
    let significant: Vec<&TokenWithSpan> = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .collect();
    let is_kw = |j: usize, kw: Keyword| {
        matches!(significant.get(j), Some(TokenWithSpan { token: Token::Word(w), .. })
            if w.keyword == kw && w.quote_style.is_none())
    };
    if !(is_kw(0, Keyword::ALTER) && is_kw(1, Keyword::TABLE)) {
        return Ok(sql.to_string());
    }
    // The name: words separated by periods, then EXECUTE.
    let is_word = |j: usize| matches!(significant.get(j).map(|t| &t.token), Some(Token::Word(_)));
    let is_period = |j: usize| matches!(significant.get(j).map(|t| &t.token), Some(Token::Period));
    let mut k = 2;
    while is_word(k) && is_period(k + 1) {
        k += 2;
    }
    if !is_word(k) || !is_kw(k + 1, Keyword::EXECUTE) {
        return Ok(sql.to_string());
    }
    k += 1;
    let Some(TokenWithSpan {
        token: Token::Word(procedure),
        ..
    }) = significant.get(k + 1)
    else {
        return Err(DataFusionError::Plan(
            "ALTER TABLE ... EXECUTE needs a procedure name, e.g. expire_snapshots".into(),
        ));
    };
    let at = |t: &TokenWithSpan, end: bool| {
        let p = if end { t.span.end } else { t.span.start };
        offsets.byte(p.line, p.column)
    };
    let name = &sql[at(significant[2], false)..at(significant[k - 1], true)];
    let unexpected = |what: &str| {
        DataFusionError::Plan(format!(
            "ALTER TABLE ... EXECUTE {}: unexpected `{what}` (arguments go in parentheses, \
             name => value, ..., and nothing may follow them)",
            procedure.value
        ))
    };
    // Nothing but `;` after the arguments: this is one statement.
    let only_end = |from: usize| {
        significant[from.min(significant.len())..]
            .iter()
            .all(|t| matches!(t.token, Token::SemiColon | Token::EOF))
    };
    let args = match significant.get(k + 2).map(|t| &t.token) {
        None => String::new(),
        Some(Token::SemiColon | Token::EOF) if only_end(k + 2) => String::new(),
        Some(Token::LParen) => {
            let mut depth = 0usize;
            let mut close = None;
            for (j, t) in significant.iter().enumerate().skip(k + 2) {
                match t.token {
                    Token::LParen => depth += 1,
                    Token::RParen => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            close = Some(j);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let Some(close) = close else {
                return Err(unexpected("("));
            };
            if !only_end(close + 1) {
                return Err(unexpected(&significant[close + 1].token.to_string()));
            }
            let is_table_arg = |j: usize| {
                matches!(significant.get(j).map(|t| &t.token), Some(Token::Word(w))
                    if w.value.eq_ignore_ascii_case("table"))
                    && matches!(
                        significant.get(j + 1).map(|t| &t.token),
                        Some(Token::RArrow)
                    )
            };
            if (k + 3..close).any(is_table_arg) {
                return Err(DataFusionError::Plan(format!(
                    "ALTER TABLE ... EXECUTE {}: the table is the one altered; `table => ...` \
                     belongs to CALL system.{}(...)",
                    procedure.value, procedure.value
                )));
            }
            let inner = sql[at(significant[k + 2], true)..at(significant[close], false)].trim();
            if inner.is_empty() {
                String::new()
            } else {
                format!(", {inner}")
            }
        }
        Some(other) => return Err(unexpected(&other.to_string())),
    };
    Ok(format!(
        "CALL system.{}(table => '{}'{args})",
        procedure.value,
        name.replace('\'', "''")
    ))
}

/// `CALL [catalog.]system.procedure(table => 'name', argument => value, ...)`: a maintenance
/// procedure on an Iceberg table ([`Procedure`]).
async fn plan_procedure(
    ctx: &SessionContext,
    statement: &Statement,
) -> Result<Option<LogicalPlan>> {
    let Statement::Statement(inner) = statement else {
        return Ok(None);
    };
    let SqlStatement::Call(function) = inner.as_ref() else {
        return Ok(None);
    };
    let parts: Vec<&Ident> = function
        .name
        .0
        .iter()
        .filter_map(ObjectNamePart::as_ident)
        .collect();
    let (catalog, procedure) = match parts[..] {
        [system, procedure] if system.value.eq_ignore_ascii_case("system") => (None, procedure),
        [catalog, system, procedure] if system.value.eq_ignore_ascii_case("system") => {
            (Some(catalog), procedure)
        }
        _ => {
            return Err(DataFusionError::Plan(format!(
                "CALL {}: Basin's procedures are CALL [catalog.]system.<procedure>(table => \
                 'name', ...): expire_snapshots, remove_orphan_files, rollback_to_snapshot, \
                 set_current_snapshot, optimize, add_files",
                function.name
            )));
        }
    };
    let FunctionArguments::List(list) = &function.args else {
        return Err(DataFusionError::Plan(format!(
            "CALL {}: give the arguments as name => value",
            function.name
        )));
    };
    let mut table = None;
    let mut args = Vec::new();
    for arg in &list.args {
        let (name, value) = match arg {
            FunctionArg::Named {
                name,
                arg: FunctionArgExpr::Expr(value),
                ..
            } => (name.value.clone(), value),
            FunctionArg::ExprNamed {
                name: SqlExpr::Identifier(name),
                arg: FunctionArgExpr::Expr(value),
                ..
            } => (name.value.clone(), value),
            other => {
                return Err(DataFusionError::Plan(format!(
                    "CALL {}: `{other}` is not an argument of the form name => value",
                    function.name
                )));
            }
        };
        let text = match value {
            SqlExpr::Value(v) => match &v.value {
                Value::SingleQuotedString(s) => s.clone(),
                Value::Number(n, _) => n.clone(),
                Value::Boolean(b) => b.to_string(),
                other => other.to_string(),
            },
            SqlExpr::TypedString(ts) => match &ts.value.value {
                Value::SingleQuotedString(s) => s.clone(),
                other => other.to_string(),
            },
            other => {
                return Err(DataFusionError::Plan(format!(
                    "CALL {}: argument `{name}` takes a literal, not `{other}`",
                    function.name
                )));
            }
        };
        if name.eq_ignore_ascii_case("table") {
            table = Some(text);
        } else {
            args.push((name, text));
        }
    }
    let Some(table) = table else {
        return Err(DataFusionError::Plan(format!(
            "CALL {}: name the table: table => 'schema.table'",
            function.name
        )));
    };
    let mut name = datafusion::sql::sqlparser::parser::Parser::new(&GenericDialect {})
        .try_with_sql(&table)
        .and_then(|mut p| p.parse_object_name(false))
        .map_err(|e| DataFusionError::Plan(format!("`{table}` is not a table name: {e}")))?;
    if let Some(catalog) = catalog {
        // `CALL lake.system.p(table => 't')`: `t` in `lake`, in the session's schema.
        if name.0.len() == 1 {
            let schema = ctx.state().config_options().catalog.default_schema.clone();
            name.0
                .insert(0, ObjectNamePart::Identifier(Ident::new(schema)));
        }
        if name.0.len() == 2 {
            name.0
                .insert(0, ObjectNamePart::Identifier(catalog.clone()));
        }
    }
    let Some((resolved, _, iceberg)) = iceberg_table(ctx, &name)? else {
        return Err(DataFusionError::Plan(format!(
            "{}: `{name}` is not in an Iceberg catalog",
            procedure.value
        )));
    };
    let now = chrono::Utc::now().timestamp_millis();
    let procedure = Procedure::parse(&procedure.value, &args, now)?;
    let ident = basin_connectors::iceberg::table_ident(
        namespace_ident(&resolved.schema)?,
        resolved.table.to_string(),
    );
    let node = IcebergProcedure::new(iceberg, ident, procedure)?;
    Ok(Some(LogicalPlan::Extension(Extension {
        node: Arc::new(node),
    })))
}

/// Moves Trino's `FOR VERSION AS OF` / `FOR TIMESTAMP AS OF` clauses into the table name
/// they follow (`t FOR VERSION AS OF 42` becomes `"t__basin_version_s42" AS "t"`).
pub fn rewrite_time_travel(sql: &str) -> Result<String> {
    // Cheap exit for the common case.
    let upper = sql.to_ascii_uppercase();
    if !upper.contains("AS OF") {
        return Ok(sql.to_string());
    }
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize_with_location()
        .map_err(|e| DataFusionError::SQL(Box::new(e.into()), None))?;
    let offsets = LineOffsets::new(sql);
    let significant: Vec<usize> = tokens
        .iter()
        .enumerate()
        .filter(|(_, t)| !matches!(t.token, Token::Whitespace(_)))
        .map(|(i, _)| i)
        .collect();
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let mut k = 0;
    while k < significant.len() {
        let at = |j: usize| significant.get(j).map(|&i| &tokens[i]);
        let is_kw = |j: usize, kw: Keyword| matches!(at(j), Some(TokenWithSpan { token: Token::Word(w), .. }) if w.keyword == kw && w.quote_style.is_none());
        if !(is_kw(k, Keyword::FOR)
            && (is_kw(k + 1, Keyword::VERSION) || is_kw(k + 1, Keyword::TIMESTAMP))
            && is_kw(k + 2, Keyword::AS)
            && is_kw(k + 3, Keyword::OF))
        {
            k += 1;
            continue;
        }
        let by_version = is_kw(k + 1, Keyword::VERSION);
        let mut v = k + 4;
        if !by_version && is_kw(v, Keyword::TIMESTAMP) {
            v += 1;
        }
        let value = at(v)
            .ok_or_else(|| DataFusionError::Plan("FOR ... AS OF needs a value".to_string()))?;
        let version = match (&value.token, by_version) {
            (Token::Number(n, _), true) => TableVersion::Snapshot(
                n.parse()
                    .map_err(|_| DataFusionError::Plan(format!("`{n}` is not a snapshot id")))?,
            ),
            (Token::SingleQuotedString(s), true) => match s.parse::<i64>() {
                Ok(id) => TableVersion::Snapshot(id),
                Err(_) => TableVersion::Ref(s.clone()),
            },
            (Token::SingleQuotedString(s), false) => TableVersion::TimestampMs(parse_timestamp(s)?),
            (other, true) => {
                return Err(DataFusionError::Plan(format!(
                    "FOR VERSION AS OF takes a snapshot id or a branch or tag name in quotes, got `{other}`"
                )));
            }
            (other, false) => {
                return Err(DataFusionError::Plan(format!(
                    "FOR TIMESTAMP AS OF takes TIMESTAMP '...', got `{other}`"
                )));
            }
        };
        let name = k.checked_sub(1).and_then(at);
        let Some(TokenWithSpan {
            token: Token::Word(word),
            span,
        }) = name
        else {
            return Err(DataFusionError::Plan(
                "FOR VERSION/TIMESTAMP AS OF must follow a table name".to_string(),
            ));
        };
        let table = if word.quote_style.is_some() {
            word.value.clone()
        } else {
            word.value.to_ascii_lowercase()
        };
        // Keep the table's own name as the alias, unless the query gives one.
        let has_alias = match at(v + 1) {
            Some(TokenWithSpan {
                token: Token::Word(w),
                ..
            }) => w.quote_style.is_some() || !RESERVED_FOR_TABLE_ALIAS.contains(&w.keyword),
            _ => false,
        };
        let quoted = format!("\"{}\"", table.replace('"', "\"\""));
        let mut replacement = format!(
            "\"{}{VERSION_MARKER}{}\"",
            table.replace('"', "\"\""),
            version.encode()
        );
        if !has_alias {
            replacement.push_str(" AS ");
            replacement.push_str(&quoted);
        }
        let start = offsets.byte(span.start.line, span.start.column);
        let end = offsets.byte(value.span.end.line, value.span.end.column);
        edits.push((start, end, replacement));
        k = v + 1;
    }
    let mut out = sql.to_string();
    for (start, end, text) in edits.into_iter().rev() {
        out.replace_range(start..end, &text);
    }
    Ok(out)
}

/// Byte offsets of (line, column) positions (1-based, columns in characters).
struct LineOffsets<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineOffsets<'a> {
    fn new(text: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self { text, starts }
    }

    fn byte(&self, line: u64, column: u64) -> usize {
        let Some(&start) = self.starts.get(line.saturating_sub(1) as usize) else {
            return self.text.len();
        };
        let rest = &self.text[start..];
        rest.char_indices()
            .nth(column.saturating_sub(1) as usize)
            .map(|(i, _)| start + i)
            .unwrap_or(self.text.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_alter_table_execute_as_call() {
        assert_eq!(
            rewrite_alter_execute(
                "ALTER TABLE lake.\"Odd's\".t EXECUTE expire_snapshots(retention_threshold => '7d');"
            )
            .unwrap(),
            "CALL system.expire_snapshots(table => 'lake.\"Odd''s\".t', retention_threshold => '7d')"
        );
        assert_eq!(
            rewrite_alter_execute("alter table t execute remove_orphan_files").unwrap(),
            "CALL system.remove_orphan_files(table => 't')"
        );
        let other = "ALTER TABLE t ADD COLUMN execute INT";
        assert_eq!(rewrite_alter_execute(other).unwrap(), other);
        assert!(rewrite_alter_execute("ALTER TABLE t EXECUTE optimize WHERE x").is_err());
        assert_eq!(
            rewrite_alter_execute("ALTER TABLE t EXECUTE p(a => f(1), b => 'x') ;").unwrap(),
            "CALL system.p(table => 't', a => f(1), b => 'x')"
        );
        // One statement only; the table is the one altered.
        assert!(rewrite_alter_execute("ALTER TABLE t EXECUTE p(a => 1); DELETE FROM t").is_err());
        assert!(rewrite_alter_execute("ALTER TABLE t EXECUTE p(table => 'u')").is_err());
    }

    #[test]
    fn rewrites_version_clauses() {
        let sql = "SELECT * FROM lake.s.orders FOR VERSION AS OF 42 o JOIN t FOR VERSION AS OF 'tag1' ON 1=1";
        assert_eq!(
            rewrite_time_travel(sql).unwrap(),
            "SELECT * FROM lake.s.\"orders__basin_version_s42\" o JOIN \"t__basin_version_r74616731\" AS \"t\" ON 1=1"
        );
        let sql = "select 'it''s' , x from \"Orders\"\n  for timestamp as of timestamp '2026-01-01 00:00:00'";
        assert_eq!(
            rewrite_time_travel(sql).unwrap(),
            "select 'it''s' , x from \"Orders__basin_version_t1767225600000\" AS \"Orders\""
        );
        assert_eq!(rewrite_time_travel("SELECT 1").unwrap(), "SELECT 1");
        assert!(rewrite_time_travel("SELECT * FROM t FOR VERSION AS OF x").is_err());
    }

    #[test]
    fn parses_timestamps() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:01").unwrap(), 1000);
        assert_eq!(parse_timestamp("1970-01-01 01:00:00 +01:00").unwrap(), 0);
        assert_eq!(parse_timestamp("1970-01-02").unwrap(), 86_400_000);
        assert!(parse_timestamp("yesterday").is_err());
    }
}
