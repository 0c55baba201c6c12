//! The generic mapping for ad-hoc dumps: fields named on the command line.
//!
//! `--field NAME=SRC[:OPTION]...` maps source tensor `SRC` (a flattened name: `hidden`,
//! `aux.0` for a list entry, `layer2.hidden` for a grouped file; see `--group-by`) to field
//! `NAME`. Options:
//!
//! - `part=K/N`: part K (from 0) of N equal parts along the axis (default `-1`): `[T, 3H]`
//!   holds three layers;
//! - `index=K`: entry K along the axis (default `-2`), which is removed: `[T, L, H]` holds L
//!   layers;
//! - `axis=A`: the axis for `part` or `index`, negative from the end;
//! - `role=ids|mask|hidden|other`: by default `input_ids` holds token ids, `loss_mask` the loss
//!   mask, `hidden.{l}` the hidden state of layer id `l`, anything else `other`;
//! - `layer=L`: the layer id of a hidden state not named `hidden.{l}`;
//! - `layers=L0,L1,...`: a stacked field (role `hidden_states`, row `[k, H]`) of these k layers,
//!   from a `[T, k·H]` tensor (the layers concatenated on the last dim, e.g. EAGLE-3's
//!   `aux_hidden_state`) or a `[T, k, H]` one, stored without a copy; or from k tensors of one
//!   layer each named `SRC1+SRC2+...` (e.g. `aux.0+aux.1+aux.2`, or `layer_2+layer_30+layer_58`
//!   with `--group-by`), interleaved per token;
//! - `stack=concat|axis`: how a single source holds the k layers, when the first file's shape
//!   does not tell (a `[1, k, k·H]` tensor); by default `axis` when its second-last dim is k;
//! - `point=layer-input|layer-output|final-norm`: where the state was taken; by default the
//!   `--point` given for all, else final-norm for the id equal to `--num-layers`, else
//!   layer-input (the HF `hidden_states[i]` convention);
//! - `optional`: leave the field out when the first file lacks the tensor.
//!
//! `--mapping FILE.json` holds the same in one file ([`Mapping`]); a key there and its flag on
//! the command line together are an error. Fields are `--field` strings or objects:
//!
//! ```json
//! {
//!   "fields": [
//!     "input_ids=ids",
//!     {"name": "aux_hidden_state", "source": ["layer_2", "layer_30", "layer_58"],
//!      "layers": [2, 30, 58], "point": "layer-input"},
//!     {"name": "hidden.61", "source": "final", "point": "final-norm"}
//!   ],
//!   "group_by": "{key}/{part}.pt",
//!   "num_layers": 61,
//!   "model": "org/model"
//! }
//! ```
//!
//! Other keys: `split_by` (`{"lengths": TENSOR}` or `{"cu_seqlens": TENSOR}`),
//! `split_by_file`, `key_from`, `layers`, `points` (a list of capture points).

use std::path::Path;

use crate::format::{CapturePoint, Role};

use super::super::layout::{list_tensors, FieldSpec, LayoutError, LayoutOptions, Op, Stack};
use super::super::TensorInfo;

/// The user's fields; refuses an empty mapping, listing the tensors of the first file.
pub fn specs(
    tensors: &[TensorInfo],
    options: &LayoutOptions,
) -> Result<Vec<FieldSpec>, LayoutError> {
    if options.fields.is_empty() {
        return Err(LayoutError::BadOption(format!(
            "--layout generic needs --field NAME=TENSOR for each field; the first file has: {}",
            list_tensors(tensors)
        )));
    }
    Ok(options.fields.clone())
}

/// Parses `layer-input`, `layer-output` or `final-norm`.
pub fn parse_point(s: &str) -> Result<CapturePoint, LayoutError> {
    match s.replace('_', "-").as_str() {
        "layer-input" | "input" => Ok(CapturePoint::LayerInput),
        "layer-output" | "output" => Ok(CapturePoint::LayerOutput),
        "final-norm" | "final" => Ok(CapturePoint::FinalNorm),
        _ => Err(LayoutError::BadOption(format!(
            "unknown capture point `{s}`: use layer-input, layer-output or final-norm"
        ))),
    }
}

