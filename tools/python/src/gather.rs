//! `gather_into`: a batch assembled from many arrays on hspack's thread pool, for a caller
//! that is a single thread (the DataLoader's pin-memory thread).

use crate::detach::detached;
use pyo3::prelude::*;

use crate::borrowed::ByteView;
use crate::errors::bad_option;

/// Fills byte ranges of the writable array `out`, GIL released, on hspack's pool: each
/// `(offset, source)` of `parts` copies the source array's bytes to `offset`, each
/// `(offset, length)` of `zeros` writes zeros. The ranges must lie inside `out` and not
/// overlap; the arrays must be C-contiguous, and no source may share memory with `out`.
#[pyfunction]
pub fn gather_into(
    py: Python<'_>,
    out: &Bound<'_, PyAny>,
    parts: Vec<(usize, Bound<'_, PyAny>)>,
    zeros: Vec<(usize, usize)>,
) -> PyResult<()> {
    let sources = parts
        .iter()
        .map(|(_, src)| ByteView::new(src, "parts"))
        .collect::<PyResult<Vec<_>>>()?;
    // (start, length, source) sorted by start, so `out` splits into disjoint pieces in order.
    let mut ranges: Vec<(usize, usize, Option<&[u8]>)> = parts
        .iter()
        .zip(&sources)
        .map(|((at, _), src)| (*at, src.as_slice().len(), Some(src.as_slice())))
        .chain(zeros.iter().map(|&(at, len)| (at, len, None)))
        .collect();
    ranges.sort_by_key(|r| r.0);
    let mut view = ByteView::new(out, "out")?;
    let mut rest = view.as_mut_slice("out")?;
    let out_range = rest.as_ptr_range();
    if sources.iter().any(|src| {
        let r = src.as_slice().as_ptr_range();
        !r.is_empty() && r.start < out_range.end && out_range.start < r.end
    }) {
        return Err(bad_option("parts", "a source shares memory with `out`"));
    }
    let mut pos = 0;
    let mut pieces = Vec::with_capacity(ranges.len());
    for (at, len, src) in ranges {
        let end = at.checked_add(len).filter(|&end| end <= pos + rest.len());
        let (Some(end), true) = (end, at >= pos) else {
            return Err(bad_option(
                "parts",
                "the ranges overlap or lie outside `out`",
            ));
        };
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(at - pos);
        let (piece, tail) = tail.split_at_mut(len);
        pieces.push((piece, src));
        rest = tail;
        pos = end;
    }
    detached(py, || hspack::parallel::fill(pieces));
    Ok(())
}
