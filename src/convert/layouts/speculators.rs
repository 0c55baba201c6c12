//! vLLM speculators data generation.
//!
//! Files: one `torch.save` dict (or `.safetensors`) per sample:
//!
//! | tensor | shape | field |
//! |---|---|---|
//! | `token_ids` (or `input_ids`) | `[T]` | `input_ids` |
//! | `hidden_states` | `[T, L, H]` | `hidden.{l}` for each of the L ids of `--layers`, in order |
//! | `loss_mask` | `[T]` (optional) | `loss_mask` |
//!
//! The files do not say on which side of a layer the states were taken, so `--point` is
//! required (unless an id equals `--num-layers`, which means the final-norm output).

use super::super::layout::{find, hidden_roles, FieldSpec, LayoutError, LayoutOptions, Op};
use super::super::TensorInfo;
use super::{ids, mask};

/// The specs for a speculators file.
pub fn specs(
    tensors: &[TensorInfo],
    options: &LayoutOptions,
) -> Result<Vec<FieldSpec>, LayoutError> {
    let hs = find(tensors, "hidden_states");
    let layers = match hs.map(|t| t.shape.as_slice()) {
        Some([.., l, _]) if hs.is_some_and(|t| t.shape.len() >= 3) => *l,
        Some(s) => {
            return Err(LayoutError::Shape {
                tensor: "hidden_states".into(),
                got: format!("shape {s:?}"),
                expected: "[T, n_layers, H]".into(),
            })
        }
        None => options.layers.len() as u64,
    };
    let roles = hidden_roles(
        "speculators",
        layers as usize,
        "hidden_states[:, j] for each j",
        options,
        &vec![None; layers as usize],
    )?;
    let token = if find(tensors, "token_ids").is_some() {
        "token_ids"
    } else {
        "input_ids"
    };
    let mut out = vec![ids(token)];
    if find(tensors, "loss_mask").is_some() {
        out.push(mask("loss_mask"));
    }
    for (j, (name, role)) in roles.iter().enumerate() {
        out.push(
            FieldSpec::new(name, "hidden_states", role.clone()).with_op(Op::Index {
                index: j as u64,
                axis: -2,
            }),
        );
    }
    Ok(out)
}
