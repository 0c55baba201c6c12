//! The generic layout's fields: `--field NAME=SRC[:OPTION]...` strings and the objects of a
//! mapping file, both checked and resolved into [`FieldSpec`]s by [`FieldArg::resolve`].
//!
//! Options (keys of an object):
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
//!   does not tell (a `[1, k, k·H]` tensor, which both fit: refused without `stack=`); by
//!   default the one the first file's shape fits;
//! - `point=layer-input|layer-output|final-norm`: where the state was taken; by default the
//!   `--point` given for all, else final-norm for the id equal to `--num-layers`, else
//!   layer-input (the HF `hidden_states[i]` convention);
//! - `optional`: leave the field out when the first file lacks the tensor.

use crate::format::eagle3;
use crate::format::{CapturePoint, Role};

use super::super::layout::{layer_fits, point_name, FieldSpec, Op, Stack};
use super::SpecError;

/// Parses `layer-input`, `layer-output` or `final-norm` (also `input`, `output`, `final`, and
/// with `_` for `-`).
pub fn parse_point(s: &str) -> Result<CapturePoint, SpecError> {
    match s.replace('_', "-").as_str() {
        "layer-input" | "input" => Ok(CapturePoint::LayerInput),
        "layer-output" | "output" => Ok(CapturePoint::LayerOutput),
        "final-norm" | "final" => Ok(CapturePoint::FinalNorm),
        _ => Err(SpecError::Point {
            value: s.to_string(),
        }),
    }
}

/// What is wrong with a field of the generic layout ([`SpecError::Field`] names the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldProblem {
    /// Not `NAME=TENSOR...`.
    #[error("expected NAME=TENSOR[:OPTION]...")]
    Syntax,
    /// An empty tensor name in `SRC1+SRC2+...`.
    #[error("a stacked source is TENSOR+TENSOR+...")]
    StackedSource,
    /// An option's value that is not a number.
    #[error("`{value}` is not a number")]
    NotANumber {
        /// What was given.
        value: String,
    },
    /// A `part=` that is not `K/N`.
    #[error("part=K/N, e.g. part=0/3")]
    Part,
    /// An `axis=` that is not an integer.
    #[error("axis `{value}` is not an integer")]
    Axis {
        /// What was given.
        value: String,
    },
    /// A `point=` that is none of the three.
    #[error("unknown capture point `{value}`: use layer-input, layer-output or final-norm")]
    Point {
        /// What was given.
        value: String,
    },
    /// A `layer=` beyond the ids a layer can have.
    #[error("layer `{value}` is not a layer id (0 to 4294967295)")]
    Layer {
        /// What was given.
        value: String,
    },
    /// A `layers=` that is not a list of ids.
    #[error("layers `{value}` is not a list of layer ids, e.g. layers=2,30,58")]
    Layers {
        /// What was given.
        value: String,
    },
    /// An empty `layers`.
    #[error("layers= needs at least one id")]
    NoLayers,
    /// A `stack=` that is neither `concat` nor `axis`.
    #[error("stack `{value}`: use concat or axis")]
    Stack {
        /// What was given.
        value: String,
    },
    /// An option that does not exist.
    #[error("unknown option `{option}`")]
    UnknownOption {
        /// The option.
        option: String,
    },
    /// Both `part=` and `index=`.
    #[error("give part or index, not both")]
    PartAndIndex,
    /// `layers=` with `role=` or `layer=`.
    #[error("layers= makes a stacked hidden-state field: drop role= and layer=")]
    StackedRole,
    /// Not one source tensor per layer.
    #[error("{sources} source tensors for {layers} layers: give one tensor per layer, or one holding them all")]
    SourceCount {
        /// Source tensors given.
        sources: usize,
        /// Layers given.
        layers: usize,
    },
    /// `stack=` with one source tensor per layer.
    #[error("stack= is for one source tensor holding every layer")]
    StackWithSources,
    /// Several sources or `stack=` without `layers=`.
    #[error("several source tensors or stack= need layers=L0,L1,...")]
    SourcesNeedLayers,
    /// A `--point` list, which names one point per `--layers` id of a preset.
    #[error(
        "--point has {count} entries, one per --layers id of a preset; under --layout generic \
         give one --point for every field, or each field its own with :point=..."
    )]
    PointList {
        /// Entries.
        count: usize,
    },
    /// A layer id that does not fit `--num-layers` at its capture point.
    #[error("layer {id} at point {point}: {detail}")]
    LayerId {
        /// The id.
        id: u32,
        /// Its capture point, as the command line names it.
        point: &'static str,
        /// Why, and what to give.
        detail: String,
    },
    /// A hidden state without a layer id.
    #[error("a hidden state needs a layer id: name it hidden.{{id}} or add :layer=ID")]
    NoLayerId,
    /// A role that does not exist.
    #[error("unknown role `{role}`: ids, mask, hidden or other")]
    UnknownRole {
        /// What was given.
        role: String,
    },
}

