//! `loci stream plan` writes configs that `send`/`recv` load, for any topology source.

use std::process::Command;

#[test]
fn plan_for_the_seed_machine_writes_loadable_configs() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_loci"))
        .args([
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
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = loci_stream::ReceiverConfig::load(&dir.path().join("recv.toml")).unwrap();
    assert_eq!(r.streams.len(), 4);
    assert!(r.streams.iter().all(|s| s.recv.mem.iter().all(|&n| n == 1)));
    for k in 0..4 {
        let s =
            loci_stream::SenderConfig::load(&dir.path().join(format!("send-{k}.toml"))).unwrap();
        assert_eq!(s.stream, k);
        assert_eq!(s.compress.count, 32);
    }
}

#[test]
fn bad_topology_and_nic_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_loci"))
            .args(["stream", "plan", "-o"])
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let e = run(&["--sender", "local", "--receiver", "nonsense"]);
    assert!(e.contains("--receiver") && e.contains("preset:NAME"), "{e}");
    let e = run(&[
        "--sender",
        "local",
        "--receiver",
        "preset:xeon-gold-6346-2s",
        "--nic",
        "eth7",
    ]);
    assert!(e.contains("eth7") && e.contains("ens5f0np0"), "{e}");
}
