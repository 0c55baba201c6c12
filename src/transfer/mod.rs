//! Moving datasets between storages, with every byte proven on the way.

pub mod copy;
pub mod merge;
pub mod repair;

pub use copy::{copy, CopyMode, CopyOptions, CopyReport};
pub use merge::{merge, MergeReport};
pub use repair::{repair, RepairReport};