/// One field of the generic layout, as the user gave it. Read from JSON as a string or an
/// object, an object's mistake said by its key (an untagged enum said only that the entry
/// matched no variant, for a misspelled `source` as for a missing `name`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum FieldArg {
    /// A `--field` argument: `NAME=SRC[:OPTION]...`.
    Flag(String),
    /// The same as an object whose keys are the options.
    Object(FieldObject),
}

impl<'de> serde::Deserialize<'de> for FieldArg {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(FieldArg::Flag(s)),
            v @ serde_json::Value::Object(_) => FieldObject::deserialize(v)
                .map(FieldArg::Object)
                .map_err(|e| D::Error::custom(format!("a field object: {e}"))),
            other => Err(D::Error::custom(format!(
                "a field is a string (\"NAME=SRC[:OPTION]...\") or an object with `name`, \
                 `source` and the options as keys, not {other}"
            ))),
        }
    }
}

/// A field as an object: the `--field` options as keys.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldObject {
    /// Field name.
    pub name: String,
    /// The source tensor, or one tensor per layer of a stacked field.
    pub source: Sources,
    /// `part=K/N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
    /// `index=K`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// `axis=A`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub axis: Option<i64>,
    /// `role=...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// `layer=L`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<u32>,
    /// `layers=L0,L1,...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<Vec<u32>>,
    /// `point=...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point: Option<String>,
    /// `stack=concat|axis`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
    /// `optional`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// One source tensor or several.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum Sources {
    /// One tensor (or `SRC1+SRC2+...`, one per layer).
    One(String),
    /// One tensor per layer.
    Many(Vec<String>),
}

/// A field's options, parsed but not yet resolved against the capture points.
#[derive(Debug, Default)]
struct Decl {
    name: String,
    source: String,
    more: Vec<String>,
    part: Option<(u64, u64)>,
    index: Option<u64>,
    axis: Option<i64>,
    role: Option<String>,
    layer: Option<u32>,
    layers: Option<Vec<u32>>,
    point: Option<CapturePoint>,
    stack: Option<Stack>,
    optional: bool,
}

fn number(v: &str) -> Result<u64, FieldProblem> {
    v.parse::<u64>().map_err(|_| FieldProblem::NotANumber {
        value: v.to_string(),
    })
}

fn part(v: &str) -> Result<(u64, u64), FieldProblem> {
    let (i, n) = v.split_once('/').ok_or(FieldProblem::Part)?;
    Ok((number(i)?, number(n)?))
}

fn stack(v: &str) -> Result<Stack, FieldProblem> {
    match v {
        "concat" => Ok(Stack::Concat),
        "axis" => Ok(Stack::Axis),
        _ => Err(FieldProblem::Stack {
            value: v.to_string(),
        }),
    }
}

