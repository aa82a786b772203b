//! `loci deploy dask`: a Dask cluster laid out by one of seed 004's designs. One `dask worker`
//! per instance of the layout (threads = the instance's cpus, memory limit = its share of its
//! nodes' memory) and, unless `--scheduler` names another machine's, one `dask scheduler`; every
//! process is an instance of the same deployment (`loci run` placement, verification,
//! supervision, manifest) as `loci deploy`.

use std::ffi::OsString;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use loci_topo::{NodeSet, Topology};
use serde::{Deserialize, Serialize};

use super::layout::{self, Design, MemMode};
use super::manifest::{InstanceRecord, Manifest};
use super::template::Template;
use super::Common;

/// What a Dask deployment adds to its manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DaskInfo {
    /// The scheduler every worker joins (`tcp://HOST:PORT`).
    pub scheduler: String,
    /// The instance that runs the scheduler (the last one); `None` when it runs elsewhere
    /// (`--scheduler`).
    pub scheduler_instance: Option<usize>,
    /// Worker names by instance index (`w0-node0@10.0.0.1`), as the scheduler lists them.
    pub workers: Vec<String>,
    /// The `dask` executable.
    pub dask: String,
    /// The writable directory of the workers' scratch space, Dask's config and temporary files.
    pub dir: PathBuf,
}

impl DaskInfo {
    /// One line for `loci deploy status` and --dry-run.
    pub fn line(&self, ninstances: usize) -> String {
        let names: Vec<String> = self
            .workers
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{i} {n}"))
            .collect();
        format!(
            "dask: scheduler {} ({}); workers: {}",
            self.scheduler,
            match self.scheduler_instance {
                Some(i) => format!("instance {i} of {ninstances}, started here"),
                None => "on another machine, joined".into(),
            },
            names.join(", ")
        )
    }
}

/// `--nthreads`: the instance's cpus (auto) or a number for every worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NThreads(Option<usize>);

pub fn parse_nthreads(s: &str) -> Result<NThreads, String> {
    match s {
        "auto" => Ok(NThreads(None)),
        _ => match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(NThreads(Some(n))),
            _ => Err(format!(
                "'{s}' is neither auto nor a positive number; valid: auto, 1, 2, ..."
            )),
        },
    }
}

/// Deploy a Dask cluster: a scheduler and one `dask worker` per instance of a seed 004 design.
///
/// Every worker runs as `loci run --threads STRATEGY -n N --mem POLICY -- dask worker SCHEDULER
/// --nthreads CPUS --memory-limit BYTES --name wI-nodeK@HOST --no-nanny ...` (loci is the nanny:
/// it verifies, restarts and stops each worker), exactly as `loci deploy` starts an instance. The
/// scheduler is one more instance, the last, unpinned (`--threads os`, first-touch). With
/// --scheduler ADDR no scheduler starts: the workers join ADDR (another machine's `loci deploy
/// dask`), which makes one cluster of several machines, each laid out from its own topology.
///
///   --nthreads auto    each worker's threads = its instance's cpus (wim: all, win: its node's,
///                      wic: its core's hardware threads)
///   --memory-limit     each worker's share of its nodes' memory: a node's memory divided among
///                      the instances whose pages go there (wim: the whole machine)
///
/// The `dask` executable is bench/peers/.venv/bin/dask (bench/peers/setup --dask installs it),
/// else `dask` in PATH, or --dask FILE.
///
/// Examples:
///   loci deploy dask --design win --dry-run
///   loci deploy dask --design win --manifest /tmp/d.json &
///   loci deploy dask --design win --host 10.0.0.1 &                        # machine A
///   loci deploy dask --design win --scheduler tcp://10.0.0.1:8786 &        # machine B
///   loci deploy status /tmp/d.json; loci deploy stop /tmp/d.json
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct DaskCmd {
    /// The layout of the workers.
    #[arg(long, value_enum, default_value = "win")]
    pub design: Design,
    /// Join this scheduler (tcp://HOST:PORT or HOST:PORT: another machine's) instead of
    /// starting one.
    #[arg(long, value_name = "ADDR")]
    pub scheduler: Option<String>,
    /// Threads per worker: auto (the instance's cpus) or N.
    #[arg(long, value_name = "auto|N", default_value = "auto", value_parser = parse_nthreads)]
    pub nthreads: NThreads,
    /// The address the scheduler and workers listen on and tell others [default: 127.0.0.1;
    /// with --scheduler, this machine's address on the route to the scheduler]. Give the address
    /// of a real interface when other machines' workers will join.
    #[arg(long, value_name = "IP")]
    pub host: Option<IpAddr>,
    /// The port of the scheduler started here.
    #[arg(long, value_name = "PORT", default_value_t = 8786)]
    pub scheduler_port: u16,
    /// Worker i listens on PORT+i [default: --scheduler-port + 2; the scheduler's HTTP server
    /// (health and metrics; its dashboard with bokeh) listens on --scheduler-port + 1].
    #[arg(long, value_name = "PORT")]
    pub port_base: Option<u16>,
    /// The dask executable [default: bench/peers/.venv/bin/dask, else dask in PATH].
    #[arg(long, value_name = "FILE")]
    pub dask: Option<PathBuf>,
    /// A writable directory for the workers' scratch space and Dask's config and temporary
    /// files [default: the manifest's path with `.dask` in place of its extension].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub common: Common,
}

