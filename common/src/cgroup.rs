//! This process's memory cgroup, as the kernel shows it: which hierarchy holds the memory
//! controller, where the process's group is in the file system, and the figures of every level up
//! to the root the process can see. The library (for `N%` budgets) and `pinguard doctor` read it
//! through here, each with its own file reader: the library's never creates a cancellation point.

/// Reads a whole text file, `None` when it cannot.
pub type Read<'a> = &'a dyn Fn(&str) -> Option<String>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}

/// Where this process's memory cgroup is.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Place {
    pub version: Version,
    /// The group's path as `/proc/self/cgroup` names it.
    pub path: String,
    /// The group's folder in the file system.
    pub dir: String,
    /// The hierarchy's mount point: the highest level this process can read.
    pub mount: String,
}

/// One level of the path, from the process's own group up to the mount point.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Level {
    pub dir: String,
    /// `None`: no limit at this level ("max", or v1's page-rounded `i64::MAX`).
    pub limit: Option<u64>,
}

impl Version {
    pub fn limit_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        }
    }

    pub fn usage_file(self) -> &'static str {
        match self {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        }
    }

    /// The `memory.stat` key of the page cache the kernel reclaims before it OOM-kills: inactive
    /// file pages (v1 names the hierarchical figure `total_`).
    pub fn reclaimable_key(self) -> &'static str {
        match self {
            Version::V1 => "total_inactive_file",
            Version::V2 => "inactive_file",
        }
    }
}

/// The memory controller's group of this process, from `/proc/self/cgroup` and
/// `/proc/self/mountinfo`. A v1 memory hierarchy wins over v2 (on a hybrid host the memory
/// controller lives in v1 and the unified hierarchy holds no memory files).
pub fn locate(read: Read) -> Result<Place, String> {
    let groups = read("/proc/self/cgroup").ok_or("/proc/self/cgroup cannot be read")?;
    let mounts = read("/proc/self/mountinfo").ok_or("/proc/self/mountinfo cannot be read")?;
    let v1 = groups.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        ctrl.split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    });
    let v2 = groups
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string));
    let candidates = [(Version::V1, v1), (Version::V2, v2)];
    for (version, path) in candidates.into_iter().filter_map(|(v, p)| Some((v, p?))) {
        if let Some((root, mount)) = mount_of(&mounts, version) {
            let dir = dir_in(&mount, &root, &path);
            return Ok(Place {
                version,
                path,
                dir,
                mount,
            });
        }
    }
    Err("no memory cgroup hierarchy is mounted where this process can see it (/proc/self/mountinfo)".into())
}

/// The root and mount point of the hierarchy holding the memory controller.
fn mount_of(mountinfo: &str, version: Version) -> Option<(String, String)> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let pre: Vec<&str> = pre.split(' ').collect();
        let mut post = post.split(' ');
        let (fstype, _source, opts) = (post.next()?, post.next()?, post.next().unwrap_or(""));
        let fits = match version {
            Version::V2 => fstype == "cgroup2",
            Version::V1 => fstype == "cgroup" && opts.split(',').any(|o| o == "memory"),
        };
        (fits && pre.len() >= 5).then(|| (unescape(pre[3]), unescape(pre[4])))
    })
}

/// mountinfo writes a space, tab, newline and backslash in a path as octal escapes.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The group's folder: its path below the mount's root (a container's cgroup namespace, or a
/// bind mount of a subtree, shows a root other than `/`). A path outside the mounted subtree (a
/// process moved out of it) falls back to the mount point itself, the nearest level visible.
fn dir_in(mount: &str, root: &str, path: &str) -> String {
    let below = if root == "/" {
        Some(path)
    } else {
        path.strip_prefix(root)
            .filter(|r| r.is_empty() || r.starts_with('/'))
    };
    match below {
        Some(r) => format!("{}{}", mount.trim_end_matches('/'), r.trim_end_matches('/')),
        None => mount.to_string(),
    }
}

/// A figure file's value: a byte count, or `None` for "max" and v1's "no limit" (a page-rounded
/// `i64::MAX`, which reads above 2^62).
pub fn limit_value(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&b| b < (1 << 62))
}

/// Every level from the process's group up to the mount point, with its limit; levels whose limit
/// file cannot be read are skipped (a v2 root has no `memory.max`).
pub fn levels(place: &Place, read: Read) -> Vec<Level> {
    let mut out = Vec::new();
    let mut dir = place.dir.clone();
    loop {
        if let Some(text) = read(&format!("{dir}/{}", place.version.limit_file())) {
            out.push(Level {
                dir: dir.clone(),
                limit: limit_value(&text),
            });
        }
        if dir.len() <= place.mount.len() || !dir.starts_with(&place.mount) {
            break;
        }
        match dir.rfind('/') {
            Some(i) if i >= place.mount.len() => dir.truncate(i),
            _ => break,
        }
    }
    out
}

/// The tightest limit on the path, with the folder that sets it.
pub fn tightest(levels: &[Level]) -> Option<(u64, &str)> {
    levels
        .iter()
        .filter_map(|l| Some((l.limit?, l.dir.as_str())))
        .min_by_key(|&(b, _)| b)
}

/// The memory limit of this process's cgroup: the tightest on its path.
pub fn memory_limit(read: Read) -> Option<u64> {
    let place = locate(read).ok()?;
    tightest(&levels(&place, read)).map(|(b, _)| b)
}

