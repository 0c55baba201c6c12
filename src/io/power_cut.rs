//! What the folders of a disk hold after a power cut: the durability events the
//! [`super::MemoryStorage`] folders of one disk record (a file's bytes fsynced, a name given
//! or removed, a folder fsynced), in the order they happened, replayed up to any point.
//!
//! The model is POSIX's promise, as a local folder keeps it ([`super::LocalStorage`]): a
//! file's bytes survive once the file was fsynced, a name (a temp file's too) once its
//! folder was fsynced after it was given (or removed). Name changes not yet made durable may
//! survive or not, any of them (a journaling filesystem keeps some first of them, in the
//! order they were made; POSIX promises nothing). A file whose name survived but whose bytes were never fsynced is
//! empty, as a rename whose data had not reached the disk leaves it. Folders are there: a
//! local folder is made durable in its parent when it is created
//! ([`super::local::create_dir_durable`]).

use std::collections::{BTreeMap, HashMap};

use super::bytes::FileBytes;

#[derive(Debug, Clone)]
enum Event {
    /// The bytes of file `file` were fsynced.
    Synced { file: u64, bytes: FileBytes },
    /// `name` in `folder` was given to `file` (`Some`), or removed (`None`).
    Named {
        folder: String,
        name: String,
        file: Option<u64>,
    },
    /// `folder` was fsynced: every change of its names before it is durable.
    FolderSynced { folder: String },
}

/// A name change not yet durable: folder, name, file.
type Change<'a> = (&'a str, &'a str, Option<u64>);

/// The durability events of the folders of one disk, in order.
#[derive(Debug, Default)]
pub(crate) struct DiskLog {
    events: Vec<Event>,
    files: u64,
}

impl DiskLog {
    /// A new file, not yet named: its number.
    pub(crate) fn new_file(&mut self) -> u64 {
        self.files += 1;
        self.files
    }

    /// `bytes` of `file` were fsynced.
    pub(crate) fn synced(&mut self, file: u64, bytes: FileBytes) {
        self.events.push(Event::Synced { file, bytes });
    }

    /// `name` in `folder` now names `file` (`Some`), or nothing (`None`).
    pub(crate) fn named(&mut self, folder: &str, name: &str, file: Option<u64>) {
        self.events.push(Event::Named {
            folder: folder.to_string(),
            name: name.to_string(),
            file,
        });
    }

    /// `folder` was fsynced.
    pub(crate) fn folder_synced(&mut self, folder: &str) {
        self.events.push(Event::FolderSynced {
            folder: folder.to_string(),
        });
    }

    /// Events so far: a power cut can fall after any number of them, `0..=len`.
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// Replays the first `at` events.
    fn replay(&self, at: usize) -> Replayed<'_> {
        let mut r = Replayed::default();
        for event in &self.events[..at.min(self.events.len())] {
            match event {
                Event::Synced { file, bytes } => {
                    r.bytes.insert(*file, bytes);
                }
                Event::Named { folder, name, file } => r.pending.push((folder, name, *file)),
                Event::FolderSynced { folder } => {
                    let (mine, others) = r.pending.drain(..).partition(|c| c.0 == folder);
                    r.pending = others;
                    for change in mine {
                        r.durable.apply(change);
                    }
                }
            }
        }
        r
    }

    /// The name changes among the first `at` events not made durable by an fsync of their
    /// folder among them: those a cut after event `at` may or may not keep.
    pub(crate) fn unsynced_name_changes(&self, at: usize) -> usize {
        self.replay(at).pending.len()
    }

    /// The files of `folder` a power cut after the first `at` events leaves, by name: the
    /// names durable then, plus the name changes not yet durable (of any folder, in the order
    /// made) whose bit is set in `kept` (bit `i`, the `i`th; none past the 64th), each with the
    /// bytes its file last had fsynced (empty when never).
    pub(crate) fn survivors(
        &self,
        folder: &str,
        at: usize,
        kept: u64,
    ) -> BTreeMap<String, FileBytes> {
        let Replayed {
            mut durable,
            pending,
            bytes,
        } = self.replay(at);
        for (i, change) in pending.into_iter().enumerate() {
            if i < 64 && (kept >> i) & 1 == 1 {
                durable.apply(change);
            }
        }
        durable
            .0
            .into_iter()
            .filter(|((f, _), _)| *f == folder)
            .map(|((_, name), file)| {
                let b = bytes
                    .get(&file)
                    .map_or_else(|| FileBytes::from_vec(Vec::new()), |b| (*b).clone());
                (name.to_string(), b)
            })
            .collect()
    }
}

