//! Where a new dataset may go: a folder that holds no dataset holds nothing but what hspack
//! itself leaves there, or the dataset's files would be mixed in with someone else's (and
//! `hspack cp ds .` would spread a dataset over the working folder).

use crate::error::{Error, Result};
use crate::format::manifest::{is_data_file_name, is_temp_file_name, MANIFEST_FILE};
use crate::io::Storage;

/// True for a file an hspack writer, copy or convert run leaves in a dataset's folder before
/// (or without) its manifest: a lock or lease (named `.hspack…`), a temp file, a shard or other
/// data file (a copy publishes its shards before the manifest), convert's key log and report;
/// or what holds no one's data: a hidden file (`.gitkeep`, `.DS_Store`), a volume's
/// `lost+found`.
fn is_ours(name: &str) -> bool {
    name == crate::convert::keys::KEYS_FILE
        || name == crate::convert::report::REPORT_FILE
        || name == "lost+found"
        || name.starts_with('.')
        || is_temp_file_name(name)
        || is_data_file_name(name)
}

/// The first (by name) of the files of `storage` that are neither hspack's ([`is_ours`]) nor
/// a manifest; `None` where there is none, or `storage` is no local folder (a prefix is listed
/// at a cost, and no shell spreads a dataset into one).
fn first_foreign(storage: &dyn Storage) -> Result<Option<String>> {
    let root = storage.root();
    if crate::io::is_remote(root) || !root.is_dir() {
        return Ok(None);
    }
    Ok((storage.list()?.into_iter())
        .filter(|n| n != MANIFEST_FILE && !is_ours(n))
        .min())
}

/// True when `storage` is a local folder holding nothing but hspack's files ([`is_ours`])
/// besides its manifest: what a writer stopped before its first commit leaves.
pub fn holds_only_ours(storage: &dyn Storage) -> Result<bool> {
    let root = storage.root();
    Ok(!crate::io::is_remote(root) && root.is_dir() && first_foreign(storage)?.is_none())
}

/// Refuses a local folder that holds files, none of them a manifest, of which one at least is
/// not hspack's ([`is_ours`]). A folder that is not there, is empty or holds a dataset passes;
/// so does object storage.
pub fn refuse_foreign_folder(storage: &dyn Storage) -> Result<()> {
    let Some(foreign) = first_foreign(storage)? else {
        return Ok(());
    };
    if storage.read(MANIFEST_FILE)?.is_some() {
        return Ok(());
    }
    Err(Error::NotADataset {
        path: storage.root().to_path_buf(),
        why: format!(
            "it holds other files (such as {foreign}) and no dataset, so the dataset's files \
             would be mixed in with them; give a new or empty folder (a dataset is a folder of \
             its own: name one, e.g. `./NAME`)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_of_other_files_is_refused_and_hspacks_own_files_pass() {
        let t = tempfile::tempdir().unwrap();
        let storage = crate::io::LocalStorage::new(t.path().join("d"));
        // Not there, then empty.
        refuse_foreign_folder(&storage).unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        refuse_foreign_folder(&storage).unwrap();
        for ours in [
            "shard-000000.hsp",
            "manifest.json.tmp",
            "convert-keys.jsonl",
            ".hspack-x",
            ".gitkeep",
        ] {
            std::fs::write(t.path().join("d").join(ours), b"").unwrap();
        }
        refuse_foreign_folder(&storage).unwrap();
        std::fs::write(t.path().join("d/notes.txt"), b"mine").unwrap();
        let e = refuse_foreign_folder(&storage).unwrap_err().to_string();
        assert!(
            e.contains("such as notes.txt") && e.contains("new or empty folder"),
            "{e}"
        );
        // With a manifest it is a dataset, whatever else lies there.
        std::fs::write(t.path().join("d").join(MANIFEST_FILE), b"{}").unwrap();
        refuse_foreign_folder(&storage).unwrap();
    }
}
