//! `loci os`: the kernel knobs that move threads and pages behind a program's back.

use std::path::Path;

use anyhow::bail;
use clap::Subcommand;
use loci_place::knobs::{self, Setting};
use loci_place::policy::kernel_supports;
use loci_place::sys::mode;

/// Show or change AutoNUMA and transparent huge pages
///
/// AutoNUMA (/proc/sys/kernel/numa_balancing) migrates pages and tasks toward each other; it can
/// undo a placement. THP (/sys/kernel/mm/transparent_hugepage/enabled, defrag) changes page size
/// and so how pages spread over nodes.
///
/// Examples:
///   loci os status
///   sudo loci os set autonuma=off thp=madvise
/// For one program without root, use `loci run --thp off` instead.
#[derive(Subcommand, Debug)]
#[command(verbatim_doc_comment)]
pub enum OsCmd {
    /// Print AutoNUMA, THP enabled/defrag, and which memory policies this kernel accepts.
    Status {
        /// Print JSON: {"autonuma": "off", "thp_enabled": "madvise", "thp_defrag": "madvise",
        /// "preferred_many": true, "weighted_interleave": true}.
        #[arg(long)]
        json: bool,
    },
    /// Change system-wide settings (root only); prints each old value. All are checked before
    /// any is written; if a write fails, the ones already written are restored.
    /// SETTING: autonuma=on|off, thp=always|madvise|never.
    Set {
        #[arg(required = true, value_name = "SETTING")]
        settings: Vec<Setting>,
    },
}

#[derive(serde::Serialize)]
struct StatusJson {
    autonuma: Option<String>,
    thp_enabled: Option<String>,
    thp_defrag: Option<String>,
    preferred_many: bool,
    weighted_interleave: bool,
}

pub fn run(c: OsCmd) -> anyhow::Result<()> {
    match c {
        OsCmd::Status { json } => {
            let k = knobs::read(Path::new("/"))?;
            let nodes = loci_topo::NodeSet::single(0);
            let s = StatusJson {
                autonuma: k.autonuma,
                thp_enabled: k.thp_enabled,
                thp_defrag: k.thp_defrag,
                preferred_many: kernel_supports(mode::MPOL_PREFERRED_MANY, &nodes).unwrap_or(false),
                weighted_interleave: kernel_supports(mode::MPOL_WEIGHTED_INTERLEAVE, &nodes)
                    .unwrap_or(false),
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "not available".into());
                let yn = |b: bool| if b { "yes" } else { "no" };
                println!("autonuma (kernel.numa_balancing): {}", or(&s.autonuma));
                println!("thp enabled:                      {}", or(&s.thp_enabled));
                println!("thp defrag:                       {}", or(&s.thp_defrag));
                println!("preferred-many policy:            {}", yn(s.preferred_many));
                println!(
                    "weighted-interleave policy:       {}",
                    yn(s.weighted_interleave)
                );
            }
            Ok(())
        }
        OsCmd::Set { settings } => {
            if !knobs::is_root() {
                bail!(
                    "loci os set changes system-wide settings and needs root (run it with sudo); for one program without root use `loci run --thp off`"
                );
            }
            for c in knobs::set_all(Path::new("/"), &settings)? {
                println!("{}: {} -> {}", c.path.display(), c.old, c.new);
            }
            Ok(())
        }
    }
}
