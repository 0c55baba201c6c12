//! Decoding one unit into samples, on a worker thread: open its files, check every field
//! against the schema, split batches and trim padding when asked.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Mutex;

use crate::format::{DType, Field, Role, Schema};
use crate::store::captures::{written_digest, CaptureConfig};

use super::keys::{stored_keys, StoredKeys};
use super::layout::{
    check_field, field_bytes, field_part, refuse_unconverted, unread, FieldSpec, Held,
    LayoutOptions, Part, Preset,
};
use super::unit_error::{tensor_error, unit_error, SplitError, UnitError, UnitProblem};
use super::units::{Inputs, Unit};
use super::Limits;

/// How one file packs several requests along the token dimension. In JSON:
/// `{"lengths": TENSOR}` or `{"cu_seqlens": TENSOR}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SplitBy {
    /// A tensor of per-request lengths: `[n]`, summing to the tokens.
    Lengths(String),
    /// A tensor of cumulative offsets: `[n + 1]`, from 0 to the tokens.
    CuSeqlens(String),
}

/// Which rows are padding, when the user asks to drop them. In JSON: `"mask"` or
/// `{"ids": {"pad": PAD}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Trim {
    /// Rows after the last non-zero loss-mask row.
    #[serde(rename = "mask")]
    LossMask,
    /// Trailing rows whose token id equals the pad id.
    #[serde(rename = "ids")]
    TokenIds {
        /// The pad token id.
        pad: i64,
    },
}

/// What workers need to decode a unit.
#[derive(Debug)]
pub struct Decoder {
    /// The layout, and what the user said of it: every unit is checked to hold nothing the
    /// layout would read that `specs` leave out.
    pub layout: (Preset, LayoutOptions),
    /// Field specs, one per schema field, in schema order.
    pub specs: Vec<FieldSpec>,
    /// The dataset schema.
    pub schema: Schema,
    /// Batch splitting.
    pub split_by: Option<SplitBy>,
    /// Padding trimming.
    pub trim: Option<Trim>,
    /// Take each unit's key from this stored value instead of its file name.
    pub key_from: Option<String>,
    /// Limits for reading source files.
    pub limits: Limits,
    /// Gather buffers.
    pub pool: Pool,
}

/// The bytes of one field of a unit.
pub enum Piece {
    /// Borrowed from the mapped file: taken again with [`Inputs::tensor`] when appended.
    Mapped,
    /// Decompressed or small gathered bytes.
    Owned(Vec<u8>),
    /// Large gathered bytes (the first `len` of the buffer), in anonymous memory backed by
    /// huge pages where the system allows, recycled through [`Decoder::recycle`]: fresh pages
    /// cost a fault and a zeroing each.
    Anon(memmap2::MmapMut, usize),
    /// Not read: the unit was opened for its token ids only ([`Decoder::capture_keys`]), and
    /// is never appended.
    Skipped,
}

/// Gathers at least this many bytes into huge-page-backed memory.
const ANON_MIN: usize = 4 << 20;

/// Buffers for large gathers, kept between units.
#[derive(Debug, Default)]
pub struct Pool {
    free: Mutex<Vec<memmap2::MmapMut>>,
}

/// Most buffers the pool keeps.
const POOL_MAX: usize = 32;

impl Pool {
    fn gathered(&self, part: &Part, src: &[u8]) -> Piece {
        self.filled(part.len(), |dst| part.gather(src, dst))
    }

    /// A buffer of `len` bytes written by `fill`.
    fn filled(&self, len: usize, fill: impl FnOnce(&mut [u8])) -> Piece {
        if len >= ANON_MIN {
            let reused = self.free.lock().ok().and_then(|mut free| {
                let best = (0..free.len())
                    .filter(|&i| free[i].len() >= len)
                    .min_by_key(|&i| free[i].len())?;
                Some(free.swap_remove(best))
            });
            let buf = reused.or_else(|| {
                let m = memmap2::MmapOptions::new()
                    .len(len.next_power_of_two())
                    .map_anon()
                    .ok()?;
                // Advice only: without huge pages the memory still works, page by page.
                let _ = m.advise(memmap2::Advice::HugePage);
                Some(m)
            });
            if let Some(mut m) = buf {
                fill(&mut m[..len]);
                return Piece::Anon(m, len);
            }
        }
        let mut v = vec![0; len];
        fill(&mut v);
        Piece::Owned(v)
    }

