//! Layouts: how the tensors of a source file (or of a group of files) become the fields of a
//! sample.
//!
//! A layout is a list of [`FieldSpec`]s: each names an output field, the source tensor it comes
//! from (by its flattened name, see [`super::SourceFile::tensors`]), an optional [`Op`] that
//! takes part of that tensor, and the field's [`Role`]. The presets in [`super::layouts`] build
//! such lists for the dump layouts in the wild; `--layout generic` takes them from the user.
//!
//! Rows: after the op, leading dimensions of size 1 are dropped until a token-id or loss-mask
//! tensor has one dimension and a hidden state two (`[1, T, H]` → `[T, H]`); other fields drop
//! leading ones while they have more than one dimension. The first remaining dimension is the
//! token dimension; the rest is the row shape of the field.
//!
//! Stacked fields ([`Role::HiddenStates`], k layers, row shape `[k, H]`) come from one tensor
//! `[.., T, k·H]` (the layers concatenated on the last dim, [`Stack::Concat`]) or
//! `[.., T, k, H]` ([`Stack::Axis`]), whose bytes are the field's bytes as they are, or from k
//! tensors `[.., T, H]` of one layer each ([`Stack::Sources`]), interleaved per token.
//!
//! Bytes are never converted: every field keeps the source dtype, so what is stored is bitwise
//! what `torch.load` returns.

use std::borrow::Cow;

use crate::format::{eagle3, CaptureInfo, CapturePoint, DType, Field, Role, Schema};

use super::layouts;
use super::units::in_part;
use super::{TensorInfo, UnsupportedInfo};

/// A part of a source tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The whole tensor.
    Whole,
    /// Part `index` of `of` equal parts along `axis` (negative counts from the end): splits a
    /// concatenation such as `[T, 3H]` into layers.
    Part {
        /// Which part, from 0.
        index: u64,
        /// How many parts.
        of: u64,
        /// Axis.
        axis: i64,
    },
    /// Entry `index` along `axis`, which is removed: unstacks `[T, L, H]` into layers.
    Index {
        /// Which entry, from 0.
        index: u64,
        /// Axis.
        axis: i64,
    },
    /// Entries `start..start + len` along `axis`, which is kept: the first layers of
    /// `[T, L, H]`.
    Range {
        /// First entry.
        start: u64,
        /// Entries.
        len: u64,
        /// Axis.
        axis: i64,
    },
}

/// How a stacked field ([`Role::HiddenStates`]) lays its k layers out in the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stack {
    /// `[.., T, k·H]`: the layers concatenated on the last dim; stored as `[T, k, H]` without
    /// a copy.
    Concat,
    /// `[.., T, k, H]`: a layer axis before the hidden dim; stored as it is.
    Axis,
    /// Axis or concat, whichever the first file's tensor fits; refused when it fits both
    /// (`[1, k, k·H]`), which only `stack=` can tell apart.
    Auto,
    /// `source` then these tensors, each `[.., T, H]` of one layer, interleaved per token.
    Sources(Vec<String>),
}

/// One output field: where its bytes come from and what it means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSpec {
    /// Output field name.
    pub name: String,
    /// Flattened name of the source tensor.
    pub source: String,
    /// Which part of the source tensor.
    pub op: Op,
    /// Meaning of the field.
    pub role: Role,
    /// Leave the field out of the schema when the first file lacks the source tensor.
    pub optional: bool,
    /// For a stacked field, where its layers are in the source.
    pub stack: Stack,
}

impl FieldSpec {
    /// A whole-tensor field.
    pub fn new(name: impl Into<String>, source: impl Into<String>, role: Role) -> Self {
        FieldSpec {
            name: name.into(),
            source: source.into(),
            op: Op::Whole,
            role,
            optional: false,
            stack: Stack::Auto,
        }
    }

    /// This spec stacking layers laid out as `stack`.
    pub fn stacked(mut self, stack: Stack) -> Self {
        self.stack = stack;
        self
    }

    /// Every source tensor: `source`, then the further stacked sources.
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        let more: &[String] = match &self.stack {
            Stack::Sources(s) if self.is_stacked() => s,
            _ => &[],
        };
        std::iter::once(self.source.as_str()).chain(more.iter().map(String::as_str))
    }

    /// Whether the field stacks layers.
    pub fn is_stacked(&self) -> bool {
        matches!(self.role, Role::HiddenStates { .. })
    }

    /// Whether the field gathers several source tensors.
    pub fn is_multi_source(&self) -> bool {
        self.is_stacked() && matches!(&self.stack, Stack::Sources(s) if !s.is_empty())
    }

    fn layer_count(&self) -> u64 {
        match &self.role {
            Role::HiddenStates { layers, .. } => layers.len() as u64,
            _ => 1,
        }
    }

    /// This spec with `op`.
    pub fn with_op(mut self, op: Op) -> Self {
        self.op = op;
        self
    }

    /// This spec, left out when the source tensor is absent from the first file.
    pub fn optional(mut self) -> Self {
        self.optional = true;
        self
    }

    fn target_dims(&self) -> usize {
        match self.role {
            Role::TokenIds | Role::LossMask => 1,
            Role::HiddenState { .. } => 2,
            Role::HiddenStates { .. } => 3,
            _ => 1,
        }
    }
}

