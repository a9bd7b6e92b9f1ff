//! Pages the kernel counts as pinned (`VmPin`) that no record of pinguard's explains: an
//! `io_uring` ring's fixed buffers, a card registered through a statically linked verbs library
//! or a raw `syscall`. They have no callsite; they count against the budget all the same.

use super::live::LIVE;
use super::locked_pages::Synced;
use crate::api::Api;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// `VmPin` less what pinguard's own records pin in it, at the last reconcile.
static UNSEEN: AtomicU64 = AtomicU64::new(0);

/// The routes that move `VmPin` (`ib_umem_get`), not `VmLck`: the card's registrations.
/// `pinguard doctor --probe` shows which counter each runtime moves on a real node.
const VM_PIN_ROUTES: [Api; 4] = [
    Api::IbvRegMr,
    Api::IbvRegMrIova,
    Api::IbvRegMrIova2,
    Api::IbvRegDmabufMr,
];

/// The kernel-pinned bytes no record explains, as of the last reconcile.
pub fn kernel_pinned() -> u64 {
    UNSEEN.load(Relaxed)
}

/// Matches the unseen bytes with `VmPin` (`vm_pin`, in bytes, read with `VmLck` in one read of
/// `/proc/self/status`). Returns the change, for the caller to tell the budget.
pub fn reconcile_pinned(vm_pin: u64) -> Synced {
    // Nothing pinned in the kernel's count: no need to look at the records.
    let now = match vm_pin {
        0 => 0,
        v => v.saturating_sub(known_pinned()),
    };
    let was = UNSEEN.swap(now, Relaxed);
    Synced {
        added: now.saturating_sub(was),
        removed: was.saturating_sub(now),
    }
}

/// The most `VmPin` that pinguard's live records of the `VmPin` routes can account for. A record
/// keeps the registration's length, not its address: a range of `n` bytes pins at most the
/// pages of `n + page - 1` bytes (an unaligned start adds one), so a page per registration can
/// hide an unseen one, never the reverse (no bytes are called unseen that a record holds).
fn known_pinned() -> u64 {
    let page = crate::runtime::sys::page_size() as u64;
    let mut known = 0u64;
    for s in &LIVE {
        // Reached under other locks of pinguard's (a refusal, the locked-page view), which a
        // fork's prepare handler takes in its own order: a shard that stays busy is skipped
        // (its bytes are called unseen until the next reconcile) rather than waited for.
        let Some(map) = (0..1000).find_map(|_| {
            s.try_lock().or_else(|| {
                std::hint::spin_loop();
                None
            })
        }) else {
            continue;
        };
        known = map
            .iter()
            .filter(|(_, l)| VM_PIN_ROUTES.contains(&l.api) && !l.downgraded() && l.size > 0)
            .map(|(_, l)| (l.size + page - 1).div_ceil(page) * page)
            .fold(known, u64::saturating_add);
    }
    // A card's registration over memory another route pins too (`shared`) is charged only what
    // it added, but the kernel pins its whole range for the card.
    known.saturating_add(super::shared::span_bytes(&VM_PIN_ROUTES, page))
}

/// In a fork child: its own `mm` starts with nothing pinned.
pub(super) fn forget() {
    UNSEEN.store(0, Relaxed);
}
