//! loci-place: where threads run and where memory lives.

pub mod sys;
