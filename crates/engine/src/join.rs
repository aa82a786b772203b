//! Join result types: [`JoinRun`], how W4's index join ran ([`crate::index::probe`]), and
//! [`JoinResult`], the answer of the 32-bit reference join ([`crate::reference::join`]). W3,
//! the hash join, runs on the 64-bit tables in [`crate::wide`].

use crate::Trace;

/// Result of a join on 32-bit rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JoinResult {
    /// Number of matching (r, s) pairs.
    pub count: u64,
    /// Sum of `r.val + s.val` over the pairs.
    pub checksum: u64,
}

/// How a join ran.
#[derive(Debug, Clone, Default)]
pub struct JoinRun {
    /// Which node read each S morsel (probe side, the bulk of the bytes).
    pub probe_trace: Trace,
}
