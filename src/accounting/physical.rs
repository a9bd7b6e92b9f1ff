//! Physical host allocations of the virtual-memory APIs (`cuMemCreate`, `aclrtMallocPhysical`):
//! memory known by an opaque handle, mapped at addresses the program reserved, and freed only
//! when its last reference is released (`cuMemRelease`, `aclrtFreePhysical`; a retain takes one
//! more) **and** its last mapping unmapped (`cuMemUnmap`, `aclrtUnmapMem`), in whichever order.
//! Each such allocation is one live record from its creation until both have happened.
//!
//! Only host-located allocations are here (device memory is not pinned host memory); the caller
//! decides which. A handle pinguard never saw (a device allocation, one made before pinguard
//! started) is ignored by every call.

use crate::accounting::ledger::Live;
use crate::runtime::lock::{self, Mutex};
use std::collections::{BTreeMap, HashMap};

struct Phys {
    live: Live,
    /// References: one from the creation, one per retain, less one per release.
    refs: u32,
    /// Mappings of it that are in place.
    maps: u32,
}

#[derive(Default)]
struct Table {
    by_handle: HashMap<u64, Phys>,
    /// Mapping start -> (end, handle).
    mappings: BTreeMap<usize, (usize, u64)>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Table) -> T) -> T {
    f(TABLE.lock().get_or_insert_with(Table::default))
}

/// A new host allocation under `handle`, with one reference and no mapping. A record already
/// under that handle is one whose end pinguard missed (the runtime reuses a freed handle): it is
/// returned, for the caller to take its figures out.
pub fn created(handle: u64, live: Live) -> Option<Live> {
    with(|t| {
        t.by_handle
            .insert(
                handle,
                Phys {
                    live,
                    refs: 1,
                    maps: 0,
                },
            )
            .map(|p| p.live)
    })
}

/// Whether `handle` is a host allocation pinguard counts (for a failed mapping's event).
pub fn known(handle: u64) -> bool {
    with(|t| t.by_handle.contains_key(&handle))
}

/// One more reference (a retain of a mapped address, which names the allocation's handle).
pub fn retained(handle: u64) {
    with(|t| {
        if let Some(p) = t.by_handle.get_mut(&handle) {
            p.refs = p.refs.saturating_add(1);
        }
    })
}

/// One reference less; the record when that was the last reference and nothing maps it.
pub fn released(handle: u64) -> Option<Live> {
    with(|t| {
        let p = t.by_handle.get_mut(&handle)?;
        p.refs = p.refs.saturating_sub(1);
        if p.refs == 0 && p.maps == 0 {
            return t.by_handle.remove(&handle).map(|p| p.live);
        }
        None
    })
}

/// `handle` mapped at `[at, at + len)`.
pub fn mapped(at: usize, len: usize, handle: u64) {
    with(|t| {
        if let Some(p) = t.by_handle.get_mut(&handle) {
            p.maps = p.maps.saturating_add(1);
            t.mappings.insert(at, (at.saturating_add(len), handle));
        }
    })
}

/// `[at, at + len)` unmapped: every mapping that starts inside it goes (the runtimes unmap
/// whole mappings). Returns the records of allocations that this left unreferenced and unmapped.
pub fn unmapped(at: usize, len: usize) -> Vec<Live> {
    with(|t| {
        let end = at.saturating_add(len);
        let starts: Vec<usize> = t.mappings.range(at..end).map(|(&s, _)| s).collect();
        let mut gone = Vec::new();
        for s in starts {
            let Some((_, handle)) = t.mappings.remove(&s) else {
                continue;
            };
            if let Some(p) = t.by_handle.get_mut(&handle) {
                p.maps = p.maps.saturating_sub(1);
                if p.refs == 0 && p.maps == 0 {
                    gone.extend(t.by_handle.remove(&handle).map(|p| p.live));
                }
            }
        }
        gone
    })
}

/// Every live physical allocation: (handle, record).
pub fn records() -> Vec<(u64, Live)> {
    with(|t| t.by_handle.iter().map(|(&h, p)| (h, p.live)).collect())
}

/// Fork handlers: held across `fork`, like the ledger's own locks.
pub fn hold() {
    lock::hold(&TABLE);
}

/// # Safety
/// Only in the fork handlers, after `hold`. In the child the table starts empty: the runtimes'
/// physical memory is not the child's.
pub unsafe fn let_go(child: bool) {
    if child {
        // SAFETY: `hold` took the lock on this thread and the child has no other thread.
        unsafe { *TABLE.data_ptr() = None };
    }
    // SAFETY: `hold` took the lock on this thread (the caller's contract).
    unsafe { lock::let_go(&TABLE, child) };
}
