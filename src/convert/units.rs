//! Finding source files and grouping them into units of work, each giving one key (or, when
//! split, several); and the tensors of a unit seen as one file.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::layout::{Held, Preset};
use super::{open_source_with, ConvertError, Limits, SourceFile, SourceTensor, TensorInfo};

/// Extensions stripped from a relative path to make its key (after `.gz`).
const EXTENSIONS: [&str; 6] = [".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".npy"];

/// Source files that make one sample (or, when split, one batch of samples).
#[derive(Debug, Clone)]
pub struct Unit {
    /// Sample key (the prefix of the keys when split).
    pub key: String,
    /// Files with their part names (empty unless grouped), sorted by part.
    pub files: Vec<(String, PathBuf)>,
    /// Total bytes of the files.
    pub bytes: u64,
    /// The file holding the lengths or offsets that split this unit, beside it.
    pub split_file: Option<PathBuf>,
    /// Parts other groups have and this one lacks, with the file the pattern names for each.
    pub missing: Vec<(String, PathBuf)>,
    /// [`Unit::identity`], taken when first asked.
    pub identity: std::sync::OnceLock<String>,
}

/// Orders names as people number files: runs of digits compare as numbers (`data_2` before
/// `data_10`), the rest byte by byte; of two names that read as one number (`07`, `7`), the
/// shorter comes first. This is the order of samples in a converted dataset.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn runs(s: &str) -> impl Iterator<Item = (bool, &str)> {
        let mut rest = s;
        std::iter::from_fn(move || {
            let first = rest.chars().next()?;
            let digits = first.is_ascii_digit();
            let end = rest
                .find(|c: char| c.is_ascii_digit() != digits)
                .unwrap_or(rest.len());
            let (run, tail) = rest.split_at(end);
            rest = tail;
            Some((digits, run))
        })
    }
    let mut ra = runs(a);
    let mut rb = runs(b);
    loop {
        let ord = match (ra.next(), rb.next()) {
            (None, None) => return a.len().cmp(&b.len()).then_with(|| a.cmp(b)),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((true, x)), Some((true, y))) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                x.len().cmp(&y.len()).then_with(|| x.cmp(y))
            }
            (Some((_, x)), Some((_, y))) => x.cmp(y),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
}

/// A unit key ordered by [`natural_cmp`].
#[derive(Debug, PartialEq, Eq)]
struct Natural(String);

impl Ord for Natural {
    fn cmp(&self, other: &Self) -> Ordering {
        natural_cmp(&self.0, &other.0)
    }
}

impl PartialOrd for Natural {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Unit {
    /// Every file an error about this unit may name: its files, its split file, and the files
    /// of the parts it lacks.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files
            .iter()
            .map(|f| f.1.as_path())
            .chain(self.split_file.as_deref())
            .chain(self.missing.iter().map(|m| m.1.as_path()))
    }
}

/// What walking the source folder found.
#[derive(Debug, Default)]
pub struct Plan {
    /// Units in the natural order of their keys ([`natural_cmp`]).
    pub units: Vec<Unit>,
    /// Files the layout or the group pattern does not take.
    pub ignored: Vec<PathBuf>,
    /// Dump files reached again under another name (a hard link, a link to a file), each
    /// with the name it is converted under: converted once, and said by name, as a sample
    /// left out unsaid would be.
    pub aliases: Vec<(PathBuf, PathBuf)>,
}

