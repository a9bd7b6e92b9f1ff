//! `pinguard metrics-prune DIR`: the node's side of removing a dead process's metrics file. A
//! writer removes the files of writers it can prove dead each time it writes (the library); a
//! folder whose last writer was killed gets no next writer, so a node agent runs this now and then.
//! The same rules (`pinguard_common::textfile`): a `.prom` file that starts with a writer's line,
//! a regular file never followed through a link, removed only when its writer is proven dead.

use pinguard_common::textfile::{self, Writer};
use pinguard_common::untrusted::{self, Links};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Removes the dead writers' files in `dir`, one line each on stdout; 0, or 2 when `dir` cannot
/// be read.
pub fn run(dir: &Path) -> i32 {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("pinguard metrics-prune: {}: {e}", dir.display());
            return 2;
        }
    };
    let own_ns = own_pidns();
    let mut finder = crate::writers::Finder::default();
    for entry in entries.flatten() {
        if !textfile::candidate_name(entry.file_name().as_encoded_bytes()) {
            continue;
        }
        let path = entry.path();
        let (w, age_ms, id) = match look(&path) {
            Ok(Some(l)) => l,
            Ok(None) => continue,
            Err(why) => {
                eprintln!(
                    "pinguard metrics-prune: {}: {why}; left alone",
                    path.display()
                );
                continue;
            }
        };
        let live = w.live.and_then(|ino| live_word(&path, ino));
        if !w.proven_dead(age_ms, own_ns, live.map(|l| l.0), ended) {
            // A running writer's file stays; one that is not its writer's is named.
            if let Some(Err(crate::writers::Mismatch::Foreign(why))) =
                std::fs::symlink_metadata(&path)
                    .ok()
                    .map(|m| finder.check(&w, &m))
            {
                eprintln!(
                    "pinguard metrics-prune: {}: {why}; left alone",
                    path.display()
                );
            }
            continue;
        }
        if remove_if_same(&path, id) {
            let ns = w.pidns.map_or("unknown".to_string(), |n| n.to_string());
            println!(
                "removed {}: its writer (pid {}, PID namespace {ns}) has ended",
                path.display(),
                w.pid
            );
        }
        if let (Some((_, id)), Some(name)) = (live, path.file_name().and_then(|n| n.to_str())) {
            remove_if_same(&path.with_file_name(textfile::live_name(name)), id);
        }
    }
    0
}

/// A file's writer, its age in milliseconds and its identity (device, inode).
type Looked = (Writer, Option<u64>, (u64, u64));

/// The writer a file names, the file's age and identity; `Ok(None)` for a file that is not a
/// writer's or is gone, `Err` for one that is not read (a link, a FIFO: never followed or waited on).
fn look(path: &Path) -> Result<Option<Looked>, String> {
    let (f, meta) = match untrusted::open(path, Links::Refuse) {
        Ok(o) => o,
        Err(r) if r.not_a_file => return Err(r.why),
        Err(_) => return Ok(None),
    };
    let mut head = Vec::with_capacity(textfile::HEAD_BYTES);
    if f.take(textfile::HEAD_BYTES as u64)
        .read_to_end(&mut head)
        .is_err()
    {
        return Ok(None);
    }
    let Some(w) = Writer::parse(&head) else {
        return Ok(None);
    };
    let age_ms = meta
        .modified()
        .ok()
        .and_then(|m| m.elapsed().ok())
        .map(|d| d.as_millis() as u64);
    Ok(Some((w, age_ms, (meta.dev(), meta.ino()))))
}

/// Removes `path` only if it still names the file `id` (device, inode): a writer may have renamed
/// a new one there since it was read.
fn remove_if_same(path: &Path, id: (u64, u64)) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == id)
        && std::fs::remove_file(path).is_ok()
}

/// The lock word of the liveness file beside metrics file `path`, if it is the file (inode `ino`)
/// the writer's line names; read, never locked.
fn live_word(path: &Path, ino: u64) -> Option<(u32, (u64, u64))> {
    let name = path.file_name()?.to_str()?;
    let (f, meta) = untrusted::open(
        &path.with_file_name(textfile::live_name(name)),
        Links::Refuse,
    )
    .ok()?;
    if meta.ino() != ino {
        return None;
    }
    let mut word = [0u8; 4];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut word, 0).ok()?;
    Some((u32::from_ne_bytes(word), (meta.dev(), meta.ino())))
}

/// This command's PID namespace, when `/proc` is that namespace's own.
fn own_pidns() -> Option<u64> {
    let me = std::fs::read_link("/proc/self").ok()?;
    if me.as_os_str().as_encoded_bytes() != std::process::id().to_string().as_bytes() {
        return None;
    }
    textfile::ns_inode(
        std::fs::read_link("/proc/self/ns/pid")
            .ok()?
            .as_os_str()
            .as_encoded_bytes(),
    )
}

fn ended(pid: u32, start: u64) -> Option<bool> {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => textfile::stat_says_ended(&stat, start),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(true),
        Err(_) => None,
    }
}
