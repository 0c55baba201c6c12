//! A pickle reader that never executes code.
//!
//! Every opcode of protocols 0 to 5 is understood. Globals are checked against an
//! allowlist modelled on `torch.load(weights_only=True)` at the opcode that names them,
//! before anything is built; calls of allowed globals (`REDUCE`, `NEWOBJ`, `BUILD`, ...)
//! produce inert [`Value`]s such as [`TensorRef`] instead of running anything.
//! Opcodes that need state hspack does not have (`EXT*`, `NEXT_BUFFER`, text `PERSID`)
//! are refused with an error.
//!
//! Resources are bounded by the input: every length is checked against the bytes that
//! remain before anything is copied, the stack and memo grow by at most one entry per
//! opcode byte, nesting is limited to a fixed depth (which also rejects cycles), and the
//! bytes produced by expanding shared references into the owned [`Value`] tree are
//! metered against a budget proportional to the input size.

use std::path::Path;

use super::ConvertError;

mod calls;
mod globals;
mod text;
mod value;
mod vm;

pub(crate) use globals::numpy_descr;
pub use value::{NdArray, StorageKind, StorageRef, TensorLike, TensorRef, Value};

/// Decodes one pickle from the start of `bytes`; bytes after its `STOP` are ignored.
/// `file` names the source in errors.
pub fn parse(bytes: &[u8], file: &Path) -> Result<Value, ConvertError> {
    parse_prefix(bytes, file).map(|(v, _, _)| v)
}

/// Decodes one pickle from the start of `bytes` and returns it with the number of bytes
/// it occupied (through its `STOP` opcode), for streams of consecutive pickles, and every
/// storage its persistent ids named (the first of each key), in order: also those the value no longer holds (a dict
/// entry given again, a tensor of a dtype hspack does not store), whose bytes a legacy file
/// still holds.
pub fn parse_prefix(
    bytes: &[u8],
    file: &Path,
) -> Result<(Value, usize, Vec<StorageRef>), ConvertError> {
    let mut machine = vm::Machine::new(bytes, file);
    let value = machine.run()?;
    Ok((value, machine.pos, machine.loaded))
}

#[cfg(test)]
mod tests;