/// The dump layouts hspack knows, and the generic mapping. In JSON, by [`Preset::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Preset {
    /// SpecForge offline data: `rows_*/data_N.ckpt[.gz]`.
    SpecForge,
    /// EAGLE (1/2) `ge_data`: `*/data_N.ckpt`.
    Eagle,
    /// NVIDIA ModelOpt `collect_hidden_states`: `{conversation_id}.pt`.
    ModelOpt,
    /// vLLM speculators: `hidden_states [T, n_layers, H]`, `token_ids`.
    Speculators,
    /// Fields given by the user ([`LayoutOptions::fields`]).
    Generic,
}

impl Preset {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Preset::SpecForge => "specforge",
            Preset::Eagle => "eagle",
            Preset::ModelOpt => "modelopt",
            Preset::Speculators => "speculators",
            Preset::Generic => "generic",
        }
    }

    /// Whether a file name (relative path) is a source file of this layout.
    pub fn accepts(self, name: &str) -> bool {
        let (extensions, gzipped) = self.extensions();
        let base = match name.strip_suffix(".gz") {
            Some(base) if gzipped => base,
            Some(_) => return false,
            None => name,
        };
        extensions.iter().any(|x| base.ends_with(x))
    }

    /// The extensions of the files the preset reads, and whether it reads them gzipped too
    /// (`NAME.gz`).
    pub fn extensions(self) -> (&'static [&'static str], bool) {
        match self {
            Preset::SpecForge => (&[".ckpt"], true),
            Preset::Eagle => (&[".ckpt"], false),
            Preset::ModelOpt => (&[".pt"], false),
            Preset::Speculators => (&[".pt", ".pth", ".safetensors"], true),
            Preset::Generic => (
                &[".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".npy"],
                true,
            ),
        }
    }

    /// The files the preset reads, in words: `*.ckpt or *.ckpt.gz`.
    pub fn file_names(self) -> String {
        let (extensions, gzipped) = self.extensions();
        let mut names: Vec<String> = extensions.iter().map(|x| format!("*{x}")).collect();
        if gzipped {
            names.extend(extensions.iter().map(|x| format!("*{x}.gz")));
        }
        names.join(", ")
    }
}

/// What the user says about the capture, where the files don't.
#[derive(Debug, Clone, Default)]
pub struct LayoutOptions {
    /// Layer ids of the captured hidden states, in the order the layout lists them.
    pub layers: Vec<u32>,
    /// Capture point of each layer, or one for all; empty for the preset's default.
    pub points: Vec<CapturePoint>,
    /// Decoder layers of the model; an id equal to it defaults to the final-norm output.
    pub num_layers: Option<u32>,
    /// Model name for the capture metadata.
    pub model: Option<String>,
    /// Expected hidden size; files with another are refused.
    pub hidden_size: Option<u64>,
    /// Fields of the generic layout.
    pub fields: Vec<FieldSpec>,
    /// One field per layer (`hidden.{l}`) instead of the presets' stacked fields.
    pub split_layers: bool,
    /// Sources are deleted once converted (`--delete-source`): under the generic layout, a
    /// unit holding a tensor nothing reads is refused ([`refuse_left_out`]).
    pub delete_source: bool,
    /// What is read besides the fields' sources: the `--key-from` value and the `--split-by`
    /// tensor, by their names.
    pub read_besides: Vec<String>,
}

/// What a unit's files hold, as the checks for what no field reads see it.
#[derive(Debug, Clone, Default)]
pub struct Held {
    /// Every tensor hspack reads, named as fields name them (`PART.NAME` in a group).
    pub tensors: Vec<TensorInfo>,
    /// The tensors of a dtype hspack does not store, named likewise.
    pub unsupported: Vec<UnsupportedInfo>,
    /// The parts of a group of files; empty for a unit of one file.
    pub parts: Vec<String>,
}

