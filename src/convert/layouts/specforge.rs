//! SpecForge offline data (`scripts/prepare_hidden_states.py`).
//!
//! Files: `rows_{start}-{end}/data_{N}.ckpt`, optionally gzip-compressed (`.ckpt.gz`); each a
//! `torch.save` dict of one sample:
//!
//! | tensor | shape | field |
//! |---|---|---|
//! | `input_ids` | `[T]` | `input_ids` |
//! | `loss_mask` | `[T]` | `loss_mask` |
//! | `aux_hidden_state` | `[1, T, k·H]` | `aux_hidden_state`, row `[k, H]`, layers: the first k ids of `--layers` |
//! | `hidden_state` | `[1, T, H]` | `hidden.{l}` for the last id of `--layers` |
//!
//! k is `aux_hidden_state`'s width over `hidden_state`'s (3 for EAGLE-3). The aux states are
//! the EAGLE-3 auxiliary layers, concatenated in `--layers` order; by default they are taken as
//! layer inputs (the SGLang `layers_to_capture` and HF `hidden_states[i]` convention) and
//! `hidden_state` as the final-norm output (HF `hidden_states[-1]`). Override with `--point`.
//!
//! `aux_hidden_state` is one stacked field (role `hidden_states`): its bytes are the source's
//! as they are, and a reader hands a row out as the `[k·H]` concatenation EAGLE-3 trains on.
//! With `--split-layers` it becomes one field `hidden.{l}` per aux layer instead (a copy that
//! de-interleaves the layers).
//! Rows past the real length (batches padded to one length) are kept unless `--trim-padding`.

use crate::format::eagle3::{AUX_HIDDEN_STATE, SAVED};
use crate::format::CapturePoint;

use super::super::layout::{hidden_roles, FieldSpec, LayoutError, LayoutOptions};
use super::super::TensorInfo;
use super::{ids, layer_fields, mask, part, parts};
use crate::convert::layout::Stack;

/// The specs for a SpecForge file.
pub fn specs(
    tensors: &[TensorInfo],
    options: &LayoutOptions,
) -> Result<Vec<FieldSpec>, LayoutError> {
    super::require("specforge", tensors, SAVED.target)?;
    let k = parts(tensors, SAVED.aux, SAVED.target)?.unwrap_or(3);
    let mut defaults = vec![Some(CapturePoint::LayerInput); k as usize];
    defaults.push(Some(CapturePoint::FinalNorm));
    let roles = hidden_roles(
        "specforge",
        k as usize + 1,
        &format!("the {} parts, then {}", SAVED.aux, SAVED.target),
        options,
        &defaults,
    )?;
    let mut out = vec![ids(SAVED.input_ids), mask(SAVED.loss_mask)];
    out.extend(layer_fields(
        "specforge",
        AUX_HIDDEN_STATE,
        SAVED.aux,
        &roles[..k as usize],
        Stack::Concat,
        options.split_layers,
        |i| part(i, k),
    )?);
    let (name, role) = &roles[k as usize];
    out.push(FieldSpec::new(name, SAVED.target, role.clone()));
    Ok(out)
}