/// Relative path with `/` separators.
fn rel_name(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// The key of a relative path: without `.gz` and a known extension.
pub fn key_of(rel: &str) -> String {
    let base = rel.strip_suffix(".gz").unwrap_or(rel);
    for e in EXTENSIONS {
        if let Some(k) = base.strip_suffix(e) {
            return k.to_string();
        }
    }
    base.to_string()
}

/// What a walk of a source folder found.
#[derive(Default)]
struct Walk {
    /// Every file, with its length.
    files: Vec<(PathBuf, u64)>,
    /// Hidden files and folders (named `.…`), links to nothing, folders and files reached a
    /// second time (through a link, or a file's hard link), and what is not a file nor a
    /// folder (a FIFO, a socket, a device): not converted, and reported with the files the
    /// layout does not take.
    passed_over: Vec<PathBuf>,
    /// The device and inode of every folder walked.
    seen: std::collections::HashSet<(u64, u64)>,
    /// The device and inode of every file found, and where it is in `files`: one reached
    /// again would be converted twice, under two keys.
    seen_files: std::collections::HashMap<(u64, u64), usize>,
    /// Files reached again under another name (a hard link, a link to a file), each with
    /// where the file is in `files`: [`Plan::aliases`] where the layout takes them.
    again: Vec<(PathBuf, usize)>,
    /// The device and inode of the destination, when it lies in the source: not walked (its
    /// files are the dataset being written, not dumps).
    skip: Option<(u64, u64)>,
}

/// Walks `dir`, links followed (to files and to folders): a linked dump is converted, never
/// skipped. A folder or file reached again (`latest -> step_1000`) is taken once, under the
/// first of its names in order, and a link to nothing is passed over: all are reported (a dump
/// file reached again by name). A
/// link to a folder above it (a loop) is an error naming it. `above`: the device and inode of
/// the folders the walk is in.
fn walk(dir: &Path, above: &mut Vec<(u64, u64)>, found: &mut Walk) -> Result<(), ConvertError> {
    use std::os::unix::fs::MetadataExt;
    let io = |file: &Path| {
        let file = file.to_path_buf();
        move |source| ConvertError::Io { file, source }
    };
    let here = std::fs::metadata(dir).map_err(io(dir))?;
    let id = (here.dev(), here.ino());
    if found.skip == Some(id) {
        return Ok(());
    }
    if above.contains(&id) {
        return Err(io(dir)(std::io::Error::other(
            "a link to a folder that holds it (a loop): remove the link, or convert a folder \
             that does not hold it",
        )));
    }
    if !found.seen.insert(id) {
        found.passed_over.push(dir.to_path_buf());
        return Ok(());
    }
    above.push(id);
    let mut entries = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(io(dir))?;
    // The same folder reached twice is walked under its first name in order.
    entries.sort();
    for path in entries {
        // A hidden file or folder (`.ipynb_checkpoints/`, `.git/`, an editor's swap file) is
        // no dump of the run's: converted, it would be a sample twice (a notebook's copy of a
        // dump) or a bad file. Passed over and reported.
        if path
            .file_name()
            .is_some_and(|n| n.as_encoded_bytes().starts_with(b"."))
        {
            found.passed_over.push(path);
            continue;
        }
        // Through a link: what it names.
        let meta = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                found.passed_over.push(path);
                continue;
            }
            Err(e) => return Err(io(&path)(e)),
        };
        if meta.is_dir() {
            walk(&path, above, found)?;
        } else if !meta.is_file() {
            found.passed_over.push(path);
        } else if let Some(&i) = found.seen_files.get(&(meta.dev(), meta.ino())) {
            found.again.push((path, i));
        } else {
            let at = found.files.len();
            found.seen_files.insert((meta.dev(), meta.ino()), at);
            found.files.push((path, meta.len()));
        }
    }
    above.pop();
    Ok(())
}

impl Unit {
    /// What tells this unit's files apart from files written again under their names: each
    /// one's length, modification time and inode. Empty where one cannot be read. Taken once,
    /// when first asked (planning, where a key log is kept), so the log records the files as
    /// they were when the run chose to read them, without a second `stat` of each.
    pub fn identity(&self) -> &str {
        self.identity.get_or_init(|| self.identity_now())
    }

    /// [`Unit::identity`] as the files are now: a unit whose files were written again since
    /// it was taken gives another.
    pub fn identity_now(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        let mut out = String::new();
        for path in self.own_files() {
            let Ok(m) = std::fs::metadata(path) else {
                return String::new();
            };
            out.push_str(&format!(
                "{}:{}.{}:{};",
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ino()
            ));
        }
        out
    }

