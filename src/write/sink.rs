//! Where samples go: the face a capture writer writes into.

use super::DatasetWriter;

/// Where finished samples go: a [`DatasetWriter`], or [`Discard`] to measure a producer's
/// path without storage. The capture writers (`capture::cuda::CudaWriter`) write into one.
pub trait SampleSink: Send {
    /// Keys of the samples the sink already holds (read once, when a capture writer opens).
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
        Ok(self.keys().map(str::to_string).collect())
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
