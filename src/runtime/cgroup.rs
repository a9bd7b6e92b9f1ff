//! The headroom of this process's memory cgroup, read from inside pinning calls: what the cgroup
//! can still take before its OOM killer, the least over the levels with a limit of
//! limit - usage + inactive file pages. The no-allocation twin of `pinguard_common::cgroup`
//! (which `pinguard doctor` and start-up use): the hierarchy's mount is found once at start-up,
//! and each reading follows `/proc/self/cgroup` afresh in buffers on the stack, so a process moved
//! to another group, a limit changed, or one set on a parent are all seen at the next reading.

use crate::runtime::sys;
use pinguard_common::cgroup::{Place, Version};
use std::ffi::CStr;
use std::sync::OnceLock;

/// The memory hierarchy, as found at start-up.
struct Mount {
    version: Version,
    /// Where it is mounted, and which of its paths the mount shows at that point.
    mount: String,
    root: String,
    /// The group's path when the mount was found, for the report.
    path: String,
}

static MOUNT: OnceLock<Mount> = OnceLock::new();

/// Why a reading could not be used; `WHYS` in the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bad {
    /// `/proc/self/cgroup` names no memory group, or it is outside the mount this process sees.
    NoGroup = 0,
    /// No level on the path has a limit.
    NoLimit = 1,
    /// A limited level's usage or limit cannot be read.
    Unreadable = 2,
}

pub const WHYS: [&str; 3] = [
    "name no memory group this process can see",
    "hold no memory limit on the process's path",
    "cannot be read (a limited level's usage or limit)",
];

/// One reading: the headroom and the tightest limit on the path, and which level's folder leaves
/// the least headroom (device and inode; both 0 where it cannot be examined): members of a group
/// whose readings name the same folder share one floor (`budget::group`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headroom {
    pub bytes: u64,
    pub limit: u64,
    pub dev: u64,
    pub ino: u64,
}

/// Finds the memory hierarchy (allocates: start-up only). False where there is none.
pub fn init() -> bool {
    let read = |p: &str| sys::read_text(&std::ffi::CString::new(p).ok()?);
    let Ok(place) = pinguard_common::cgroup::locate(&read) else {
        return false;
    };
    let root = root_of(&place);
    MOUNT
        .set(Mount {
            version: place.version,
            mount: place.mount,
            root,
            path: place.path,
        })
        .is_ok()
        || MOUNT.get().is_some()
}

/// The group's path as found at start-up.
pub fn path() -> Option<&'static str> {
    MOUNT.get().map(|m| m.path.as_str())
}

/// The mount's root path, from where `locate` put the group: the part of the group's path that
/// the folder below the mount point does not show.
fn root_of(p: &Place) -> String {
    let below = p
        .dir
        .strip_prefix(p.mount.trim_end_matches('/'))
        .unwrap_or("");
    p.path
        .strip_suffix(below)
        .filter(|r| !r.is_empty())
        .unwrap_or("/")
        .to_string()
}

/// A path built in a buffer on the stack, NUL-terminated for `open`.
struct PathBuf {
    b: [u8; 4096],
    len: usize,
}

impl PathBuf {
    fn push(&mut self, s: &[u8]) -> bool {
        if self.len + s.len() >= self.b.len() {
            return false;
        }
        self.b[self.len..self.len + s.len()].copy_from_slice(s);
        self.len += s.len();
        true
    }

    /// The path with `file` appended, as a C string in `out`.
    fn with<'a>(&self, file: &[u8], out: &'a mut [u8; 4096]) -> Option<&'a CStr> {
        let n = self.len + 1 + file.len();
        if n + 1 > out.len() {
            return None;
        }
        out[..self.len].copy_from_slice(&self.b[..self.len]);
        out[self.len] = b'/';
        out[self.len + 1..n].copy_from_slice(file);
        out[n] = 0;
        CStr::from_bytes_with_nul(&out[..=n]).ok()
    }
}

/// A small file's figure: `Some(None)` for "max" (or v1's no-limit figure), `None` unreadable.
fn figure(path: &CStr) -> Option<Option<u64>> {
    let fd = sys::open_read(path).ok()?;
    let mut buf = [0u8; 32];
    let n = sys::read(fd, &mut buf);
    sys::close(fd);
    let text = std::str::from_utf8(&buf[..n.ok()?]).ok()?.trim();
    if text == "max" {
        return Some(None);
    }
    text.parse::<u64>()
        .ok()
        .map(|b| (b < (1 << 62)).then_some(b))
}

