//! Tests of field specs: ops, stacked shapes, byte ranges.

use std::borrow::Cow;

use super::*;

fn spec(op: Op) -> FieldSpec {
    let role = Role::HiddenState {
        layer: 1,
        point: CapturePoint::LayerInput,
    };
    FieldSpec::new("hidden.1", "x", role).with_op(op)
}

#[test]
fn parts_and_indexes_take_the_right_bytes() {
    // [1, 2, 6] of u8: rows 0..6 and 6..12; part 1 of 3 along the last axis.
    let src: Vec<u8> = (0..12).collect();
    let op = Op::Part {
        index: 1,
        of: 3,
        axis: -1,
    };
    let b = field_bytes(&spec(op), &[1, 2, 6], 1, Cow::Borrowed(&src)).unwrap();
    assert_eq!(&b[..], &[2, 3, 8, 9]);
    assert_eq!(field_shape(&spec(op), &[1, 2, 6]).unwrap(), vec![2, 2]);
    // [2, 3, 2] ([T, L, H]): layer 2 of each token.
    let op = Op::Index { index: 2, axis: -2 };
    let b = field_bytes(&spec(op), &[2, 3, 2], 1, Cow::Borrowed(&src)).unwrap();
    assert_eq!(&b[..], &[4, 5, 10, 11]);
    // [3, 2, 2] ([L, T, H]) along axis 0 stays borrowed.
    let op = Op::Index { index: 1, axis: 0 };
    let b = field_bytes(&spec(op), &[3, 2, 2], 1, Cow::Borrowed(&src)).unwrap();
    assert!(matches!(b, Cow::Borrowed(_)));
    assert_eq!(&b[..], &[4, 5, 6, 7]);
    let bad = Op::Part {
        index: 0,
        of: 5,
        axis: -1,
    };
    assert!(field_shape(&spec(bad), &[2, 6]).is_err());
}

#[test]
fn stacked_shapes() {
    let role = Role::HiddenStates {
        layers: vec![2, 30, 58],
        point: CapturePoint::LayerInput,
    };
    let spec = |stack| FieldSpec::new("aux", "x", role.clone()).stacked(stack);
    assert_eq!(
        field_shape(&spec(Stack::Concat), &[1, 5, 48]).unwrap(),
        [5, 3, 16]
    );
    assert!(field_shape(&spec(Stack::Concat), &[5, 47]).is_err());
    // Stacking a concatenation takes the source bytes as they are: no gather.
    assert_eq!(
        field_part(&spec(Stack::Concat), &[1, 5, 48], 2).unwrap(),
        Part::Range(0..480)
    );
    assert_eq!(
        field_shape(&spec(Stack::Axis), &[1, 5, 3, 16]).unwrap(),
        [5, 3, 16]
    );
    assert!(field_shape(&spec(Stack::Axis), &[5, 4, 16]).is_err());
    let many = spec(Stack::Sources(vec!["y".into(), "z".into()]));
    assert_eq!(field_shape(&many, &[1, 5, 16]).unwrap(), [5, 3, 16]);
    assert_eq!(many.sources().collect::<Vec<_>>(), ["x", "y", "z"]);
    let two = spec(Stack::Sources(vec!["y".into()]));
    assert!(field_shape(&two, &[5, 16]).is_err());
    // The first two of [T, 4, H], kept as a layer axis; a strided copy.
    let first = FieldSpec::new(
        "aux",
        "x",
        Role::HiddenStates {
            layers: vec![1, 2],
            point: CapturePoint::LayerInput,
        },
    )
    .with_op(Op::Range {
        start: 0,
        len: 2,
        axis: -2,
    })
    .stacked(Stack::Axis);
    assert_eq!(field_shape(&first, &[2, 4, 1]).unwrap(), [2, 2, 1]);
    let src: Vec<u8> = (0..8).collect();
    let b = field_bytes(&first, &[2, 4, 1], 1, Cow::Borrowed(&src)).unwrap();
    assert_eq!(&b[..], &[0, 1, 4, 5]);
    // Auto: axis when the second-last dim is k, else concat.
    let mut auto = spec(Stack::Auto);
    resolve_stack(&mut auto, &[5, 3, 16]).unwrap();
    assert_eq!(auto.stack, Stack::Axis);
    let mut auto = spec(Stack::Auto);
    resolve_stack(&mut auto, &[1, 5, 48]).unwrap();
    assert_eq!(auto.stack, Stack::Concat);
}

