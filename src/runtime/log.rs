//! pinguard's diagnostics: `tracing` events, filtered by `PINGUARD_LOG`, one line each on stderr.
//!
//! A small subscriber of our own rather than `tracing-subscriber`'s `fmt`: that one keeps
//! destructible thread-locals, which are gone when the exit report is written (docs/field-notes.md).

use crate::runtime::guard::{errno, set_errno};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::Targets;

struct Stderr {
    filter: Targets,
}

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for Stderr {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        self.filter.would_enable(m.target(), m.level())
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, e: &Event<'_>) {
        let level = match *e.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            Level::DEBUG => "debug",
            Level::TRACE => "trace",
        };
        let mut line = Line(format!("pinguard[{}]: {level}: ", std::process::id()));
        e.record(&mut line);
        line.0.push('\n');
        write_stderr(&line.0);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

pub fn init(filter: &str) {
    let filter: Targets = filter
        .parse()
        .unwrap_or_else(|_| Targets::new().with_default(Level::WARN));
    let _ = tracing::subscriber::set_global_default(Stderr { filter });
    // std's own hook prints a panic on fd 2 whatever fd 2 now is: pinguard's go the same way as
    // its other lines (a panic inside pinguard is caught and degrades what it records).
    std::panic::set_hook(Box::new(|info| {
        write_stderr(&format!(
            "pinguard[{}]: error: internal: {info}\n",
            std::process::id()
        ))
    }));
}

/// fd 2 as the process started with it: its device and inode, packed into one word each so that
/// readers need no lock (`OPEN`: recorded, fd 2 open; `CLOSED`: recorded, fd 2 was closed).
static STDERR_DEV: AtomicU64 = AtomicU64::new(0);
static STDERR_INO: AtomicU64 = AtomicU64::new(0);
static STDERR: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const OPEN: u8 = 1;
const CLOSED: u8 = 2;

/// Records which stream fd 2 is, once (the first call wins): from the library's constructor, so
/// that a daemon that later closes fd 2 and opens its own file there is told apart. One `fstat`.
pub fn mark_stderr() {
    if STDERR.load(Ordering::Acquire) != UNKNOWN {
        return;
    }
    let e = errno();
    let id = crate::runtime::sys::file_id(2);
    set_errno(e);
    if let Some(id) = id {
        STDERR_DEV.store(id.dev, Ordering::Relaxed);
        STDERR_INO.store(id.ino, Ordering::Relaxed);
    }
    let state = if id.is_some() { OPEN } else { CLOSED };
    let _ = STDERR.compare_exchange(UNKNOWN, state, Ordering::AcqRel, Ordering::Relaxed);
}

/// What fd 2 was at the program's start, as the first stage saw it (`front`): this copy, loaded
/// later, might find a file the program opened there since.
pub fn mark_stderr_as(dev: u64, ino: u64) {
    STDERR_DEV.store(dev, Ordering::Relaxed);
    STDERR_INO.store(ino, Ordering::Relaxed);
    let _ = STDERR.compare_exchange(UNKNOWN, OPEN, Ordering::AcqRel, Ordering::Relaxed);
}

/// Whether fd 2 is still the stream it was at start: a program's data file reopened there gets
/// nothing of pinguard's. One `fstat` per line written.
fn stderr_is_ours() -> bool {
    mark_stderr();
    if STDERR.load(Ordering::Acquire) != OPEN {
        return false;
    }
    let e = errno();
    let id = crate::runtime::sys::file_id(2);
    set_errno(e);
    id.is_some_and(|id| {
        id.dev == STDERR_DEV.load(Ordering::Relaxed) && id.ino == STDERR_INO.load(Ordering::Relaxed)
    })
}

/// Writes straight to fd 2, with a raw system call: Rust's `Stderr` takes a reentrant lock with
/// thread-local state, and libc's `write` is a cancellation point. Only while fd 2 is the stream
/// it was at start (`stderr_is_ours`); otherwise the line is dropped.
pub fn write_stderr(s: &str) {
    if stderr_is_ours() {
        let e = errno();
        let _ = crate::runtime::sys::write_all(2, s.as_bytes());
        set_errno(e);
    }
}