/// A level's usage (`memory.usage_in_bytes`, `memory.current`).
pub fn usage_at(dir: &str, version: Version, read: Read) -> Option<u64> {
    read(&format!("{dir}/{}", version.usage_file()))?
        .trim()
        .parse()
        .ok()
}

/// A level's page cache that the kernel reclaims before its OOM killer.
pub fn reclaimable_at(dir: &str, version: Version, read: Read) -> Option<u64> {
    stat_value(
        &read(&format!("{dir}/memory.stat"))?,
        version.reclaimable_key(),
    )
}

/// One level's room before its OOM killer: limit - usage + the page cache the kernel reclaims
/// first. The one formula both the library's floor and the CLI's readers use.
pub const fn room(limit: u64, used: u64, reclaimable: u64) -> u64 {
    limit.saturating_add(reclaimable).saturating_sub(used)
}

/// What the process's cgroup can still take before an OOM kill: the least, over the levels with
/// a limit, of limit - usage + reclaimable page cache (a parent's limit counts its other children
/// too). `None`: no limit on the path, or a limited level whose usage cannot be read.
pub fn headroom(version: Version, levels: &[Level], read: Read) -> Option<u64> {
    let mut least: Option<u64> = None;
    for l in levels {
        let Some(limit) = l.limit else { continue };
        let used = usage_at(&l.dir, version, read)?;
        let room = room(
            limit,
            used,
            reclaimable_at(&l.dir, version, read).unwrap_or(0),
        );
        least = Some(least.map_or(room, |m| m.min(room)));
    }
    least
}

/// A key's value in a `memory.stat` file.
pub fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn reader(files: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = files
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |p: &str| m.get(p).cloned()
    }

    const HYBRID: &str =
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
                          41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

    #[test]
    fn a_hybrid_host_uses_the_v1_memory_hierarchy() {
        let r = reader(&[
            ("/proc/self/cgroup", "4:memory:/a/b\n0::/\n"),
            ("/proc/self/mountinfo", HYBRID),
        ]);
        let p = locate(&r).unwrap();
        assert_eq!(
            (p.version, p.dir.as_str(), p.mount.as_str()),
            (
                Version::V1,
                "/sys/fs/cgroup/memory/a/b",
                "/sys/fs/cgroup/memory"
            )
        );
    }

    #[test]
    fn a_container_namespace_root_maps_to_the_mount_point() {
        // Docker without a cgroup namespace: the path and the mount's root are the container's.
        let mi = "50 40 0:30 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
        let r = reader(&[
            ("/proc/self/cgroup", "4:memory:/docker/abc\n"),
            ("/proc/self/mountinfo", mi),
        ]);
        assert_eq!(locate(&r).unwrap().dir, "/sys/fs/cgroup/memory");
        // v2 with a cgroup namespace: "0::/" at the namespace's root.
        let mi = "60 40 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let r = reader(&[
            ("/proc/self/cgroup", "0::/\n"),
            ("/proc/self/mountinfo", mi),
        ]);
        let p = locate(&r).unwrap();
        assert_eq!((p.version, p.dir.as_str()), (Version::V2, "/sys/fs/cgroup"));
    }

    #[test]
    fn the_tightest_limit_on_the_path_wins() {
        let mi = "60 40 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let r = reader(&[
            ("/proc/self/cgroup", "0::/pod/ctr\n"),
            ("/proc/self/mountinfo", mi),
            ("/sys/fs/cgroup/pod/ctr/memory.max", "max\n"),
            ("/sys/fs/cgroup/pod/memory.max", "1073741824\n"),
        ]);
        let p = locate(&r).unwrap();
        let lv = levels(&p, &r);
        assert_eq!(lv.len(), 2);
        assert_eq!(tightest(&lv), Some((1 << 30, "/sys/fs/cgroup/pod")));
        assert_eq!(memory_limit(&r), Some(1 << 30));
        assert_eq!(
            headroom(Version::V2, &lv, &r),
            None,
            "the limited level's usage is unknown"
        );
        let r = reader(&[
            ("/proc/self/cgroup", "0::/pod/ctr\n"),
            ("/proc/self/mountinfo", mi),
            ("/sys/fs/cgroup/pod/ctr/memory.max", "536870912\n"),
            ("/sys/fs/cgroup/pod/ctr/memory.current", "104857600\n"),
            ("/sys/fs/cgroup/pod/memory.max", "1073741824\n"),
            ("/sys/fs/cgroup/pod/memory.current", "943718400\n"),
            ("/sys/fs/cgroup/pod/memory.stat", "inactive_file 52428800\n"),
        ]);
        let lv = levels(&locate(&r).unwrap(), &r);
        // The pod's 1 GiB less its 900 MiB used plus 50 MiB of cache: tighter than the container's.
        assert_eq!(headroom(Version::V2, &lv, &r), Some(174 << 20));
        assert_eq!(limit_value("9223372036854771712"), None);
    }

    #[test]
    fn escapes_and_stat_keys() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(
            stat_value(
                "cache 5\ninactive_file 4096\ntotal_inactive_file 8192\n",
                "inactive_file"
            ),
            Some(4096)
        );
        assert_eq!(
            stat_value("total_inactive_file 8192\n", "inactive_file"),
            None
        );
        let r = reader(&[
            ("/proc/self/cgroup", "0::/\n"),
            ("/proc/self/mountinfo", "1 2 3:4 / / rw - ext4 /dev/x rw\n"),
        ]);
        assert!(locate(&r).is_err());
    }
}
