//! Capture keys (FORMAT.md §11.7): which stored sample is the capture of which tokens under
//! which capture config, so a capture run copies what the store already has instead of
//! running the model on it.
//!
//! A capture key is the BLAKE3 of the config and the token ids. After a commit, the writer
//! records `(capture key, sample digest, ordinal)` for the samples it wrote into
//! `captures/<id>.capt`, a sorted, checksummed file naming the dataset. A later run looks its
//! keys up in every capture file and reuses a sample only when the dataset still holds, at
//! that ordinal, a sample whose bytes hash to the recorded digest: a capture file is a hint,
//! never trusted for the bytes themselves.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::format::manifest::hex;
use crate::format::{FormatError, Role, Schema};
use crate::read::{Dataset, Tensor};
use crate::write::DatasetWriter;

use super::pack::{invalid, magic, u64_at, version};
use super::snapshot::is_dataset_name;
use super::Store;

/// The folder of a store holding the capture files.
pub const CAPTURES_DIR: &str = "captures";
const MAGIC: &[u8; 8] = b"HSPKCAPT";
const VERSION: u16 = 1;
const HEADER: usize = 160;
const ENTRY: usize = 72;
const KEY_CONTEXT: &str = "hspack 2026 capture key v1";
const DIGEST_CONTEXT: &str = "hspack 2026 sample digest v1";

/// What makes two captures of the same tokens the same capture. Every part is a string in
/// the key (FORMAT.md §11.7).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureConfig {
    /// The model (path or hub id).
    pub model: String,
    /// Its revision, when known.
    #[serde(default)]
    pub revision: Option<String>,
    /// The hash of its config, when known.
    #[serde(default)]
    pub config_hash: Option<String>,
    /// The engine that ran it (`transformers`, `sglang`, ...).
    pub engine: String,
    /// True when the engine ran in a mode whose rows do not depend on the batch.
    pub deterministic: bool,
    /// The dtype of the captured states (`bf16`, ...).
    pub dtype: String,
    /// The captured layer ids, in order.
    pub layers: Vec<i64>,
    /// The dataset's field names, in schema order. Empty in a config given to `hspack
    /// convert`: the converted dataset's ([`CaptureConfig::for_schema`]).
    #[serde(default)]
    pub fields: Vec<String>,
}

impl CaptureConfig {
    /// This config for samples of a dataset of `schema`: its field names filled in where
    /// none are given. Refused when it names other fields (its keys would never be a capture
    /// of that dataset's samples) or when the schema holds no token ids to key by.
    pub fn for_schema(mut self, schema: &Schema) -> std::result::Result<Self, String> {
        let names: Vec<String> = schema.fields.iter().map(|f| f.name.clone()).collect();
        if self.fields.is_empty() {
            self.fields = names;
        } else if self.fields != names {
            return Err(format!(
                "the capture config names fields [{}], the dataset has [{}]: give the dataset's, or leave `fields` out",
                self.fields.join(", "),
                names.join(", ")
            ));
        }
        if !schema.fields.iter().any(|f| f.role == Role::TokenIds) {
            return Err(
                "a capture is keyed by its token ids, and the dataset has no token-id field".into(),
            );
        }
        Ok(self)
    }

    /// The capture key of a sample given by its fields as a dataset of `schema` stores them
    /// (by name): its token ids and, where the schema has one, its loss mask, read from the
    /// fields whose roles say so ([`CaptureConfig::key`]). `None` when a field is missing or
    /// its values are not integers.
    pub fn key_of(&self, schema: &Schema, fields: &[(&str, &[u8])]) -> Option<[u8; 32]> {
        let ints = |role: Role| -> Option<Option<Vec<i64>>> {
            let Some(f) = schema.fields.iter().find(|f| f.role == role) else {
                return Some(None);
            };
            let (_, bytes) = fields.iter().find(|(n, _)| *n == f.name)?;
            f.dtype.ints(bytes).map(Some)
        };
        let tokens = ints(Role::TokenIds)??;
        let mask = ints(Role::LossMask)?;
        Some(self.key(&tokens, mask.as_deref()))
    }

