//! The `ctl` side of the binary: clap arguments and the printing of replies.
//! Only the binary prints; the library answers with data.

pub mod checker;
pub mod faults;
pub mod steering;
