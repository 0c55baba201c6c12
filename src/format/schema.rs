//! The schema: which fields every sample holds, and how the hidden states were captured.

use serde::{Deserialize, Serialize};

use super::{DType, FormatError};

/// Most fields a schema may declare.
pub const MAX_FIELDS: usize = 4096;
/// Longest field name, in bytes.
pub const MAX_FIELD_NAME: usize = 128;
/// The naming rule of fields, as [`check_field_name`] applies it.
pub const FIELD_NAME_RULE: &str =
    "field names must be 1..=128 bytes of ASCII letters, digits, `_`, `.` and `-`, not starting with `.` or `-`";
/// Most dimensions of a row.
pub const MAX_ROW_DIMS: usize = 8;
/// Largest row, in bytes (256 MiB).
pub const MAX_ROW_BYTES: u64 = 256 << 20;

/// Where in the model a hidden state was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CapturePoint {
    /// The input of decoder layer `layer`: HF `hidden_states[layer]`, SGLang
    /// `layers_to_capture` entry `layer` (there computed as `hidden_states + residual`).
    /// Layer 0's input is the embedding output.
    LayerInput,
    /// The output of decoder layer `layer`, before the next layer: HF `hidden_states[layer + 1]`
    /// for every layer but the last.
    LayerOutput,
    /// The state after the model's final norm: HF `hidden_states[-1]`, what the LM head reads.
    FinalNorm,
}

/// What a field means to a trainer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Role {
    /// Token ids, one per row.
    TokenIds,
    /// Loss mask, one per row; non-zero where the loss counts.
    LossMask,
    /// A hidden state of the captured model.
    HiddenState {
        /// Decoder layer number, counted from 0.
        layer: u32,
        /// Which side of the layer.
        point: CapturePoint,
    },
    /// Hidden states of several layers stacked in one field (manifest version 2): the row
    /// shape is `[k, H]` and entry `i` comes from layer `layers[i]`. A row read as `k·H`
    /// values is the layers concatenated on the last dim (EAGLE-3's `aux_hidden_state`), so
    /// a trainer reads it without copying; one layer alone is a strided view.
    HiddenStates {
        /// Decoder layer numbers, counted from 0, in entry order.
        layers: Vec<u32>,
        /// Which side of the layers.
        point: CapturePoint,
    },
    /// Anything else.
    Other,
}

/// Reads as what a person calls the point: `input`, `output`, `after the final norm`.
impl std::fmt::Display for CapturePoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CapturePoint::LayerInput => "input",
            CapturePoint::LayerOutput => "output",
            CapturePoint::FinalNorm => "after the final norm",
        })
    }
}

/// Reads as prose, for human output: `token ids`, `hidden state, layer 2 input`,
/// `hidden states, layers 2, 30, 58 input`.
impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::TokenIds => f.write_str("token ids"),
            Role::LossMask => f.write_str("loss mask"),
            Role::HiddenState { layer, point } => write!(f, "hidden state, layer {layer} {point}"),
            Role::HiddenStates { layers, point } => {
                let layers: Vec<String> = layers.iter().map(u32::to_string).collect();
                let noun = if layers.len() == 1 { "layer" } else { "layers" };
                write!(f, "hidden states, {noun} {} {point}", layers.join(", "))
            }
            Role::Other => f.write_str("other"),
        }
    }
}

/// One field of every sample: rows of `shape`-shaped elements of `dtype`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Field {
    /// Unique name, e.g. `input_ids` or `hidden.30`.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape of one row; `[]` for one element per row.
    pub shape: Vec<u64>,
    /// Meaning.
    pub role: Role,
    /// Stored quantized (lossy, manifest version 5): readers hand out `dtype` values decoded
    /// from the stored form. Absent for fields stored exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantized: Option<Quantized>,
}

/// How a quantized field is stored (FORMAT.md §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Quantized {
    /// The stored form.
    pub scheme: QuantScheme,
    /// Elements of a row that share one scale: consecutive, dividing the row; the hidden size
    /// (one scale per row and layer) unless chosen otherwise.
    pub group: u64,
}

