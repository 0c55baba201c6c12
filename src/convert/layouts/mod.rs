//! The layout presets, one file each. Every preset documents the tensors it expects and the
//! capture convention it assumes; none of the formats records layer ids, so every preset that
//! holds hidden states asks for `--layers`.

pub mod eagle;
pub mod generic;
pub mod modelopt;
pub mod specforge;
pub mod speculators;

use crate::format::eagle3;
use crate::format::Role;

use super::layout::{find, FieldSpec, LayoutError, Op, Stack};
use super::TensorInfo;

/// The token-id field ([`eagle3::INPUT_IDS`]) from `source`.
pub(crate) fn ids(source: &str) -> FieldSpec {
    FieldSpec::new(eagle3::INPUT_IDS, source, Role::TokenIds)
}

/// The loss-mask field ([`eagle3::LOSS_MASK`]) from `source`.
pub(crate) fn mask(source: &str) -> FieldSpec {
    FieldSpec::new(eagle3::LOSS_MASK, source, Role::LossMask)
}

/// Refuses files without tensor `name`, which `layout`'s files always hold: said before its
/// flags are checked, since no flag makes another tool's files this layout's.
pub(crate) fn require(
    layout: &'static str,
    tensors: &[TensorInfo],
    name: &str,
) -> Result<(), LayoutError> {
    match find(tensors, name) {
        Some(_) => Ok(()),
        None => Err(super::layout::missing_tensor(layout, name.into(), tensors)),
    }
}

/// How many hidden-size parts the last axis of `concat` holds, given one state `single`.
pub(crate) fn parts(
    tensors: &[TensorInfo],
    concat: &str,
    single: &str,
) -> Result<Option<u64>, LayoutError> {
    let (Some(c), Some(s)) = (find(tensors, concat), find(tensors, single)) else {
        return Ok(None);
    };
    let (Some(&cw), Some(&sw)) = (c.shape.last(), s.shape.last()) else {
        return Ok(None);
    };
    if sw == 0 || cw % sw != 0 {
        return Err(LayoutError::Shape {
            tensor: concat.into(),
            got: format!("last dimension {cw}"),
            expected: format!("a multiple of `{single}`'s hidden size {sw}"),
        });
    }
    Ok(Some(cw / sw))
}

/// Part `i` of `of` along the last axis.
pub(crate) fn part(i: u64, of: u64) -> Op {
    Op::Part {
        index: i,
        of,
        axis: -1,
    }
}

/// One role stacking the layers of `roles` (from [`super::layout::hidden_roles`]); they must
/// share a capture point.
pub(crate) fn stacked_role(layout: &str, roles: &[(String, Role)]) -> Result<Role, LayoutError> {
    let mut layers = Vec::with_capacity(roles.len());
    let mut points = Vec::with_capacity(roles.len());
    for (_, role) in roles {
        if let Role::HiddenState { layer, point } = role {
            layers.push(*layer);
            points.push(*point);
        }
    }
    match points.first() {
        Some(&point) if points.iter().all(|&p| p == point) => {
            Ok(Role::HiddenStates { layers, point })
        }
        _ => Err(LayoutError::Layers {
            detail: format!(
                "the {layout} layout stores layers {layers:?} in one field, so they need one \
                 capture point, but the points are {points:?}: give one --point for them, or \
                 --split-layers for one field per layer"
            ),
        }),
    }
}

/// The fields of `roles.len()` layers held by `source`: one stacked field `name` (laid out as
/// `stack`), or with `split` one field per layer taking `op(i)`.
pub(crate) fn layer_fields(
    layout: &str,
    name: &str,
    source: &str,
    roles: &[(String, Role)],
    stack: Stack,
    split: bool,
    op: impl Fn(u64) -> Op,
) -> Result<Vec<FieldSpec>, LayoutError> {
    if split {
        return Ok(roles
            .iter()
            .enumerate()
            .map(|(i, (n, role))| FieldSpec::new(n, source, role.clone()).with_op(op(i as u64)))
            .collect());
    }
    let role = stacked_role(layout, roles)?;
    Ok(vec![FieldSpec::new(name, source, role).stacked(stack)])
}
