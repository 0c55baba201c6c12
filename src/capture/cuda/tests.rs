//! Tests that need no GPU: slot planning, sample checks and the no-driver error.

use proptest::prelude::*;

use super::driver::probe;
use super::writer::{plan, Piece};
use super::CaptureError;

#[test]
fn missing_library_is_a_clear_error() {
    let err = probe("libcuda-that-does-not-exist.so.1").unwrap_err();
    assert!(matches!(err, CaptureError::NoDriver { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.starts_with("no CUDA driver: cannot load libcuda-that-does-not-exist.so.1"));
    assert!(text.contains("HSPACK_LIBCUDA"), "{text}");
}

#[test]
fn library_without_the_entry_points_is_an_old_driver() {
    // libc loads everywhere and has none of CUDA's symbols.
    #[cfg(target_os = "linux")]
    {
        let err = probe("libc.so.6").unwrap_err();
        assert!(
            matches!(
                err,
                CaptureError::OldDriver {
                    symbol: "cuInit",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

#[test]
fn plan_packs_small_fields_into_one_slot() {
    let (pieces, used) = plan(&[100, 300, 256], 1024);
    assert_eq!(used, 1);
    assert_eq!(
        pieces,
        vec![
            vec![Piece {
                slot: 0,
                offset: 0,
                len: 100
            }],
            vec![Piece {
                slot: 0,
                offset: 256,
                len: 300
            }],
            vec![Piece {
                slot: 0,
                offset: 768,
                len: 256
            }],
        ]
    );
}

#[test]
fn plan_splits_a_field_across_slots() {
    let (pieces, used) = plan(&[1000, 2500], 1024);
    assert_eq!(used, 4);
    assert_eq!(
        pieces[0],
        vec![Piece {
            slot: 0,
            offset: 0,
            len: 1000
        }]
    );
    assert_eq!(
        pieces[1],
        vec![
            Piece {
                slot: 1,
                offset: 0,
                len: 1024
            },
            Piece {
                slot: 2,
                offset: 0,
                len: 1024
            },
            Piece {
                slot: 3,
                offset: 0,
                len: 452
            },
        ]
    );
}

#[test]
fn plan_moves_a_field_that_fits_a_slot_to_the_next_one() {
    let (pieces, used) = plan(&[600, 600, 100], 1024);
    assert_eq!(used, 2);
    assert_eq!(
        pieces,
        vec![
            vec![Piece {
                slot: 0,
                offset: 0,
                len: 600
            }],
            vec![Piece {
                slot: 1,
                offset: 0,
                len: 600
            }],
            vec![Piece {
                slot: 1,
                offset: 768,
                len: 100
            }],
        ]
    );
}

#[test]
fn plan_of_empty_fields_uses_no_slot() {
    let (pieces, used) = plan(&[0, 0], 1024);
    assert_eq!(used, 0);
    assert!(pieces.iter().all(Vec::is_empty));
}

proptest! {
    #[test]
    fn plan_covers_every_byte_once(
        lens in proptest::collection::vec(0usize..5000, 0..8),
        slot_bytes in 256usize..4096,
    ) {
        let (pieces, used) = plan(&lens, slot_bytes);
        let mut taken: Vec<Vec<(usize, usize)>> = vec![Vec::new(); used];
        for (len, ps) in lens.iter().zip(&pieces) {
            prop_assert_eq!(ps.iter().map(|p| p.len).sum::<usize>(), *len);
            for p in ps {
                prop_assert!(p.len > 0);
                prop_assert!(p.offset + p.len <= slot_bytes);
                taken[p.slot].push((p.offset, p.offset + p.len));
            }
            if let Some(first) = ps.first() {
                prop_assert_eq!(first.offset % 256, 0);
            }
            if *len <= slot_bytes {
                prop_assert!(ps.len() <= 1, "a field that fits a slot is not split");
            }
        }
        for ranges in &mut taken {
            ranges.sort();
            for w in ranges.windows(2) {
                prop_assert!(w[0].1 <= w[1].0, "overlap {:?}", w);
            }
        }
    }
}
