//! The `--mapping FILE.json` file: the generic layout's options in one file, filling the same
//! [`ConvertSpec`] as the flags. A key there and its flag together are an error. Fields are
//! `--field` strings or objects (see [`FieldArg`]):
//!
//! ```json
//! {
//!   "fields": [
//!     "input_ids=ids",
//!     {"name": "aux_hidden_state", "source": ["layer_2", "layer_30", "layer_58"],
//!      "layers": [2, 30, 58], "point": "layer-input"},
//!     {"name": "hidden.61", "source": "final", "point": "final-norm"}
//!   ],
//!   "group_by": "{key}/{part}.pt",
//!   "num_layers": 61,
//!   "model": "org/model"
//! }
//! ```
//!
//! Other keys: `split_by` (`{"lengths": TENSOR}` or `{"cu_seqlens": TENSOR}`),
//! `split_by_file`, `key_from`, `layers`, `points` (a list of capture points).

use std::path::Path;

use super::super::prepare::SplitBy;
use super::{ConvertSpec, FieldArg, SpecError};

/// A mapping file: the keys of [`ConvertSpec`] it may set, each standing for the flag of the
/// same name.
#[derive(Debug, Default, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mapping {
    /// Fields: `--field` strings, or objects with the same options as keys.
    #[serde(default)]
    pub fields: Vec<FieldArg>,
    /// `--group-by`.
    pub group_by: Option<String>,
    /// `--split-by`: `{"lengths": TENSOR}` or `{"cu_seqlens": TENSOR}`.
    pub split_by: Option<SplitBy>,
    /// `--split-by-file`.
    pub split_by_file: Option<String>,
    /// `--key-from`.
    pub key_from: Option<String>,
    /// `--layers`.
    pub layers: Option<Vec<u32>>,
    /// `--point`: one for all layers or one per layer.
    pub points: Option<Vec<String>>,
    /// `--num-layers`.
    pub num_layers: Option<u32>,
    /// `--model`.
    pub model: Option<String>,
}

impl Mapping {
    /// Reads a mapping file.
    pub fn read(path: &Path) -> Result<Mapping, SpecError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| SpecError::MappingUnreadable {
                file: path.to_path_buf(),
                source,
            })?;
        Mapping::parse(&text, path)
    }

    /// Parses a mapping file's text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Mapping, SpecError> {
        serde_json::from_str(text).map_err(|source| SpecError::NotAMapping {
            file: path.to_path_buf(),
            source,
        })
    }
}

impl ConvertSpec {
    /// Sets what the mapping file `file` holds, refusing a key the spec already sets (a flag
    /// given too).
    pub fn merge_mapping(&mut self, m: Mapping, file: &Path) -> Result<(), SpecError> {
        let twice = |key, flag| SpecError::Twice {
            file: file.to_path_buf(),
            key,
            flag,
        };
        fn take<T>(
            slot: &mut Option<T>,
            value: Option<T>,
            err: SpecError,
        ) -> Result<(), SpecError> {
            if let Some(v) = value {
                if slot.is_some() {
                    return Err(err);
                }
                *slot = Some(v);
            }
            Ok(())
        }
        fn take_list<T>(
            slot: &mut Vec<T>,
            value: Option<Vec<T>>,
            err: SpecError,
        ) -> Result<(), SpecError> {
            if let Some(v) = value {
                if !slot.is_empty() {
                    return Err(err);
                }
                *slot = v;
            }
            Ok(())
        }
        if !m.fields.is_empty() {
            take_list(&mut self.fields, Some(m.fields), twice("fields", "--field"))?;
        }
        take(
            &mut self.group_by,
            m.group_by,
            twice("group_by", "--group-by"),
        )?;
        take(
            &mut self.split_by,
            m.split_by,
            twice("split_by", "--split-by"),
        )?;
        take(
            &mut self.split_by_file,
            m.split_by_file,
            twice("split_by_file", "--split-by-file"),
        )?;
        take(
            &mut self.key_from,
            m.key_from,
            twice("key_from", "--key-from"),
        )?;
        take(
            &mut self.num_layers,
            m.num_layers,
            twice("num_layers", "--num-layers"),
        )?;
        take(&mut self.model, m.model, twice("model", "--model"))?;
        take_list(&mut self.layers, m.layers, twice("layers", "--layers"))?;
        take_list(&mut self.points, m.points, twice("points", "--point"))?;
        Ok(())
    }
}
