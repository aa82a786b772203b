//! The text parsers of the sysfs reader (`loci_topo::sysfs`), each fed the whole input as the
//! file it reads: node and `/proc/meminfo`, a node `distance` row, a cache `size` and `type`, a
//! one-integer file, `/proc/self/status` fields, `/proc/self/cgroup`, `/proc/self/mountinfo` and
//! `/proc/mounts`, the cpuset directories those lead to, and NVIDIA's `numa_status`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loci_topo::sysfs;

fuzz_target!(|data: &[u8]| {
    let s = loci_fuzz::text(data);
    let _ = sysfs::parse_meminfo(&s);
    if let Ok(row) = sysfs::parse_distance_row(&s) {
        // Each whitespace-separated token is one distance.
        assert_eq!(row.len(), s.split_whitespace().count());
    }
    let _ = sysfs::parse_size(&s);
    let _ = sysfs::parse_cache_type(&s);
    if let Ok(v) = sysfs::parse_int(&s) {
        assert_eq!(sysfs::parse_int(&v.to_string()), Ok(v));
    }
    for key in ["Cpus_allowed_list", "Mems_allowed_list", "Cpus_allowed", ""] {
        if let Some(v) = sysfs::status_field(&s, key) {
            assert_eq!(v, v.trim(), "status_field returns a trimmed value");
        }
    }
    let cg = sysfs::parse_proc_cgroup(&s);
    let mounts = sysfs::parse_mountinfo(&s);
    let _ = sysfs::cpuset_dirs(&cg, &mounts);
    let mounts = sysfs::parse_proc_mounts(&s);
    let _ = sysfs::cpuset_dirs(&cg, &mounts);
    let _ = sysfs::parse_numa_status(&s);
});