    fn put(&self, m: memmap2::MmapMut) {
        if let Ok(mut free) = self.free.lock() {
            free.push(m);
            if free.len() > POOL_MAX {
                if let Some(i) = (0..free.len()).min_by_key(|&i| free[i].len()) {
                    free.swap_remove(i);
                }
            }
        }
    }
}

/// A decoded unit: its open files, its fields, and the samples (row ranges) it holds.
pub struct Prepared {
    /// The open files.
    pub inputs: Inputs,
    /// One per field.
    pub pieces: Vec<Piece>,
    /// Sample keys and their rows.
    pub samples: Vec<(String, Range<u64>)>,
    /// The unit's key: its file name's, or the stored one with `key_from` (the file name's
    /// when the stored value gives one key per request).
    pub key: String,
    /// Whether `key` was read from the files (`key_from` giving one key for the unit).
    pub stored_key: bool,
}

/// Reads every 4096th byte so the pages are mapped before the writer reads them.
fn touch(bytes: &[u8]) {
    let mut acc = 0u8;
    for b in bytes.iter().step_by(4096) {
        acc ^= b;
    }
    std::hint::black_box(acc);
}

impl Decoder {
    /// The digest ([`written_digest`]) of each sample of `unit`, with its key: what its
    /// sources hold, read whole, as a dataset holding them would give it back.
    pub fn sample_digests(&self, unit: &Unit) -> Result<Vec<(String, [u8; 32])>, UnitError> {
        let p = self.prepare(unit)?;
        let fields = (0..self.specs.len())
            .map(|f| self.field(&p, f))
            .collect::<Result<Vec<_>, _>>()?;
        let digests = p
            .samples
            .iter()
            .map(|(key, rows)| {
                let named = sample_rows(&self.schema, &fields, rows);
                (key.clone(), written_digest(&self.schema, &named))
            })
            .collect();
        drop(fields);
        self.recycle(p);
        Ok(digests)
    }

    /// Returns a unit's gather buffers for reuse.
    pub fn recycle(&self, p: Prepared) {
        for piece in p.pieces {
            if let Piece::Anon(m, _) = piece {
                self.pool.put(m);
            }
        }
    }

