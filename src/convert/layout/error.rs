//! Why a layout cannot map a source, and the words its errors use: tensors listed, the
//! closest name to a missing one, the command-line name of a capture point.

use crate::convert::TensorInfo;
use crate::format::CapturePoint;

use super::shape::drop_leading_ones;
use super::Preset;

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
    /// With `--delete-source`, a unit holds a tensor nothing reads: it would be deleted with
    /// its file.
    #[error(
        "tensor `{tensor}` ({what}) is read by no field (nor --key-from or --split-by), so \
         --delete-source would delete it with its file; map it with --field NAME={tensor} \
         under --layout generic (see `hspack convert --help`), or leave out --delete-source \
         and delete the files yourself once the dataset holds what you need"
    )]
    Unread {
        /// The tensor nothing reads.
        tensor: String,
        /// Its dtype and shape.
        what: String,
    },
    /// With `--delete-source`, a unit holds a value that is not a tensor (a str, a number),
    /// which no field can read: it would be deleted with its file.
    #[error(
        "`{name}` ({kind}) is not a tensor, and a dataset keeps tensors only, so \
         --delete-source would delete it with its file; if it names the sample (a str or an \
         int), key the samples by it (--key-from {name}); else leave out --delete-source, or \
         take `{name}` out of the files if it is not needed"
    )]
    UnreadValue {
        /// Its path in the file.
        name: String,
        /// What it is, in words.
        kind: &'static str,
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
            | LayoutError::UnreadValue { name: tensor, .. }
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
