//! `loci stream recv|send|plan`: the NUMA-aware streaming runtime (seed 001) on the command line.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use loci_stream::config::{secret, ReceiverConfig, SenderConfig};
use loci_stream::plan::{plan, PlanOptions};
use loci_stream::{Codec, Faults, Receiver, RecvOptions, SendOptions, SinkSpec, SourceSpec};
use loci_topo::Topology;

/// Stream detector data: compress -> send -> receive -> decompress, every stage pinned.
#[derive(Subcommand)]
pub enum StreamCmd {
    /// Receive streams and store them (run this first, on the gateway).
    Recv(RecvArgs),
    /// Send a file or synthetic phantom projections to a receiver.
    Send(SendArgs),
    /// Write sender and receiver configs from the two machines' topologies and the NIC's node.
    Plan(PlanArgs),
}

/// What both sides take: the report format, the shared secret's file, the frame protection.
#[derive(Args)]
pub struct SideArgs {
    /// Print the final report as JSON on stdout (the text report goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// File holding the shared secret, the same on both sides (at least 16 bytes; one trailing
    /// newline is ignored). It must be a regular file only its owner can read (chmod 600). Make
    /// one with `head -c 32 /dev/urandom | base64 > FILE && chmod 600 FILE`. Overrides the
    /// config's `secret_file` and `secret` and the environment variable LOCI_STREAM_SECRET.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// send: encrypt every chunk on the wire (AES-256-GCM, key derived from the shared secret
    /// per connection); recv: accept only senders that encrypt, refusing the others at the
    /// handshake. Without it, frames are authenticated (tampering is detected) but readable by
    /// anyone on the path. Overrides the config's `encrypt`.
    #[arg(long, conflicts_with = "unauthenticated")]
    pub encrypt: bool,
    /// send: frames carry only a checksum, which anyone on the network path can forge (altered
    /// data would be accepted), saving the authentication's CPU; recv: also accept such senders
    /// (the receiver must allow it). For measurements and isolated links only; the handshake
    /// still checks the shared secret. Overrides the config's `unauthenticated`.
    #[arg(long)]
    pub unauthenticated: bool,
}

#[derive(Args)]
pub struct RecvArgs {
    /// Address to listen on, e.g. 0.0.0.0:7700.
    #[arg(long, value_name = "ADDR")]
    pub listen: String,
    /// Receiver config (recv.toml from `loci stream plan`): cores of each stream. Without it,
    /// any stream id is accepted and the OS places the threads.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where chunks go: `null` (discard), `memory`, a FILE (positional writes, with a journal
    /// FILE.loci-journal for resume), or a DIR/ (one file per stream: DIR/stream-ID.raw).
    #[arg(long, default_value = "null", value_name = "FILE|DIR|null|memory")]
    pub sink: SinkSpec,
    /// Exit after this many streams ended (default: every stream in the config, or 1).
    #[arg(long, value_name = "N", value_parser = crate::at_least_one)]
    pub streams: Option<usize>,
    #[command(flatten)]
    pub side: SideArgs,
    /// Before confirming a stream to its sender, flush the sink file to disk, drop its pages from
    /// the page cache, read every chunk back and check the whole-stream checksum over what the
    /// disk returns, not over what was written (catches storage that lost or changed data).
    /// Costs one more read of the whole stream; needs a FILE or DIR/ sink (`memory` re-hashes
    /// what it holds).
    #[arg(long)]
    pub verify_on_disk: bool,
    /// Most TCP connections served at once, handshaking or streaming (each sender opens one per
    /// sending thread); further ones are closed at once. Overrides the config's
    /// `max_connections` (default 256).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_connections: Option<u32>,
}