/// Why a layout cannot map the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// A tensor the layout needs is absent.
    #[error("the {layout} layout needs tensor `{tensor}`, the file has: {have}; {next}")]
    MissingTensor {
        /// Layout name.
        layout: &'static str,
        /// Tensor name.
        tensor: String,
        /// Tensors the file has.
        have: String,
        /// What to do: the name the file has that is closest, another layout.
        next: String,
    },
    /// A preset reads only some tensors of the files, and one it leaves out looks like hidden
    /// states: the files are likely another layout's, and converting (then `--delete-source`)
    /// would lose it.
    #[error(
        "the {layout} layout does not convert tensor `{tensor}` ({what}) of these files, which \
         looks like hidden states: they are likely another layout's, and converting them with \
         this one (and --delete-source) would lose it; choose the --layout that reads it \
         (`hspack convert --help` lists what each reads), or name every field to keep with \
         --layout generic --field"
    )]
    LeftOut {
        /// Layout name.
        layout: &'static str,
        /// The tensor left out.
        tensor: String,
        /// Its dtype and shape.
        what: String,
    },
    /// Under the generic layout with `--delete-source`, a unit holds a tensor nothing reads: it
    /// would be deleted with its file.
    #[error(
        "tensor `{tensor}` ({what}) is read by no --field (nor --key-from or --split-by), so \
         --delete-source would delete it with its file; map it with --field NAME={tensor} (see \
         `hspack convert --help`), or leave out --delete-source and delete the files yourself \
         once the dataset holds what you need"
    )]
    Unread {
        /// The tensor nothing reads.
        tensor: String,
        /// Its dtype and shape.
        what: String,
    },
    /// Under the generic layout with `--delete-source`, a file of a group nothing is read
    /// from: it would be deleted unread.
    #[error(
        "nothing of this file (part `{part}` of the group, holding {have}) is read by a \
         --field (nor --key-from or --split-by), so --delete-source would delete it unread; \
         map what it holds with --field NAME={part}.TENSOR (NAME={part} for a bare tensor), \
         or leave out --delete-source"
    )]
    UnreadPart {
        /// The part.
        part: String,
        /// What the file holds, in words.
        have: String,
    },
    /// A stacked field's single source reads both as its layers on an axis and as its layers
    /// concatenated, in the first file converted: its shape cannot tell which.
    #[error(
        "field `{field}`: tensor `{tensor}` {shape:?} reads two ways as {k} layers: {} \
         (stack=axis) or {} (stack=concat); say which with --field \
         {field}={tensor}:layers=...:stack=axis or :stack=concat",
        stack_reading(shape, *k, 3),
        stack_reading(shape, *k, 2)
    )]
    AmbiguousStack {
        /// The field.
        field: String,
        /// Its source tensor.
        tensor: String,
        /// The tensor's shape in the first file.
        shape: Vec<u64>,
        /// Layers.
        k: u64,
    },
    /// A file holds a tensor that the fields made from the first file converted do not read:
    /// the first file had no such tensor (the layout reads it into `field`), or this file is
    /// another tool's.
    #[error(
        "this file holds tensor `{tensor}` ({what}){}, but the fields made from the first \
         file converted do not read it (that file had no such tensor, or this one is another \
         tool's), so converting this file (with --delete-source) would lose it; convert the \
         files with `{tensor}` and those without into separate datasets",
        field.as_ref().map_or_else(String::new, |f| format!(", which the {layout} layout reads into field `{f}`"))
    )]
    NotInSchema {
        /// Layout name.
        layout: &'static str,
        /// The tensor.
        tensor: String,
        /// Its dtype and shape.
        what: String,
        /// The field the layout reads it into, where it could tell.
        field: Option<String>,
    },
    /// The layer ids are not given or do not match the data.
    #[error("{detail}")]
    Layers {
        /// What to give.
        detail: String,
    },
    /// A tensor's shape does not fit the layout or the schema.
    #[error("tensor `{tensor}` has {got}, expected {expected}")]
    Shape {
        /// Tensor name.
        tensor: String,
        /// What was found.
        got: String,
        /// What was expected.
        expected: String,
    },
    /// A preset would label the last layer id the final-norm output, but nothing says that id
    /// is the final norm: `--num-layers` is absent or names another id.
    #[error("{}", final_norm_message(layout, *id, *num_layers, layers, points))]
    FinalNormId {
        /// Layout name.
        layout: String,
        /// The last id of `--layers`.
        id: u32,
        /// `--num-layers`, when given.
        num_layers: Option<u32>,
        /// `--layers` ending with `num_layers` instead of `id` (comma-separated).
        layers: String,
        /// `--point` naming every layer's point, the last as a layer output (comma-separated).
        points: String,
    },
    /// A `--field` or other option does not parse or contradicts another.
    #[error("{0}")]
    BadOption(String),
}

impl LayoutError {
    /// The tensor (or, for [`LayoutError::UnreadPart`], the part) the error is about, where
    /// it names one: it tells which file of a group is at fault.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            LayoutError::MissingTensor { tensor, .. }
            | LayoutError::LeftOut { tensor, .. }
            | LayoutError::NotInSchema { tensor, .. }
            | LayoutError::Unread { tensor, .. }
            | LayoutError::AmbiguousStack { tensor, .. }
            | LayoutError::Shape { tensor, .. } => Some(tensor),
            LayoutError::UnreadPart { part, .. } => Some(part),
            _ => None,
        }
    }
}