    /// The bytes of field `f` of a prepared unit. A field stored as fp8 is checked to hold
    /// only finite values first: a unit holding another is bad, before any of its samples is
    /// written.
    pub fn field<'a>(&self, p: &'a Prepared, f: usize) -> Result<Cow<'a, [u8]>, UnitError> {
        let bytes = match &p.pieces[f] {
            Piece::Owned(v) => Cow::Borrowed(v.as_slice()),
            Piece::Anon(m, len) => Cow::Borrowed(&m[..*len]),
            Piece::Skipped => unreachable!("a unit opened for its token ids is never appended"),
            Piece::Mapped => {
                let spec = &self.specs[f];
                let t = p.inputs.tensor(&spec.source)?;
                field_bytes(spec, &t.shape, t.dtype.size(), t.bytes)
                    .map_err(|e| unit_error(&p.inputs, e))?
            }
        };
        let field = &self.schema.fields[f];
        if field.quantized.is_some() {
            let found = crate::format::fp8::first_non_finite(
                &bytes,
                field.dtype,
                field.row_elems() as usize,
            );
            if let Some(e) = found {
                return Err(unit_error(
                    &p.inputs,
                    UnitProblem::NotFinite {
                        field: field.name.clone(),
                        tensor: self.specs[f].source.clone(),
                        row: e.row,
                        elem: e.elem,
                        value: e.value,
                    },
                ));
            }
        }
        Ok(bytes)
    }

    /// Opens and checks `unit`; an error is the reason the file is bad.
    pub fn prepare(&self, unit: &Unit) -> Result<Prepared, UnitError> {
        self.prepare_fields(unit, &|_| true)
    }

    /// The capture key under `config` of each sample of `unit`, with its sample key, read
    /// from the token ids (and loss mask) alone: the hidden states are neither read nor
    /// checked. `config` is for this decoder's schema ([`CaptureConfig::for_schema`]).
    pub fn capture_keys(
        &self,
        unit: &Unit,
        config: &CaptureConfig,
    ) -> Result<Vec<(String, [u8; 32])>, UnitError> {
        let keyed = |f: &Field| matches!(f.role, Role::TokenIds | Role::LossMask);
        let p = self.prepare_fields(unit, &|i| keyed(&self.schema.fields[i]))?;
        let mut fields = Vec::new();
        for (i, f) in self.schema.fields.iter().enumerate() {
            if keyed(f) {
                fields.push((f, self.field(&p, i)?));
            }
        }
        let mut out = Vec::with_capacity(p.samples.len());
        for (key, rows) in &p.samples {
            let named: Vec<(&str, &[u8])> = fields
                .iter()
                .map(|(f, b)| {
                    let rb = f.row_bytes() as usize;
                    (
                        f.name.as_str(),
                        &b[rows.start as usize * rb..rows.end as usize * rb],
                    )
                })
                .collect();
            let capture = config.key_of(&self.schema, &named).ok_or_else(|| {
                unit_error(
                    &p.inputs,
                    UnitProblem::CaptureKey {
                        fields: fields.iter().map(|(f, _)| f.name.clone()).collect(),
                    },
                )
            })?;
            out.push((key.clone(), capture));
        }
        self.recycle(p);
        Ok(out)
    }

    /// [`Decoder::prepare`], reading only the fields `wanted` takes (by number); the others
    /// are [`Piece::Skipped`], their shapes checked.
    fn prepare_fields(
        &self,
        unit: &Unit,
        wanted: &dyn Fn(usize) -> bool,
    ) -> Result<Prepared, UnitError> {
        let inputs = Inputs::open(unit, self.limits)?;
        let (preset, options) = &self.layout;
        refuse_unconverted(*preset, &self.specs, &inputs.held(), options).map_err(|e| {
            let tensor = e.tensor().unwrap_or_default().to_string();
            tensor_error(&inputs, &tensor, e)
        })?;
        let mut pieces = Vec::with_capacity(self.specs.len());
        let mut rows = None;
        for (i, (spec, field)) in self.specs.iter().zip(&self.schema.fields).enumerate() {
            let t = inputs.tensor(&spec.source)?;
            let r = check_field(field, spec, t.dtype, &t.shape)
                .map_err(|e| tensor_error(&inputs, &spec.source, e))?;
            match rows {
                None => rows = Some(r),
                Some(prev) if prev != r => {
                    return Err(tensor_error(
                        &inputs,
                        &spec.source,
                        UnitProblem::Tokens {
                            field: spec.name.clone(),
                            tensor: spec.source.clone(),
                            rows: r,
                            earlier: prev,
                        },
                    ))
                }
                _ => {}
            }
            if !wanted(i) {
                pieces.push(Piece::Skipped);
                continue;
            }
            if spec.is_multi_source() {
                drop(t);
                pieces.push(self.stacked(&inputs, spec, field, r)?);
                continue;
            }
            let part = field_part(spec, &t.shape, t.dtype.size())
                .map_err(|e| tensor_error(&inputs, &spec.source, e))?;
            pieces.push(match (part, t.bytes) {
                (Part::Range(r), Cow::Borrowed(b)) => {
                    touch(&b[r]);
                    Piece::Mapped
                }
                (Part::Range(r), Cow::Owned(v)) if r.len() == v.len() => Piece::Owned(v),
                (part, b) => self.pool.gathered(&part, &b),
            });
        }
        let rows = rows.unwrap_or(0);
        let ranges = self.split(unit, &inputs, rows)?;
        let split = self.split_by.is_some();
        let stored = match &self.key_from {
            Some(name) => Some(stored_keys(&inputs, name, split.then_some(ranges.len()))?),
            None => None,
        };
        let (key, mut per_request) = match stored {
            None => (unit.key.clone(), None),
            Some(StoredKeys::One(k)) => (k, None),
            Some(StoredKeys::PerRequest(keys)) => (unit.key.clone(), Some(keys.into_iter())),
        };
        let mut prepared = Prepared {
            inputs,
            pieces,
            samples: Vec::with_capacity(ranges.len()),
            stored_key: self.key_from.is_some() && per_request.is_none(),
            key,
        };
        for (i, range) in ranges.into_iter().enumerate() {
            let key = match per_request.as_mut().and_then(Iterator::next) {
                Some(id) => id,
                None if split => format!("{}/{i}", prepared.key),
                None => prepared.key.clone(),
            };
            let range = match self.trim {
                Some(t) if !range.is_empty() => {
                    let trimmed = self.trimmed(&prepared, t, range)?;
                    if trimmed.is_empty() {
                        let why = match t {
                            Trim::LossMask => "its loss mask is all zero".to_string(),
                            Trim::TokenIds { pad } => format!("every token id is {pad}"),
                        };
                        return Err(unit_error(
                            &prepared.inputs,
                            UnitProblem::TrimLeftNothing { key, why },
                        ));
                    }
                    trimmed
                }
                _ => range,
            };
            prepared.samples.push((key, range));
        }
        Ok(prepared)
    }

    /// A field stacking one layer from each of its sources: rows interleaved per token.
    fn stacked(
        &self,
        inputs: &Inputs,
        spec: &FieldSpec,
        field: &Field,
        rows: u64,
    ) -> Result<Piece, UnitError> {
        let mut layers = Vec::with_capacity(field.shape.first().copied().unwrap_or(0) as usize);
        for name in spec.sources() {
            let t = inputs.tensor(name)?;
            let r = check_field(field, spec, t.dtype, &t.shape).map_err(|error| {
                tensor_error(
                    inputs,
                    name,
                    UnitProblem::Layer {
                        tensor: name.to_string(),
                        error,
                    },
                )
            })?;
            if r != rows {
                return Err(tensor_error(
                    inputs,
                    name,
                    UnitProblem::LayerTokens {
                        tensor: name.to_string(),
                        rows: r,
                        first: spec.source.clone(),
                        first_rows: rows,
                        field: spec.name.clone(),
                    },
                ));
            }
            layers.push(
                field_bytes(spec, &t.shape, t.dtype.size(), t.bytes)
                    .map_err(|e| tensor_error(inputs, name, e))?,
            );
        }
        let row = field.shape.get(1).copied().unwrap_or(1) as usize * field.dtype.size();
        let len = field.row_bytes() as usize * rows as usize;
        Ok(self.pool.filled(len, |dst| {
            if row == 0 {
                return;
            }
            for (t, out) in dst.chunks_exact_mut(row * layers.len()).enumerate() {
                for (j, l) in layers.iter().enumerate() {
                    out[j * row..(j + 1) * row].copy_from_slice(&l[t * row..(t + 1) * row]);
                }
            }
        }))
    }

    fn split(&self, unit: &Unit, inputs: &Inputs, rows: u64) -> Result<Vec<Range<u64>>, UnitError> {
        let Some(by) = &self.split_by else {
            return Ok(std::iter::once(0..rows).collect());
        };
        let name = match by {
            SplitBy::Lengths(n) | SplitBy::CuSeqlens(n) => n,
        };
        let Some(path) = &unit.split_file else {
            let t = inputs.tensor(name)?;
            return bounds(by, name, &t.bytes, t.dtype, rows)
                .map_err(|e| unit_error(inputs, UnitProblem::Split(e)));
        };
        // The split lies in a file beside the batch: errors name both.
        let both = |error| UnitError::SplitFile {
            file: inputs.path().to_path_buf(),
            split: path.clone(),
            error: Box::new(error),
        };
        let file =
            super::open_source_with(path, self.limits).map_err(|e| both(SplitError::Source(e)))?;
        if self.layout.1.delete_source {
            // Deleted with the unit: nothing in it but the split may go unread.
            let held = Held {
                tensors: file.tensors(),
                unsupported: file.unsupported(),
                values: file.values(),
                parts: Vec::new(),
            };
            let left = unread(&held, |t| t == name.as_str())
                .next()
                .map(|l| (l.name.clone(), l.what));
            if let Some((tensor, what)) = left {
                return Err(both(SplitError::Unread {
                    tensor,
                    what,
                    split: name.clone(),
                }));
            }
        }
        let t = file.tensor(name).map_err(|e| both(SplitError::Source(e)))?;
        bounds(by, name, &t.bytes, t.dtype, rows).map_err(both)
    }

    fn trimmed(
        &self,
        p: &Prepared,
        trim: Trim,
        range: Range<u64>,
    ) -> Result<Range<u64>, UnitError> {
        let role = match trim {
            Trim::LossMask => crate::format::Role::LossMask,
            Trim::TokenIds { .. } => crate::format::Role::TokenIds,
        };
        let f = self
            .schema
            .fields
            .iter()
            .position(|f| f.role == role)
            .ok_or_else(|| unit_error(&p.inputs, UnitProblem::TrimNeedsField))?;
        let field = &self.schema.fields[f];
        let rb = field.row_bytes() as usize;
        let bytes = self.field(p, f)?;
        let rows = &bytes[range.start as usize * rb..range.end as usize * rb];
        let keep = match trim {
            Trim::LossMask => rows
                .chunks_exact(rb)
                .rposition(|r| r.iter().any(|&b| b != 0))
                .map_or(0, |i| i + 1),
            Trim::TokenIds { pad } => {
                let ids = field.dtype.ints(rows).ok_or_else(|| {
                    unit_error(
                        &p.inputs,
                        UnitProblem::TrimNotIntegers { dtype: field.dtype },
                    )
                })?;
                ids.iter().rposition(|&v| v != pad).map_or(0, |i| i + 1)
            }
        };
        Ok(range.start..range.start + keep as u64)
    }
}

