//! vLLM speculators data generation.
//!
//! Files: one `torch.save` dict (or `.safetensors`) per sample:
//!
//! | tensor | shape | field |
//! |---|---|---|
//! | `token_ids` (or `input_ids`) | `[T]` | `input_ids` |
//! | `hidden_states` | `[T, L, H]` | `hidden_states`, row `[L, H]`, layers: the L ids of `--layers` |
//! | `loss_mask` | `[T]` (optional) | `loss_mask` |
//!
//! The files do not say on which side of a layer the states were taken, so `--point` is
//! required (unless an id equals `--num-layers`, which means the final-norm output).
//!
//! Fields: when every layer has the same capture point, `hidden_states` is one stacked field
//! (role `hidden_states`) holding the source bytes as they are. When only the last layer's
//! point differs (the verifier's final-norm output after L − 1 auxiliary layers, e.g.
//! `--num-layers` equal to the last id), the first L − 1 layers are stacked as
//! `aux_hidden_state` (a copy: they are strided in the source) and the last is `hidden.{l}`,
//! the two inputs of EAGLE-3 training. `--split-layers` writes one field `hidden.{l}` per
//! layer instead.

use super::super::layout::{find, hidden_roles, FieldSpec, LayoutError, LayoutOptions, Op};
use super::super::TensorInfo;
use super::{ids, mask, stacked_role};
use crate::convert::layout::Stack;
use crate::format::eagle3::{
    AUX_HIDDEN_STATE, INPUT_IDS, LOSS_MASK, SPECULATORS_HIDDEN_STATES as HIDDEN_STATES,
    SPECULATORS_TOKEN_IDS as TOKEN_IDS,
};

/// The specs for a speculators file.
pub fn specs(
    tensors: &[TensorInfo],
    options: &LayoutOptions,
) -> Result<Vec<FieldSpec>, LayoutError> {
    let hs = find(tensors, HIDDEN_STATES);
    let layers = match hs.map(|t| t.shape.as_slice()) {
        Some([.., l, _]) if hs.is_some_and(|t| t.shape.len() >= 3) => *l,
        Some(s) => {
            return Err(LayoutError::Shape {
                tensor: HIDDEN_STATES.into(),
                got: format!("shape {s:?}"),
                expected: "[T, n_layers, H]".into(),
            })
        }
        None => options.layers.len() as u64,
    };
    let roles = hidden_roles(
        "speculators",
        layers as usize,
        &format!("{HIDDEN_STATES}[:, j] for each j"),
        options,
        &vec![None; layers as usize],
    )?;
    let token = if find(tensors, TOKEN_IDS).is_some() {
        TOKEN_IDS
    } else {
        INPUT_IDS
    };
    let mut out = vec![ids(token)];
    if find(tensors, LOSS_MASK).is_some() {
        out.push(mask(LOSS_MASK));
    }
    let index = |j: usize| Op::Index {
        index: j as u64,
        axis: -2,
    };
    if !options.split_layers {
        if let Ok(role) = stacked_role("speculators", &roles) {
            out.push(FieldSpec::new(HIDDEN_STATES, HIDDEN_STATES, role).stacked(Stack::Axis));
            return Ok(out);
        }
        if let [aux @ .., (name, last)] = roles.as_slice() {
            if !aux.is_empty() {
                let role = stacked_role("speculators", aux)?;
                let first = Op::Range {
                    start: 0,
                    len: aux.len() as u64,
                    axis: -2,
                };
                out.push(
                    FieldSpec::new(AUX_HIDDEN_STATE, HIDDEN_STATES, role)
                        .with_op(first)
                        .stacked(Stack::Axis),
                );
                out.push(
                    FieldSpec::new(name, HIDDEN_STATES, last.clone()).with_op(index(aux.len())),
                );
                return Ok(out);
            }
        }
    }
    for (j, (name, role)) in roles.iter().enumerate() {
        out.push(FieldSpec::new(name, HIDDEN_STATES, role.clone()).with_op(index(j)));
    }
    Ok(out)
}
