//! Why a unit (a source file, or a group of files) cannot be converted: typed, naming the file
//! at fault, so that the report lists it apart from the message.

use std::path::{Path, PathBuf};

use crate::format::DType;

use super::keys::KeyError;
use super::layout::LayoutError;
use super::units::Inputs;
use super::ConvertError;

/// Why a unit (a source file, or a group of files) cannot be converted: the unit is bad, and
/// is listed in the report with `--skip-bad`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UnitError {
    /// A file could not be read, or lacks a tensor.
    #[error(transparent)]
    Source(#[from] ConvertError),
    /// The stored key (`--key-from`) cannot be read.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The tensors do not fit the fields.
    #[error("{}: {problem}", file.display())]
    Unit {
        /// The unit's first file.
        file: PathBuf,
        /// What is wrong.
        problem: Box<UnitProblem>,
    },
    /// The split file beside a batch (`--split-by-file`) is missing or does not split it.
    #[error("{}: split file {} of this batch: {error}; each batch needs its split file (--split-by-file)", file.display(), split.display())]
    SplitFile {
        /// The batch's file.
        file: PathBuf,
        /// The split file.
        split: PathBuf,
        /// What is wrong with it.
        error: Box<SplitError>,
    },
}

/// What is wrong with a unit's tensors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UnitProblem {
    /// A tensor does not fit its field (shape, dtype, part).
    #[error("{0}")]
    Layout(#[from] LayoutError),
    /// One of the tensors a stacked field takes a layer from does not fit it.
    #[error("{error} (tensor `{tensor}`)")]
    Layer {
        /// The tensor.
        tensor: String,
        /// Why.
        error: LayoutError,
    },
    /// Fields of one unit with different token counts.
    #[error(
        "field `{field}` (tensor `{tensor}`) has {rows} tokens, earlier fields have {earlier}"
    )]
    Tokens {
        /// The field.
        field: String,
        /// Its tensor.
        tensor: String,
        /// Its tokens.
        rows: u64,
        /// The earlier fields' tokens.
        earlier: u64,
    },
    /// The tensors a stacked field takes its layers from, with different token counts.
    #[error("tensor `{tensor}` has {rows} tokens, `{first}` has {first_rows}: field `{field}` stacks them")]
    LayerTokens {
        /// The tensor.
        tensor: String,
        /// Its tokens.
        rows: u64,
        /// The field's first tensor.
        first: String,
        /// Its tokens.
        first_rows: u64,
        /// The field.
        field: String,
    },
    /// The split tensor does not split the unit.
    #[error("{0}")]
    Split(SplitError),
    /// A value of a field stored as fp8 that FP8 cannot hold.
    #[error("field `{field}` (tensor `{tensor}`) holds {value} at token {row}, element {elem}, and a field stored as fp8 (--quantize) holds finite values only: fix the dump, or leave the field out of --quantize")]
    NotFinite {
        /// The field.
        field: String,
        /// Its tensor.
        tensor: String,
        /// The token (row) of the unit.
        row: u64,
        /// The element of the row.
        elem: u64,
        /// The value.
        value: f32,
    },
    /// Token ids (or a loss mask) that are no integers, with `--capture-config`.
    #[error("a capture key (--capture-config) is made of integer token ids and loss mask, and fields [{}] are not integers", fields.join(", "))]
    CaptureKey {
        /// The fields read for the key.
        fields: Vec<String>,
    },
    /// Fields other than the dataset's, into which the run appends (files of another kind,
    /// or flags other than the earlier runs').
    #[error("its fields are not the dataset's: {difference}")]
    NotTheDatasets {
        /// What differs, in words.
        difference: String,
    },
    /// `--trim-padding` without the field it reads.
    #[error("--trim-padding needs a loss mask or token id field in the layout")]
    TrimNeedsField,
    /// `--trim-padding` that would leave a sample no token: it would be stored empty.
    #[error(
        "--trim-padding leaves sample `{key}` no token ({why}); a sample without tokens is none \
         to train on: convert this file without --trim-padding, or leave it out (--skip-bad \
         lists it)"
    )]
    TrimLeftNothing {
        /// The sample's key.
        key: String,
        /// Why, in words: the mask all zero, or every id the pad id.
        why: String,
    },
    /// `--trim-padding ids` over token ids that are no integers.
    #[error("token ids are {dtype}, not integers")]
    TrimNotIntegers {
        /// The token ids' dtype.
        dtype: DType,
    },
}

