//! The whole description of a conversion job ([`ConvertSpec`]), whichever face fills it:
//! `hspack convert`'s flags, a `--mapping` file ([`Mapping`]), or a library caller. The faces
//! only parse; [`ConvertSpec::check`] checks the spec in one place, and resolves it into what
//! the job runs.

mod field;
mod mapping;
#[cfg(test)]
mod tests;

use crate::store::captures::CaptureConfig;
use std::path::PathBuf;
use std::str::FromStr;

use crate::format::{CapturePoint, Codec, QuantizeSpec};
use crate::parallel::jobs_problem;
use crate::write::WriteOptions;

use super::layout::{LayoutOptions, Preset};
use super::prepare::{SplitBy, Trim};
use super::Limits;

pub use field::{parse_point, FieldArg, FieldObject, FieldProblem, Sources};
pub use mapping::Mapping;

/// What to convert and how: every option of `hspack convert`, as serde data.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvertSpec {
    /// Source folder (walked recursively) or file.
    pub src: PathBuf,
    /// Dataset folder, created or resumed.
    pub dst: PathBuf,
    /// The layout of the source files.
    pub layout: Preset,
    /// Fields of the generic layout (`--field`).
    #[serde(default)]
    pub fields: Vec<FieldArg>,
    /// Layer ids of the captured hidden states, in the layout's order (`--layers`).
    #[serde(default)]
    pub layers: Vec<u32>,
    /// Capture points: one for all layers or one per layer (`--point`), as written:
    /// `layer-input`, `layer-output` or `final-norm`.
    #[serde(default)]
    pub points: Vec<String>,
    /// Decoder layers of the model: this id means the final-norm output (`--num-layers`).
    #[serde(default)]
    pub num_layers: Option<u32>,
    /// Model name or path for the capture metadata (`--model`).
    #[serde(default)]
    pub model: Option<String>,
    /// Expected hidden size: files with another are refused (`--hidden-size`).
    #[serde(default)]
    pub hidden_size: Option<u64>,
    /// One field per layer instead of the presets' stacked fields (`--split-layers`).
    #[serde(default)]
    pub split_layers: bool,
    /// Join files into one sample by a pattern with `{key}` and `{part}` (`--group-by`).
    #[serde(default)]
    pub group_by: Option<String>,
    /// Split each file into requests (`--split-by`).
    #[serde(default)]
    pub split_by: Option<SplitBy>,
    /// The file beside each batch holding its split tensor: a name with `{stem}`
    /// (`--split-by-file`).
    #[serde(default)]
    pub split_by_file: Option<String>,
    /// Key each sample by this value stored in its file (`--key-from`).
    #[serde(default)]
    pub key_from: Option<String>,
    /// Drop padding rows (`--trim-padding`).
    #[serde(default)]
    pub trim_padding: Option<Trim>,
    /// Delete each source file once its samples are committed and verified
    /// (`--delete-source`).
    #[serde(default)]
    pub delete_source: bool,
    /// With `delete_source`, delete sources the dataset does not hold exactly too: those
    /// converted with `quantize` or `trim_padding` (`--delete-lossy-source`).
    #[serde(default)]
    pub delete_lossy_source: bool,
    /// List bad files in the report and go on, instead of stopping (`--skip-bad`).
    #[serde(default)]
    pub skip_bad: bool,
    /// Where bad files are listed (`--report`; default `convert-report.jsonl` in `dst`).
    #[serde(default)]
    pub report: Option<PathBuf>,
    /// Decoding threads (`--jobs`; default the cores).
    #[serde(default)]
    pub jobs: Option<usize>,
    /// Largest shard, in MiB (`--shard-mib`).
    #[serde(default = "default_shard_mib")]
    pub shard_mib: u64,
    /// Commit a shard once it holds this many samples (`--shard-samples`).
    #[serde(default = "default_shard_samples")]
    pub shard_samples: u64,
    /// Chunk codec: none, zstd or zstd-bytegroup (`--codec`).
    #[serde(default = "default_codec")]
    pub codec: String,
    /// Fields stored as FP8, lossy (`--quantize`): `fp8` (every hidden-state field) or
    /// `fp8:NAME,NAME`.
    #[serde(default)]
    pub quantize: Option<String>,
    /// fsync at commits; off (`--no-fsync`) for scratch data only.
    #[serde(default = "default_fsync")]
    pub fsync: bool,
    /// The capture the dumps are of (`--capture-config`), for a destination `STORE/NAME`:
    /// samples whose capture the store holds are copied from it without reading their hidden
    /// states, and every sample converted is recorded as that capture, so a later capture
    /// or conversion skips it (FORMAT.md §11.7).
    #[serde(default)]
    pub capture: Option<CaptureConfig>,
    /// Limits for reading source files.
    #[serde(default)]
    pub limits: Limits,
}

