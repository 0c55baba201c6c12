//! Turning a strided view of a byte buffer into C-contiguous little-endian bytes.

use std::borrow::Cow;

use super::limits::{expansion_cap, EXPANDED_BYTES, EXPANSION};

/// A strided view: element size, shape, strides and offset in elements.
pub(crate) struct View<'a> {
    /// Bytes per element.
    pub elem: usize,
    /// Size of each dimension.
    pub shape: &'a [u64],
    /// Step per dimension, in elements.
    pub strides: &'a [i64],
    /// First element, in elements from the start of the buffer.
    pub offset: u64,
    /// Whether each element must be byte-reversed (big-endian source).
    pub swap: bool,
}

/// C-order strides (in elements) for a shape.
pub(crate) fn contiguous_strides(shape: &[u64]) -> Option<Vec<i64>> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc: i64 = 1;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.checked_mul(i64::try_from(d.max(1)).ok()?)?;
    }
    Some(strides)
}

/// Fortran-order strides (in elements) for a shape.
pub(crate) fn fortran_strides(shape: &[u64]) -> Option<Vec<i64>> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc: i64 = 1;
    for (s, &d) in strides.iter_mut().zip(shape) {
        *s = acc;
        acc = acc.checked_mul(i64::try_from(d.max(1)).ok()?)?;
    }
    Some(strides)
}

/// Reads the view out of `data` as C-contiguous little-endian bytes, borrowing when the
/// view is already contiguous and needs no swap. `limit` bounds the bytes produced.
/// On failure returns a sentence saying what does not fit.
pub(crate) fn materialize<'d>(
    data: &'d [u8],
    view: &View<'_>,
    limit: u64,
) -> Result<Cow<'d, [u8]>, String> {
    if view.shape.len() != view.strides.len() {
        return Err(format!(
            "shape has {} dimensions but strides have {}",
            view.shape.len(),
            view.strides.len()
        ));
    }
    let elem = view.elem as u64;
    let numel = view
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("the element count of shape {:?} overflows", view.shape))?;
    if numel == 0 {
        return Ok(Cow::Borrowed(&[]));
    }
    let mut last = view.offset;
    for (&d, &s) in view.shape.iter().zip(view.strides) {
        let s = u64::try_from(s).map_err(|_| format!("negative stride {s}"))?;
        last = (d - 1)
            .checked_mul(s)
            .and_then(|x| x.checked_add(last))
            .ok_or_else(|| {
                format!(
                    "shape {:?} with strides {:?} overflows",
                    view.shape, view.strides
                )
            })?;
    }
    let end = last
        .checked_add(1)
        .and_then(|n| n.checked_mul(elem))
        .ok_or_else(|| "the byte extent overflows".to_string())?;
    if end > data.len() as u64 {
        return Err(format!(
            "the view needs {end} bytes of storage (offset {}, shape {:?}, strides {:?}) but the storage has {}",
            view.offset,
            view.shape,
            view.strides,
            data.len()
        ));
    }
    let out_len = numel
        .checked_mul(elem)
        .filter(|&n| n <= limit)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("{numel} elements exceed the limit of {limit} bytes per tensor"))?;
    // A view that repeats its storage's bytes (a stride of 0: an expanded tensor) could make
    // a small file ask for any amount of memory.
    if out_len as u64 > expansion_cap(data.len() as u64) {
        return Err(format!(
            "the view (shape {:?}, strides {:?}) repeats its storage of {} bytes into {out_len}: \
             more than {EXPANSION} times its bytes or {} MiB; save the tensor materialized \
             (`.contiguous()` or `.clone()` before torch.save)",
            view.shape,
            view.strides,
            data.len(),
            EXPANDED_BYTES >> 20
        ));
    }
    let start = usize::try_from(view.offset * elem).map_err(|_| "offset overflows".to_string())?;

    let contiguous = {
        let mut expected: u64 = 1;
        let mut ok = true;
        for (&d, &s) in view.shape.iter().zip(view.strides).rev() {
            if d != 1 {
                ok &= u64::try_from(s).ok() == Some(expected);
                expected = expected.saturating_mul(d);
            }
        }
        ok
    };
    if contiguous {
        let slice = start
            .checked_add(out_len)
            .and_then(|e| data.get(start..e))
            .ok_or_else(|| "contiguous view out of range".to_string())?;
        if !view.swap || view.elem == 1 {
            return Ok(Cow::Borrowed(slice));
        }
        let mut out = slice.to_vec();
        swap_in_place(&mut out, view.elem);
        return Ok(Cow::Owned(out));
    }

    let mut out = Vec::new();
    out.try_reserve_exact(out_len)
        .map_err(|_| format!("cannot allocate {out_len} bytes"))?;
    let rank = view.shape.len();
    // rank >= 1 here: a 0-d view is always contiguous.
    let (inner_dim, outer_dims) = view.shape.split_last().ok_or("empty shape")?;
    let (inner_stride, outer_strides) = view.strides.split_last().ok_or("empty strides")?;
    let inner_stride = *inner_stride as u64;
    let run_bytes = usize::try_from(inner_dim * elem).map_err(|_| "run overflows".to_string())?;
    let mut index = vec![0u64; rank - 1];
    loop {
        let base = index
            .iter()
            .zip(outer_strides)
            .fold(view.offset, |acc, (&i, &s)| acc + i * s as u64);
        if inner_stride == 1 {
            let b = (base * elem) as usize;
            let run = data.get(b..b + run_bytes).ok_or("gather out of range")?;
            out.extend_from_slice(run);
        } else {
            for j in 0..*inner_dim {
                let b = ((base + j * inner_stride) * elem) as usize;
                let e = data.get(b..b + view.elem).ok_or("gather out of range")?;
                out.extend_from_slice(e);
            }
        }
        // Advance the odometer over the outer dimensions.
        let mut k = outer_dims.len();
        loop {
            if k == 0 {
                if view.swap {
                    swap_in_place(&mut out, view.elem);
                }
                return Ok(Cow::Owned(out));
            }
            k -= 1;
            let (Some(i), Some(&d)) = (index.get_mut(k), outer_dims.get(k)) else {
                return Err("index out of range".into());
            };
            *i += 1;
            if *i < d {
                break;
            }
            *i = 0;
        }
    }
}