/// Why a split tensor does not split its batch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SplitError {
    /// The split file cannot be read, or lacks the tensor.
    #[error(transparent)]
    Source(ConvertError),
    /// Not an integer tensor.
    #[error("`{tensor}` is {dtype}, not an integer tensor")]
    NotIntegers {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: DType,
    },
    /// Lengths whose sum overflows.
    #[error("lengths overflow")]
    Overflow,
    /// With `--delete-source`, the split file holds a tensor nothing reads, which would be
    /// deleted with it.
    #[error(
        "it also holds `{tensor}` ({what}), which nothing reads, so --delete-source \
         would delete it with the file; leave out --delete-source, or keep only `{split}` in \
         the split files"
    )]
    Unread {
        /// The tensor (or value) nothing reads.
        tensor: String,
        /// A tensor's dtype and shape, or what the value is.
        what: String,
        /// The split tensor, the one read.
        split: String,
    },
    /// Lengths that do not add up to the token count, or offsets that do not rise from 0 to
    /// it.
    #[error("`{tensor}` does not split the {rows} tokens: {got}")]
    Bounds {
        /// The tensor.
        tensor: String,
        /// The unit's tokens.
        rows: u64,
        /// What it gives instead (its lengths' sum, its first or last offset).
        got: String,
    },
}

impl UnitError {
    /// The file at fault: the one whose content is bad, or that is missing from its group,
    /// else the unit's first.
    pub fn file(&self) -> &Path {
        match self {
            UnitError::Source(e) => e.file(),
            UnitError::Key(e) => e.file(),
            UnitError::Unit { file, .. } | UnitError::SplitFile { file, .. } => file,
        }
    }

    /// The message without the file it starts with.
    pub fn detail(&self) -> String {
        match self {
            UnitError::Source(e) => e.detail(),
            UnitError::Key(e) => e.detail(),
            UnitError::Unit { problem, .. } => problem.to_string(),
            UnitError::SplitFile { split, error, .. } => format!(
                "split file {} of this batch: {error}; each batch needs its split file \
                 (--split-by-file)",
                split.display()
            ),
        }
    }
}

/// A [`UnitError`] about the unit whose first file is `inputs`'.
pub(super) fn unit_error(inputs: &Inputs, problem: impl Into<UnitProblem>) -> UnitError {
    UnitError::Unit {
        file: inputs.path().to_path_buf(),
        problem: Box::new(problem.into()),
    }
}

/// A [`UnitError`] about tensor `tensor` of `inputs`, naming the file that holds it (in a
/// group of files, not the group's first).
pub(super) fn tensor_error(
    inputs: &Inputs,
    tensor: &str,
    problem: impl Into<UnitProblem>,
) -> UnitError {
    UnitError::Unit {
        file: inputs.file_of(tensor).to_path_buf(),
        problem: Box::new(problem.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::KeyProblem;
    use super::*;

    #[test]
    fn each_error_names_its_file_apart_from_the_message() {
        let (batch, split) = (PathBuf::from("d/b_0.pt"), PathBuf::from("d/b_0.lens.pt"));
        let cases = [
            (
                UnitError::Unit {
                    file: batch.clone(),
                    problem: Box::new(UnitProblem::Tokens {
                        field: "l".into(),
                        tensor: "lens".into(),
                        rows: 2,
                        earlier: 4,
                    }),
                },
                &batch,
                "field `l` (tensor `lens`) has 2 tokens, earlier fields have 4",
            ),
            (
                UnitError::SplitFile {
                    file: batch.clone(),
                    split: split.clone(),
                    error: Box::new(SplitError::Bounds {
                        tensor: "".into(),
                        rows: 4,
                        got: "its 2 lengths add up to 3".into(),
                    }),
                },
                &batch,
                "split file d/b_0.lens.pt of this batch: `` does not split the 4 tokens: its 2 \
                 lengths add up to 3; each batch needs its split file (--split-by-file)",
            ),
            (
                UnitError::Key(KeyError::Value {
                    file: split.clone(),
                    name: "rids".into(),
                    problem: KeyProblem::Twice { id: "7".into() },
                }),
                &split,
                "--key-from rids: id `7` is there twice; every request needs its own id",
            ),
            (
                UnitError::Source(ConvertError::Missing {
                    file: split.clone(),
                    what: "tensor",
                    key: "lens".into(),
                }),
                &split,
                "missing tensor \"lens\"; the file is incomplete",
            ),
        ];
        for (e, file, detail) in cases {
            assert_eq!(e.file(), file.as_path());
            assert_eq!(e.detail(), detail);
            assert_eq!(e.to_string(), format!("{}: {detail}", file.display()));
        }
    }
}