    /// Every file of the unit: its parts, then the file that splits it.
    pub fn own_files(&self) -> impl Iterator<Item = &PathBuf> {
        self.files.iter().map(|f| &f.1).chain(&self.split_file)
    }

    /// The first of the unit's files reached through a symbolic link, or that has other hard
    /// links: deleting that name would leave its bytes under another.
    pub fn linked_file(&self) -> Option<&PathBuf> {
        use std::os::unix::fs::MetadataExt;
        self.own_files().find(|path| {
            std::fs::symlink_metadata(path)
                .is_ok_and(|m| m.file_type().is_symlink() || m.nlink() > 1)
        })
    }
}

/// Matches `name` against a pattern of literals, `{key}` and `{part}` (each matching one or
/// more characters); returns (key, part). A pattern must name each once (`ConvertSpec::check`
/// refuses others); one that does not matches nothing, as the search, trying every split of
/// `name` for each placeholder, would take time exponential in their number.
pub fn match_pattern(pattern: &str, name: &str) -> Option<(String, String)> {
    if pattern.matches("{key}").count() != 1 || pattern.matches("{part}").count() != 1 {
        return None;
    }
    fn go<'a>(pat: &str, name: &'a str, caps: &mut Vec<(bool, &'a str)>) -> bool {
        for (tag, is_key) in [("{key}", true), ("{part}", false)] {
            if let Some(rest) = pat.strip_prefix(tag) {
                for end in (1..=name.len()).rev() {
                    if !name.is_char_boundary(end) {
                        continue;
                    }
                    caps.push((is_key, &name[..end]));
                    if go(rest, &name[end..], caps) {
                        return true;
                    }
                    caps.pop();
                }
                return false;
            }
        }
        match (pat.chars().next(), name.chars().next()) {
            (None, None) => true,
            (Some(p), Some(n)) if p == n => go(&pat[p.len_utf8()..], &name[n.len_utf8()..], caps),
            _ => false,
        }
    }
    let mut caps = Vec::new();
    if !go(pattern, name, &mut caps) {
        return None;
    }
    let key = caps.iter().find(|c| c.0).map(|c| c.1.to_string())?;
    let part = caps.iter().find(|c| !c.0).map(|c| c.1.to_string())?;
    Some((key, part))
}

/// The stem of a file name: without `.gz` and a known extension.
fn stem_of(name: &str) -> &str {
    let base = name.strip_suffix(".gz").unwrap_or(name);
    EXTENSIONS
        .iter()
        .find_map(|e| base.strip_suffix(e))
        .unwrap_or(base)
}

/// Whether `name` (a file name) matches `pattern`, a file name with one `{stem}`.
fn is_split_file(pattern: &str, name: &str) -> bool {
    let Some((pre, post)) = pattern.split_once("{stem}") else {
        return false;
    };
    name.len() > pre.len() + post.len() && name.starts_with(pre) && name.ends_with(post)
}

/// The file beside `path` that `pattern` (a file name with `{stem}`) names for it.
pub fn split_file_of(pattern: &str, path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let sibling = pattern.replace("{stem}", stem_of(&name));
    path.with_file_name(sibling)
}

