//! Sender and receiver configuration files (TOML), as written by `loci stream plan`.
//!
//! ```toml
//! # send.toml: one stream leaving one sender
//! stream = 0
//! chunk_bytes = 1048576
//! codec = "lz4-c"
//! window = 32            # most chunks in flight (sent, not yet acknowledged)
//! queue_depth = 8        # compress -> send queue
//! [compress]             # each compressing thread reads its own chunks from the source
//! count = 2
//! cpus = ["0", "1"]      # one cpu list per thread; leave out for OS placement
//! mem = [0, 0]           # the node each thread's buffers live on; leave out for "wherever it runs"
//! [send]
//! count = 1
//! cpus = ["1"]
//! mem = [0]
//! ```
//!
//! ```toml
//! # recv.toml: every stream one receiver accepts, each with its own cores
//! max_chunk_bytes = 268435456
//! sync = "data"          # none | journal | data: what is fsync'd before a chunk is acknowledged
//! [[stream]]
//! id = 0
//! queue_depth = 8        # recv -> decompress queue
//! [stream.recv]
//! count = 1
//! cpus = ["1"]
//! mem = [0]
//! [stream.decompress]
//! count = 1
//! cpus = ["0"]
//! mem = [0]
//! ```

use std::path::{Path, PathBuf};

use loci_place::{MemPolicy, Plan, PlanError, Strategy};
use loci_topo::{CpuSet, NodeSet, Topology};
use serde::{Deserialize, Serialize};

use crate::codec::Codec;

pub use crate::secret::{check_secret, secret, MIN_SECRET_BYTES, SECRET_ENV};

/// Where the threads of one stage run and where their buffers live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Number of threads.
    pub count: usize,
    /// One cpu list per thread (`sched_setaffinity`); empty: the OS places them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpus: Vec<CpuSet>,
    /// One node per thread for its buffers (`mbind`); empty: first touch wherever it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mem: Vec<u32>,
}

impl Stage {
    /// `count` threads placed by the OS.
    pub fn os(count: usize) -> Self {
        Stage {
            count,
            cpus: vec![],
            mem: vec![],
        }
    }
    /// Checks counts and list lengths; `what` names the stage in errors.
    pub fn validate(&self, what: &str) -> Result<(), ConfigError> {
        if self.count == 0 {
            return Err(ConfigError::Invalid(format!(
                "{what}.count is 0; every stage needs at least one thread"
            )));
        }
        if self.count > 4096 {
            return Err(ConfigError::Invalid(format!(
                "{what}.count = {} is beyond 4096 threads",
                self.count
            )));
        }
        if !self.cpus.is_empty() && self.cpus.len() != self.count {
            return Err(ConfigError::Invalid(format!(
                "{what}.cpus has {} entries but count = {} (give one cpu list per thread, or none)",
                self.cpus.len(),
                self.count
            )));
        }
        if let Some(i) = self.cpus.iter().position(|c| c.is_empty()) {
            return Err(ConfigError::Invalid(format!("{what}.cpus[{i}] is empty")));
        }
        if !self.mem.is_empty() && self.mem.len() != self.count {
            return Err(ConfigError::Invalid(format!(
                "{what}.mem has {} entries but count = {} (give one node per thread, or none)",
                self.mem.len(),
                self.count
            )));
        }
        Ok(())
    }
    /// The stage as a loci-place plan on `topo`: thread `i` bound to `cpus[i]` (or placed by the
    /// OS when `cpus` is left out), and the threads' memory policy from `mem`: none given is
    /// first-touch, one node for every thread is `preferred:N`, each thread's own cpu node (what
    /// `loci stream plan` writes) is `localalloc`. `what` names the stage in errors.
    pub fn plan(&self, topo: &Topology, what: &str) -> Result<Plan, ConfigError> {
        let mem = self.mem_policy(topo, what)?;
        let plan = if self.cpus.is_empty() {
            // Oversubscribed on purpose: stage sizes do not depend on the machine's cpu count.
            Plan::new(topo, &Strategy::os(), self.count, &mem, true)
        } else {
            Plan::from_cpu_sets(topo, self.cpus.clone(), &mem)
        };
        plan.map_err(|e| ConfigError::Invalid(format!("{what}: {}", plan_message(e))))
    }