#[test]
fn the_final_norm_is_the_id_num_layers_names() {
    let defaults = [
        Some(CapturePoint::LayerInput),
        Some(CapturePoint::LayerInput),
        Some(CapturePoint::LayerInput),
        Some(CapturePoint::FinalNorm),
    ];
    let options = |layers: &[u32], num_layers| LayoutOptions {
        layers: layers.to_vec(),
        num_layers,
        ..LayoutOptions::default()
    };
    let roles = |o: &LayoutOptions| hidden_roles("specforge", 4, "states", o, &defaults);
    // Id 60 with --num-layers 61: 61 is the final norm, so 60 is not labelled so.
    let e = roles(&options(&[2, 30, 58, 60], Some(61))).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(
            &e,
            LayoutError::FinalNormId {
                id: 60,
                num_layers: Some(61),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(text.contains("--layers 2,30,58,61"), "{text}");
    assert!(
        text.contains("--point layer-input,layer-input,layer-input,layer-output"),
        "{text}"
    );
    // Without --num-layers: the message says where to give it.
    let text = roles(&options(&[2, 30, 58, 60], None))
        .unwrap_err()
        .to_string();
    assert!(text.contains("--num-layers 60"), "{text}");
    assert!(text.contains("unknown (0 layers)"), "{text}");
    // The id --num-layers names is the final norm.
    let ok = roles(&options(&[2, 30, 58, 61], Some(61))).unwrap();
    assert_eq!(
        ok[3].1,
        Role::HiddenState {
            layer: 61,
            point: CapturePoint::FinalNorm
        }
    );
    // An explicit --point says where every state was captured.
    let mut explicit = options(&[2, 30, 58, 60], None);
    explicit.points = vec![
        CapturePoint::LayerInput,
        CapturePoint::LayerInput,
        CapturePoint::LayerInput,
        CapturePoint::LayerOutput,
    ];
    let ok = roles(&explicit).unwrap();
    assert_eq!(
        ok[3].1,
        Role::HiddenState {
            layer: 60,
            point: CapturePoint::LayerOutput
        }
    );
    // With --num-layers, the final norm is that id and no other: id 60 labelled the final
    // norm of a 61-layer model was stored so.
    explicit.num_layers = Some(61);
    explicit.points[3] = CapturePoint::FinalNorm;
    let text = roles(&explicit).unwrap_err().to_string();
    assert!(
        text.contains("--layers 60 with --point final-norm")
            && text.contains("final-norm output at id 61, not 60"),
        "{text}"
    );
}

fn info(name: &str, dtype: DType, shape: &[u64]) -> TensorInfo {
    TensorInfo {
        name: name.into(),
        dtype,
        shape: shape.to_vec(),
    }
}

/// `[1, T, k·H]` with T = k reads as k layers on an axis (one token) and as k concatenated
/// layers (T tokens): the first file cannot tell, so `stack=` must.
#[test]
fn a_stacked_source_both_readings_fit_is_refused() {
    let options = LayoutOptions {
        fields: vec![FieldSpec::new(
            "aux",
            "aux",
            Role::HiddenStates {
                layers: vec![1, 2, 3],
                point: CapturePoint::LayerInput,
            },
        )],
        ..LayoutOptions::default()
    };
    let tensors = |shape: &[u64]| vec![info("aux", DType::F32, shape)];
    let e = specs_for(Preset::Generic, &tensors(&[1, 3, 12]), &options).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, LayoutError::AmbiguousStack { .. }), "{e:?}");
    assert!(
        text.contains("[T=1, 3 layers, H=12] (stack=axis)")
            && text.contains("[T=3, 3 layers, H=4] (stack=concat)"),
        "{text}"
    );
    // One reading alone is taken.
    let specs = specs_for(Preset::Generic, &tensors(&[1, 5, 12]), &options).unwrap();
    assert_eq!(specs[0].stack, Stack::Concat);
    let specs = specs_for(Preset::Generic, &tensors(&[5, 3, 12]), &options).unwrap();
    assert_eq!(specs[0].stack, Stack::Axis);
}