#[derive(Args)]
pub struct SendArgs {
    /// Receiver address, HOST:PORT.
    #[arg(long, value_name = "ADDR")]
    pub to: String,
    /// A raw binary file to stream, compressed straight from a read-only mapping of it. It must
    /// not shrink while it streams (that stops the send with an error naming it); one changed or
    /// grown meanwhile is read from copies, its size at the start being what is sent.
    #[arg(long, value_name = "FILE", conflicts_with = "synthetic")]
    pub source: Option<PathBuf>,
    /// Stream BYTES of synthetic tomography projections (suffixes K, M, G, KiB, MiB, GiB).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub synthetic: Option<u64>,
    /// Seed of the synthetic phantom.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Sender config (send-K.toml from `loci stream plan`). Without it: stream 0, one reader,
    /// one compressor per cpu, one connection, OS placement.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Continue an interrupted transfer: skip the chunks the receiver's sink already holds.
    #[arg(long)]
    pub resume: bool,
    /// Give up when a lost connection cannot be re-established for this many seconds
    /// (0 to 604800, a week).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=604_800))]
    pub reconnect_timeout: u64,
    #[command(flatten)]
    pub side: SideArgs,
    /// Fault injection for tests: flip a payload byte in the first transmission of these chunks
    /// (a cpu-list style list of sequence numbers, e.g. 3,7-9).
    #[arg(long, value_name = "SEQS", hide = true)]
    pub fault_corrupt: Option<String>,
    /// Fault injection for tests: wait this many milliseconds before sending each chunk the
    /// first time (so a test can kill a process mid-stream).
    #[arg(long, value_name = "MS", hide = true, default_value_t = 0)]
    pub fault_delay_ms: u64,
}

#[derive(Args)]
pub struct PlanArgs {
    /// Sender topology: `local` (this machine), `preset:NAME` (e.g. preset:xeon-gold-6346-2s),
    /// `synthetic:SPEC` (e.g. synthetic:nodes=2,cores=16,smt=2), `xml:FILE` (hwloc XML),
    /// `sysfs:DIR` (a captured /sys tree) or `json:FILE` (from `loci topo --json`).
    #[arg(long, value_name = "TOPOLOGY")]
    pub sender: String,
    /// Receiver topology (same forms as --sender).
    #[arg(long, value_name = "TOPOLOGY")]
    pub receiver: String,
    /// The receiver's NIC by interface name (its node comes from the topology).
    #[arg(long, value_name = "IFACE", conflicts_with = "nic_node")]
    pub nic: Option<String>,
    /// The receiver's NIC node, given directly.
    #[arg(long, value_name = "N")]
    pub nic_node: Option<u32>,
    /// The senders' NIC node (default: the same interface on the sender, else its biggest node).
    #[arg(long, value_name = "N")]
    pub sender_nic_node: Option<u32>,
    /// Number of streams into the receiver; its NIC node's cores are split evenly between them.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    /// All streams leave one sender machine (split its cores); default: one sender per stream.
    #[arg(long)]
    pub shared_sender: bool,
    /// Chunk size in bytes (1 MiB: a chunk is still cached when it is hashed after compressing
    /// and after decompressing; docs/stream.md, "Chunk size").
    #[arg(long, default_value_t = loci_stream::config::DEFAULT_CHUNK_BYTES, value_parser = parse_usize_bytes)]
    pub chunk_bytes: usize,
    /// LZ4 implementation: lz4-c (the reference C library, the default: faster in quiet
    /// `loci bench stream --codec-only` runs) or lz4-flex (pure Rust); both speak the same block
    /// format.
    #[arg(long, default_value = "lz4-c")]
    pub codec: Codec,
    /// How wide each stage thread's binding is around the cpu the plan's rules chose for it:
    /// node (every allowed cpu of that cpu's node, the OS picks the core: seed 001's
    /// `numa_bind`), group (its last-level cache group), core (its SMT siblings) or cpu (that
    /// one cpu).
    #[arg(long, default_value = "node", value_name = "node|group|core|cpu")]
    pub bind: loci_place::Bind,
    /// Output directory for recv.toml and send-K.toml.
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: PathBuf,
}

/// Parses `123`, `4K`, `663M`, `1G`, `2MiB` into bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 663M, 1G, 11059200)"))?;
    let mul: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        u => {
            return Err(format!(
                "unknown size unit {u:?} (valid: K M G KiB MiB GiB)"
            ))
        }
    };
    n.checked_mul(mul)
        .ok_or_else(|| format!("{s:?} is too large"))
}

