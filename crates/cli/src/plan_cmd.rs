//! `loci plan`: where each thread would go, and where memory would be placed, on this machine or
//! on any other (a preset, a captured /sys tree, an hwloc XML export, a synthetic spec).

use clap::Args;
use loci_place::{MemPolicy, Plan, Strategy};

use crate::topo_args::TopoArgs;

/// Shared help text for `--threads`.
pub const THREADS_HELP: &str = "\
Thread strategy, NAME[@BIND]:
  os           not pinned; the OS chooses among the allowed cpus
  compact      fill a node before the next; inside a node one hardware thread
               of every physical core first, then the SMT siblings
  sparse       round-robin over nodes: thread 0 on the first node, thread 1
               on the next, ...
  shared:G     groups of G consecutive threads share a node and (where they
               fit) a last-level cache; groups go round-robin over nodes
  random:SEED  a shuffle of the allowed cpus, the same for the same SEED
  group        each thread bound to a core group (cpus sharing the last-level
               cache inside a node), groups dealt round-robin alternating
               nodes; the OS picks the cpu inside the group
  nodes:LIST   round-robin over the listed nodes, each thread bound to its
               whole node (numactl --cpunodebind, one node per thread)
  cpus:LIST    thread i on the i-th listed cpu, ascending (numactl
               --physcpubind, one cpu per thread)
@BIND widens each thread's cpu to @cpu (itself), @core (its SMT siblings),
@group (its core group) or @node (all allowed cpus of its node). Default:
@node for nodes:, @group for group, @cpu otherwise. LISTs use the Linux list
syntax (0-3,8), `all`, and `!LIST` (all but LIST). Only allowed cpus are used
(affinity mask, cgroup cpuset).";

/// Shared help text for `--mem`.
pub const MEM_HELP: &str = "\
Memory policy, set for every thread of the program (set_mempolicy(2)):
  first-touch                kernel default: a page goes to the node of the
                             thread that touches it first
  interleave[:NODES]         pages round-robin over NODES (default: every
                             allowed node with memory; numactl --interleave)
  localalloc                 the allocating thread's node (--localalloc)
  preferred:N                node N first, others when full (--preferred)
  bind:NODES                 only NODES, never elsewhere (--membind)
  preferred-many:NODES       NODES first (Linux 5.15+)
  weighted-interleave:NODES  interleave by the weights in /sys/kernel/mm/
                             mempolicy/weighted_interleave (Linux 6.9+)
Memoryless nodes in a list are left out, and interleave over one node is
applied as preferred:N; either is said once on stderr. Nodes that are not
present or not allowed are errors.";

/// Where each thread of a program would run, and where its memory would go
///
/// Prints one line per thread (its cpus and nodes) and the memory policy, or with --json the
/// plan document:
///   {"threads": [{"index": 0, "cpus": "0", "nodes": "0"}, ...],
///    "memory": {"policy": "interleave", "nodes": "0-3"}}
///
/// Plans can be made for machines you are not on (--preset, --sysfs-root, --topology,
/// --synthetic); `loci run` applies the same plan on this machine.
///
/// Examples:
///   loci plan --threads compact -n 4
///   loci plan --preset opteron-8220-8s --threads sparse -n 8 --json
///   loci plan --synthetic nodes=4,cores=8,smt=2 --threads shared:4 -n 16 --mem interleave
///   loci plan --threads nodes:0-1 -n 2 --mem bind:0-1
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct PlanCmd {
    #[arg(long, value_name = "STRATEGY", default_value = "compact", long_help = THREADS_HELP)]
    pub threads: Strategy,
    /// Number of threads [default: every cpu the strategy may use].
    #[arg(short = 'n', long = "nthreads", value_name = "N")]
    pub n: Option<usize>,
    #[arg(long, value_name = "POLICY", default_value = "first-touch", long_help = MEM_HELP)]
    pub mem: MemPolicy,
    /// Allow more threads than cpus: threads then share cpus (anchors wrap around).
    #[arg(long)]
    pub oversubscribe: bool,
    /// Print the plan JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub topo: TopoArgs,
}

/// The number of threads when `-n` is not given: every cpu the strategy may use.
pub fn default_threads(topo: &loci_topo::Topology, strategy: &Strategy) -> anyhow::Result<usize> {
    // Plan one thread per allowed cpu with oversubscription and count the distinct pool cpus.
    let (places, _) =
        loci_place::strategy::place_threads(topo, strategy, topo.allowed_cpus().len().max(1), true)
            .map_err(|e| anyhow::anyhow!("--threads: {e}"))?;
    let pool = places
        .iter()
        .fold(loci_topo::CpuSet::new(), |a, p| a.union(&p.cpus));
    Ok(match &strategy.kind {
        loci_place::strategy::Kind::Os => topo.allowed_cpus().len(),
        _ => pool.len().max(1),
    })
}

/// Makes the plan, printing its notes once on stderr.
pub fn make_plan(
    topo: &loci_topo::Topology,
    strategy: &Strategy,
    n: Option<usize>,
    mem: &MemPolicy,
    oversubscribe: bool,
) -> anyhow::Result<Plan> {
    let n = match n {
        Some(n) => n,
        None => default_threads(topo, strategy)?,
    };
    let plan = Plan::new(topo, strategy, n, mem, oversubscribe)?;
    for note in &plan.notes {
        eprintln!("loci: note: {note}");
    }
    Ok(plan)
}

pub fn run(c: PlanCmd) -> anyhow::Result<()> {
    let topo = c.topo.load()?;
    let plan = make_plan(&topo, &c.threads, c.n, &c.mem, c.oversubscribe)?;
    if c.json {
        println!("{}", serde_json::to_string_pretty(&plan.to_json())?);
    } else {
        println!("machine {}", topo.source);
        println!("{plan}");
    }
    Ok(())
}
