//! loci-engine: in-memory query operators over node-homed data (seeds 002 and 004).
//!
//! Glossary (DESIGN.md): a **morsel** is a slice of a table with a **home node**; a **worker** is
//! a loci-sched worker thread, pinned to its core group (or not); the **local-access ratio** is the share of bytes a worker
//! read from morsels whose pages sit on its own node, sampled with `move_pages(2)`.
//!
//! - [`gen`]: seeded, chunking-independent data generators (aggregation datasets, join tables).
//! - [`storage`]: tables of `(key: u32, val: u32)` or `(key: u64, val: i64)` morsels placed by
//!   loci-place's [`MemPolicy`] (`per-node` gives each node a contiguous share of the morsels).
//! - [`exec`]: [`Exec`], operators' workers on loci-sched (LAS, NLS or unpinned): every morsel
//!   is a task queued on its home node's core group.
//! - [`partition`]: two-pass radix partitioning into node-homed partitions.
//! - [`agg`]: W2 (count/sum/min/max/avg by key) and W1 (exact median by key).
//! - [`join`]: join result types (W3, the hash join, is in [`wide`]).
//! - [`index`]: W4 index nested-loop join on the 64-bit tables over sorted array, B-tree, skip
//!   list or ART (`[u8; 8]` big-endian keys), answered by W3's join digest.
//! - [`wide`]: the 64-bit tables (`u64` keys anywhere in the domain, `i64` or `f64` values) and their
//!   operators: W2 and W1 by hash partitioning and open addressing, W3 partitioned hash join, and
//!   the order-independent answer digests the benchmark compares with the peers.
//! - [`tpch`]: TPC-H Q1, Q3, Q5, Q6 and Q18 as physical plans over typed columnar morsels
//!   generated in process by `tpchgen`.
//! - [`reference`]: simple single-thread answers the differential tests compare against.

/// `CHOICES`, `Display` and `FromStr` of a fieldless enum from one table of names: a variant
/// prints as its first name, parses from any of them; a bad name is a `BadChoice` listing
/// `CHOICES`.
macro_rules! named_choices {
    ($ty:ty, $what:literal, $choices:literal, $($var:ident => $name:literal $(| $alias:literal)*),+ $(,)?) => {
        impl $ty {
            /// Names accepted by [`FromStr`](std::str::FromStr).
            pub const CHOICES: &'static str = $choices;
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self {
                    $(Self::$var => $name,)+
                })
            }
        }
        impl std::str::FromStr for $ty {
            type Err = $crate::EngineError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name $(| $alias)* => Ok(Self::$var),)+
                    _ => Err($crate::EngineError::BadChoice {
                        what: $what,
                        given: s.into(),
                        valid: Self::CHOICES,
                    }),
                }
            }
        }
    };
}

pub mod agg;
pub mod exec;
pub mod gen;
pub mod index;
pub mod join;
pub mod partition;
pub mod reference;
pub mod storage;
pub mod tpch;
pub mod wide;

pub use exec::{parse_sched, Exec, Locality, Pass};
pub use gen::{AggGen, AggSpec, Dist, JoinSpec, Keys, Values};
/// Where a table's pages go: loci-place's memory policies.
pub use loci_place::MemPolicy;
use loci_place::PartOrder;
/// How workers are placed on cpus: loci-place's strategies.
pub use loci_place::Strategy;
pub use loci_sched::Policy as Sched;
pub use storage::{Morsel, Table};

/// Errors of the engine: bad input named with the valid choices, or a failed system call.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("unknown {what} '{given}'; valid: {valid}")]
    BadChoice {
        what: &'static str,
        given: String,
        valid: &'static str,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{what} failed: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// The kernel would not apply the memory plan to a mapping; names the range and the policy.
    #[error(transparent)]
    Placement(#[from] loci_place::apply::RangeError),
}

/// Default rows per morsel: 1 Mi rows = 8 MiB of key+value, large enough to amortize scheduling
/// and page sampling, small enough for 100 morsels per 100M-row table.
pub const MORSEL_ROWS: usize = 1 << 20;

/// A raw pointer that may cross threads; users promise disjoint access (see each SAFETY note).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub *mut T);
impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper, not the field).
    #[inline(always)]
    pub(crate) fn ptr(&self) -> *mut T {
        self.0
    }
}

// SAFETY: only used to hand disjoint ranges or distinct elements of one allocation to workers.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