/// Stored forms of a quantized field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum QuantScheme {
    /// OCP FP8 E4M3FN codes with one f32 scale per group (codec `fp8`).
    #[serde(rename = "fp8-e4m3fn")]
    Fp8E4m3fn,
}

impl QuantScheme {
    /// The name in schemas and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            QuantScheme::Fp8E4m3fn => "fp8-e4m3fn",
        }
    }
}

impl Field {
    /// A field.
    pub fn new(name: impl Into<String>, dtype: DType, shape: &[u64], role: Role) -> Self {
        Field {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            role,
            quantized: None,
        }
    }

    /// The field stored as FP8 with one scale per `group` elements (default: the last
    /// dimension of a row, the hidden size: one scale per row and layer).
    pub fn quantize_fp8(mut self, group: Option<u64>) -> Self {
        let group = group.unwrap_or_else(|| self.shape.last().copied().unwrap_or(1));
        self.quantized = Some(Quantized {
            scheme: QuantScheme::Fp8E4m3fn,
            group,
        });
        self
    }

    /// Elements sharing a scale, for a quantized field; the row for any other.
    pub fn group(&self) -> u64 {
        self.quantized.map_or(self.row_elems(), |q| q.group)
    }

    /// Elements per row.
    pub fn row_elems(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        self.row_elems() * self.dtype.size() as u64
    }
}

/// Checks the naming rule of fields ([`FIELD_NAME_RULE`]): 1..=128 bytes of ASCII letters,
/// digits, `_`, `.` and `-`, not starting with `.` or `-`. Such a name is a plain file name
/// on every platform (no folder part, not `.` or `..`, not an option), so exporters may use it
/// as one. Both the writers ([`Schema::validate`]) and manifest decoding apply it.
pub fn check_field_name(name: &str) -> Result<(), FormatError> {
    let problem = if name.is_empty() {
        "is empty".to_string()
    } else if name.len() > MAX_FIELD_NAME {
        format!("is {} bytes long", name.len())
    } else if let Some((at, c)) = name.char_indices().find(|&(at, c)| {
        let allowed = c.is_ascii_alphanumeric() || c == '_' || (at > 0 && (c == '.' || c == '-'));
        !allowed
    }) {
        if at == 0 && (c == '.' || c == '-') {
            format!("starts with {c:?}")
        } else {
            format!("holds {c:?} at byte {at}")
        }
    } else {
        return Ok(());
    };
    // A long name is cut for the message: it may be any size in a hostile manifest.
    let shown: String = name.chars().take(64).collect();
    let cut = if shown.len() < name.len() { "..." } else { "" };
    Err(FormatError::Json {
        structure: "schema",
        detail: format!(
            "field name {shown:?}{cut} {problem}, but {FIELD_NAME_RULE}: rename the field"
        ),
    })
}

/// The rules of a quantized field: a float field (f16, bf16, f32) that is not token ids or a
/// loss mask, its groups of at least one element dividing its row.
fn check_quantized(f: &Field, q: Quantized) -> Result<(), FormatError> {
    let problem = if !super::fp8::quantizable(f.dtype) {
        format!(
            "its dtype is {}, and only f16, bf16 and f32 fields can be",
            f.dtype
        )
    } else if matches!(f.role, Role::TokenIds | Role::LossMask) {
        format!("it holds {}, which must stay exact", f.role)
    } else if q.group == 0 || !f.row_elems().is_multiple_of(q.group) {
        format!(
            "its scale group of {} elements does not divide its rows of {} elements",
            q.group,
            f.row_elems()
        )
    } else {
        return Ok(());
    };
    Err(FormatError::Json {
        structure: "schema",
        detail: format!(
            "field `{}` cannot be stored as {}: {problem}",
            f.name,
            q.scheme.name()
        ),
    })
}

