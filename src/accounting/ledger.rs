//! What is pinned right now and what happened so far: live allocations, locked ranges, the
//! process, per-API and per-callsite counters, events and the timeline.
//!
//! Hooks never touch this directly; `track` turns each hooked call into these records.

use crate::api::Api;
use crate::accounting::callsite::Callsite;
use crate::runtime::guard;
use crate::accounting::ranges::RangeSet;
use crate::runtime::lock::{self, Mutex, MutexGuard};
use pinguard_report::{ApiStats, EventKind, Limit, Totals};
use crate::accounting::addr_map::AddrMap;
use std::collections::VecDeque;
use crate::runtime::guard::Thread;
use crate::accounting::level::Level;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::{AcqRel, Acquire, Relaxed}};
use std::sync::OnceLock;

/// `repr(C)`: live records sit in the tables of the state file, whose readers know this layout
/// (`pinguard_report::state::slot`, checked below).
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
    use pinguard_report::state::slot as s;
    use std::mem::{offset_of, size_of};
    // A slot is the address, then the record.
    assert!(size_of::<Live>() + 8 == s::SIZE);
    assert!(offset_of!(Live, size) + 8 == s::BYTES && offset_of!(Live, site) + 8 == s::SITE);
    assert!(offset_of!(Live, unix_ms) + 8 == s::UNIX_MS && offset_of!(Live, tid) + 8 == s::TID);
    assert!(offset_of!(Live, api) + 8 == s::API && offset_of!(Live, backing) + 8 == s::BACKING);
};

impl Live {
    /// `unix_ms` from the coarse clock (`guard::coarse_unix_ms`), read once per hooked call.
    pub fn new(t: &Thread, api: Api, size: u64, site: &'static Callsite, backing: Backing, unix_ms: u64) -> Live {
        Live { size, api, backing, tid: t.tid(), unix_ms, site }
    }

    /// Served by a downgrade: not pinned, not in the budget.
    #[inline]
    pub fn downgraded(&self) -> bool {
        self.backing != Backing::Pinned
    }
}

/// A thread's event counters, made from the one list of them (`with_total_counters!` for the
/// process's, `with_api_counters!` for each entry point's, in `pinguard_report`): the fields in
/// the block's order, the zeroed value a new block starts from, and the sum into the report's
/// figures. Counters only go up, but for `downgraded_live_bytes`, whose deltas are added as two's
/// complement and whose sum is read as signed.
macro_rules! counters {
    ($name:ident, $out:ty, $($f:ident),*) => {
        #[repr(C)]
        struct $name {
            $($f: AtomicU64,)*
        }

        impl $name {
            #[allow(clippy::declare_interior_mutable_const)]
            const ZERO: $name = $name { $($f: AtomicU64::new(0),)* };

            /// Adds this block's counters to `out`'s.
            fn add_to(&self, out: &mut $out) {
                $(out.$f = out.$f.wrapping_add(self.$f.load(Relaxed));)*
            }
        }
    };
}
macro_rules! total_counters {
    ($($f:ident),*) => { counters!(Counters, Totals, $($f),*); };
}
macro_rules! api_counters {
    ($($f:ident),*) => { counters!(ApiCounters, ApiStats, $($f),*); };
}
pinguard_report::with_total_counters!(total_counters);
pinguard_report::with_api_counters!(api_counters);

/// One thread's event counters. Only the owning thread writes them, with a plain load and store
/// (`add`: no locked instruction, no cache line shared with another writer); readers sum every
/// block. A thread that ends hands its block back (a `pthread` key destructor) to the next thread
/// that counts, figures and all, so the sums stay right and short-lived threads leak nothing.
///
/// Blocks live in the state file (`arena`); `repr(C)` in the layout its readers know
/// (`pinguard_report::state::block`, checked below).
#[repr(C, align(128))]
pub struct Block {
    /// The next older block in the state file's list.
    state_next: AtomicU64,
    /// Which stripe of each `Level` this block's thread writes: blocks are numbered as they are
    /// made, so the threads alive at once hold the low numbers.
    pub slot: usize,
    totals: Counters,
    apis: [ApiCounters; Api::COUNT],
    /// The next older block in `BLOCKS`; set before the block is published, never changed.
    next: AtomicPtr<Block>,
}

const _: () = {
    use pinguard_report::state::block as b;
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(Block, state_next) == b::NEXT && offset_of!(Block, totals) == b::TOTALS && offset_of!(Block, apis) == b::APIS);
    assert!(size_of::<Counters>() == b::TOTAL_NAMES.len() * 8 && size_of::<ApiCounters>() == b::API_SIZE);
};

#[allow(clippy::declare_interior_mutable_const)]
const BLOCK: Block = Block {
    totals: Counters::ZERO,
    apis: [ApiCounters::ZERO; Api::COUNT],
    next: AtomicPtr::new(std::ptr::null_mut()),
    state_next: AtomicU64::new(0),
    slot: 0,
};
static MADE: AtomicUsize = AtomicUsize::new(0);