    /// The capture key of `tokens` under this config, with the sample's loss mask where the
    /// dataset stores one (a reused sample brings its stored fields, the mask among them).
    pub fn key(&self, tokens: &[i64], loss_mask: Option<&[i64]>) -> [u8; 32] {
        let join = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        let parts = [
            self.model.clone(),
            self.revision.clone().unwrap_or_default(),
            self.config_hash.clone().unwrap_or_default(),
            self.engine.clone(),
            (if self.deterministic { "1" } else { "0" }).to_string(),
            self.dtype.clone(),
            join(&self.layers),
            self.fields.join(","),
        ];
        let mut h = blake3::Hasher::new_derive_key(KEY_CONTEXT);
        for p in &parts {
            h.update(&(p.len() as u32).to_le_bytes());
            h.update(p.as_bytes());
        }
        h.update(&(tokens.len() as u64).to_le_bytes());
        for t in tokens {
            h.update(&t.to_le_bytes());
        }
        let mask = loss_mask.unwrap_or_default();
        h.update(&(mask.len() as u64).to_le_bytes());
        for m in mask {
            h.update(&m.to_le_bytes());
        }
        *h.finalize().as_bytes()
    }
}

/// The digest of a sample: its fields in schema order, each as its name and its bytes.
pub fn sample_digest<'a>(fields: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(DIGEST_CONTEXT);
    for (name, bytes) in fields {
        h.update(&(name.len() as u32).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&(bytes.len() as u64).to_le_bytes());
        crate::parallel::blake3_update(&mut h, bytes);
    }
    *h.finalize().as_bytes()
}

/// The digest ([`sample_digest`]) of a sample appended with `fields` (by name, any order) to a
/// dataset of `schema`, as its readers will see it: a quantized field as it decodes, not as
/// it was given. Fields the schema lacks are left out (the append refuses them).
pub fn written_digest(schema: &crate::format::Schema, fields: &[(&str, &[u8])]) -> [u8; 32] {
    use crate::format::{Codec, Elements};
    let decoded: Vec<(&str, std::borrow::Cow<[u8]>)> = schema
        .fields
        .iter()
        .filter_map(|f| {
            let (_, bytes) = fields.iter().find(|(n, _)| *n == f.name)?;
            let bytes = match f.quantized {
                None => std::borrow::Cow::Borrowed(*bytes),
                Some(_) => {
                    let el = Elements::of(f);
                    let stored = Codec::Fp8.encode(bytes, el, 0).ok()?;
                    std::borrow::Cow::Owned(
                        Codec::Fp8.decode(&stored, bytes.len() as u64, el).ok()?,
                    )
                }
            };
            Some((f.name.as_str(), bytes))
        })
        .collect();
    sample_digest(decoded.iter().map(|(n, b)| (*n, b.as_ref())))
}

/// One line of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureEntry {
    /// The capture key.
    pub key: [u8; 32],
    /// The sample's digest.
    pub digest: [u8; 32],
    /// The sample's ordinal in the dataset.
    pub ordinal: u64,
}

/// A capture file, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureFile {
    /// The dataset the entries are samples of.
    pub dataset: String,
    /// The entries, sorted by key, each key once.
    pub entries: Vec<CaptureEntry>,
}

