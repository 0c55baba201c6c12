//! A quantized field as stored: FP8 codes and their scales, for trainers that consume them
//! without dequantizing (FORMAT.md §4.1).

use std::ops::Range;

use crate::error::{Error, Result};

use super::dataset::Sample;

/// Rows of a quantized field as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedRows {
    /// E4M3FN codes, `rows × row elements`, C-ordered as the field's rows.
    pub codes: Vec<u8>,
    /// One scale per group: `rows × (row elements / group)`, a row's groups in order.
    pub scales: Vec<f32>,
    /// Elements sharing a scale.
    pub group: u64,
}

impl Sample<'_> {
    /// Rows `rows` (all when `None`) of quantized field number `f` as stored: a value is its
    /// code times its group's scale. Every scale and code is checked as when decoding.
    pub fn read_quantized(&self, f: usize, rows: Option<Range<u64>>) -> Result<QuantizedRows> {
        let schema = self.ds.schema();
        let field = self.ds.field(f)?;
        if field.quantized.is_none() {
            return Err(Error::BadOption {
                option: "field",
                detail: format!(
                    "field `{}` is stored exactly, not quantized: read it as it is",
                    field.name
                ),
            });
        }
        let rows = rows.unwrap_or(0..self.rows());
        self.check_rows(&rows)?;
        // Rows an index declares: the memory is asked for, never assumed (a crafted index
        // may declare terabytes).
        let n = rows.end - rows.start;
        let mut out = QuantizedRows {
            codes: Vec::new(),
            scales: Vec::new(),
            group: field.group(),
        };
        self.reserve(&mut out.codes, n, field.row_elems())?;
        self.reserve(&mut out.scales, n, field.row_elems() / field.group())?;
        for x in self.extents(f) {
            let lo = x.row_start.max(rows.start);
            let hi = (x.row_start + x.row_count).min(rows.end);
            if lo >= hi {
                continue;
            }
            let (e, stored) = self
                .shard
                .chunk(x.chunk.into(), schema, self.ds.options().check)?;
            let first = (x.chunk_row + lo - x.row_start) as usize;
            let (scales, codes) = self.shard.fp8_rows(
                x.chunk.into(),
                &e,
                &stored,
                schema,
                first..first + (hi - lo) as usize,
            )?;
            out.codes.extend_from_slice(codes);
            out.scales.extend(scales);
        }
        Ok(out)
    }
}
