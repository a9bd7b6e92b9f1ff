//! What `doctor` and its probe both read about this node: the cgroup's facts, `RLIMIT_MEMLOCK`,
//! `/proc/meminfo`, a cgroup's usage. Its own module, so the probe and the report of the findings
//! import it, not each other.

use pinguard_common::cgroup::{self, Place};
use serde::Serialize;

#[derive(Serialize)]
pub struct CgroupFacts {
    #[serde(flatten)]
    pub place: Place,
    /// Where the group and its hierarchy were found.
    pub place_source: &'static str,
    pub levels: Vec<cgroup::Level>,
    /// The tightest limit on the path, the folder that sets it and its file.
    pub limit_bytes: Option<u64>,
    pub limit_dir: Option<String>,
    pub limit_file: Option<String>,
    pub usage_bytes: Option<u64>,
    pub usage_file: String,
    /// Inactive file pages the kernel reclaims before an OOM kill (`memory.stat`).
    pub reclaimable_bytes: Option<u64>,
    pub reclaimable_file: String,
    /// What the cgroup can still take before its OOM killer: the least, over the limited levels,
    /// of limit - usage + reclaimable.
    pub headroom_bytes: Option<u64>,
    /// The files the headroom is worked out from.
    pub headroom_source: String,
    pub kernel_memory_accounted: Option<bool>,
    pub kernel_memory_source: String,
}

#[derive(Serialize, Default)]
pub struct Rlimit {
    /// `None`: unlimited.
    pub soft_bytes: Option<u64>,
    pub hard_bytes: Option<u64>,
    pub source: &'static str,
    /// `CAP_IPC_LOCK` in this process's effective set (root's by default): the kernel then
    /// lets it lock past `RLIMIT_MEMLOCK`.
    pub cap_ipc_lock: Option<bool>,
    pub cap_ipc_lock_source: &'static str,
    /// Whether the limit binds this process (soft limit set, no `CAP_IPC_LOCK`).
    pub binds: Option<bool>,
    /// What this process has locked already (`VmLck`), which the limit counts.
    pub vm_lck_bytes: Option<u64>,
}

pub fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

pub fn meminfo_kb(key: &str) -> Option<u64> {
    read("/proc/meminfo")?
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|k| k * 1024)
}

/// The cgroup's usage now, as the kernel counts it.
pub fn usage(place: &Place) -> Option<u64> {
    cgroup::usage_at(&place.dir, place.version, &read)
}
