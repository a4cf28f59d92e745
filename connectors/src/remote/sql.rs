//! Rendering of pushed-down SQL: DataFusion's unparser builds the statement; Basin then
//! renders every string literal itself, because the unparser's quoting is not safe
//! (sqlparser leaves a quote after a backslash unescaped, so `x\' OR 1=1 --` breaks out of
//! its literal). Identifiers are always quoted, and plans whose names contain a quote
//! character or a backslash are never pushed (see `pushdown::safe_name`).

use std::ops::ControlFlow;

use datafusion::error::{DataFusionError, Result};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, ObjectName, ObjectNamePart, Statement, TableFactor, Value, Visit, VisitMut,
    Visitor, VisitorMut,
};

use super::backend::SqlDialect;

/// A rendered SQL text whose string literals are still placeholders.
pub struct Rendered {
    text: String,
    literals: Vec<(String, String)>,
}

struct LiteralCollector {
    prefix: String,
    literals: Vec<(String, String)>,
    error: Option<String>,
}

impl VisitorMut for LiteralCollector {
    type Break = ();

    fn pre_visit_value(&mut self, value: &mut Value) -> ControlFlow<()> {
        match value {
            Value::SingleQuotedString(s) => {
                let token = format!("{}{}__", self.prefix, self.literals.len());
                self.literals.push((token.clone(), std::mem::take(s)));
                *value = Value::Placeholder(token);
                ControlFlow::Continue(())
            }
            Value::Number(_, _) | Value::Boolean(_) | Value::Null => ControlFlow::Continue(()),
            other => {
                self.error = Some(format!("literal form not pushed: {other}"));
                ControlFlow::Break(())
            }
        }
    }
}

struct CatalogStripper<'a> {
    catalog: &'a str,
}

impl VisitorMut for CatalogStripper<'_> {
    type Break = ();

    fn pre_visit_relation(&mut self, relation: &mut ObjectName) -> ControlFlow<()> {
        if relation.0.len() == 3
            && let ObjectNamePart::Identifier(first) = &relation.0[0]
            && first.value == self.catalog
        {
            relation.0.remove(0);
        }
        ControlFlow::Continue(())
    }
}

/// Tables of a statement: which real names are aliased, which appear unaliased.
#[derive(Default)]
struct AliasCollector {
    aliased: std::collections::HashMap<String, Vec<String>>,
    plain: std::collections::HashSet<String>,
}

impl Visitor for AliasCollector {
    type Break = ();

    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<()> {
        match t {
            TableFactor::Table { name, alias, .. } => {
                let table = name
                    .0
                    .last()
                    .and_then(|p| p.as_ident())
                    .map(|i| i.value.clone())
                    .unwrap_or_default();
                match alias {
                    Some(a) => self
                        .aliased
                        .entry(table)
                        .or_default()
                        .push(a.name.value.clone()),
                    None => {
                        self.plain.insert(table);
                    }
                }
            }
            TableFactor::Derived { alias: Some(a), .. } => {
                self.plain.insert(a.name.value.clone());
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// DataFusion 53's unparser sometimes qualifies a column with the table's real name where
/// the FROM clause only has the table's alias (`FROM items AS i … WHERE items.id < 12`).
/// Such qualifiers are renamed to the alias when that is unambiguous.
struct QualifierFixer {
    renames: std::collections::HashMap<String, String>,
}

impl VisitorMut for QualifierFixer {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut SqlExpr) -> ControlFlow<()> {
        if let SqlExpr::CompoundIdentifier(ids) = expr
            && ids.len() == 2
            && let Some(alias) = self.renames.get(&ids[0].value)
        {
            ids[0].value = alias.clone();
        }
        ControlFlow::Continue(())
    }
}

/// Drops Basin's catalog name from table references (`pg.public.t` → `public.t`) and takes
/// the string literals out of `stmt`.
pub fn prepare(stmt: &mut Statement, catalog: &str) -> Result<Rendered> {
    let _ = stmt.visit(&mut CatalogStripper { catalog });
    let mut tables = AliasCollector::default();
    let _ = Visit::visit(&*stmt, &mut tables);
    let aliases: std::collections::HashSet<String> =
        tables.aliased.values().flatten().cloned().collect();
    let renames = tables
        .aliased
        .iter()
        .filter(|(t, a)| a.len() == 1 && !tables.plain.contains(*t) && !aliases.contains(*t))
        .map(|(t, a)| (t.clone(), a[0].clone()))
        .collect();
    let _ = stmt.visit(&mut QualifierFixer { renames });
    collect(stmt, |s| s.to_string())
}

/// Same as [`prepare`] for a lone expression.
pub fn prepare_expr(expr: &mut SqlExpr) -> Result<Rendered> {
    collect(expr, |e| e.to_string())
}

fn collect<T: VisitMut>(node: &mut T, show: impl Fn(&T) -> String) -> Result<Rendered> {
    let mut collector = LiteralCollector {
        prefix: format!("$basin_{}_", uuid::Uuid::new_v4().simple()),
        literals: vec![],
        error: None,
    };
    let _ = node.visit(&mut collector);
    if let Some(e) = collector.error {
        return Err(DataFusionError::NotImplemented(e));
    }
    Ok(Rendered {
        text: show(node),
        literals: collector.literals,
    })
}

impl Rendered {
    /// The final SQL for `dialect`, literals escaped for it.
    pub fn finish(self, dialect: &dyn SqlDialect) -> Result<String> {
        let mut text = self.text;
        // Replace the longest tokens first so that `…_1__` never matches inside `…_11__`.
        // (Tokens end with `__`, which makes them prefix-free already.)
        for (token, value) in self.literals {
            let literal = dialect.quote_literal(&value)?;
            if !text.contains(&token) {
                return Err(DataFusionError::Internal(
                    "pushed-down literal lost while rendering".into(),
                ));
            }
            text = text.replacen(&token, &literal, 1);
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::super::backend::Dialect;

    fn quote_literal(value: &str, dialect: Dialect) -> datafusion::error::Result<String> {
        dialect.sql().quote_literal(value)
    }

    #[test]
    fn postgres_literals_cannot_break_out() {
        assert_eq!(
            quote_literal("x\\' OR 1=1) --", Dialect::Postgres).unwrap(),
            "E'x\\\\'' OR 1=1) --'"
        );
        assert!(quote_literal("a\0b", Dialect::Postgres).is_err());
    }

    #[test]
    fn mysql_literals_are_hex() {
        assert_eq!(
            quote_literal("a'", Dialect::MySql).unwrap(),
            "_utf8mb4 X'6127'"
        );
        assert_eq!(quote_literal("", Dialect::MySql).unwrap(), "_utf8mb4 X''");
    }

    #[test]
    fn sqlserver_literals_are_unicode_and_doubled() {
        assert_eq!(
            quote_literal("x' OR 1=1 --", Dialect::SqlServer).unwrap(),
            "N'x'' OR 1=1 --'"
        );
        // A backslash is an ordinary character in T-SQL strings.
        assert_eq!(quote_literal("\\'", Dialect::SqlServer).unwrap(), "N'\\'''");
        assert!(quote_literal("a\0b", Dialect::SqlServer).is_err());
    }
}