/// The group's path from `/proc/self/cgroup`, into `out`: the memory controller's line (v1) or
/// the unified one (v2).
fn group_path(m: &Mount, out: &mut PathBuf) -> bool {
    let mut found = false;
    let want_v1 = m.version == Version::V1;
    super::kernel::for_each_line(c"/proc/self/cgroup", |line| {
        if found {
            return;
        }
        let mut f = line.splitn(3, |&c| c == b':');
        let (_, ctrl, path) = (f.next(), f.next().unwrap_or(b""), f.next().unwrap_or(b""));
        let fits = if want_v1 {
            ctrl.split(|&c| c == b',').any(|c| c == b"memory")
        } else {
            ctrl.is_empty()
        };
        if fits {
            found = out.push(path);
        }
    });
    found
}

/// The group's folder: the mount point, then the group's path below the mount's root.
fn group_dir(m: &Mount, dir: &mut PathBuf) -> bool {
    let mut path = PathBuf {
        b: [0; 4096],
        len: 0,
    };
    if !group_path(m, &mut path) {
        return false;
    }
    let p = &path.b[..path.len];
    let root = m.root.as_bytes();
    let below = if root == b"/" {
        p
    } else if p.starts_with(root) && matches!(p.get(root.len()), None | Some(b'/')) {
        &p[root.len()..]
    } else {
        return false;
    };
    dir.push(m.mount.trim_end_matches('/').as_bytes())
        && dir.push(below.strip_suffix(b"/").unwrap_or(below))
}

/// A level's room: limit - usage + inactive file pages, with its limit; `Ok(None)` unlimited.
fn level(dir: &PathBuf, v: Version) -> Result<Option<(u64, u64)>, Bad> {
    let mut c = [0u8; 4096];
    // No limit file (a v2 root has none) is no limit at this level.
    let Some(Some(limit)) = dir.with(v.limit_file().as_bytes(), &mut c).and_then(figure) else {
        return Ok(None);
    };
    let used = dir
        .with(v.usage_file().as_bytes(), &mut c)
        .and_then(figure)
        .flatten()
        .ok_or(Bad::Unreadable)?;
    let key = v.reclaimable_key().as_bytes();
    let mut cache = 0u64;
    if let Some(stat) = dir.with(b"memory.stat", &mut c) {
        super::kernel::for_each_line(stat, |l| {
            if let Some(rest) = l.strip_prefix(key).and_then(|r| r.strip_prefix(b" ")) {
                cache = std::str::from_utf8(rest)
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0);
            }
        });
    }
    Ok(Some((
        pinguard_common::cgroup::room(limit, used, cache),
        limit,
    )))
}

/// The headroom now, from the group's folder up to the mount point.
pub fn headroom() -> Result<Headroom, Bad> {
    let m = MOUNT.get().ok_or(Bad::NoGroup)?;
    let mut dir = PathBuf {
        b: [0; 4096],
        len: 0,
    };
    if !group_dir(m, &mut dir) {
        return Err(Bad::NoGroup);
    }
    let floor = m.mount.trim_end_matches('/').len();
    let mut best: Option<Headroom> = None;
    loop {
        if let Some((room, limit)) = level(&dir, m.version)? {
            // The deepest of the levels with the least room names the floor.
            if best.is_none_or(|b| room < b.bytes) {
                let mut c = [0u8; 4096];
                let id = dir
                    .with(b".", &mut c)
                    .and_then(sys::path_id)
                    .map_or((0, 0), |f| (f.dev, f.ino));
                best = Some(Headroom {
                    bytes: room,
                    limit: best.map_or(limit, |b| b.limit.min(limit)),
                    dev: id.0,
                    ino: id.1,
                });
            } else if let Some(b) = best.as_mut() {
                b.limit = b.limit.min(limit);
            }
        }
        match dir.b[..dir.len].iter().rposition(|&c| c == b'/') {
            Some(i) if dir.len > floor && i >= floor => dir.len = i,
            _ => break,
        }
    }
    best.ok_or(Bad::NoLimit)
}
