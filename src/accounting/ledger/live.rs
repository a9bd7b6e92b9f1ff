//! Live records: what each pinned allocation, registration and locked range is, and the
//! tables that hold them by address (sharded, in the state file) and the registrations over
//! memory that is already pinned.

use super::locked_pages::locked_pages;
use crate::accounting::addr_map::AddrMap;
use crate::accounting::callsite::Callsite;
use crate::api::Api;
use crate::runtime::guard::Thread;
use crate::runtime::lock::Mutex;

/// `repr(C)`: live records sit in the tables of the state file, whose readers know this layout
/// (`pinguard_common::state::slot`, checked below).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Live {
    pub size: u64,
    pub site: &'static Callsite,
    pub unix_ms: u64,
    pub tid: u32,
    pub api: Api,
    pub backing: Backing,
}

/// How a live record's memory is backed: what its release gives back, and to whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Backing {
    /// Pinned by the runtime: its bytes are the budget's until the runtime releases them.
    Pinned = 0,
    /// pinguard's own pageable memory, served in place of a pinned allocation (`downgrade`):
    /// pinguard frees it, the runtime never saw it.
    Pageable = 1,
    /// The caller's own memory, left unpinned in place of a registration (`downgrade`): nothing
    /// to free, nothing the runtime holds.
    Unpinned = 2,
}

const _: () = {
    use pinguard_common::state::slot as s;
    use std::mem::{offset_of, size_of};
    // A slot is the address, then the record.
    assert!(size_of::<Live>() + 8 == s::SIZE);
    assert!(offset_of!(Live, size) + 8 == s::BYTES && offset_of!(Live, site) + 8 == s::SITE);
    assert!(offset_of!(Live, unix_ms) + 8 == s::UNIX_MS && offset_of!(Live, tid) + 8 == s::TID);
    assert!(offset_of!(Live, api) + 8 == s::API && offset_of!(Live, backing) + 8 == s::BACKING);
};

impl Live {
    /// `unix_ms` from the coarse clock (`guard::coarse_unix_ms`), read once per hooked call.
    pub fn new(
        t: &Thread,
        api: Api,
        size: u64,
        site: &'static Callsite,
        backing: Backing,
        unix_ms: u64,
    ) -> Live {
        Live {
            size,
            api,
            backing,
            tid: t.tid(),
            unix_ms,
            site,
        }
    }

    /// Served by a downgrade: not pinned, not in the budget.
    #[inline]
    pub fn downgraded(&self) -> bool {
        self.backing != Backing::Pinned
    }
}

pub(super) const SHARDS: usize = 64;
/// One cache line (two, with the adjacent-line prefetcher) per shard: threads on different shards
/// must not share a line.
#[repr(align(128))]
pub(super) struct Shard(Mutex<AddrMap<Live>>);
impl std::ops::Deref for Shard {
    type Target = Mutex<AddrMap<Live>>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
pub(super) static LIVE: [Shard; SHARDS] = {
    let mut shards = [const { Shard(Mutex::new(AddrMap::EMPTY)) }; SHARDS];
    let mut i = 0;
    while i < SHARDS {
        shards[i] = Shard(Mutex::new(AddrMap::in_state(i)));
        i += 1;
    }
    shards
};
const _: () = assert!(SHARDS == pinguard_common::state::TABLES);

pub(super) fn shard(addr: usize) -> &'static Shard {
    // Allocations are at least 16-byte aligned and usually page-aligned; mix the bits so
    // neighbouring pages spread over the shards.
    let h = (addr as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    &LIVE[(h >> 58) as usize % SHARDS]
}

/// Records `live` at `addr`; returns a record it replaced (one whose release pinguard missed:
/// the caller takes its figures out, so nothing is counted twice).
#[inline(always)]
#[must_use]
pub fn insert(addr: usize, live: Live) -> Option<Live> {
    shard(addr).lock().insert(addr, live)
}

/// The live record at `addr`, if any.
pub fn live_at(addr: usize) -> Option<Live> {
    shard(addr).lock().get(addr).copied()
}

/// Removes the record at `addr` if `accept` says the release call matches how it was taken
/// (`cudaFreeHost` does not free a `cudaHostRegister`ed range).
#[inline]
pub fn take(addr: usize, accept: impl Fn(Api) -> bool) -> Option<Live> {
    shard(addr).lock().remove_if(addr, |l| accept(l.api))
}

/// Registrations of memory that is already pinned (torch_npu registers each block it allocated,
/// to map it for the device): kept apart from the record of the memory they cover, which has
/// the same address, and counting only the bytes they add (pinned bytes are pages: a page pinned
/// twice is pinned once). Few, and reached only when a release finds no record of its own kind.
pub(super) static OVER: Mutex<Vec<(usize, Live)>> = Mutex::new(Vec::new());

/// Records a registration over already-pinned memory at `addr`.
pub fn insert_over(addr: usize, live: Live) {
    OVER.lock().push((addr, live));
}

/// Removes the registration over already-pinned memory at `addr` that `accept` takes.
pub fn take_over(addr: usize, accept: impl Fn(Api) -> bool) -> Option<Live> {
    let mut over = OVER.lock();
    let i = over.iter().position(|(a, l)| *a == addr && accept(l.api))?;
    Some(over.swap_remove(i).1)
}

/// Every live record: allocations and registrations, locked ranges.
pub fn live_records() -> Vec<(usize, Live)> {
    let mut v = Vec::new();
    for s in &LIVE {
        let map = s.lock();
        v.reserve(map.len());
        v.extend(map.iter().map(|(a, &l)| (a, l)));
    }
    let g = locked_pages();
    v.extend(g.ranges.iter().map(|(s, e, l)| {
        (
            s,
            Live {
                size: (e - s) as u64,
                ..*l
            },
        )
    }));
    drop(g);
    v.extend(OVER.lock().iter().copied());
    v.extend(super::shared::members());
    v
}