pub fn parse_usize_bytes(s: &str) -> Result<usize, String> {
    parse_bytes(s).map(|v| v as usize)
}

/// A topology from a one-string source, in the form `Topology::source` is printed in:
/// `local` or `sysfs:/` (this machine), `sysfs:DIR` / `sysfs-dir:DIR` (a captured tree),
/// `xml:FILE` (hwloc XML), `preset:NAME`, `synthetic:SPEC`, or `json:FILE` (`loci topo --json`).
pub fn load_topology(s: &str) -> anyhow::Result<Topology> {
    let src: loci_topo::Source = s.parse()?;
    Ok(loci_topo::load(&src)?)
}

pub fn run(cmd: StreamCmd) -> anyhow::Result<()> {
    match cmd {
        StreamCmd::Recv(a) => recv(a),
        StreamCmd::Send(a) => send(a),
        StreamCmd::Plan(a) => plan_cmd(a),
    }
}

fn print_reports(reps: &[loci_stream::StreamReport], json: bool) -> anyhow::Result<()> {
    for r in reps {
        eprint!("{}", r.text());
    }
    if json {
        println!("{}", serde_json::to_string_pretty(reps)?);
    }
    Ok(())
}

/// The config file at `path` (`load` reads and validates it), or the default config without one.
fn config_or_default<C: Default>(
    path: Option<&Path>,
    load: fn(&Path) -> Result<C, loci_stream::config::ConfigError>,
) -> anyhow::Result<C> {
    Ok(path.map(load).transpose()?.unwrap_or_default())
}

/// The secret file to read: `--secret-file` if given, else the config's `secret_file` (a relative
/// one is taken relative to the config file's directory).
fn secret_file_of(
    flag: Option<&Path>,
    config_file: Option<&Path>,
    from_config: Option<&Path>,
) -> Option<PathBuf> {
    if let Some(f) = flag {
        return Some(f.to_path_buf());
    }
    let f = from_config?;
    Some(match config_file.and_then(Path::parent) {
        Some(dir) if f.is_relative() => dir.join(f),
        _ => f.to_path_buf(),
    })
}

/// Applies `--encrypt` / `--unauthenticated` over the config's values: a flag given wins, and
/// turns off the contradicting setting (with a note on stderr).
fn protection_flags(
    encrypt: &mut bool,
    unauthenticated: &mut bool,
    flag_encrypt: bool,
    flag_unauthenticated: bool,
) {
    if flag_encrypt {
        if *unauthenticated {
            eprintln!("note: --encrypt overrides `unauthenticated = true` in the config");
        }
        *encrypt = true;
        *unauthenticated = false;
    }
    if flag_unauthenticated {
        if *encrypt {
            eprintln!("note: --unauthenticated overrides `encrypt = true` in the config");
        }
        *unauthenticated = true;
        *encrypt = false;
    }
}

impl SideArgs {
    /// Applies `--encrypt` / `--unauthenticated` over the config's values ([`protection_flags`]).
    fn protection(&self, encrypt: &mut bool, unauthenticated: &mut bool) {
        protection_flags(encrypt, unauthenticated, self.encrypt, self.unauthenticated);
    }

    /// The shared secret: `--secret-file`, else the config's `(secret_file, secret)`
    /// ([`secret_file_of`], [`secret`]); then prints `warning`, if any, on stderr.
    fn secret(
        &self,
        config_file: Option<&Path>,
        (file, text): (Option<&Path>, Option<&str>),
        warning: Option<&str>,
    ) -> anyhow::Result<Vec<u8>> {
        let file = secret_file_of(self.secret_file.as_deref(), config_file, file);
        let s = secret(file.as_deref(), text)?;
        if let Some(w) = warning {
            eprintln!("{w}");
        }
        Ok(s)
    }
}

