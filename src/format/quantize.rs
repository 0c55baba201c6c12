//! Which fields a writer stores quantized: the option every face takes (`--quantize`,
//! `quantize=`), parsed and applied to a schema in one place.

use super::schema::{QuantScheme, Role, Schema};

/// `fp8` (every hidden-state field) or `fp8:NAME,NAME` (those fields): the fields to store as
/// FP8 with a scale per row and layer. Token ids, loss masks and fields not named stay exact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantizeSpec {
    /// The stored form.
    pub scheme: QuantScheme,
    /// The fields named; `None` for every hidden-state field.
    pub fields: Option<Vec<String>>,
}

/// How the option is written, for errors.
pub const QUANTIZE_SYNTAX: &str =
    "`fp8` (every hidden-state field) or `fp8:NAME,NAME` (the fields named)";

impl std::str::FromStr for QuantizeSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (scheme, fields) = match s.split_once(':') {
            Some((scheme, names)) => (scheme, Some(names)),
            None => (s, None),
        };
        if scheme != "fp8" {
            return Err(format!(
                "{s:?}: the one scheme is fp8; write {QUANTIZE_SYNTAX}"
            ));
        }
        let fields = match fields {
            None => None,
            Some(names) => {
                let names: Vec<String> = names
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(String::from)
                    .collect();
                if names.is_empty() {
                    return Err(format!("{s:?} names no field; write {QUANTIZE_SYNTAX}"));
                }
                Some(names)
            }
        };
        Ok(QuantizeSpec {
            scheme: QuantScheme::Fp8E4m3fn,
            fields,
        })
    }
}

impl QuantizeSpec {
    /// Marks the fields of `schema` this spec names quantized, each with one scale per row
    /// and layer (its last dimension). Returns their names, or why it cannot: a field named
    /// that the schema lacks or that cannot be quantized, or no hidden-state field at all.
    pub fn apply(&self, schema: &mut Schema) -> Result<Vec<String>, String> {
        let chosen: Vec<usize> = match &self.fields {
            Some(names) => names
                .iter()
                .map(|n| {
                    schema.field_index(n).ok_or_else(|| {
                        let have: Vec<&str> =
                            schema.fields.iter().map(|f| f.name.as_str()).collect();
                        format!(
                            "the schema has no field `{n}` to quantize; it has {}",
                            have.join(", ")
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
            None => (0..schema.fields.len())
                .filter(|&i| {
                    matches!(
                        schema.fields[i].role,
                        Role::HiddenState { .. } | Role::HiddenStates { .. }
                    )
                })
                .collect(),
        };
        if chosen.is_empty() {
            return Err(
                "the schema has no hidden-state field to quantize: name the fields, `fp8:NAME`"
                    .into(),
            );
        }
        for &i in &chosen {
            let f = schema.fields[i].clone();
            schema.fields[i] = match self.scheme {
                QuantScheme::Fp8E4m3fn => f.quantize_fp8(None),
            };
        }
        schema.validate_given()?;
        Ok(chosen
            .into_iter()
            .map(|i| schema.fields[i].name.clone())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{CapturePoint, DType, Field};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("input_ids", DType::I32, &[], Role::TokenIds),
            Field::new("loss_mask", DType::U8, &[], Role::LossMask),
            Field::new(
                "aux",
                DType::BF16,
                &[3, 8],
                Role::HiddenStates {
                    layers: vec![1, 2, 3],
                    point: CapturePoint::LayerInput,
                },
            ),
            Field::new("h", DType::BF16, &[8], Role::Other),
        ])
    }

    #[test]
    fn fp8_alone_quantizes_the_hidden_states_with_a_scale_per_layer() {
        let mut s = schema();
        let done = "fp8"
            .parse::<QuantizeSpec>()
            .unwrap()
            .apply(&mut s)
            .unwrap();
        assert_eq!(done, ["aux"]);
        assert_eq!(s.fields[2].group(), 8);
        assert!(s
            .fields
            .iter()
            .filter(|f| f.name != "aux")
            .all(|f| f.quantized.is_none()));
        assert_eq!(s.manifest_version(), 5);
    }

    #[test]
    fn named_fields_are_quantized_and_bad_names_refused() {
        let mut s = schema();
        let spec: QuantizeSpec = "fp8:h, aux".parse().unwrap();
        assert_eq!(spec.apply(&mut s).unwrap(), ["h", "aux"]);
        let err = "fp8:nope"
            .parse::<QuantizeSpec>()
            .unwrap()
            .apply(&mut schema());
        assert!(err.unwrap_err().contains("no field `nope`"));
        let err = "fp8:input_ids"
            .parse::<QuantizeSpec>()
            .unwrap()
            .apply(&mut schema());
        assert!(err.unwrap_err().contains("only f16, bf16 and f32"));
        assert!("int4".parse::<QuantizeSpec>().is_err());
        assert!("fp8:".parse::<QuantizeSpec>().is_err());
        let mut plain = Schema::new(vec![Field::new("h", DType::BF16, &[8], Role::Other)]);
        let err = "fp8".parse::<QuantizeSpec>().unwrap().apply(&mut plain);
        assert!(err.unwrap_err().contains("no hidden-state field"));
    }
}
