//! One sample into a shard: fields checked against the schema, split into chunks, written,
//! indexed. Shared by the dataset writer and by shard lanes.

use crate::error::{Error, Result};
use crate::format::{ExtentEntry, Role, Schema};

use super::dataset_writer::WriteOptions;
use super::encode::encode_sample;
use super::shard_writer::ShardWriter;

/// A sample's fields in schema order, checked.
pub struct CheckedSample<'a> {
    fields: Vec<&'a [u8]>,
    rows: u64,
    /// Decoded bytes of all fields.
    pub raw: u64,
}

/// Orders `fields` (by name) as the schema does and checks that every field is there once,
/// holds whole rows, and that all fields share one row count.
pub fn check<'a>(
    schema: &Schema,
    key: &str,
    fields: &[(&str, &'a [u8])],
) -> Result<CheckedSample<'a>> {
    let bad = |field: &str, detail: String| Error::BadSample {
        key: key.to_string(),
        field: field.to_string(),
        detail,
    };
    if key.len() > u32::MAX as usize {
        return Err(bad("", "the key is longer than 4 GiB".into()));
    }
    for (name, _) in fields {
        if schema.field_index(name).is_none() {
            return Err(bad(
                name,
                format!(
                    "the schema has no such field; it has {}",
                    field_names(schema)
                ),
            ));
        }
    }
    let mut ordered = Vec::with_capacity(schema.fields.len());
    let mut rows = None;
    for f in &schema.fields {
        let mut given = fields.iter().filter(|(n, _)| *n == f.name);
        let data = given
            .next()
            .ok_or_else(|| {
                bad(
                    &f.name,
                    "missing: every field of the schema is required".into(),
                )
            })?
            .1;
        if given.next().is_some() {
            return Err(bad(&f.name, "given twice".into()));
        }
        let row_bytes = f.row_bytes();
        if data.len() as u64 % row_bytes != 0 {
            return Err(bad(
                &f.name,
                format!(
                    "{} bytes is not a whole number of rows of {row_bytes} bytes ({} {:?})",
                    data.len(),
                    f.dtype,
                    f.shape
                ),
            ));
        }
        let r = data.len() as u64 / row_bytes;
        match rows {
            None => rows = Some(r),
            Some(prev) if prev != r => {
                return Err(bad(
                    &f.name,
                    format!(
                        "has {r} rows, other fields have {prev}: all fields share the token \
                         dimension"
                    ),
                ))
            }
            _ => {}
        }
        ordered.push(data);
    }
    Ok(CheckedSample {
        raw: ordered.iter().map(|d| d.len() as u64).sum(),
        fields: ordered,
        rows: rows.unwrap_or(0),
    })
}

/// Writes a checked sample as the next sample of `shard`.
pub fn write(
    shard: &mut ShardWriter,
    schema: &Schema,
    options: &WriteOptions,
    key: &str,
    sample: &CheckedSample<'_>,
) -> Result<()> {
    let loss_rows = match schema.fields.iter().position(|f| f.role == Role::LossMask) {
        Some(i) => {
            let rb = schema.fields[i].row_bytes() as usize;
            sample.fields[i]
                .chunks_exact(rb)
                .filter(|r| r.iter().any(|&b| b != 0))
                .count() as u64
        }
        None => u64::MAX,
    };
    let chunks = encode_sample(
        schema,
        &sample.fields,
        sample.rows,
        options.chunk_target(),
        options.codec,
        options.zstd_level,
    );
    let dtypes: Vec<u8> = chunks
        .iter()
        .map(|c| schema.fields[c.field as usize].dtype.code())
        .collect();
    let ids = shard.write_chunks(&chunks, &dtypes)?;
    let extents: Vec<ExtentEntry> = chunks
        .iter()
        .zip(ids)
        .map(|(c, id)| ExtentEntry {
            row_start: c.row_start,
            row_count: c.row_count,
            chunk_row: 0,
            chunk: id,
            field: c.field,
            reserved: 0,
        })
        .collect();
    shard.push_sample(key, sample.rows, loss_rows, sample.raw, &extents);
    Ok(())
}

/// The schema's field names, for errors.
pub fn field_names(schema: &Schema) -> String {
    schema
        .fields
        .iter()
        .map(|f| f.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