fn recv(a: RecvArgs) -> anyhow::Result<()> {
    let mut config = config_or_default(a.config.as_deref(), ReceiverConfig::load)?;
    a.side
        .protection(&mut config.encrypt, &mut config.unauthenticated);
    if let Some(n) = a.max_connections {
        config.max_connections = n as usize;
    }
    config.validate()?;
    if a.verify_on_disk && matches!(a.sink, SinkSpec::Null) {
        bail!(
            "--verify-on-disk: the null sink stores nothing to read back; give --sink FILE or \
             --sink DIR/"
        );
    }
    let secret = a.side.secret(
        a.config.as_deref(),
        (config.secret_file.as_deref(), config.secret.as_deref()),
        config.unauthenticated.then_some(
            "loci stream recv: WARNING: accepting senders whose frames carry only a checksum \
             (--unauthenticated): anyone on the network path can alter their data undetected",
        ),
    )?;
    let r = Receiver::bind(
        &a.listen,
        RecvOptions {
            config,
            secret,
            sink: a.sink,
            progress: !a.side.json,
            streams: a.streams,
            verify_on_disk: a.verify_on_disk,
        },
    )?;
    eprintln!("loci stream recv: listening on {}", r.local_addr());
    let reps = r.run()?;
    print_reports(&reps, a.side.json)?;
    if reps.iter().any(|r| !r.verified) {
        bail!("a stream's whole-stream checksum did not match");
    }
    Ok(())
}

fn send(a: SendArgs) -> anyhow::Result<()> {
    let mut config = config_or_default(a.config.as_deref(), SenderConfig::load)?;
    a.side
        .protection(&mut config.encrypt, &mut config.unauthenticated);
    config.validate()?;
    let source = match (&a.source, a.synthetic) {
        (Some(p), None) => SourceSpec::File(p.clone()),
        (None, Some(bytes)) => SourceSpec::Synthetic {
            bytes,
            seed: a.seed,
        },
        _ => bail!("give --source FILE or --synthetic BYTES"),
    };
    let mut faults = Faults::default();
    if let Some(s) = &a.fault_corrupt {
        faults.corrupt = loci_topo::IdSet::parse(s)
            .map_err(|e| anyhow::anyhow!("--fault-corrupt: {e}"))?
            .iter()
            .map(u64::from)
            .collect();
    }
    faults.delay = Duration::from_millis(a.fault_delay_ms);
    let secret = a.side.secret(
        a.config.as_deref(),
        (config.secret_file.as_deref(), config.secret.as_deref()),
        config.unauthenticated.then_some(
            "loci stream send: WARNING: frames carry only a checksum (--unauthenticated): anyone \
             on the network path can alter the data undetected",
        ),
    )?;
    let rep = loci_stream::send(SendOptions {
        to: a.to,
        config,
        secret,
        source,
        resume: a.resume,
        progress: !a.side.json,
        reconnect_timeout: Duration::from_secs(a.reconnect_timeout),
        faults,
    })?;
    print_reports(&[rep], a.side.json)
}

