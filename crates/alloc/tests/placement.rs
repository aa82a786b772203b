//! Blocks allocated by a thread pinned to node k sit on node k (move_pages) for at least 99% of
//! their pages, on every node of the machine the test runs on (one node here; all nodes in the
//! NUMA VMs, where the same check runs as `examples/placement_check.rs`).

#[path = "../examples/placement_check.rs"]
mod placement_check;

#[test]
fn pinned_threads_get_pages_of_their_node() {
    let res = placement_check::check_all();
    assert!(!res.is_empty(), "no node with cpus found");
    for r in res {
        assert!(r.ok(), "{}: {} ({r:?})", r.name(), r.detail());
    }
}