fn final_norm_message(
    layout: &str,
    id: u32,
    num_layers: Option<u32>,
    layers: &str,
    points: &str,
) -> String {
    let convention = "(layer ids follow HF hidden_states[i]: id i is the input of layer i, id \
                      --num-layers the final-norm output)";
    match num_layers {
        Some(n) => format!(
            "the {layout} layout takes the last state, layer {id}, as the final-norm output, but \
             with --num-layers {n} the final-norm output is id {n} {convention}: if the last \
             state is the final-norm output, give --layers {layers}; if it is what layer {id} \
             gave before the norm, give --point {points}"
        ),
        None => format!(
            "the {layout} layout takes the last state, layer {id}, as the final-norm output, but \
             --num-layers is not given, so nothing says the model has {id} layers {convention} \
             and `hspack info` would show \"unknown (0 layers)\": give --num-layers {id} (the \
             model's decoder layers, kept in the capture metadata) if the last state is the \
             final-norm output, or give --point {points} to say where it was captured instead"
        ),
    }
}

/// A stacked source of `shape` read as `k` layers, in words: `dims` 3 for the layers on an
/// axis (`[.., T, k, H]`), 2 for them concatenated (`[.., T, k·H]`).
fn stack_reading(shape: &[u64], k: u64, dims: usize) -> String {
    let mut s = shape.to_vec();
    drop_leading_ones(&mut s, dims);
    match s[..] {
        [t, _, h] if dims == 3 => format!("[T={t}, {k} layers, H={h}]"),
        [t, kh] if dims == 2 => format!("[T={t}, {k} layers, H={}]", kh / k.max(1)),
        _ => format!("{s:?}"),
    }
}

/// The command-line name of a capture point.
pub fn point_name(p: CapturePoint) -> &'static str {
    match p {
        CapturePoint::LayerInput => "layer-input",
        CapturePoint::LayerOutput => "layer-output",
        _ => "final-norm",
    }
}

/// The error for tensor `tensor` that `preset` needs and the file (holding `tensors`) lacks:
/// it names the tensor of the file whose name is closest, and what to do.
pub(crate) fn missing_tensor(
    layout: &'static str,
    tensor: String,
    tensors: &[TensorInfo],
) -> LayoutError {
    let closest = tensors
        .iter()
        .filter(|t| !t.name.is_empty())
        .map(|t| (edit_distance(&t.name, &tensor), &t.name))
        .filter(|(d, name)| *d <= 2.max(name.len().min(tensor.len()) / 3))
        .min();
    let mean = closest.map(|(_, name)| format!("did you mean `{name}`? "));
    let next = match layout == Preset::Generic.name() {
        true => "name a tensor the file has in --field (or --mapping)",
        false => "choose another --layout or map fields with --layout generic --field",
    };
    LayoutError::MissingTensor {
        layout,
        have: list_tensors(tensors),
        next: format!("{}{next}", mean.unwrap_or_default()),
        tensor,
    }
}

