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

mod error;
mod refusals;
mod roles;
mod shape;

use crate::format::{CaptureInfo, CapturePoint, DType, Field, Role, Schema};

use super::layouts;
use super::{TensorInfo, UnsupportedInfo, ValueInfo};

/// The start of the capture `tool` of a dataset convert made: `hspack convert --layout NAME`.
pub const CONVERT_TOOL: &str = "hspack convert";

pub(crate) use error::missing_tensor;
pub use error::{list_tensors, point_name, LayoutError};
pub(crate) use refusals::unread;
pub use refusals::{refuse_left_out, refuse_unconverted};
pub use roles::{hidden_roles, layer_fits};
use shape::resolve_stack;
pub use shape::{field_bytes, field_part, field_shape, Part};

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
    /// The values that hold data but are not tensors, named likewise.
    pub values: Vec<ValueInfo>,
    /// The parts of a group of files; empty for a unit of one file.
    pub parts: Vec<String>,
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

/// Whether `d` is a floating-point dtype (any that is not an integer or bool, so that one
/// added later counts as floating).
pub(super) fn is_floating(d: DType) -> bool {
    !matches!(
        d,
        DType::Bool | DType::U8 | DType::I8 | DType::I16 | DType::I32 | DType::I64
    )
}

/// Finds a tensor by name.
pub fn find<'a>(tensors: &'a [TensorInfo], name: &str) -> Option<&'a TensorInfo> {
    tensors.iter().find(|t| t.name == name)
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
    let is_hidden =
        |f: &Field| matches!(f.role, Role::HiddenState { .. } | Role::HiddenStates { .. });
    let hidden = fields.iter().find(|f| is_hidden(f));
    refuse_repeated_layers(specs)?;
    refuse_other_widths(
        fields
            .iter()
            .zip(specs)
            .filter(|(f, _)| is_hidden(f))
            .collect(),
    )?;
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
                tool: format!("{CONVERT_TOOL} --layout {}", preset.name()),
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

/// Refuses a stacked field naming a layer id twice (`--layers 2,2,2,61`): its layers would be
/// labelled as one, whatever the tensor holds.
fn refuse_repeated_layers(specs: &[FieldSpec]) -> Result<(), LayoutError> {
    for spec in specs {
        if let Role::HiddenStates { layers, .. } = &spec.role {
            let mut seen = std::collections::HashSet::new();
            if let Some(id) = layers.iter().find(|&&id| !seen.insert(id)) {
                return Err(LayoutError::BadOption(format!(
                    "field `{}` names layer {id} more than once ({}): each layer it stacks is \
                     another layer id; give each once",
                    spec.name,
                    layers
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                )));
            }
        }
    }
    Ok(())
}

/// Refuses hidden-state fields of different widths: the hidden states of one model share its
/// hidden size. Where a field concatenates layers on its last dim, this is what tells a
/// `layers=` list of the wrong length, which reads the same bytes as layers of another width
/// (`[T, 96]` named with 2 ids is 2 layers of 48, where 3 of 32 were stored): such a field is
/// measured against one whose width is read as it is, where there is one.
fn refuse_other_widths(hidden: Vec<(&Field, &FieldSpec)>) -> Result<(), LayoutError> {
    let width = |f: &Field| f.shape.last().copied().unwrap_or(1);
    let concatenated = |s: &FieldSpec| s.is_stacked() && s.stack == Stack::Concat;
    let Some(&(first, _)) = hidden
        .iter()
        .find(|(_, s)| !concatenated(s))
        .or(hidden.first())
    else {
        return Ok(());
    };
    let want = width(first);
    for &(f, spec) in &hidden {
        let got = width(f);
        if got == want {
            continue;
        }
        let k = spec.layer_count();
        let fits = if concatenated(spec) && (k * got).is_multiple_of(want) {
            format!(
                "; its last dim, {}, holds {} layers of {want}: name as many in its `layers=`",
                k * got,
                k * got / want
            )
        } else {
            String::new()
        };
        return Err(LayoutError::Shape {
            tensor: spec.source.clone(),
            got: format!(
                "hidden states {got} wide in field `{}`{}",
                f.name,
                if spec.is_stacked() {
                    format!(" ({k} layers)")
                } else {
                    String::new()
                }
            ),
            expected: format!(
                "{want} wide, as field `{}` holds them: the hidden states of one model share \
                 its hidden size{fits}",
                first.name
            ),
        });
    }
    Ok(())
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
mod tests;
