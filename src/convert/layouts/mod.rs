//! The layout presets, one file each. Every preset documents the tensors it expects and the
//! capture convention it assumes; none of the formats records layer ids, so every preset that
//! holds hidden states asks for `--layers`.

pub mod eagle;
pub mod generic;
pub mod modelopt;
pub mod specforge;
pub mod speculators;

use crate::format::Role;

use super::layout::{find, FieldSpec, LayoutError, Op};
use super::TensorInfo;

/// `input_ids` from `source`.
pub(crate) fn ids(source: &str) -> FieldSpec {
    FieldSpec::new("input_ids", source, Role::TokenIds)
}

/// `loss_mask` from `source`.
pub(crate) fn mask(source: &str) -> FieldSpec {
    FieldSpec::new("loss_mask", source, Role::LossMask)
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