/// Levenshtein distance of `a` and `b` (by character).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Lists tensors for messages.
pub fn list_tensors(tensors: &[TensorInfo]) -> String {
    if tensors.is_empty() {
        return "no tensors".into();
    }
    tensors
        .iter()
        .map(|t| match t.name.is_empty() {
            // A file holding one tensor, not a dict of them (`torch.save(tensor)`).
            true => format!(
                "a bare tensor (not a dict of named ones) {} {:?}",
                t.dtype, t.shape
            ),
            false => format!("`{}` {} {:?}", t.name, t.dtype, t.shape),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The field specs of `preset` for a file holding `tensors`.
pub fn specs_for(
    preset: Preset,
    tensors: &[TensorInfo],
    options: &LayoutOptions,
) -> Result<Vec<FieldSpec>, LayoutError> {
    let specs = match preset {
        Preset::SpecForge => layouts::specforge::specs(tensors, options)?,
        Preset::Eagle => layouts::eagle::specs(tensors, options)?,
        Preset::ModelOpt => layouts::modelopt::specs(tensors, options)?,
        Preset::Speculators => layouts::speculators::specs(tensors, options)?,
        Preset::Generic => layouts::generic::specs(tensors, options)?,
    };
    let mut kept = Vec::with_capacity(specs.len());
    for mut s in specs {
        let missing = s
            .sources()
            .find(|src| !tensors.iter().any(|t| t.name == *src))
            .map(str::to_string);
        match missing {
            None => {
                if let Some(t) = find(tensors, &s.source) {
                    resolve_stack(&mut s, &t.shape)?;
                }
                kept.push(s);
            }
            Some(_) if s.optional => {}
            Some(tensor) => return Err(missing_tensor(preset.name(), tensor, tensors)),
        }
    }
    Ok(kept)
}

/// Refuses a unit whose tensors `preset` would convert into fields other than `specs`, those
/// made from the first unit: a tensor an optional field reads that the first lacked, or
/// what [`refuse_left_out`] refuses.
pub fn refuse_unconverted(
    preset: Preset,
    specs: &[FieldSpec],
    held: &Held,
    options: &LayoutOptions,
) -> Result<(), LayoutError> {
    let tensors = &held.tensors;
    let what = |name: &str| {
        find(tensors, name).map_or_else(String::new, |t| format!("{} {:?}", t.dtype, t.shape))
    };
    // What this file lacks is refused field by field, as a missing tensor; what the layout
    // cannot make of it (other --layers) is named below by the tensor it would lose. The
    // generic layout reads what it is told.
    if preset != Preset::Generic {
        if let Ok(own) = specs_for(preset, tensors, options) {
            if let Some(o) = own.iter().find(|o| !specs.iter().any(|s| s.name == o.name)) {
                return Err(LayoutError::NotInSchema {
                    layout: preset.name(),
                    tensor: o.source.clone(),
                    what: what(&o.source),
                    field: Some(o.name.clone()),
                });
            }
        }
    }
    match refuse_left_out(preset, specs, held, options) {
        Err(LayoutError::LeftOut { tensor, what, .. }) => Err(LayoutError::NotInSchema {
            layout: preset.name(),
            tensor,
            what,
            field: None,
        }),
        other => other,
    }
}

/// Refuses what a unit holds that converting it with `specs` would lose. A preset knows
/// every tensor its tool writes, so one it does not read that looks like hidden states (two
/// or more dimensions, of a floating dtype, or of one hspack does not store with
/// `--delete-source`) means another tool's files. Under
/// the generic layout, which reads what it is told, only `--delete-source` loses what is not
/// read: any tensor no field (nor `--key-from`, `--split-by`) reads, and a file of a group
/// nothing is read from, are refused then.
pub fn refuse_left_out(
    preset: Preset,
    specs: &[FieldSpec],
    held: &Held,
    options: &LayoutOptions,
) -> Result<(), LayoutError> {
    let read = |name: &str| {
        specs.iter().any(|s| s.sources().any(|src| src == name))
            || options.read_besides.iter().any(|r| r == name)
    };
    // Only what no field reads is described (a string each): most tensors are read.
    let left = held
        .tensors
        .iter()
        .filter(|t| !read(&t.name))
        .map(|t| {
            (
                &t.name,
                format!("{} {:?}", t.dtype, t.shape),
                Some(t.dtype),
                &t.shape,
            )
        })
        .chain(held.unsupported.iter().filter(|u| !read(&u.name)).map(|u| {
            let what = format!("{}, a dtype hspack does not store, {:?}", u.dtype, u.shape);
            (&u.name, what, None, &u.shape)
        }));
    if preset != Preset::Generic {
        // A tensor of a dtype hspack does not store is harmless unless a field reads it, or
        // --delete-source would delete it: it could hold hidden states (uint16 bf16 bits).
        let hidden_like = |dtype: Option<DType>, shape: &[u64]| {
            shape.len() >= 2 && dtype.map_or(options.delete_source, is_floating)
        };
        return match left
            .into_iter()
            .find(|(_, _, d, shape)| hidden_like(*d, shape))
        {
            None => Ok(()),
            Some((tensor, what, ..)) => Err(LayoutError::LeftOut {
                layout: preset.name(),
                tensor: tensor.clone(),
                what,
            }),
        };
    }
    if !options.delete_source {
        return Ok(());
    }
    let names = specs
        .iter()
        .flat_map(|s| s.sources())
        .chain(options.read_besides.iter().map(String::as_str));
    let names: Vec<&str> = names.collect();
    for part in &held.parts {
        if !names.iter().any(|n| in_part(part, n).is_some()) {
            let of_part: Vec<TensorInfo> = held
                .tensors
                .iter()
                .filter(|t| in_part(part, &t.name).is_some())
                .cloned()
                .collect();
            return Err(LayoutError::UnreadPart {
                part: part.clone(),
                have: list_tensors(&of_part),
            });
        }
    }
    match left.into_iter().next() {
        None => Ok(()),
        Some((tensor, what, ..)) => Err(LayoutError::Unread {
            tensor: tensor.clone(),
            what,
        }),
    }
}

/// Whether `d` is a floating-point dtype (any that is not an integer or bool, so that one
/// added later counts as floating).
fn is_floating(d: DType) -> bool {
    !matches!(
        d,
        DType::Bool | DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64
    )
}

/// Drops leading dimensions of 1 from `shape` while it has more than `keep`.
fn drop_leading_ones(shape: &mut Vec<u64>, keep: usize) {
    let extra = shape.len().saturating_sub(keep);
    let ones = shape.iter().take(extra).take_while(|&&d| d == 1).count();
    shape.drain(..ones);
}

/// Finds a tensor by name.
pub fn find<'a>(tensors: &'a [TensorInfo], name: &str) -> Option<&'a TensorInfo> {
    tensors.iter().find(|t| t.name == name)
}

/// Hidden-state roles and names for `count` captured states: ids from `--layers`, points from
/// `--point`, else `defaults[i]` (`None`: the preset cannot know, so `--point` is required).
pub fn hidden_roles(
    layout: &str,
    count: usize,
    what: &str,
    options: &LayoutOptions,
    defaults: &[Option<CapturePoint>],
) -> Result<Vec<(String, Role)>, LayoutError> {
    if options.layers.len() != count {
        return Err(LayoutError::Layers {
            detail: format!(
                "the {layout} layout holds {count} hidden states ({what}) but the files do not say \
                 which layers they are: give --layers with {count} comma-separated layer ids in \
                 that order (got {}), e.g. --layers {}",
                options.layers.len(),
                (0..count).map(|i| (i * 10 + 2).to_string()).collect::<Vec<_>>().join(",")
            ),
        });
    }
    let points: Vec<CapturePoint> = match options.points.len() {
        0 => {
            let mut out = Vec::with_capacity(count);
            for (i, &id) in options.layers.iter().enumerate() {
                let point = if options.num_layers == Some(id) {
                    Some(CapturePoint::FinalNorm)
                } else {
                    match defaults.get(i).copied().flatten() {
                        Some(CapturePoint::FinalNorm) => {
                            return Err(final_norm_id(layout, i, options, defaults))
                        }
                        p => p,
                    }
                };
                out.push(point.ok_or_else(|| LayoutError::Layers {
                    detail: format!(
                        "the {layout} layout does not say where layer {id} was captured: give \
                         --point layer-input|layer-output|final-norm (one for all layers, or one \
                         per layer)"
                    ),
                })?);
            }
            out
        }
        1 => vec![options.points[0]; count],
        n if n == count => options.points.clone(),
        n => {
            return Err(LayoutError::Layers {
                detail: format!("--point has {n} entries; give one, or one per layer ({count})"),
            })
        }
    };
    if let Some(n) = options.num_layers {
        for (&id, &point) in options.layers.iter().zip(&points) {
            // Ids 0..n are layers (their input or output); n is the final norm's output.
            let fits = match point {
                CapturePoint::FinalNorm => true,
                _ => id < n,
            };
            if !fits {
                return Err(LayoutError::Layers {
                    detail: format!(
                        "--layers {id} with --point {}: a model of --num-layers {n} has layers \
                         0 to {}, and id {n} is its final-norm output; give --point final-norm \
                         for it (or leave --point out), or the layer id it was taken at",
                        point_name(point),
                        n.saturating_sub(1)
                    ),
                });
            }
        }
    }
    Ok(options
        .layers
        .iter()
        .zip(points)
        .map(|(&layer, point)| {
            (
                eagle3::hidden_field(layer),
                Role::HiddenState { layer, point },
            )
        })
        .collect())
}

/// The error for a preset whose default labels layer `options.layers[i]` the final-norm
/// output when `--num-layers` does not say so; it names the flags that would.
fn final_norm_id(
    layout: &str,
    i: usize,
    options: &LayoutOptions,
    defaults: &[Option<CapturePoint>],
) -> LayoutError {
    let id = options.layers[i];
    let join = |v: Vec<String>| v.join(",");
    let layers = join(
        options
            .layers
            .iter()
            .enumerate()
            .map(|(j, &l)| match (j == i, options.num_layers) {
                (true, Some(n)) => n.to_string(),
                _ => l.to_string(),
            })
            .collect(),
    );
    let points = join(
        (0..options.layers.len())
            .map(|j| match defaults.get(j).copied().flatten() {
                _ if j == i => point_name(CapturePoint::LayerOutput).to_string(),
                Some(p) => point_name(p).to_string(),
                None => "layer-input".to_string(),
            })
            .collect(),
    );
    LayoutError::FinalNormId {
        layout: layout.to_string(),
        id,
        num_layers: options.num_layers,
        layers,
        points,
    }
}

/// Normalizes a possibly negative axis for `ndim` dimensions.
fn axis_of(axis: i64, ndim: usize, tensor: &str) -> Result<usize, LayoutError> {
    let a = if axis < 0 { axis + ndim as i64 } else { axis };
    if a < 0 || a >= ndim as i64 {
        return Err(LayoutError::Shape {
            tensor: tensor.into(),
            got: format!("{ndim} dimensions"),
            expected: format!("an axis {axis}"),
        });
    }
    Ok(a as usize)
}

/// The slab an op takes: (axis, start, len along it, whether the axis is dropped).
fn slab(
    op: Op,
    shape: &[u64],
    tensor: &str,
) -> Result<Option<(usize, u64, u64, bool)>, LayoutError> {
    match op {
        Op::Whole => Ok(None),
        Op::Part { index, of, axis } => {
            let a = axis_of(axis, shape.len(), tensor)?;
            if of == 0 || index >= of || !shape[a].is_multiple_of(of) {
                return Err(LayoutError::Shape {
                    tensor: tensor.into(),
                    got: format!("shape {shape:?}"),
                    expected: format!("axis {axis} divisible into {of} parts (part {index})"),
                });
            }
            let len = shape[a] / of;
            Ok(Some((a, index * len, len, false)))
        }
        Op::Index { index, axis } => {
            let a = axis_of(axis, shape.len(), tensor)?;
            if index >= shape[a] {
                return Err(LayoutError::Shape {
                    tensor: tensor.into(),
                    got: format!("shape {shape:?}"),
                    expected: format!("more than {index} entries along axis {axis}"),
                });
            }
            Ok(Some((a, index, 1, true)))
        }
        Op::Range { start, len, axis } => {
            let a = axis_of(axis, shape.len(), tensor)?;
            if len == 0 || start.checked_add(len).is_none_or(|end| end > shape[a]) {
                return Err(LayoutError::Shape {
                    tensor: tensor.into(),
                    got: format!("shape {shape:?}"),
                    expected: format!("entries {start}..{} along axis {axis}", start + len),
                });
            }
            Ok(Some((a, start, len, false)))
        }
    }
}

/// Shape of the field's tensor after the op and the row squeeze: `[tokens, row...]`. For a
/// field stacking several sources, `shape` is one source's and the result the field's.
pub fn field_shape(spec: &FieldSpec, shape: &[u64]) -> Result<Vec<u64>, LayoutError> {
    let mut s = shape.to_vec();
    if let Some((a, _, len, drop)) = slab(spec.op, shape, &spec.source)? {
        if drop {
            s.remove(a);
        } else {
            s[a] = len;
        }
    }
    let bad = |expected: String| LayoutError::Shape {
        tensor: spec.source.clone(),
        got: format!("shape {shape:?}"),
        expected,
    };
    if spec.is_stacked() {
        let k = spec.layer_count();
        let (dims, what) = match &spec.stack {
            Stack::Axis => (
                3,
                format!("[.., T, {k}, H] ({k} layers on the second-last axis)"),
            ),
            Stack::Sources(more) if !more.is_empty() => (2, "[.., T, H] (one layer)".into()),
            _ => (
                2,
                format!("[.., T, {k}·H] ({k} layers concatenated on the last dim)"),
            ),
        };
        drop_leading_ones(&mut s, dims);
        let ok = s.len() == dims
            && match &spec.stack {
                Stack::Axis => s[1] == k,
                Stack::Sources(more) if !more.is_empty() => {
                    more.len() as u64 + 1 == k && {
                        s.insert(1, k);
                        true
                    }
                }
                _ => {
                    s[1].is_multiple_of(k) && {
                        let h = s[1] / k;
                        s[1] = k;
                        s.push(h);
                        true
                    }
                }
            };
        if !ok {
            return Err(bad(format!("{what} for field `{}`", spec.name)));
        }
        return Ok(s);
    }
    let target = spec.target_dims();
    drop_leading_ones(&mut s, target);
    if s.is_empty() || s.len() != target && !matches!(spec.role, Role::Other) {
        return Err(bad(format!(
            "{target} dimension(s) after dropping leading ones for field `{}`",
            spec.name
        )));
    }
    Ok(s)
}

/// Resolves [`Stack::Auto`] from the first file's tensor of `shape`; refuses a shape that
/// both readings fit (`[1, T, k·H]` with T = k), which only `stack=` can tell apart.
fn resolve_stack(spec: &mut FieldSpec, shape: &[u64]) -> Result<(), LayoutError> {
    if !spec.is_stacked() || spec.stack != Stack::Auto {
        return Ok(());
    }
    let read_as = |stack: Stack| {
        let mut s = spec.clone();
        s.stack = stack;
        field_shape(&s, shape).ok()
    };
    spec.stack = match (read_as(Stack::Axis), read_as(Stack::Concat)) {
        (Some(_), Some(_)) => {
            return Err(LayoutError::AmbiguousStack {
                field: spec.name.clone(),
                tensor: spec.source.clone(),
                shape: shape.to_vec(),
                k: spec.layer_count(),
            });
        }
        (Some(_), None) => Stack::Axis,
        _ => Stack::Concat,
    };
    Ok(())
}

/// Where a field's bytes lie in its source tensor's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// One contiguous range.
    Range(std::ops::Range<usize>),
    /// `outer` runs of `len` bytes, `stride` apart, the first at `start`.
    Strided {
        /// Runs.
        outer: usize,
        /// Bytes between runs.
        stride: usize,
        /// Offset of the first run.
        start: usize,
        /// Bytes of a run.
        len: usize,
    },
}