/// Parses one `--field` argument; `options` supplies default points.
pub fn parse_field(arg: &str, options: &LayoutOptions) -> Result<FieldSpec, LayoutError> {
    let bad = |detail: String| LayoutError::BadOption(format!("--field {arg}: {detail}"));
    let (name, rest) = arg
        .split_once('=')
        .ok_or_else(|| bad("expected NAME=TENSOR[:OPTION]...".into()))?;
    let mut parts = rest.split(':');
    let mut sources = parts
        .next()
        .unwrap_or_default()
        .split('+')
        .map(str::to_string);
    let source = sources.next().unwrap_or_default();
    let more: Vec<String> = sources.collect();
    if source.is_empty() && !more.is_empty() || more.iter().any(String::is_empty) {
        return Err(bad("a stacked source is TENSOR+TENSOR+...".into()));
    }
    let (mut layers, mut stack) = (None::<Vec<u32>>, None);
    let (mut part, mut index, mut axis) = (None, None, None);
    let (mut role, mut layer, mut point, mut optional) = (None, None, None, false);
    let num = |v: &str| {
        v.parse::<u64>()
            .map_err(|_| bad(format!("`{v}` is not a number")))
    };
    for opt in parts {
        let (k, v) = opt.split_once('=').unwrap_or((opt, ""));
        match k {
            "part" => {
                let (i, n) = v
                    .split_once('/')
                    .ok_or_else(|| bad("part=K/N, e.g. part=0/3".into()))?;
                part = Some((num(i)?, num(n)?));
            }
            "index" => index = Some(num(v)?),
            "axis" => {
                axis = Some(
                    v.parse::<i64>()
                        .map_err(|_| bad(format!("axis `{v}` is not an integer")))?,
                )
            }
            "role" => role = Some(v.to_string()),
            "layer" => layer = Some(num(v)? as u32),
            "point" => point = Some(parse_point(v).map_err(|e| bad(e.to_string()))?),
            "optional" => optional = true,
            "layers" => {
                let ids = v
                    .split(',')
                    .map(|x| x.trim().parse::<u32>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| {
                        bad(format!(
                            "layers `{v}` is not a list of layer ids, e.g. layers=2,30,58"
                        ))
                    })?;
                if ids.is_empty() {
                    return Err(bad("layers= needs at least one id".into()));
                }
                layers = Some(ids);
            }
            "stack" => {
                stack = Some(match v {
                    "concat" => Stack::Concat,
                    "axis" => Stack::Axis,
                    _ => return Err(bad(format!("stack `{v}`: use concat or axis"))),
                })
            }
            _ => return Err(bad(format!("unknown option `{k}`"))),
        }
    }
    let op = match (part, index) {
        (Some(_), Some(_)) => return Err(bad("give part or index, not both".into())),
        (Some((index, of)), None) => Op::Part {
            index,
            of,
            axis: axis.unwrap_or(-1),
        },
        (None, Some(index)) => Op::Index {
            index,
            axis: axis.unwrap_or(-2),
        },
        (None, None) => Op::Whole,
    };
    let named_layer = name
        .strip_prefix("hidden.")
        .and_then(|l| l.parse::<u32>().ok());
    let role_name = role.unwrap_or_else(|| {
        match name {
            _ if layers.is_some() => "hidden",
            "input_ids" => "ids",
            "loss_mask" => "mask",
            _ if named_layer.is_some() || layer.is_some() => "hidden",
            _ => "other",
        }
        .into()
    });
    if let Some(ids) = &layers {
        if role_name != "hidden" || layer.is_some() {
            return Err(bad(
                "layers= makes a stacked hidden-state field: drop role= and layer=".into(),
            ));
        }
        if !more.is_empty() && more.len() + 1 != ids.len() {
            return Err(bad(format!(
                "{} source tensors for {} layers: give one tensor per layer, or one holding them all",
                more.len() + 1,
                ids.len()
            )));
        }
        if !more.is_empty() && stack.is_some() {
            return Err(bad(
                "stack= is for one source tensor holding every layer".into()
            ));
        }
        let point = point.unwrap_or(match options.points.as_slice() {
            [p] => *p,
            _ => CapturePoint::LayerInput,
        });
        let stack = if more.is_empty() {
            stack.unwrap_or(Stack::Auto)
        } else {
            Stack::Sources(more)
        };
        return Ok(FieldSpec {
            name: name.to_string(),
            source,
            op,
            role: Role::HiddenStates {
                layers: ids.clone(),
                point,
            },
            optional,
            stack,
        });
    }
    if !more.is_empty() || stack.is_some() {
        return Err(bad(
            "several source tensors or stack= need layers=L0,L1,...".into(),
        ));
    }
    let role = match role_name.as_str() {
        "ids" => Role::TokenIds,
        "mask" => Role::LossMask,
        "other" => Role::Other,
        "hidden" => {
            let layer = layer.or(named_layer).ok_or_else(|| {
                bad("a hidden state needs a layer id: name it hidden.{id} or add :layer=ID".into())
            })?;
            let point = point.unwrap_or_else(|| match options.points.as_slice() {
                [p] => *p,
                _ if options.num_layers == Some(layer) => CapturePoint::FinalNorm,
                _ => CapturePoint::LayerInput,
            });
            Role::HiddenState { layer, point }
        }
        r => {
            return Err(bad(format!(
                "unknown role `{r}`: ids, mask, hidden or other"
            )))
        }
    };
    Ok(FieldSpec {
        name: name.to_string(),
        source,
        op,
        role,
        optional,
        stack: Stack::Auto,
    })
}