impl CaptureFile {
    /// The file's bytes and its name (`<first 16 bytes of its BLAKE3, hex>.capt`); entries
    /// are sorted and a key given twice keeps its lowest ordinal.
    pub fn encode(&self) -> (String, Vec<u8>) {
        let mut entries = self.entries.clone();
        entries.sort_by(|a, b| a.key.cmp(&b.key).then(a.ordinal.cmp(&b.ordinal)));
        entries.dedup_by(|b, a| a.key == b.key);
        let mut out = Vec::with_capacity(HEADER + ENTRY * entries.len() + 32);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&(self.dataset.len() as u32).to_le_bytes());
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        let mut name = [0u8; 128];
        name[..self.dataset.len()].copy_from_slice(self.dataset.as_bytes());
        out.extend_from_slice(&name);
        for e in &entries {
            out.extend_from_slice(&e.key);
            out.extend_from_slice(&e.digest);
            out.extend_from_slice(&e.ordinal.to_le_bytes());
        }
        let hash = blake3::hash(&out);
        out.extend_from_slice(hash.as_bytes());
        (capture_file_name(hash.as_bytes()), out)
    }

    /// Parses and checks a capture file: magic, version, reserved bytes, the dataset name,
    /// the length, the trailing BLAKE3, and keys in strictly increasing order.
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        const S: &str = "capture file";
        if b.len() < HEADER + 32 {
            return Err(FormatError::Truncated {
                structure: S,
                needed: (HEADER + 32) as u64,
                available: b.len() as u64,
            });
        }
        magic(&b[..8], MAGIC, S)?;
        version(u16::from_le_bytes([b[8], b[9]]), VERSION, S)?;
        let name_len = u32::from_le_bytes(b[12..16].try_into().expect("4")) as usize;
        let n = u64_at(b, 16);
        if b[10..12].iter().chain(&b[24..32]).any(|&x| x != 0) {
            return Err(FormatError::ReservedNotZero {
                structure: S,
                offset: 10,
            });
        }
        let expected = n
            .checked_mul(ENTRY as u64)
            .and_then(|e| e.checked_add((HEADER + 32) as u64));
        if expected != Some(b.len() as u64) {
            return Err(invalid(
                S,
                "file length",
                b.len() as u64,
                "160 + 72 × entries + 32",
            ));
        }
        let body = b.len() - 32;
        if blake3::hash(&b[..body]).as_bytes() != &b[body..] {
            return Err(FormatError::Json {
                structure: S,
                detail: "its bytes do not hash to its trailing BLAKE3: the file is damaged".into(),
            });
        }
        let name_field = &b[32..HEADER];
        let dataset = (name_len <= 128)
            .then(|| std::str::from_utf8(&name_field[..name_len]).ok())
            .flatten()
            .filter(|n| is_dataset_name(n) && name_field[name_len..].iter().all(|&x| x == 0))
            .ok_or_else(|| {
                invalid(
                    S,
                    "dataset name length",
                    name_len as u64,
                    "a dataset name, zero-padded to 128 bytes",
                )
            })?
            .to_string();
        let entries: Vec<CaptureEntry> = b[HEADER..body]
            .chunks_exact(ENTRY)
            .map(|e| CaptureEntry {
                key: e[..32].try_into().expect("32"),
                digest: e[32..64].try_into().expect("32"),
                ordinal: u64_at(e, 64),
            })
            .collect();
        if let Some(i) = entries.windows(2).position(|w| w[0].key >= w[1].key) {
            return Err(invalid(
                S,
                "entry",
                i as u64 + 1,
                "sorted by key, each key once",
            ));
        }
        Ok(CaptureFile { dataset, entries })
    }

    /// The entry of `key`.
    pub fn find(&self, key: &[u8; 32]) -> Option<&CaptureEntry> {
        self.entries
            .binary_search_by(|e| e.key.cmp(key))
            .ok()
            .map(|i| &self.entries[i])
    }
}

/// The name of the capture file whose BLAKE3 is `hash`.
pub fn capture_file_name(hash: &[u8; 32]) -> String {
    format!("{}.capt", hex(&hash[..16]))
}

/// True for a capture file's name.
pub fn is_capture_file_name(name: &str) -> bool {
    name.strip_suffix(".capt")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|c| c.is_ascii_hexdigit()))
}

/// A stored sample a capture key names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureHit {
    /// The dataset holding it.
    pub dataset: String,
    /// Its ordinal there.
    pub ordinal: u64,
    /// The digest its bytes must have.
    pub digest: [u8; 32],
}

/// What [`reuse_captured`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReuseStats {
    /// Samples copied from the store.
    pub reused: u64,
    /// Keys found whose sample is gone or changed (the dataset was removed or replaced).
    pub stale: u64,
}

