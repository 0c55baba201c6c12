//! The zip container written by `torch.save` since torch 1.6.
//!
//! Layout: `<folder>/data.pkl` (the pickle), `<folder>/data/<key>` (one entry per storage),
//! and small records (`byteorder`, `version`, `.format_version`, `.storage_alignment`).
//! Entries are stored uncompressed; torch pads the local header's extra field so each
//! entry's data starts on a 64-byte boundary, so data offsets are read from local headers.
//! Sizes come from the central directory, with ZIP64 extensions when present.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use super::bytes::Cursor;
use super::ConvertError;

const EOCD_SIG: u32 = 0x0605_4b50;
const EOCD64_SIG: u32 = 0x0606_4b50;
const EOCD64_LOCATOR_SIG: u32 = 0x0706_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
const EOCD_LEN: usize = 22;
const CENTRAL_LEN: usize = 46;
const LOCAL_LEN: usize = 30;

/// Byte order of the storages in an archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteOrder {
    /// Little-endian (also assumed when the archive has no `byteorder` record).
    Little,
    /// Big-endian: storages are byte-swapped per element when read.
    Big,
}

/// One stored entry: its name and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Full name inside the archive.
    pub name: String,
    /// Byte range of the entry's data within the archive.
    pub data: Range<usize>,
    /// CRC-32 of the data, from the central directory.
    pub crc32: u32,
}

/// A parsed `torch.save` zip archive. Holds offsets only; the bytes stay in the caller's buffer.
#[derive(Debug, Clone)]
pub struct Archive {
    /// The folder every entry lives in (`archive`, `data_0`, the saved file's stem, ...).
    pub prefix: String,
    /// Every entry, in central-directory order.
    pub entries: Vec<Entry>,
    /// Byte range of `<prefix>/data.pkl`.
    pub pickle: Range<usize>,
    /// Storage byte order from the `byteorder` record.
    pub byte_order: ByteOrder,
    /// Content of the `version` record (or `.data/version`), if any.
    pub version: Option<String>,
    /// Content of the `.format_version` record, if any.
    pub format_version: Option<String>,
    /// Content of the `.storage_alignment` record, if any.
    pub storage_alignment: Option<String>,
    by_name: HashMap<String, usize>,
}

