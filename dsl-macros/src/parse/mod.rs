//! Parsing and validating what the author wrote.

pub mod attr;
pub mod validate;