fn default_shard_mib() -> u64 {
    2048
}

fn default_shard_samples() -> u64 {
    65_536
}

fn default_codec() -> String {
    "none".into()
}

fn default_fsync() -> bool {
    true
}

/// The largest `--shard-mib` (1 TiB).
pub const MAX_SHARD_MIB: u64 = 1 << 20;

/// Why a spec cannot run. Each names the option at fault ([`SpecError::option`]) and says
/// what it takes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The mapping file cannot be read.
    #[error("{}: cannot read the mapping file: {source}", file.display())]
    MappingUnreadable {
        /// The mapping file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The mapping file is not JSON with the keys of one.
    #[error("{}: not a mapping file: {source}; see the generic layout in the README for its keys", file.display())]
    NotAMapping {
        /// The mapping file.
        file: PathBuf,
        /// Where the JSON is wrong.
        #[source]
        source: serde_json::Error,
    },
    /// The mapping file sets a key whose flag is given too.
    #[error("{}: the mapping file sets `{key}` and so does {flag}: give it in one place", file.display())]
    Twice {
        /// The mapping file.
        file: PathBuf,
        /// The key, as the mapping file and the spec name it.
        key: &'static str,
        /// The flag.
        flag: &'static str,
    },
    /// A capture point that is none of the three.
    #[error("unknown capture point `{value}`: use layer-input, layer-output or final-norm")]
    Point {
        /// What was given.
        value: String,
    },
    /// A field of the generic layout that does not parse or contradicts itself.
    #[error("--field {field}: {problem}")]
    Field {
        /// The field, in `--field` syntax.
        field: String,
        /// What is wrong and what to give.
        problem: FieldProblem,
    },
    /// Fields given for a preset layout.
    #[error("--field (or fields in a --mapping file) needs --layout generic")]
    FieldsNeedGeneric,
    /// A `--split-by` that is neither `lengths:` nor `cu_seqlens:`.
    #[error(
        "--split-by takes lengths:TENSOR or cu_seqlens:TENSOR (TENSOR left out: the bare \
         tensor of a --split-by-file file)"
    )]
    SplitBy {
        /// What was given.
        value: String,
    },
    /// A `--trim-padding` that is neither `mask` nor `ids[:PAD]`.
    #[error("--trim-padding takes mask, ids or ids:PAD")]
    Trim {
        /// What was given.
        value: String,
    },
    /// An unknown codec.
    #[error("unknown codec {name}: use none, zstd or zstd-bytegroup (fp8 is --quantize fp8)")]
    Codec {
        /// What was given.
        name: String,
    },
    /// A `--quantize` that does not parse.
    #[error("--quantize {0}")]
    Quantize(String),
    /// An option that keeps a local file beside the dataset, for a dataset in object storage.
    #[error("{option} keeps a file beside the dataset, which in object storage cannot be appended to: {what}")]
    NeedsLocalFile {
        /// The option.
        option: &'static str,
        /// What to do instead.
        what: &'static str,
    },
    /// Deleting sources the dataset holds only in part or approximately, without saying so.
    #[error(
        "--delete-source with {option} {value}: {why}, so deleting the sources would lose \
         what the dataset does not hold; keep the sources (leave out --delete-source), or add \
         --delete-lossy-source to delete them all the same"
    )]
    DeleteLossy {
        /// The flag that makes the dataset differ from the sources.
        option: &'static str,
        /// Its value.
        value: String,
        /// What the dataset lacks.
        why: &'static str,
    },
    /// A `--jobs` of no thread, or of more than a machine runs.
    #[error("--jobs {value} (`jobs` in a mapping file): {problem}")]
    Jobs {
        /// What was given.
        value: usize,
        /// What to give.
        problem: String,
    },
    /// A number option given as 0, where it takes 1 or more.
    #[error("{flag} 0 (`{key}` in a mapping file): give 1 or more")]
    Zero {
        /// The option on the command line.
        flag: &'static str,
        /// Its key in a mapping file.
        key: &'static str,
    },
    /// A number option beyond what the job can use.
    #[error("{flag} {value} (`{key}` in a mapping file): must be at most {max} ({why})")]
    TooLarge {
        /// The option on the command line (`--jobs`, ...).
        flag: &'static str,
        /// Its key in a mapping file (`jobs`, ...).
        key: &'static str,
        /// What was given.
        value: u64,
        /// The largest accepted.
        max: u64,
        /// Why.
        why: &'static str,
    },
    /// `--delete-lossy-source` without `--delete-source`.
    #[error("--delete-lossy-source goes with --delete-source, which it extends")]
    LossyWithoutDelete,
    /// Deleting sources without fsync.
    #[error("--delete-source needs durable commits: sources are deleted only after their shard is fsynced")]
    DeleteNeedsFsync,
    /// A split file without `--split-by`, or with `--group-by`.
    #[error(
        "a split file beside each batch (--split-by-file) needs --split-by lengths[:TENSOR] \
         or cu_seqlens[:TENSOR], and does not combine with --group-by"
    )]
    SplitFileAlone,
    /// A split-file pattern that is not a file name with `{stem}`.
    #[error(
        "--split-by-file takes a file name with {{stem}}, the batch file's name without its \
         extension, e.g. '{{stem}}.lens.pt'"
    )]
    SplitFileName {
        /// What was given.
        pattern: String,
    },
    /// A group-by pattern that does not name `{key}` and `{part}` once each.
    #[error(
        "--group-by {pattern:?}: a pattern names {{key}} once and {{part}} once (here {{key}}: \
         {keys}, {{part}}: {parts}), {{key}} the sample and {{part}} the file within it, \
         e.g. '{{key}}_{{part}}.pt' or '{{key}}/{{part}}.pt'"
    )]
    GroupBy {
        /// What was given.
        pattern: String,
        /// How many times it names `{key}`.
        keys: usize,
        /// How many times it names `{part}`.
        parts: usize,
    },
}