/// The row ranges a lengths or offsets tensor gives for `rows` tokens.
fn bounds(
    by: &SplitBy,
    name: &str,
    bytes: &[u8],
    dtype: DType,
    rows: u64,
) -> Result<Vec<Range<u64>>, SplitError> {
    let values = dtype.ints(bytes).ok_or_else(|| SplitError::NotIntegers {
        tensor: name.to_string(),
        dtype,
    })?;
    let mut bounds = Vec::with_capacity(values.len() + 1);
    match by {
        SplitBy::Lengths(_) => {
            bounds.push(0i64);
            for v in &values {
                let last = *bounds.last().unwrap_or(&0);
                bounds.push(last.checked_add(*v).ok_or(SplitError::Overflow)?);
            }
        }
        SplitBy::CuSeqlens(_) => bounds = values,
    }
    let falls = bounds.windows(2).position(|w| w[1] < w[0]);
    let got = match (by, bounds.first(), bounds.last()) {
        (SplitBy::Lengths(_), ..) if falls.is_some() => {
            let at = falls.unwrap_or_default();
            Some(format!(
                "its length at position {at} is negative ({})",
                bounds[at + 1].saturating_sub(bounds[at])
            ))
        }
        (SplitBy::Lengths(_), _, Some(&sum)) if sum != rows as i64 => {
            Some(format!("its {} lengths add up to {sum}", bounds.len() - 1))
        }
        (SplitBy::CuSeqlens(_), None, _) => Some("it holds no offsets".into()),
        (SplitBy::CuSeqlens(_), Some(&first), _) if first != 0 => {
            Some(format!("its offsets start at {first}, not 0"))
        }
        (SplitBy::CuSeqlens(_), _, Some(&last)) if last != rows as i64 => {
            Some(format!("its offsets end at {last}, not {rows}"))
        }
        (SplitBy::CuSeqlens(_), ..) if falls.is_some() => Some(format!(
            "its offsets fall after position {}",
            falls.unwrap_or_default()
        )),
        _ => None,
    };
    if let Some(got) = got {
        return Err(SplitError::Bounds {
            tensor: name.to_string(),
            rows,
            got,
        });
    }
    Ok(bounds
        .windows(2)
        .map(|w| w[0] as u64..w[1] as u64)
        .collect())
}

/// The bytes of each field of `schema` (`fields`, the unit's, in schema order) for the
/// sample of `rows`, by field name.
pub fn sample_rows<'a>(
    schema: &'a Schema,
    fields: &'a [Cow<'a, [u8]>],
    rows: &Range<u64>,
) -> Vec<(&'a str, &'a [u8])> {
    schema
        .fields
        .iter()
        .zip(fields)
        .map(|(f, b)| {
            let rb = f.row_bytes() as usize;
            (
                f.name.as_str(),
                &b[rows.start as usize * rb..rows.end as usize * rb],
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A negative length is named by its position and its value (it said "length 1 is
    /// negative", where 1 was the position).
    #[test]
    fn a_negative_length_is_named_by_its_position_and_value() {
        let lens: Vec<u8> = [2i64, -1, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        let by = SplitBy::Lengths("lens".into());
        let err = bounds(&by, "lens", &lens, DType::I64, 5).unwrap_err();
        assert!(
            err.to_string()
                .contains("its length at position 1 is negative (-1)"),
            "{err}"
        );
    }
}
