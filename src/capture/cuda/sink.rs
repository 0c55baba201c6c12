//! Where captured samples go, and the schema check made before anything is copied.

use crate::write::DatasetWriter;
use crate::{Error, Schema};

use super::writer::DeviceField;

/// Where finished samples go: a [`DatasetWriter`], or [`Discard`] to measure the copy path.
pub trait SampleSink: Send {
    /// Keys of the samples the sink already holds (read once, when the writer opens).
    fn existing_keys(&self) -> crate::Result<Vec<String>>;
    /// Takes one sample; `fields` are host bytes by field name, in the sample's order.
    fn append(&mut self, key: &str, fields: &[(&str, &[u8])]) -> crate::Result<()>;
    /// Makes what was appended durable and visible.
    fn commit(&mut self) -> crate::Result<()>;
    /// Commits and closes.
    fn finish(self: Box<Self>) -> crate::Result<()>;
}

impl SampleSink for DatasetWriter {
    fn existing_keys(&self) -> crate::Result<Vec<String>> {
        let rows = crate::write::dataset_writer::sample_rows(self.dir())?;
        Ok(rows.into_iter().map(|r| r.key).collect())
    }
    fn append(&mut self, key: &str, fields: &[(&str, &[u8])]) -> crate::Result<()> {
        DatasetWriter::append(self, key, fields).map(drop)
    }
    fn commit(&mut self) -> crate::Result<()> {
        DatasetWriter::commit(self).map(drop)
    }
    fn finish(self: Box<Self>) -> crate::Result<()> {
        DatasetWriter::finish(*self).map(drop)
    }
}

/// A sink that drops every sample: measures the device-to-host path without storage.
#[derive(Debug, Default, Clone, Copy)]
pub struct Discard;

impl SampleSink for Discard {
    fn existing_keys(&self) -> crate::Result<Vec<String>> {
        Ok(Vec::new())
    }
    fn append(&mut self, _key: &str, _fields: &[(&str, &[u8])]) -> crate::Result<()> {
        Ok(())
    }
    fn commit(&mut self) -> crate::Result<()> {
        Ok(())
    }
    fn finish(self: Box<Self>) -> crate::Result<()> {
        Ok(())
    }
}

/// Checks a sample against the schema before anything is copied: every field once, whole
/// rows, the same rows in every field.
pub(crate) fn check_sample(
    schema: &Schema,
    key: &str,
    fields: &[DeviceField<'_>],
) -> Result<(), Error> {
    let bad = |field: &str, detail: String| Error::BadSample {
        key: key.to_string(),
        field: field.to_string(),
        detail,
    };
    for f in fields {
        if schema.field_index(f.name).is_none() {
            let names: Vec<&str> = schema.fields.iter().map(|f| f.name.as_str()).collect();
            return Err(bad(
                f.name,
                format!("the schema has no such field; it has {}", names.join(", ")),
            ));
        }
    }
    let mut rows = None;
    for sf in &schema.fields {
        let mut given = fields.iter().filter(|f| f.name == sf.name);
        let f = given.next().ok_or_else(|| {
            bad(
                &sf.name,
                "missing: every field of the schema is required".into(),
            )
        })?;
        if given.next().is_some() {
            return Err(bad(&sf.name, "given twice".into()));
        }
        let row_bytes = sf.row_bytes();
        if f.bytes as u64 % row_bytes != 0 {
            return Err(bad(
                &sf.name,
                format!(
                    "{} bytes is not a whole number of rows of {row_bytes} bytes ({} {:?})",
                    f.bytes, sf.dtype, sf.shape
                ),
            ));
        }
        let r = f.bytes as u64 / row_bytes;
        match rows {
            None => rows = Some(r),
            Some(prev) if prev != r => {
                return Err(bad(
                    &sf.name,
                    format!(
                    "has {r} rows, other fields have {prev}: all fields share the token dimension"
                ),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}
