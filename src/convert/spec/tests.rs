use std::path::Path;

use super::*;
use crate::format::Role;

fn flags() -> ConvertSpec {
    ConvertSpec {
        fields: vec![
            FieldArg::Flag("input_ids=ids".into()),
            FieldArg::Flag("aux=aux.0+aux.1+aux.2:layers=2,30,58:point=layer-output".into()),
            FieldArg::Flag("hidden.61=final".into()),
        ],
        split_by: Some("lengths:lens".parse().unwrap()),
        num_layers: Some(61),
        model: Some("org/model".into()),
        ..ConvertSpec::new("src", "dst", Preset::Generic)
    }
}

const MAPPING: &str = r#"{
  "fields": [
    "input_ids=ids",
    {"name": "aux", "source": ["aux.0", "aux.1", "aux.2"], "layers": [2, 30, 58],
     "point": "layer-output"},
    {"name": "hidden.61", "source": "final"}
  ],
  "split_by": {"lengths": "lens"},
  "num_layers": 61,
  "model": "org/model"
}"#;

fn from_mapping() -> ConvertSpec {
    let mut spec = ConvertSpec::new("src", "dst", Preset::Generic);
    let m = Mapping::parse(MAPPING, Path::new("m.json")).unwrap();
    spec.merge_mapping(m, Path::new("m.json")).unwrap();
    spec
}

#[test]
fn flags_and_a_mapping_file_give_the_same_job() {
    let (a, b) = (
        flags().resolve().unwrap(),
        from_mapping().resolve().unwrap(),
    );
    assert_eq!(a.layout.fields, b.layout.fields);
    assert_eq!(a.layout.num_layers, b.layout.num_layers);
    assert_eq!(a.layout.model, b.layout.model);
    assert_eq!(a.split_by, b.split_by);
    assert_eq!(a.split_by, Some(SplitBy::Lengths("lens".into())));
    let roles: Vec<&Role> = a.layout.fields.iter().map(|f| &f.role).collect();
    assert_eq!(
        roles,
        [
            &Role::TokenIds,
            &Role::HiddenStates {
                layers: vec![2, 30, 58],
                point: CapturePoint::LayerOutput
            },
            // The id equal to num_layers is the final-norm output.
            &Role::HiddenState {
                layer: 61,
                point: CapturePoint::FinalNorm
            },
        ]
    );
    // Everything but the fields' spelling is the same spec.
    let (mut a, b) = (flags(), from_mapping());
    a.fields = b.fields.clone();
    assert_eq!(a, b);
}

