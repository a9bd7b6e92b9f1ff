//! The metrics files pinguard writes for node_exporter's textfile collector: the writer's line
//! each one starts with, its liveness file, and when that writer is proven dead, so that its file may be removed (by
//! the next writer in the folder, in the library, or by `pinguard metrics-prune` on the node).
//! `docs/internals.md`, "Metrics".

/// The first line of every metrics file pinguard writes, before the writer's identity. The text
/// format ignores a `#` line that is neither `# HELP` nor `# TYPE`.
pub const HEADER: &str = "# pinguard-writer ";
/// A writer in another PID namespace is dead when its file is older than two of its intervals
/// and this: room for a write held up by a report being written or a loaded machine.
pub const SLACK_MS: u64 = 5_000;
/// The longest interval a file's line is believed for (a file says what it likes).
pub const MAX_INTERVAL_MS: u64 = 3_600_000;
/// What is read of a file to find its writer's line.
pub const HEAD_BYTES: usize = 256;

/// The kernel's mark on a robust futex whose owner died (`linux/futex.h`), and the owner's thread
/// id in the rest of the word.
pub const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
pub const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// Who wrote a metrics file: enough for another process to prove it dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writer {
    pub pid: u32,
    /// Start time, clock ticks after boot (`/proc/PID/stat`): a reused pid is another process.
    pub start: u64,
    /// The inode of the writer's PID namespace; `None` where it could not be read, which makes
    /// every reader go by the file's age.
    pub pidns: Option<u64>,
    pub interval_ms: u64,
    /// The inode of the writer's liveness file (`live_name`): a process-shared robust mutex its
    /// metrics thread holds for its whole life, which the kernel marks when that thread ends,
    /// however the process ends, in whatever PID namespace; `None` where it has none.
    pub live: Option<u64>,
}

/// The liveness file beside metrics file `name`: hidden, so neither node_exporter nor a pass over
/// the folder takes it for metrics.
pub fn live_name(name: &str) -> String {
    format!(".{name}.live")
}

/// What a liveness file's lock word says: `Some(true)` its owner died (the kernel's mark),
/// `Some(false)` an owner holds it; `None` unlocked (nothing to conclude).
pub fn lock_word_says(word: u32) -> Option<bool> {
    if word & FUTEX_OWNER_DIED != 0 {
        Some(true)
    } else if word & FUTEX_TID_MASK != 0 {
        Some(false)
    } else {
        None
    }
}

impl Writer {
    pub fn line(&self) -> String {
        let ns = self.pidns.map_or("-".to_string(), |n| n.to_string());
        let live = self.live.map_or(String::new(), |i| format!(" live={i}"));
        format!(
            "{HEADER}pid={} start={} pidns={ns} interval_ms={}{live}\n",
            self.pid, self.start, self.interval_ms
        )
    }

    /// The writer a file's first line names; `None` for any file that does not start with it.
    pub fn parse(head: &[u8]) -> Option<Writer> {
        let line = head.split(|&b| b == b'\n').next()?;
        let rest = std::str::from_utf8(line).ok()?.strip_prefix(HEADER)?;
        let mut w = Writer {
            pid: 0,
            start: 0,
            pidns: None,
            interval_ms: 0,
            live: None,
        };
        let mut seen = 0;
        for kv in rest.split(' ') {
            let (k, v) = kv.split_once('=')?;
            match k {
                "pid" => w.pid = v.parse().ok()?,
                "start" => w.start = v.parse().ok()?,
                "pidns" => {
                    w.pidns = if v == "-" {
                        None
                    } else {
                        Some(v.parse().ok()?)
                    }
                }
                "interval_ms" => w.interval_ms = v.parse().ok()?,
                "live" => {
                    w.live = Some(v.parse().ok()?);
                    continue;
                }
                _ => continue,
            }
            seen += 1;
        }
        (seen == 4 && w.pid != 0).then_some(w)
    }

    /// Whether this writer is proven to have ended, as a process of PID namespace `own_ns` sees
    /// it: by its liveness file's lock word (`live_word`, read from the file its line names), the
    /// kernel's mark; else in the same namespace, by `ended` (`/proc`: `Some(true)` gone, a zombie
    /// or another start time; `None` when it does not say); in another (or where a namespace is
    /// unknown), by the file's age (`age_ms`). A lock still held proves nothing either way: where
    /// the kernel keeps no robust list (a sandbox that denies it, qemu-user) it is never marked.
    pub fn proven_dead(
        &self,
        age_ms: Option<u64>,
        own_ns: Option<u64>,
        live_word: Option<u32>,
        ended: impl FnOnce(u32, u64) -> Option<bool>,
    ) -> bool {
        if live_word.and_then(lock_word_says) == Some(true) {
            return true;
        }
        if self.pidns.is_some() && self.pidns == own_ns {
            return ended(self.pid, self.start) == Some(true);
        }
        let interval = self.interval_ms.clamp(1, MAX_INTERVAL_MS);
        age_ms.is_some_and(|age| age > 2 * interval + SLACK_MS)
    }
}

