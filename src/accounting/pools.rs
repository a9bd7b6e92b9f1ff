//! Host memory pools of CUDA's stream-ordered allocator (`cuMemPoolCreate`, `cudaMemPoolCreate`):
//! a pool reserves memory as its allocations need it and keeps what they free until it is
//! trimmed or destroyed, so its pinned figure is its reserved memory
//! (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`), not the sum of its allocations. Each host pool is one
//! live record, under its handle, whose size is the reserved memory as last read from the
//! runtime; each allocation from it is remembered, so that its free is known to be the pool's.
//!
//! Only host pools are here: a device pool's memory is not pinned host memory. The runtime is
//! read by the caller (`track`); this table only keeps the figures.

use crate::accounting::ledger::Live;
use crate::runtime::lock::{self, Mutex};
use std::collections::HashMap;

struct Pool {
    live: Live,
    /// Destroyed by the program: it goes once its last allocation is freed.
    destroyed: bool,
    /// Allocations from it not freed yet.
    allocations: u64,
}

#[derive(Default)]
struct Table {
    pools: HashMap<u64, Pool>,
    /// Allocation address -> its pool.
    allocations: HashMap<usize, u64>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Table) -> T) -> T {
    f(TABLE.lock().get_or_insert_with(Table::default))
}

/// A host pool under `handle`, reserving nothing yet (`live.size` 0); a record already under
/// that handle (a pool whose end pinguard missed) is returned, for the caller to take out.
pub fn created(handle: u64, live: Live) -> Option<Live> {
    with(|t| {
        t.pools
            .insert(
                handle,
                Pool {
                    live,
                    destroyed: false,
                    allocations: 0,
                },
            )
            .map(|p| p.live)
    })
}

/// The pool's record, if it is a host pool pinguard counts.
pub fn get(handle: u64) -> Option<Live> {
    with(|t| t.pools.get(&handle).map(|p| p.live))
}

/// The pool's reserved memory is now `reserved`: its record before the change (for the caller to
/// move the figures by the difference). A destroyed pool that reserves nothing and holds no
/// allocation leaves the table.
pub fn reserved(handle: u64, reserved: u64) -> Option<Live> {
    with(|t| {
        let p = t.pools.get_mut(&handle)?;
        let before = p.live;
        p.live.size = reserved;
        if p.destroyed && reserved == 0 && p.allocations == 0 {
            t.pools.remove(&handle);
        }
        Some(before)
    })
}

/// An allocation at `addr` from the pool.
pub fn allocated(handle: u64, addr: usize) {
    with(|t| {
        if let Some(p) = t.pools.get_mut(&handle) {
            p.allocations += 1;
            t.allocations.insert(addr, handle);
        }
    })
}

/// The allocation at `addr` freed: its pool, if it is one pinguard counts.
pub fn freed(addr: usize) -> Option<u64> {
    with(|t| {
        let handle = t.allocations.remove(&addr)?;
        if let Some(p) = t.pools.get_mut(&handle) {
            p.allocations = p.allocations.saturating_sub(1);
        }
        Some(handle)
    })
}

/// Whether the pool was destroyed and no allocation from it is left (the runtime then freed its
/// memory, and can no longer be asked about it).
pub fn destroyed_and_empty(handle: u64) -> bool {
    with(|t| {
        t.pools
            .get(&handle)
            .is_some_and(|p| p.destroyed && p.allocations == 0)
    })
}

/// The pool destroyed by the program; whether allocations from it are still out (its memory then
/// stays reserved until they are freed).
pub fn destroyed(handle: u64) -> bool {
    with(|t| match t.pools.get_mut(&handle) {
        Some(p) => {
            p.destroyed = true;
            p.allocations > 0
        }
        None => false,
    })
}

/// Every host pool that reserves memory: (handle, record).
pub fn records() -> Vec<(u64, Live)> {
    with(|t| {
        t.pools
            .iter()
            .filter(|(_, p)| p.live.size > 0)
            .map(|(&h, p)| (h, p.live))
            .collect()
    })
}

/// Fork handlers: held across `fork`.
pub fn hold() {
    lock::hold(&TABLE);
}

/// # Safety
/// Only in the fork handlers, after `hold`. In the child the table starts empty: the runtime's
/// pools are not the child's.
pub unsafe fn let_go(child: bool) {
    if child {
        // SAFETY: `hold` took the lock on this thread and the child has no other thread.
        unsafe { *TABLE.data_ptr() = None };
    }
    // SAFETY: `hold` took the lock on this thread (the caller's contract).
    unsafe { lock::let_go(&TABLE, child) };
}