impl Part {
    /// Bytes of the field.
    pub fn len(&self) -> usize {
        match self {
            Part::Range(r) => r.len(),
            Part::Strided { outer, len, .. } => outer * len,
        }
    }

    /// True when the field is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the field's bytes from `src` into `dst` (of [`Part::len`] bytes).
    pub fn gather(&self, src: &[u8], dst: &mut [u8]) {
        match self {
            Part::Range(r) => dst.copy_from_slice(&src[r.clone()]),
            Part::Strided {
                stride, start, len, ..
            } => {
                for (o, out) in dst.chunks_exact_mut(*len).enumerate() {
                    let from = start + o * stride;
                    out.copy_from_slice(&src[from..from + len]);
                }
            }
        }
    }
}

/// Where the field lies in a source tensor of `shape` with elements of `elem` bytes.
pub fn field_part(spec: &FieldSpec, shape: &[u64], elem: usize) -> Result<Part, LayoutError> {
    let total = shape.iter().product::<u64>() as usize * elem;
    let Some((a, start, len, _)) = slab(spec.op, shape, &spec.source)? else {
        return Ok(Part::Range(0..total));
    };
    let outer = shape[..a].iter().product::<u64>() as usize;
    let inner = shape[a + 1..].iter().product::<u64>() as usize * elem;
    let (dim, start, len) = (shape[a] as usize, start as usize, len as usize);
    if outer == 1 {
        return Ok(Part::Range(start * inner..(start + len) * inner));
    }
    Ok(Part::Strided {
        outer,
        stride: dim * inner,
        start: start * inner,
        len: len * inner,
    })
}

