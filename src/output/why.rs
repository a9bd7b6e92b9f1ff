//! Why a refused, downgraded or failed call went as it did, for its event in the report and for
//! the exit line: the API's answer and the process's room then (`runtime::room`, read in the
//! call), shaped at write time.

use crate::accounting::ledger::EventRec;
use crate::runtime::room::Room;
use pinguard_common::codes::{self, Space};
use pinguard_common::{EventKind, Why};

/// The event's `why`, where the call kept its room (refusals, downgrades, failures).
pub fn of(e: &EventRec) -> Option<Why> {
    let room = e.room?;
    Some(shaped(e.kind, e.api.name(), &room))
}

/// The room now, for the `warn` line of a call pinned over its limit.
pub fn room_line(room: &Room) -> String {
    shaped(EventKind::OverBudget, "", room).room()
}

fn shaped(kind: EventKind, api: &str, room: &Room) -> Why {
    let error = match (kind, room.code) {
        (_, Some(code)) => codes::named(api, code),
        (EventKind::Downgraded, None) => {
            "none: served unpinned instead (policy downgrade)".to_string()
        }
        _ => Space::refusal(api).to_string(),
    };
    Why {
        error,
        rlimit_memlock_bytes: room.rlimit_memlock,
        rlimit_memlock_known: room.rlimit_memlock.is_some() || room.rlimit_unlimited,
        cap_ipc_lock: room.cap_ipc_lock,
        vm_lck_bytes: room.vm_lck,
        vm_pin_bytes: room.vm_pin,
        cgroup_headroom_bytes: room.cgroup_headroom,
        budget_bytes: room.budget,
        asked_bytes: room.asked,
    }
}

/// `last refused: cudaHostAlloc of 4.00 MiB (4194304 bytes): cudaErrorMemoryAllocation (2);
/// budget ...`: the latest refused, downgraded or failed call, for the exit line.
pub fn last(events: &[EventRec]) -> Option<String> {
    let e = events.iter().rev().find(|e| e.room.is_some())?;
    let why = of(e)?;
    // Counted in whole pages: both figures, so that a budget's sum can be followed.
    let call = pinguard_common::call_line(e.api.name(), e.size, why.asked_bytes);
    Some(format!("last {}: {call}: {}", e.kind.verb(), why.line()))
}
