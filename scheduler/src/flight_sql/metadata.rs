//! What the Flight SQL endpoint tells clients about itself: `GetSqlInfo`, `GetXdbcTypeInfo`,
//! and the `ARROW:FLIGHT:SQL:*` metadata on result columns.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};

use arrow_flight::sql::metadata::{
    SqlInfoData, SqlInfoDataBuilder, XdbcTypeInfo, XdbcTypeInfoData, XdbcTypeInfoDataBuilder,
};
use arrow_flight::sql::{
    Nullable, Searchable, SqlInfo, SqlNullOrdering, SqlOuterJoinsSupportLevel,
    SqlSupportedCaseSensitivity, SqlSupportedGroupBy, SqlSupportedSubqueries,
    SqlSupportedTransaction, SqlSupportedUnions, SupportedSqlGrammar, XdbcDataType,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::DFSchema;

const KEYWORDS: &[&str] = &[
    "ANALYZE",
    "ARRAY",
    "COPY",
    "DESCRIBE",
    "EXPLAIN",
    "EXTERNAL",
    "FORMAT",
    "LOCATION",
    "OPTIONS",
    "PARTITIONED",
    "QUALIFY",
    "SHOW",
    "STORED",
    "TBLPROPERTIES",
    "UNNEST",
    "VERBOSE",
];
const NUMERIC_FUNCTIONS: &[&str] = &[
    "abs", "acos", "asin", "atan", "atan2", "cbrt", "ceil", "cos", "cot", "degrees", "exp",
    "floor", "gcd", "lcm", "ln", "log", "log10", "log2", "mod", "pi", "power", "radians", "random",
    "round", "sign", "sin", "sqrt", "tan", "trunc",
];
const STRING_FUNCTIONS: &[&str] = &[
    "ascii",
    "btrim",
    "char_length",
    "chr",
    "concat",
    "concat_ws",
    "initcap",
    "left",
    "length",
    "lower",
    "lpad",
    "ltrim",
    "md5",
    "octet_length",
    "repeat",
    "replace",
    "reverse",
    "right",
    "rpad",
    "rtrim",
    "split_part",
    "starts_with",
    "strpos",
    "substr",
    "substring",
    "translate",
    "trim",
    "upper",
];
const SYSTEM_FUNCTIONS: &[&str] = &["arrow_typeof", "coalesce", "nullif", "nvl", "version"];
const DATETIME_FUNCTIONS: &[&str] = &[
    "current_date",
    "current_time",
    "current_timestamp",
    "date_bin",
    "date_part",
    "date_trunc",
    "extract",
    "from_unixtime",
    "make_date",
    "now",
    "to_char",
    "to_date",
    "to_timestamp",
    "to_unixtime",
];

/// The answers to `GetSqlInfo`, built once.
pub static SQL_INFO: LazyLock<SqlInfoData> = LazyLock::new(|| {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "Basin");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, "1.3");
    b.append(SqlInfo::FlightSqlServerReadOnly, false);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(SqlInfo::FlightSqlServerSubstraitMinVersion, "");
    b.append(SqlInfo::FlightSqlServerSubstraitMaxVersion, "");
    b.append(
        SqlInfo::FlightSqlServerTransaction,
        SqlSupportedTransaction::None as i32,
    );
    b.append(SqlInfo::FlightSqlServerCancel, true);
    b.append(SqlInfo::FlightSqlServerBulkIngestion, false);
    b.append(SqlInfo::FlightSqlServerIngestTransactionsSupported, false);
    b.append(SqlInfo::FlightSqlServerStatementTimeout, 0i32);
    b.append(SqlInfo::FlightSqlServerTransactionTimeout, 0i32);
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, true);
    b.append(SqlInfo::SqlDdlTable, true);
    b.append(
        SqlInfo::SqlIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityLowercase as i32,
    );
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.append(
        SqlInfo::SqlQuotedIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityCaseInsensitive as i32,
    );
    b.append(SqlInfo::SqlAllTablesAreSelectable, true);
    b.append(
        SqlInfo::SqlNullOrdering,
        SqlNullOrdering::SqlNullsSortedHigh as i32,
    );
    b.append(SqlInfo::SqlKeywords, KEYWORDS);
    b.append(SqlInfo::SqlNumericFunctions, NUMERIC_FUNCTIONS);
    b.append(SqlInfo::SqlStringFunctions, STRING_FUNCTIONS);
    b.append(SqlInfo::SqlSystemFunctions, SYSTEM_FUNCTIONS);
    b.append(SqlInfo::SqlDatetimeFunctions, DATETIME_FUNCTIONS);
    b.append(SqlInfo::SqlSearchStringEscape, "\\");
    b.append(SqlInfo::SqlExtraNameCharacters, "");
    b.append(SqlInfo::SqlSupportsColumnAliasing, true);
    b.append(SqlInfo::SqlNullPlusNullIsNull, true);
    b.append(
        SqlInfo::SqlSupportsConvert,
        BTreeMap::<i32, Vec<i32>>::new(),
    );
    b.append(SqlInfo::SqlSupportsTableCorrelationNames, true);
    b.append(SqlInfo::SqlSupportsDifferentTableCorrelationNames, false);
    b.append(SqlInfo::SqlSupportsExpressionsInOrderBy, true);
    b.append(SqlInfo::SqlSupportsOrderByUnrelated, true);
    b.append(
        SqlInfo::SqlSupportedGroupBy,
        (1 << SqlSupportedGroupBy::SqlGroupByUnrelated as i32)
            | (1 << SqlSupportedGroupBy::SqlGroupByBeyondSelect as i32),
    );
    b.append(SqlInfo::SqlSupportsLikeEscapeClause, true);
    b.append(SqlInfo::SqlSupportsNonNullableColumns, true);
    b.append(
        SqlInfo::SqlSupportedGrammar,
        (1 << SupportedSqlGrammar::SqlMinimumGrammar as i32)
            | (1 << SupportedSqlGrammar::SqlCoreGrammar as i32),
    );
    // ANSI-92 entry and intermediate SQL.
    b.append(SqlInfo::SqlAnsi92SupportedLevel, 0b011);
    b.append(SqlInfo::SqlSupportsIntegrityEnhancementFacility, false);
    b.append(
        SqlInfo::SqlOuterJoinsSupportLevel,
        SqlOuterJoinsSupportLevel::SqlFullOuterJoins as i32,
    );
    b.append(SqlInfo::SqlSchemaTerm, "schema");
    b.append(SqlInfo::SqlProcedureTerm, "procedure");
    b.append(SqlInfo::SqlCatalogTerm, "catalog");
    b.append(SqlInfo::SqlCatalogAtStart, true);
    b.append(SqlInfo::SqlSchemasSupportedActions, 0i32);
    b.append(SqlInfo::SqlCatalogsSupportedActions, 0i32);
    b.append(SqlInfo::SqlSupportedPositionedCommands, 0i32);
    b.append(SqlInfo::SqlSelectForUpdateSupported, false);
    b.append(SqlInfo::SqlStoredProceduresSupported, false);
    b.append(
        SqlInfo::SqlSupportedSubqueries,
        (1 << SqlSupportedSubqueries::SqlSubqueriesInComparisons as i32)
            | (1 << SqlSupportedSubqueries::SqlSubqueriesInExists as i32)
            | (1 << SqlSupportedSubqueries::SqlSubqueriesInIns as i32),
    );
    b.append(SqlInfo::SqlCorrelatedSubqueriesSupported, true);
    b.append(
        SqlInfo::SqlSupportedUnions,
        (1 << SqlSupportedUnions::SqlUnion as i32) | (1 << SqlSupportedUnions::SqlUnionAll as i32),
    );
    for info in [
        SqlInfo::SqlMaxBinaryLiteralLength,
        SqlInfo::SqlMaxCharLiteralLength,
        SqlInfo::SqlMaxColumnNameLength,
        SqlInfo::SqlMaxColumnsInGroupBy,
        SqlInfo::SqlMaxColumnsInIndex,
        SqlInfo::SqlMaxColumnsInOrderBy,
        SqlInfo::SqlMaxColumnsInSelect,
        SqlInfo::SqlMaxColumnsInTable,
        SqlInfo::SqlMaxConnections,
        SqlInfo::SqlMaxCursorNameLength,
        SqlInfo::SqlMaxIndexLength,
        SqlInfo::SqlDbSchemaNameLength,
        SqlInfo::SqlMaxProcedureNameLength,
        SqlInfo::SqlMaxCatalogNameLength,
        SqlInfo::SqlMaxRowSize,
        SqlInfo::SqlMaxStatementLength,
        SqlInfo::SqlMaxStatements,
        SqlInfo::SqlMaxTableNameLength,
        SqlInfo::SqlMaxTablesInSelect,
        SqlInfo::SqlMaxUsernameLength,
    ] {
        // 0: no limit or unknown.
        b.append(info, 0i64);
    }
    b.append(SqlInfo::SqlMaxRowSizeIncludesBlobs, true);
    b.append(SqlInfo::SqlDefaultTransactionIsolation, 0i32);
    b.append(SqlInfo::SqlTransactionsSupported, false);
    b.append(SqlInfo::SqlSupportedTransactionsIsolationLevels, 0i32);
    b.append(SqlInfo::SqlDataDefinitionCausesTransactionCommit, false);
    b.append(SqlInfo::SqlDataDefinitionsInTransactionsIgnored, true);
    // Forward-only result sets, read-only concurrency.
    b.append(SqlInfo::SqlSupportedResultSetTypes, 1 << 1);
    b.append(
        SqlInfo::SqlSupportedConcurrenciesForResultSetUnspecified,
        0i32,
    );
    b.append(
        SqlInfo::SqlSupportedConcurrenciesForResultSetForwardOnly,
        1 << 1,
    );
    b.append(
        SqlInfo::SqlSupportedConcurrenciesForResultSetScrollSensitive,
        0i32,
    );
    b.append(
        SqlInfo::SqlSupportedConcurrenciesForResultSetScrollInsensitive,
        0i32,
    );
    b.append(SqlInfo::SqlBatchUpdatesSupported, false);
    b.append(SqlInfo::SqlSavepointsSupported, false);
    b.append(SqlInfo::SqlNamedParametersSupported, false);
    b.append(SqlInfo::SqlLocatorsUpdateCopy, false);
    b.append(SqlInfo::SqlStoredFunctionsUsingCallSyntaxSupported, false);
    // The builder only fails on inconsistent value types, which the table above rules out
    // (covered by a unit test).
    b.build()
        .unwrap_or_else(|e| panic!("static SqlInfo table is inconsistent: {e}"))
});