/// How the hidden states were captured: enough to know what the numbers mean.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CaptureInfo {
    /// Model name or path, e.g. `moonshotai/Kimi-K2.5`.
    pub model: String,
    /// Model revision (commit), where known.
    #[serde(default)]
    pub revision: Option<String>,
    /// BLAKE3 of the model's config.json, where known.
    #[serde(default)]
    pub config_hash: Option<String>,
    /// Decoder layers of the model.
    pub num_layers: u32,
    /// Hidden size.
    pub hidden_size: u64,
    /// DType the model ran in.
    pub dtype: DType,
    /// Tensor-parallel size of the run that captured.
    #[serde(default = "one")]
    pub tp_size: u32,
    /// Tool that captured, e.g. `hspack.capture.sglang` or `hspack convert --layout specforge`.
    pub tool: String,
    /// Version of that tool.
    pub tool_version: String,
}

fn one() -> u32 {
    1
}

/// The fields of every sample and the capture that produced them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Schema {
    /// Fields, in storage order; a field's number is its position.
    pub fields: Vec<Field>,
    /// Capture metadata.
    #[serde(default)]
    pub capture: Option<CaptureInfo>,
}

impl Schema {
    /// A schema without capture metadata.
    pub fn new(fields: Vec<Field>) -> Self {
        Schema {
            fields,
            capture: None,
        }
    }

