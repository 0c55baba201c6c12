//! EAGLE (1 and 2) `ge_data` dumps (`ge_data/ge_data_all_*.py`).
//!
//! Files: `{outdir}/{index}/data_{N}.ckpt`; each a `torch.save` dict of one sample:
//!
//! | tensor | shape | field |
//! |---|---|---|
//! | `input_ids` | `[T]` | `input_ids` |
//! | `loss_mask` | `[T]` | `loss_mask` |
//! | `hidden_state` | `[T, H]` | `hidden.{l}`, `l` the one id of `--layers` |
//!
//! `hidden_state` is the model's last hidden state, HF `hidden_states[-1]`: the final-norm
//! output by default (give the model's layer count as its id, as the capture tools do).

use crate::format::eagle3::SAVED;
use crate::format::CapturePoint;

use super::super::layout::{hidden_roles, FieldSpec, LayoutError, LayoutOptions};
use super::super::TensorInfo;
use super::{ids, mask};

/// The specs for an EAGLE file.
pub fn specs(
    tensors: &[TensorInfo],
    options: &LayoutOptions,
) -> Result<Vec<FieldSpec>, LayoutError> {
    super::require("eagle", tensors, SAVED.target)?;
    let roles = hidden_roles(
        "eagle",
        1,
        SAVED.target,
        options,
        &[Some(CapturePoint::FinalNorm)],
    )?;
    let (name, role) = &roles[0];
    Ok(vec![
        ids(SAVED.input_ids),
        mask(SAVED.loss_mask),
        FieldSpec::new(name, SAVED.target, role.clone()),
    ])
}