/// Reverses the bytes of every `elem`-sized element.
pub(crate) fn swap_in_place(bytes: &mut [u8], elem: usize) {
    if elem > 1 {
        for chunk in bytes.chunks_exact_mut(elem) {
            chunk.reverse();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(shape: &'a [u64], strides: &'a [i64], offset: u64) -> View<'a> {
        View {
            elem: 1,
            shape,
            strides,
            offset,
            swap: false,
        }
    }

    #[test]
    fn transposed_and_sliced() {
        let data: Vec<u8> = (0..12).collect();
        // 3x4 transposed to 4x3.
        let t = materialize(&data, &view(&[4, 3], &[1, 4], 0), u64::MAX).unwrap();
        assert_eq!(&*t, &[0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]);
        // x[:, ::2]
        let s = materialize(&data, &view(&[3, 2], &[4, 2], 0), u64::MAX).unwrap();
        assert_eq!(&*s, &[0, 2, 4, 6, 8, 10]);
        // row 1, contiguous: borrowed
        let r = materialize(&data, &view(&[4], &[1], 4), u64::MAX).unwrap();
        assert!(matches!(r, Cow::Borrowed(_)));
        assert_eq!(&*r, &[4, 5, 6, 7]);
    }

    #[test]
    fn bounds_and_overflow() {
        let data = [0u8; 8];
        assert!(materialize(&data, &view(&[9], &[1], 0), u64::MAX).is_err());
        assert!(materialize(&data, &view(&[2], &[1], 7), u64::MAX).is_err());
        assert!(materialize(&data, &view(&[2, 2], &[i64::MAX, 1], 0), u64::MAX).is_err());
        assert!(materialize(&data, &view(&[u64::MAX, 2], &[0, 0], 0), u64::MAX).is_err());
        assert!(materialize(&data, &view(&[2], &[-1], 1), u64::MAX).is_err());
        assert!(materialize(&data, &view(&[4], &[0], 0), 3).is_err());
        assert_eq!(
            &*materialize(&data, &view(&[0, 5], &[5, 1], 100), u64::MAX).unwrap(),
            &[] as &[u8]
        );
    }

    #[test]
    fn a_broadcast_repeats_its_storage_a_bounded_number_of_times() {
        let data = [7u8; 4];
        // An expanded mask of a million tokens: gathered.
        let mask = materialize(&data, &view(&[1 << 20], &[0], 0), u64::MAX).unwrap();
        assert!(mask.iter().all(|&b| b == 7) && mask.len() == 1 << 20);
        // Two billion elements from four bytes: refused before any allocation.
        let err = materialize(&data, &view(&[1 << 31], &[0], 0), u64::MAX).unwrap_err();
        assert!(err.contains("repeats its storage of 4 bytes"), "{err}");
        assert!(err.contains(".contiguous()"), "{err}");
    }

    #[test]
    fn swaps_elements() {
        let data = [1u8, 2, 3, 4];
        let v = View {
            elem: 2,
            shape: &[2],
            strides: &[1],
            offset: 0,
            swap: true,
        };
        assert_eq!(&*materialize(&data, &v, u64::MAX).unwrap(), &[2, 1, 4, 3]);
    }
}

#[cfg(test)]
mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any permutation of any strided slice reads the same elements as naive indexing.
        #[test]
        fn matches_naive_indexing(
            base in proptest::collection::vec(1u64..5, 1..4),
            steps in proptest::collection::vec(1u64..3, 3),
            perm_seed in any::<u64>(),
            offset in 0u64..3,
            elem in proptest::sample::select(vec![1usize, 2, 4]),
            swap in any::<bool>(),
        ) {
            let rank = base.len();
            let storage_strides = contiguous_strides(&base).unwrap();
            let numel_base: u64 = base.iter().product();
            let data: Vec<u8> = (0..(numel_base + offset) * elem as u64).map(|i| i as u8).collect();
            // View: take every step-th element along each dim, then permute dims.
            let mut shape: Vec<u64> = base.iter().zip(&steps).map(|(d, s)| d.div_ceil(*s)).collect();
            let mut strides: Vec<i64> = storage_strides.iter().zip(&steps).map(|(st, s)| st * *s as i64).collect();
            let mut perm: Vec<usize> = (0..rank).collect();
            let mut seed = perm_seed;
            for i in (1..rank).rev() {
                perm.swap(i, (seed % (i as u64 + 1)) as usize);
                seed /= 7;
            }
            shape = perm.iter().map(|&p| shape[p]).collect();
            strides = perm.iter().map(|&p| strides[p]).collect();
            let view = View { elem, shape: &shape, strides: &strides, offset, swap };
            let got = materialize(&data, &view, u64::MAX).unwrap();
            let mut want = Vec::new();
            let numel: u64 = shape.iter().product();
            for flat in 0..numel {
                let mut rem = flat;
                let mut pos = offset as i64;
                for (d, s) in shape.iter().zip(&strides).rev() {
                    pos += (rem % d) as i64 * s;
                    rem /= d;
                }
                let start = pos as usize * elem;
                let mut e = data[start..start + elem].to_vec();
                if swap { e.reverse(); }
                want.extend(e);
            }
            prop_assert_eq!(&got[..], &want[..]);
        }
    }
}
