//! Errors of loci-array: each names the bad part and what would have been valid.

/// Why an array operation cannot be done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArrayError {
    /// Bad dimensions, attributes or chunking.
    #[error("array schema: {0}")]
    Schema(String),
    /// A box with the wrong number of ranges.
    #[error("the box has {got} ranges but the array has {want} dimensions ({dims})")]
    BoxDims {
        got: usize,
        want: usize,
        dims: String,
    },
    /// A range that is reversed (start past its end) or leaves the array (`why` says which).
    #[error("dimension `{dim}`: range {lo}..{hi} is {why}; valid extent is 0..{len}")]
    Range {
        dim: String,
        lo: usize,
        hi: usize,
        len: usize,
        why: &'static str,
    },
    /// Memory could not be mapped or its policy could not be set.
    #[error("memory: {0}")]
    Memory(String),
    /// A thread could not be pinned as planned.
    #[error("pinning: {0}")]
    Pin(String),
    /// A file could not be read or written.
    #[error("{0}")]
    Io(String),
    /// Text that does not parse (a box, a strategy, a span).
    #[error("{0}")]
    Parse(String),
}

/// The member of `all` that `s` (trimmed) names, or an error naming `s` and the `choices`
/// (`what`: what is named, for the message).
pub(crate) fn by_name<T: Copy, const N: usize>(
    all: &[T],
    names: impl Fn(T) -> [&'static str; N],
    what: &str,
    choices: &str,
    s: &str,
) -> Result<T, String> {
    let s = s.trim();
    all.iter()
        .copied()
        .find(|&t| names(t).contains(&s))
        .ok_or_else(|| format!("unknown {what} `{s}`; valid: {choices}"))
}