    fn mem_policy(&self, topo: &Topology, what: &str) -> Result<MemPolicy, ConfigError> {
        let Some(&first) = self.mem.first() else {
            return Ok(MemPolicy::FirstTouch);
        };
        if self.mem.iter().all(|&n| n == first) {
            return Ok(MemPolicy::Preferred(first));
        }
        let own_node = |(i, &n): (usize, &u32)| {
            let c = self.cpus.get(i)?;
            let nodes: NodeSet = c.iter().filter_map(|c| topo.node_of_cpu(c)).collect();
            (nodes == NodeSet::single(n)).then_some(())
        };
        if self.mem.iter().enumerate().all(|x| own_node(x).is_some()) {
            return Ok(MemPolicy::Local);
        }
        Err(ConfigError::Invalid(format!(
            "{what}.mem = {:?}: give one node for every thread, or for each thread the node of              its cpus (a stage has one memory policy: preferred:N or localalloc)",
            self.mem
        )))
    }

    /// The stage a plan describes (the inverse of [`Stage::plan`]), as config files hold it.
    pub fn from_plan(plan: &Plan) -> Self {
        let count = plan.threads.len();
        let mem: Vec<u32> = (0..count).map_while(|i| buffer_node(plan, i)).collect();
        Stage {
            count,
            cpus: if plan.pinned {
                plan.threads.iter().map(|t| t.cpus.clone()).collect()
            } else {
                vec![]
            },
            mem: if mem.len() == count { mem } else { vec![] },
        }
    }
    /// The same thread count, placed by the OS.
    pub fn unpinned(&self) -> Self {
        Stage::os(self.count)
    }
}

/// A loci-place plan error without its `--threads:`/`--mem:` flag prefix (stream stages come from
/// config files and the generator, not from flags).
pub(crate) fn plan_message(e: PlanError) -> String {
    match e {
        PlanError::Strategy(e) => e.to_string(),
        PlanError::Policy(e) => e.to_string(),
    }
}

/// This machine's topology, which stage plans are made against when a stream runs.
pub fn this_machine() -> Result<Topology, ConfigError> {
    loci_topo::load(&loci_topo::Source::live())
        .map_err(|e| ConfigError::Invalid(format!("reading this machine's topology: {e}")))
}

/// The node thread `i` of a stage plan keeps its buffers on: the policy's one node
/// (`preferred:N`, `bind:N`), or for `localalloc` the node of the thread's cpus; `None` when the
/// plan leaves it to first touch.
pub fn buffer_node(plan: &Plan, i: usize) -> Option<u32> {
    let one = |s: &NodeSet| (s.len() == 1).then(|| s.first()).flatten();
    match plan.memory.policy {
        "localalloc" if plan.pinned => one(&plan.threads.get(i)?.nodes),
        "preferred" | "bind" => one(&plan.memory.nodes),
        _ => None,
    }
}

/// A bad configuration file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {err}")]
    Read { path: String, err: std::io::Error },
    #[error("{path}: {err}")]
    Parse { path: String, err: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// No usable shared secret (none given, too short, or a secret file others can read).
    #[error("shared secret: {0}")]
    Secret(String),
}

/// Chunk size of a sender config that gives none, and of `loci stream plan`: 1 MiB. Small enough
/// that a chunk and its compressed copy are still cached when they are hashed, large enough that
/// per-chunk costs vanish; the best of 512 KiB to 11 MB on the development machine
/// (docs/stream.md, "Chunk size").
pub const DEFAULT_CHUNK_BYTES: usize = 1 << 20;
fn default_chunk() -> usize {
    DEFAULT_CHUNK_BYTES
}
fn default_window() -> usize {
    32
}
fn default_depth() -> usize {
    8
}
fn default_max_connections() -> usize {
    256
}
fn default_handshake_secs() -> u64 {
    10
}
/// Largest chunk a sender may use, and the receiver's default `max_chunk_bytes`.
pub const MAX_CHUNK_BYTES: u64 = 256 << 20;
fn default_max_chunk() -> u64 {
    MAX_CHUNK_BYTES
}
/// Largest window and queue depth, in chunks (the queues are allocated up front).
const MAX_DEPTH: usize = 65536;
/// Largest `max_connections` a receiver config may give.
const MAX_CONNECTIONS: usize = 65536;
/// Largest `handshake_timeout_secs` a receiver config may give (one hour).
const MAX_HANDSHAKE_SECS: u64 = 3600;

