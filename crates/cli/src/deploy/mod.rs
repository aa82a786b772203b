//! `loci deploy`: seed 004's deployment designs for any engine's workers: lay instances out over
//! the topology, start each through `loci run` with its own plan, verify, supervise, and keep a
//! manifest that `loci deploy status|stop` read.

use std::ffi::OsString;
use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, Subcommand, ValueEnum};

use crate::topo_args::TopoArgs;

pub mod dask;
pub mod layout;
pub mod manifest;
mod supervise;
pub mod template;

use layout::{Deployment, Design, MemMode};
use manifest::{InstanceRecord, Manifest};
use template::{Template, Values};

/// Run a set of worker instances placed by one of seed 004's designs, and supervise them
///
/// Designs (seed 004: WIN with bound memory beat WIM and WIC by 2-3x on TPC-H):
///   wim     one instance for the machine, not pinned        (default --mem first-touch)
///   win     one instance per node with cpus, on its cpus     (default --mem bind)
///   wic     one instance per physical core                   (default --mem bind)
///   spmwin  as many instances as win, as many cores each, but every core from another node
///
/// Each instance runs as `loci run --threads STRATEGY -n N --mem POLICY -- COMMAND` (the same
/// placement code as `loci run`), in its own process group, its output prefixed `[i] `. After
/// start every instance is checked from /proc: its threads on its cpus, its pages per node.
/// SIGINT and SIGTERM go to every instance (SIGKILL after --grace). An instance that ends with a
/// non-zero status is restarted (--restart on-failure) after 0.25 s, doubling up to 8 s, at most
/// --max-restarts times. The manifest (JSON, docs/deploy.md) says every instance's plan, pids,
/// restarts and state; `loci deploy status MANIFEST` and `loci deploy stop MANIFEST` read it.
///
/// Template placeholders (`{{` `}}` for literal braces):
///   {instance} {ninstances} {node} {nodes} {cpus} {ncpus} {port} {nic} {nic_node}
///
/// Examples:
///   loci deploy --design win --dry-run -- worker --port {port} --cpus {cpus}
///   loci deploy --design win --preset xeon-gold-6346-2s --dry-run --json -- w {node}
///   loci deploy --design wic --manifest /tmp/d.json -- ./server --listen :{port}
///   loci deploy status /tmp/d.json
///   loci deploy stop /tmp/d.json
#[derive(Args, Debug)]
#[command(
    verbatim_doc_comment,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct DeployCmd {
    #[command(subcommand)]
    pub action: Option<Action>,
    #[command(flatten)]
    pub start: StartArgs,
}

#[derive(Subcommand, Debug)]
pub enum Action {
    Status(manifest::StatusCmd),
    Stop(manifest::StopCmd),
    Dask(Box<dask::DaskCmd>),
}

/// When an instance that ended is started again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Restart {
    /// After a non-zero exit status or death by a signal.
    OnFailure,
    Never,
}

#[derive(Args, Debug)]
pub struct StartArgs {
    /// The layout of instances.
    #[arg(long, value_enum, required = true)]
    pub design: Option<Design>,
    #[command(flatten)]
    pub common: Common,
    /// {port} of instance i is PORT+i.
    #[arg(long, value_name = "PORT", default_value_t = 20000)]
    pub port_base: u16,
    /// The command template of one instance.
    #[arg(last = true, required = true, value_name = "CMD-TEMPLATE")]
    pub cmd: Vec<OsString>,
}

