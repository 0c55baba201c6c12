//! NVIDIA ModelOpt `examples/speculative_decoding/collect_hidden_states`.
//!
//! Files: `{conversation_id}.pt`; each a `torch.save` dict of one conversation (the key is the
//! file name, which is the conversation id; `--key-from conversation_id` takes it from the
//! value stored in the dict instead, a `str` or `int` from the input JSONL):
//!
//! | entry | shape | field |
//! |---|---|---|
//! | `input_ids` | `[T]` | `input_ids` |
//! | `aux_hidden_states` | `[T, k·H]` (optional) | `aux_hidden_state`, row `[k, H]`, layers: the first k ids of `--layers` |
//! | `hidden_states` | `[T, H]` | `hidden.{l}` for the last id of `--layers` |
//! | `loss_mask` | `[T]` (optional) | `loss_mask` |
//! | `conversation_id` | `str` or `int` | the key, with `--key-from conversation_id` |
//!
//! The aux states are HF `hidden_states[i]` for the selected ids (layer inputs), concatenated in
//! `--layers` order; `hidden_states` is HF `hidden_states[-1]`, the final-norm output.
//! `aux_hidden_state` is one stacked field (role `hidden_states`) holding the source bytes as
//! they are; `--split-layers` writes one field `hidden.{l}` per aux layer instead.

use crate::format::eagle3::{AUX_HIDDEN_STATE, MODELOPT_SAVED as SAVED};
use crate::format::CapturePoint;

use super::super::layout::{find, hidden_roles, FieldSpec, LayoutError, LayoutOptions};
use super::super::TensorInfo;
use super::{ids, layer_fields, mask, part, parts};
use crate::convert::layout::Stack;

/// The specs for a ModelOpt file.
pub fn specs(
    tensors: &[TensorInfo],
    options: &LayoutOptions,
) -> Result<Vec<FieldSpec>, LayoutError> {
    super::require("modelopt", tensors, SAVED.target)?;
    let k = parts(tensors, SAVED.aux, SAVED.target)?.unwrap_or(0);
    let mut defaults = vec![Some(CapturePoint::LayerInput); k as usize];
    defaults.push(Some(CapturePoint::FinalNorm));
    let roles = hidden_roles(
        "modelopt",
        k as usize + 1,
        &if k > 0 {
            format!("the {} parts, then {}", SAVED.aux, SAVED.target)
        } else {
            SAVED.target.to_string()
        },
        options,
        &defaults,
    )?;
    let mut out = vec![ids(SAVED.input_ids)];
    if find(tensors, SAVED.loss_mask).is_some() {
        out.push(mask(SAVED.loss_mask));
    }
    if k > 0 {
        out.extend(layer_fields(
            "modelopt",
            AUX_HIDDEN_STATE,
            SAVED.aux,
            &roles[..k as usize],
            Stack::Concat,
            options.split_layers,
            |i| part(i, k),
        )?);
    }
    let (name, role) = &roles[k as usize];
    out.push(FieldSpec::new(name, SAVED.target, role.clone()));
    Ok(out)
}
