//! Where a field's bytes lie in its source tensor: the op's slab, the row squeeze, the
//! stacked layers' readings.

use std::borrow::Cow;

use crate::format::Role;

use super::{FieldSpec, LayoutError, Op, Stack};

/// Drops leading dimensions of 1 from `shape` while it has more than `keep`.
pub(super) fn drop_leading_ones(shape: &mut Vec<u64>, keep: usize) {
    let extra = shape.len().saturating_sub(keep);
    let ones = shape.iter().take(extra).take_while(|&&d| d == 1).count();
    shape.drain(..ones);
}

/// Normalizes a possibly negative axis for `ndim` dimensions.
fn axis_of(axis: i64, ndim: usize, tensor: &str) -> Result<usize, LayoutError> {
    let a = if axis < 0 { axis + ndim as i64 } else { axis };
    if a < 0 || a >= ndim as i64 {
        return Err(LayoutError::Shape {
            tensor: tensor.into(),
            got: format!("{ndim} dimensions"),
            expected: format!("an axis {axis}"),
        });
    }
    Ok(a as usize)
}

/// The slab an op takes: (axis, start, len along it, whether the axis is dropped).
fn slab(
    op: Op,
    shape: &[u64],
    tensor: &str,
) -> Result<Option<(usize, u64, u64, bool)>, LayoutError> {
    match op {
        Op::Whole => Ok(None),
        Op::Part { index, of, axis } => {
            let a = axis_of(axis, shape.len(), tensor)?;
            if of == 0 || index >= of || !shape[a].is_multiple_of(of) {
                return Err(LayoutError::Shape {
                    tensor: tensor.into(),
                    got: format!("shape {shape:?}"),
                    expected: format!("axis {axis} divisible into {of} parts (part {index})"),
                });
            }
            let len = shape[a] / of;
            Ok(Some((a, index * len, len, false)))
        }
        Op::Index { index, axis } => {
            let a = axis_of(axis, shape.len(), tensor)?;
            if index >= shape[a] {
                return Err(LayoutError::Shape {
                    tensor: tensor.into(),
                    got: format!("shape {shape:?}"),
                    expected: format!("more than {index} entries along axis {axis}"),
                });
            }
            Ok(Some((a, index, 1, true)))
        }
        Op::Range { start, len, axis } => {
            let a = axis_of(axis, shape.len(), tensor)?;
            if len == 0 || start.checked_add(len).is_none_or(|end| end > shape[a]) {
                return Err(LayoutError::Shape {
                    tensor: tensor.into(),
                    got: format!("shape {shape:?}"),
                    expected: format!("entries {start}..{} along axis {axis}", start + len),
                });
            }
            Ok(Some((a, start, len, false)))
        }
    }
}

/// Shape of the field's tensor after the op and the row squeeze: `[tokens, row...]`. For a
/// field stacking several sources, `shape` is one source's and the result the field's.
pub fn field_shape(spec: &FieldSpec, shape: &[u64]) -> Result<Vec<u64>, LayoutError> {
    let mut s = shape.to_vec();
    if let Some((a, _, len, drop)) = slab(spec.op, shape, &spec.source)? {
        if drop {
            s.remove(a);
        } else {
            s[a] = len;
        }
    }
    let bad = |expected: String| LayoutError::Shape {
        tensor: spec.source.clone(),
        got: format!("shape {shape:?}"),
        expected,
    };
    if spec.is_stacked() {
        let k = spec.layer_count();
        let (dims, what) = match &spec.stack {
            Stack::Axis => (
                3,
                format!("[.., T, {k}, H] ({k} layers on the second-last axis)"),
            ),
            Stack::Sources(more) if !more.is_empty() => (2, "[.., T, H] (one layer)".into()),
            _ => (
                2,
                format!("[.., T, {k}·H] ({k} layers concatenated on the last dim)"),
            ),
        };
        drop_leading_ones(&mut s, dims);
        let ok = s.len() == dims
            && match &spec.stack {
                Stack::Axis => s[1] == k,
                Stack::Sources(more) if !more.is_empty() => {
                    more.len() as u64 + 1 == k && {
                        s.insert(1, k);
                        true
                    }
                }
                _ => {
                    s[1].is_multiple_of(k) && {
                        let h = s[1] / k;
                        s[1] = k;
                        s.push(h);
                        true
                    }
                }
            };
        if !ok {
            return Err(bad(format!("{what} for field `{}`", spec.name)));
        }
        return Ok(s);
    }
    let target = spec.target_dims();
    drop_leading_ones(&mut s, target);
    if s.is_empty() || s.len() != target && !matches!(spec.role, Role::Other) {
        return Err(bad(format!(
            "{target} dimension(s) after dropping leading ones for field `{}`",
            spec.name
        )));
    }
    Ok(s)
}