impl Archive {
    /// Parses the archive held in `bytes`. `file` names it in errors.
    ///
    /// Rejects compressed entries, unsafe names (`..`, absolute paths, backslashes, drive
    /// letters), duplicate names, entries that overlap one another or run past the end,
    /// and directories whose declared sizes cannot fit in the input.
    pub fn parse(bytes: &[u8], file: &Path) -> Result<Archive, ConvertError> {
        let (cd_start, cd_size, count) = find_central_directory(bytes, file)?;
        let cd_end = cd_start
            .checked_add(cd_size)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| ConvertError::DeclaredSizeTooLarge {
                file: file.to_path_buf(),
                what: "zip central directory".into(),
                declared: cd_size as u64,
                limit: bytes.len().saturating_sub(cd_start) as u64,
            })?;
        // Each record takes at least 46 bytes, which bounds the count before allocating.
        let max_count = cd_size / CENTRAL_LEN;
        if count > max_count as u64 {
            return Err(ConvertError::DeclaredSizeTooLarge {
                file: file.to_path_buf(),
                what: "zip entry count".into(),
                declared: count,
                limit: max_count as u64,
            });
        }
        let cd = bytes.get(..cd_end).unwrap_or(&[]);
        let mut cur = Cursor::new(cd, cd_start, file);
        let mut entries = Vec::with_capacity(count as usize);
        let mut by_name = HashMap::new();
        let mut spans: Vec<(usize, usize, usize)> = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let entry = read_central_entry(&mut cur, bytes, file)?;
            if by_name
                .insert(entry.0.name.clone(), entries.len())
                .is_some()
            {
                return Err(ConvertError::UnsafeEntryName {
                    file: file.to_path_buf(),
                    entry: entry.0.name,
                    reason: "the name appears twice",
                });
            }
            spans.push((entry.1, entry.0.data.end, entries.len()));
            entries.push(entry.0);
        }
        check_overlaps(&entries, &mut spans, cd_start, file)?;

        let first = entries.first().ok_or_else(|| ConvertError::NotATorchFile {
            file: file.to_path_buf(),
            reason: "the archive is empty".into(),
        })?;
        let prefix = match first.name.split_once('/') {
            Some((p, _)) => p.to_string(),
            None => {
                return Err(ConvertError::NotATorchFile {
                    file: file.to_path_buf(),
                    reason: format!("first entry {:?} is not inside a folder", first.name),
                })
            }
        };
        let record = |name: &str| -> Option<Range<usize>> {
            by_name
                .get(&format!("{prefix}/{name}"))
                .and_then(|&i| entries.get(i))
                .map(|e| e.data.clone())
        };
        let text = |name: &str| -> Option<String> {
            record(name)
                .and_then(|r| bytes.get(r))
                .map(|b| String::from_utf8_lossy(b).trim().to_string())
        };
        let pickle = record("data.pkl").ok_or_else(|| ConvertError::NotATorchFile {
            file: file.to_path_buf(),
            reason: format!("no {prefix}/data.pkl"),
        })?;
        let byte_order = match text("byteorder").as_deref() {
            None | Some("little") => ByteOrder::Little,
            Some("big") => ByteOrder::Big,
            Some(other) => {
                return Err(ConvertError::malformed(
                    file,
                    "torch byteorder record",
                    0,
                    format!("unknown byte order {other:?}"),
                ))
            }
        };
        Ok(Archive {
            version: text("version").or_else(|| text(".data/version")),
            format_version: text(".format_version"),
            storage_alignment: text(".storage_alignment"),
            prefix,
            pickle,
            byte_order,
            entries,
            by_name,
        })
    }

    /// The entry named `<prefix>/<name>`.
    pub fn record(&self, name: &str) -> Option<&Entry> {
        let i = self.by_name.get(&format!("{}/{name}", self.prefix))?;
        self.entries.get(*i)
    }

    /// Checks `entry`'s data in `bytes` (the archive) against its CRC-32.
    pub fn check_crc(entry: &Entry, bytes: &[u8], file: &Path) -> Result<(), ConvertError> {
        let got = crc32fast::hash(bytes.get(entry.data.clone()).unwrap_or(&[]));
        if got != entry.crc32 {
            return Err(ConvertError::ChecksumMismatch {
                file: file.to_path_buf(),
                entry: entry.name.clone(),
                of: String::new(),
                expected: entry.crc32,
                got,
            });
        }
        Ok(())
    }

    /// The data range of storage `key` (`<prefix>/data/<key>`).
    pub fn storage(&self, key: &str) -> Option<Range<usize>> {
        self.record(&format!("data/{key}")).map(|e| e.data.clone())
    }
}

