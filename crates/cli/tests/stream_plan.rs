//! `loci stream plan` writes configs that `send`/`recv` load, for any topology source.

mod common;
use common::loci;

#[test]
fn plan_for_the_seed_machine_writes_loadable_configs() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = loci(&[
        "stream",
        "plan",
        "--sender",
        "preset:xeon-gold-6346-2s",
        "--receiver",
        "preset:xeon-gold-6346-2s",
        "--nic",
        "ens5f0np0",
        "--streams",
        "4",
        "-o",
        dir.path().to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let r = loci_stream::ReceiverConfig::load(&dir.path().join("recv.toml")).unwrap();
    assert_eq!(r.streams.len(), 4);
    assert!(r.streams.iter().all(|s| s.recv.mem.iter().all(|&n| n == 1)));
    // Bound to their node by default (node 1 of the preset is cpus 16-31,48-63).
    assert!(r.streams[0]
        .recv
        .cpus
        .iter()
        .all(|c| c.to_string() == "16-31,48-63"));
    for k in 0..4 {
        let s =
            loci_stream::SenderConfig::load(&dir.path().join(format!("send-{k}.toml"))).unwrap();
        assert_eq!(s.stream, k);
        assert_eq!(s.compress.count, 32);
    }
    let header = std::fs::read_to_string(dir.path().join("recv.toml")).unwrap();
    assert!(header.contains("# binding: each thread may run on every allowed cpu of its node"));
}

/// `--bind cpu` pins each thread to the one cpu the rules chose; a bad binding names the valid ones.
#[test]
fn bind_cpu_pins_one_cpu_per_thread_and_bad_bindings_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let seed = "preset:xeon-gold-6346-2s";
    let args = |bind| {
        [
            "stream",
            "plan",
            "--sender",
            seed,
            "--receiver",
            seed,
            "--nic",
            "ens5f0np0",
            "--bind",
            bind,
            "-o",
            out,
        ]
    };
    let (ok, _, err) = loci(&args("cpu"));
    assert!(ok, "{err}");
    let r = loci_stream::ReceiverConfig::load(&dir.path().join("recv.toml")).unwrap();
    let recv = &r.streams[0].recv;
    assert_eq!(recv.cpus.len(), 16);
    assert!(recv.cpus.iter().all(|c| c.len() == 1), "{:?}", recv.cpus);
    let (ok, _, err) = loci(&args("socket"));
    assert!(
        !ok && err.contains("`socket`") && err.contains("cpu, core, group, node"),
        "{err}"
    );
}

/// Out-of-range numbers are refused by name before anything starts (no panic, no empty run).
#[test]
fn out_of_range_numbers_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let seed = "preset:xeon-gold-6346-2s";
    let plan = |chunk: &'static str| -> Vec<&str> {
        let nic = ["--nic", "ens5f0np0", "--chunk-bytes", chunk, "-o", out];
        [
            &["stream", "plan", "--sender", seed, "--receiver", seed][..],
            &nic,
        ]
        .concat()
    };
    let send = [
        "stream",
        "send",
        "--reconnect-timeout",
        "18446744073709551615",
        "--to",
        "127.0.0.1:1",
    ];
    let cases: [(Vec<&str>, &str); 4] = [
        (send.to_vec(), "not in 0..=604800"),
        (vec!["stream", "recv", "--streams", "0"], "at least 1"),
        (plan("0"), "--chunk-bytes 0 outside 1..=268435456"),
        (plan("8G"), "--chunk-bytes 8000000000 outside"),
    ];
    for (args, want) in cases {
        let (ok, _, err) = loci(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(
            err.contains(want) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    assert!(!dir.path().join("send-0.toml").exists());
}