/// Allowed memory nodes of the executor's machine, ascending.
pub fn mem_nodes(exec: &Exec) -> Vec<u32> {
    let t = exec.topology();
    let mut v: Vec<u32> = t.allowed_mems().iter().collect();
    if v.is_empty() {
        v = t.nodes.iter().map(|n| n.id).collect();
    }
    v
}

/// What one generation or operator pass did: which node ran each morsel.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// (morsel, node of the worker that processed it; None = unknown).
    pub touched: Vec<(usize, Option<u32>)>,
}

impl Trace {
    /// Both passes' items (an operator that reads its input twice).
    pub fn and(mut self, other: Trace) -> Trace {
        self.touched.extend(other.touched);
        self
    }
}

/// Who writes a generated table (under first touch: where its pages land).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gen {
    /// Each morsel by a task on its home node's workers (first touch: each node with workers
    /// writes a contiguous share of the morsels).
    #[default]
    Workers,
    /// One task writes the whole table (the classic accident under first touch: every page on
    /// that worker's node).
    OneThread,
}

named_choices!(Gen, "generation", "workers, one-thread",
    Workers => "workers",
    OneThread => "one-thread",
);

/// How a generated table is laid out: loci-place's memory policy for its morsels, and who
/// writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableMem {
    pub policy: MemPolicy,
    pub gen: Gen,
}

impl From<MemPolicy> for TableMem {
    /// The policy, written by the workers.
    fn from(policy: MemPolicy) -> Self {
        TableMem {
            policy,
            gen: Gen::Workers,
        }
    }
}

impl std::fmt::Display for TableMem {
    /// `per-node`, or `first-touch/one-thread` when one thread writes the table.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.gen {
            Gen::Workers => write!(f, "{}", self.policy),
            g => write!(f, "{}/{g}", self.policy),
        }
    }
}

/// A row generator of either table layout: `fill(start_row, keys, vals)` writes rows
/// `start_row..` into both columns.
#[derive(Clone, Copy)]
pub enum Fill<'a> {
    /// `(u32, u32)` rows; the table gets its key range ([`Table::key_range`]).
    U32(&'a FillRows<'a, u32, u32>),
    /// `(u64, i64)` rows; no statistic is kept (the 64-bit operators use none).
    U64(&'a FillRows<'a, u64, i64>),
    /// `(u64, f64)` rows; no statistic either.
    F64(&'a FillRows<'a, u64, f64>),
}

/// `fill(start_row, keys, vals)` for one column layout.
pub type FillRows<'a, K, V> = dyn Fn(u64, &mut [K], &mut [V]) + Sync + 'a;

impl Fill<'_> {
    /// Fills a morsel of this layout from `start`; returns its key range (32-bit rows).
    fn morsel(self, start: u64, mo: &mut Morsel) -> Option<(u32, u32)> {
        match self {
            Fill::U32(f) => {
                let (k, v) = mo.cols_mut();
                f(start, k, v);
                Some((k.iter().copied().min()?, k.iter().copied().max()?))
            }
            Fill::U64(f) => {
                let (k, v) = mo.cols64_mut();
                f(start, k, v);
                None
            }
            Fill::F64(f) => {
                let (k, v) = mo.cols64f_mut();
                f(start, k, v);
                None
            }
        }
    }
}