/// Finds the end-of-central-directory record (and its ZIP64 form) and returns the central
/// directory's start, size and entry count.
fn find_central_directory(bytes: &[u8], file: &Path) -> Result<(usize, usize, u64), ConvertError> {
    let not_zip = |reason: &str| ConvertError::NotATorchFile {
        file: file.to_path_buf(),
        reason: reason.to_string(),
    };
    let eocd_at = |i: usize| bytes.get(i..i + 4) == Some(&EOCD_SIG.to_le_bytes()[..]);
    // The record is the last 22 bytes plus a comment of at most 65535 bytes.
    let lowest = bytes.len().saturating_sub(EOCD_LEN + 0xffff);
    let highest = bytes.len().checked_sub(EOCD_LEN);
    let eocd = highest.and_then(|h| (lowest..=h).rev().find(|&i| eocd_at(i)));
    if eocd.is_none() && bytes.starts_with(&LOCAL_SIG.to_le_bytes()) {
        return Err(ConvertError::TruncatedZip {
            file: file.to_path_buf(),
            size: bytes.len() as u64,
            ends: where_it_ends(bytes),
        });
    }
    if bytes.len() < EOCD_LEN {
        return Err(ConvertError::truncated(
            file,
            "zip end record",
            0,
            EOCD_LEN,
            bytes.len(),
        ));
    }
    let eocd = eocd.ok_or_else(|| not_zip("no end-of-central-directory record"))?;
    let mut cur = Cursor::new(bytes, eocd + 4, file);
    let what = "zip end record";
    let _disk = cur.u16(what)?;
    let _cd_disk = cur.u16(what)?;
    let _disk_entries = cur.u16(what)?;
    let mut count = u64::from(cur.u16(what)?);
    let mut cd_size = u64::from(cur.u32(what)?);
    let mut cd_start = u64::from(cur.u32(what)?);
    let needs64 = count == 0xffff || cd_size == 0xffff_ffff || cd_start == 0xffff_ffff;
    let locator = eocd.checked_sub(20);
    let has_locator = locator
        .and_then(|l| bytes.get(l..l + 4))
        .map(|s| s == EOCD64_LOCATOR_SIG.to_le_bytes())
        .unwrap_or(false);
    if has_locator || needs64 {
        let l = locator.ok_or_else(|| not_zip("ZIP64 values without a ZIP64 locator"))?;
        if !has_locator {
            return Err(not_zip("ZIP64 values without a ZIP64 locator"));
        }
        let mut c = Cursor::new(bytes, l + 8, file);
        let rec = c.u64("zip64 locator")?;
        let rec = usize::try_from(rec)
            .ok()
            .filter(|&r| r < l)
            .ok_or_else(|| {
                ConvertError::malformed(file, "zip64 locator", l, "record offset past the locator")
            })?;
        let mut c = Cursor::new(bytes, rec, file);
        let what = "zip64 end record";
        if c.u32(what)? != EOCD64_SIG {
            return Err(ConvertError::malformed(
                file,
                "zip64 end record",
                rec,
                "bad signature",
            ));
        }
        let _size = c.u64(what)?;
        let _made = c.u16(what)?;
        let _needed = c.u16(what)?;
        let _disk = c.u32(what)?;
        let _cd_disk = c.u32(what)?;
        let _disk_entries = c.u64(what)?;
        count = c.u64(what)?;
        cd_size = c.u64(what)?;
        cd_start = c.u64(what)?;
    }
    let start = usize::try_from(cd_start)
        .ok()
        .filter(|&s| s <= bytes.len())
        .ok_or_else(|| ConvertError::DeclaredSizeTooLarge {
            file: file.to_path_buf(),
            what: "zip central directory offset".into(),
            declared: cd_start,
            limit: bytes.len() as u64,
        })?;
    let size = usize::try_from(cd_size).unwrap_or(usize::MAX);
    Ok((start, size, count))
}