/// Every block ever made, newest first (blocks are never freed).
static BLOCKS: AtomicPtr<Block> = AtomicPtr::new(std::ptr::null_mut());
/// Blocks whose thread has ended.
static FREE: Mutex<Vec<&'static Block>> = Mutex::new(Vec::new());
static KEY: OnceLock<Option<libc::pthread_key_t>> = OnceLock::new();

/// This thread's block.
#[inline]
fn mine(t: &Thread) -> &'static Block {
    let p = t.counters.get() as *const Block;
    if !p.is_null() {
        // SAFETY: `counters` is only set (in `adopt`) to a leaked block, which is never freed.
        return unsafe { &*p };
    }
    adopt(t)
}

/// A thread's first count: on pinguard's own stack (it may place a block in the arena), for the
/// hooks that count on the caller's (the CUDA family's, the locking family's steady path).
#[cold]
#[inline(never)]
fn adopt(t: &Thread) -> &'static Block {
    crate::runtime::workstack::run(t, || adopt_here(t))
}

fn adopt_here(t: &Thread) -> &'static Block {
    let b = FREE.lock().pop().unwrap_or_else(|| {
        let b: &'static Block = crate::accounting::arena::leak(Block { slot: MADE.fetch_add(1, Relaxed), ..BLOCK });
        crate::accounting::arena::push(pinguard_report::state::header::BLOCKS, b as *const Block as *const u8);
        let mut head = BLOCKS.load(Acquire);
        loop {
            b.next.store(head, Relaxed);
            match BLOCKS.compare_exchange_weak(head, b as *const Block as *mut Block, AcqRel, Acquire) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        b
    });
    t.counters.set(b as *const Block as *const ());
    let key = KEY.get_or_init(|| {
        let mut key = 0;
        // SAFETY: `key` is a valid out-pointer and `hand_back` has the destructor signature pthread expects.
        (unsafe { libc::pthread_key_create(&mut key, Some(hand_back)) } == 0).then_some(key)
    });
    // Without the key (the process used up its keys, or the key is one for which glibc would
    // `calloc`, which a first count inside a signal handler must not do) the block stays with the
    // ended thread.
    if let Some(key) = key.filter(|&k| (k as usize) < guard::PTHREAD_KEY_INLINE) {
        // SAFETY: `key` was created by us above; the value is a leaked block that lives forever.
        unsafe { libc::pthread_setspecific(key, b as *const Block as *const c_void) };
    }
    b
}

/// At thread exit. A hook the thread reaches after this (another key's destructor) adopts a block
/// again, and glibc then runs this destructor once more.
unsafe extern "C" fn hand_back(p: *mut c_void) {
    // Inside pinguard while `FREE` is held: a signal handler's hooked call on this thread passes
    // through instead of waiting for the lock its own thread holds.
    let was = guard::mark_inside();
    let t = guard::here();
    if t.counters.get() == p as *const () {
        t.counters.set(std::ptr::null());
    }
    // SAFETY: glibc hands back the value `adopt` set for this key: a leaked block, never freed.
    FREE.lock().push(unsafe { &*(p as *const Block) });
    guard::unmark_inside(was);
}

fn blocks() -> impl Iterator<Item = &'static Block> {
    let mut p = BLOCKS.load(Acquire) as *const Block;
    std::iter::from_fn(move || {
        // SAFETY: `p` is null or a block from `BLOCKS`: blocks are leaked, never freed, and their
        // `next` is set before they are published (read here with Acquire).
        let b = unsafe { p.as_ref()? };
        p = b.next.load(Relaxed);
        Some(b)
    })
}

/// Adds to a counter only this thread writes.
#[inline(always)]
fn add<A: crate::accounting::level::Add>(c: &A, v: A::V) {
    c.add(v, true);
}

/// Live bytes and counts, and their peaks: the process's and each entry point's. In the state
/// file once there is one (`use_levels`); until then, and where there is none, here.
#[repr(C)]
pub struct Levels {
    total: Level<16>,
    apis: [Level<16>; Api::COUNT],
}
static OWN_LEVELS: Levels = Levels { total: Level::NEW, apis: [const { Level::NEW }; Api::COUNT] };
static LEVELS: AtomicPtr<Levels> = AtomicPtr::new(&OWN_LEVELS as *const Levels as *mut Levels);

#[inline(always)]
fn levels() -> &'static Levels {
    // SAFETY: `LEVELS` points at `OWN_LEVELS` or at levels in the arena, which stay mapped for
    // the process's life (a fork child points back at `OWN_LEVELS` before it lets go of them).
    unsafe { &*LEVELS.load(Relaxed) }
}

/// The arena placed the levels at `p` (zeroed, `Levels`' size and alignment), before anything
/// was counted: from now on they are counted there.
pub fn use_levels(p: *mut u8) {
    LEVELS.store(p as *mut Levels, Relaxed);
}

