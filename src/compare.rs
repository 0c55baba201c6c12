//! Two datasets holding the same samples compared value by value: how far a lossy copy (a
//! quantized one) is from the exact one, per field and per layer (`hspack compare`).

use crate::error::{Error, Result};
use crate::format::{Role, Schema};
use crate::read::Dataset;

/// What [`compare`] reads.
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    /// Compare only the first this many samples of the first dataset; all when `None`.
    pub samples: Option<u64>,
}

/// The differences of one field (one layer of it, for fields that stack layers).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FieldDiff {
    /// The field.
    pub field: String,
    /// The layer this part of the field holds, for hidden-state fields.
    pub layer: Option<u32>,
    /// How the second dataset stores the field: a quantization scheme, or `exact`.
    pub stored: String,
    /// Values compared.
    pub values: u64,
    /// Values that differ (integers compared exactly, floats by their bits).
    pub differing: u64,
    /// Values NaN or infinite in either dataset: counted in `differing` where they differ,
    /// left out of `max_abs`, `rel_l2` and the cosines, which they would make NaN or infinite.
    pub non_finite: u64,
    /// Largest absolute difference.
    #[serde(serialize_with = "figure")]
    pub max_abs: f64,
    /// ‖a − b‖ / ‖a‖ over all values (0 where a is all zeros and b equals it, infinite where
    /// b does not).
    #[serde(serialize_with = "figure")]
    pub rel_l2: f64,
    /// Mean over rows (tokens) of the cosine similarity of a row of a and of b.
    #[serde(serialize_with = "figure")]
    pub cosine_mean: f64,
    /// Smallest such cosine similarity.
    #[serde(serialize_with = "figure")]
    pub cosine_min: f64,
}

/// A figure in JSON: a number, or `"inf"`, `"-inf"` or `"NaN"`, which JSON has no number for
/// (serde writes them as `null`, which reads as "not computed").
fn figure<S: serde::Serializer>(v: &f64, s: S) -> std::result::Result<S::Ok, S::Error> {
    match v.is_finite() {
        true => s.serialize_f64(*v),
        false => s.serialize_str(&v.to_string()),
    }
}

/// What [`compare`] found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Comparison {
    /// Samples compared.
    pub samples: u64,
    /// Rows (tokens) compared.
    pub rows: u64,
    /// Per field and layer, in schema order.
    pub fields: Vec<FieldDiff>,
}

#[derive(Default, Clone)]
struct Acc {
    values: u64,
    differing: u64,
    non_finite: u64,
    max_abs: f64,
    sum_sq_a: f64,
    sum_sq_d: f64,
    rows: u64,
    cos_sum: f64,
    cos_min: f64,
}

impl Acc {
    /// Adds a row: `a` and `b` as f64, and for an integer field `ints`, the same values exactly
    /// (an i64 past 2^53 has no f64 of its own).
    fn add_row(&mut self, a: &[f64], b: &[f64], ints: Option<(&[i64], &[i64])>) {
        let (mut dot, mut na, mut nb) = (0.0, 0.0, 0.0);
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            let (differ, d) = match ints {
                Some((ia, ib)) => {
                    let d = (i128::from(ia[i]) - i128::from(ib[i])).unsigned_abs();
                    (d != 0, d as f64)
                }
                None => (x.to_bits() != y.to_bits(), (x - y).abs()),
            };
            self.differing += u64::from(differ);
            if !(x.is_finite() && y.is_finite()) {
                self.non_finite += 1;
                continue;
            }
            self.max_abs = self.max_abs.max(d);
            let d = x - y;
            self.sum_sq_a += x * x;
            self.sum_sq_d += d * d;
            dot += x * y;
            na += x * x;
            nb += y * y;
        }
        self.values += a.len() as u64;
        let cos = match (na > 0.0, nb > 0.0) {
            (false, false) => 1.0,
            // One square root: a row compared with itself gives exactly 1.
            (true, true) => (dot / (na * nb).sqrt()).clamp(-1.0, 1.0),
            _ => 0.0,
        };
        self.cos_min = if self.rows == 0 {
            cos
        } else {
            self.cos_min.min(cos)
        };
        self.cos_sum += cos;
        self.rows += 1;
    }
}

/// The parts of a field's row that [`compare`] reports apart: (layer, elements) for each.
fn parts(role: &Role, row_elems: u64) -> Vec<(Option<u32>, u64)> {
    match role {
        Role::HiddenStates { layers, .. } if !layers.is_empty() => layers
            .iter()
            .map(|&l| (Some(l), row_elems / layers.len() as u64))
            .collect(),
        Role::HiddenState { layer, .. } => vec![(Some(*layer), row_elems)],
        _ => vec![(None, row_elems)],
    }
}