impl SpecError {
    /// The option at fault, as [`ConvertSpec`] (and a mapping file) names it.
    pub fn option(&self) -> &'static str {
        match self {
            SpecError::MappingUnreadable { .. } | SpecError::NotAMapping { .. } => "mapping",
            SpecError::Twice { key, .. } => key,
            SpecError::Point { .. } => "points",
            SpecError::Field { .. } | SpecError::FieldsNeedGeneric => "fields",
            SpecError::SplitBy { .. } => "split_by",
            SpecError::Trim { .. } => "trim_padding",
            SpecError::Codec { .. } => "codec",
            SpecError::Quantize(_) => "quantize",
            SpecError::DeleteNeedsFsync | SpecError::DeleteLossy { .. } => "delete_source",
            SpecError::LossyWithoutDelete => "delete_lossy_source",
            SpecError::NeedsLocalFile { option, .. } => option,
            SpecError::TooLarge { key, .. } => key,
            SpecError::Jobs { .. } => "jobs",
            SpecError::Zero { key, .. } => key,
            SpecError::SplitFileAlone | SpecError::SplitFileName { .. } => "split_by_file",
            SpecError::GroupBy { .. } => "group_by",
        }
    }
}

impl FromStr for SplitBy {
    type Err = SpecError;

    /// `lengths:TENSOR` or `cu_seqlens:TENSOR` (`TENSOR` may be empty: the bare tensor of a
    /// split file).
    fn from_str(s: &str) -> Result<SplitBy, SpecError> {
        match s.split_once(':').unwrap_or((s, "")) {
            ("lengths", t) => Ok(SplitBy::Lengths(t.into())),
            ("cu_seqlens", t) => Ok(SplitBy::CuSeqlens(t.into())),
            _ => Err(SpecError::SplitBy { value: s.into() }),
        }
    }
}

impl FromStr for Trim {
    type Err = SpecError;