    /// The number of the field named `name`.
    pub fn field_index(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    /// The field with number `index`.
    pub fn field(&self, index: usize) -> Option<&Field> {
        self.fields.get(index)
    }

    /// The manifest version this schema needs: 5 when a field is quantized, else 2 when a
    /// field stacks layers ([`Role::HiddenStates`]), else 1, so readers that predate either
    /// refuse it by version.
    pub fn manifest_version(&self) -> u16 {
        self.version_need().0
    }

    /// What makes the schema need [`Schema::manifest_version`], for errors.
    pub fn version_need(&self) -> (u16, &'static str) {
        if self.fields.iter().any(|f| f.quantized.is_some()) {
            (
                super::manifest::QUANTIZED_VERSION,
                "the schema has a quantized field",
            )
        } else if self
            .fields
            .iter()
            .any(|f| matches!(f.role, Role::HiddenStates { .. }))
        {
            (2, "the schema stacks layers in one field")
        } else {
            (1, "")
        }
    }

    /// The names of the fields stored quantized (lossy), in schema order.
    pub fn quantized_fields(&self) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|f| f.quantized.is_some())
            .map(|f| f.name.as_str())
            .collect()
    }

    /// The field holding the loss mask, if any.
    pub fn loss_mask_field(&self) -> Option<usize> {
        self.fields.iter().position(|f| f.role == Role::LossMask)
    }

    /// [`Schema::validate`] of a schema a caller gives (a writer's): what is wrong said of
    /// the schema, not of a manifest's bytes.
    pub fn validate_given(&self) -> Result<(), String> {
        self.validate().map_err(|e| match e {
            FormatError::Invalid {
                what, value, rule, ..
            } => format!("the schema given is not valid: {what} is {value}, but must be {rule}"),
            FormatError::Json { detail, .. } => format!("the schema given is not valid: {detail}"),
            e => e.to_string(),
        })
    }

    /// Checks the rules of the format: 1..=4096 fields, unique names that pass
    /// [`check_field_name`], rows of 1 byte ..= 256 MiB, at most 8 row dimensions.
    pub fn validate(&self) -> Result<(), FormatError> {
        const S: &str = "schema";
        let invalid = |what, value: u64, rule: &str| FormatError::Invalid {
            structure: S,
            what,
            value,
            rule: rule.to_string(),
        };
        if self.fields.is_empty() || self.fields.len() > MAX_FIELDS {
            return Err(invalid(
                "field count",
                self.fields.len() as u64,
                "in 1..=4096",
            ));
        }
        for (i, f) in self.fields.iter().enumerate() {
            check_field_name(&f.name)?;
            if self.fields[..i].iter().any(|g| g.name == f.name) {
                return Err(FormatError::Json {
                    structure: S,
                    detail: format!(
                        "field name `{}` appears twice; names must be unique",
                        f.name
                    ),
                });
            }
            if f.shape.len() > MAX_ROW_DIMS {
                return Err(invalid("row dimensions", f.shape.len() as u64, "at most 8"));
            }
            let bytes = f
                .shape
                .iter()
                .try_fold(f.dtype.size() as u64, |acc, &d| acc.checked_mul(d))
                .unwrap_or(u64::MAX);
            if bytes == 0 || bytes > MAX_ROW_BYTES {
                return Err(invalid(
                    "row bytes",
                    bytes,
                    "in 1..=256 MiB (no zero dimensions)",
                ));
            }
            if let Some(q) = f.quantized {
                check_quantized(f, q)?;
            }
            if let Role::HiddenStates { layers, .. } = &f.role {
                if f.shape.len() != 2 || f.shape[0] != layers.len() as u64 {
                    return Err(FormatError::Json {
                        structure: S,
                        detail: format!(
                            "field `{}` stacks {} layers, so its row shape must be [{}, hidden size], not {:?}",
                            f.name,
                            layers.len(),
                            layers.len(),
                            f.shape
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The canonical JSON of the schema: what [`Schema::hash`] covers.
    pub fn canonical_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a schema always serializes")
    }

    /// BLAKE3 of the canonical JSON; shard headers carry it.
    pub fn hash(&self) -> [u8; 32] {
        *blake3::hash(&self.canonical_json()).as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_bad_schemas() {
        let ok = Field::new("x", DType::BF16, &[4], Role::Other);
        assert!(Schema::new(vec![ok.clone()]).validate().is_ok());
        assert!(Schema::new(vec![]).validate().is_err());
        assert!(Schema::new(vec![ok.clone(), ok.clone()])
            .validate()
            .is_err());
        assert!(
            Schema::new(vec![Field::new("", DType::U8, &[], Role::Other)])
                .validate()
                .is_err()
        );
        assert!(
            Schema::new(vec![Field::new("z", DType::U8, &[0], Role::Other)])
                .validate()
                .is_err()
        );
        assert!(Schema::new(vec![Field::new(
            "h",
            DType::F64,
            &[u64::MAX, 2],
            Role::Other
        )])
        .validate()
        .is_err());
    }

    fn refusal(name: &str) -> String {
        match check_field_name(name) {
            Err(FormatError::Json { structure, detail }) => {
                assert_eq!(structure, "schema");
                assert!(detail.contains(FIELD_NAME_RULE), "{detail}");
                detail
            }
            other => panic!("{name:?}: expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn field_names_in_use_pass_the_rule() {
        let long = "a".repeat(MAX_FIELD_NAME);
        for name in [
            "input_ids",
            "loss_mask",
            "aux_hidden_state",
            "hidden_states",
            "hidden.61",
            "aux.0",
            "f8e4m3fn",
            "x",
            "0",
            "_private",
            "layer-2",
            "HIDDEN.2",
            long.as_str(),
        ] {
            assert!(check_field_name(name).is_ok(), "{name:?}");
        }
        assert!(FIELD_NAME_RULE.contains(&format!("1..={MAX_FIELD_NAME} bytes")));
    }

    #[test]
    fn field_name_empty_is_refused() {
        assert!(refusal("").contains("\"\" is empty"));
    }

    #[test]
    fn field_name_too_long_is_refused_and_cut_in_the_message() {
        let e = refusal(&"a".repeat(MAX_FIELD_NAME + 1));
        assert!(e.contains("is 129 bytes long"), "{e}");
        let e = refusal(&"b".repeat(1 << 20));
        assert!(e.len() < 1000, "{e}");
        assert!(e.contains(&format!("{:?}...", "b".repeat(64))), "{e}");
    }

    #[test]
    fn field_name_with_a_folder_part_is_refused() {
        let e = refusal("../../PWN");
        assert!(
            e.contains("field name \"../../PWN\" starts with '.'"),
            "{e}"
        );
        let e = refusal("/tmp/x/PWN");
        assert!(e.contains("holds '/' at byte 0"), "{e}");
        let e = refusal("a/b");
        assert!(e.contains("holds '/' at byte 1"), "{e}");
        let e = refusal("a\\b");
        assert!(e.contains("holds '\\\\' at byte 1"), "{e}");
        let e = refusal("C:x");
        assert!(e.contains("holds ':' at byte 1"), "{e}");
    }

    #[test]
    fn field_name_starting_with_a_dot_or_dash_is_refused() {
        for (name, c) in [
            (".", "'.'"),
            ("..", "'.'"),
            (".hidden", "'.'"),
            ("-rf", "'-'"),
        ] {
            let e = refusal(name);
            assert!(e.contains(&format!("starts with {c}")), "{e}");
        }
    }

    #[test]
    fn field_name_with_other_characters_is_refused() {
        for (name, what) in [
            ("a b", "' ' at byte 1"),
            ("a\0b", "'\\0' at byte 1"),
            ("a\nb", "'\\n' at byte 1"),
            ("h\u{e9}", "'\u{e9}' at byte 1"),
            ("x*", "'*' at byte 1"),
        ] {
            let e = refusal(name);
            assert!(e.contains(&format!("holds {what}")), "{name:?}: {e}");
        }
    }

    #[test]
    fn validate_applies_the_naming_rule() {
        let s = Schema::new(vec![
            Field::new("input_ids", DType::I32, &[], Role::TokenIds),
            Field::new("../x", DType::BF16, &[4], Role::Other),
        ]);
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("\"../x\""), "{e}");
        assert!(e.contains(FIELD_NAME_RULE), "{e}");
    }

    #[test]
    fn stacked_layers_need_a_matching_row_shape_and_version_2() {
        let role = Role::HiddenStates {
            layers: vec![2, 30, 58],
            point: CapturePoint::LayerInput,
        };
        let ok = Schema::new(vec![Field::new("aux", DType::BF16, &[3, 8], role.clone())]);
        assert!(ok.validate().is_ok());
        assert_eq!(ok.manifest_version(), 2);
        let json = String::from_utf8(ok.canonical_json()).unwrap();
        assert!(
            json.contains(r#"{"kind":"hidden_states","layers":[2,30,58],"point":"layer_input"}"#),
            "{json}"
        );
        for shape in [&[24][..], &[2, 8], &[3, 8, 1]] {
            let bad = Schema::new(vec![Field::new("aux", DType::BF16, shape, role.clone())]);
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains("`aux` stacks 3 layers"), "{e}");
        }
        let plain = Schema::new(vec![Field::new("x", DType::BF16, &[4], Role::Other)]);
        assert_eq!(plain.manifest_version(), 1);
    }

    #[test]
    fn hash_changes_with_any_field() {
        let a = Schema::new(vec![Field::new("x", DType::BF16, &[4], Role::Other)]);
        let mut b = a.clone();
        b.fields[0].dtype = DType::F16;
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn roles_read_as_prose() {
        let hidden = |layer, point| Role::HiddenState { layer, point };
        assert_eq!(Role::TokenIds.to_string(), "token ids");
        assert_eq!(Role::LossMask.to_string(), "loss mask");
        assert_eq!(
            hidden(2, CapturePoint::LayerInput).to_string(),
            "hidden state, layer 2 input"
        );
        assert_eq!(
            hidden(60, CapturePoint::FinalNorm).to_string(),
            "hidden state, layer 60 after the final norm"
        );
        let stacked = Role::HiddenStates {
            layers: vec![2, 30, 58],
            point: CapturePoint::LayerOutput,
        };
        assert_eq!(
            stacked.to_string(),
            "hidden states, layers 2, 30, 58 output"
        );
        assert_eq!(Role::Other.to_string(), "other");
    }
}
