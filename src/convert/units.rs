//! Finding source files and grouping them into units of work, each giving one key (or, when
//! split, several); and the tensors of a unit seen as one file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::layout::Preset;
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
}

/// What walking the source folder found.
#[derive(Debug, Default)]
pub struct Plan {
    /// Units sorted by key.
    pub units: Vec<Unit>,
    /// Files the layout or the group pattern does not take.
    pub ignored: Vec<PathBuf>,
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

fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) -> Result<(), ConvertError> {
    let io = |source| ConvertError::Io {
        file: dir.to_path_buf(),
        source,
    };
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let ty = entry.file_type().map_err(io)?;
        let path = entry.path();
        if ty.is_dir() {
            walk(&path, out)?;
        } else if ty.is_file() {
            let len = entry.metadata().map_err(io)?.len();
            out.push((path, len));
        }
    }
    Ok(())
}

/// Matches `name` against a pattern of literals, `{key}` and `{part}` (each matching one or
/// more characters); returns (key, part).
pub fn match_pattern(pattern: &str, name: &str) -> Option<(String, String)> {
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

/// Walks `src` (a folder, or one file) and groups its files into units, sorted by key.
/// With `split_file` (a file name pattern with `{stem}`), files matching it are not units but
/// hold the split of the unit beside them.
pub fn plan(
    src: &Path,
    preset: Preset,
    group_by: Option<&str>,
    split_file: Option<&str>,
) -> Result<Plan, ConvertError> {
    let mut files = Vec::new();
    let root = if src.is_dir() {
        walk(src, &mut files)?;
        src.to_path_buf()
    } else {
        let len = std::fs::metadata(src)
            .map_err(|source| ConvertError::Io {
                file: src.to_path_buf(),
                source,
            })?
            .len();
        files.push((src.to_path_buf(), len));
        src.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    files.sort();
    let mut plan = Plan::default();
    let mut groups: BTreeMap<String, Unit> = BTreeMap::new();
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
        let unit = groups.entry(key.clone()).or_insert_with(|| Unit {
            key,
            files: Vec::new(),
            bytes: 0,
            split_file: split_file.map(|p| split_file_of(p, &path)),
        });
        unit.files.push((part, path));
        unit.bytes += len;
    }
    for mut u in groups.into_values() {
        u.files.sort();
        plan.units.push(u);
    }
    Ok(plan)
}

/// The files of a unit, opened: one file, or several whose tensors are named `{part}.{name}`
/// (`{part}` for a bare tensor).
pub struct Inputs {
    files: Vec<(String, SourceFile)>,
}

impl Inputs {
    /// Opens every file of `unit`.
    pub fn open(unit: &Unit, limits: Limits) -> Result<Inputs, ConvertError> {
        let mut files = Vec::with_capacity(unit.files.len());
        for (part, path) in &unit.files {
            files.push((part.clone(), open_source_with(path, limits)?));
        }
        Ok(Inputs { files })
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

    /// The error for reading `name` when it is a tensor of a dtype hspack does not store.
    pub fn unsupported(&self, name: &str) -> Option<ConvertError> {
        for (part, f) in &self.files {
            for (n, dtype) in f.unsupported() {
                if Self::qualify(part, &n) == name {
                    return Some(ConvertError::UnsupportedDType {
                        file: f.path().to_path_buf(),
                        tensor: name.to_string(),
                        dtype,
                    });
                }
            }
        }
        None
    }

    /// The tensor called `name` (as listed by [`Inputs::tensors`]).
    pub fn tensor(&self, name: &str) -> Result<SourceTensor<'_>, ConvertError> {
        for (part, f) in &self.files {
            let inner = if part.is_empty() {
                Some(name)
            } else if name == part {
                Some("")
            } else {
                name.strip_prefix(part.as_str())
                    .and_then(|r| r.strip_prefix('.'))
            };
            if let Some(inner) = inner {
                match f.tensor(inner) {
                    Ok(mut t) => {
                        t.name = name.to_string();
                        return Ok(t);
                    }
                    // Not in this part: the next part may hold it.
                    Err(ConvertError::Missing { .. }) => {}
                    // In this part, but unreadable: that is the answer.
                    Err(e) => return Err(e),
                }
            }
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
        assert!(is_split_file("{stem}.lens.pt", "b_0.lens.pt"));
        assert!(!is_split_file("{stem}.lens.pt", "b_0.pt"));
        assert!(!is_split_file("{stem}.lens.pt", ".lens.pt"));
        assert_eq!(
            split_file_of("{stem}.lens.pt", Path::new("d/b_0.pt.gz")),
            Path::new("d/b_0.lens.pt")
        );
    }
}
