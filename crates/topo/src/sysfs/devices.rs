//! Network and block devices with the node they hang off.

use std::fs;
use std::path::Path;

use super::read_int_opt;
use crate::error::TopoError;
use crate::idset::NodeSet;
use crate::model::{Device, DeviceKind};

/// Devices under `sys/class/net` and `sys/class/block` that are hardware (not below
/// `sys/devices/virtual`; partitions skipped), each with its home node when that is one of
/// `node_ids`.
pub(super) fn read_devices(sys: &Path, node_ids: &NodeSet) -> Result<Vec<Device>, TopoError> {
    let mut devices = Vec::new();
    for (class, kind) in [("net", DeviceKind::Net), ("block", DeviceKind::Block)] {
        let dir = sys.join("class").join(class);
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        for name in names {
            let d = dir.join(&name);
            if d.join("partition").exists() {
                continue;
            }
            // Physical devices live below sys/devices/<bus>; loop, ram, zram, bridges, tunnels
            // below sys/devices/virtual. Very old trees have real directories in sys/class:
            // there a `device` link marks hardware.
            match (fs::canonicalize(&d), fs::canonicalize(sys.join("devices"))) {
                (Ok(c), Ok(top)) if c.starts_with(&top) => {
                    if c.starts_with(top.join("virtual")) {
                        continue;
                    }
                }
                _ => {
                    if !d.join("device").exists() {
                        continue;
                    }
                }
            }
            let node = device_node(sys, &d)?
                .filter(|n| *n >= 0)
                .map(|n| n as u32)
                .filter(|n| node_ids.contains(*n));
            devices.push(Device { name, kind, node });
        }
    }
    Ok(devices)
}

/// The `numa_node` of a device (`entry` is its `sys/class/CLASS/NAME`): `device/numa_node`, else
/// the first `numa_node` found walking up from the entry towards `sys/devices` (an NVMe namespace
/// sits below its PCI function).
fn device_node(sys: &Path, entry: &Path) -> Result<Option<i64>, TopoError> {
    if let Some(v) = read_int_opt(&entry.join("device/numa_node"))? {
        return Ok(Some(v));
    }
    let (Ok(mut p), Ok(top)) = (
        fs::canonicalize(entry),
        fs::canonicalize(sys.join("devices")),
    ) else {
        return Ok(None);
    };
    while p.starts_with(&top) && p != top {
        if let Some(v) = read_int_opt(&p.join("numa_node"))? {
            return Ok(Some(v));
        }
        if !p.pop() {
            break;
        }
    }
    Ok(None)
}
