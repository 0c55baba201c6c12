//! Bytes of a file that never changes: a range of its mapping, or of a copy held in memory.
//! Slicing is zero-copy; the bytes live as long as any slice of them.

use std::ops::{Deref, Range};
use std::sync::{Arc, Weak};

/// What holds a file's bytes.
#[derive(Debug)]
pub(crate) enum Backing {
    /// A read-only mapping of the file, and the identity of the file mapped.
    Mapped(super::mmap::ReadOnlyMap, super::mmap::FileId),
    /// A copy in 8-byte aligned memory, so every dtype can be viewed in place.
    Aligned(AlignedBytes),
    /// A copy in memory, as produced (e.g. by decompression).
    Vec(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m, _) => m,
            Backing::Aligned(a) => a.as_bytes(),
            Backing::Vec(v) => v,
        }
    }
}

/// A range of a file's bytes; cheap to clone and to slice.
#[derive(Debug, Clone)]
pub struct FileBytes {
    backing: Arc<Backing>,
    range: Range<usize>,
}

impl FileBytes {
    pub(crate) fn new(backing: Backing) -> FileBytes {
        let len = backing.bytes().len();
        FileBytes {
            backing: Arc::new(backing),
            range: 0..len,
        }
    }

    /// Bytes held in memory, 8-byte aligned (a copy of `bytes`).
    pub fn copy_of(bytes: &[u8]) -> FileBytes {
        let mut a = AlignedBytes::zeroed(bytes.len());
        a.as_bytes_mut().copy_from_slice(bytes);
        FileBytes::new(Backing::Aligned(a))
    }

    /// Bytes held in memory, as given (no alignment promised).
    pub fn from_vec(bytes: Vec<u8>) -> FileBytes {
        FileBytes::new(Backing::Vec(bytes))
    }

    /// Bytes `range` of these bytes (relative to them), zero-copy; `None` when out of range.
    pub fn slice(&self, range: Range<usize>) -> Option<FileBytes> {
        if range.start > range.end || range.end > self.range.len() {
            return None;
        }
        Some(FileBytes {
            backing: Arc::clone(&self.backing),
            range: self.range.start + range.start..self.range.start + range.end,
        })
    }

    /// These bytes followed by `next`, as one view, when `next` starts where these end in
    /// the same backing (blobs laid one after another in a mapped pack); `None` otherwise.
    pub fn joined(&self, next: &FileBytes) -> Option<FileBytes> {
        (Arc::ptr_eq(&self.backing, &next.backing) && self.range.end == next.range.start).then(
            || FileBytes {
                backing: Arc::clone(&self.backing),
                range: self.range.start..next.range.end,
            },
        )
    }

    /// True when the bytes are a mapping of the file (not a copy).
    pub fn is_mapped(&self) -> bool {
        matches!(*self.backing, Backing::Mapped(..))
    }

    /// The whole mapping these bytes lie in, when they are mapped: its address and length,
    /// and a handle that tells whether it still lives. Lets a process name a view by file
    /// offset (see `hspack.torch`'s transfer of mapped tensors).
    pub fn mapping(&self) -> Option<MappingRef> {
        match &*self.backing {
            Backing::Mapped(m, file) => Some(MappingRef {
                base: m.as_ptr() as usize,
                len: m.len(),
                file: *file,
                changed: m.changed,
                alive: Arc::downgrade(&self.backing),
            }),
            _ => None,
        }
    }

    /// Asks the kernel to read bytes `range` (relative to these bytes) ahead; with `load`, reads
    /// them into the page cache before returning (`MADV_POPULATE_READ`, Linux 5.14+; the hint
    /// where it is missing). Nothing to do for bytes in memory, or when every page is in the
    /// page cache already: asking whether they are (`mincore`) costs a fifth of a hint that
    /// finds them there (the kernel still walks the cache page by page) and a small part of
    /// loading them, which warm epochs would pay at every sample.
    pub fn will_need(&self, range: Range<usize>, load: bool) {
        let Backing::Mapped(map, _) = &*self.backing else {
            return;
        };
        let start = self.range.start + range.start.min(self.range.len());
        let len = range.len().min(self.range.end - start);
        if len == 0 || super::mmap::resident(map, start, len) {
            return;
        }
        let loaded = load
            && map
                .advise_range(memmap2::Advice::PopulateRead, start, len)
                .is_ok();
        if !loaded {
            let _ = map.advise_range(memmap2::Advice::WillNeed, start, len);
        }
    }
}

