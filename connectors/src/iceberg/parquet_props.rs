//! The Parquet writer settings of a table, read from its Iceberg `write.parquet.*`
//! properties (the names and defaults of the Iceberg specification's table properties).

use std::collections::HashMap;

use datafusion::error::{DataFusionError, Result};
use parquet::basic::{BrotliLevel, Compression, GzipLevel, ZstdLevel};
use parquet::file::properties::WriterProperties;

pub const CODEC: &str = "write.parquet.compression-codec";
pub const LEVEL: &str = "write.parquet.compression-level";
pub const ROW_GROUP_BYTES: &str = "write.parquet.row-group-size-bytes";
/// pyiceberg's name for the most rows in a row group.
pub const ROW_GROUP_ROWS: &str = "write.parquet.row-group-limit";
pub const PAGE_BYTES: &str = "write.parquet.page-size-bytes";
pub const PAGE_ROWS: &str = "write.parquet.page-row-limit";
pub const DICT_BYTES: &str = "write.parquet.dict-size-bytes";

/// Iceberg's default row group size (128 MiB).
const DEFAULT_ROW_GROUP_BYTES: usize = 128 * 1024 * 1024;
/// The most rows in a row group: 1 Mi (parquet-rs's and pyiceberg's default), which is what
/// bounds a row group of narrow tables. Smaller row groups cut a small table into more pieces for the task slots,
/// but cost more than they gave: TPC-H SF1 written at 128 Ki rows took 7% longer in all (its
/// lineitem scans paid for more, smaller row groups; splitting `part` in two gained nothing).
const DEFAULT_ROW_GROUP_ROWS: usize = 1024 * 1024;

/// The writer properties for `table` (its `catalog.namespace.name`, for messages): zstd by
/// default, like Iceberg. A value Basin cannot use is an error that names the property.
pub fn writer_properties(table: &str, props: &HashMap<String, String>) -> Result<WriterProperties> {
    let bad = |name: &str, value: &str, expected: &str| {
        DataFusionError::Plan(format!(
            "table `{table}`: property \"{name}\" = '{value}' is not valid: {expected}"
        ))
    };
    let size = |name: &str| -> Result<Option<usize>> {
        props
            .get(name)
            .map(|v| {
                v.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(name, v, "expected a positive whole number"))
            })
            .transpose()
    };
    let level = props
        .get(LEVEL)
        .map(|v| {
            v.trim()
                .parse::<i32>()
                .map_err(|_| bad(LEVEL, v, "expected a whole number"))
                .map(|n| (v, n))
        })
        .transpose()?;
    let codec = props.get(CODEC).map_or("zstd", String::as_str);
    let compression = match codec.trim().to_ascii_lowercase().as_str() {
        "zstd" => Compression::ZSTD(match level {
            Some((v, n)) => {
                ZstdLevel::try_new(n).map_err(|_| bad(LEVEL, v, "zstd takes 1 to 22"))?
            }
            None => ZstdLevel::default(),
        }),
        "gzip" => Compression::GZIP(match level {
            Some((v, n)) => u32::try_from(n)
                .ok()
                .and_then(|n| GzipLevel::try_new(n).ok())
                .ok_or_else(|| bad(LEVEL, v, "gzip takes 0 to 9"))?,
            None => GzipLevel::default(),
        }),
        "brotli" => Compression::BROTLI(match level {
            Some((v, n)) => u32::try_from(n)
                .ok()
                .and_then(|n| BrotliLevel::try_new(n).ok())
                .ok_or_else(|| bad(LEVEL, v, "brotli takes 0 to 11"))?,
            None => BrotliLevel::default(),
        }),
        "snappy" => Compression::SNAPPY,
        // Parquet's LZ4 (Hadoop framing) is deprecated; readers expect LZ4_RAW.
        "lz4" | "lz4_raw" => Compression::LZ4_RAW,
        "uncompressed" | "none" => Compression::UNCOMPRESSED,
        _ => {
            return Err(bad(
                CODEC,
                codec,
                "use zstd, snappy, gzip, lz4, brotli or uncompressed",
            ));
        }
    };
    let mut builder = WriterProperties::builder()
        .set_compression(compression)
        .set_max_row_group_bytes(Some(
            size(ROW_GROUP_BYTES)?.unwrap_or(DEFAULT_ROW_GROUP_BYTES),
        ))
        .set_max_row_group_row_count(Some(
            size(ROW_GROUP_ROWS)?.unwrap_or(DEFAULT_ROW_GROUP_ROWS),
        ));
    if let Some(bytes) = size(PAGE_BYTES)? {
        builder = builder.set_data_page_size_limit(bytes);
    }
    if let Some(rows) = size(PAGE_ROWS)? {
        builder = builder.set_data_page_row_count_limit(rows);
    }
    if let Some(bytes) = size(DICT_BYTES)? {
        builder = builder.set_dictionary_page_size_limit(bytes);
    }
    Ok(builder.build())
}

#[cfg(test)]
mod tests {
    use parquet::schema::types::ColumnPath;

    use super::*;

    fn col() -> ColumnPath {
        ColumnPath::from("c")
    }

    fn props(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn zstd_and_iceberg_row_groups_by_default() {
        let p = writer_properties("lake.s.t", &HashMap::new()).unwrap();
        assert_eq!(
            p.compression(&col()),
            Compression::ZSTD(ZstdLevel::default())
        );
        assert_eq!(p.max_row_group_bytes(), Some(DEFAULT_ROW_GROUP_BYTES));
        assert_eq!(p.max_row_group_row_count(), Some(DEFAULT_ROW_GROUP_ROWS));
    }

    #[test]
    fn table_properties_choose_codec_level_and_sizes() {
        let p = writer_properties(
            "lake.s.t",
            &props(&[
                (CODEC, "SNAPPY"),
                (ROW_GROUP_BYTES, "8388608"),
                (ROW_GROUP_ROWS, "50000"),
                (PAGE_ROWS, "10000"),
                (PAGE_BYTES, "65536"),
            ]),
        )
        .unwrap();
        assert_eq!(p.compression(&col()), Compression::SNAPPY);
        assert_eq!(p.max_row_group_bytes(), Some(8 << 20));
        assert_eq!(p.max_row_group_row_count(), Some(50_000));
        assert_eq!(p.data_page_row_count_limit(), 10_000);
        assert_eq!(p.data_page_size_limit(), 65536);
        let p = writer_properties("lake.s.t", &props(&[(CODEC, "zstd"), (LEVEL, "9")])).unwrap();
        assert_eq!(
            p.compression(&col()),
            Compression::ZSTD(ZstdLevel::try_new(9).unwrap())
        );
    }

    #[test]
    fn bad_values_name_the_table_and_the_property() {
        for (pairs, needle) in [
            (vec![(CODEC, "lzo")], "write.parquet.compression-codec"),
            (vec![(LEVEL, "99")], "zstd takes 1 to 22"),
            (
                vec![(CODEC, "gzip"), (LEVEL, "x")],
                "expected a whole number",
            ),
            (vec![(ROW_GROUP_BYTES, "0")], "row-group-size-bytes"),
            (vec![(ROW_GROUP_ROWS, "-5")], "row-group-limit"),
            (vec![(PAGE_ROWS, "-5")], "page-row-limit"),
        ] {
            let e = writer_properties("lake.s.t", &props(&pairs))
                .unwrap_err()
                .to_string();
            assert!(e.contains("lake.s.t") && e.contains(needle), "{e}");
        }
    }
}
