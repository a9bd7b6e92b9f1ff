//! pinguard's diagnostics: `tracing` events, filtered by `PINGUARD_LOG`, one line each on stderr.
//!
//! A small subscriber of our own rather than `tracing-subscriber`'s `fmt`: that one keeps
//! destructible thread-locals, which are gone when the exit report is written (docs/field-notes.md).

use std::fmt::Write as _;
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
}

/// Writes straight to fd 2, with a raw system call: Rust's `Stderr` takes a reentrant lock with
/// thread-local state, and libc's `write` is a cancellation point.
pub fn write_stderr(s: &str) {
    let _ = crate::runtime::sys::write_all(2, s.as_bytes());
}