fn plan_cmd(a: PlanArgs) -> anyhow::Result<()> {
    let s = load_topology(&a.sender).context("--sender")?;
    let r = load_topology(&a.receiver).context("--receiver")?;
    let p = plan(
        &s,
        &r,
        &PlanOptions {
            streams: a.streams,
            nic: a.nic,
            nic_node: a.nic_node,
            sender_nic_node: a.sender_nic_node,
            shared_sender: a.shared_sender,
            chunk_bytes: a.chunk_bytes,
            codec: a.codec,
            bind: a.bind,
        },
    )?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let header: String = std::iter::once(format!(
        "# written by `loci stream plan` (sender {}, receiver {})\n",
        s.source, r.source
    ))
    .chain(p.notes.iter().map(|n| format!("# {n}\n")))
    .collect();
    let rp = a.out.join("recv.toml");
    std::fs::write(&rp, format!("{header}{}", p.receiver.to_toml()))?;
    println!("wrote {}", rp.display());
    for (k, sc) in p.senders.iter().enumerate() {
        let sp = a.out.join(format!("send-{k}.toml"));
        std::fs::write(&sp, format!("{header}{}", sc.to_toml()))?;
        println!("wrote {}", sp.display());
    }
    for n in &p.notes {
        println!("  {n}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_sources() {
        let t = load_topology("synthetic:nodes=2,cores=4,smt=2").unwrap();
        assert_eq!(t.nodes.len(), 2);
        let e = load_topology("bogus:x").unwrap_err().to_string();
        assert!(e.contains("preset:NAME"), "{e}");
        assert!(load_topology("preset:no-such-machine").is_err());
    }

    #[test]
    fn secret_file_flag_wins_and_config_paths_are_relative_to_the_config() {
        let flag = Path::new("/k/flag.key");
        let cfg = Path::new("/etc/loci/recv.toml");
        assert_eq!(
            secret_file_of(Some(flag), Some(cfg), Some(Path::new("c.key"))),
            Some(flag.to_path_buf())
        );
        assert_eq!(
            secret_file_of(None, Some(cfg), Some(Path::new("c.key"))),
            Some(PathBuf::from("/etc/loci/c.key"))
        );
        assert_eq!(
            secret_file_of(None, Some(cfg), Some(Path::new("/abs/c.key"))),
            Some(PathBuf::from("/abs/c.key"))
        );
        assert_eq!(
            secret_file_of(None, Some(Path::new("recv.toml")), Some(Path::new("c.key"))),
            Some(PathBuf::from("c.key"))
        );
        assert_eq!(secret_file_of(None, Some(cfg), None), None);
    }

    #[test]
    fn protection_flags_override_the_config() {
        // (config encrypt, config unauthenticated, --encrypt, --unauthenticated) -> result
        for (ce, cu, fe, fu, want) in [
            (false, false, false, false, (false, false)),
            (true, false, false, false, (true, false)),
            (false, true, false, false, (false, true)),
            (false, false, true, false, (true, false)),
            (false, true, true, false, (true, false)),
            (false, false, false, true, (false, true)),
            (true, false, false, true, (false, true)),
        ] {
            let (mut e, mut u) = (ce, cu);
            protection_flags(&mut e, &mut u, fe, fu);
            assert_eq!((e, u), want, "config ({ce}, {cu}) flags ({fe}, {fu})");
        }
    }

    #[test]
    fn stream_flags_parse() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(subcommand)]
            cmd: StreamCmd,
        }
        let c = Cli::try_parse_from([
            "stream",
            "recv",
            "--listen",
            "0:1",
            "--encrypt",
            "--secret-file",
            "/k",
            "--verify-on-disk",
            "--max-connections",
            "9",
        ])
        .unwrap();
        let StreamCmd::Recv(r) = c.cmd else {
            panic!("not recv")
        };
        assert!(r.side.encrypt && r.verify_on_disk && !r.side.unauthenticated);
        assert_eq!(r.max_connections, Some(9));
        assert_eq!(r.side.secret_file, Some(PathBuf::from("/k")));
        for bad in ["0", "65537"] {
            assert!(Cli::try_parse_from([
                "stream",
                "recv",
                "--listen",
                "0:1",
                "--max-connections",
                bad
            ])
            .is_err());
        }
        let c = Cli::try_parse_from([
            "stream",
            "send",
            "--to",
            "h:1",
            "--synthetic",
            "1M",
            "--unauthenticated",
            "--secret-file",
            "k",
        ])
        .unwrap();
        let StreamCmd::Send(s) = c.cmd else {
            panic!("not send")
        };
        assert!(s.side.unauthenticated && !s.side.encrypt);
        assert_eq!(s.side.secret_file, Some(PathBuf::from("k")));
        for cmd in [
            &[
                "stream",
                "send",
                "--to",
                "h:1",
                "--encrypt",
                "--unauthenticated",
            ][..],
            &[
                "stream",
                "recv",
                "--listen",
                "0:1",
                "--encrypt",
                "--unauthenticated",
            ][..],
        ] {
            let e = Cli::try_parse_from(cmd).err().unwrap().to_string();
            assert!(
                e.contains("--encrypt") && e.contains("--unauthenticated"),
                "{e}"
            );
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("663M").unwrap(), 663_000_000);
        assert_eq!(parse_bytes("2MiB").unwrap(), 2 << 20);
        assert_eq!(parse_bytes("11059200").unwrap(), 11_059_200);
        assert!(parse_bytes("12X").unwrap_err().contains("valid"));
        assert!(parse_bytes("M").is_err());
    }
}
