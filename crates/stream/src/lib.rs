//! loci-stream: NUMA-aware, lossless streaming of detector data.
//!
//! Pipeline (seed 001): `compress (C threads, each reading its own chunks) -> queue -> send (S
//! threads, one TCP connection each) -> recv (R threads) -> queue -> decompress (D threads) ->
//! sink`, every
//! stage's threads placed by a loci-place `Plan` (started with its `apply_thread`) and their
//! buffers on their own node. See [`proto`] for the wire protocol, [`plan`] for the configuration
//! generator (seed 001's rules choose the cpus, the stages are loci-place plans),
//! [`config`] for the TOML files, [`sink`] for the durable journal that makes resume work.

pub mod buf;
pub mod codec;
pub mod config;
pub mod hash;
pub mod phantom;
pub mod plan;
pub mod proto;
pub mod recv;
pub mod secret;
pub mod send;
pub mod sink;
pub mod source;
pub mod stats;

pub use codec::Codec;
pub use config::{ReceiverConfig, SenderConfig, Stage};
pub use recv::{Receiver, RecvOptions};
pub use send::{send, Faults, SendOptions};
pub use sink::SinkSpec;
pub use source::SourceSpec;
pub use stats::StreamReport;