fn point(v: &str) -> Result<CapturePoint, FieldProblem> {
    parse_point(v).map_err(|_| FieldProblem::Point {
        value: v.to_string(),
    })
}

/// `SRC` or `SRC1+SRC2+...`: the first source and the others.
fn sources(first: String, more: Vec<String>) -> Result<(String, Vec<String>), FieldProblem> {
    if first.is_empty() && !more.is_empty() || more.iter().any(String::is_empty) {
        return Err(FieldProblem::StackedSource);
    }
    Ok((first, more))
}

fn split_sources(s: &str) -> Result<(String, Vec<String>), FieldProblem> {
    let mut all = s.split('+').map(str::to_string);
    let first = all.next().unwrap_or_default();
    sources(first, all.collect())
}

impl FieldArg {
    /// The field in `--field` syntax, as messages name it.
    pub fn text(&self) -> String {
        let o = match self {
            FieldArg::Flag(s) => return s.clone(),
            FieldArg::Object(o) => o,
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

    /// The field spec: `points` (the `--point` given for all, when one) and `num_layers`
    /// give the capture point of a hidden state that names none. An error names the field.
    pub fn resolve(
        &self,
        points: &[CapturePoint],
        num_layers: Option<u32>,
    ) -> Result<FieldSpec, SpecError> {
        let decl = match self {
            FieldArg::Flag(s) => Decl::parse(s),
            FieldArg::Object(o) => Decl::of_object(o),
        };
        decl.and_then(|d| d.resolve(points, num_layers))
            .map_err(|problem| SpecError::Field {
                field: self.text(),
                problem,
            })
    }
}

impl Decl {
    /// Parses `NAME=SRC[:OPTION]...`.
    fn parse(arg: &str) -> Result<Decl, FieldProblem> {
        let (name, rest) = arg.split_once('=').ok_or(FieldProblem::Syntax)?;
        let mut parts = rest.split(':');
        let (source, more) = split_sources(parts.next().unwrap_or_default())?;
        let mut d = Decl {
            name: name.to_string(),
            source,
            more,
            ..Decl::default()
        };
        for opt in parts {
            let (k, v) = opt.split_once('=').unwrap_or((opt, ""));
            match k {
                "part" => d.part = Some(part(v)?),
                "index" => d.index = Some(number(v)?),
                "axis" => {
                    d.axis = Some(v.parse::<i64>().map_err(|_| FieldProblem::Axis {
                        value: v.to_string(),
                    })?)
                }
                "role" => d.role = Some(v.to_string()),
                "layer" => {
                    let layer = u32::try_from(number(v)?).map_err(|_| FieldProblem::Layer {
                        value: v.to_string(),
                    })?;
                    d.layer = Some(layer);
                }
                "point" => d.point = Some(point(v)?),
                "optional" => d.optional = true,
                "layers" => {
                    let ids = v
                        .split(',')
                        .map(|x| x.trim().parse::<u32>())
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|_| FieldProblem::Layers {
                            value: v.to_string(),
                        })?;
                    d.layers = Some(ids);
                }
                "stack" => d.stack = Some(stack(v)?),
                _ => {
                    return Err(FieldProblem::UnknownOption {
                        option: k.to_string(),
                    })
                }
            }
        }
        Ok(d)
    }

    /// The options of an object, checked in the order `--field` text lists them.
    fn of_object(o: &FieldObject) -> Result<Decl, FieldProblem> {
        let (source, more) = match &o.source {
            Sources::One(s) => split_sources(s)?,
            Sources::Many(v) => {
                let mut all = v.iter().cloned();
                sources(all.next().unwrap_or_default(), all.collect())?
            }
        };
        Ok(Decl {
            name: o.name.clone(),
            source,
            more,
            part: o.part.as_deref().map(part).transpose()?,
            index: o.index,
            axis: o.axis,
            role: o.role.clone(),
            layer: o.layer,
            layers: o.layers.clone(),
            point: o.point.as_deref().map(point).transpose()?,
            stack: o.stack.as_deref().map(stack).transpose()?,
            optional: o.optional,
        })
    }

    fn resolve(
        self,
        points: &[CapturePoint],
        num_layers: Option<u32>,
    ) -> Result<FieldSpec, FieldProblem> {
        if points.len() > 1 {
            return Err(FieldProblem::PointList {
                count: points.len(),
            });
        }
        let spec = self.resolve_role(points, num_layers)?;
        if let Some(n) = num_layers {
            let (ids, point) = match &spec.role {
                Role::HiddenState { layer, point } => (std::slice::from_ref(layer), *point),
                Role::HiddenStates { layers, point } => (&layers[..], *point),
                _ => (&[][..], CapturePoint::LayerInput),
            };
            for &id in ids {
                layer_fits(id, point, n).map_err(|detail| FieldProblem::LayerId {
                    id,
                    point: point_name(point),
                    detail,
                })?;
            }
        }
        Ok(spec)
    }

    fn resolve_role(
        self,
        points: &[CapturePoint],
        num_layers: Option<u32>,
    ) -> Result<FieldSpec, FieldProblem> {
        let Decl {
            name,
            source,
            more,
            layers,
            stack,
            layer,
            point,
            optional,
            ..
        } = self;
        let op = match (self.part, self.index) {
            (Some(_), Some(_)) => return Err(FieldProblem::PartAndIndex),
            (Some((index, of)), None) => Op::Part {
                index,
                of,
                axis: self.axis.unwrap_or(-1),
            },
            (None, Some(index)) => Op::Index {
                index,
                axis: self.axis.unwrap_or(-2),
            },
            (None, None) => Op::Whole,
        };
        let named_layer = eagle3::hidden_field_layer(&name);
        let role_name = self.role.unwrap_or_else(|| {
            match name.as_str() {
                _ if layers.is_some() => "hidden",
                eagle3::INPUT_IDS => "ids",
                eagle3::LOSS_MASK => "mask",
                _ if named_layer.is_some() || layer.is_some() => "hidden",
                _ => "other",
            }
            .into()
        });
        if let Some(ids) = layers {
            if ids.is_empty() {
                return Err(FieldProblem::NoLayers);
            }
            if role_name != "hidden" || layer.is_some() {
                return Err(FieldProblem::StackedRole);
            }
            if !more.is_empty() && more.len() + 1 != ids.len() {
                return Err(FieldProblem::SourceCount {
                    sources: more.len() + 1,
                    layers: ids.len(),
                });
            }
            if !more.is_empty() && stack.is_some() {
                return Err(FieldProblem::StackWithSources);
            }
            let point = point.unwrap_or(match points {
                [p] => *p,
                _ => CapturePoint::LayerInput,
            });
            let stack = if more.is_empty() {
                stack.unwrap_or(Stack::Auto)
            } else {
                Stack::Sources(more)
            };
            return Ok(FieldSpec {
                name,
                source,
                op,
                role: Role::HiddenStates { layers: ids, point },
                optional,
                stack,
            });
        }
        if !more.is_empty() || stack.is_some() {
            return Err(FieldProblem::SourcesNeedLayers);
        }
        let role = match role_name.as_str() {
            "ids" => Role::TokenIds,
            "mask" => Role::LossMask,
            "other" => Role::Other,
            "hidden" => {
                let layer = layer.or(named_layer).ok_or(FieldProblem::NoLayerId)?;
                let point = point.unwrap_or(match points {
                    [p] => *p,
                    _ if num_layers == Some(layer) => CapturePoint::FinalNorm,
                    _ => CapturePoint::LayerInput,
                });
                Role::HiddenState { layer, point }
            }
            r => {
                return Err(FieldProblem::UnknownRole {
                    role: r.to_string(),
                })
            }
        };
        Ok(FieldSpec {
            name,
            source,
            op,
            role,
            optional,
            stack: Stack::Auto,
        })
    }
}