    /// `mask`, `ids` or `ids:PAD`.
    fn from_str(s: &str) -> Result<Trim, SpecError> {
        match s {
            "mask" => Ok(Trim::LossMask),
            "ids" => Ok(Trim::TokenIds { pad: 0 }),
            _ => match s.strip_prefix("ids:").map(str::parse::<i64>) {
                Some(Ok(pad)) => Ok(Trim::TokenIds { pad }),
                _ => Err(SpecError::Trim { value: s.into() }),
            },
        }
    }
}

/// A checked spec, resolved into what the job runs.
#[derive(Debug, Clone)]
pub(crate) struct ConvertOptions {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub preset: Preset,
    /// Layer ids, points, model, the generic layout's fields resolved.
    pub layout: LayoutOptions,
    pub group_by: Option<String>,
    pub split_by: Option<SplitBy>,
    pub split_file: Option<String>,
    pub key_from: Option<String>,
    pub trim: Option<Trim>,
    pub delete_source: bool,
    pub skip_bad: bool,
    pub report_path: Option<PathBuf>,
    pub jobs: usize,
    pub write: WriteOptions,
    /// The fields stored quantized, applied to the schema the layout derives.
    pub quantize: Option<QuantizeSpec>,
    pub capture: Option<CaptureConfig>,
    pub limits: Limits,
}

impl ConvertSpec {
    /// A spec with every option at its default.
    pub fn new(src: impl Into<PathBuf>, dst: impl Into<PathBuf>, layout: Preset) -> ConvertSpec {
        ConvertSpec {
            src: src.into(),
            dst: dst.into(),
            layout,
            fields: Vec::new(),
            layers: Vec::new(),
            points: Vec::new(),
            num_layers: None,
            model: None,
            hidden_size: None,
            split_layers: false,
            group_by: None,
            split_by: None,
            split_by_file: None,
            key_from: None,
            trim_padding: None,
            delete_source: false,
            delete_lossy_source: false,
            skip_bad: false,
            report: None,
            jobs: None,
            shard_mib: default_shard_mib(),
            shard_samples: default_shard_samples(),
            codec: default_codec(),
            quantize: None,
            fsync: default_fsync(),
            capture: None,
            limits: Limits::default(),
        }
    }

    /// Checks the spec: every option alone and the options together. What the source files
    /// must agree with (layer counts, tensor names) is checked on the first file, by the job.
    pub fn check(&self) -> Result<(), SpecError> {
        self.resolve().map(drop)
    }

    /// Refuses thread counts and shard sizes no machine has: a thread per job is started, and
    /// the shard size in bytes must fit in 64 bits.
    fn check_sizes(&self) -> Result<(), SpecError> {
        use crate::format::schema::MAX_FIELDS;
        if self.fields.len() > MAX_FIELDS {
            return Err(SpecError::TooLarge {
                flag: "--field",
                key: "fields",
                value: self.fields.len() as u64,
                max: MAX_FIELDS as u64,
                why: "a dataset's schema holds at most as many fields",
            });
        }
        if let Some((value, problem)) = self.jobs.and_then(|j| Some((j, jobs_problem(j)?))) {
            return Err(SpecError::Jobs { value, problem });
        }
        if self.shard_mib == 0 {
            return Err(SpecError::Zero {
                flag: "--shard-mib",
                key: "shard_mib",
            });
        }
        if self.shard_mib > MAX_SHARD_MIB {
            return Err(SpecError::TooLarge {
                flag: "--shard-mib",
                key: "shard_mib",
                value: self.shard_mib,
                max: MAX_SHARD_MIB,
                why: "a shard of 1 TiB is already more than any reader reads at once",
            });
        }
        Ok(())
    }

    /// Refuses `--delete-source` where the dataset will not hold the sources exactly, unless
    /// `--delete-lossy-source` says to delete them all the same.
    fn check_lossy_delete(&self) -> Result<(), SpecError> {
        if self.delete_lossy_source && !self.delete_source {
            return Err(SpecError::LossyWithoutDelete);
        }
        if !self.delete_source || self.delete_lossy_source {
            return Ok(());
        }
        if let Some(q) = &self.quantize {
            return Err(SpecError::DeleteLossy {
                option: "--quantize",
                value: q.clone(),
                why: "the dataset holds those fields as FP8, an approximation of the source \
                      values",
            });
        }
        if let Some(t) = &self.trim_padding {
            return Err(SpecError::DeleteLossy {
                option: "--trim-padding",
                value: match t {
                    Trim::LossMask => "mask".into(),
                    Trim::TokenIds { pad } => format!("ids:{pad}"),
                },
                why: "the dataset leaves out the rows it trims, which are not always padding \
                      (rows after the last loss-mask row of an unpadded file are tokens)",
            });
        }
        Ok(())
    }

