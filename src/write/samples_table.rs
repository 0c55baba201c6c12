//! `samples.parquet`: one row per sample, for pandas, polars and duckdb.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray, UInt32Array, UInt64Array};
use arrow_schema::{DataType, Field as ArrowField, Schema as ArrowSchema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{Error, Result};

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

/// Reads the key and ordinal columns back, to check a table against the dataset. A table
/// the parquet decoder cannot read, or panics on, is an error: the table is derived data
/// (`hspack reindex` rewrites it), never a reason to crash a reader.
pub fn decode_keys(bytes: Vec<u8>, path: &Path) -> Result<Vec<(String, u64)>> {
    let decoded = std::panic::catch_unwind(|| decode_keys_unguarded(bytes, path));
    decoded.unwrap_or_else(|_| {
        Err(Error::SamplesTable {
            path: path.to_path_buf(),
            detail: "cannot decode: the parquet decoder failed on it".into(),
        })
    })
}

fn decode_keys_unguarded(bytes: Vec<u8>, path: &Path) -> Result<Vec<(String, u64)>> {
    use parquet::arrow::arrow_reader::{ArrowReaderOptions, ParquetRecordBatchReaderBuilder};
    let err = |e: &dyn std::fmt::Display| Error::SamplesTable {
        path: path.to_path_buf(),
        detail: format!("cannot decode: {e}"),
    };
    // The columns' types come from the parquet schema; the arrow schema a writer may embed
    // is not decoded (its decoder panics on some malformed input).
    let options = ArrowReaderOptions::new().with_skip_arrow_metadata(true);
    let reader =
        ParquetRecordBatchReaderBuilder::try_new_with_options(bytes::Bytes::from(bytes), options)
            .map_err(|e| err(&e))?
            .build()
            .map_err(|e| err(&e))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| err(&e))?;
        let keys = batch
            .column_by_name("key")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>().cloned())
            .ok_or_else(|| err(&"no utf8 column `key`"))?;
        let ords = batch
            .column_by_name("ordinal")
            .and_then(|c| c.as_any().downcast_ref::<UInt64Array>().cloned())
            .ok_or_else(|| err(&"no u64 column `ordinal`"))?;
        for i in 0..batch.num_rows() {
            out.push((keys.value(i).to_string(), ords.value(i)));
        }
    }
    Ok(out)
}
