//! [`JoinRun`], how W4's index join ran ([`crate::index::probe`]). W3, the hash join, runs on
//! the 64-bit tables in [`crate::wide`].

use crate::Trace;

/// How a join ran.
#[derive(Debug, Clone, Default)]
pub struct JoinRun {
    /// Which node read each S morsel (probe side, the bulk of the bytes).
    pub probe_trace: Trace,
}
