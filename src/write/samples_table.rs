//! `samples.parquet`: one row per sample, for pandas, polars and duckdb.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field as ArrowField, Schema as ArrowSchema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};
use crate::format::ShardRecord;
use crate::read::Shard;

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleRow {
    /// Key.
    pub key: String,
    /// Ordinal.
    pub ordinal: u64,
    /// Shard file name.
    pub shard: String,
    /// Shard sequence number.
    pub shard_seq: u32,
    /// Rows (tokens).
    pub tokens: u64,
    /// Rows with the loss mask set, when there is a loss mask.
    pub loss_tokens: Option<u64>,
    /// Decoded bytes of all fields.
    pub bytes: u64,
}

/// The rows of the samples of `shard`, whose manifest entry is `record`, in ordinal order.
pub fn rows_of(shard: &Shard, record: &ShardRecord) -> Vec<SampleRow> {
    let index = shard.index();
    (0..index.sample_count())
        .filter_map(|i| index.sample(i))
        .map(|entry| SampleRow {
            key: index.key_of(&entry).unwrap_or("").to_string(),
            ordinal: entry.ordinal,
            shard: record.file.clone(),
            shard_seq: record.seq,
            tokens: entry.rows,
            loss_tokens: entry.loss_rows(),
            bytes: entry.raw_bytes,
        })
        .collect()
}

/// Encodes `rows` as parquet bytes (zstd).
pub fn encode(rows: &[SampleRow], path: &Path) -> Result<Vec<u8>> {
    let schema = Arc::new(ArrowSchema::new(vec![
        ArrowField::new("key", DataType::Utf8, false),
        ArrowField::new("ordinal", DataType::UInt64, false),
        ArrowField::new("shard", DataType::Utf8, false),
        ArrowField::new("shard_seq", DataType::UInt32, false),
        ArrowField::new("tokens", DataType::UInt64, false),
        ArrowField::new("loss_tokens", DataType::UInt64, true),
        ArrowField::new("bytes", DataType::UInt64, false),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.key.as_str()),
        )),
        Arc::new(UInt64Array::from_iter_values(
            rows.iter().map(|r| r.ordinal),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.shard.as_str()),
        )),
        Arc::new(UInt32Array::from_iter_values(
            rows.iter().map(|r| r.shard_seq),
        )),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.tokens))),
        Arc::new(UInt64Array::from_iter(rows.iter().map(|r| r.loss_tokens))),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.bytes))),
    ];
    let err = |e: &dyn std::fmt::Display| Error::SamplesTable {
        path: path.to_path_buf(),
        detail: format!("cannot encode: {e}"),
    };
    let batch = RecordBatch::try_new(schema.clone(), columns).map_err(|e| err(&e))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_created_by(format!("hspack {}", env!("CARGO_PKG_VERSION")))
        .build();
    let mut out = Vec::new();
    let mut w = ArrowWriter::try_new(&mut out, schema, Some(props)).map_err(|e| err(&e))?;
    w.write(&batch).map_err(|e| err(&e))?;
    w.close().map_err(|e| err(&e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    #[test]
    fn the_table_holds_every_row_as_given() {
        let rows: Vec<SampleRow> = (0..5u64)
            .map(|i| SampleRow {
                key: format!("req-{i}"),
                ordinal: i,
                shard: format!("shard-{:06}.hsp", i / 2),
                shard_seq: (i / 2) as u32,
                tokens: 10 + i,
                loss_tokens: (i % 2 == 0).then_some(i),
                bytes: 1000 * i,
            })
            .collect();
        let bytes = encode(&rows, Path::new("samples.parquet")).unwrap();
        // The table is read here only as a test of what the writer wrote, from trusted bytes.
        let batches: Vec<RecordBatch> =
            ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes))
                .unwrap()
                .build()
                .unwrap()
                .map(|b| b.unwrap())
                .collect();
        let b = &batches[0];
        let col = |name: &str| b.column_by_name(name).unwrap().clone();
        let keys = col("key");
        let keys = keys.as_any().downcast_ref::<StringArray>().unwrap();
        let loss = col("loss_tokens");
        let loss = loss.as_any().downcast_ref::<UInt64Array>().unwrap();
        let ordinals = col("ordinal");
        let ordinals = ordinals.as_any().downcast_ref::<UInt64Array>().unwrap();
        assert_eq!(b.num_rows(), 5);
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(keys.value(i), r.key);
            assert_eq!(ordinals.value(i), r.ordinal);
            assert_eq!(loss.is_null(i), r.loss_tokens.is_none());
            if let Some(n) = r.loss_tokens {
                assert_eq!(loss.value(i), n);
            }
        }
    }
}