fn same_fields(a: &Schema, b: &Schema) -> std::result::Result<(), String> {
    let shape = |s: &Schema| -> Vec<(String, String, Vec<u64>)> {
        s.fields
            .iter()
            .map(|f| (f.name.clone(), f.dtype.name().to_string(), f.shape.clone()))
            .collect()
    };
    let (x, y) = (shape(a), shape(b));
    if x == y {
        return Ok(());
    }
    let text = |v: &[(String, String, Vec<u64>)]| {
        v.iter()
            .map(|(n, d, s)| format!("{n} {d} {s:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(format!(
        "the datasets hold different fields ({} against {}): compare a dataset with its own \
         converted or quantized copy",
        text(&x),
        text(&y)
    ))
}

/// Compares every sample of `a` (or the first `options.samples`) with the sample of `b` that
/// has its key, value by value, field by field. Both must have the same fields (names, dtypes,
/// shapes; how they are stored may differ) and every key of `a` must be in `b` with the same
/// rows.
pub fn compare(a: &Dataset, b: &Dataset, options: &CompareOptions) -> Result<Comparison> {
    if options.samples == Some(0) {
        // Nothing compared would read as a perfect match.
        return Err(Error::BadOption {
            option: "samples",
            detail: "0 compares nothing: give 1 or more, or leave it out to compare every sample"
                .into(),
        });
    }
    same_fields(a.schema(), b.schema()).map_err(|detail| Error::BadOption {
        option: "datasets",
        detail,
    })?;
    let schema = a.schema();
    let layout: Vec<Vec<(Option<u32>, u64)>> = schema
        .fields
        .iter()
        .map(|f| parts(&f.role, f.row_elems()))
        .collect();
    let mut accs: Vec<Vec<Acc>> = layout
        .iter()
        .map(|p| vec![Acc::default(); p.len()])
        .collect();
    let n = options.samples.map_or(a.len(), |s| s.min(a.len()));
    let mut rows = 0;
    for i in 0..n {
        let sa = a.sample(i)?;
        let key = sa.key().to_string();
        let sb = b.find(&key)?.ok_or_else(|| Error::BadOption {
            option: "datasets",
            detail: format!(
                "sample `{key}` of the first dataset is not in the second: compare copies of \
                 one dataset"
            ),
        })?;
        if sa.rows() != sb.rows() {
            return Err(Error::BadOption {
                option: "datasets",
                detail: format!(
                    "sample `{key}` has {} rows in the first dataset and {} in the second",
                    sa.rows(),
                    sb.rows()
                ),
            });
        }
        rows += sa.rows();
        for (f, field) in schema.fields.iter().enumerate() {
            let (ta, tb) = (sa.read_field(f, None)?, sb.read_field(f, None)?);
            let (va, vb) = (ta.to_f64(), tb.to_f64());
            let ints = field
                .dtype
                .ints(ta.bytes())
                .zip(field.dtype.ints(tb.bytes()));
            let row = field.row_elems().max(1) as usize;
            for (r, (ra, rb)) in va.chunks(row).zip(vb.chunks(row)).enumerate() {
                let mut at = 0;
                for (p, &(_, len)) in layout[f].iter().enumerate() {
                    let (len, from) = (len as usize, r * row + at);
                    let exact = ints
                        .as_ref()
                        .map(|(ia, ib)| (&ia[from..from + len], &ib[from..from + len]));
                    accs[f][p].add_row(&ra[at..at + len], &rb[at..at + len], exact);
                    at += len;
                }
            }
        }
    }
    let mut fields = Vec::new();
    for (f, field) in schema.fields.iter().enumerate() {
        let stored = b.schema().fields[f]
            .quantized
            .map_or("exact".to_string(), |q| q.scheme.name().to_string());
        for (p, &(layer, _)) in layout[f].iter().enumerate() {
            let acc = &accs[f][p];
            fields.push(FieldDiff {
                field: field.name.clone(),
                layer,
                stored: stored.clone(),
                values: acc.values,
                differing: acc.differing,
                non_finite: acc.non_finite,
                max_abs: acc.max_abs,
                rel_l2: match acc.sum_sq_a > 0.0 {
                    true => (acc.sum_sq_d / acc.sum_sq_a).sqrt(),
                    false if acc.sum_sq_d == 0.0 => 0.0,
                    false => f64::INFINITY,
                },
                cosine_mean: match acc.rows {
                    0 => 1.0,
                    r => acc.cos_sum / r as f64,
                },
                cosine_min: if acc.rows == 0 { 1.0 } else { acc.cos_min },
            });
        }
    }
    Ok(Comparison {
        samples: n,
        rows,
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An infinite relative error (a reference of zeros) is `"inf"` in JSON, not `null`.
    #[test]
    fn a_figure_json_has_no_number_for_is_said_not_nulled() {
        let diff = FieldDiff {
            field: "h".into(),
            layer: None,
            stored: "exact".into(),
            values: 2,
            differing: 1,
            non_finite: 0,
            max_abs: 1.0,
            rel_l2: f64::INFINITY,
            cosine_mean: f64::NAN,
            cosine_min: f64::NEG_INFINITY,
        };
        let v = serde_json::to_value(&diff).unwrap();
        assert_eq!(v["max_abs"], 1.0);
        assert_eq!(v["rel_l2"], "inf");
        assert_eq!(v["cosine_mean"], "NaN");
        assert_eq!(v["cosine_min"], "-inf");
    }
}