/// Where the scheduler is and how this machine's processes reach and are reached.
#[derive(Debug, Clone, PartialEq)]
struct Endpoint {
    /// `tcp://HOST:PORT` as the workers are given it.
    url: String,
    /// The host the scheduler (when started here) and the workers listen on.
    host: IpAddr,
}

/// Parses `tcp://HOST:PORT` or `HOST:PORT` into the URL the workers get and the host and port.
pub fn parse_address(addr: &str) -> anyhow::Result<(String, String, u16)> {
    let bad = |why: &str| {
        anyhow::anyhow!("--scheduler {addr}: {why}; valid: tcp://HOST:PORT or HOST:PORT, e.g. tcp://10.0.0.1:8786")
    };
    let rest = match addr.split_once("://") {
        Some(("tcp", rest)) => rest,
        Some((scheme, _)) => {
            return Err(bad(&format!(
                "the protocol `{scheme}` is not supported (only tcp)"
            )))
        }
        None => addr,
    };
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port: u16 = match port.parse() {
        Ok(p) if p > 0 => p,
        _ => return Err(bad(&format!("`{port}` is not a port (1-65535)"))),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains('/') {
        return Err(bad("no host"));
    }
    let url = match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => format!("tcp://[{v6}]:{port}"),
        _ => format!("tcp://{host}:{port}"),
    };
    Ok((url, host.to_string(), port))
}

/// The scheduler to join: its address resolved and answering (checked with a TCP connect, 3 s).
fn join(addr: &str, host: Option<IpAddr>, check: bool) -> anyhow::Result<Endpoint> {
    let (url, h, port) = parse_address(addr)?;
    let sock: SocketAddr = (h.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| anyhow::anyhow!("--scheduler {addr}: the host `{h}` does not resolve"))?;
    if check {
        TcpStream::connect_timeout(&sock, Duration::from_secs(3)).map_err(|e| {
            anyhow::anyhow!(
                "--scheduler {addr}: nothing answers at {sock} ({e}); start the scheduler first (`loci deploy dask --host IP` on that machine)"
            )
        })?;
    }
    let host = match host {
        Some(h) => h,
        None => local_address_toward(sock).with_context(|| {
            format!("--scheduler {addr}: finding this machine's address toward {sock} (give it with --host)")
        })?,
    };
    Ok(Endpoint { url, host })
}

/// This machine's address on the route to `to`: a connected UDP socket's local address (a UDP
/// connect only picks the route; it sends nothing).
fn local_address_toward(to: SocketAddr) -> std::io::Result<IpAddr> {
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any)?;
    s.connect(to)?;
    Ok(s.local_addr()?.ip())
}

/// `HOST:PORT` for an address of this machine (`[V6]:PORT`).
fn host_port(host: IpAddr, port: u16) -> String {
    match host {
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
        IpAddr::V4(v4) => format!("{v4}:{port}"),
    }
}

/// `tcp://HOST:PORT` for an address of this machine.
fn url_of(host: IpAddr, port: u16) -> String {
    format!("tcp://{}", host_port(host, port))
}

/// An error when `port` cannot be listened on at `host` (in use, or not this machine's address).
fn check_port(host: IpAddr, port: u16, what: &str) -> anyhow::Result<()> {
    TcpListener::bind((host, port)).map(drop).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::AddrInUse {
            "in use".to_string()
        } else if e.kind() == std::io::ErrorKind::AddrNotAvailable {
            format!("{host} is not an address of this machine (--host)")
        } else {
            e.to_string()
        };
        anyhow::anyhow!("{what}: cannot listen on {host}:{port}: {why}")
    })
}

const INSTALL: &str = "install it with bench/peers/setup --dask (dask[dataframe] and distributed from PyPI into bench/peers/.venv), or name the executable with --dask FILE";

