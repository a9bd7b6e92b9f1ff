//! The figures matched with the kernel's before they are observed (`pinguard_live_bytes`, a
//! report, a refusal): one read of `/proc/self/status` for both `VmLck` and `VmPin`.

use super::kernel_pinned::reconcile_pinned;
use super::locked_pages::{locked_pages, Synced};
use crate::runtime::guard::Thread;
use crate::runtime::kernel::{self, Status};

/// Brings the locked pages' view in line with `VmLck` (with `locked`: the locking family's hooks
/// on; a walk of the mappings only when they differ) and the unseen pinned bytes with `VmPin`.
/// Call on a thread inside pinguard (`Reentry`). Returns the status read and what changed, for
/// the caller to tell the budget.
pub fn reconcile_kernel(t: &Thread, locked: bool) -> (Status, Synced) {
    let status = kernel::status();
    let mut d = match (locked, status.vm_lck) {
        (true, Some(k)) => {
            let now = crate::runtime::clock::coarse_unix_ms();
            locked_pages().check_against(k, t, now, |_, _| None)
        }
        _ => Synced::default(),
    };
    let p = status.vm_pin.map(reconcile_pinned).unwrap_or_default();
    d.added += p.added;
    d.removed += p.removed;
    (status, d)
}