/// Set once anything was counted: a process that pins nothing writes no report.
static TOUCHED: AtomicBool = AtomicBool::new(false);

const SHARDS: usize = 64;
/// One cache line (two, with the adjacent-line prefetcher) per shard: threads on different shards
/// must not share a line.
#[repr(align(128))]
struct Shard(Mutex<AddrMap<Live>>);
impl std::ops::Deref for Shard {
    type Target = Mutex<AddrMap<Live>>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}
static LIVE: [Shard; SHARDS] = {
    let mut shards = [const { Shard(Mutex::new(AddrMap::EMPTY)) }; SHARDS];
    let mut i = 0;
    while i < SHARDS {
        shards[i] = Shard(Mutex::new(AddrMap::in_state(i)));
        i += 1;
    }
    shards
};
const _: () = assert!(SHARDS == pinguard_report::state::TABLES);

fn shard(addr: usize) -> &'static Shard {
    // Allocations are at least 16-byte aligned and usually page-aligned; mix the bits so
    // neighbouring pages spread over the shards.
    let h = (addr as u64 >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    &LIVE[(h >> 58) as usize % SHARDS]
}

/// The locking family's live pages, keyed by address: the kernel's locked mappings as pinguard
/// knows them, each page attributed to the call that locked it (`mlockall`'s pages to it).
///
/// The kernel is the truth (`VmLck`). Hooked calls keep the view exact; what pinguard cannot see
/// (glibc's own `munmap` of a freed block and `mremap` in `realloc`, pages locked while a signal
/// handler interrupted pinguard, a locked stack growing, `MCL_FUTURE`) is found by `check`: one
/// read of `VmLck`, and only when it differs from the view, a walk of `/proc/self/smaps` that
/// makes the view the kernel's.
pub struct Locked {
    pub ranges: RangeSet<Live>,
    /// The `mlockall(MCL_FUTURE)` in force: later mappings the kernel locks by itself are its.
    pub future: Option<Live>,
    /// `VmLck` minus the view right after the last walk: pages the kernel counts without showing
    /// them locked in `smaps`, or the reverse (none on the kernels tried), so that such pages do
    /// not make every check walk again.
    skew: i64,
}

/// What a walk changed in the view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Synced {
    pub added: u64,
    pub removed: u64,
}

impl Synced {
    pub fn any(self) -> bool {
        self != Synced::default()
    }
}

impl Locked {
    /// Adds `[s, e)`, a gap of the view, for `live`'s call, with the live figures. The budget is
    /// the caller's.
    pub fn add(&mut self, t: &Thread, s: usize, e: usize, live: Live, now: u64) {
        self.ranges.insert(s, e, Live { size: (e - s) as u64, ..live });
        live_delta(t, live.api, live.site, (e - s) as i64, 1, now);
    }

    /// Removes `[s, e)` from the view, with the live figures; returns the bytes removed, which
    /// the caller gives back to the budget.
    pub fn cut(&mut self, t: &Thread, s: usize, e: usize, now: u64) -> u64 {
        let mut removed = 0;
        self.ranges.remove(s, e, |l, b, c| {
            live_delta(t, l.api, l.site, -(b as i64), c, now);
            removed += b;
        });
        removed
    }

    /// Everything unlocked (`munlockall`), with the live figures; returns the bytes removed, which
    /// the caller gives back to the budget.
    pub fn clear(&mut self, t: &Thread, now: u64) -> u64 {
        let mut removed = 0;
        self.ranges.clear(|l, b, c| {
            live_delta(t, l.api, l.site, -(b as i64), c, now);
            removed += b;
        });
        self.future = None;
        self.skew = 0;
        removed
    }

