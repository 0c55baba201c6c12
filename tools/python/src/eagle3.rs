//! `EAGLE3`: the EAGLE-3 names of `hspack::format::eagle3`, for the Python package, which
//! spells none of them itself.

use hspack::format::eagle3;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// `{"fields": {...}, "view": {...}, "specforge_item": {...}}`: the field names hspack writes
/// ([`eagle3::FIELDS`]), the keys of the `eagle3` view ([`eagle3::VIEW`]) and of SpecForge's
/// dataset items, the `eagle3-specforge` view ([`eagle3::SPECFORGE_ITEM`], with its
/// `attention_mask`).
pub fn names(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let dict = |entries: &[(&str, &str)]| -> PyResult<Bound<'_, PyDict>> {
        let d = PyDict::new(py);
        for (part, name) in entries {
            d.set_item(part, name)?;
        }
        Ok(d)
    };
    let item = dict(&eagle3::SPECFORGE_ITEM.entries())?;
    item.set_item("attention_mask", eagle3::ATTENTION_MASK)?;
    let out = PyDict::new(py);
    out.set_item("fields", dict(&eagle3::FIELDS)?)?;
    out.set_item("view", dict(&eagle3::VIEW.entries())?)?;
    out.set_item("specforge_item", item)?;
    Ok(out)
}
