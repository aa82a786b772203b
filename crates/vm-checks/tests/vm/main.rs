//! The VM tests of the libraries' placement (`--test vm`, the VM step of scripts/test): each boots
//! NUMA VMs (scripts/numa-vm, through loci-vm) and runs one of this crate's check programs inside.
//! Run only with `LOCI_NUMA_VM=1`; without it each test prints a skip note and passes.

mod array;
mod engine;
mod sched;