impl FileBytes {
    /// Drops bytes `range` (relative to these bytes) of a mapping from this process's memory;
    /// they are read again on the next access. Nothing to do for bytes in memory.
    pub fn release(&self, range: Range<usize>) {
        let Backing::Mapped(map, _) = &*self.backing else {
            return;
        };
        let start = self.range.start + range.start.min(self.range.len());
        let len = range.len().min(self.range.end - start);
        if len > 0 {
            super::mmap::release(map, start, len);
        }
    }
}

impl Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.backing.bytes()[self.range.clone()]
    }
}

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// A whole mapping, named by address, with a weak handle on it; see [`FileBytes::mapping`].
#[derive(Debug, Clone)]
pub struct MappingRef {
    /// Address of the mapping's first byte.
    pub base: usize,
    /// Length of the mapping.
    pub len: usize,
    /// The file mapped, as it was when mapped: a file since replaced at its path has another.
    pub file: super::mmap::FileId,
    /// The file's status change time when mapped (seconds, nanoseconds): a file given the
    /// same inode number after this one was deleted has another.
    pub changed: (i64, i64),
    alive: Weak<Backing>,
}

impl MappingRef {
    /// True while some [`FileBytes`] still holds the mapping.
    pub fn is_alive(&self) -> bool {
        self.alive.strong_count() > 0
    }

    /// True when `other` names the same live mapping.
    pub fn same_as(&self, other: &MappingRef) -> bool {
        self.base == other.base && Weak::ptr_eq(&self.alive, &other.alive)
    }
}

/// Bytes in 8-byte aligned storage, so every dtype can be viewed in place.
#[derive(Debug, Default)]
pub struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
    /// Made by [`AlignedBytes::for_overwrite`]: its memory goes back to be reused.
    reused: bool,
}

impl AlignedBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        AlignedBytes {
            words: vec![0; len.div_ceil(8)],
            len,
            reused: false,
        }
    }

    /// `len` bytes for a caller that writes every one of them before any is read: memory a
    /// dropped buffer of this kind left (already faulted in, holding its old bytes, perhaps
    /// more of them than `len`), or new zeroed memory. It is kept for reuse when dropped (see
    /// [`super::recycle`]). `None` when that much memory cannot be had.
    pub fn for_overwrite(len: usize) -> Option<Self> {
        Some(AlignedBytes {
            words: super::recycle::take(len.div_ceil(8))?,
            len,
            reused: true,
        })
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    /// The bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

impl Clone for AlignedBytes {
    /// A plain copy of the bytes: of `len` of them, not of a reused buffer's whole length.
    fn clone(&self) -> Self {
        AlignedBytes {
            words: self.words[..self.len.div_ceil(8)].to_vec(),
            len: self.len,
            reused: false,
        }
    }
}

impl Drop for AlignedBytes {
    fn drop(&mut self) {
        if self.reused {
            super::recycle::give_back(std::mem::take(&mut self.words));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_the_bytes_and_refuse_out_of_range() {
        let b = FileBytes::copy_of(b"0123456789");
        let s = b.slice(2..8).unwrap();
        assert_eq!(&*s, b"234567");
        let t = s.slice(1..3).unwrap();
        assert_eq!(&*t, b"34");
        assert!(s.slice(5..7).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = s.slice(3..2);
        assert!(backwards.is_none());
        assert!(!b.is_mapped() && b.mapping().is_none());
        assert_eq!(b.as_ptr() as usize % 8, 0, "copies are 8-byte aligned");
    }
}