/// The `dask` executable: --dask, else bench/peers/.venv/bin/dask, else `dask` in PATH.
fn find_dask(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("--dask {}: no such file; {INSTALL}", p.display());
    }
    let venv = crate::bench::common::peers_dir("setup").map(|d| d.join(".venv/bin/dask"));
    if let Some(p) = venv.filter(|p| p.is_file()) {
        return Ok(p);
    }
    crate::run_cmd::resolve(&OsString::from("dask")).ok_or_else(|| {
        anyhow::anyhow!(
            "Dask is not installed: no bench/peers/.venv/bin/dask and no dask in PATH; {INSTALL}"
        )
    })
}

/// The interpreter of a script's `#!` line (`#!/usr/bin/env NAME`: NAME in PATH).
fn interpreter(script: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 512];
    let n = std::fs::File::open(script).ok()?.read(&mut head).ok()?;
    let line = std::str::from_utf8(&head[..n]).ok()?.lines().next()?;
    let mut words = line.strip_prefix("#!")?.split_whitespace();
    let first = PathBuf::from(words.next()?);
    if first.file_name().is_some_and(|f| f == "env") {
        return crate::run_cmd::resolve(&OsString::from(words.next()?));
    }
    first
        .file_name()
        .is_some_and(|f| f.to_string_lossy().starts_with("python"))
        .then_some(first)
}

/// An error unless `dask` can run `dask scheduler` and `dask worker` (the `distributed`
/// package): asked of its Python without importing anything, else of `dask scheduler --version`.
fn check_distributed(dask: &Path) -> anyhow::Result<()> {
    let probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('distributed') else 3)";
    let run = |c: &mut Command| {
        c.env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
    };
    let ok = match interpreter(dask) {
        Some(py) => run(Command::new(&py).args(["-c", probe]))
            .with_context(|| {
                format!(
                    "running {} (the interpreter of {})",
                    py.display(),
                    dask.display()
                )
            })?
            .success(),
        None => run(Command::new(dask).args(["scheduler", "--version"]))
            .with_context(|| format!("running {}", dask.display()))?
            .success(),
    };
    if !ok {
        bail!(
            "{}: Dask's `distributed` package is not installed for it (`dask scheduler` and `dask worker` come from it); {INSTALL}",
            dask.display()
        );
    }
    Ok(())
}

/// Each instance's share of memory in bytes: for every node its pages go to, the node's memory
/// divided by the number of instances whose pages go there. `None` when the topology does not
/// say some node's memory.
fn memory_shares(topo: &Topology, mem_nodes: &[NodeSet]) -> Option<Vec<u64>> {
    mem_nodes
        .iter()
        .map(|own| {
            own.iter()
                .map(|n| {
                    let bytes = topo.nodes.iter().find(|x| x.id == n)?.memory_bytes?;
                    let sharing = mem_nodes.iter().filter(|m| m.contains(n)).count() as u64;
                    Some(bytes / sharing.max(1))
                })
                .sum()
        })
        .collect()
}

/// A worker's name: its instance, its nodes and the host it listens on (unique in a cluster of
/// several machines).
fn worker_name(index: usize, nodes: &NodeSet, host: IpAddr) -> String {
    let at = if nodes.len() == 1 { "node" } else { "nodes" };
    format!("w{index}-{at}{nodes}@{host}")
}

/// Appends `extra` to an instance's command and to the `loci run` line that ends with it.
fn append(rec: &mut InstanceRecord, extra: &[String]) {
    rec.command.extend(extra.iter().cloned());
    rec.run.extend(extra.iter().cloned());
}

/// `s` as template text: its braces doubled, so a path or address is taken literally.
fn lit(s: &str) -> String {
    s.replace('{', "{{").replace('}', "}}")
}

/// The template of every worker (name and memory limit are added per instance).
fn worker_template(
    dask: &str,
    ep: &Endpoint,
    nthreads: NThreads,
    dir: &Path,
) -> anyhow::Result<Template> {
    let threads = nthreads.0.map_or("{ncpus}".to_string(), |n| n.to_string());
    let scratch = lit(&dir.to_string_lossy()) + "/worker-{instance}";
    let args = [
        lit(dask),
        "worker".into(),
        lit(&ep.url),
        "--nthreads".into(),
        threads,
        "--no-nanny".into(),
        "--host".into(),
        ep.host.to_string(),
        "--worker-port".into(),
        "{port}".into(),
        "--no-dashboard".into(),
        "--local-directory".into(),
        scratch,
    ];
    Template::parse(&args.map(OsString::from))
}