/// Walks `src` (a folder, or one file) and groups its files into units, in the natural order
/// of their keys ([`natural_cmp`]); folder `dst` (the dataset written), where it lies inside
/// `src`, is not walked.
/// With `split_file` (a file name pattern with `{stem}`), files matching it are not units but
/// hold the split of the unit beside them.
pub fn plan(
    src: &Path,
    dst: &Path,
    preset: Preset,
    group_by: Option<&str>,
    split_file: Option<&str>,
) -> Result<Plan, ConvertError> {
    use std::os::unix::fs::MetadataExt;
    let mut found = Walk {
        skip: std::fs::metadata(dst).ok().map(|m| (m.dev(), m.ino())),
        ..Walk::default()
    };
    let root = if src.is_dir() {
        walk(src, &mut Vec::new(), &mut found)?;
        src.to_path_buf()
    } else {
        let meta = std::fs::metadata(src).map_err(|source| ConvertError::Io {
            file: src.to_path_buf(),
            source,
        })?;
        if !meta.is_file() {
            // A FIFO would block the read for good; a device is no dump.
            return Err(ConvertError::Io {
                file: src.to_path_buf(),
                source: std::io::Error::other(
                    "not a file nor a folder (a FIFO, a socket or a device): give a dump \
                     file or a folder of them",
                ),
            });
        }
        found.files.push((src.to_path_buf(), meta.len()));
        src.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    // Whether a file is a unit's: a split file beside a batch is not, nor one the layout or
    // the pattern does not take.
    let takes = |path: &Path| {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        if split_file.is_some_and(|p| is_split_file(p, &name)) {
            return false;
        }
        let rel = rel_name(&root, path);
        match group_by {
            Some(p) => match_pattern(p, &rel).is_some(),
            None => preset.accepts(&rel),
        }
    };
    // A file reached under several names is converted under the first the layout takes (the
    // first found may be one it does not, a backup's name); its other names the layout takes
    // are listed as aliases of that one, the rest passed over.
    let mut plan = Plan::default();
    let mut others: Vec<Vec<PathBuf>> = vec![Vec::new(); found.files.len()];
    for (path, i) in found.again {
        others[i].push(path);
    }
    for (i, names) in others.into_iter().enumerate() {
        if names.is_empty() {
            continue;
        }
        let mut all: Vec<PathBuf> = std::iter::once(found.files[i].0.clone())
            .chain(names)
            .collect();
        let chosen = all.remove(all.iter().position(|p| takes(p)).unwrap_or(0));
        for name in all {
            match takes(&name) {
                true => plan.aliases.push((name, chosen.clone())),
                false => found.passed_over.push(name),
            }
        }
        found.files[i].0 = chosen;
    }
    let mut files = found.files;
    files.sort();
    plan.ignored = found.passed_over;
    let mut groups: BTreeMap<Natural, Unit> = BTreeMap::new();
    for (path, len) in files {
        let rel = rel_name(&root, &path);
        if let Some(p) = split_file {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default();
            if is_split_file(p, &name) {
                continue;
            }
        }
        let (key, part) = match group_by {
            Some(p) => match match_pattern(p, &rel) {
                Some(kp) => kp,
                None => {
                    plan.ignored.push(path);
                    continue;
                }
            },
            None if preset.accepts(&rel) => (key_of(&rel), String::new()),
            None => {
                plan.ignored.push(path);
                continue;
            }
        };
        let unit = groups.entry(Natural(key.clone())).or_insert_with(|| Unit {
            key,
            files: Vec::new(),
            bytes: 0,
            split_file: split_file.map(|p| split_file_of(p, &path)),
            missing: Vec::new(),
            identity: Default::default(),
        });
        unit.files.push((part, path));
        unit.bytes += len;
    }
    let parts: BTreeSet<Natural> = groups
        .values()
        .flat_map(|u| &u.files)
        .filter(|(p, _)| !p.is_empty())
        .map(|(p, _)| Natural(p.clone()))
        .collect();
    for mut u in groups.into_values() {
        u.files
            .sort_by(|a, b| natural_cmp(&a.0, &b.0).then_with(|| a.1.cmp(&b.1)));
        if let Some(pattern) = group_by {
            for Natural(part) in &parts {
                if !u.files.iter().any(|(p, _)| p == part) {
                    let rel = pattern.replace("{key}", &u.key).replace("{part}", part);
                    u.missing.push((part.clone(), root.join(rel)));
                }
            }
        }
        plan.units.push(u);
    }
    Ok(plan)
}

/// The name of `name` inside the file of `part`: tensors and values of a group's files are
/// named `PART.NAME`, or `PART` for the file's bare tensor or value; `None` when `name` is not
/// in that part. Without a part (ungrouped files), `name` itself.
pub fn in_part<'n>(part: &str, name: &'n str) -> Option<&'n str> {
    if part.is_empty() {
        Some(name)
    } else if name == part {
        Some("")
    } else {
        name.strip_prefix(part).and_then(|r| r.strip_prefix('.'))
    }
}