/// `encrypt` and `unauthenticated` contradict each other.
fn check_protection(encrypt: bool, unauthenticated: bool) -> Result<(), ConfigError> {
    if encrypt && unauthenticated {
        return Err(ConfigError::Invalid(
            "encrypt = true and unauthenticated = true contradict each other (encrypted frames \
             are authenticated too; unauthenticated frames carry only a checksum): set at most \
             one of them"
                .into(),
        ));
    }
    Ok(())
}

/// One stream leaving one sender.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SenderConfig {
    /// Stream id (the receiver's config gives each id its own cores).
    #[serde(default)]
    pub stream: u32,
    #[serde(default = "default_chunk")]
    pub chunk_bytes: usize,
    #[serde(default)]
    pub codec: Codec,
    /// Most chunks sent and not yet acknowledged (memory held for resending: window x chunk).
    #[serde(default = "default_window")]
    pub window: usize,
    /// Compress -> send queue depth (chunks).
    #[serde(default = "default_depth")]
    pub queue_depth: usize,
    /// Shared secret; when absent, `LOCI_STREAM_SECRET` from the environment. A `secret_file`
    /// (or `--secret-file`) takes precedence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// A file holding the shared secret (mode 0600 or 0400); see [`secret`]. `loci stream` takes
    /// a relative path relative to the config file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    /// Encrypt every DATA payload (AES-256-GCM) as well as authenticating every frame.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypt: bool,
    /// Frames carry only an xxh3 checksum: no authentication, anyone on the path can forge data.
    /// For measurements and isolated links; the receiver must allow it too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unauthenticated: bool,
    /// The compressing threads; each reads its next chunk from the source itself (seed 001:
    /// "compressor threads successively fetch sequential data chunks").
    pub compress: Stage,
    pub send: Stage,
}

impl Default for SenderConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        SenderConfig {
            stream: 0,
            chunk_bytes: default_chunk(),
            codec: Codec::default(),
            window: default_window(),
            queue_depth: default_depth(),
            secret: None,
            secret_file: None,
            encrypt: false,
            unauthenticated: false,
            compress: Stage::os(cores),
            send: Stage::os(1),
        }
    }
}

impl SenderConfig {
    /// Checks every field; errors name the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.compress.validate("compress")?;
        self.send.validate("send")?;
        if self.chunk_bytes == 0 || self.chunk_bytes as u64 > default_max_chunk() {
            return Err(ConfigError::Invalid(format!(
                "chunk_bytes = {} outside 1..={}",
                self.chunk_bytes,
                default_max_chunk()
            )));
        }
        if self.send.count > u16::MAX as usize {
            return Err(ConfigError::Invalid("send.count beyond 65535".into()));
        }
        for (name, v) in [("window", self.window), ("queue_depth", self.queue_depth)] {
            if !(1..=MAX_DEPTH).contains(&v) {
                return Err(ConfigError::Invalid(format!(
                    "{name} = {v} outside 1..={MAX_DEPTH}"
                )));
            }
        }
        check_protection(self.encrypt, self.unauthenticated)?;
        Ok(())
    }
    /// The same thread counts, every stage placed by the OS.
    pub fn unpinned(&self) -> Self {
        SenderConfig {
            compress: self.compress.unpinned(),
            send: self.send.unpinned(),
            ..self.clone()
        }
    }
    /// Reads and validates a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let c: Self = load_toml(path)?;
        c.validate()?;
        Ok(c)
    }
    /// TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
    }
}

/// What the receiver makes durable before acknowledging a chunk (file sinks only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Sync {
    /// Nothing is fsync'd: survives a receiver crash (page cache), not a power loss.
    None,
    /// The journal is fsync'd, the data is not.
    Journal,
    /// Data (fdatasync) then journal are fsync'd: survives a power loss.
    #[default]
    Data,
}

/// The cores of one stream on the receiver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamPart {
    pub id: u32,
    /// Recv -> decompress queue depth (chunks).
    #[serde(default = "default_depth")]
    pub queue_depth: usize,
    pub recv: Stage,
    pub decompress: Stage,
}