impl Store {
    /// The names of the capture files, sorted (none in a store without the folder).
    pub fn capture_names(&self) -> Result<Vec<String>> {
        if !self.is_remote() && !self.root().join(CAPTURES_DIR).is_dir() {
            return Ok(Vec::new());
        }
        let mut names: Vec<String> = self
            .captures()
            .list()?
            .into_iter()
            .filter(|n| is_capture_file_name(n))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Every capture file that decodes, by file name. One that does not (damaged, or of a
    /// newer version) is passed over: capture files are hints, and `store verify` names it.
    pub fn capture_files(&self) -> Result<Vec<(String, CaptureFile)>> {
        let storage = self.captures();
        let mut files = Vec::new();
        for name in self.capture_names()? {
            // None: removed by a collection since the listing.
            if let Some(bytes) = storage.read(&name)? {
                if let Ok(f) = CaptureFile::decode(&bytes) {
                    files.push((name, f));
                }
            }
        }
        Ok(files)
    }

    /// For each key, a stored sample recorded for it (`None` where there is none). A hit is
    /// a hint: [`reuse_captured`] checks the sample's bytes against the digest.
    pub fn find_captures(&self, keys: &[[u8; 32]]) -> Result<Vec<Option<CaptureHit>>> {
        let files = self.capture_files()?;
        let names = self.names()?;
        let files: Vec<&CaptureFile> = files
            .iter()
            .map(|(_, f)| f)
            .filter(|f| names.binary_search(&f.dataset).is_ok())
            .collect();
        Ok(keys
            .iter()
            .map(|k| {
                files.iter().find_map(|f| {
                    f.find(k).map(|e| CaptureHit {
                        dataset: f.dataset.clone(),
                        ordinal: e.ordinal,
                        digest: e.digest,
                    })
                })
            })
            .collect())
    }

    /// Records that the samples `(capture key, digest, sample key)` of dataset `name` are
    /// those captures: looks up each sample key's ordinal (the samples must be committed) and
    /// publishes one capture file. Returns its name, or `None` when `records` is empty.
    pub fn record_captures(
        self: &Arc<Self>,
        name: &str,
        records: &[([u8; 32], [u8; 32], String)],
    ) -> Result<Option<String>> {
        if records.is_empty() {
            return Ok(None);
        }
        let ds = Dataset::open_in(Arc::new(self.dataset(name)?), Default::default())?;
        let entries = records
            .iter()
            .map(|(key, digest, sample)| {
                let s = ds.get_by_key(sample)?;
                Ok(CaptureEntry {
                    key: *key,
                    digest: *digest,
                    ordinal: s.ordinal(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let file = CaptureFile {
            dataset: name.to_string(),
            entries,
        };
        let (file_name, bytes) = file.encode();
        let storage = self.captures();
        storage.create_root()?;
        if storage.read(&file_name)?.is_none() {
            storage.put_new(&file_name, &bytes, true)?;
        }
        Ok(Some(file_name))
    }
}

/// For each `(sample key, capture key)`, copies the stored capture into `writer` under the
/// sample key when the store holds one whose bytes still hash to the recorded digest. Returns
/// the digest of each sample copied (`None` where it was not: capture it), and counts.
pub fn reuse_captured(
    store: &Arc<Store>,
    writer: &mut DatasetWriter,
    items: &[(String, [u8; 32])],
) -> Result<(Vec<Option<[u8; 32]>>, ReuseStats)> {
    // Every sample key checked before any sample is appended: a refusal part way left the
    // samples before it appended, and the caller, given an error, could not tell which.
    let mut given = std::collections::HashSet::new();
    for (key, _) in items {
        if writer.contains_key(key) {
            return Err(crate::Error::DuplicateKey { key: key.clone() });
        }
        if !given.insert(key.as_str()) {
            return Err(crate::Error::BadSample {
                key: key.clone(),
                field: String::new(),
                detail: "given twice in the samples to reuse: keys are unique; nothing was \
                         appended"
                    .into(),
            });
        }
    }
    let keys: Vec<[u8; 32]> = items.iter().map(|(_, k)| *k).collect();
    let hits = store.find_captures(&keys)?;
    let mut open: HashMap<String, Option<Dataset>> = HashMap::new();
    let mut stats = ReuseStats::default();
    let mut out = Vec::with_capacity(items.len());
    for ((sample_key, _), hit) in items.iter().zip(hits) {
        let Some(hit) = hit else {
            out.push(None);
            continue;
        };
        if !open.contains_key(&hit.dataset) {
            // A dataset whose file does not decode (damage `store verify` names) lends
            // nothing: its samples are captured anew.
            let ds = match store.snapshot(&hit.dataset) {
                Ok(Some(_)) => Some(Dataset::open_in(
                    Arc::new(store.dataset(&hit.dataset)?),
                    Default::default(),
                )?),
                Ok(None) | Err(crate::Error::Format { .. }) => None,
                Err(e) => return Err(e),
            };
            open.insert(hit.dataset.clone(), ds);
        }
        let Some(ds) = open[&hit.dataset]
            .as_ref()
            .filter(|d| hit.ordinal < d.len())
        else {
            stats.stale += 1;
            out.push(None);
            continue;
        };
        if !stores_as_exactly(ds.schema(), writer.schema()) {
            // Values read back approximately, or bytes of another dtype, must not become
            // another dataset's values: a sample is reused only by a dataset that stores its
            // fields alike.
            out.push(None);
            continue;
        }
        let tensors = sample_tensors(ds, hit.ordinal)?;
        let fields: Vec<(&str, &[u8])> = tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.bytes()))
            .collect();
        if sample_digest(fields.iter().copied()) != hit.digest {
            stats.stale += 1;
            out.push(None);
            continue;
        }
        writer.append(sample_key, &fields)?;
        stats.reused += 1;
        // What the writer's dataset gives back: the stored sample quantized, where the
        // writer quantizes what the stored dataset holds exactly.
        out.push(Some(written_digest(writer.schema(), &fields)));
    }
    Ok((out, stats))
}

/// True when every field of `to` is in `from` with its dtype and row shape, stored exactly or
/// quantized as `to` quantizes it: a sample of `from` is then a sample `to` may hold (bytes of
/// another dtype of the same width would pass every length check, and mean other values).
fn stores_as_exactly(from: &crate::format::Schema, to: &crate::format::Schema) -> bool {
    to.fields.iter().all(|f| {
        from.fields
            .iter()
            .find(|g| g.name == f.name)
            .is_some_and(|g| {
                g.dtype == f.dtype
                    && g.shape == f.shape
                    && (g.quantized.is_none() || g.quantized == f.quantized)
            })
    })
}

/// Every field of sample `ordinal` of `ds`, in schema order, as [`sample_digest`] takes them.
pub fn sample_tensors(ds: &Dataset, ordinal: u64) -> Result<Vec<(String, Tensor)>> {
    let sample = ds.sample(ordinal)?;
    ds.schema()
        .fields
        .iter()
        .enumerate()
        .map(|(f, field)| Ok((field.name.clone(), sample.read_field(f, None)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> CaptureConfig {
        CaptureConfig {
            model: "m".into(),
            revision: None,
            config_hash: Some("abc".into()),
            engine: "transformers".into(),
            deterministic: true,
            dtype: "bf16".into(),
            layers: vec![2, 30],
            fields: vec!["input_ids".into(), "hidden_state".into()],
        }
    }

    #[test]
    fn keys_change_with_every_part_of_the_config_and_the_tokens() {
        let base = config();
        let k = base.key(&[1, 2, 3], None);
        assert_eq!(k, config().key(&[1, 2, 3], None));
        assert_ne!(k, base.key(&[1, 2], None));
        assert_ne!(k, base.key(&[1, 2, 4], None));
        assert_ne!(k, base.key(&[1, 2, 3], Some(&[0, 1, 1])));
        assert_ne!(
            base.key(&[1, 2, 3], Some(&[1, 1, 1])),
            base.key(&[1, 2, 3], Some(&[0, 1, 1]))
        );
        let variants: Vec<CaptureConfig> = vec![
            CaptureConfig {
                model: "n".into(),
                ..config()
            },
            CaptureConfig {
                revision: Some("r".into()),
                ..config()
            },
            CaptureConfig {
                config_hash: None,
                ..config()
            },
            CaptureConfig {
                engine: "sglang".into(),
                ..config()
            },
            CaptureConfig {
                deterministic: false,
                ..config()
            },
            CaptureConfig {
                dtype: "f16".into(),
                ..config()
            },
            CaptureConfig {
                layers: vec![2, 31],
                ..config()
            },
            CaptureConfig {
                fields: vec!["input_ids".into()],
                ..config()
            },
        ];
        for v in variants {
            assert_ne!(v.key(&[1, 2, 3], None), k, "{v:?}");
        }
    }

    #[test]
    fn a_capture_file_round_trips_and_refuses_damage() {
        let e = |b: u8, o| CaptureEntry {
            key: [b; 32],
            digest: [b ^ 0xff; 32],
            ordinal: o,
        };
        let f = CaptureFile {
            dataset: "run-1".into(),
            entries: vec![e(3, 7), e(1, 4), e(3, 2)],
        };
        let (name, bytes) = f.encode();
        assert!(is_capture_file_name(&name));
        let back = CaptureFile::decode(&bytes).unwrap();
        assert_eq!(back.dataset, "run-1");
        assert_eq!(back.entries, vec![e(1, 4), e(3, 2)]);
        assert_eq!(back.find(&[3; 32]).unwrap().ordinal, 2);
        assert!(back.find(&[2; 32]).is_none());
        for at in [0, 9, 12, 20, 40, HEADER + 5, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(CaptureFile::decode(&bad).is_err(), "flip at {at}");
        }
        assert!(CaptureFile::decode(&bytes[..bytes.len() - 1]).is_err());
    }
}