/// Describes where a zip that has no end record stops, walking its local headers from the
/// start: inside which entry, or after which one. Entries written with a data descriptor
/// (as torch does) are skipped by finding a descriptor whose size matches its distance.
fn where_it_ends(bytes: &[u8]) -> String {
    let u16_at = |i: usize| {
        bytes
            .get(i..i + 2)
            .and_then(|b| <[u8; 2]>::try_from(b).ok())
            .map(u16::from_le_bytes)
    };
    let u32_at = |i: usize| {
        bytes
            .get(i..i + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
    };
    let mut at = 0usize;
    let mut last: Option<String> = None;
    let after = |last: &Option<String>| match last {
        Some(name) => format!("after entry {name:?}"),
        None => "at the start".to_string(),
    };
    // Each entry takes at least a local header, which bounds the walk.
    for _ in 0..=bytes.len() / LOCAL_LEN {
        if at == bytes.len() {
            return format!(
                "{} at offset {at}, before the central directory",
                after(&last)
            );
        }
        match u32_at(at) {
            Some(LOCAL_SIG) => {}
            Some(CENTRAL_SIG) => {
                return format!("inside the central directory, which starts at offset {at}")
            }
            _ => {
                return format!(
                    "{} at offset {at}, where no entry header follows",
                    after(&last)
                )
            }
        }
        let header = (
            u16_at(at + 6),
            u32_at(at + 18),
            u16_at(at + 26),
            u16_at(at + 28),
        );
        let (Some(flags), Some(size32), Some(name_len), Some(extra_len)) = header else {
            return format!("inside the local header at offset {at}");
        };
        let name_at = at + LOCAL_LEN;
        let data_start = name_at + usize::from(name_len) + usize::from(extra_len);
        let Some(raw) = bytes.get(name_at..name_at + usize::from(name_len)) else {
            return format!("inside the local header at offset {at}");
        };
        let name = String::from_utf8_lossy(raw).into_owned();
        if data_start > bytes.len() {
            return format!("inside the local header of entry {name:?} at offset {at}");
        }
        let inside = |end: String| {
            format!("inside entry {name:?}, whose data starts at offset {data_start} and {end}")
        };
        let next = if flags & 0x8 != 0 {
            // A data descriptor (signature, CRC-32, sizes of 4 or 8 bytes) follows the data.
            let found = find_descriptor(bytes, data_start);
            match found {
                Some(end) if end <= bytes.len() => end,
                _ => return inside("has no end in the file".into()),
            }
        } else {
            let size = if size32 == 0xffff_ffff {
                zip64_local_size(bytes.get(name_at + usize::from(name_len)..data_start))
            } else {
                Some(u64::from(size32))
            };
            let end = size
                .and_then(|s| usize::try_from(s).ok())
                .and_then(|s| data_start.checked_add(s));
            match end {
                Some(end) if end <= bytes.len() => end,
                Some(end) => return inside(format!("needs bytes up to offset {end}")),
                None => return inside("has no readable size".into()),
            }
        };
        at = next;
        last = Some(name);
    }
    after(&last)
}

/// The end of the data descriptor that closes an entry whose data starts at `start`: the
/// first descriptor signature followed by a size equal to its distance from `start`.
fn find_descriptor(bytes: &[u8], start: usize) -> Option<usize> {
    const SIG: [u8; 4] = 0x0807_4b50u32.to_le_bytes();
    let size_at = |p: usize, n: usize| bytes.get(p + 8..p + 8 + n);
    let mut p = start;
    loop {
        p += bytes.get(p..)?.iter().position(|&b| b == SIG[0])?;
        if bytes.get(p..p + 4) == Some(&SIG[..]) {
            let len = (p - start) as u64;
            if size_at(p, 4) == Some(&(len as u32).to_le_bytes()[..]) && len <= u32::MAX as u64 {
                return Some(p + 16);
            }
            if size_at(p, 8) == Some(&len.to_le_bytes()[..]) {
                return Some(p + 24);
            }
        }
        p += 1;
    }
}

/// The size in a local header's ZIP64 extra field (the first value of block 0x0001).
fn zip64_local_size(extra: Option<&[u8]>) -> Option<u64> {
    let mut extra = extra?;
    while let [a, b, c, d, rest @ ..] = extra {
        let id = u16::from_le_bytes([*a, *b]);
        let len = usize::from(u16::from_le_bytes([*c, *d]));
        let body = rest.get(..len)?;
        if id == 0x0001 {
            return body
                .get(..8)
                .and_then(|v| <[u8; 8]>::try_from(v).ok())
                .map(u64::from_le_bytes);
        }
        extra = rest.get(len..)?;
    }
    None
}

/// Reads one central-directory record and its local header; returns the entry and the
/// offset of its local header.
fn read_central_entry(
    cur: &mut Cursor<'_>,
    bytes: &[u8],
    file: &Path,
) -> Result<(Entry, usize), ConvertError> {
    let at = cur.pos();
    let what = "zip central directory record";
    if cur.u32(what)? != CENTRAL_SIG {
        return Err(ConvertError::malformed(file, what, at, "bad signature"));
    }
    let _made = cur.u16(what)?;
    let _needed = cur.u16(what)?;
    let flags = cur.u16(what)?;
    let method = cur.u16(what)?;
    let _time = cur.u16(what)?;
    let _date = cur.u16(what)?;
    let crc32 = cur.u32(what)?;
    let mut compressed = u64::from(cur.u32(what)?);
    let mut size = u64::from(cur.u32(what)?);
    let name_len = usize::from(cur.u16(what)?);
    let extra_len = usize::from(cur.u16(what)?);
    let comment_len = usize::from(cur.u16(what)?);
    let _disk = cur.u16(what)?;
    let _internal = cur.u16(what)?;
    let _external = cur.u32(what)?;
    let mut local = u64::from(cur.u32(what)?);
    let raw_name = cur.take(name_len, "zip entry name")?;
    let extra = cur.take(extra_len, "zip extra field")?;
    cur.take(comment_len, "zip entry comment")?;

    let name = check_name(raw_name, file)?;
    if method != 0 {
        return Err(ConvertError::CompressedEntry {
            file: file.to_path_buf(),
            entry: name,
            method,
        });
    }
    if flags & 0x1 != 0 {
        return Err(ConvertError::malformed(
            file,
            what,
            at,
            format!("entry {name:?} is encrypted"),
        ));
    }
    // ZIP64 extended information: present values replace the 0xffffffff placeholders, in order.
    let mut ex = Cursor::new(extra, 0, file);
    while ex.remaining() >= 4 {
        let id = ex.u16("zip extra field")?;
        let len = usize::from(ex.u16("zip extra field")?);
        let body = ex.take(len, "zip extra field")?;
        if id == 0x0001 {
            let mut z = Cursor::new(body, 0, file);
            if size == 0xffff_ffff {
                size = z.u64("zip64 extra")?;
            }
            if compressed == 0xffff_ffff {
                compressed = z.u64("zip64 extra")?;
            }
            if local == 0xffff_ffff {
                local = z.u64("zip64 extra")?;
            }
        }
    }
    if compressed != size {
        return Err(ConvertError::malformed(
            file,
            what,
            at,
            format!("stored entry {name:?} has compressed size {compressed} != size {size}"),
        ));
    }
    let too_large = |what: &str, declared: u64| ConvertError::DeclaredSizeTooLarge {
        file: file.to_path_buf(),
        what: format!("zip entry {name:?} {what}"),
        declared,
        limit: bytes.len() as u64,
    };
    let local_at = usize::try_from(local)
        .ok()
        .filter(|&l| l < bytes.len())
        .ok_or_else(|| too_large("local header offset", local))?;
    let mut lc = Cursor::new(bytes, local_at, file);
    let lwhat = "zip local header";
    if lc.u32(lwhat)? != LOCAL_SIG {
        return Err(ConvertError::malformed(
            file,
            lwhat,
            local_at,
            format!("bad signature for {name:?}"),
        ));
    }
    lc.take(LOCAL_LEN - 4 - 4, lwhat)?;
    let lname_len = usize::from(lc.u16(lwhat)?);
    let lextra_len = usize::from(lc.u16(lwhat)?);
    let lname = lc.take(lname_len, lwhat)?;
    if lname != raw_name {
        return Err(ConvertError::malformed(
            file,
            lwhat,
            local_at,
            format!("local name differs from central name {name:?}"),
        ));
    }
    lc.take(lextra_len, lwhat)?;
    let start = lc.pos();
    let end = usize::try_from(size)
        .ok()
        .and_then(|s| start.checked_add(s))
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| too_large("size", size))?;
    Ok((
        Entry {
            name,
            data: start..end,
            crc32,
        },
        local_at,
    ))
}