/// Everything one receiver accepts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverConfig {
    /// Largest chunk a sender may announce.
    #[serde(default = "default_max_chunk")]
    pub max_chunk_bytes: u64,
    #[serde(default)]
    pub sync: Sync,
    /// Shared secret; when absent, `LOCI_STREAM_SECRET` from the environment. A `secret_file`
    /// (or `--secret-file`) takes precedence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// A file holding the shared secret (mode 0600 or 0400); see [`secret`]. `loci stream` takes
    /// a relative path relative to the config file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    /// Refuse senders that do not encrypt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypt: bool,
    /// Accept senders whose frames carry only an xxh3 checksum (unauthenticated).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unauthenticated: bool,
    /// Most connections served at once (handshaking or streaming); more are closed at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Seconds a connection has for its whole handshake, however it trickles its bytes.
    #[serde(default = "default_handshake_secs")]
    pub handshake_timeout_secs: u64,
    /// Streams and their cores. Empty: any stream id, OS placement, one receiving thread per
    /// connection and as many decompressors as cpus.
    #[serde(default, rename = "stream")]
    pub streams: Vec<StreamPart>,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            max_chunk_bytes: default_max_chunk(),
            sync: Sync::default(),
            secret: None,
            secret_file: None,
            encrypt: false,
            unauthenticated: false,
            max_connections: default_max_connections(),
            handshake_timeout_secs: default_handshake_secs(),
            streams: vec![],
        }
    }
}

impl ReceiverConfig {
    /// Checks every field; errors name the stream and field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::BTreeSet::new();
        for s in &self.streams {
            if !seen.insert(s.id) {
                return Err(ConfigError::Invalid(format!(
                    "stream {} appears twice",
                    s.id
                )));
            }
            s.recv.validate(&format!("stream {}.recv", s.id))?;
            s.decompress
                .validate(&format!("stream {}.decompress", s.id))?;
            if !(1..=MAX_DEPTH).contains(&s.queue_depth) {
                return Err(ConfigError::Invalid(format!(
                    "stream {}.queue_depth = {} outside 1..={MAX_DEPTH}",
                    s.id, s.queue_depth
                )));
            }
        }
        if self.max_chunk_bytes == 0 || self.max_chunk_bytes > 1 << 31 {
            return Err(ConfigError::Invalid(format!(
                "max_chunk_bytes = {} outside 1..=2147483648",
                self.max_chunk_bytes
            )));
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return Err(ConfigError::Invalid(format!(
                "max_connections = {} outside 1..={MAX_CONNECTIONS}",
                self.max_connections
            )));
        }
        if !(1..=MAX_HANDSHAKE_SECS).contains(&self.handshake_timeout_secs) {
            return Err(ConfigError::Invalid(format!(
                "handshake_timeout_secs = {} outside 1..={MAX_HANDSHAKE_SECS}",
                self.handshake_timeout_secs
            )));
        }
        check_protection(self.encrypt, self.unauthenticated)?;
        Ok(())
    }
    /// The part for stream `id`: from the config, or the default when the config lists none.
    pub fn part(&self, id: u32, conns: usize) -> Result<StreamPart, String> {
        if self.streams.is_empty() {
            let cores = std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1);
            return Ok(StreamPart {
                id,
                queue_depth: default_depth(),
                recv: Stage::os(conns.max(1)),
                decompress: Stage::os(cores),
            });
        }
        self.streams
            .iter()
            .find(|s| s.id == id)
            .cloned()
            .ok_or_else(|| {
                let ids: loci_topo::IdSet = self.streams.iter().map(|s| s.id).collect();
                format!("stream {id} is not in this receiver's config (configured streams: {ids})")
            })
    }
    /// The same thread counts, every stage placed by the OS.
    pub fn unpinned(&self) -> Self {
        let mut c = self.clone();
        for s in &mut c.streams {
            s.recv = s.recv.unpinned();
            s.decompress = s.decompress.unpinned();
        }
        c
    }
    /// Reads and validates a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let c: Self = load_toml(path)?;
        c.validate()?;
        Ok(c)
    }
    /// TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
    }
}

fn load_toml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
        path: path.display().to_string(),
        err,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.display().to_string(),
        err: with_removed_field_hint(e.to_string()),
    })
}