fn xdbc(
    name: &str,
    data_type: XdbcDataType,
    column_size: Option<i32>,
    prefix: Option<&str>,
    searchable: Searchable,
) -> XdbcTypeInfo {
    XdbcTypeInfo {
        type_name: name.to_string(),
        data_type,
        column_size,
        literal_prefix: prefix.map(str::to_string),
        literal_suffix: prefix.map(str::to_string),
        create_params: None,
        nullable: Nullable::NullabilityNullable,
        case_sensitive: matches!(data_type, XdbcDataType::XdbcVarchar),
        searchable,
        unsigned_attribute: Some(false),
        fixed_prec_scale: matches!(data_type, XdbcDataType::XdbcDecimal),
        auto_increment: Some(false),
        local_type_name: Some(name.to_string()),
        minimum_scale: None,
        maximum_scale: None,
        sql_data_type: data_type,
        datetime_subcode: None,
        num_prec_radix: None,
        interval_precision: None,
    }
}

/// The answers to `GetXdbcTypeInfo`.
pub static XDBC_TYPES: LazyLock<XdbcTypeInfoData> = LazyLock::new(|| {
    use Searchable::{Basic, Full};
    let mut b = XdbcTypeInfoDataBuilder::new();
    b.append(xdbc("BOOLEAN", XdbcDataType::XdbcBit, Some(1), None, Basic));
    b.append(xdbc(
        "TINYINT",
        XdbcDataType::XdbcTinyint,
        Some(3),
        None,
        Basic,
    ));
    b.append(xdbc(
        "SMALLINT",
        XdbcDataType::XdbcSmallint,
        Some(5),
        None,
        Basic,
    ));
    b.append(xdbc(
        "INTEGER",
        XdbcDataType::XdbcInteger,
        Some(10),
        None,
        Basic,
    ));
    b.append(xdbc(
        "BIGINT",
        XdbcDataType::XdbcBigint,
        Some(19),
        None,
        Basic,
    ));
    b.append(xdbc("REAL", XdbcDataType::XdbcReal, Some(7), None, Basic));
    b.append(xdbc(
        "DOUBLE",
        XdbcDataType::XdbcDouble,
        Some(15),
        None,
        Basic,
    ));
    b.append(xdbc(
        "DECIMAL",
        XdbcDataType::XdbcDecimal,
        Some(38),
        None,
        Basic,
    ));
    b.append(xdbc(
        "VARCHAR",
        XdbcDataType::XdbcVarchar,
        None,
        Some("'"),
        Full,
    ));
    b.append(xdbc(
        "VARBINARY",
        XdbcDataType::XdbcVarbinary,
        None,
        None,
        Basic,
    ));
    b.append(xdbc(
        "DATE",
        XdbcDataType::XdbcDate,
        Some(10),
        Some("'"),
        Basic,
    ));
    b.append(xdbc(
        "TIME",
        XdbcDataType::XdbcTime,
        Some(15),
        Some("'"),
        Basic,
    ));
    b.append(xdbc(
        "TIMESTAMP",
        XdbcDataType::XdbcTimestamp,
        Some(26),
        Some("'"),
        Basic,
    ));
    b.build()
        .unwrap_or_else(|e| panic!("static XDBC type table is inconsistent: {e}"))
});