/// The placement, supervision and output flags `loci deploy` and `loci deploy dask` share.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Number of instances [default: the design's: nodes with cpus (win, spmwin), cores (wic),
    /// 1 (wim)]. Fewer take the first nodes or cores.
    #[arg(long, value_name = "N")]
    pub instances: Option<usize>,
    /// Memory policy of every instance [default: bind, or first-touch for wim]. bind: the
    /// instance's own nodes (a memory-less node: the nearest node with memory).
    #[arg(long, value_enum)]
    pub mem: Option<MemMode>,
    /// Network devices to deal to instances by locality (nearest node first) [default: every
    /// network device of the topology].
    #[arg(long, value_name = "IF,...", value_delimiter = ',')]
    pub nics: Option<Vec<String>>,
    #[arg(long, value_enum, default_value_t = Restart::OnFailure)]
    pub restart: Restart,
    /// Restarts per instance before it is left failed.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub max_restarts: u32,
    /// Seconds between SIGTERM and SIGKILL when stopping (0 to 3600).
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = parse_grace)]
    pub grace: f64,
    /// Where the manifest is written.
    #[arg(long, value_name = "FILE", default_value = "loci-deploy.json")]
    pub manifest: PathBuf,
    /// Print each instance's placement and command line; start nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the manifest as JSON (with --dry-run: the plans; otherwise once every instance is
    /// verified).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub topo: TopoArgs,
}

impl Common {
    /// The layout options these flags give.
    pub fn layout_options(&self) -> layout::Options {
        layout::Options {
            instances: self.instances,
            mem: self.mem,
            nics: self.nics.clone(),
        }
    }
}

pub fn run(c: DeployCmd) -> anyhow::Result<()> {
    match c.action {
        Some(Action::Status(s)) => manifest::status(s),
        Some(Action::Stop(s)) => manifest::stop(s),
        Some(Action::Dask(d)) => dask::run(*d),
        None => start(c.start),
    }
}