/// The port of the scheduler's HTTP server (it listens even with --no-dashboard).
fn http_port(d: &DaskCmd) -> anyhow::Result<u16> {
    d.scheduler_port.checked_add(1).ok_or_else(|| {
        anyhow::anyhow!("--scheduler-port 65535: the scheduler's HTTP server needs the port after it; valid: 1-65534")
    })
}

/// The manifest of the whole cluster: every worker of the layout, then the scheduler (when
/// started here); errors before anything starts.
fn plan(
    d: &DaskCmd,
    topo: &Topology,
    dask: &str,
    ep: &Endpoint,
    dir: &Path,
) -> anyhow::Result<Manifest> {
    let c = &d.common;
    let lay = layout::layout(topo, d.design, &c.layout_options())?;
    let exe = super::runner_exe(c, topo)?;
    let port_base = match d.port_base {
        Some(p) => p,
        None => d.scheduler_port.checked_add(2).ok_or_else(|| {
            anyhow::anyhow!(
                "--scheduler-port {}: the workers' ports start 2 after it, beyond 65535; give --port-base or a lower --scheduler-port",
                d.scheduler_port
            )
        })?,
    };
    let tpl = worker_template(dask, ep, d.nthreads, dir)?;
    let mut m = super::planned(&lay, &tpl, port_base, c, &topo.source, &exe)?;
    let mem_nodes: Vec<NodeSet> = m.instances.iter().map(|r| r.mem_nodes.clone()).collect();
    let shares = memory_shares(topo, &mem_nodes);
    if shares.is_none() {
        m.notes.push("the topology does not say every node's memory: each worker gets Dask's default memory limit".into());
    }
    let mut names = Vec::new();
    for (k, rec) in m.instances.iter_mut().enumerate() {
        let name = worker_name(rec.index, &rec.nodes, ep.host);
        let mut extra = vec!["--name".to_string(), name.clone()];
        if let Some(s) = &shares {
            extra.extend(["--memory-limit".to_string(), s[k].to_string()]);
        }
        if let Some(n) = d.nthreads.0.filter(|&n| n > rec.cpus.len()) {
            m.notes.push(format!(
                "--nthreads {n}: worker {} has {} cpus ({}): its threads share them",
                rec.index,
                rec.cpus.len(),
                rec.cpus
            ));
        }
        append(rec, &extra);
        names.push(name);
    }
    let scheduler_instance = if d.scheduler.is_none() {
        // The scheduler: one unpinned instance (wim, first-touch) that serves every node.
        let whole = layout::layout(
            topo,
            Design::Wim,
            &layout::Options {
                mem: Some(MemMode::FirstTouch),
                ..Default::default()
            },
        )?;
        let host = ep.host.to_string();
        let port = d.scheduler_port.to_string();
        let http = host_port(ep.host, http_port(d)?);
        let file = dir.join("scheduler.json");
        let args = [
            lit(dask),
            "scheduler".into(),
            "--host".into(),
            host,
            "--port".into(),
            port,
            "--no-dashboard".into(),
            "--dashboard-address".into(),
            http,
            "--scheduler-file".into(),
            lit(&file.to_string_lossy()),
        ];
        let stpl = Template::parse(&args.map(OsString::from))?;
        let mut s = super::planned(&whole, &stpl, d.scheduler_port, c, &topo.source, &exe)?;
        let mut rec = s.instances.remove(0);
        rec.index = m.instances.len();
        m.notes.push(format!(
            "instance {} is the Dask scheduler: not pinned (--threads os, first-touch); the workers are instances 0-{}",
            rec.index,
            rec.index.saturating_sub(1)
        ));
        m.instances.push(rec);
        Some(m.instances.len() - 1)
    } else {
        None
    };
    m.dask = Some(DaskInfo {
        scheduler: ep.url.clone(),
        scheduler_instance,
        workers: names,
        dask: dask.to_string(),
        dir: dir.to_path_buf(),
    });
    Ok(m)
}

