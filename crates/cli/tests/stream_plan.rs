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
    for k in 0..4 {
        let s =
            loci_stream::SenderConfig::load(&dir.path().join(format!("send-{k}.toml"))).unwrap();
        assert_eq!(s.stream, k);
        assert_eq!(s.compress.count, 32);
    }
}