/// A mapping file (`--mapping FILE.json`): what the generic layout's flags say, in one file.
/// Each key stands for the flag of the same name; a key and its flag together are refused.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mapping {
    /// Fields: `--field` strings, or objects with the same options as keys.
    #[serde(default)]
    pub fields: Vec<MappingField>,
    /// `--group-by`.
    pub group_by: Option<String>,
    /// `--split-by`: `{"lengths": TENSOR}` or `{"cu_seqlens": TENSOR}`.
    pub split_by: Option<MappingSplit>,
    /// `--split-by-file`.
    pub split_by_file: Option<String>,
    /// `--key-from`.
    pub key_from: Option<String>,
    /// `--layers`.
    pub layers: Option<Vec<u32>>,
    /// `--point`: one for all layers or one per layer.
    pub points: Option<Vec<String>>,
    /// `--num-layers`.
    pub num_layers: Option<u32>,
    /// `--model`.
    pub model: Option<String>,
}

/// How a mapping file splits batches.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum MappingSplit {
    /// A tensor of per-request lengths.
    Lengths(String),
    /// A tensor of cumulative offsets.
    CuSeqlens(String),
}

/// One field of a mapping file.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
pub enum MappingField {
    /// A `--field` argument.
    Flag(String),
    /// The same as keys.
    Object(FieldObject),
}

/// A field of a mapping file as an object: the `--field` options as keys.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldObject {
    /// Field name.
    pub name: String,
    /// The source tensor, or one tensor per layer of a stacked field.
    pub source: Sources,
    /// `part=K/N`.
    pub part: Option<String>,
    /// `index=K`.
    pub index: Option<u64>,
    /// `axis=A`.
    pub axis: Option<i64>,
    /// `role=...`.
    pub role: Option<String>,
    /// `layer=L`.
    pub layer: Option<u32>,
    /// `layers=L0,L1,...`.
    pub layers: Option<Vec<u32>>,
    /// `point=...`.
    pub point: Option<String>,
    /// `stack=concat|axis`.
    pub stack: Option<String>,
    /// `optional`.
    #[serde(default)]
    pub optional: bool,
}

/// One source tensor or several.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
pub enum Sources {
    /// One tensor.
    One(String),
    /// One tensor per layer.
    Many(Vec<String>),
}

impl MappingField {
    /// The field as a `--field` argument.
    pub fn to_flag(&self) -> String {
        let o = match self {
            MappingField::Flag(s) => return s.clone(),
            MappingField::Object(o) => o,
        };
        let mut out = format!(
            "{}={}",
            o.name,
            match &o.source {
                Sources::One(s) => s.clone(),
                Sources::Many(v) => v.join("+"),
            }
        );
        let mut opt = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                out.push_str(&format!(":{k}={v}"));
            }
        };
        opt("part", o.part.clone());
        opt("index", o.index.map(|v| v.to_string()));
        opt("axis", o.axis.map(|v| v.to_string()));
        opt("role", o.role.clone());
        opt("layer", o.layer.map(|v| v.to_string()));
        opt(
            "layers",
            o.layers
                .as_ref()
                .map(|l| l.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
        );
        opt("point", o.point.clone());
        opt("stack", o.stack.clone());
        if o.optional {
            out.push_str(":optional");
        }
        out
    }
}

impl Mapping {
    /// Reads a mapping file.
    pub fn read(path: &Path) -> Result<Mapping, LayoutError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            LayoutError::BadOption(format!(
                "{}: cannot read the mapping file: {e}",
                path.display()
            ))
        })?;
        Mapping::parse(&text, path)
    }

    /// Parses a mapping file's text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Mapping, LayoutError> {
        serde_json::from_str(text).map_err(|e| {
            LayoutError::BadOption(format!(
                "{}: not a mapping file: {e}; see the generic layout in the README for its keys",
                path.display()
            ))
        })
    }
}