/// Sender configs written before the compressing threads read their own chunks had a `[read]`
/// stage and a `read_queue_depth`; serde names the field, this says what became of it.
fn with_removed_field_hint(err: String) -> String {
    if err.contains("unknown field `read`") || err.contains("unknown field `read_queue_depth`") {
        format!(
            "{err}\n(the read stage is gone: each compressing thread reads its own chunks, so \
             delete `[read]` and `read_queue_depth`, or write the configs again with `loci stream \
             plan`)"
        )
    } else {
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_config_roundtrips_and_bad_fields_are_named() {
        let mut c = SenderConfig {
            compress: Stage {
                count: 2,
                cpus: vec![CpuSet::parse("0").unwrap(), CpuSet::parse("1").unwrap()],
                mem: vec![0, 0],
            },
            ..SenderConfig::default()
        };
        let t = c.to_toml();
        let back: SenderConfig = toml::from_str(&t).unwrap();
        assert_eq!(back, c);
        c.compress.mem.pop();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("compress.mem"));
        let e = toml::from_str::<SenderConfig>(
            "stream = 0\n[compress]\ncount=1\ncpus=[\"0-x\"]\n[send]\ncount=1\n",
        );
        assert!(e.is_err());
        let e = toml::from_str::<SenderConfig>("bogus = 1\n[compress]\ncount=1\n[send]\ncount=1\n")
            .unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let bad = |f: fn(&mut SenderConfig)| {
            let mut c = SenderConfig::default();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert_eq!(
            bad(|c| c.window = usize::MAX >> 1),
            format!(
                "invalid configuration: window = {} outside 1..=65536",
                usize::MAX >> 1
            )
        );
        assert!(bad(|c| c.queue_depth = 0).contains("queue_depth = 0 outside 1..=65536"));
        assert!(bad(|c| c.queue_depth = 65537).contains("queue_depth = 65537"));
    }

    #[test]
    fn a_config_with_the_old_read_stage_is_refused_with_what_to_do() {
        let dir = std::env::temp_dir().join(format!("loci-old-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in [
            (
                "stage",
                "[read]\ncount=1\n[compress]\ncount=1\n[send]\ncount=1\n",
            ),
            (
                "depth",
                "read_queue_depth = 4\n[compress]\ncount=1\n[send]\ncount=1\n",
            ),
        ] {
            let path = dir.join(format!("{name}.toml"));
            std::fs::write(&path, text).unwrap();
            let e = SenderConfig::load(&path).unwrap_err().to_string();
            assert!(e.contains("unknown field `read"), "{e}");
            assert!(
                e.contains("each compressing thread reads its own chunks"),
                "{e}"
            );
            assert!(e.contains("loci stream plan"), "{e}");
        }
        // Any other unknown field gets serde's message alone.
        let path = dir.join("other.toml");
        std::fs::write(&path, "bogus = 1\n[compress]\ncount=1\n[send]\ncount=1\n").unwrap();
        let e = SenderConfig::load(&path).unwrap_err().to_string();
        assert!(e.contains("bogus") && !e.contains("read stage"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stages_become_loci_place_plans_and_back() {
        let t = crate::plan::tests::machine(2, 2, &[]);
        let sets = |l: &[&str]| l.iter().map(|c| CpuSet::parse(c).unwrap()).collect();
        let stage = |cpus: &[&str], mem: &[u32]| Stage {
            count: cpus.len().max(mem.len()),
            cpus: sets(cpus),
            mem: mem.to_vec(),
        };
        // Each thread's own node: localalloc; one node for all: preferred; none: first touch.
        for (s, policy) in [
            (stage(&["0", "2"], &[0, 1]), "localalloc"),
            (stage(&["0", "2"], &[1, 1]), "preferred"),
            (stage(&["0", "2"], &[]), "first-touch"),
            (stage(&[], &[1, 1, 1]), "preferred"),
        ] {
            let p = s.plan(&t, "compress").unwrap();
            assert_eq!(p.memory.policy, policy, "{s:?}");
            assert_eq!(p.pinned, !s.cpus.is_empty());
            assert_eq!(p.threads.len(), s.count);
            assert_eq!(Stage::from_plan(&p), s, "written back as it was");
        }
        let p = Stage::os(3).plan(&t, "recv").unwrap();
        assert!(!p.pinned && p.threads.len() == 3);
        // Mixed nodes that are not the threads' own, a cpu the machine lacks: named.
        let e = stage(&["0", "2", "1"], &[1, 0, 0])
            .plan(&t, "send")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("send.mem = [1, 0, 0]") && e.contains("localalloc"),
            "{e}"
        );
        let e = stage(&["0", "64"], &[])
            .plan(&t, "decompress")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("decompress: thread 1: cpu 64 is not present"),
            "{e}"
        );
    }

    #[test]
    fn receiver_parts() {
        let c: ReceiverConfig = toml::from_str(
            "[[stream]]\nid = 2\n[stream.recv]\ncount = 1\n[stream.decompress]\ncount = 3\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.part(2, 1).unwrap().decompress.count, 3);
        let e = c.part(5, 1).unwrap_err();
        assert!(
            e.contains("stream 5") && e.contains("configured streams: 2"),
            "{e}"
        );
        let mut d = c.clone();
        d.streams.push(d.streams[0].clone());
        assert!(d.validate().unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn receiver_limits_and_protection_are_checked() {
        let ok = ReceiverConfig::default();
        ok.validate().unwrap();
        type Case = (
            &'static str,
            &'static str,
            u64,
            bool,
            fn(u64) -> ReceiverConfig,
        );
        let cases: [Case; 8] = [
            ("max_connections", "1..=65536", 0, false, max_conns),
            ("max_connections", "1..=65536", 1, true, max_conns),
            ("max_connections", "1..=65536", 65536, true, max_conns),
            ("max_connections", "1..=65536", 65537, false, max_conns),
            ("handshake_timeout_secs", "1..=3600", 0, false, handshake),
            ("handshake_timeout_secs", "1..=3600", 1, true, handshake),
            ("handshake_timeout_secs", "1..=3600", 3600, true, handshake),
            ("handshake_timeout_secs", "1..=3600", 3601, false, handshake),
        ];
        fn max_conns(n: u64) -> ReceiverConfig {
            ReceiverConfig {
                max_connections: n as usize,
                ..ReceiverConfig::default()
            }
        }
        fn handshake(n: u64) -> ReceiverConfig {
            ReceiverConfig {
                handshake_timeout_secs: n,
                ..ReceiverConfig::default()
            }
        }
        for (field, range, n, good, make) in cases {
            match make(n).validate() {
                Ok(()) => assert!(good, "{field} = {n} accepted"),
                Err(e) => {
                    assert!(!good, "{field} = {n} refused: {e}");
                    let e = e.to_string();
                    assert!(e.contains(field) && e.contains(range), "{e}");
                }
            }
        }
        for (encrypt, unauthenticated) in [(true, false), (false, true)] {
            ReceiverConfig {
                encrypt,
                unauthenticated,
                ..ReceiverConfig::default()
            }
            .validate()
            .unwrap();
        }
        let e = ReceiverConfig {
            encrypt: true,
            unauthenticated: true,
            ..ReceiverConfig::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("encrypt") && e.contains("unauthenticated"),
            "{e}"
        );
        let e = toml::from_str::<ReceiverConfig>("max_connections = 0\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_connections"), "{e}");
    }

    #[test]
    fn sender_protection_is_checked_and_secret_file_roundtrips() {
        let c = SenderConfig {
            encrypt: true,
            unauthenticated: true,
            ..SenderConfig::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("encrypt") && e.contains("unauthenticated"),
            "{e}"
        );
        let c = SenderConfig {
            encrypt: true,
            secret_file: Some(PathBuf::from("/etc/loci/stream.key")),
            ..SenderConfig::default()
        };
        c.validate().unwrap();
        let t = c.to_toml();
        assert!(t.contains("secret_file = \"/etc/loci/stream.key\""), "{t}");
        assert_eq!(toml::from_str::<SenderConfig>(&t).unwrap(), c);
        // Absent: not written, and read back as None.
        let t = SenderConfig::default().to_toml();
        assert!(!t.contains("secret_file"), "{t}");
        let r: ReceiverConfig = toml::from_str("secret_file = \"k\"\n").unwrap();
        assert_eq!(r.secret_file, Some(PathBuf::from("k")));
        assert_eq!(toml::from_str::<ReceiverConfig>(&r.to_toml()).unwrap(), r);
    }
}