/// What no field reads: a preset refuses a floating tensor of two or more dims (fp8 too), and
/// one of a dtype hspack does not store only with --delete-source; the generic layout refuses
/// any tensor, and a part of a group, nothing reads, only with --delete-source.
#[test]
fn what_no_field_reads_is_refused_where_it_would_be_lost() {
    let ids = FieldSpec::new("input_ids", "ids", Role::TokenIds);
    let held = |extra: Vec<TensorInfo>, unsupported: Vec<UnsupportedInfo>| Held {
        tensors: [vec![info("ids", DType::I64, &[4])], extra].concat(),
        unsupported,
        values: Vec::new(),
        parts: Vec::new(),
    };
    let keep = LayoutOptions::default();
    let delete = LayoutOptions {
        delete_source: true,
        ..LayoutOptions::default()
    };
    let specs = std::slice::from_ref(&ids);
    let fp8 = held(vec![info("t", DType::F8E4M3FN, &[1, 4, 8])], vec![]);
    for options in [&keep, &delete] {
        let e = refuse_left_out(Preset::SpecForge, specs, &fp8, options).unwrap_err();
        assert!(
            matches!(&e, LayoutError::LeftOut { tensor, .. } if tensor == "t"),
            "{e:?}"
        );
    }
    let u16 = UnsupportedInfo {
        name: "u".into(),
        dtype: "torch.uint16".into(),
        shape: vec![1, 4, 8],
    };
    let odd = held(vec![], vec![u16]);
    assert!(refuse_left_out(Preset::SpecForge, specs, &odd, &keep).is_ok());
    let e = refuse_left_out(Preset::SpecForge, specs, &odd, &delete).unwrap_err();
    assert!(e.to_string().contains("torch.uint16"), "{e}");
    // A small integer tensor nothing reads is left out where the file stays, and refused by
    // every layout where --delete-source would delete it with the file.
    let small = held(vec![info("lens", DType::I64, &[2])], vec![]);
    for preset in [Preset::SpecForge, Preset::Generic] {
        assert!(refuse_left_out(preset, specs, &small, &keep).is_ok());
        let e = refuse_left_out(preset, specs, &small, &delete).unwrap_err();
        assert!(
            matches!(&e, LayoutError::Unread { tensor, .. } if tensor == "lens"),
            "{preset:?}: {e:?}"
        );
    }
    let besides = LayoutOptions {
        read_besides: vec!["lens".into()],
        ..delete.clone()
    };
    assert!(refuse_left_out(Preset::Generic, specs, &small, &besides).is_ok());
    // A value that is not a tensor goes with its file: refused with --delete-source, unless
    // read (a list of ids by its name) by --key-from.
    let with_values = Held {
        values: vec![
            ValueInfo {
                name: "rids.0".into(),
                kind: "a str",
            },
            ValueInfo {
                name: "__metadata__.prompt".into(),
                kind: "a metadata string",
            },
        ],
        ..held(vec![], vec![])
    };
    for preset in [Preset::SpecForge, Preset::Generic] {
        assert!(refuse_left_out(preset, specs, &with_values, &keep).is_ok());
        let e = refuse_left_out(preset, specs, &with_values, &delete).unwrap_err();
        assert!(
            matches!(&e, LayoutError::UnreadValue { name, .. } if name == "rids.0"),
            "{preset:?}: {e:?}"
        );
        let rids = LayoutOptions {
            read_besides: vec!["rids".into()],
            ..delete.clone()
        };
        let e = refuse_left_out(preset, specs, &with_values, &rids).unwrap_err();
        assert!(
            e.to_string()
                .contains("`__metadata__.prompt` (a metadata string)"),
            "{e}"
        );
    }
    // A part of a group nothing reads (here, one holding no tensor at all).
    let group = Held {
        parts: vec!["meta".into(), "L30".into()],
        tensors: vec![info("meta.ids", DType::I64, &[4])],
        unsupported: Vec::new(),
        values: Vec::new(),
    };
    let meta = FieldSpec::new("input_ids", "meta.ids", Role::TokenIds);
    let e = refuse_left_out(Preset::Generic, &[meta], &group, &delete).unwrap_err();
    assert!(
        matches!(&e, LayoutError::UnreadPart { part, .. } if part == "L30"),
        "{e:?}"
    );
}

/// A `layers=` list of the wrong length for a field concatenating layers on its last dim reads
/// the same bytes as layers of another width: refused where another hidden-state field shows
/// the model's width (it was stored as `[T, 2, 48]`, labelled layers 2 and 30).
#[test]
fn a_stacked_field_naming_too_few_layers_is_refused_by_the_models_width() {
    let stacked = |layers: Vec<u32>| {
        FieldSpec::new(
            "aux_hidden_state",
            "aux",
            Role::HiddenStates {
                layers,
                point: CapturePoint::LayerInput,
            },
        )
    };
    let last = FieldSpec::new(
        "hidden.61",
        "final",
        Role::HiddenState {
            layer: 61,
            point: CapturePoint::FinalNorm,
        },
    );
    let tensors = [
        info("aux", DType::BF16, &[5, 96]),
        info("final", DType::BF16, &[5, 32]),
    ];
    let schema_of = |layers: Vec<u32>| {
        let options = LayoutOptions {
            fields: vec![stacked(layers), last.clone()],
            num_layers: Some(61),
            ..LayoutOptions::default()
        };
        let specs = specs_for(Preset::Generic, &tensors, &options)?;
        derive_schema(Preset::Generic, &specs, &tensors, &options)
    };
    for layers in [vec![2, 30], vec![2, 30, 58, 59]] {
        let e = schema_of(layers).unwrap_err().to_string();
        assert!(
            e.contains("in field `aux_hidden_state`")
                && e.contains("32 wide, as field `hidden.61` holds them")
                && e.contains("its last dim, 96, holds 3 layers of 32"),
            "{e}"
        );
    }
    let e = schema_of(vec![2, 2, 30]).unwrap_err().to_string();
    assert!(
        e.contains("field `aux_hidden_state` names layer 2 more than once (2,2,30)"),
        "{e}"
    );
    let schema = schema_of(vec![2, 30, 58]).unwrap();
    assert_eq!(schema.fields[0].shape, vec![3, 32]);
    assert_eq!(schema.capture.unwrap().hidden_size, 32);
}