/// SQL type name of an Arrow type, as clients show it.
pub fn sql_type_name(dt: &DataType) -> String {
    match dt {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int8 => "TINYINT".into(),
        DataType::Int16 => "SMALLINT".into(),
        DataType::Int32 => "INTEGER".into(),
        DataType::Int64 => "BIGINT".into(),
        DataType::UInt8 => "TINYINT UNSIGNED".into(),
        DataType::UInt16 => "SMALLINT UNSIGNED".into(),
        DataType::UInt32 => "INTEGER UNSIGNED".into(),
        DataType::UInt64 => "BIGINT UNSIGNED".into(),
        DataType::Float16 | DataType::Float32 => "REAL".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Decimal32(p, s)
        | DataType::Decimal64(p, s)
        | DataType::Decimal128(p, s)
        | DataType::Decimal256(p, s) => format!("DECIMAL({p},{s})"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "VARCHAR".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "VARBINARY".into(),
        DataType::FixedSizeBinary(n) => format!("BINARY({n})"),
        DataType::Date32 | DataType::Date64 => "DATE".into(),
        DataType::Time32(_) | DataType::Time64(_) => "TIME".into(),
        DataType::Timestamp(_, None) => "TIMESTAMP".into(),
        DataType::Timestamp(_, Some(_)) => "TIMESTAMP WITH TIME ZONE".into(),
        DataType::Interval(_) => "INTERVAL".into(),
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(_, _) => {
            "ARRAY".into()
        }
        DataType::Struct(_) => "STRUCT".into(),
        DataType::Map(_, _) => "MAP".into(),
        other => other.to_string(),
    }
}

fn precision_scale(dt: &DataType) -> Option<(u8, i8)> {
    match dt {
        DataType::Decimal32(p, s)
        | DataType::Decimal64(p, s)
        | DataType::Decimal128(p, s)
        | DataType::Decimal256(p, s) => Some((*p, *s)),
        DataType::Int8 => Some((3, 0)),
        DataType::Int16 => Some((5, 0)),
        DataType::Int32 => Some((10, 0)),
        DataType::Int64 => Some((19, 0)),
        _ => None,
    }
}

/// The result schema with `ARROW:FLIGHT:SQL:*` metadata on every column (type name,
/// precision, scale, nullability, and the catalog/schema/table it comes from when known).
pub fn annotate_schema(schema: &DFSchema) -> SchemaRef {
    let fields: Vec<Field> = schema
        .iter()
        .map(|(qualifier, field)| {
            let mut md: HashMap<String, String> = field.metadata().clone();
            let dt = field.data_type();
            md.insert("ARROW:FLIGHT:SQL:TYPE_NAME".into(), sql_type_name(dt));
            if let Some((p, s)) = precision_scale(dt) {
                md.insert("ARROW:FLIGHT:SQL:PRECISION".into(), p.to_string());
                md.insert("ARROW:FLIGHT:SQL:SCALE".into(), s.to_string());
            }
            md.insert(
                "ARROW:FLIGHT:SQL:IS_NULLABLE".into(),
                if field.is_nullable() { "1" } else { "0" }.into(),
            );
            md.insert("ARROW:FLIGHT:SQL:IS_READ_ONLY".into(), "1".into());
            md.insert("ARROW:FLIGHT:SQL:IS_SEARCHABLE".into(), "1".into());
            if let Some(q) = qualifier {
                if let Some(c) = q.catalog() {
                    md.insert("ARROW:FLIGHT:SQL:CATALOG_NAME".into(), c.to_string());
                }
                if let Some(s) = q.schema() {
                    md.insert("ARROW:FLIGHT:SQL:SCHEMA_NAME".into(), s.to_string());
                }
                md.insert("ARROW:FLIGHT:SQL:TABLE_NAME".into(), q.table().to_string());
            }
            field.as_ref().clone().with_metadata(md)
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_tables_build() {
        assert!(SQL_INFO.record_batch([0u32, 504, 508, 563]).is_ok());
        assert!(XDBC_TYPES.record_batch(None).is_ok());
    }
}
