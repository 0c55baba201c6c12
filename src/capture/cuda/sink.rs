//! The schema check made before anything is copied.

use crate::{Error, Schema};

use super::writer::DeviceField;

/// Checks a sample against the schema before anything is copied: every field once, whole
/// rows, the same rows in every field.
pub(crate) fn check_sample(
    schema: &Schema,
    key: &str,
    fields: &[DeviceField<'_>],
    prequantized: bool,
) -> Result<(), Error> {
    let lengths: Vec<(&str, usize)> = fields.iter().map(|f| (f.name, f.bytes)).collect();
    crate::write::sample::check_lengths(schema, key, &lengths, prequantized).map(drop)
}