/// The bytes of the field: the op applied to `bytes` (C order, `shape`, elements of `elem`
/// bytes). Borrowed when the part is contiguous.
pub fn field_bytes<'a>(
    spec: &FieldSpec,
    shape: &[u64],
    elem: usize,
    bytes: Cow<'a, [u8]>,
) -> Result<Cow<'a, [u8]>, LayoutError> {
    Ok(match (field_part(spec, shape, elem)?, bytes) {
        (Part::Range(r), Cow::Borrowed(b)) => Cow::Borrowed(&b[r]),
        (Part::Range(r), Cow::Owned(b)) if r.len() == b.len() => Cow::Owned(b),
        (part, b) => {
            let mut out = vec![0; part.len()];
            part.gather(&b, &mut out);
            Cow::Owned(out)
        }
    })
}

/// The schema of the specs for a file holding `tensors`, with capture metadata naming the tool.
pub fn derive_schema(
    preset: Preset,
    specs: &[FieldSpec],
    tensors: &[TensorInfo],
    options: &LayoutOptions,
) -> Result<Schema, LayoutError> {
    let mut fields = Vec::with_capacity(specs.len());
    for spec in specs {
        let t = find(tensors, &spec.source)
            .ok_or_else(|| missing_tensor(preset.name(), spec.source.clone(), tensors))?;
        let shape = field_shape(spec, &t.shape)?;
        for other in spec.sources().skip(1) {
            let o = find(tensors, other)
                .ok_or_else(|| missing_tensor(preset.name(), other.to_string(), tensors))?;
            check_stacked_source(spec, other, t.dtype, &shape, o.dtype, &o.shape)?;
        }
        fields.push(Field::new(
            &spec.name,
            t.dtype,
            &shape[1..],
            spec.role.clone(),
        ));
    }
    let hidden = fields
        .iter()
        .find(|f| matches!(f.role, Role::HiddenState { .. } | Role::HiddenStates { .. }));
    let capture = match hidden {
        Some(h) => {
            let size = h.shape.last().copied().unwrap_or(1);
            if let Some(want) = options.hidden_size {
                if want != size {
                    return Err(LayoutError::Shape {
                        tensor: h.name.clone(),
                        got: format!("hidden size {size}"),
                        expected: format!("--hidden-size {want}"),
                    });
                }
            }
            Some(CaptureInfo {
                model: options.model.clone().unwrap_or_else(|| "unknown".into()),
                revision: None,
                config_hash: None,
                num_layers: options.num_layers.unwrap_or(0),
                hidden_size: size,
                dtype: h.dtype,
                tp_size: 1,
                tool: format!("hspack convert --layout {}", preset.name()),
                tool_version: env!("CARGO_PKG_VERSION").into(),
            })
        }
        None => None,
    };
    let schema = Schema { fields, capture };
    schema
        .validate()
        .map_err(|e| LayoutError::BadOption(format!("the derived schema is invalid: {e}")))?;
    Ok(schema)
}