pub fn run(d: DaskCmd) -> anyhow::Result<()> {
    let c = &d.common;
    let live = !c.dry_run;
    let topo = c.topo.load()?;
    let ep = match &d.scheduler {
        Some(addr) => join(addr, d.host, live)?,
        None => {
            let host = d.host.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
            Endpoint {
                url: url_of(host, d.scheduler_port),
                host,
            }
        }
    };
    // Layout errors come first; a dry run shows the plan without Dask (`dask` stands in).
    let found = find_dask(d.dask.as_deref());
    let dask = found
        .as_ref()
        .map_or("dask".into(), |p| p.to_string_lossy().into_owned());
    let dir = d
        .dir
        .clone()
        .unwrap_or_else(|| c.manifest.with_extension("dask"));
    let dir = if dir.is_absolute() {
        dir
    } else {
        std::env::current_dir()?.join(dir)
    };
    let mut m = plan(&d, &topo, &dask, &ep, &dir)?;
    match found {
        Err(e) if live => return Err(e),
        Err(_) => m
            .notes
            .push(format!("Dask is not installed here; {INSTALL}")),
        Ok(_) => {}
    }
    let info = m.dask.clone().expect("plan sets it");
    if super::show_plan(&m, c, |m| {
        super::print_plan(m);
        println!("  {}", info.line(m.instances.len()));
    })? {
        return Ok(());
    }
    check_distributed(Path::new(&dask))?;
    if info.scheduler_instance.is_some() {
        check_port(ep.host, d.scheduler_port, "--scheduler-port")?;
        check_port(
            ep.host,
            http_port(&d)?,
            "the scheduler's HTTP server (--scheduler-port + 1)",
        )?;
    }
    for r in m.instances.iter().take(info.workers.len()) {
        check_port(
            ep.host,
            r.port,
            &format!("worker {} (--port-base)", r.index),
        )?;
    }
    super::refuse_live_manifest(&c.manifest)?;
    for sub in ["", "config", "tmp"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("creating {} (--dir)", dir.join(sub).display()))?;
    }
    // Dask writes nothing outside `dir` (its config and temporary files, no bytecode), so a
    // read-only venv works, as in the NUMA VM whose root filesystem is the host's, read-only.
    // Set before any thread or child exists.
    std::env::set_var("PYTHONDONTWRITEBYTECODE", "1");
    std::env::set_var("DASK_CONFIG", dir.join("config"));
    std::env::set_var("DASK_TEMPORARY_DIRECTORY", dir.join("tmp"));
    eprintln!("loci: deploy dask: {}", info.line(m.instances.len()));
    for n in &m.notes {
        eprintln!("loci: note: {n}");
    }
    super::supervise::run(m, c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_or_name_the_problem() {
        assert_eq!(
            parse_address("tcp://10.0.0.1:8786").unwrap(),
            ("tcp://10.0.0.1:8786".into(), "10.0.0.1".into(), 8786)
        );
        assert_eq!(parse_address("h:1").unwrap().0, "tcp://h:1");
        assert_eq!(parse_address("[::1]:9").unwrap().0, "tcp://[::1]:9");
        for (bad, want) in [
            ("10.0.0.1", "no port"),
            ("tls://a:1", "`tls` is not supported"),
            ("a:99999", "`99999` is not a port"),
            ("a:0", "`0` is not a port"),
            (":8786", "no host"),
        ] {
            let e = parse_address(bad).unwrap_err().to_string();
            assert!(
                e.contains(want) && e.contains("valid: tcp://HOST:PORT"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn nthreads_is_auto_or_positive() {
        assert_eq!(parse_nthreads("auto"), Ok(NThreads(None)));
        assert_eq!(parse_nthreads("3"), Ok(NThreads(Some(3))));
        assert!(parse_nthreads("0").unwrap_err().contains("valid: auto"));
        assert!(parse_nthreads("x").is_err());
    }

    #[test]
    fn memory_is_shared_by_the_instances_on_a_node() {
        let topo = loci_topo::load(&loci_topo::Source::Synthetic(
            "nodes=2,cores=2,mem=4G".into(),
        ))
        .unwrap();
        let set = |s: &str| NodeSet::parse(s).unwrap();
        let g = 4u64 << 30;
        // win: one per node; wic: two per node; wim: the machine.
        assert_eq!(
            memory_shares(&topo, &[set("0"), set("1")]),
            Some(vec![g, g])
        );
        assert_eq!(
            memory_shares(&topo, &[set("0"), set("0"), set("1"), set("1")]),
            Some(vec![g / 2; 4])
        );
        assert_eq!(memory_shares(&topo, &[set("0-1")]), Some(vec![2 * g]));
        assert_eq!(
            worker_name(3, &set("1"), IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "w3-node1@127.0.0.1"
        );
        assert_eq!(
            worker_name(0, &set("0-3"), "10.0.0.2".parse().unwrap()),
            "w0-nodes0-3@10.0.0.2"
        );
    }

    #[test]
    fn a_route_toward_loopback_is_loopback() {
        let ip = local_address_toward("127.0.0.1:9".parse().unwrap()).unwrap();
        assert!(ip.is_loopback());
    }
}