#[test]
fn a_spec_round_trips_through_json_with_defaults_filled() {
    let spec = flags();
    let json = serde_json::to_string(&spec).unwrap();
    assert_eq!(serde_json::from_str::<ConvertSpec>(&json).unwrap(), spec);
    let min: ConvertSpec =
        serde_json::from_str(r#"{"src": "src", "dst": "dst", "layout": "specforge"}"#).unwrap();
    assert_eq!(min, ConvertSpec::new("src", "dst", Preset::SpecForge));
    let o = min.resolve().unwrap();
    assert_eq!(o.write.shard_bytes, 2048 << 20);
    assert!(o.write.durable);
    let e = serde_json::from_str::<ConvertSpec>(
        r#"{"src": "s", "dst": "d", "layout": "generic", "trim": "mask"}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("`trim`"), "{e}");
}

#[test]
fn a_bad_spec_is_refused_naming_the_option() {
    let base = || ConvertSpec::new("src", "dst", Preset::Generic);
    let cases: Vec<(ConvertSpec, &str, &str)> = vec![
        (
            ConvertSpec {
                jobs: Some(usize::MAX),
                ..base()
            },
            "jobs",
            "(`jobs` in a mapping file): give 1 to 4096",
        ),
        (
            ConvertSpec {
                jobs: Some(0),
                ..base()
            },
            "jobs",
            "--jobs 0 (`jobs` in a mapping file): give 1 to 4096",
        ),
        (
            ConvertSpec {
                shard_mib: 0,
                ..base()
            },
            "shard_mib",
            "--shard-mib 0 (`shard_mib` in a mapping file): give 1 or more",
        ),
        (
            ConvertSpec {
                shard_mib: u64::MAX >> 19,
                ..base()
            },
            "shard_mib",
            "--shard-mib 35184372088831 (`shard_mib` in a mapping file): must be at most 1048576",
        ),
        (
            ConvertSpec {
                fields: vec![FieldArg::Flag("h=h:layer=4294967298".into())],
                ..base()
            },
            "fields",
            "--field h=h:layer=4294967298: layer `4294967298` is not a layer id",
        ),
        (
            ConvertSpec {
                split_by_file: Some("lens.pt".into()),
                split_by: Some(SplitBy::Lengths(String::new())),
                ..base()
            },
            "split_by_file",
            "--split-by-file takes a file name with {stem}",
        ),
        (
            ConvertSpec {
                split_by_file: Some("{stem}.lens.pt".into()),
                ..base()
            },
            "split_by_file",
            "needs --split-by",
        ),
        (
            ConvertSpec {
                group_by: Some("{key}_{part}_{key}.pt".into()),
                ..base()
            },
            "group_by",
            "--group-by \"{key}_{part}_{key}.pt\": a pattern names {key} once and {part} once (here {key}: 2, {part}: 1)",
        ),
        (
            ConvertSpec {
                fields: (0..4097)
                    .map(|i| FieldArg::Flag(format!("f{i}=t{i}")))
                    .collect(),
                ..base()
            },
            "fields",
            "--field 4097 (`fields` in a mapping file): must be at most 4096 (a dataset's schema",
        ),
        (
            ConvertSpec {
                group_by: Some("{key}.pt".into()),
                ..base()
            },
            "group_by",
            "(here {key}: 1, {part}: 0), {key} the sample and {part} the file within it",
        ),
        (
            ConvertSpec {
                delete_source: true,
                fsync: false,
                ..base()
            },
            "delete_source",
            "--delete-source needs durable commits",
        ),
        (
            ConvertSpec {
                delete_source: true,
                quantize: Some("fp8".into()),
                ..base()
            },
            "delete_source",
            "--delete-source with --quantize fp8: the dataset holds those fields as FP8",
        ),
        (
            ConvertSpec {
                delete_source: true,
                trim_padding: Some(Trim::LossMask),
                ..base()
            },
            "delete_source",
            "--delete-source with --trim-padding mask: the dataset leaves out the rows",
        ),
        (
            ConvertSpec {
                delete_lossy_source: true,
                quantize: Some("fp8".into()),
                ..base()
            },
            "delete_lossy_source",
            "--delete-lossy-source goes with --delete-source",
        ),
        (
            ConvertSpec {
                codec: "lz4".into(),
                ..base()
            },
            "codec",
            "unknown codec lz4",
        ),
        (
            ConvertSpec {
                points: vec!["middle".into()],
                ..base()
            },
            "points",
            "unknown capture point `middle`",
        ),
        (
            ConvertSpec {
                fields: vec![FieldArg::Flag("x=t:part=1/3:index=0".into())],
                ..base()
            },
            "fields",
            "--field x=t:part=1/3:index=0: give part or index, not both",
        ),
        (
            ConvertSpec {
                fields: vec![FieldArg::Flag("x=t".into())],
                ..ConvertSpec::new("src", "dst", Preset::Eagle)
            },
            "fields",
            "needs --layout generic",
        ),
    ];
    for (spec, option, message) in cases {
        let e = spec.check().unwrap_err();
        assert_eq!(e.option(), option, "{e}");
        assert!(e.to_string().contains(message), "{e}");
    }
    // Said on purpose, lossy options and --delete-source go together.
    let lossy = ConvertSpec {
        delete_source: true,
        delete_lossy_source: true,
        quantize: Some("fp8".into()),
        trim_padding: Some(Trim::TokenIds { pad: 0 }),
        ..base()
    };
    assert!(lossy.check().is_ok());
    assert!("lengths".parse::<SplitBy>().is_ok());
    let e = "offsets:t".parse::<SplitBy>().unwrap_err();
    assert_eq!(e.option(), "split_by");
    assert_eq!("ids:7".parse::<Trim>().unwrap(), Trim::TokenIds { pad: 7 });
    assert_eq!(
        "ids:x".parse::<Trim>().unwrap_err().option(),
        "trim_padding"
    );
}

#[test]
fn a_field_object_is_named_in_field_syntax() {
    let m = Mapping::parse(
        r#"{"fields": [{"name": "aux", "source": ["a", "b"], "layers": [1, 2, 3]}]}"#,
        Path::new("m.json"),
    )
    .unwrap();
    let mut spec = ConvertSpec::new("src", "dst", Preset::Generic);
    spec.merge_mapping(m, Path::new("m.json")).unwrap();
    let e = spec.check().unwrap_err();
    assert!(
        matches!(
            &e,
            SpecError::Field {
                problem: FieldProblem::SourceCount {
                    sources: 2,
                    layers: 3
                },
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "--field aux=a+b:layers=1,2,3: 2 source tensors for 3 layers: give one tensor per \
         layer, or one holding them all"
    );
}

#[test]
fn a_mapping_key_given_as_a_flag_too_is_refused() {
    let mut spec = flags();
    let m = Mapping::parse(MAPPING, Path::new("m.json")).unwrap();
    let e = spec.merge_mapping(m, Path::new("m.json")).unwrap_err();
    assert_eq!(e.option(), "fields");
    assert_eq!(
        e.to_string(),
        "m.json: the mapping file sets `fields` and so does --field: give it in one place"
    );
    // A field object's mistake is said by its key (it was "data did not match any variant
    // of untagged enum FieldArg").
    for (fields, said) in [
        (
            r#"[{"name": "h", "sourc": "x"}]"#,
            "a field object: unknown field `sourc`",
        ),
        (
            r#"[{"source": "x"}]"#,
            "a field object: missing field `name`",
        ),
        (
            r#"[7]"#,
            "a field is a string (\"NAME=SRC[:OPTION]...\") or an object",
        ),
    ] {
        let text = format!(r#"{{"fields": {fields}}}"#);
        let e = Mapping::parse(&text, Path::new("m.json")).unwrap_err();
        assert!(e.to_string().contains(said), "{e}");
    }
    let e = Mapping::parse(r#"{"feilds": []}"#, Path::new("m.json")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("m.json: not a mapping file: unknown field `feilds`"),
        "{e}"
    );
}

/// Under the generic layout a `--point` list (one point per preset `--layers` id) is refused,
/// not dropped for layer-input; with `--num-layers`, each hidden field's id must fit its
/// point (ids below it are layers, it is the final norm's output).
#[test]
fn generic_fields_refuse_a_point_list_and_ids_that_do_not_fit_the_model() {
    let resolve = |field: &str, points: &[CapturePoint], n| {
        FieldArg::Flag(field.into())
            .resolve(points, n)
            .map_err(|e| e.to_string())
    };
    let two = [CapturePoint::LayerOutput, CapturePoint::FinalNorm];
    let e = resolve("hidden.2=a", &two, Some(61)).unwrap_err();
    assert!(e.contains("--point has 2 entries"), "{e}");
    let e = resolve("hidden.61=b", &[CapturePoint::LayerInput], Some(61)).unwrap_err();
    assert!(e.contains("layer 61 at point layer-input"), "{e}");
    let e = resolve("hidden.90=b:point=layer-output", &[], Some(61)).unwrap_err();
    assert!(e.contains("layer 90 at point layer-output"), "{e}");
    let e = resolve("hidden.60=b:point=final-norm", &[], Some(61)).unwrap_err();
    assert!(e.contains("final-norm output at id 61, not 60"), "{e}");
    let e = resolve("aux=a:layers=2,30,61", &[], Some(61)).unwrap_err();
    assert!(e.contains("layer 61 at point layer-input"), "{e}");
    // What fits: the final norm at 61 (the default for that id), layers below it.
    let ok = resolve("hidden.61=b", &[], Some(61)).unwrap();
    assert_eq!(
        ok.role,
        Role::HiddenState {
            layer: 61,
            point: CapturePoint::FinalNorm
        }
    );
    assert!(resolve("hidden.60=b:point=layer-output", &[], Some(61)).is_ok());
    assert!(resolve("hidden.90=b", &[], None).is_ok());
}