/// Rejects names that could escape a folder when extracted, or that are not UTF-8.
fn check_name(raw: &[u8], file: &Path) -> Result<String, ConvertError> {
    let unsafe_name = |entry: String, reason| ConvertError::UnsafeEntryName {
        file: file.to_path_buf(),
        entry,
        reason,
    };
    let name = std::str::from_utf8(raw)
        .map_err(|_| unsafe_name(String::from_utf8_lossy(raw).into_owned(), "not UTF-8"))?
        .to_string();
    if name.is_empty() {
        return Err(unsafe_name(name, "empty name"));
    }
    if name.contains('\\') {
        return Err(unsafe_name(name, "contains a backslash"));
    }
    if name.contains('\0') {
        return Err(unsafe_name(name, "contains a NUL byte"));
    }
    if name.starts_with('/') {
        return Err(unsafe_name(name, "absolute path"));
    }
    if name.as_bytes().get(1) == Some(&b':') {
        return Err(unsafe_name(name, "drive letter"));
    }
    if name.split('/').any(|c| c == "..") {
        return Err(unsafe_name(name, "`..` component"));
    }
    Ok(name)
}

/// Entries (local header through data) must not overlap each other or the central directory.
fn check_overlaps(
    entries: &[Entry],
    spans: &mut [(usize, usize, usize)],
    cd_start: usize,
    file: &Path,
) -> Result<(), ConvertError> {
    spans.sort_unstable();
    let name = |i: usize| entries.get(i).map(|e| e.name.clone()).unwrap_or_default();
    for pair in spans.windows(2) {
        if let [(_, end_a, a), (start_b, _, b)] = pair {
            if start_b < end_a {
                return Err(ConvertError::OverlappingEntries {
                    file: file.to_path_buf(),
                    entry: name(*b),
                    other: name(*a),
                });
            }
        }
    }
    if let Some((_, end, i)) = spans.last() {
        if *end > cd_start {
            return Err(ConvertError::OverlappingEntries {
                file: file.to_path_buf(),
                entry: name(*i),
                other: "central directory".into(),
            });
        }
    }
    Ok(())
}
