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
    let lengths: Vec<(&str, usize)> = fields.iter().map(|f| (f.name, f.bytes)).collect();
    crate::write::sample::check_lengths(schema, key, &lengths).map(drop)
}