/// Whether a `/proc/PID/stat` text says its process ended, for a writer that started at `start`:
/// a zombie (or dead) process, or another process now holding the pid.
pub fn stat_says_ended(stat: &str, start: u64) -> Option<bool> {
    let state = stat[stat.rfind(')')? + 1..]
        .split_ascii_whitespace()
        .next()?;
    let ticks = crate::state::stat_start_ticks(stat)?;
    Some(ticks != start || state == "Z" || state == "X")
}

/// `pid:[4026531836]` (a `/proc/PID/ns/pid` link) as the inode number.
pub fn ns_inode(link: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(link).ok()?;
    s.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// Whether a directory entry's name is one a writer's file may have: `*.prom` (what node_exporter
/// reads), not hidden (a writer's temporary files start with `.`).
pub fn candidate_name(name: &[u8]) -> bool {
    !name.starts_with(b".") && name.ends_with(b".prom")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writers_line_reads_back_and_nothing_else_is_one() {
        let w = Writer {
            pid: 42,
            start: 123456,
            pidns: Some(4026531836),
            interval_ms: 15000,
            live: Some(77),
        };
        let line = w.line();
        assert_eq!(
            line,
            "# pinguard-writer pid=42 start=123456 pidns=4026531836 interval_ms=15000 live=77\n"
        );
        assert_eq!(
            Writer::parse(format!("{line}# HELP x y\n").as_bytes()),
            Some(w)
        );
        let unknown = Writer {
            pidns: None,
            live: None,
            ..w
        };
        assert_eq!(Writer::parse(unknown.line().as_bytes()), Some(unknown));
        assert_eq!(live_name("m.7.prom"), ".m.7.prom.live");
        for other in [
            "# HELP pinguard_pinned_bytes x\n",
            "node_cpu 1\n",
            "# pinguard-writer pid=42 start=1\n",
            "# pinguard-writer pid=x start=1 pidns=- interval_ms=1\n",
            " # pinguard-writer pid=42 start=1 pidns=- interval_ms=1\n",
            "",
        ] {
            assert_eq!(Writer::parse(other.as_bytes()), None, "{other:?}");
        }
        assert_eq!(ns_inode(b"pid:[4026531836]"), Some(4026531836));
        assert_eq!(ns_inode(b"net:[4026531836]"), None);
        assert!(
            candidate_name(b"pinguard.1.7.prom")
                && !candidate_name(b".pinguard.7.prom.7.0.tmp")
                && !candidate_name(b"x.prom.bak")
        );
    }

    #[test]
    fn another_namespaces_writer_is_dead_only_when_its_file_is_stale() {
        let other = Writer {
            pid: 1,
            start: 99,
            pidns: Some(2),
            interval_ms: 1000,
            live: None,
        };
        let never = |_, _| panic!("another namespace's pid is never looked up");
        assert!(!other.proven_dead(Some(2000 + SLACK_MS), Some(1), None, never));
        assert!(other.proven_dead(Some(2001 + SLACK_MS), Some(1), None, never));
        assert!(!other.proven_dead(None, Some(1), None, never));
        let unknown = Writer {
            pidns: None,
            ..other
        };
        assert!(!unknown.proven_dead(Some(1000), None, None, never));
        assert!(unknown.proven_dead(Some(8000), None, None, never));
        // In the same namespace, only `/proc` decides, however old the file.
        let here = Writer {
            pidns: Some(1),
            ..other
        };
        assert!(!here.proven_dead(Some(u64::MAX / 4), Some(1), None, |_, _| Some(false)));
        assert!(!here.proven_dead(Some(u64::MAX / 4), Some(1), None, |_, _| None));
        assert!(here.proven_dead(Some(0), Some(1), None, |pid, start| Some(
            (pid, start) == (1, 99)
        )));
        // The kernel's mark on the lock decides at once, in any namespace; a held or free lock
        // leaves it to the other rules.
        assert!(other.proven_dead(Some(0), Some(1), Some(FUTEX_OWNER_DIED | 7), never));
        assert!(!other.proven_dead(Some(0), Some(1), Some(7), never));
        assert!(
            other.proven_dead(Some(2001 + SLACK_MS), Some(1), Some(7), never),
            "a mark the kernel never made"
        );
        assert!(!other.proven_dead(Some(0), Some(1), Some(0), never));
        assert_eq!(
            (
                lock_word_says(0),
                lock_word_says(12),
                lock_word_says(FUTEX_OWNER_DIED)
            ),
            (None, Some(false), Some(true))
        );
    }

    #[test]
    fn a_stat_line_tells_a_reused_pid_and_a_zombie() {
        let stat = |state: &str, start: u64| {
            format!("7 (a (b) c) {state} 1 7 7 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {start} 1 1 18446744073709551615")
        };
        assert_eq!(stat_says_ended(&stat("S", 500), 500), Some(false));
        assert_eq!(stat_says_ended(&stat("S", 501), 500), Some(true));
        assert_eq!(stat_says_ended(&stat("Z", 500), 500), Some(true));
        assert_eq!(stat_says_ended("garbage", 500), None);
    }
}
