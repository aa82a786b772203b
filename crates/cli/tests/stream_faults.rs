//! Fault tests of `loci stream`, with real processes (each killed on drop, every wait bounded,
//! no timing asserted):
//! - kill -9 the receiver mid-stream and restart it; kill -9 the sender and restart it with
//!   --resume; corrupt frames on the wire (authenticated: the connection ends and the chunk is
//!   resent; checksum-only: NACKed and resent). Each on loopback and across two network
//!   namespaces joined by a veth pair;
//! - a man in the middle (`faults/mitm.rs`) forging DATA and ACK frames, replaying, reordering and
//!   splicing DATA frames, forging END_ACK and the handshake's resume ranges, in auth and encrypt
//!   mode: on every connection the stream fails closed, once it is survived (resume ranges: fails
//!   closed);
//! - simulated power loss of a `sync = "none"` receiver (file tail cut, a journaled chunk
//!   overwritten, journal torn): the resumed stream repairs itself;
//! - two streams into one FILE sink: the second is refused;
//! - 200 half-open connections held while a stream runs.
//!
//! `fault_table` (ignored; `scripts/stream-faults [RUNS]`) runs every scenario RUNS times and
//! prints, per fault, the bytes lost, the bytes corrupted and the false "verified" reports.
//!
//! `tc netem` (delay, loss, reordering on the veth) is applied when the kernel has sch_netem. When
//! it does not (CONFIG_NET_SCH_NETEM unset, as on the machine this was written on), the namespace
//! tests here still run over the veth pair and print a note: the faults under test are the
//! application's (process death, corrupt frames), and netem's packet loss and reordering are
//! repaired by TCP below loci, so refusing to run would only lose coverage. Set
//! `LOCI_REQUIRE_NETEM=1` to make a missing netem a failure instead. The same scenarios WITH netem
//! run inside a NUMA VM whose Debian kernel loads sch_netem (`tests/vm.rs`, the VM step of
//! `scripts/test`).

mod common;
mod faults;

use faults::mitm::{mitm, Attack, Mode, Persist};
use faults::{
    corrupt_frames_are_nacked_unauthenticated, corrupt_frames_are_resent, half_open_flood,
    namespaces, power_loss, receiver_killed_and_restarted, sender_killed_and_resumed,
    two_streams_one_file, Net, Tally, HOST,
};

#[test]
fn namespaces_with_veth_all_faults() {
    let (_ns, net) = match namespaces("f") {
        Ok(x) => x,
        Err(e) if e.contains("Operation not permitted") => {
            eprintln!("NOTE: skipped: creating network namespaces needs root ({e})");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    receiver_killed_and_restarted(&net, HOST);
    sender_killed_and_resumed(&net, HOST);
    corrupt_frames_are_resent(&net, HOST);
}

/// Every attack of one kind: on every connection and once, in auth and encrypt mode.
fn mitm_all(attack: Attack) {
    for persist in [Persist::Always, Persist::Once] {
        for mode in Mode::ALL {
            mitm(attack, persist, mode);
        }
    }
}

/// One test per line: `NAME: BODY`.
macro_rules! tests {
    ($($name:ident: $body:expr),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $body;
            }
        )*
    };
}

tests! {
    loopback_receiver_kill_9_and_restart: receiver_killed_and_restarted(&Net::loopback(), HOST),
    loopback_sender_kill_9_and_resume: sender_killed_and_resumed(&Net::loopback(), HOST),
    loopback_corrupt_frames: corrupt_frames_are_resent(&Net::loopback(), HOST),
    loopback_corrupt_frames_unauthenticated_are_nacked:
        corrupt_frames_are_nacked_unauthenticated(&Net::loopback(), HOST),
    mitm_forged_data: mitm_all(Attack::ForgeData),
    mitm_forged_ack: mitm_all(Attack::ForgeAck),
    mitm_replayed_data: mitm_all(Attack::Replay),
    mitm_reordered_data: mitm_all(Attack::Reorder),
    mitm_spliced_data: mitm_all(Attack::Splice),
    mitm_forged_end_ack: mitm_all(Attack::ForgeEndAck),
    power_loss_sender_reconnects: power_loss(HOST, true),
    power_loss_sender_resumes: power_loss(HOST, false),
    two_streams_into_one_file_sink: two_streams_one_file(HOST),
    half_open_connection_flood: half_open_flood(HOST),
}

/// The ranges travel in the handshake, the same in both modes; forged on every connection the
/// stream fails only at END, after the receiver's 30 s wait for missing chunks, so the default
/// run does that in auth mode only (`fault_table` does both).
#[test]
fn mitm_forged_resume_ranges() {
    mitm(Attack::ForgeRanges, Persist::Always, Mode::Auth);
    for mode in Mode::ALL {
        mitm(Attack::ForgeRanges, Persist::Once, mode);
    }
}

/// Runs every loopback scenario `LOCI_FAULT_RUNS` times (default 3; the goal is 20) and prints
/// one row per fault: runs, runs that failed an assertion, bytes lost, bytes corrupted, false
/// "verified" reports. Fails if any column but runs is non-zero. `scripts/stream-faults [RUNS]`.
#[test]
#[ignore = "long: run by scripts/stream-faults"]
fn fault_table() {
    let runs: usize = std::env::var("LOCI_FAULT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let all = faults::scenarios();
    let mut rows: Vec<(usize, usize, Tally)> = vec![(0, 0, Tally::default()); all.len()];
    let mut failures: Vec<String> = vec![];
    let t0 = std::time::Instant::now();
    for round in 1..=runs {
        for (sc, row) in all.iter().zip(rows.iter_mut()) {
            let _ = faults::take_tally();
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (sc.run)()));
            row.0 += 1;
            row.2.add(faults::take_tally());
            if let Err(e) = r {
                row.1 += 1;
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("round {round}, {}: {msg}", sc.name));
            }
        }
        eprintln!(
            "fault table: round {round} of {runs} done ({:.0} s)",
            t0.elapsed().as_secs_f64()
        );
    }
    let w = all.iter().map(|s| s.name.len()).max().unwrap_or(5).max(5);
    let mut table = format!(
        "\n{:w$} | runs | failed | bytes lost | bytes corrupted | false \"verified\"\n{}\n",
        "fault",
        "-".repeat(w + 64)
    );
    for (sc, (n, failed, t)) in all.iter().zip(&rows) {
        table += &format!(
            "{:w$} | {n:4} | {failed:6} | {:10} | {:15} | {:16}\n",
            sc.name, t.bytes_lost, t.bytes_corrupted, t.false_verified
        );
    }
    println!("{table}");
    println!(
        "{} scenarios x {runs} runs in {:.0} s",
        all.len(),
        t0.elapsed().as_secs_f64()
    );
    for f in &failures {
        println!("FAILED: {f}");
    }
    assert!(
        failures.is_empty() && rows.iter().all(|(_, _, t)| t.is_clean()),
        "faults lost, corrupted or falsely verified data, or a scenario failed (table above)"
    );
}
