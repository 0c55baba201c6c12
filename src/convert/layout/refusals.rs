//! What a unit holds that converting it would lose, refused before anything is written.

use crate::convert::units::in_part;
use crate::convert::TensorInfo;
use crate::format::DType;

use super::{
    find, is_floating, list_tensors, specs_for, FieldSpec, Held, LayoutError, LayoutOptions, Preset,
};

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
    let left = unread(held, read);
    if preset != Preset::Generic {
        // A tensor of a dtype hspack does not store is harmless unless a field reads it, or
        // --delete-source would delete it: it could hold hidden states (uint16 bf16 bits).
        let hidden_like = |l: &Left| {
            l.value.is_none()
                && l.shape.len() >= 2
                && l.dtype.map_or(options.delete_source, is_floating)
        };
        let mut left: Vec<_> = left.collect();
        if let Some(at) = left.iter().position(hidden_like) {
            let l = left.swap_remove(at);
            return Err(LayoutError::LeftOut {
                layout: preset.name(),
                tensor: l.name.clone(),
                what: l.what,
            });
        }
        // With --delete-source, anything else left unread would go with its file too.
        return match left.into_iter().next().filter(|_| options.delete_source) {
            None => Ok(()),
            Some(l) => Err(l.refused()),
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
        Some(l) => Err(l.refused()),
    }
}

/// Something a unit holds that no field reads.
pub(crate) struct Left<'a> {
    /// Its name, as fields name tensors.
    pub name: &'a String,
    /// In words: a tensor's dtype and shape, or what a value is.
    pub what: String,
    /// A tensor's dtype; `None` for a dtype hspack does not store, and for a value.
    pub dtype: Option<DType>,
    /// A tensor's shape; empty for a value.
    pub shape: &'a [u64],
    /// For a value that is not a tensor (a str, a number), which no field can read: what
    /// it is.
    pub value: Option<&'static str>,
}

impl Left<'_> {
    /// The refusal of deleting it with its file (`--delete-source`).
    fn refused(self) -> LayoutError {
        match self.value {
            Some(kind) => LayoutError::UnreadValue {
                name: self.name.clone(),
                kind,
            },
            None => LayoutError::Unread {
                tensor: self.name.clone(),
                what: self.what,
            },
        }
    }
}

/// What `held` holds that `read` does not read: tensors (of a dtype hspack stores or not)
/// and values that are not tensors; a value is read where `read` reads it or a list or dict
/// holding it (`--key-from rids`). Only what is left is described: most tensors are read.
pub(crate) fn unread<'a>(
    held: &'a Held,
    read: impl Fn(&str) -> bool + Copy + 'a,
) -> impl Iterator<Item = Left<'a>> + 'a {
    let tensors = held
        .tensors
        .iter()
        .filter(move |t| !read(&t.name))
        .map(|t| Left {
            name: &t.name,
            what: format!("{} {:?}", t.dtype, t.shape),
            dtype: Some(t.dtype),
            shape: &t.shape,
            value: None,
        });
    let unsupported = held.unsupported.iter().filter(move |u| !read(&u.name));
    let unsupported = unsupported.map(|u| Left {
        name: &u.name,
        what: format!("{}, a dtype hspack does not store, {:?}", u.dtype, u.shape),
        dtype: None,
        shape: &u.shape,
        value: None,
    });
    let within_read =
        move |name: &str| read(name) || name.match_indices('.').any(|(at, _)| read(&name[..at]));
    let values = held.values.iter().filter(move |v| !within_read(&v.name));
    let values = values.map(|v| Left {
        name: &v.name,
        what: format!("{}, not a tensor", v.kind),
        dtype: None,
        shape: &[],
        value: Some(v.kind),
    });
    tensors.chain(unsupported).chain(values)
}
