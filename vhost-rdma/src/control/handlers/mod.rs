//! One handler per feature: each turns its requests into calls on the
//! fabric's engines and their results into a reply. The engines know nothing
//! of the control protocol.

pub mod checker;
pub mod faults;
pub mod steering;