/// Checks that `other`, a further source of a stacked field, matches the first source's dtype
/// and its field shape `want` (`[T, k, H]`).
pub fn check_stacked_source(
    spec: &FieldSpec,
    other: &str,
    dtype: DType,
    want: &[u64],
    other_dtype: DType,
    other_shape: &[u64],
) -> Result<(), LayoutError> {
    let got = field_shape(spec, other_shape).ok();
    if other_dtype != dtype || got.as_deref() != Some(want) {
        return Err(LayoutError::Shape {
            tensor: other.to_string(),
            got: format!("{other_dtype} {other_shape:?}"),
            expected: format!(
                "{dtype} [T, {}] like `{}`: field `{}` stacks them",
                want.last().copied().unwrap_or(0),
                spec.source,
                spec.name
            ),
        });
    }
    Ok(())
}

/// Checks a file's tensor against the schema's field: same dtype and row shape.
pub fn check_field(
    field: &Field,
    spec: &FieldSpec,
    dtype: DType,
    shape: &[u64],
) -> Result<u64, LayoutError> {
    let s = field_shape(spec, shape)?;
    if dtype != field.dtype || s[1..] != field.shape[..] {
        return Err(LayoutError::Shape {
            tensor: spec.source.clone(),
            got: format!("{dtype} {shape:?}"),
            expected: format!(
                "{} rows of {:?} as in the first file (field `{}`)",
                field.dtype, field.shape, field.name
            ),
        });
    }
    Ok(s[0])
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
