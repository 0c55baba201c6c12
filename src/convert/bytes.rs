//! A bounds-checked little cursor over untrusted bytes.

use std::path::Path;

use super::ConvertError;

/// Reads integers and slices from a byte buffer, failing with [`ConvertError::Truncated`]
/// instead of panicking when the input ends early.
pub(crate) struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    file: &'a Path,
}

impl<'a> Cursor<'a> {
    /// A cursor at `pos` within `data`.
    pub(crate) fn new(data: &'a [u8], pos: usize, file: &'a Path) -> Self {
        Cursor { data, pos, file }
    }

    /// Current offset.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left after the current offset.
    pub(crate) fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    /// Takes `n` bytes.
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ConvertError> {
        let slice = self
            .pos
            .checked_add(n)
            .and_then(|end| self.data.get(self.pos..end))
            .ok_or_else(|| {
                ConvertError::truncated(self.file, what, self.pos, n, self.data.len())
            })?;
        self.pos += n;
        Ok(slice)
    }

    /// Takes `N` bytes as an array.
    pub(crate) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ConvertError> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    /// One byte.
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, ConvertError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// Little-endian u16.
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, ConvertError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// Little-endian u32.
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, ConvertError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// Little-endian u64.
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, ConvertError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that a declared length fits in the rest of the input before anything is allocated.
    pub(crate) fn bounded_len(
        &self,
        n: u64,
        start: usize,
        what: &str,
    ) -> Result<usize, ConvertError> {
        match usize::try_from(n) {
            Ok(n) if n <= self.remaining() => Ok(n),
            _ => Err(ConvertError::Truncated {
                file: self.file.to_path_buf(),
                what: what.to_string(),
                offset: start as u64,
                needed: n,
                len: self.data.len() as u64,
            }),
        }
    }
}
