//! Metrics files in a folder others write to, as `top --metrics` and `metrics-prune` read them:
//! opened as `pinguard_common::untrusted` opens files, and believed only when the process their
//! writer's line names runs as the user who owns the file (`docs/internals.md`, "Metrics").

use pinguard_common::textfile::{self, Writer};
use pinguard_common::untrusted::{self, Links};
use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A metrics file read: its text, its writer's line, and the file's metadata.
pub struct File {
    pub text: String,
    pub writer: Option<Writer>,
    pub meta: Metadata,
}

/// Reads a metrics file (at most `METRICS_MAX` bytes, never through a link); `Ok(None)` when it
/// is gone (its writer renamed it away or ended), `Err` with the line's tail when it is not read.
pub fn read(path: &Path) -> Result<Option<File>, String> {
    match untrusted::read(path, Links::Refuse, untrusted::METRICS_MAX, "metrics file") {
        Ok((bytes, meta)) => Ok(Some(File {
            writer: Writer::parse(&bytes[..bytes.len().min(textfile::HEAD_BYTES)]),
            text: String::from_utf8_lossy(&bytes).into_owned(),
            meta,
        })),
        Err(r) if r.why == "no such file or directory" => Ok(None),
        Err(r) => Err(r.why),
    }
}

/// A running process as `/proc` shows it: its start time and its user ids (real, effective,
/// saved, file system).
#[derive(Clone, Copy)]
struct Proc {
    start: u64,
    uids: [u32; 4],
}

fn proc_at(dir: &str) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    if stat_state_ended(&stat) {
        return None;
    }
    let start = pinguard_common::state::stat_start_ticks(&stat)?;
    let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
    let uids = field(&status, "Uid:")?;
    (uids.len() == 4).then(|| Proc {
        start,
        uids: [
            uids[0] as u32,
            uids[1] as u32,
            uids[2] as u32,
            uids[3] as u32,
        ],
    })
}

/// A zombie (or dead) process has ended, whatever its start time.
fn stat_state_ended(stat: &str) -> bool {
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_ascii_whitespace().next())
        .is_some_and(|s| s == "Z" || s == "X")
}

/// The numbers of a `/proc/PID/status` line (`Uid:`, `NSpid:`).
fn field(status: &str, key: &str) -> Option<Vec<u64>> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .split_ascii_whitespace()
        .map(|n| n.parse().ok())
        .collect()
}

fn pidns_of(dir: &str) -> Option<u64> {
    let link = std::fs::read_link(format!("{dir}/ns/pid")).ok()?;
    textfile::ns_inode(link.as_os_str().as_encoded_bytes())
}

/// Finds writers' processes: in this command's PID namespace by their pid, in another by a walk
/// of `/proc` (made once, and only when a file names another namespace) for the process of that
/// namespace whose innermost pid (`NSpid`) is the writer's.
#[derive(Default)]
pub struct Finder {
    own_ns: Option<Option<u64>>,
    others: Option<HashMap<(u64, u32), String>>,
}

impl Finder {
    fn own_ns(&mut self) -> Option<u64> {
        *self.own_ns.get_or_insert_with(|| {
            let me = std::fs::read_link("/proc/self").ok()?;
            if me.as_os_str().as_encoded_bytes() != std::process::id().to_string().as_bytes() {
                return None; // a /proc of another namespace
            }
            pidns_of("/proc/self")
        })
    }

    fn others(&mut self) -> &HashMap<(u64, u32), String> {
        self.others.get_or_insert_with(|| {
            let mut m = HashMap::new();
            for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let name = e.file_name();
                let Some(n) = name
                    .to_str()
                    .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                else {
                    continue;
                };
                let dir = format!("/proc/{n}");
                let (Some(ns), Some(nspid)) = (
                    pidns_of(&dir),
                    std::fs::read_to_string(format!("{dir}/status"))
                        .ok()
                        .and_then(|s| field(&s, "NSpid:")),
                ) else {
                    continue;
                };
                if let Some(&inner) = nspid.last() {
                    m.insert((ns, inner as u32), dir);
                }
            }
            m
        })
    }

    /// Whether the file's owner is a user its writer runs as: `Ok(())`, or why it is not
    /// believed.
    pub fn check(&mut self, w: &Writer, meta: &Metadata) -> Result<(), Mismatch> {
        let here = self.own_ns();
        let dir = match w.pidns {
            Some(ns) if Some(ns) == here => Some(format!("/proc/{}", w.pid)),
            Some(ns) => self.others().get(&(ns, w.pid)).cloned(),
            None => None,
        };
        let ns = w.pidns.map_or("unknown".to_string(), |n| n.to_string());
        let Some(p) = dir
            .as_deref()
            .and_then(proc_at)
            .filter(|p| p.start == w.start)
        else {
            return Err(Mismatch::NotRunning(format!(
                "its writer (pid {}, PID namespace {ns}) is not a process running here",
                w.pid
            )));
        };
        if p.uids.contains(&meta.uid()) {
            return Ok(());
        }
        Err(Mismatch::Foreign(format!(
            "owned by user {}, but its writer (pid {}, PID namespace {ns}) runs as user {}: not its writer's",
            meta.uid(),
            w.pid,
            p.uids[1]
        )))
    }
}

/// Why a metrics file's writer's line is not believed.
pub enum Mismatch {
    /// The writer does not run where this command can see it (ended, or in a PID namespace this
    /// `/proc` does not show): its user cannot be read.
    NotRunning(String),
    /// It runs, as another user than the file's owner: someone else wrote the file.
    Foreign(String),
}
