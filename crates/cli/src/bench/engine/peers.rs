//! DuckDB and Polars on the same rows: the tables exported as raw columns, bench/peers/peers.py
//! run on them, and its answers checked against loci's.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use loci_engine::{
    generate_agg64, generate_join, Exec, MemPolicy, Sched, Strategy, Table, TableMem, Values,
};
use loci_report::{Report, Row};

use super::{Answer, Case, EngineArgs, Sizes, Workload};
use crate::bench::common;

/// Writes one column of the 64-bit table `t` as raw little-endian values (u64 keys, or values
/// of `values`' type), morsel by morsel (no copy of the table).
fn write_col(t: &Table, path: &Path, col: Option<Values>) -> anyhow::Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, f);
    let mut b = Vec::with_capacity(1 << 19);
    for m in &t.morsels {
        match col {
            None => put_le(&mut f, &mut b, m.keys64(), u64::to_le_bytes)?,
            Some(Values::I64) => put_le(&mut f, &mut b, m.vals64(), i64::to_le_bytes)?,
            Some(Values::F64) => put_le(&mut f, &mut b, m.vals_f64(), f64::to_le_bytes)?,
        }
    }
    f.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Writes `col` as little-endian values through the buffer `b`, 64 Ki values at a time.
fn put_le<T: Copy, const N: usize>(
    f: &mut impl Write,
    b: &mut Vec<u8>,
    col: &[T],
    le: fn(T) -> [u8; N],
) -> std::io::Result<()> {
    for chunk in col.chunks(1 << 16) {
        b.clear();
        for &x in chunk {
            b.extend_from_slice(&le(x));
        }
        f.write_all(b)?;
    }
    Ok(())
}

/// Exports the 64-bit table `t` as `<name>.k.u64` + `<name>.v.i64` (or `.v.f64`).
fn export(t: &Table, dir: &Path, name: &str, values: Values) -> anyhow::Result<()> {
    write_col(t, &dir.join(format!("{name}.k.u64")), None)?;
    write_col(t, &dir.join(format!("{name}.v.{values}")), Some(values))?;
    Ok(())
}

pub(super) fn run_peers(
    w: Workload,
    a: &EngineArgs,
    sz: &Sizes,
    cases: &[Case],
    answers: &[(String, Answer)],
    rep: &mut Report,
) -> anyhow::Result<()> {
    let pdir = common::peers_dir("peers.py")
        .context("bench/peers/peers.py not found (run loci from the repository root)")?;
    let st = Command::new(pdir.join("setup"))
        .status()
        .context("running bench/peers/setup")?;
    if !st.success() {
        bail!("bench/peers/setup failed ({st}): the peers need python3 with venv and PyPI access");
    }
    let topo = crate::this_machine()?;
    let nworkers = a.workers.unwrap_or(topo.allowed_cpus().len().max(1));
    let pool = Exec::new(&topo, Sched::Las, Strategy::sparse(), Some(nworkers))?;
    let (dir, temp) = match &a.peer_dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("loci-peers-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir)?;
    // The peers' rows come from one first-touch generation (rows do not depend on placement).
    let ft = TableMem::from(MemPolicy::FirstTouch);
    let result = (|| -> anyhow::Result<()> {
        for d in cases {
            // Same rows as loci's runs: the generators are independent of placement and threads.
            match d.dist {
                Some(dist) => {
                    let spec = sz.agg(dist, a.seed);
                    let t = generate_agg64(&pool, spec, d.keys, d.values, a.morsel_rows, &ft)?;
                    export(&t, &dir, "t", d.values)?;
                }
                None => {
                    let spec = sz.join(a.seed);
                    let (r, s) = generate_join(&pool, spec, d.keys, a.morsel_rows, &ft)?;
                    export(&r, &dir, "r", Values::I64)?;
                    export(&s, &dir, "s", Values::I64)?;
                }
            }
            let key = d.label();
            let want = answers.iter().find(|x| x.0 == key).map(|x| &x.1);
            eprintln!("running peers {} on {key}", a.peers.join(","));
            let mut child = Command::new(pdir.join(".venv/bin/python"))
                .arg(pdir.join("peers.py"))
                .args(["--workload", w.name()])
                .args(["--values", &d.values.to_string()])
                .arg("--dir")
                .arg(&dir)
                .args(["--reps", &sz.reps.to_string()])
                .args(["--threads", &nworkers.to_string()])
                .args(["--peers", &a.peers.join(",")])
                .stdout(Stdio::piped())
                .spawn()
                .context("starting bench/peers/peers.py")?;
            let stdout = child.stdout.take().expect("piped");
            for line in BufReader::new(stdout).lines() {
                let line = line?;
                let v: serde_json::Value = serde_json::from_str(&line)
                    .with_context(|| format!("peer output is not JSON: {line}"))?;
                let system = v["system"].as_str().unwrap_or("peer").to_string();
                let times: Vec<f64> = serde_json::from_value(v["times_s"].clone())?;
                let ck = v["checksum"].clone();
                if let Some(want) = want {
                    if !want.agrees(&ck) {
                        bail!(
                            "{system} computed a different answer on the same rows: {ck} vs loci {}",
                            want.checksum()
                        );
                    }
                }
                let case = match w {
                    Workload::W4 => format!("{key}/peer hash join"),
                    _ => format!("{key}/peer"),
                };
                rep.results.push(
                    Row::from_times(&system, times)
                        .case(&case)
                        .config("threads", nworkers)
                        .work(sz.rows as f64, "rows/s")
                        .extra("version", v["version"].clone())
                        .extra("timed", v["timed"].clone())
                        .extra("checksum", ck),
                );
            }
            let st = child.wait()?;
            if !st.success() {
                bail!("bench/peers/peers.py failed ({st})");
            }
        }
        Ok(())
    })();
    if temp {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}
