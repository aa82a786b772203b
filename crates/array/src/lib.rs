//! loci-array: dense chunked N-dimensional arrays whose chunks live on chosen NUMA nodes, the
//! `subarray` copy run by pinned worker threads, the thread strategies of seed 000 (SAVIME/SciDB
//! under pinning), and a placement search that beats them.
//!
//! Glossary (see DESIGN.md for the shared words):
//! - **layout**: dimensions (named, `0..len`), attributes (named, typed) and the chunk grid;
//! - **chunk**: one cell of the grid, one memory region, one **home** node;
//! - **box**: one half-open range per dimension; `subarray(box)` copies its cells into a new array;
//! - **part**: the unit of work of a subarray: a slab of one box ∩ chunk intersection;
//! - **plan**: a loci-place [`Plan`]: the cpus of each worker thread (an `os` plan: the OS chooses);
//! - **strategy**: a loci-place strategy that yields a plan (`os`, `compact`, `sparse`,
//!   `shared:G`, `random:SEED`, ...; `shared` alone: G = threads per touched chunk);
//! - **search**: tries plans and keeps the fastest (`best-of:K`, `elastic`, `search`).

pub mod array;
pub mod dtype;
pub mod error;
pub mod layout;
pub mod mem;
pub mod model;
pub mod pin;
pub mod pool;
pub mod query;
pub mod search;
pub mod seismic;
pub mod strategy;
pub mod subarray;
// Under loom only the models use the helpers (callers copy alone there).
#[cfg_attr(loom, allow(dead_code))]
pub mod team;

pub use array::{Array, BuildOptions, Chunk, ChunkFill};
pub use dtype::DType;
pub use error::ArrayError;
pub use layout::{Attr, Bounds, Chunking, Dim, Layout, PerDim, ShowBox, INLINE_DIMS};
pub use loci_place::Plan;
pub use mem::{chunk_homes, chunk_policy, Home, Region, CHUNK_POLICIES};
pub use model::{CostModel, ModelLimits, ModelWorkload};
pub use pin::run_pinned;
pub use pool::{Binding, BufferPool, PoolStats};
pub use query::{Query, Span};
pub use search::{search, Evaluator, ModelEval, SearchCache, SearchConfig, SearchOutcome, Trial};
pub use seismic::{seismic_layout, Seismic};
pub use strategy::{choose, Choice, PlanSearch, RunInfo, ThreadPlacement};
pub use subarray::{plan_parts, subarray, Part, PoolOutcome, RunStats, Schedule, SubarrayOptions};