/// The manifest of a layout with every template expanded: the plan before anything starts.
/// Instance i gets port `port_base + i`.
pub fn planned(
    layout: &Deployment,
    tpl: &Template,
    port_base: u16,
    a: &Common,
    topology: &str,
    exe: &str,
) -> anyhow::Result<Manifest> {
    let n = layout.instances.len();
    let instances = layout
        .instances
        .iter()
        .map(|i| {
            let port = u16::try_from(port_base as usize + i.index).map_err(|_| {
                anyhow::anyhow!(
                    "--port-base {}: instance {} would get port {}, above 65535",
                    port_base,
                    i.index,
                    port_base as usize + i.index
                )
            })?;
            let command = tpl.expand(&Values {
                instance: i.index,
                ninstances: n,
                nodes: i.nodes.clone(),
                cpus: i.cpus.clone(),
                port,
                nic: i.nic.clone(),
            })?;
            let mut run = vec![
                exe.to_string(),
                "run".into(),
                "--threads".into(),
                i.strategy.to_string(),
            ];
            if let Some(k) = i.nthreads {
                run.extend(["-n".to_string(), k.to_string()]);
            }
            run.extend(["--mem".to_string(), i.mem.to_string(), "--".to_string()]);
            run.extend(command.iter().cloned());
            Ok(InstanceRecord {
                index: i.index,
                nodes: i.nodes.clone(),
                cpus: i.cpus.clone(),
                mem: i.mem.to_string(),
                mem_nodes: i.plan.expected_mem_nodes(),
                nic: i.nic.as_ref().map(|x| x.0.clone()),
                nic_node: i.nic.as_ref().and_then(|x| x.1),
                port,
                plan: i.plan.to_json(),
                command,
                run,
                state: "planned".into(),
                runner_pid: None,
                pid: None,
                restarts: 0,
                last_exit: None,
                verify: None,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Manifest {
        design: layout.design.name().into(),
        topology: topology.into(),
        state: "planned".into(),
        supervisor_pid: None,
        restart: a
            .restart
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default(),
        max_restarts: a.max_restarts,
        grace_s: a.grace,
        notes: layout.notes.clone(),
        instances,
        dask: None,
    })
}

fn print_plan(m: &Manifest) {
    println!(
        "deploy {} on {}: {} instance(s)",
        m.design,
        m.topology,
        m.instances.len()
    );
    for r in &m.instances {
        println!(
            "  instance {}: nodes {}, cpus {} ({}), mem {}, nic {}, port {}",
            r.index,
            r.nodes,
            r.cpus,
            r.cpus.len(),
            r.mem,
            match (&r.nic, r.nic_node) {
                (Some(n), Some(node)) => format!("{n} (node {node})"),
                (Some(n), None) => format!("{n} (no node)"),
                (None, _) => "none".into(),
            },
            r.port
        );
        println!("    {}", crate::run_cmd::shell_line(&r.run));
    }
    for n in &m.notes {
        println!("  note: {n}");
    }
}

fn start(a: StartArgs) -> anyhow::Result<()> {
    let design = a.design.expect("clap requires --design");
    let tpl = Template::parse(&a.cmd)?;
    let c = &a.common;
    let topo = c.topo.load()?;
    let layout = layout::layout(&topo, design, &c.layout_options())?;
    let exe = runner_exe(c, &topo)?;
    let m = planned(&layout, &tpl, a.port_base, c, &topo.source, &exe)?;
    if show_plan(&m, c, print_plan)? {
        return Ok(());
    }
    refuse_live_manifest(&c.manifest)?;
    for n in &m.notes {
        eprintln!("loci: note: {n}");
    }
    supervise::run(m, c)
}

/// The `loci` that starts each instance: this binary on a live machine; a layout for another
/// machine can only be shown (`loci` stands in), and without --dry-run that is an error.
fn runner_exe(c: &Common, topo: &loci_topo::Topology) -> anyhow::Result<String> {
    let live = c.topo.is_live();
    if !live && !c.dry_run {
        bail!(
            "the topology names another machine ({}): its layout can only be shown; add --dry-run",
            topo.source
        );
    }
    Ok(if live {
        std::env::current_exe()?.to_string_lossy().into_owned()
    } else {
        "loci".into()
    })
}

/// For --dry-run: prints the plan (JSON, or `text`) and returns true; otherwise false.
fn show_plan(m: &Manifest, c: &Common, text: impl Fn(&Manifest)) -> anyhow::Result<bool> {
    if !c.dry_run {
        return Ok(false);
    }
    if c.json {
        println!("{}", serde_json::to_string_pretty(m)?);
    } else {
        text(m);
    }
    Ok(true)
}

/// An error when `path` belongs to a deployment whose supervisor still runs.
fn refuse_live_manifest(path: &std::path::Path) -> anyhow::Result<()> {
    if let Ok(old) = Manifest::read(path) {
        if old.supervisor_alive() {
            bail!(
                "{} belongs to a deployment that is still running (supervisor pid {}); stop it with `loci deploy stop {}` or choose another --manifest",
                path.display(),
                old.supervisor_pid.unwrap_or_default(),
                path.display()
            );
        }
    }
    Ok(())
}

pub fn parse_grace(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    manifest::check_grace(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        d: DeployCmd,
    }

    #[test]
    fn start_and_subcommands_parse() {
        let t = T::try_parse_from(["x", "--design", "win", "--nics", "a,b", "--", "w", "{node}"])
            .unwrap();
        assert!(t.d.action.is_none());
        assert_eq!(
            t.d.start.common.nics.as_deref(),
            Some(&["a".to_string(), "b".to_string()][..])
        );
        let t = T::try_parse_from(["x", "status", "m.json"]).unwrap();
        assert!(matches!(t.d.action, Some(Action::Status(_))));
        let t = T::try_parse_from(["x", "stop", "m.json"]).unwrap();
        assert!(matches!(t.d.action, Some(Action::Stop(_))));
        // Errors name what is missing or the valid designs.
        for (args, want) in [
            (&["x", "--", "w"][..], "--design"),
            (&["x", "--design", "wix", "--", "w"][..], "spmwin"),
        ] {
            let e = T::try_parse_from(args).err().map(|e| e.to_string());
            assert!(
                e.as_deref().is_some_and(|e| e.contains(want)),
                "{args:?}: {e:?}"
            );
        }
    }

    #[test]
    fn shell_lines_quote_what_needs_it() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            crate::run_cmd::shell_line(&v(&["a", "b c", "it's", ""])),
            "a 'b c' 'it'\\''s' ''"
        );
    }
}
