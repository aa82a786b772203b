//! loci-engine as an engine of `loci bench tpch`: Q1, Q3, Q5, Q6 and Q18 as loci-engine's
//! physical plans, run in this process on loci-sched workers. A configuration's thread
//! placement and memory policy are applied by the engine itself (`--threads` is the workers'
//! loci-place strategy, `--mem` the tables' memory policy); `--alloc` and `--thp` are not (the
//! facts say so, and the summary flags an allocator that is not in the process). The tables
//! are generated in process by the `tpchgen` crate (the rows tpchgen-cli writes for the other
//! engines), once per thread placement and memory policy; generation is not timed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use loci_engine::tpch::{self, Data, Query, Value};
use loci_engine::{Exec, MemPolicy, Sched, Strategy};
use serde_json::json;

use super::{Config, RunSpec, Session};

/// The TPC-H query numbers loci-engine runs.
pub const QUERIES: [u32; 5] = [1, 3, 5, 6, 18];

/// A configuration's thread placement and memory policy, its executor and its tables.
type Prepared = (String, String, Arc<Exec>, Arc<Data>);

/// The engine: the last configuration's executor and tables, reused while the thread
/// placement and memory policy stay the same.
#[derive(Default)]
pub struct Loci {
    cached: std::cell::RefCell<Option<Prepared>>,
}

/// The queries of `wanted` this engine runs.
pub fn supported(wanted: &[u32]) -> Vec<u32> {
    wanted
        .iter()
        .copied()
        .filter(|q| QUERIES.contains(q))
        .collect()
}

/// A cell as the Python driver writes it: numbers as JSON numbers, dates as ISO text.
fn cell(v: &Value) -> serde_json::Value {
    match v {
        Value::Int(i) => json!(i),
        Value::Text(s) => json!(s),
        Value::Date(_) => json!(v.to_string()),
        other => json!(other.as_f64().unwrap_or(f64::NAN)),
    }
}

impl Loci {
    /// The executor and tables of `cfg`, generated when the placement or policy changed.
    fn prepare(&self, run: &RunSpec, cfg: &Config) -> anyhow::Result<(Arc<Exec>, Arc<Data>)> {
        let mut c = self.cached.borrow_mut();
        if let Some((t, m, e, d)) = c.as_ref() {
            if *t == cfg.threads && *m == cfg.mem {
                return Ok((e.clone(), d.clone()));
            }
        }
        *c = None;
        let topo = crate::this_machine()?;
        let strategy: Strategy = cfg
            .threads
            .parse()
            .map_err(|e| anyhow::anyhow!("--threads {}: {e}", cfg.threads))?;
        let policy: MemPolicy = cfg
            .mem
            .parse()
            .map_err(|e| anyhow::anyhow!("--mem {}: {e}", cfg.mem))?;
        let exec = Arc::new(Exec::new(&topo, Sched::Las, strategy, Some(run.cpus))?);
        let sf: f64 = run.sf.parse().with_context(|| format!("--sf {}", run.sf))?;
        let t0 = Instant::now();
        let data = Arc::new(Data::generate(&exec, sf, tpch::MORSEL_ORDERS, &policy)?);
        eprintln!(
            "loci-engine: generated TPC-H sf {} in {:.1} s ({} lineitem rows in {} morsels, {} workers, {})",
            run.sf,
            t0.elapsed().as_secs_f64(),
            data.lineitem_rows(),
            data.lineitem.len(),
            exec.workers(),
            cfg.mem
        );
        *c = Some((
            cfg.threads.clone(),
            cfg.mem.clone(),
            exec.clone(),
            data.clone(),
        ));
        Ok((exec, data))
    }

    /// One session: each supported query of the run warmed `run.warm` times and timed once; the
    /// timed run's rows go to `answers` (the Python driver's format).
    pub fn session(
        &self,
        run: &RunSpec,
        cfg: &Config,
        answers: Option<&Path>,
    ) -> anyhow::Result<Session> {
        let queries = supported(&run.queries);
        if queries.is_empty() {
            bail!(
                "--engines loci: none of the queries {:?} is one loci-engine runs; valid: {:?}",
                run.queries,
                QUERIES
            );
        }
        let (exec, data) = self.prepare(run, cfg)?;
        let mut times = BTreeMap::new();
        let mut rows = serde_json::Map::new();
        for q in queries {
            let query = Query::from_number(q)?;
            for _ in 0..run.warm {
                std::hint::black_box(tpch::run(&exec, &data, query));
            }
            let t0 = Instant::now();
            let a = tpch::run(&exec, &data, query);
            times.insert(q, t0.elapsed().as_secs_f64());
            rows.insert(
                format!("q{q:02}"),
                a.rows
                    .iter()
                    .map(|r| r.iter().map(cell).collect::<Vec<_>>())
                    .collect::<Vec<_>>()
                    .into(),
            );
        }
        if let Some(p) = answers {
            std::fs::write(p, serde_json::Value::Object(rows).to_string())
                .with_context(|| format!("writing {}", p.display()))?;
        }
        let topo = crate::this_machine()?;
        let facts = json!({
            "engine": "loci",
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "maps_allocators": [],
            "own_allocator": null,
            "cpus_allowed": topo.allowed_cpus().to_string(),
            "thp_enabled": null,
            "workers": exec.workers(),
            "note": "in process: --threads and --mem applied by the engine, --alloc and --thp not",
        });
        Ok(Session { times, facts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_written_like_the_python_driver() {
        assert_eq!(cell(&Value::Int(7)), json!(7));
        assert_eq!(cell(&Value::Dec(12345, 2)), json!(123.45));
        assert_eq!(cell(&Value::Date(0)), json!("1970-01-01"));
        assert_eq!(cell(&Value::Text("ASIA".into())), json!("ASIA"));
        assert_eq!(supported(&[1, 2, 3, 18, 22]), vec![1, 3, 18]);
    }
}
