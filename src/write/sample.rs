//! One sample into a shard: fields checked against the schema, split into chunks, written,
//! indexed. Shared by the dataset writer and by shard lanes.

use crate::error::{Error, Result};
use crate::format::{ExtentEntry, Schema};

use super::encode::encode_sample;
use super::options::WriteOptions;
use super::shard_writer::ShardWriter;

/// A sample's fields in schema order, checked.
pub struct CheckedSample<'a> {
    fields: Vec<&'a [u8]>,
    rows: u64,
    /// Decoded bytes of all fields.
    pub raw: u64,
}

/// Orders `fields` (by name) as the schema does and checks that every field is there once,
/// holds whole rows, and that all fields share one row count. With `prequantized`, quantized
/// fields hold their stored form ([`WriteOptions::prequantized`]).
pub fn check<'a>(
    schema: &Schema,
    key: &str,
    fields: &[(&str, &'a [u8])],
    prequantized: bool,
) -> Result<CheckedSample<'a>> {
    let lengths: Vec<(&str, usize)> = fields.iter().map(|(n, d)| (*n, d.len())).collect();
    let (order, rows) = check_lengths(schema, key, &lengths, prequantized)?;
    let fields: Vec<&'a [u8]> = order.into_iter().map(|i| fields[i].1).collect();
    Ok(CheckedSample {
        raw: schema.fields.iter().map(|f| rows * f.row_bytes()).sum(),
        fields,
        rows,
    })
}

/// Bytes a row of `field` is given in: its row bytes, or for a quantized field given in its
/// stored form, a byte per element and 4 per scale.
pub fn given_row_bytes(field: &crate::format::Field, prequantized: bool) -> u64 {
    match (field.quantized, prequantized) {
        (Some(q), true) => field.row_elems() + 4 * (field.row_elems() / q.group.max(1)),
        _ => field.row_bytes(),
    }
}

/// The checks of [`check`] on fields given by name and byte length (the capture writer makes
/// them before copying anything). Returns, for each schema field in order, its position in
/// `fields`, and the row count.
pub fn check_lengths(
    schema: &Schema,
    key: &str,
    fields: &[(&str, usize)],
    prequantized: bool,
) -> Result<(Vec<usize>, u64)> {
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
    let mut order = Vec::with_capacity(schema.fields.len());
    let mut counts: Vec<(&str, u64)> = Vec::with_capacity(schema.fields.len());
    for f in &schema.fields {
        let mut given = (0..fields.len()).filter(|&i| fields[i].0 == f.name);
        let at = given.next().ok_or_else(|| {
            bad(
                &f.name,
                "missing: every field of the schema is required".into(),
            )
        })?;
        if given.next().is_some() {
            return Err(bad(&f.name, "given twice".into()));
        }
        let len = fields[at].1 as u64;
        let row_bytes = given_row_bytes(f, prequantized);
        if !len.is_multiple_of(row_bytes) {
            let what = match row_bytes == f.row_bytes() {
                true => format!("{} {:?}", f.dtype, f.shape),
                false => format!("fp8 codes and scales of {} {:?}", f.dtype, f.shape),
            };
            return Err(bad(
                &f.name,
                format!("{len} bytes is not a whole number of rows of {row_bytes} bytes ({what})"),
            ));
        }
        counts.push((&f.name, len / row_bytes));
        order.push(at);
    }
    let rows = counts.first().map_or(0, |&(_, r)| r);
    if counts.iter().any(|&(_, r)| r != rows) {
        // The field blamed is one whose count fewest share, the last of those (the first
        // field's count was taken for everyone's: `input_ids` alone of 6 rows blamed
        // `loss_mask`, of 5); every count is said.
        let sharing = |r: u64| counts.iter().filter(|&&(_, o)| o == r).count();
        let &(odd, _) = counts
            .iter()
            .rev()
            .min_by_key(|&&(_, r)| sharing(r))
            .expect("two counts at least");
        let each: Vec<String> = counts.iter().map(|(n, r)| format!("{n} {r}")).collect();
        return Err(bad(
            odd,
            format!(
                "the fields have different row counts ({}): all fields share the token \
                 dimension",
                each.join(", ")
            ),
        ));
    }
    Ok((order, rows))
}

/// Writes a checked sample as the next sample of `shard`.
pub fn write(
    shard: &mut ShardWriter,
    schema: &Schema,
    options: &WriteOptions,
    key: &str,
    sample: &CheckedSample<'_>,
) -> Result<()> {
    let loss_rows = match schema.loss_mask_field() {
        Some(i) => {
            crate::format::loss_rows_of(sample.fields[i], schema.fields[i].row_bytes() as usize)
        }
        None => u64::MAX,
    };
    let chunks = encode_sample(schema, &sample.fields, sample.rows, options).map_err(|e| {
        Error::BadSample {
            key: key.to_string(),
            field: schema.fields[e.field as usize].name.clone(),
            detail: e.detail,
        }
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{DType, Field, Role};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("ids", DType::I32, &[], Role::TokenIds),
            Field::new("h", DType::BF16, &[8], Role::Other),
        ])
    }

    fn refusal(fields: &[(&str, usize)]) -> (String, String) {
        match check_lengths(&schema(), "k", fields, false) {
            Err(Error::BadSample { field, detail, .. }) => (field, detail),
            other => panic!("{fields:?}: {other:?}"),
        }
    }

    #[test]
    fn fields_are_ordered_by_the_schema_and_share_their_rows() {
        assert_eq!(
            check_lengths(&schema(), "k", &[("h", 48), ("ids", 12)], false).unwrap(),
            (vec![1, 0], 3)
        );
        assert_eq!(
            check_lengths(&schema(), "k", &[("ids", 0), ("h", 0)], false).unwrap(),
            (vec![0, 1], 0)
        );
    }

    #[test]
    fn every_refusal_names_the_field_and_the_fix() {
        let (field, detail) = refusal(&[("ids", 12), ("h", 48), ("x", 1)]);
        assert_eq!(field, "x");
        assert!(detail.contains("it has ids, h"), "{detail}");
        let (field, detail) = refusal(&[("ids", 12)]);
        assert_eq!((field.as_str(), detail.starts_with("missing")), ("h", true));
        let (field, detail) = refusal(&[("ids", 12), ("h", 48), ("h", 48)]);
        assert_eq!((field.as_str(), detail.as_str()), ("h", "given twice"));
        let (field, detail) = refusal(&[("ids", 12), ("h", 47)]);
        assert_eq!(field, "h");
        assert!(detail.contains("47 bytes is not a whole number of rows of 16 bytes"));
        let (field, detail) = refusal(&[("ids", 12), ("h", 32)]);
        assert_eq!(field, "h");
        assert_eq!(
            detail,
            "the fields have different row counts (ids 3, h 2): all fields share the token \
             dimension"
        );
        // The field whose count the others do not share is blamed, the first one too.
        let three = Schema::new(vec![
            Field::new("ids", DType::I32, &[], Role::TokenIds),
            Field::new("mask", DType::U8, &[], Role::LossMask),
            Field::new("h", DType::BF16, &[8], Role::Other),
        ]);
        match check_lengths(&three, "k", &[("ids", 24), ("mask", 5), ("h", 80)], false) {
            Err(Error::BadSample { field, detail, .. }) => {
                assert_eq!(field, "ids");
                assert!(detail.contains("(ids 6, mask 5, h 5)"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
    }
}