    /// The names the job reads besides the fields' sources: the `--key-from` value and the
    /// `--split-by` tensor.
    fn read_besides(&self) -> Vec<String> {
        let split = self.split_by.as_ref().map(|s| match s {
            SplitBy::Lengths(t) | SplitBy::CuSeqlens(t) => t.clone(),
        });
        self.key_from.iter().cloned().chain(split).collect()
    }

    /// Checks the spec and resolves it: capture points parsed, the generic layout's fields
    /// resolved against them, the writer's options.
    pub(crate) fn resolve(&self) -> Result<ConvertOptions, SpecError> {
        let points = self
            .points
            .iter()
            .map(|p| parse_point(p))
            .collect::<Result<Vec<CapturePoint>, _>>()?;
        if !self.fields.is_empty() && self.layout != Preset::Generic {
            return Err(SpecError::FieldsNeedGeneric);
        }
        let fields = self
            .fields
            .iter()
            .map(|f| f.resolve(&points, self.num_layers))
            .collect::<Result<_, _>>()?;
        let codec = Codec::from_name(&self.codec)
            .filter(|c| Codec::LOSSLESS.contains(c))
            .ok_or_else(|| SpecError::Codec {
                name: self.codec.clone(),
            })?;
        let quantize = self
            .quantize
            .as_deref()
            .map(str::parse::<QuantizeSpec>)
            .transpose()
            .map_err(SpecError::Quantize)?;
        if self.delete_source && !self.fsync {
            return Err(SpecError::DeleteNeedsFsync);
        }
        self.check_sizes()?;
        self.check_lossy_delete()?;
        if crate::io::is_remote(&self.dst) {
            if self.key_from.is_some() {
                return Err(SpecError::NeedsLocalFile {
                    option: "key_from",
                    what: "convert into a folder, then `hspack cp FOLDER URL`",
                });
            }
            if self.skip_bad && self.report.is_none() {
                return Err(SpecError::NeedsLocalFile {
                    option: "skip_bad",
                    what: "name a local file for the list of bad files with --report",
                });
            }
        }
        if self.split_by_file.is_some() && (self.split_by.is_none() || self.group_by.is_some()) {
            return Err(SpecError::SplitFileAlone);
        }
        if let Some(p) = &self.group_by {
            let (keys, parts) = (p.matches("{key}").count(), p.matches("{part}").count());
            if (keys, parts) != (1, 1) {
                return Err(SpecError::GroupBy {
                    pattern: p.clone(),
                    keys,
                    parts,
                });
            }
        }
        if let Some(p) = &self.split_by_file {
            if !p.contains("{stem}") || p.contains('/') {
                return Err(SpecError::SplitFileName { pattern: p.clone() });
            }
        }
        Ok(ConvertOptions {
            src: self.src.clone(),
            dst: self.dst.clone(),
            preset: self.layout,
            layout: LayoutOptions {
                layers: self.layers.clone(),
                points,
                num_layers: self.num_layers,
                model: self.model.clone(),
                hidden_size: self.hidden_size,
                fields,
                split_layers: self.split_layers,
                delete_source: self.delete_source,
                read_besides: self.read_besides(),
            },
            group_by: self.group_by.clone(),
            split_by: self.split_by.clone(),
            split_file: self.split_by_file.clone(),
            key_from: self.key_from.clone(),
            trim: self.trim_padding,
            delete_source: self.delete_source,
            skip_bad: self.skip_bad,
            report_path: self.report.clone(),
            jobs: self
                .jobs
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
            write: WriteOptions {
                shard_bytes: self.shard_mib.max(1) << 20,
                shard_samples: self.shard_samples,
                codec,
                durable: self.fsync,
                ..WriteOptions::default()
            },
            quantize,
            capture: self.capture.clone(),
            limits: self.limits,
        })
    }
}