/// The first events of a [`DiskLog`], replayed.
#[derive(Default)]
struct Replayed<'a> {
    /// The names durable then.
    durable: Names<'a>,
    /// The name changes not yet durable, in the order made.
    pending: Vec<Change<'a>>,
    /// The bytes each file last had fsynced.
    bytes: HashMap<u64, &'a FileBytes>,
}

/// Files by folder and name.
#[derive(Default)]
struct Names<'a>(BTreeMap<(&'a str, &'a str), u64>);

impl<'a> Names<'a> {
    fn apply(&mut self, (folder, name, file): Change<'a>) {
        match file {
            Some(f) => self.0.insert((folder, name), f),
            None => self.0.remove(&(folder, name)),
        };
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
        log.named("", "a", Some(a));
        log.folder_synced(""); // 3 events: `a` durable with its bytes
        let b = log.new_file();
        log.named("", "b", Some(b)); // never fsynced: empty if its name survives
        log.named("", "a", None);
        let c = log.new_file();
        log.synced(c, bytes("c1"));
        log.named("", "c", Some(c));
        assert_eq!(log.len(), 7);

        let root = |at, kept| text(&log.survivors("", at, kept));
        assert!(root(0, 9).is_empty());
        assert_eq!(root(3, 0), pairs(&[("a", "a1")]));
        assert_eq!(log.unsynced_name_changes(3), 0);
        assert_eq!(log.unsynced_name_changes(7), 3);
        assert_eq!(root(7, 0), pairs(&[("a", "a1")]));
        assert_eq!(root(7, 0b1), pairs(&[("a", "a1"), ("b", "")]));
        assert_eq!(root(7, 0b11), pairs(&[("b", "")]));
        assert_eq!(root(7, 0b111), pairs(&[("b", ""), ("c", "c1")]));
        // Any of them: `c` named, `a`'s removal lost.
        assert_eq!(root(7, 0b100), pairs(&[("a", "a1"), ("c", "c1")]));
        log.folder_synced("");
        assert_eq!(log.unsynced_name_changes(8), 0);
        assert_eq!(
            text(&log.survivors("", 8, 0)),
            pairs(&[("b", ""), ("c", "c1")])
        );
    }

    #[test]
    fn a_folder_fsync_makes_its_own_names_durable_and_no_others() {
        let mut log = DiskLog::default();
        let (p, i) = (log.new_file(), log.new_file());
        log.synced(p, bytes("pack"));
        log.named("packs", "p", Some(p));
        log.synced(i, bytes("index"));
        log.named("meta", "i", Some(i));
        log.folder_synced("meta"); // 5 events: `i` durable, `p` not
        assert_eq!(log.unsynced_name_changes(5), 1);
        assert_eq!(text(&log.survivors("meta", 5, 0)), pairs(&[("i", "index")]));
        assert!(log.survivors("packs", 5, 0).is_empty());
        assert_eq!(text(&log.survivors("packs", 5, 1)), pairs(&[("p", "pack")]));
        log.folder_synced("packs");
        assert_eq!(text(&log.survivors("packs", 6, 0)), pairs(&[("p", "pack")]));
        assert!(log.survivors("other", 6, 9).is_empty());
    }
}
