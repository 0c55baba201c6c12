//! The generic mapping for ad-hoc dumps: fields named by the user.
//!
//! `--field NAME=SRC[:OPTION]...` maps source tensor `SRC` (a flattened name: `hidden`,
//! `aux.0` for a list entry, `layer2.hidden` for a grouped file; see `--group-by`) to field
//! `NAME`; the options, and the same field as an object of a `--mapping` file, are described
//! with [`FieldArg`](crate::convert::spec::FieldArg), which resolves them
//! ([`crate::convert::spec`], checked with the rest of the job's options). The mapping file is
//! [`Mapping`](crate::convert::spec::Mapping).

use super::super::layout::{list_tensors, FieldSpec, LayoutError, LayoutOptions};
use super::super::TensorInfo;

/// The user's fields; refuses an empty mapping, listing the tensors of the first file.
pub fn specs(
    tensors: &[TensorInfo],
    options: &LayoutOptions,
) -> Result<Vec<FieldSpec>, LayoutError> {
    if options.fields.is_empty() {
        return Err(LayoutError::BadOption(format!(
            "--layout generic needs --field NAME=TENSOR for each field; the first file has: {}",
            list_tensors(tensors)
        )));
    }
    Ok(options.fields.clone())
}