/// Generates a table of `rows` rows with `fill`, morsel by morsel on the executor's workers,
/// straight into storage placed by `mem.policy`. Morsels with a home are generated by a task
/// queued on their home node; for first touch (and `localalloc`), each node with workers gets a
/// contiguous share of the generation tasks, and each morsel's home becomes the node of the
/// worker that actually generated it. [`Gen::OneThread`] generates everything in one task.
pub fn generate(
    exec: &Exec,
    rows: usize,
    morsel_rows: usize,
    mem: &TableMem,
    fill: Fill<'_>,
) -> Result<(Table, Trace), EngineError> {
    let width = match fill {
        Fill::U32(_) => 4,
        Fill::U64(_) | Fill::F64(_) => 8,
    };
    let plan = storage::resolve(exec.topology(), &mem.policy)?;
    let mut table = Table::alloc_width(rows, morsel_rows, &plan, width)?;
    let m = table.morsels.len();
    let wn = exec.worker_nodes();
    // Pages land where they are written: the generation tasks are dealt to the nodes with
    // workers in contiguous shares, loci-place's `per-node` order.
    let touch = matches!(plan.policy, "first-touch" | "localalloc");
    let homes: Vec<Option<u32>> = table
        .morsels
        .iter()
        .enumerate()
        .map(|(i, mo)| match touch {
            true => Some(wn[PartOrder::Blocks.node_index(i, m, wn.len())]),
            false => mo.home,
        })
        .collect();
    let starts: Vec<u64> = table
        .morsels
        .iter()
        .scan(0u64, |s, m| {
            let r = *s;
            *s += m.rows() as u64;
            Some(r)
        })
        .collect();
    let base = SendPtr(table.morsels.as_mut_ptr());
    // Fills morsel i and returns its key range (32-bit tables).
    let one = |i: usize| -> Option<(u32, u32)> {
        // SAFETY: every morsel index is handed to exactly one task (or the one sequential loop),
        // so this is the only reference to morsel i; the Vec is not resized meanwhile.
        let mo = unsafe { &mut *base.ptr().add(i) };
        fill.morsel(starts[i], mo)
    };
    let merge = |a: Option<(u32, u32)>, b: Option<(u32, u32)>| match (a, b) {
        (Some(a), Some(b)) => Some((a.0.min(b.0), a.1.max(b.1))),
        (a, None) => a,
        (None, b) => b,
    };
    let (range, touched) = if mem.gen == Gen::OneThread {
        let (r, node) = exec.one(|| (0..m).map(one).fold(None, merge));
        (r, (0..m).map(|i| (i, node)).collect::<Vec<_>>())
    } else {
        let pass = exec.for_each(
            &homes,
            || None,
            |r: &mut Option<(u32, u32)>, i| {
                *r = merge(*r, one(i));
            },
        );
        (
            pass.states.into_iter().fold(None, merge),
            pass.trace.touched,
        )
    };
    if touch {
        for &(i, n) in &touched {
            table.morsels[i].home = n;
        }
    }
    table.key_range = range;
    Ok((table, Trace { touched }))
}

/// Generates an aggregation dataset: a 32-bit table (`keys` None), or a 64-bit one with `i64`
/// values whose keys are the ranks of `spec`'s distribution laid out as `keys`.
pub fn generate_agg(
    exec: &Exec,
    spec: AggSpec,
    keys: Option<Keys>,
    morsel_rows: usize,
    mem: &TableMem,
) -> Result<Table, EngineError> {
    match keys {
        None => {
            let g = AggGen::new(spec)?;
            let f = Fill::U32(&|s, k, v| g.fill(s, k, v));
            Ok(generate(exec, spec.rows, morsel_rows, mem, f)?.0)
        }
        Some(keys) => generate_agg64(exec, spec, keys, Values::I64, morsel_rows, mem),
    }
}

/// Generates a 64-bit aggregation dataset: keys as [`generate_agg`], values of type `values`
/// ([`gen::val64`] or [`gen::val_f64`] of the same row).
pub fn generate_agg64(
    exec: &Exec,
    spec: AggSpec,
    keys: Keys,
    values: Values,
    morsel_rows: usize,
    mem: &TableMem,
) -> Result<Table, EngineError> {
    let g = AggGen::new(spec)?;
    let fill_i64 = |s, k: &mut [u64], v: &mut [i64]| g.fill64(s, keys, k, v);
    let fill_f64 = |s, k: &mut [u64], v: &mut [f64]| g.fill64(s, keys, k, v);
    let fill = match values {
        Values::I64 => Fill::U64(&fill_i64),
        Values::F64 => Fill::F64(&fill_f64),
    };
    let (t, _) = generate(exec, spec.rows, morsel_rows, mem, fill)?;
    Ok(t)
}

/// Generates the join tables R and S of W3 and W4, keys laid out as `keys`.
pub fn generate_join(
    exec: &Exec,
    spec: JoinSpec,
    keys: Keys,
    morsel_rows: usize,
    mem: &TableMem,
) -> Result<(Table, Table), EngineError> {
    spec.check()?;
    let table = |rows, fill| Ok::<_, EngineError>(generate(exec, rows, morsel_rows, mem, fill)?.0);
    Ok((
        table(
            spec.r_rows,
            Fill::U64(&|s, k, v| spec.fill_r64(s, keys, k, v)),
        )?,
        table(
            spec.s_rows,
            Fill::U64(&|s, k, v| spec.fill_s64(s, keys, k, v)),
        )?,
    ))
}
