//! Moving datasets between storages, with every byte proven on the way.

pub mod copy;

pub use copy::{copy, CopyMode, CopyOptions, CopyReport};
