//! What a folder holds after a power cut: the durability events a [`super::MemoryStorage`]
//! records (a file's bytes fsynced, a name given or removed, the folder fsynced), replayed up
//! to any point.
//!
//! The model is POSIX's promise and nothing more, as a local folder keeps it
//! ([`super::LocalStorage`]): a file's bytes survive once the file was fsynced, a name once
//! the folder was fsynced after it was given (or removed). Name changes made since the last
//! folder fsync may survive or not; a journal keeps them in the order they were made, so a
//! cut keeps some first of them. A file whose name survived but whose bytes were never
//! fsynced is empty, as a rename whose data had not reached the disk leaves it.

use std::collections::{BTreeMap, HashMap};

use super::bytes::FileBytes;

#[derive(Debug, Clone)]
enum Event {
    /// The bytes of file `file` were fsynced.
    Synced { file: u64, bytes: FileBytes },
    /// `name` was given to `file` (`Some`), or removed (`None`).
    Named { name: String, file: Option<u64> },
    /// The folder was fsynced: every name change before it is durable.
    FolderSynced,
}

/// The durability events of one folder, in order.
#[derive(Debug, Default)]
pub(crate) struct DiskLog {
    events: Vec<Event>,
    files: u64,
    names: HashMap<String, u64>,
}

impl DiskLog {
    /// A new file, not yet named: its number.
    pub(crate) fn new_file(&mut self) -> u64 {
        self.files += 1;
        self.files
    }

    /// The file `name` is now, if any.
    pub(crate) fn file_of(&self, name: &str) -> Option<u64> {
        self.names.get(name).copied()
    }

    /// `bytes` of `file` were fsynced.
    pub(crate) fn synced(&mut self, file: u64, bytes: FileBytes) {
        self.events.push(Event::Synced { file, bytes });
    }

    /// `name` now names `file` (`Some`), or nothing (`None`).
    pub(crate) fn named(&mut self, name: &str, file: Option<u64>) {
        match file {
            Some(f) => self.names.insert(name.to_string(), f),
            None => self.names.remove(name),
        };
        self.events.push(Event::Named {
            name: name.to_string(),
            file,
        });
    }

    /// The folder was fsynced.
    pub(crate) fn folder_synced(&mut self) {
        self.events.push(Event::FolderSynced);
    }

    /// Events so far: a power cut can fall after any number of them, `0..=len`.
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// The name changes among the first `at` events made after the last folder fsync among
    /// them: those a cut after event `at` may or may not keep.
    pub(crate) fn unsynced_name_changes(&self, at: usize) -> usize {
        let events = &self.events[..at.min(self.events.len())];
        let after_sync = events
            .iter()
            .rposition(|e| matches!(e, Event::FolderSynced))
            .map_or(0, |i| i + 1);
        events[after_sync..]
            .iter()
            .filter(|e| matches!(e, Event::Named { .. }))
            .count()
    }

    /// The files a power cut after the first `at` events leaves, by name: the names durable
    /// then, plus the first `kept` name changes made after the last folder fsync, each with
    /// the bytes its file last had fsynced (empty when never).
    pub(crate) fn survivors(&self, at: usize, kept: usize) -> BTreeMap<String, FileBytes> {
        let mut durable: BTreeMap<String, u64> = BTreeMap::new();
        let mut pending: Vec<(&str, Option<u64>)> = Vec::new();
        let mut bytes: HashMap<u64, &FileBytes> = HashMap::new();
        let apply = |names: &mut BTreeMap<String, u64>, (name, file): (&str, Option<u64>)| {
            match file {
                Some(f) => names.insert(name.to_string(), f),
                None => names.remove(name),
            };
        };
        for event in &self.events[..at.min(self.events.len())] {
            match event {
                Event::Synced { file, bytes: b } => {
                    bytes.insert(*file, b);
                }
                Event::Named { name, file } => pending.push((name, *file)),
                Event::FolderSynced => {
                    for change in pending.drain(..) {
                        apply(&mut durable, change);
                    }
                }
            }
        }
        for change in pending.into_iter().take(kept) {
            apply(&mut durable, change);
        }
        durable
            .into_iter()
            .map(|(name, file)| {
                let b = bytes
                    .get(&file)
                    .map_or_else(|| FileBytes::from_vec(Vec::new()), |b| (*b).clone());
                (name, b)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> FileBytes {
        FileBytes::copy_of(s.as_bytes())
    }

    fn text(files: &BTreeMap<String, FileBytes>) -> Vec<(String, String)> {
        files
            .iter()
            .map(|(n, b)| (n.clone(), String::from_utf8(b.to_vec()).unwrap()))
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn only_fsynced_names_and_bytes_survive_and_unsynced_names_in_order() {
        let mut log = DiskLog::default();
        let a = log.new_file();
        log.synced(a, bytes("a1"));
        log.named("a", Some(a));
        log.folder_synced(); // 3 events: `a` durable with its bytes
        let b = log.new_file();
        log.named("b", Some(b)); // never fsynced: empty if its name survives
        log.named("a", None);
        let c = log.new_file();
        log.synced(c, bytes("c1"));
        log.named("c", Some(c));
        assert_eq!(log.len(), 7);

        assert!(log.survivors(0, 9).is_empty());
        assert_eq!(text(&log.survivors(3, 0)), pairs(&[("a", "a1")]));
        assert_eq!(log.unsynced_name_changes(3), 0);
        assert_eq!(log.unsynced_name_changes(7), 3);
        assert_eq!(text(&log.survivors(7, 0)), pairs(&[("a", "a1")]));
        assert_eq!(text(&log.survivors(7, 1)), pairs(&[("a", "a1"), ("b", "")]));
        assert_eq!(text(&log.survivors(7, 2)), pairs(&[("b", "")]));
        assert_eq!(text(&log.survivors(7, 3)), pairs(&[("b", ""), ("c", "c1")]));
        log.folder_synced();
        assert_eq!(log.unsynced_name_changes(8), 0);
        assert_eq!(text(&log.survivors(8, 0)), pairs(&[("b", ""), ("c", "c1")]));
        assert_eq!(log.file_of("c"), Some(c));
        assert_eq!(log.file_of("a"), None);
    }
}