/// The files of a unit, opened: one file, or several whose tensors are named `{part}.{name}`
/// (`{part}` for a bare tensor).
pub struct Inputs {
    files: Vec<(String, SourceFile)>,
    group: String,
    missing: Vec<(String, PathBuf)>,
}

impl Inputs {
    /// Opens every file of `unit`.
    pub fn open(unit: &Unit, limits: Limits) -> Result<Inputs, ConvertError> {
        let mut files = Vec::with_capacity(unit.files.len());
        for (part, path) in &unit.files {
            files.push((part.clone(), open_source_with(path, limits)?));
        }
        Ok(Inputs {
            files,
            group: unit.key.clone(),
            missing: unit.missing.clone(),
        })
    }

    /// The error for `name` when it lies in a part this group lacks.
    pub fn missing_part_of(&self, name: &str) -> Option<ConvertError> {
        self.missing
            .iter()
            .find(|(part, _)| in_part(part, name).is_some())
            .map(|(part, file)| ConvertError::MissingPart {
                file: file.clone(),
                group: self.group.clone(),
                part: part.clone(),
                wanted: name.to_string(),
            })
    }

    /// The open files with their part names.
    pub fn files(&self) -> &[(String, SourceFile)] {
        &self.files
    }

    /// The file named in errors.
    pub fn path(&self) -> &Path {
        self.files.first().map_or(Path::new(""), |f| f.1.path())
    }

    fn qualify(part: &str, name: &str) -> String {
        match (part.is_empty(), name.is_empty()) {
            (true, _) => name.to_string(),
            (false, true) => part.to_string(),
            (false, false) => format!("{part}.{name}"),
        }
    }

    /// Every tensor of every file.
    pub fn tensors(&self) -> Vec<TensorInfo> {
        let mut out = Vec::new();
        for (part, f) in &self.files {
            for mut t in f.tensors() {
                t.name = Self::qualify(part, &t.name);
                out.push(t);
            }
        }
        out
    }

    /// What the files hold under `name` where that is a list or tuple of values, not a tensor
    /// (token ids saved as a Python list), in words: `a list of 8 ints`.
    pub fn not_a_tensor(&self, name: &str) -> Option<String> {
        for (part, f) in &self.files {
            let items: Vec<&'static str> = f
                .values()
                .into_iter()
                .filter_map(|v| {
                    let path = Self::qualify(part, &v.name);
                    let rest = path.strip_prefix(name)?.strip_prefix('.')?;
                    rest.bytes().all(|b| b.is_ascii_digit()).then_some(v.kind)
                })
                .collect();
            if !items.is_empty() {
                let what = match items.iter().all(|k| *k == "an int") {
                    true => "ints",
                    false => "values",
                };
                return Some(format!("a list of {} {what}", items.len()));
            }
        }
        None
    }

    /// The error for reading `name` when it is a tensor of a dtype hspack does not store.
    pub fn unsupported(&self, name: &str) -> Option<ConvertError> {
        for (part, f) in &self.files {
            for u in f.unsupported() {
                if Self::qualify(part, &u.name) == name {
                    return Some(ConvertError::UnsupportedDType {
                        file: f.path().to_path_buf(),
                        tensor: name.to_string(),
                        dtype: u.dtype,
                    });
                }
            }
        }
        None
    }

