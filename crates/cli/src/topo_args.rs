//! The topology-source flags every command that needs a machine shares (`loci topo`, `loci plan`,
//! ...): flatten [`TopoArgs`] into the command's clap struct and call [`TopoArgs::load`].

use std::path::PathBuf;

use clap::Args;
use loci_topo::{Source, Topology};

/// Which machine to describe. Without a flag: the machine loci runs on, as this process sees it
/// (its affinity mask and cgroup cpuset decide which cpus and nodes are allowed).
#[derive(Args, Clone, Debug, Default)]
pub struct TopoArgs {
    /// Read a captured sysfs tree instead of this machine: DIR holds `sys/` (and optionally
    /// `proc/`), e.g. a copy of another machine's /sys. The cgroup cpuset captured in the tree
    /// (`proc/self/cgroup` or `proc/self/cpuset` with the cgroup mount) decides what is allowed.
    #[arg(long, value_name = "DIR", help_heading = "Topology source",
          conflicts_with_all = ["topology", "preset", "synthetic"])]
    pub sysfs_root: Option<PathBuf>,
    /// Read an hwloc v2 XML export (`lstopo --of xml > FILE.xml`), or a machine saved with
    /// `loci topo --json > FILE.json` (told apart by content).
    #[arg(
        long,
        value_name = "FILE.xml|FILE.json",
        help_heading = "Topology source",
        conflicts_with_all = ["preset", "synthetic"]
    )]
    pub topology: Option<PathBuf>,
    /// Use a built-in machine from the papers loci follows: xeon-silver-4114-2s, xeon-gold-6346-2s,
    /// opteron-8220-8s, xeon-e7520-4s, xeon-e7-4850v4-4s, xeon-e7-4820-4s, xeon-e5310-2s,
    /// xeon-e5-4660v4-4s, xeon-platinum-8275cl-2s.
    #[arg(
        long,
        value_name = "NAME",
        help_heading = "Topology source",
        conflicts_with = "synthetic"
    )]
    pub preset: Option<String>,
    /// Make up a machine: comma-separated key=value, e.g. `nodes=4,cores=8,smt=2,llc=node,dist=10:21`.
    /// Keys: nodes, cores (per node), smt, packages, llc (node|package|core|N), l2 (core|N), mem
    /// (per node, e.g. 64G), dist (LOCAL:REMOTE or rows `10:21/21:10`), cpuless, memless
    /// (node lists), siblings (apart|adjacent).
    #[arg(long, value_name = "SPEC", help_heading = "Topology source")]
    pub synthetic: Option<String>,
    /// Plan as if every present cpu and node were allowed, ignoring the cgroup cpuset, the
    /// affinity mask and Mems_allowed (hwloc's --whole-system). Without it plans never use a cpu
    /// or node outside them. On this machine the kernel still refuses to bind outside them.
    #[arg(long, help_heading = "Topology source")]
    pub whole_system: bool,
}

impl TopoArgs {
    /// The source these flags name.
    pub fn source(&self) -> Source {
        if let Some(d) = &self.sysfs_root {
            Source::Sysfs(d.clone())
        } else if let Some(f) = &self.topology {
            if is_json(f) {
                Source::Json(f.clone())
            } else {
                Source::HwlocXml(f.clone())
            }
        } else if let Some(p) = &self.preset {
            Source::Preset(p.clone())
        } else if let Some(s) = &self.synthetic {
            Source::Synthetic(s.clone())
        } else {
            Source::live()
        }
    }

    /// Loads the topology these flags name.
    pub fn load(&self) -> anyhow::Result<Topology> {
        let mut t = loci_topo::load(&self.source())?;
        if self.whole_system {
            t.allow_everything();
        }
        Ok(t)
    }

    /// Whether the topology is the machine this process runs on (placement can be applied and
    /// verified) rather than a description of another one (plans only).
    pub fn is_live(&self) -> bool {
        matches!(self.source(), Source::Live { .. })
    }
}

/// Whether a file starts (after whitespace) with `{`: a JSON document rather than XML. A file
/// that cannot be read goes to the XML reader, whose error names it.
fn is_json(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 256];
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let n = f.read(&mut buf).unwrap_or(0);
    buf[..n]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{')
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        topo: TopoArgs,
    }

    #[test]
    fn default_is_this_machine() {
        let t = T::try_parse_from(["x"]).unwrap();
        assert!(t.topo.is_live());
        assert_eq!(t.topo.source(), Source::live());
    }

    #[test]
    fn flags_pick_sources() {
        let t = T::try_parse_from(["x", "--preset", "opteron-8220-8s"]).unwrap();
        assert_eq!(t.topo.source(), Source::Preset("opteron-8220-8s".into()));
        assert_eq!(t.topo.load().unwrap().nodes.len(), 8);
        let t = T::try_parse_from(["x", "--synthetic", "nodes=2"]).unwrap();
        assert_eq!(t.topo.load().unwrap().nodes.len(), 2);
        let t = T::try_parse_from(["x", "--sysfs-root", "/tmp/x"]).unwrap();
        assert_eq!(t.topo.source(), Source::Sysfs("/tmp/x".into()));
    }

    #[test]
    fn saved_json_is_a_source() {
        let dir = std::env::temp_dir().join(format!("loci-topo-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("m.json");
        let t = loci_topo::load(&Source::Preset("xeon-e5310-2s".into())).unwrap();
        std::fs::write(&file, serde_json::to_string(&t.to_json()).unwrap()).unwrap();
        let a = T::try_parse_from(["x", "--topology", file.to_str().unwrap()]).unwrap();
        assert_eq!(a.topo.source(), Source::Json(file.clone()));
        let back = a.topo.load().unwrap();
        assert_eq!(back.cpus, t.cpus);
        assert_eq!(back.caches, t.caches);
        assert!(
            back.source.contains("preset:xeon-e5310-2s"),
            "{}",
            back.source
        );
        std::fs::write(&file, "{\"source\": 1}").unwrap();
        let e = a.topo.load().unwrap_err().to_string();
        assert!(
            e.contains("m.json") && e.contains("loci topo --json"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn whole_system_lifts_the_restrictions() {
        let t =
            T::try_parse_from(["x", "--synthetic", "nodes=2,cores=2", "--whole-system"]).unwrap();
        assert!(t.topo.whole_system);
        assert_eq!(t.topo.source(), Source::Synthetic("nodes=2,cores=2".into()));
        let topo = t.topo.load().unwrap();
        assert_eq!(topo.allowed_cpus().to_string(), "0-3");
        assert!(topo.notes.iter().any(|n| n.contains("--whole-system")));
    }

    #[test]
    fn sources_are_exclusive() {
        let e = T::try_parse_from(["x", "--preset", "a", "--synthetic", "nodes=2"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("cannot be used with"), "{e}");
    }

    #[test]
    fn bad_preset_names_choices() {
        let t = T::try_parse_from(["x", "--preset", "nope"]).unwrap();
        let e = t.topo.load().unwrap_err().to_string();
        assert!(e.contains("`nope`") && e.contains("opteron-8220-8s"), "{e}");
    }
}