/// Resolves [`Stack::Auto`] from the first file's tensor of `shape`; refuses a shape that
/// both readings fit (`[1, T, k·H]` with T = k), which only `stack=` can tell apart.
pub(super) fn resolve_stack(spec: &mut FieldSpec, shape: &[u64]) -> Result<(), LayoutError> {
    if !spec.is_stacked() || spec.stack != Stack::Auto {
        return Ok(());
    }
    let read_as = |stack: Stack| {
        let mut s = spec.clone();
        s.stack = stack;
        field_shape(&s, shape).ok()
    };
    spec.stack = match (read_as(Stack::Axis), read_as(Stack::Concat)) {
        (Some(_), Some(_)) => {
            return Err(LayoutError::AmbiguousStack {
                field: spec.name.clone(),
                tensor: spec.source.clone(),
                shape: shape.to_vec(),
                k: spec.layer_count(),
            });
        }
        (Some(_), None) => Stack::Axis,
        _ => Stack::Concat,
    };
    Ok(())
}

/// Where a field's bytes lie in its source tensor's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// One contiguous range.
    Range(std::ops::Range<usize>),
    /// `outer` runs of `len` bytes, `stride` apart, the first at `start`.
    Strided {
        /// Runs.
        outer: usize,
        /// Bytes between runs.
        stride: usize,
        /// Offset of the first run.
        start: usize,
        /// Bytes of a run.
        len: usize,
    },
}

impl Part {
    /// Bytes of the field.
    pub fn len(&self) -> usize {
        match self {
            Part::Range(r) => r.len(),
            Part::Strided { outer, len, .. } => outer * len,
        }
    }

    /// True when the field is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the field's bytes from `src` into `dst` (of [`Part::len`] bytes).
    pub fn gather(&self, src: &[u8], dst: &mut [u8]) {
        match self {
            Part::Range(r) => dst.copy_from_slice(&src[r.clone()]),
            Part::Strided {
                stride, start, len, ..
            } => {
                for (o, out) in dst.chunks_exact_mut(*len).enumerate() {
                    let from = start + o * stride;
                    out.copy_from_slice(&src[from..from + len]);
                }
            }
        }
    }
}

/// Where the field lies in a source tensor of `shape` with elements of `elem` bytes.
pub fn field_part(spec: &FieldSpec, shape: &[u64], elem: usize) -> Result<Part, LayoutError> {
    let total = shape.iter().product::<u64>() as usize * elem;
    let Some((a, start, len, _)) = slab(spec.op, shape, &spec.source)? else {
        return Ok(Part::Range(0..total));
    };
    let outer = shape[..a].iter().product::<u64>() as usize;
    let inner = shape[a + 1..].iter().product::<u64>() as usize * elem;
    let (dim, start, len) = (shape[a] as usize, start as usize, len as usize);
    if outer == 1 {
        return Ok(Part::Range(start * inner..(start + len) * inner));
    }
    Ok(Part::Strided {
        outer,
        stride: dim * inner,
        start: start * inner,
        len: len * inner,
    })
}

/// The bytes of the field: the op applied to `bytes` (C order, `shape`, elements of `elem`
/// bytes). Borrowed when the part is contiguous.
pub fn field_bytes<'a>(
    spec: &FieldSpec,
    shape: &[u64],
    elem: usize,
    bytes: Cow<'a, [u8]>,
) -> Result<Cow<'a, [u8]>, LayoutError> {
    Ok(match (field_part(spec, shape, elem)?, bytes) {
        (Part::Range(r), Cow::Borrowed(b)) => Cow::Borrowed(&b[r]),
        (Part::Range(r), Cow::Owned(b)) if r.len() == b.len() => Cow::Owned(b),
        (part, b) => {
            let mut out = vec![0; part.len()];
            part.gather(&b, &mut out);
            Cow::Owned(out)
        }
    })
}
