//! Frame protection compared: loci with the plan once per protection mode, the modes' order
//! rotated every round, each mode set against checksum-only and its goal.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::bail;
use loci_report::{Report, Row};
use loci_stream::proto::Protection;

use super::cpu_seconds;
use super::limit::Probe;
use super::loci::{loci_once, stage_medians_per_gb};

/// Every frame protection, weakest first (the order of the comparison's rows).
const PROTECTIONS: [Protection; 3] = [Protection::Checksum, Protection::Auth, Protection::Encrypt];

/// The protection goals: the most of the checksum-only goodput each mode may cost.
pub(super) const PROTECTION_GOALS: [(Protection, f64); 2] =
    [(Protection::Auth, 0.10), (Protection::Encrypt, 0.35)];

/// The modes named in `--protection`, weakest first, each once; an unknown name is an error.
pub(super) fn protection_modes(names: &[String]) -> anyhow::Result<Vec<Protection>> {
    let mut want = Vec::new();
    for n in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        match PROTECTIONS.iter().find(|p| p.name() == n) {
            Some(p) => want.push(*p),
            None => bail!(
                "unknown protection {n:?} (valid: {})",
                PROTECTIONS.map(Protection::name).join(", ")
            ),
        }
    }
    Ok(PROTECTIONS
        .into_iter()
        .filter(|p| want.contains(p))
        .collect())
}

/// The protection comparison: loci with the plan, once per mode per round, the order rotated
/// every round (round r starts with mode r mod n), so drift over the run hits every mode alike.
/// One `protection` row per mode (goodput, cpu-s/GB, ratios to checksum when it ran) and the
/// goals' verdicts in `params.protection_goals`. Every run must end with the whole-stream
/// checksum confirmed by the receiver.
pub(super) fn protection_rows(
    rep: &mut Report,
    data: &Path,
    p: &loci_stream::plan::StreamPlan,
    modes: &[Protection],
    reps: usize,
    probe: &mut Probe,
) -> anyhow::Result<()> {
    if modes.is_empty() {
        return Ok(());
    }
    let bytes = std::fs::metadata(data)?.len();
    anyhow::ensure!(bytes > 0, "{}: empty", data.display());
    let n = modes.len();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut last: Vec<Option<loci_stream::StreamReport>> = vec![None; n];
    let mut stage_cpu: Vec<Vec<BTreeMap<String, f64>>> = vec![Vec::new(); n];
    let mut fractions: Vec<Vec<f64>> = vec![Vec::new(); n];
    for round in 0..reps {
        let limit_bps = probe.measure()?;
        for k in 0..n {
            let m = (round + k) % n;
            let c0 = cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN);
            let run = loci_once(data, p, true, modes[m])?;
            let (t, r) = (run.secs, run.report);
            stage_cpu[m].push(run.stage_cpu_s);
            cpu[m].push(cpu_seconds(libc::RUSAGE_SELF) + cpu_seconds(libc::RUSAGE_CHILDREN) - c0);
            anyhow::ensure!(
                r.verified,
                "protection {}: the receiver did not confirm the whole-stream checksum",
                modes[m].name()
            );
            eprintln!(
                "round {round}: loci plan/{} {:.1} MB/s",
                modes[m].name(),
                bytes as f64 / t / 1e6
            );
            times[m].push(t);
            fractions[m].push(bytes as f64 / t / limit_bps);
            last[m] = Some(r);
        }
    }
    let med = |v: &[f64]| loci_report::median(v).expect("at least one rep");
    let base = modes.iter().position(|m| *m == Protection::Checksum);
    let mut goals = serde_json::Map::new();
    for (m, mode) in modes.iter().enumerate() {
        let r = last[m].take().expect("every mode ran");
        let cpu_s_per_gb = med(&cpu[m]) * 1e9 / bytes as f64;
        let mut row = Row::from_times("loci", times[m].clone())
            .case("protection")
            .config("placement", "plan")
            .config("protection", mode.name())
            .work(bytes as f64, "B/s")
            .extra("verified", true)
            .extra("cpu_s", med(&cpu[m]))
            .extra("cpu_s_per_round", &cpu[m])
            .extra("cpu_ns_per_byte", cpu_s_per_gb)
            .extra("cpu_s_per_gb", cpu_s_per_gb)
            .extra("fraction_of_limit", med(&fractions[m]))
            .extra("fraction_of_limit_per_round", &fractions[m])
            .extra("wire_bytes", r.wire_bytes)
            .extra("compression_ratio", r.compression_ratio)
            .extra("bottleneck", &r.bottleneck)
            .extra(
                "stage_cpu_s_per_gb",
                stage_medians_per_gb(&stage_cpu[m], bytes),
            );
        if let Some(b) = base {
            // Goodput ratio: the checksum mode's time over this mode's (same bytes), of the
            // medians and, to show the spread, round by round.
            let goodput_ratio = med(&times[b]) / med(&times[m]);
            let per_round: Vec<f64> = times[b]
                .iter()
                .zip(&times[m])
                .map(|(tb, tm)| tb / tm)
                .collect();
            let cpu_ratio = med(&cpu[m]) / med(&cpu[b]);
            row = row
                .extra("goodput_vs_checksum", goodput_ratio)
                .extra("goodput_vs_checksum_per_round", per_round)
                .extra("cpu_vs_checksum", cpu_ratio);
            if let Some((_, max_cost)) = PROTECTION_GOALS.iter().find(|(g, _)| g == mode) {
                let cost = 1.0 - goodput_ratio;
                goals.insert(
                    mode.name().into(),
                    serde_json::json!({
                        "max_cost": max_cost,
                        "cost": cost,
                        "goodput_vs_checksum": goodput_ratio,
                        "met": cost <= *max_cost,
                    }),
                );
            }
        }
        rep.results.push(row);
    }
    rep.params["protection"] =
        serde_json::json!(modes.iter().map(|m| m.name()).collect::<Vec<_>>());
    rep.params["protection_goals"] = serde_json::Value::Object(goals);
    Ok(())
}
