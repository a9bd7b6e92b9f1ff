//! What the kernel says about this process: locked and pinned pages, limits, identity.

use crate::config::System;

#[derive(Default)]
pub struct Status {
    pub vm_lck: Option<u64>,
    pub vm_pin: Option<u64>,
    pub vm_size: Option<u64>,
}

/// `VmLck`, `VmPin` and `VmSize` from `/proc/self/status`, in bytes.
pub fn status() -> Status {
    let mut s = Status::default();
    let Ok(text) = std::fs::read_to_string("/proc/self/status") else { return s };
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else { continue };
        let slot = match key {
            "VmLck" => &mut s.vm_lck,
            "VmPin" => &mut s.vm_pin,
            "VmSize" => &mut s.vm_size,
            _ => continue,
        };
        *slot = rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|kb| kb * 1024);
    }
    s
}

pub fn rlimit_memlock() -> Option<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(r.rlim_cur)
}

/// A set-user-ID or otherwise secure-mode process: the environment must not choose where it writes.
pub fn secure_mode() -> bool {
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

pub struct Host;

impl System for Host {
    fn memory_limit(&self) -> Option<u64> {
        cgroup_memory_limit().or_else(mem_total)
    }
}

fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    line["MemTotal:".len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|kb| kb * 1024)
}

/// The memory limit of this process's cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`); the
/// cgroup path is tried as seen from inside the container, then the mount's root.
fn cgroup_memory_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mut candidates = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        if ctrl.is_empty() {
            candidates.push(format!("/sys/fs/cgroup{path}/memory.max"));
            candidates.push("/sys/fs/cgroup/memory.max".to_string());
        } else if ctrl.split(',').any(|c| c == "memory") {
            candidates.push(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"));
            candidates.push("/sys/fs/cgroup/memory/memory.limit_in_bytes".to_string());
        }
    }
    candidates.iter().find_map(|p| {
        let v = std::fs::read_to_string(p).ok()?;
        // "max", or v1's "no limit" (a page-rounded i64::MAX).
        v.trim().parse::<u64>().ok().filter(|&b| b < (1 << 62))
    })
}

pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return String::new();
    }
    let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

pub fn exe() -> String {
    std::fs::read_link("/proc/self/exe").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
}

pub fn cmdline() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The parts of `[start, end)` the kernel has locked now (`lo` in the mapping's `VmFlags`).
/// Read only after a lock call failed: the kernel applies `mlock`/`munlock` mapping by mapping and
/// stops at the first hole, so a failed call may still have changed some pages.
pub fn locked_parts(start: usize, end: usize) -> Option<Vec<(usize, usize)>> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut parts = Vec::new();
    let mut cur: Option<(usize, usize)> = None;
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some((s, e)) = cur.take() {
                if flags.split_whitespace().any(|f| f == "lo") && s < end && start < e {
                    parts.push((s.max(start), e.min(end)));
                }
            }
            continue;
        }
        let Some(range) = line.split_whitespace().next() else { continue };
        if let Some((a, b)) = range.split_once('-') {
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                cur = Some((a, b));
            }
        }
    }
    Some(parts)
}
