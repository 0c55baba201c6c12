//! Moving datasets between storages, with every byte proven on the way.

pub mod copy;
pub mod repair;

pub use copy::{copy, CopyMode, CopyOptions, CopyReport};
pub use repair::{repair, RepairReport};