    /// Compares with the kernel and, when they differ, makes the view the kernel's (`sync`).
    /// Returns what changed, for the caller to tell the budget.
    pub fn check(&mut self, t: &Thread, now: u64, owner: impl FnMut(usize, usize) -> Option<(Api, &'static Callsite)>) -> Synced {
        match crate::runtime::kernel::vm_lck() {
            Some(kernel) => self.check_against(kernel, t, now, owner),
            None => Synced::default(),
        }
    }

    /// `check` before a refusal, which a walk can only spare by finding pages the view holds and
    /// the kernel no longer has locked. Where a runtime pins with `mlock` (`note_runtime_lock`),
    /// `VmLck` moves with every runtime call, so only a kernel count below the view's own (such
    /// pages for certain) is worth a walk.
    pub fn check_before_refusal(&mut self, kernel: u64, t: &Thread, now: u64) -> Synced {
        if RUNTIME_LOCKS.load(Relaxed) && kernel >= self.ranges.bytes() {
            return Synced::default();
        }
        self.check_against(kernel, t, now, |_, _| None)
    }

    /// `check` with `VmLck` already read (`kernel`, in bytes).
    pub fn check_against(&mut self, kernel: u64, t: &Thread, now: u64, owner: impl FnMut(usize, usize) -> Option<(Api, &'static Callsite)>) -> Synced {
        let view = self.ranges.bytes();
        if kernel as i64 == view as i64 + self.skew {
            return Synced::default();
        }
        tracing::debug!("locked pages drifted from the kernel's: VmLck {kernel} bytes, pinguard's view {view} bytes; reading /proc/self/smaps");
        self.sync(t, now, owner)
    }

    /// Walks the kernel's mappings and makes the view match: pages no longer locked leave it,
    /// pages locked without pinguard's knowledge join it. Returns both, for the caller to tell the
    /// budget (`removed` given back, `added` taken whatever the limit: locked already); where the
    /// mappings could not be read whole, what was changed before. A new part is attributed to
    /// `owner`'s answer, else to the range it extends (a locked mapping that grew), else to the
    /// `MCL_FUTURE` call in force, else to no callsite.
    ///
    /// Pages inside a live runtime record (a runtime that pins with `mlock` inside its own hooked
    /// call, as the emulated ones do) stay that record's: counted once, not joined to the view.
    /// Once such a runtime was seen (`note_runtime_lock`), pages nobody claims are left out.
    pub fn sync(&mut self, t: &Thread, now: u64, mut owner: impl FnMut(usize, usize) -> Option<(Api, &'static Callsite)>) -> Synced {
        let mut out = Synced::default();
        let mut cur = 0usize;
        let mut runtime: Option<Vec<(usize, usize)>> = None;
        let complete = crate::runtime::kernel::for_each_vma(|v| {
            if v.start > cur {
                out.removed += self.cut(t, cur, v.start, now); // nothing mapped there
            }
            if v.locked {
                let gaps = self.ranges.gaps(v.start, v.end);
                let spans = match (&runtime, gaps.is_empty()) {
                    (_, true) => &[][..],
                    (Some(r), _) => &r[..],
                    (None, false) => &runtime.insert(runtime_spans())[..],
                };
                for (s, e) in gaps.into_iter().flat_map(|(s, e)| outside(s, e, spans)) {
                    let claimed = owner(s, e);
                    if claimed.is_none() && RUNTIME_LOCKS.load(Relaxed) {
                        // Pages nobody claims may be a runtime call's in flight, its record not
                        // yet written: never charge them to the view (the skew absorbs them).
                        continue;
                    }
                    let (api, site) = claimed
                        .or_else(|| self.ranges.adjacent(s, e).map(|l| (l.api, l.site)))
                        .or_else(|| self.future.map(|l| (l.api, l.site)))
                        .unwrap_or_else(|| (Api::Mlock, crate::accounting::callsite::empty()));
                    self.add(t, s, e, Live::new(t, api, 0, site, Backing::Pinned, now), now);
                    out.added += (e - s) as u64;
                }
            } else {
                out.removed += self.cut(t, v.start, v.end, now);
            }
            cur = cur.max(v.end);
        });
        if complete {
            out.removed += self.cut(t, cur, usize::MAX, now);
        }
        if !complete {
            return out;
        }
        if let Some(kernel) = crate::runtime::kernel::vm_lck() {
            self.skew = kernel as i64 - self.ranges.bytes() as i64;
        }
        out
    }
}

static LOCKED: Mutex<Option<Locked>> = Mutex::new(None);
/// Lets `munmap` and `mmap(MAP_FIXED)` skip the lock while nothing is locked.
static LOCKED_ANY: AtomicBool = AtomicBool::new(false);

pub struct LockedGuard(MutexGuard<'static, Option<Locked>>);

impl std::ops::Deref for LockedGuard {
    type Target = Locked;
    fn deref(&self) -> &Locked {
        self.0.as_ref().expect("initialised in locked()")
    }
}

impl std::ops::DerefMut for LockedGuard {
    fn deref_mut(&mut self) -> &mut Locked {
        self.0.as_mut().expect("initialised in locked()")
    }
}

impl Drop for LockedGuard {
    fn drop(&mut self) {
        let l = self.0.as_ref().expect("initialised in locked()");
        LOCKED_ANY.store(!l.ranges.is_empty() || l.future.is_some(), Relaxed);
    }
}

pub fn locked() -> LockedGuard {
    // Interned now, before the lock, if not yet: a walk attributes pages nobody claims to it, and
    // the callsite table's lock comes before the view's in the fork handlers' order.
    crate::accounting::callsite::empty();
    let mut g = LOCKED.lock();
    g.get_or_insert_with(|| Locked { ranges: RangeSet::default(), future: None, skew: 0 });
    LockedGuard(g)
}

pub fn locked_any() -> bool {
    LOCKED_ANY.load(Relaxed)
}

/// The page spans of every live pinned record of the runtimes, sorted: what they pinned is
/// theirs even where the kernel shows it locked.
fn runtime_spans() -> Vec<(usize, usize)> {
    let page = crate::runtime::sys::page_size();
    let mut v = Vec::new();
    for s in &LIVE {
        // Called under the view's lock, which a fork's prepare handler takes after every shard:
        // a shard that stays busy is skipped (its pages, if locked, join the view until the next
        // walk) rather than waited for.
        let Some(map) = (0..1000).find_map(|_| s.try_lock().or_else(|| {
            std::hint::spin_loop();
            None
        })) else {
            continue;
        };
        v.extend(map.iter().filter(|(_, l)| !l.downgraded()).filter_map(|(a, l)| crate::accounting::ranges::page_span(a, l.size as usize, page)));
    }
    v.sort_unstable();
    v
}

/// The parts of `[s, e)` outside every span of `spans` (sorted; they may overlap each other).
fn outside(s: usize, e: usize, spans: &[(usize, usize)]) -> crate::accounting::ranges::Gaps {
    crate::accounting::ranges::uncovered(s, e, spans.iter().copied())
}

/// Brings the locked pages' view in line with the kernel before they are observed
/// (`pinguard_live_bytes`, a report): a read of `VmLck`, and a walk of the mappings only when it
/// differs. Call on a thread inside pinguard (`Reentry`), with the locking family's hooks on.
/// Returns what changed, for the caller to tell the budget.
pub fn reconcile_locked(t: &Thread) -> Synced {
    locked().check(t, crate::runtime::clock::coarse_unix_ms(), |_, _| None)
}

/// Locking calls (`mlock`, `mlock2`, `mlockall`, `mmap` with `MAP_LOCKED`) that arrived while
/// their thread was already inside pinguard (a signal handler that interrupted a hook): passed
/// straight through, uncounted elsewhere. One relaxed add: no allocation, no lock.
static UNTRACKED: AtomicU64 = AtomicU64::new(0);

/// Set once a runtime pinned with `mlock` inside its own tracked call (the emulated runtimes do;
/// NVIDIA's pins through its driver, outside `VmLck`): from then on, locked pages of unknown origin
/// may be such a call's, in flight, and are not taken into the view.
static RUNTIME_LOCKS: AtomicBool = AtomicBool::new(false);

#[inline]
pub fn note_runtime_lock() {
    if !RUNTIME_LOCKS.load(Relaxed) {
        RUNTIME_LOCKS.store(true, Relaxed);
    }
}

/// From a signal handler that interrupted pinguard on its thread: only the flag, without telling
/// `on_first_count`'s function, which may allocate (the exit report tells it instead).
#[inline]
pub fn count_untracked() {
    UNTRACKED.fetch_add(1, Relaxed);
    if !TOUCHED.load(Relaxed) {
        TOUCHED.store(true, Relaxed);
    }
}

/// Moves pinned bytes in or out of the live figures (every level: process, API, callsite).
/// `now_ms` is the hooked call's coarse clock reading (`Live::unix_ms`).
#[inline]
pub fn live_delta(t: &Thread, api: Api, site: &'static Callsite, bytes: i64, count: i64, now_ms: u64) {
    let slot = mine(t).slot;
    levels().total.live(slot, bytes, count);
    levels().apis[api as usize].live(slot, bytes, count);
    site.level.live(slot, bytes, count);
    timeline_tick(now_ms);
}

/// A successful pinning call of `bytes` new pinned bytes, now live: `count_alloc` and
/// `live_delta` in one pass over the levels (the path every pinning call takes).
#[inline]
pub fn alloc_live(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, now_ms: u64) {
    touch();
    let m = mine(t);
    let slot = m.slot; // read once: the stores below could be to it, as far as the compiler knows
    add(&m.totals.alloc_count, 1);
    add(&m.totals.alloc_bytes, bytes);
    let levels = levels();
    levels.total.grow(slot, bytes);
    levels.apis[api as usize].alloc_live(slot, bytes);
    site.level.alloc_live(slot, bytes);
    site.note_api(api);
    timeline_tick(now_ms);
}

/// A pinned record of `bytes` released: `live_delta` of minus its bytes and one allocation,
/// without the peak's checks, which a release never needs.
#[inline(never)]
pub fn live_release(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, now_ms: u64) {
    let slot = mine(t).slot;
    let levels = levels();
    levels.total.release(slot, bytes);
    levels.apis[api as usize].release(slot, bytes);
    site.level.release(slot, bytes);
    timeline_tick(now_ms);
}

/// A successful pinning call of `bytes` new pinned bytes.
#[inline]
pub fn count_alloc(t: &Thread, api: Api, site: &'static Callsite, bytes: u64) {
    touch();
    let m = mine(t);
    add(&m.totals.alloc_count, 1);
    add(&m.totals.alloc_bytes, bytes);
    levels().apis[api as usize].alloc(m.slot, bytes);
    site.level.alloc(m.slot, bytes);
    site.note_api(api);
}

#[inline]
pub fn count_release(t: &Thread) {
    add(&mine(t).totals.release_count, 1);
}

pub fn count_failed(t: &Thread, api: Api) {
    touch();
    let m = mine(t);
    add(&m.totals.failed_count, 1);
    add(&m.apis[api as usize].failed_count, 1);
}

pub fn count_unknown_release(t: &Thread, api: Api) {
    touch();
    let m = mine(t);
    add(&m.totals.unknown_release_count, 1);
    add(&m.apis[api as usize].unknown_release_count, 1);
}

/// Which limit a call went over, for its counters and its event, and with the host reserve the
/// host's available memory as counted for the decision. One word (the limit in the low two bits):
/// the hook's decision carries it, and on the hot path a decision is no larger than a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Over(u64);

impl Over {
    const LIMITS: [Limit; 4] = [Limit::Budget, Limit::GroupBudget, Limit::HostReserve, Limit::GroupUnavailable];

    pub fn budget() -> Over {
        Over(0)
    }

    pub fn group_budget() -> Over {
        Over(1)
    }

    /// The group's ledger could not be reached in time: its budget could not be checked.
    pub fn group_unavailable() -> Over {
        Over(3)
    }

    /// Over the host reserve, with `available` bytes (kept up to 2^62, 4 EiB).
    pub fn host_reserve(available: u64) -> Over {
        Over(available.min(u64::MAX >> 2) << 2 | 2)
    }

    pub fn limit(self) -> Limit {
        Self::LIMITS[(self.0 & 3) as usize % Self::LIMITS.len()]
    }

    pub fn host_available(self) -> Option<u64> {
        (self.limit() == Limit::HostReserve).then_some(self.0 >> 2)
    }

    /// A call over the host reserve also counts as one (`host_reserve_count`), and a call the
    /// group could not decide (`group_unavailable_count`).
    fn count(self, m: &Block) {
        match self.limit() {
            Limit::HostReserve => add(&m.totals.host_reserve_count, 1),
            Limit::GroupUnavailable => add(&m.totals.group_unavailable_count, 1),
            _ => {}
        }
    }
}

pub fn count_denied(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, over: Over) {
    denied(t, api, site, bytes, over, false);
}

/// A refusal under `downgrade` of a call outside `PINGUARD_DOWNGRADE_MATCH`: its event says so.
pub fn count_denied_out_of_scope(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, over: Over) {
    denied(t, api, site, bytes, over, true);
}

fn denied(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, over: Over, out_of_scope: bool) {
    touch();
    let m = mine(t);
    add(&m.totals.denied_count, 1);
    add(&m.totals.denied_bytes, bytes);
    add(&m.apis[api as usize].denied_count, 1);
    over.count(m);
    site.denied_count.fetch_add(1, Relaxed);
    site.note_api(api);
    event_with(EventKind::Denied, api, bytes, site, over, out_of_scope);
}

/// A call served with pageable memory (or left unpinned) instead of pinned memory.
pub fn count_downgraded(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, over: Over) {
    touch();
    let m = mine(t);
    add(&m.totals.downgraded_count, 1);
    add(&m.totals.downgraded_bytes, bytes);
    add(&m.apis[api as usize].downgraded_count, 1);
    over.count(m);
    site.downgraded_count.fetch_add(1, Relaxed);
    site.note_api(api);
    event_with(EventKind::Downgraded, api, bytes, site, over, false);
}

pub fn count_over_budget(t: &Thread, api: Api, site: &'static Callsite, bytes: u64, over: Over) {
    touch();
    let m = mine(t);
    add(&m.totals.over_budget_count, 1);
    over.count(m);
    site.over_budget_count.fetch_add(1, Relaxed);
    site.note_api(api);
    event_with(EventKind::OverBudget, api, bytes, site, over, false);
}

pub fn downgraded_live_delta(t: &Thread, bytes: i64) {
    add(&mine(t).totals.downgraded_live_bytes, bytes as u64); // two's complement: read as signed
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
static OVER: Mutex<Vec<(usize, Live)>> = Mutex::new(Vec::new());

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

/// Marks the process as having something to report; a load first, so that the hot path does
/// not keep writing one shared cache line.
#[inline]
fn touch() {
    if !TOUCHED.load(Relaxed) {
        first_touch();
    }
}

/// Told once per process (and again in a fork child, whose counters start from nothing) when the
/// first thing is counted: the composition layer prints what it held back until the process
/// turned out to pin (`on_first_count`).
static FIRST_COUNT: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// `f` runs when this process first counts anything (a pin, a refusal, a downgrade, a failure...),
/// on the counting thread, inside pinguard, from wherever the count is made (possibly under the
/// locked-page view's lock): it must take none of the locks the fork handlers take before the
/// ledger's.
pub fn on_first_count(f: fn()) {
    let _ = FIRST_COUNT.set(f);
}

/// On pinguard's own stack: the composition layer's function may print.
#[cold]
#[inline(never)]
fn first_touch() {
    // One thread wins the flag; the others go on counting without waiting for it.
    if !TOUCHED.swap(true, Relaxed) {
        if let Some(f) = FIRST_COUNT.get() {
            crate::runtime::workstack::run(guard::here(), f);
        }
    }
}

pub fn touched() -> bool {
    TOUCHED.load(Relaxed)
}

pub fn live_bytes() -> u64 {
    levels().total.bytes()
}

pub fn totals() -> Totals {
    let mut t = Totals {
        live_bytes: levels().total.bytes(),
        live_count: levels().total.count(),
        peak_live_bytes: levels().total.peak(),
        untracked_count: UNTRACKED.load(Relaxed),
        stack_short_count: crate::runtime::workstack::short_count(),
        ..Totals::default()
    };
    for b in blocks() {
        b.totals.add_to(&mut t);
    }
    t.downgraded_live_bytes = (t.downgraded_live_bytes as i64).max(0) as u64;
    t
}

/// Per-API figures for every entry point that saw any activity.
pub fn apis() -> Vec<(Api, ApiStats)> {
    Api::ALL
        .iter()
        .map(|&api| {
            let i = api as usize;
            let mut s = ApiStats {
                alloc_count: levels().apis[i].alloc_count(),
                alloc_bytes: levels().apis[i].alloc_bytes(),
                live_count: levels().apis[i].count(),
                live_bytes: levels().apis[i].bytes(),
                peak_live_bytes: levels().apis[i].peak(),
                ..ApiStats::default()
            };
            for b in blocks() {
                b.apis[i].add_to(&mut s);
            }
            (api, s)
        })
        .filter(|(_, s)| *s != ApiStats::default())
        .collect()
}

/// Every live record: allocations and registrations, locked ranges.
pub fn live_records() -> Vec<(usize, Live)> {
    let mut v = Vec::new();
    for s in &LIVE {
        let map = s.lock();
        v.reserve(map.len());
        v.extend(map.iter().map(|(a, &l)| (a, l)));
    }
    let g = locked();
    v.extend(g.ranges.iter().map(|(s, e, l)| (s, Live { size: (e - s) as u64, ..*l })));
    drop(g);
    v.extend(OVER.lock().iter().copied());
    v
}

pub struct EventRec {
    pub unix_ms: u64,
    pub kind: EventKind,
    pub api: Api,
    pub size: u64,
    pub callsite: u32,
    pub live_bytes: u64,
    /// A refusal under `downgrade` of a callsite outside `PINGUARD_DOWNGRADE_MATCH`.
    pub out_of_scope: bool,
    pub over: Over,
}

const MAX_EVENTS: usize = 10_000;
const MAX_TIMELINE: usize = 10_000;

struct Bounded<T> {
    items: VecDeque<T>,
    dropped: u64,
}

static EVENTS: Mutex<Bounded<EventRec>> = Mutex::new(Bounded { items: VecDeque::new(), dropped: 0 });
static TIMELINE: Mutex<Bounded<(u64, u64)>> = Mutex::new(Bounded { items: VecDeque::new(), dropped: 0 });
static TIMELINE_MS: AtomicU64 = AtomicU64::new(0);

fn event_with(kind: EventKind, api: Api, size: u64, site: &'static Callsite, over: Over, out_of_scope: bool) {
    let rec = EventRec { unix_ms: crate::runtime::clock::unix_ms(), kind, api, size, callsite: site.id(), live_bytes: live_bytes(), out_of_scope, over };
    let mut e = EVENTS.lock();
    if e.items.len() >= MAX_EVENTS {
        e.items.pop_front();
        e.dropped += 1;
    }
    e.items.push_back(rec);
}

/// One point per millisecond at most: the lock is taken at most a thousand times a second however
/// hot the allocation loop is; `timeline_now` adds the final value when a report is written.
#[inline]
fn timeline_tick(now: u64) {
    let last = TIMELINE_MS.load(Relaxed);
    if now <= last || TIMELINE_MS.compare_exchange(last, now, Relaxed, Relaxed).is_err() {
        return;
    }
    push_point(now, live_bytes());
}

fn push_point(now: u64, live: u64) {
    let mut t = TIMELINE.lock();
    if let Some(back) = t.items.back_mut() {
        if back.0 >= now {
            back.1 = live;
            return;
        }
    }
    if t.items.len() >= MAX_TIMELINE {
        t.items.pop_front();
        t.dropped += 1;
    }
    t.items.push_back((now, live));
}

pub fn timeline_now() {
    push_point(crate::runtime::clock::unix_ms(), live_bytes());
}

pub fn events() -> (Vec<EventRec>, u64) {
    let e = EVENTS.lock();
    (
        e.items
            .iter()
            .map(|r| EventRec { unix_ms: r.unix_ms, kind: r.kind, api: r.api, size: r.size, callsite: r.callsite, live_bytes: r.live_bytes, out_of_scope: r.out_of_scope, over: r.over })
            .collect(),
        e.dropped,
    )
}

pub fn timeline() -> (Vec<(u64, u64)>, u64) {
    let t = TIMELINE.lock();
    (t.items.iter().copied().collect(), t.dropped)
}

/// Fork support: take every lock of the ledger so the child inherits none held.
pub fn lock_all() {
    for s in &LIVE {
        lock::hold(s);
    }
    lock::hold(&LOCKED);
    lock::hold(&EVENTS);
    lock::hold(&TIMELINE);
    lock::hold(&FREE);
    lock::hold(&OVER);
}

/// # Safety
/// Only after `lock_all` on this thread. With `clear` (the child), the ledger starts empty:
/// pinned memory and `mlock` locks are not inherited across `fork`.
pub unsafe fn unlock_all(clear: bool) {
    if clear {
        // SAFETY: `lock_all` holds every one of these locks (the caller's contract), and the fork
        // child has no other thread: the data behind them is this thread's alone.
        unsafe {
            for s in &LIVE {
                (*s.data_ptr()).forget();
            }
            *LOCKED.data_ptr() = None;
            *EVENTS.data_ptr() = Bounded { items: VecDeque::new(), dropped: 0 };
            *TIMELINE.data_ptr() = Bounded { items: VecDeque::new(), dropped: 0 };
            *FREE.data_ptr() = Vec::new();
            *OVER.data_ptr() = Vec::new();
        }
        LOCKED_ANY.store(false, Relaxed);
        TIMELINE_MS.store(0, Relaxed);
        reset_counters();
    }
    // SAFETY: each of these locks is held by `lock_all` on this thread (the caller's contract),
    // released once here, in the parent or in the child as `clear` says.
    unsafe {
        lock::release(&FREE, clear);
        lock::release(&OVER, clear);
        for s in &LIVE {
            if clear { lock::release_in_child(s) } else { lock::release_in_parent(s) }
        }
        if clear {
            lock::release_in_child(&LOCKED);
            lock::release_in_child(&EVENTS);
            lock::release_in_child(&TIMELINE);
        } else {
            lock::release_in_parent(&LOCKED);
            lock::release_in_parent(&EVENTS);
            lock::release_in_parent(&TIMELINE);
        }
    }
}

/// The child's counters start from nothing: the parent's blocks (in the parent's state file,
/// which the child lets go of, or on the heap) are forgotten, and this thread adopts a new one.
fn reset_counters() {
    BLOCKS.store(std::ptr::null_mut(), Relaxed);
    MADE.store(0, Relaxed);
    guard::here().counters.set(std::ptr::null());
    if let Some(&Some(key)) = KEY.get() {
        if (key as usize) < guard::PTHREAD_KEY_INLINE {
            // SAFETY: our key; clearing it keeps the thread's exit from handing back a parent's block.
            unsafe { libc::pthread_setspecific(key, std::ptr::null()) };
        }
    }
    LEVELS.store(&OWN_LEVELS as *const Levels as *mut Levels, Relaxed);
    for l in std::iter::once(&OWN_LEVELS.total).chain(OWN_LEVELS.apis.iter()) {
        l.reset();
    }
    UNTRACKED.store(0, Relaxed);
    crate::runtime::workstack::forget_short();
    TOUCHED.store(false, Relaxed);
}

#[cfg(test)]
mod locked_tests {
    #[test]
    fn outside_runtime_spans() {
        let spans = [(0x1000, 0x3000), (0x2000, 0x2800), (0x5000, 0x6000)];
        assert_eq!(super::outside(0x0, 0x8000, &spans).to_vec(), vec![(0x0, 0x1000), (0x3000, 0x5000), (0x6000, 0x8000)]);
        assert_eq!(super::outside(0x2000, 0x2800, &spans).to_vec(), vec![]);
        assert_eq!(super::outside(0x2800, 0x5800, &spans).to_vec(), vec![(0x3000, 0x5000)]);
        assert_eq!(super::outside(0x7000, 0x8000, &[]).to_vec(), vec![(0x7000, 0x8000)]);
    }
}

#[cfg(test)]
mod over_tests {
    use super::*;

    #[test]
    fn an_over_keeps_its_limit_and_the_available_bytes() {
        assert_eq!((Over::budget().limit(), Over::budget().host_available()), (Limit::Budget, None));
        assert_eq!((Over::group_budget().limit(), Over::group_budget().host_available()), (Limit::GroupBudget, None));
        for a in [0, 1, 4095, 1 << 40, u64::MAX >> 2] {
            assert_eq!((Over::host_reserve(a).limit(), Over::host_reserve(a).host_available()), (Limit::HostReserve, Some(a)));
        }
        assert_eq!(Over::host_reserve(u64::MAX).host_available(), Some(u64::MAX >> 2));
    }
}
