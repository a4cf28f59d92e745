//! The eight TPC-H tables: names, Arrow schemas and size estimates.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

/// One of the eight TPC-H tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TpchTable {
    Nation,
    Region,
    Part,
    Supplier,
    PartSupp,
    Customer,
    Orders,
    LineItem,
}

/// Money and quantity columns: DECIMAL(15,2) as in the TPC-H specification.
const MONEY: DataType = DataType::Decimal128(15, 2);

impl TpchTable {
    /// All tables, in the specification's order.
    pub const ALL: [TpchTable; 8] = [
        TpchTable::Nation,
        TpchTable::Region,
        TpchTable::Part,
        TpchTable::Supplier,
        TpchTable::PartSupp,
        TpchTable::Customer,
        TpchTable::Orders,
        TpchTable::LineItem,
    ];

    /// The SQL name of the table.
    pub fn name(self) -> &'static str {
        match self {
            TpchTable::Nation => "nation",
            TpchTable::Region => "region",
            TpchTable::Part => "part",
            TpchTable::Supplier => "supplier",
            TpchTable::PartSupp => "partsupp",
            TpchTable::Customer => "customer",
            TpchTable::Orders => "orders",
            TpchTable::LineItem => "lineitem",
        }
    }

    /// Looks a table up by its SQL name (case-insensitive).
    pub fn from_name(name: &str) -> Option<TpchTable> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Estimated number of rows at scale factor `sf` (exact except for lineitem).
    pub fn row_count(self, sf: f64) -> u64 {
        let scaled = |base: f64| (base * sf) as u64;
        match self {
            TpchTable::Nation => 25,
            TpchTable::Region => 5,
            TpchTable::Part => scaled(200_000.0),
            TpchTable::Supplier => scaled(10_000.0),
            TpchTable::PartSupp => scaled(200_000.0) * 4,
            TpchTable::Customer => scaled(150_000.0),
            TpchTable::Orders => scaled(1_500_000.0),
            // 1 to 7 lines per order, 4 on average.
            TpchTable::LineItem => scaled(1_500_000.0) * 4,
        }
    }

    /// Whether [`TpchTable::row_count`] is exact.
    pub fn row_count_is_exact(self) -> bool {
        self != TpchTable::LineItem
    }

    /// Rows of the generator's unit of splitting per output row (partsupp and lineitem are
    /// split by part and by order).
    pub fn rows_per_split_unit(self) -> u64 {
        match self {
            TpchTable::PartSupp | TpchTable::LineItem => 4,
            _ => 1,
        }
    }

    /// Whether the generator can split this table into parts (nation and region cannot).
    pub fn splittable(self) -> bool {
        !matches!(self, TpchTable::Nation | TpchTable::Region)
    }

    /// The table's Arrow schema.
    pub fn schema(self) -> SchemaRef {
        SCHEMAS[self as usize].clone()
    }
}

static SCHEMAS: LazyLock<Vec<SchemaRef>> = LazyLock::new(|| {
    TpchTable::ALL
        .into_iter()
        .map(|t| Arc::new(Schema::new(columns(t))))
        .collect()
});

fn columns(table: TpchTable) -> Vec<Field> {
    use DataType::{Date32, Int32, Int64, Utf8View as Str};
    let cols: &[(&str, DataType)] = match table {
        TpchTable::Nation => &[
            ("n_nationkey", Int64),
            ("n_name", Str),
            ("n_regionkey", Int64),
            ("n_comment", Str),
        ],
        TpchTable::Region => &[("r_regionkey", Int64), ("r_name", Str), ("r_comment", Str)],
        TpchTable::Part => &[
            ("p_partkey", Int64),
            ("p_name", Str),
            ("p_mfgr", Str),
            ("p_brand", Str),
            ("p_type", Str),
            ("p_size", Int32),
            ("p_container", Str),
            ("p_retailprice", MONEY),
            ("p_comment", Str),
        ],
        TpchTable::Supplier => &[
            ("s_suppkey", Int64),
            ("s_name", Str),
            ("s_address", Str),
            ("s_nationkey", Int64),
            ("s_phone", Str),
            ("s_acctbal", MONEY),
            ("s_comment", Str),
        ],
        TpchTable::PartSupp => &[
            ("ps_partkey", Int64),
            ("ps_suppkey", Int64),
            ("ps_availqty", Int32),
            ("ps_supplycost", MONEY),
            ("ps_comment", Str),
        ],
        TpchTable::Customer => &[
            ("c_custkey", Int64),
            ("c_name", Str),
            ("c_address", Str),
            ("c_nationkey", Int64),
            ("c_phone", Str),
            ("c_acctbal", MONEY),
            ("c_mktsegment", Str),
            ("c_comment", Str),
        ],
        TpchTable::Orders => &[
            ("o_orderkey", Int64),
            ("o_custkey", Int64),
            ("o_orderstatus", Str),
            ("o_totalprice", MONEY),
            ("o_orderdate", Date32),
            ("o_orderpriority", Str),
            ("o_clerk", Str),
            ("o_shippriority", Int32),
            ("o_comment", Str),
        ],
        TpchTable::LineItem => &[
            ("l_orderkey", Int64),
            ("l_partkey", Int64),
            ("l_suppkey", Int64),
            ("l_linenumber", Int32),
            ("l_quantity", MONEY),
            ("l_extendedprice", MONEY),
            ("l_discount", MONEY),
            ("l_tax", MONEY),
            ("l_returnflag", Str),
            ("l_linestatus", Str),
            ("l_shipdate", Date32),
            ("l_commitdate", Date32),
            ("l_receiptdate", Date32),
            ("l_shipinstruct", Str),
            ("l_shipmode", Str),
            ("l_comment", Str),
        ],
    };
    cols.iter()
        .map(|(name, ty)| Field::new(*name, ty.clone(), false))
        .collect()
}

/// Parses a schema name into a scale factor: `tiny` is 0.01, `sfN` is N, and `sfA_B` is A.B
/// (so `sf0_1` is 0.1).
pub fn scale_factor_of(schema: &str) -> Option<f64> {
    if schema.eq_ignore_ascii_case("tiny") {
        return Some(0.01);
    }
    let digits = schema.strip_prefix("sf")?;
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return None;
    }
    let sf: f64 = digits.replacen('_', ".", 1).parse().ok()?;
    (sf > 0.0 && sf <= 100_000.0).then_some(sf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names() {
        assert_eq!(scale_factor_of("tiny"), Some(0.01));
        assert_eq!(scale_factor_of("sf1"), Some(1.0));
        assert_eq!(scale_factor_of("sf0_1"), Some(0.1));
        assert_eq!(scale_factor_of("sf1000"), Some(1000.0));
        assert_eq!(scale_factor_of("sf"), None);
        assert_eq!(scale_factor_of("sf0"), None);
        assert_eq!(scale_factor_of("public"), None);
        assert_eq!(scale_factor_of("sf1_2_3"), None);
    }

    #[test]
    fn names_round_trip() {
        for t in TpchTable::ALL {
            assert_eq!(TpchTable::from_name(t.name()), Some(t));
            assert!(t.schema().fields().len() >= 3);
        }
    }
}
