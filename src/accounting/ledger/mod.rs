//! What is pinned right now and what happened so far, one file per role:
//!
//! - `live`: the live records (allocations, registrations, locked ranges) and their tables;
//! - `blocks`: each thread's block of event counters;
//! - `levels`: live bytes and counts and their peaks, and the moves in and out of them;
//! - `count`: the event counters' updates;
//! - `first_count`: whether anything was counted yet;
//! - `over`: which limit a call went over;
//! - `locked_pages`: the locking family's view of the locked pages, kept in line with the kernel;
//! - `kernel_pinned`: the kernel's pinned pages (`VmPin`) no record explains;
//! - `reconcile`: both matched with the kernel's counts, from one read;
//! - `shared`: ranges pinned by more than one route, counted once;
//! - `figures`: the process's and each entry point's figures, read out;
//! - `events`: the last events and the timeline;
//! - `fork`: the ledger's locks across `fork`, and the child's empty ledger.
//!
//! Hooks never touch this directly; `track` turns each hooked call into these records.

mod blocks;
mod count;
mod events;
mod figures;
mod first_count;
mod fork;
mod kernel_pinned;
mod levels;
mod live;
mod locked_pages;
mod over;
mod reconcile;
mod shared;

pub use count::{
    count_alloc, count_failed, count_failed_at, count_outcome, count_release,
    count_unknown_release, count_untracked, downgraded_live_delta, Outcome,
};
pub use events::{events, failed_again, timeline, timeline_now, EventRec, Failure, Point};
pub use figures::{apis, live_bytes, restart_window, totals, window_peak};
pub use first_count::{on_first_count, touched};
pub use fork::{hold, let_go};
pub use kernel_pinned::kernel_pinned;
pub use levels::{alloc_live, live_delta, live_release, use_levels};
pub use live::{insert, insert_over, live_at, live_records, take, take_over, Backing, Live};
/// Only the hooks call it, and the builds without hooks (unit tests, fuzzing) have none.
#[cfg(not(any(test, feature = "fuzzing")))]
pub use locked_pages::note_runtime_lock;
pub use locked_pages::{locked_any, locked_pages, LockCall, LockedPagesGuard, Synced};
pub use over::Over;
pub use reconcile::reconcile_kernel;
pub use shared::Member;
pub mod overlap {
    //! Ranges pinned by more than one route (`shared`).
    pub use super::shared::{
        any, join, leave, pinned_within, rejoin, table_spans, take_overlapped,
    };
}