    /// What the files hold: every tensor (of a dtype hspack stores or not), every value that
    /// is not a tensor, and the parts.
    pub fn held(&self) -> Held {
        let mut unsupported = Vec::new();
        let mut values = Vec::new();
        for (part, f) in &self.files {
            for mut u in f.unsupported() {
                u.name = Self::qualify(part, &u.name);
                unsupported.push(u);
            }
            for mut v in f.values() {
                v.name = Self::qualify(part, &v.name);
                values.push(v);
            }
        }
        Held {
            tensors: self.tensors(),
            unsupported,
            values,
            parts: self
                .files
                .iter()
                .map(|(p, _)| p.clone())
                .filter(|p| !p.is_empty())
                .collect(),
        }
    }

    /// The file holding the tensor called `name`: the part's whose tensors (of a dtype
    /// hspack stores or not) it is among, else the file of the part `name` is in, else the
    /// unit's first file.
    pub fn file_of(&self, name: &str) -> &Path {
        let holds = |part: &str, f: &SourceFile| {
            in_part(part, name).is_some_and(|inner| {
                f.tensors().iter().any(|t| t.name == inner)
                    || f.unsupported().iter().any(|u| u.name == inner)
            })
        };
        self.files
            .iter()
            .find(|(part, f)| holds(part, f))
            .or_else(|| {
                self.files
                    .iter()
                    .find(|(part, _)| !part.is_empty() && in_part(part, name).is_some())
            })
            .map_or(self.path(), |(_, f)| f.path())
    }

    /// The tensor called `name` (as listed by [`Inputs::tensors`]).
    pub fn tensor(&self, name: &str) -> Result<SourceTensor<'_>, ConvertError> {
        for (part, f) in &self.files {
            if let Some(inner) = in_part(part, name) {
                match f.tensor(inner) {
                    Ok(mut t) => {
                        t.name = name.to_string();
                        return Ok(t);
                    }
                    // Not in this part: the next part may hold it. (A storage or entry
                    // the file lacks is that file's fault, and said so.)
                    Err(ConvertError::Missing { what: "tensor", .. }) => {}
                    // In this part, but unreadable: that is the answer.
                    Err(e) => return Err(e),
                }
            }
        }
        if let Some(e) = self.missing_part_of(name) {
            return Err(e);
        }
        Err(ConvertError::Missing {
            file: self.path().to_path_buf(),
            what: "tensor",
            key: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_patterns() {
        assert_eq!(key_of("rows_0-9/data_3.ckpt.gz"), "rows_0-9/data_3");
        assert_eq!(key_of("a/b.pt"), "a/b");
        assert_eq!(
            match_pattern("req_{key}_layer{part}.pt", "req_7_layer30.pt"),
            Some(("7".into(), "30".into()))
        );
        assert_eq!(
            match_pattern("{key}/{part}.pt", "a/b/ids.pt"),
            Some(("a/b".into(), "ids".into()))
        );
        assert_eq!(match_pattern("{key}/{part}.pt", "a.pt"), None);
        // A pattern naming a placeholder more than once matches nothing, at once: trying
        // every split of a long name for each of 16 placeholders would never end.
        let many = "{key}{part}".repeat(8) + "x";
        let t = std::time::Instant::now();
        assert_eq!(match_pattern(&many, &"a".repeat(200)), None);
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        // One of each is quadratic at worst: a 4096-byte path that does not match.
        assert_eq!(match_pattern("{key}{part}x", &"a".repeat(4096)), None);
        assert!(is_split_file("{stem}.lens.pt", "b_0.lens.pt"));
        let mut names = [
            "data_10",
            "data_2",
            "data_1",
            "rows_10/data_0",
            "rows_9/data_0",
            "data_02",
            "data_",
            "data_1a",
            "b",
        ];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            [
                "b",
                "data_",
                "data_1",
                "data_1a",
                "data_2",
                "data_02",
                "data_10",
                "rows_9/data_0",
                "rows_10/data_0"
            ]
        );
        assert!(!is_split_file("{stem}.lens.pt", "b_0.pt"));
        assert!(!is_split_file("{stem}.lens.pt", ".lens.pt"));
        assert_eq!(
            split_file_of("{stem}.lens.pt", Path::new("d/b_0.pt.gz")),
            Path::new("d/b_0.lens.pt")
        );
    }
}
