//! Callsites: distinct stacks, deduplicated, each with its own counters.
//!
//! A callsite's memory is never freed, so live records and calls in flight hold a plain
//! `&'static Callsite` and update its counters without taking any lock. The table is bounded
//! (`set_max`, `PINGUARD_MAX_CALLSITES`): beyond that many callsites, those with nothing live are
//! folded (`fold`) into one aggregate (`Folded`, in the state file too) and their slots, frames
//! and state-file records are reused for new stacks after a grace period (`reuse`). A callsite
//! with a live allocation is never folded; a folded stack that comes back is interned anew.
//!
//! A slot's `gen` tells its holders what it is: even while it is in the table, odd once it is
//! folded (or retired by `retire`). Caches outside the table (the thread's last callsites, the
//! walk memos' tags) check it, so a reused slot is never taken for the stack it held before.

use crate::accounting::level::Level;
use crate::api::Api;
use crate::runtime::lock::{self, Mutex};
use rustc_hash::{FxHashMap, FxHasher};
use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};

/// Callsites live in the state file (`arena`), in the layout its readers know
/// (`pinguard_common::state::site`, checked below), with their frames and their Python frames as
/// text; the fields after `level` are the process's own.
#[repr(C)]
pub struct Callsite {
    /// The next older callsite in the state file's list.
    state_next: AtomicU64,
    /// A new id each time the slot is given to a stack (`id()`).
    id: AtomicU32,
    /// The key (`frames()`): this slot's own buffer of `frames_cap` words, in the arena, for
    /// every stack the slot holds (so a stale holder never reads outside it).
    frames_at: *const usize,
    frames_len: AtomicUsize,
    /// The Python frames as text, for readers of the state file only (`py_cap` bytes there).
    py_at: AtomicPtr<u8>,
    py_len: AtomicUsize,
    pub denied_count: AtomicU64,
    pub downgraded_count: AtomicU64,
    /// Bit per `Api` this callsite called (`Api as usize` bit of the words).
    pub apis: ApiBits,
    /// Calls pinned over the budget under `warn`.
    pub over_budget_count: AtomicU64,
    /// Bytes of the refused and downgraded calls (the slow path's; in what was padding).
    pub denied_bytes: AtomicU64,
    pub downgraded_bytes: AtomicU64,
    /// Live bytes and count, their peak, allocations: striped by thread (`level`).
    pub level: Level<4>,
    /// Set once the `warn` policy has logged this callsite.
    pub warned: AtomicBool,
    /// Even while the slot is in the table; odd once it is out (folded, or retired because an
    /// object its frames lie in was closed: `unload`).
    gen: AtomicU32,
    /// Whether `PINGUARD_DOWNGRADE_MATCH` takes it in: 0 not asked yet, 1 yes, 2 no (the patterns
    /// are the process's for its whole life, and so are the callsite's frames).
    pub scope: AtomicU8,
    /// The names those frames had while the object was loaded.
    pub closed: Mutex<Vec<Closed>>,
    /// Words at `frames_at`: a power of two, fixed for the slot's life.
    frames_cap: usize,
    /// Bytes at `py_at`.
    py_cap: AtomicUsize,
    /// `activity()` when `fold` last looked: a callsite that moved since is recently used.
    seen: AtomicU64,
}

const _: () = {
    use pinguard_common::state::site as s;
    use std::mem::offset_of;
    assert!(
        offset_of!(Callsite, state_next) == s::NEXT
            && offset_of!(Callsite, id) == s::ID
            && offset_of!(Callsite, apis) == s::APIS
    );
    assert!(
        offset_of!(Callsite, frames_at) == s::FRAMES
            && offset_of!(Callsite, frames_len) == s::NFRAMES
    );
    assert!(offset_of!(Callsite, py_at) == s::PY && offset_of!(Callsite, py_len) == s::PY_LEN);
    assert!(
        offset_of!(Callsite, denied_count) == s::DENIED
            && offset_of!(Callsite, downgraded_count) == s::DOWNGRADED
    );
    assert!(offset_of!(Callsite, over_budget_count) == s::OVER_BUDGET);
    assert!(
        offset_of!(Callsite, denied_bytes) == s::DENIED_BYTES
            && offset_of!(Callsite, downgraded_bytes) == s::DOWNGRADED_BYTES
    );
    assert!(offset_of!(Callsite, level) == s::LEVEL && offset_of!(Callsite, apis) == s::APIS);
    assert!(
        Api::COUNT <= API_BITS,
        "a bit per entry point in `apis`: widen `state::API_WORDS`"
    );
};

/// What the library does with each callsite counter (`pinguard_common::with_callsite_counters!`,
/// the one list of them): `Callsite`'s and `Folded`'s fields are declared by hand, where the state
/// file's layout puts them, and everything else here is made from the list (`zeroed` is their
/// initialiser, so a field missing from the list, or the other way round, fails to compile).
macro_rules! site_counters {
    (
        counts { $( $(#[$ca:meta])* $c:ident, )* }
        bytes { $( $(#[$ba:meta])* $b:ident, )* }
    ) => {
        impl Callsite {
            /// The calls refused, downgraded or pinned over the budget here (the counts summed).
            pub fn calls_answered(&self) -> u64 {
                0u64 $( .wrapping_add(self.$c.load(Ordering::Relaxed)) )*
            }

            /// Whether any call here was refused, downgraded or pinned over the budget.
            pub fn answered_any(&self) -> bool {
                false $( || self.$c.load(Ordering::Relaxed) > 0 )*
            }
        }

        /// Moves a callsite's counters into the aggregate, zeroing them.
        fn absorb_counters(f: &Folded, cs: &Callsite) {
            $( f.$c.fetch_add(cs.$c.swap(0, Ordering::Relaxed), Ordering::Relaxed); )*
            $( f.$b.fetch_add(cs.$b.swap(0, Ordering::Relaxed), Ordering::Relaxed); )*
        }
    };
}
pinguard_common::with_callsite_counters!(site_counters);

/// `Name { fields }` with the callsite counters (`with_callsite_counters!`) at zero besides.
macro_rules! zeroed {
    (
        { $name:ident { $($field:ident: $value:expr),* $(,)? } }
        counts { $( $(#[$ca:meta])* $c:ident, )* }
        bytes { $( $(#[$ba:meta])* $b:ident, )* }
    ) => {
        $name {
            $($field: $value,)*
            $($c: AtomicU64::new(0),)*
            $($b: AtomicU64::new(0),)*
        }
    };
}

/// A bit per entry point, in the state file's words (`state::API_WORDS`).
pub type ApiBits = [AtomicU64; pinguard_common::state::API_WORDS];
const API_BITS: usize = pinguard_common::state::API_WORDS * 64;

/// The words' bits as plain values.
pub fn api_bits(a: &ApiBits) -> [u64; pinguard_common::state::API_WORDS] {
    std::array::from_fn(|w| a[w].load(Ordering::Relaxed))
}

/// Whether `api`'s bit is set in `bits`.
pub fn has_api(bits: &[u64], api: Api) -> bool {
    bits.get(api as usize / 64)
        .is_some_and(|w| w & (1u64 << (api as u32 % 64)) != 0)
}

// SAFETY: the raw pointers point at immutable data that lives as long as the process (the
// arena, or leaked heap memory); everything mutable is atomic or behind a lock.
unsafe impl Sync for Callsite {}
// SAFETY: as above.
unsafe impl Send for Callsite {}

/// Frames of a callsite inside an object that has since been closed, named while it was loaded.
pub struct Closed {
    pub frames: Vec<(usize, Vec<pinguard_common::Frame>)>,
    pub module: pinguard_common::Module,
}

/// Separates the native return addresses from the Python frame ids in a callsite's key.
pub const PYTHON: usize = usize::MAX;

impl Callsite {
    /// The callsite's number in reports and events (a reused slot gets a new one).
    #[inline]
    pub fn id(&self) -> u32 {
        self.id.load(Ordering::Relaxed)
    }

    /// Calls counted here so far: changes whenever the callsite is used.
    fn activity(&self) -> u64 {
        self.level.alloc_count().wrapping_add(self.calls_answered())
    }

    /// The key: return addresses, innermost first (the first is in the code that called the
    /// hooked API), then `PYTHON` and the Python frame ids when there are any.
    #[inline]
    pub fn frames(&self) -> &'static [usize] {
        let len = self.frames_len.load(Ordering::Relaxed).min(self.frames_cap);
        if len == 0 {
            return &[];
        }
        // SAFETY: `frames_at` is this slot's buffer of `frames_cap` words (`slot`), never freed
        // nor moved, and `len` is clamped to it. A slot is rewritten only while it is out of the
        // table: a holder that may see it rewritten checks `gen` around its read (`live_match`).
        unsafe { std::slice::from_raw_parts(self.frames_at, len) }
    }

    /// The native return addresses, innermost first.
    pub fn native(&self) -> &[usize] {
        let f = self.frames();
        let end = f.iter().position(|&a| a == PYTHON).unwrap_or(f.len());
        &f[..end]
    }

    /// The interned Python frames (`python::frame`), innermost first.
    pub fn python(&self) -> &[usize] {
        let f = self.frames();
        match f.iter().position(|&a| a == PYTHON) {
            Some(i) => &f[i + 1..],
            None => &[],
        }
    }

    pub fn note_api(&self, api: Api) {
        // One word's load, and an atomic or the first time only (the hot path's cost).
        let (word, bit) = (&self.apis[api as usize / 64], 1u64 << (api as u32 % 64));
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }
}

/// A tag holds the slot's address in its low 48 bits (Linux gives no user address above them
/// without a hint, which pinguard never gives) and the low 16 bits of its `gen` above.
const TAG_SHIFT: u32 = 48;

/// A callsite as a plain word, for a cache outside this stage to hold (`stack::tag`): never 0.
/// `None` for a slot no tag can name (out of the table already, or an address above 48 bits).
pub fn tag(cs: &'static Callsite) -> Option<usize> {
    let (at, gen) = (
        cs as *const Callsite as usize,
        cs.gen.load(Ordering::Acquire),
    );
    (at >> TAG_SHIFT == 0 && gen & 1 == 0).then_some(at | ((gen as usize & 0xffff) << TAG_SHIFT))
}

/// The callsite a `tag` names, unless its slot has left the table since (folded, or retired
/// when its object was closed), and so may hold another stack.
///
/// # Safety
/// `tag` must come from `tag` (callsite slots are never freed).
#[inline]
pub unsafe fn from_tag(tag: usize) -> Option<&'static Callsite> {
    // SAFETY: the caller's contract: the low bits are the address of a callsite slot, and slots
    // stay mapped for the process's life (`slot`).
    let cs = unsafe { &*((tag & ((1 << TAG_SHIFT) - 1)) as *const Callsite) };
    // Compared as 16-bit words: one compare with the field in memory (callgrind).
    (cs.gen.load(Ordering::Relaxed) as u16 == (tag >> TAG_SHIFT) as u16).then_some(cs)
}

const SHARDS: usize = 16;

static TABLE: [Shard; SHARDS] = [const { Mutex::new(None) }; SHARDS];
static NEXT_ID: AtomicU32 = AtomicU32::new(0);

const RECENT: usize = 8;

thread_local! {
    /// The callsites this thread used last, by hash: a loop pinning from one place finds its
    /// callsite here, without the table's lock.
    static RECENT_SITES: Cell<[(u64, usize); RECENT]> = const { Cell::new([(0, 0); RECENT]) };
    static RECENT_NEXT: Cell<usize> = const { Cell::new(0) };
    /// The callsite this thread used last: a loop pinning from one place finds it by comparing
    /// frames, without hashing them first.
    static LAST: Cell<usize> = const { Cell::new(0) };
}

/// The callsite without frames (`PINGUARD_DEPTH=0`), kept at hand: it is never retired.
static EMPTY: AtomicPtr<Callsite> = AtomicPtr::new(std::ptr::null_mut());

pub fn empty() -> &'static Callsite {
    let p = EMPTY.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: `EMPTY` only ever holds a callsite from `intern`; callsites are leaked, never freed.
        return unsafe { &*p };
    }
    // The first callsite may set up the table and the state file: on pinguard's own stack.
    let cs = crate::runtime::workstack::run(crate::runtime::guard::here(), || intern(&[]));
    EMPTY.store(cs as *const Callsite as *mut Callsite, Ordering::Release);
    cs
}

pub fn intern(frames: &[usize]) -> &'static Callsite {
    // SAFETY: a destructor-less thread-local is never freed while its thread runs, so the
    // reference outlives this call; one look-up of each thread-local.
    let last: &Cell<usize> = LAST.with(|l| unsafe { &*(l as *const Cell<usize>) });
    if let Some(cs) = live_match(last.get(), frames) {
        return cs;
    }
    let mut h = FxHasher::default();
    frames.hash(&mut h);
    let hash = h.finish();
    // SAFETY: as above: `RECENT_SITES` has no destructor and lives as long as this thread.
    let recent: &Cell<[(u64, usize)]> =
        RECENT_SITES.with(|r| unsafe { &*(r as *const Cell<[(u64, usize); RECENT]>) });
    let recent = recent.as_slice_of_cells();
    let cs = match recent
        .iter()
        .map(Cell::get)
        .find(|&(rh, _)| rh == hash)
        .and_then(|(_, p)| live_match(p, frames))
    {
        Some(cs) => cs,
        None => {
            let cs = intern_slow(hash, frames);
            RECENT_NEXT.with(|n| {
                let i = n.get();
                n.set((i + 1) % RECENT);
                recent[i].set((hash, cs as *const Callsite as usize));
            });
            cs
        }
    };
    last.set(cs as *const Callsite as usize);
    cs
}

/// The callsite at `p` (0: none) if it has exactly these frames and is still in the table: its
/// `gen` even and the same before and after the frames are read, as a sequence lock's reader.
#[inline]
fn live_match(p: usize, frames: &[usize]) -> Option<&'static Callsite> {
    // SAFETY: `p` is 0 or the address of a callsite slot from `intern_slow`; slots are never
    // freed (folded and retired ones included).
    let cs = unsafe { (p as *const Callsite).as_ref()? };
    let gen = cs.gen.load(Ordering::Acquire);
    if gen & 1 != 0 || cs.frames() != frames {
        return None;
    }
    fence(Ordering::Acquire);
    (cs.gen.load(Ordering::Relaxed) == gen).then_some(cs)
}

fn intern_slow(hash: u64, frames: &[usize]) -> &'static Callsite {
    let shard = &TABLE[hash as usize % SHARDS];
    if let Some(cs) = shard.lock().as_ref().and_then(|m| m.get(frames).copied()) {
        return cs;
    }
    // Made outside the table's lock: its Python frames' text takes the Python table's lock, and
    // the module list walks the loaded objects.
    let py = py_text(frames);
    let cs = slot(frames, py.as_bytes());
    let mut guard = shard.lock();
    let map = guard.get_or_insert_with(FxHashMap::default);
    if let Some(&found) = map.get(frames) {
        drop(guard);
        LIMBO.lock().push_front((cs, 0, 0)); // another thread made it meanwhile; nobody saw `cs`
        return found;
    }
    if map.try_reserve(1).is_err() {
        // Short of memory, the table is not grown: the slot serves this call alone, out of the
        // table (`gen` odd), where `all` still finds what it counts and `reuse` keeps it apart
        // while it holds live memory.
        drop(guard);
        LIMBO.lock().push_front((cs, 0, 0));
        return cs;
    }
    cs.gen.fetch_add(1, Ordering::Release); // even: in the table, found by its frames
    map.insert(cs.frames(), cs);
    drop(guard);
    let n = TABLE_LEN.fetch_add(1, Ordering::Relaxed) + 1;
    note_modules(cs.native());
    if n > NEXT_FOLD.load(Ordering::Relaxed) {
        fold();
    }
    cs
}

/// Callsites in the table (all shards).
static TABLE_LEN: AtomicUsize = AtomicUsize::new(0);
/// The most callsites kept apart (`PINGUARD_MAX_CALLSITES`), set at start-up.
static MAX: AtomicUsize = AtomicUsize::new(pinguard_common::vars::DEFAULT_MAX_CALLSITES);
/// The table size at which `fold` next looks (`MAX` at first).
static NEXT_FOLD: AtomicUsize = AtomicUsize::new(pinguard_common::vars::DEFAULT_MAX_CALLSITES);

/// Sets the most callsites kept apart; those with nothing live beyond it are folded.
pub fn set_max(max: usize) {
    let max = max.max(1);
    MAX.store(max, Ordering::Relaxed);
    NEXT_FOLD.store(max, Ordering::Relaxed);
}

pub fn max() -> usize {
    MAX.load(Ordering::Relaxed)
}

/// A slot for a new stack, its frames and Python text written, out of the table (`gen` odd): a
/// folded one whose grace has passed, else a new one (on the state file's list from the start).
fn slot(frames: &[usize], py: &[u8]) -> &'static Callsite {
    let cs = reuse(frames.len()).unwrap_or_else(|| fresh(frames.len()));
    // SAFETY: the slot is out of the table and out of `LIMBO`, so this thread is its only writer;
    // `frames.len()` fits its buffer (`reuse` and `fresh` make sure). A stale holder reading the
    // frames meanwhile sees `gen` odd, or changed, and does not take it (`live_match`).
    unsafe {
        std::ptr::copy_nonoverlapping(frames.as_ptr(), cs.frames_at as *mut usize, frames.len())
    };
    cs.frames_len.store(frames.len(), Ordering::Relaxed);
    cs.py_len.store(0, Ordering::Relaxed);
    if py.len() > cs.py_cap.load(Ordering::Relaxed) {
        let cap = py.len().next_power_of_two();
        cs.py_at.store(buffer::<u8>(cap), Ordering::Relaxed);
        cs.py_cap.store(cap, Ordering::Relaxed);
    }
    if !py.is_empty() {
        // SAFETY: `py_at` holds `py_cap` >= `py.len()` bytes of this slot's, written by no one else
        // (as the frames above); the state file's readers check `py_len`, set after.
        unsafe {
            std::ptr::copy_nonoverlapping(py.as_ptr(), cs.py_at.load(Ordering::Relaxed), py.len())
        };
    }
    cs.py_len.store(py.len(), Ordering::Release);
    cs.warned.store(false, Ordering::Relaxed);
    cs.scope.store(0, Ordering::Relaxed);
    cs.apis.iter().for_each(|w| w.store(0, Ordering::Relaxed));
    cs.seen.store(UNSEEN, Ordering::Relaxed);
    cs.closed.lock().clear();
    cs.id
        .store(NEXT_ID.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    cs
}

/// `n` zeroed values in the arena, or on pinguard's heap when the arena cannot take them; never freed.
fn buffer<T: Copy + Default>(n: usize) -> *mut T {
    match crate::accounting::arena::alloc(n * std::mem::size_of::<T>(), std::mem::align_of::<T>()) {
        Some(p) => p as *mut T,
        None => Box::leak(vec![T::default(); n].into_boxed_slice()).as_mut_ptr(),
    }
}

/// A new slot with room for `len` frames (rounded up to a power of two, so that it can hold
/// other stacks of about its depth later), on the state file's list.
fn fresh(len: usize) -> &'static Callsite {
    let cap = len.next_power_of_two().max(4);
    let cs: &'static Callsite =
        crate::accounting::arena::leak(pinguard_common::with_callsite_counters!(zeroed {
            Callsite {
                state_next: AtomicU64::new(0),
                id: AtomicU32::new(0),
                apis: [const { AtomicU64::new(0) }; pinguard_common::state::API_WORDS],
                frames_at: buffer::<usize>(cap),
                frames_len: AtomicUsize::new(0),
                py_at: AtomicPtr::new(std::ptr::null_mut()),
                py_len: AtomicUsize::new(0),
                level: Level::NEW,
                warned: AtomicBool::new(false),
                gen: AtomicU32::new(1),
                scope: AtomicU8::new(0),
                closed: Mutex::new(Vec::new()),
                frames_cap: cap,
                py_cap: AtomicUsize::new(0),
                seen: AtomicU64::new(UNSEEN),
            }
        }));
    crate::accounting::arena::push(
        pinguard_common::state::header::CALLSITES,
        cs as *const Callsite as *const u8,
    );
    cs
}

/// The folded callsites' figures, summed: in the arena, named by the state file's header
/// (`pinguard_common::state::folded`, checked below).
#[repr(C)]
pub struct Folded {
    pub count: AtomicU64,
    pub alloc_count: AtomicU64,
    pub alloc_bytes: AtomicU64,
    pub denied_count: AtomicU64,
    pub downgraded_count: AtomicU64,
    pub over_budget_count: AtomicU64,
    /// The highest peak of any folded callsite.
    pub peak_live_bytes: AtomicU64,
    /// A bit per `Api` any of them called.
    pub apis: ApiBits,
    pub denied_bytes: AtomicU64,
    pub downgraded_bytes: AtomicU64,
}

const _: () = {
    use pinguard_common::state::folded as f;
    use std::mem::{offset_of, size_of};
    assert!(
        offset_of!(Folded, count) == f::COUNT && offset_of!(Folded, alloc_count) == f::ALLOC_COUNT
    );
    assert!(
        offset_of!(Folded, alloc_bytes) == f::ALLOC_BYTES
            && offset_of!(Folded, denied_count) == f::DENIED
    );
    assert!(
        offset_of!(Folded, downgraded_count) == f::DOWNGRADED
            && offset_of!(Folded, over_budget_count) == f::OVER_BUDGET
    );
    assert!(
        offset_of!(Folded, denied_bytes) == f::DENIED_BYTES
            && offset_of!(Folded, downgraded_bytes) == f::DOWNGRADED_BYTES
    );
    assert!(
        offset_of!(Folded, peak_live_bytes) == f::PEAK
            && offset_of!(Folded, apis) == f::APIS
            && size_of::<Folded>() == f::SIZE
    );
};

static FOLDED: AtomicPtr<Folded> = AtomicPtr::new(std::ptr::null_mut());

/// The aggregate, made at the first fold; `None` before.
pub fn folded() -> Option<&'static Folded> {
    // SAFETY: `FOLDED` holds null or a `Folded` from `folded_record`, never freed.
    unsafe { FOLDED.load(Ordering::Acquire).as_ref() }
}

fn folded_record() -> &'static Folded {
    if let Some(f) = folded() {
        return f;
    }
    let z = || AtomicU64::new(0);
    let f: &'static Folded =
        crate::accounting::arena::leak(pinguard_common::with_callsite_counters!(zeroed {
            Folded {
                count: z(),
                alloc_count: z(),
                alloc_bytes: z(),
                peak_live_bytes: z(),
                apis: [const { AtomicU64::new(0) }; pinguard_common::state::API_WORDS],
            }
        }));
    let p = f as *const Folded as *mut Folded;
    match FOLDED.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            if crate::accounting::arena::holds(p as *const u8) {
                if let Some(w) =
                    crate::accounting::arena::header_word(pinguard_common::state::header::FOLDED)
                {
                    w.store(p as u64, Ordering::Release);
                }
            }
            f
        }
        // SAFETY: another thread's record, from this function, never freed.
        Err(other) => unsafe { &*other },
    }
}

/// Moves a callsite's figures into the aggregate and zeroes them (a reader of the state file
/// sees them in one place or the other).
fn absorb(cs: &Callsite) {
    let f = folded_record();
    let take = |a: &AtomicU64| a.swap(0, Ordering::Relaxed);
    let (count, bytes, peak) = cs.level.drain();
    f.alloc_count.fetch_add(count, Ordering::Relaxed);
    f.alloc_bytes.fetch_add(bytes, Ordering::Relaxed);
    f.peak_live_bytes.fetch_max(peak, Ordering::Relaxed);
    absorb_counters(f, cs);
    for (to, from) in f.apis.iter().zip(&cs.apis) {
        to.fetch_or(take(from), Ordering::Relaxed);
    }
}

/// Folded slots waiting to be reused: (slot, `FOLDS` when it was folded, coarse ms then), oldest
/// first. Slots given back unseen (`intern_slow`'s lost race) go first, with zeros.
static LIMBO: Mutex<std::collections::VecDeque<(&'static Callsite, u64, u64)>> =
    Mutex::new(std::collections::VecDeque::new());
/// Callsites folded so far.
static FOLDS: AtomicU64 = AtomicU64::new(0);
/// A folded slot is reused only after this many more folds and this long: a call that took the
/// callsite just before it was folded (a walk memo, a thread's last callsite) has long finished
/// counting in it by then, and whatever it counted late joins the aggregate (`settle`).
const GRACE_FOLDS: u64 = 256;
const GRACE_MS: u64 = 50;
/// One fold at a time; a thread that finds one under way goes on.
static FOLDING: Mutex<()> = Mutex::new(());

/// A folded slot with room for `len` frames, once its grace has passed.
fn reuse(len: usize) -> Option<&'static Callsite> {
    let mut q = LIMBO.lock();
    if q.is_empty() {
        return None;
    }
    let (folds, now) = (
        FOLDS.load(Ordering::Relaxed),
        crate::runtime::clock::coarse_unix_ms(),
    );
    for i in 0..q.len().min(8) {
        let (cs, at, ms) = q[i];
        if folds.saturating_sub(at) < GRACE_FOLDS || now.saturating_sub(ms) < GRACE_MS {
            break; // the rest are younger
        }
        if cs.frames_cap >= len {
            q.remove(i);
            drop(q);
            return settle(cs).then_some(cs);
        }
    }
    None
}

/// A folded slot about to be reused: what a late call counted in it since it was folded joins
/// the aggregate; one that holds a live allocation now is kept apart for good (listed with the
/// retired ones, never reused), so that the allocation keeps its own callsite.
fn settle(cs: &'static Callsite) -> bool {
    if cs.level.count() != 0 || cs.level.bytes() != 0 {
        RETIRED.lock().push(cs);
        return false;
    }
    if cs.activity() != 0 || cs.level.peak() != 0 {
        absorb(cs);
    }
    true
}

/// `Callsite::seen` of a callsite `fold` has not looked at yet.
const UNSEEN: u64 = u64::MAX;

/// Keeps the table at most `MAX` callsites with nothing live: folds the least useful of them
/// (not used since the last look first, then the smallest peak, the fewest calls, the oldest;
/// never one made since the last look, whose call may still be on its way to count in it)
/// down to `MAX - MAX / 8`, so that the next look is `MAX / 8` new callsites away. Callsites
/// with live allocations are never folded.
fn fold() {
    let Some(_one) = FOLDING.try_lock() else {
        return;
    };
    let max = MAX.load(Ordering::Relaxed);
    let mut idle: Vec<(bool, u64, u64, u32, &'static Callsite)> = Vec::new();
    if idle
        .try_reserve(TABLE_LEN.load(Ordering::Relaxed) + 64)
        .is_err()
    {
        return; // no memory to sort them: the table stays as it is for now
    }
    for shard in &TABLE {
        for &cs in shard.lock().iter().flat_map(|m| m.values()) {
            // The callsite without frames stays (`empty` keeps it at hand).
            if cs.frames().is_empty() || cs.level.count() != 0 {
                continue;
            }
            let a = cs.activity();
            let before = cs.seen.swap(a, Ordering::Relaxed);
            if before == UNSEEN {
                continue; // made since the last look: its first call may not have counted yet
            }
            let recent = before != a;
            if idle.len() < idle.capacity() {
                idle.push((recent, cs.level.peak(), a, cs.id(), cs));
            }
        }
    }
    let keep = max - max / 8;
    if idle.len() > keep {
        let n = idle.len() - keep;
        idle.select_nth_unstable_by_key(n - 1, |&(r, p, a, id, _)| (r, p, a, id));
        let now = crate::runtime::clock::coarse_unix_ms();
        for &(.., cs) in &idle[..n] {
            if take_out(cs, true) {
                // Counted when it did something: one that never did is in no report's list either.
                if cs.activity() != 0 {
                    folded_record().count.fetch_add(1, Ordering::Relaxed);
                }
                absorb(cs);
                let at = FOLDS.fetch_add(1, Ordering::Relaxed);
                LIMBO.lock().push_back((cs, at, now));
            }
        }
    }
    NEXT_FOLD.store(
        TABLE_LEN.load(Ordering::Relaxed) + (max / 8).max(1),
        Ordering::Relaxed,
    );
}

/// Takes `cs` out of the table, unless it left already or (with `idle`) holds a live allocation now.
fn take_out(cs: &'static Callsite, idle: bool) -> bool {
    let mut guard = shard_of(cs.frames()).lock();
    let Some(map) = guard.as_mut() else {
        return false;
    };
    if !map.get(cs.frames()).is_some_and(|c| std::ptr::eq(*c, cs))
        || (idle && cs.level.count() != 0)
    {
        return false;
    }
    map.remove(cs.frames());
    cs.gen.fetch_add(1, Ordering::Release); // odd: no cache takes it for its stack any more
    drop(guard);
    TABLE_LEN.fetch_sub(1, Ordering::Relaxed);
    true
}

type Shard = Mutex<Option<FxHashMap<&'static [usize], &'static Callsite>>>;

fn shard_of(frames: &[usize]) -> &'static Shard {
    let mut h = FxHasher::default();
    frames.hash(&mut h);
    &TABLE[h.finish() as usize % SHARDS]
}

/// The loaded objects the state file lists, by address range. A new callsite with a frame
/// outside all of them has the list read again, so that a dead process's frames can be named
/// from its state (`pinguard_common::state::module`).
static MODULES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// When the list was last read again and found nothing new (coarse ms).
static FRUITLESS_MS: AtomicU64 = AtomicU64::new(0);

fn note_modules(native: &[usize]) {
    let known = |m: &[(usize, usize)]| {
        native
            .iter()
            .all(|&a| m.iter().any(|&(s, e)| a >= s && a < e))
    };
    if known(&MODULES.lock()) {
        return;
    }
    // A frame in no object (generated code, a bad return address) stays unknown: reading the list
    // again for every such callsite would walk every object each time; once a second is enough.
    let now = crate::runtime::clock::coarse_unix_ms();
    if now.saturating_sub(FRUITLESS_MS.load(Ordering::Relaxed)) < 1000 {
        return;
    }
    let mut found = Vec::new();
    crate::runtime::objects::for_each_object(|o| {
        found.push((
            o.start,
            o.end,
            o.base,
            o.name.to_bytes().to_vec(),
            o.build_id.clone(),
        ))
    });
    let mut list = MODULES.lock();
    let before = list.len();
    for (start, end, base, name, build_id) in found {
        if list.contains(&(start, end)) {
            continue;
        }
        list.push((start, end));
        let path = if name.is_empty() {
            crate::runtime::kernel::exe().into_bytes()
        } else {
            name
        };
        let path = crate::accounting::arena::leak_slice(&path);
        let id = crate::accounting::arena::leak_slice(build_id.as_deref().unwrap_or("").as_bytes());
        let rec: &'static mut [u64; 8] = crate::accounting::arena::leak([
            0,
            base as u64,
            start as u64,
            end as u64,
            path.as_ptr() as u64,
            path.len() as u64,
            id.as_ptr() as u64,
            id.len() as u64,
        ]);
        crate::accounting::arena::push(
            pinguard_common::state::header::MODULES,
            rec.as_ptr() as *const u8,
        );
    }
    if list.len() == before {
        FRUITLESS_MS.store(now, Ordering::Relaxed);
    }
}

const _: () = {
    use pinguard_common::state::module as m;
    assert!(m::SIZE == 64 && m::BASE == 8 && m::START == 16 && m::END == 24);
    assert!(m::PATH == 32 && m::PATH_LEN == 40 && m::BUILD_ID == 48 && m::BUILD_ID_LEN == 56);
};

/// The Python frames of a key as the state file keeps them: a line each.
fn py_text(frames: &[usize]) -> String {
    let mut text = String::new();
    if let Some(i) = frames.iter().position(|&a| a == PYTHON) {
        for &id in &frames[i + 1..] {
            crate::capture::python::frame(id, |f| {
                let sep = pinguard_common::state::site::PY_SEP;
                text.push_str(&format!("{}{sep}{}{sep}{}\n", f.file, f.function, f.line));
            });
        }
    }
    text
}

/// Callsites taken out of the table by `retire`, and folded ones that took a live allocation
/// late (`settle`): still reported, never found by `intern`, never reused.
static RETIRED: Mutex<Vec<&'static Callsite>> = Mutex::new(Vec::new());

/// Takes callsites out of the table, with the names of their frames in a closed object.
pub fn retire(sites: Vec<(&'static Callsite, Closed)>) {
    for (cs, closed) in sites {
        let kept = if take_out(cs, false) {
            RETIRED.lock().push(cs);
            true
        } else {
            RETIRED.lock().iter().any(|c| std::ptr::eq(*c, cs))
        };
        // A callsite folded meanwhile is not named: its slot may hold another stack by now.
        if kept {
            cs.closed.lock().push(closed);
        }
    }
}

/// Every callsite a report lists: the table's, the retired ones, and folded ones in which a late
/// call counted something not yet in the aggregate (`settle`).
pub fn all() -> Vec<&'static Callsite> {
    let mut v = RETIRED.lock().clone();
    for shard in &TABLE {
        if let Some(map) = shard.lock().as_ref() {
            v.extend(map.values().copied());
        }
    }
    v.extend(
        LIMBO
            .lock()
            .iter()
            .map(|e| e.0)
            .filter(|c| c.activity() != 0 || c.level.count() != 0),
    );
    v.sort_by_key(|c| c.id());
    v
}

/// Fork support: hold every shard across `fork()` so the child never inherits a held lock.
pub fn hold() {
    lock::hold(&FOLDING);
    lock::hold(&MODULES);
    lock::hold(&RETIRED);
    for shard in &TABLE {
        lock::hold(shard);
    }
    lock::hold(&LIMBO);
}

/// # Safety
/// Only after `hold` on this thread.
pub unsafe fn let_go(clear: bool) {
    if clear {
        NEXT_ID.store(0, Ordering::Relaxed);
        // The forking thread's cache points at the parent's callsites, with the parent's figures.
        RECENT_SITES.with(|r| r.set([(0, 0); RECENT]));
        LAST.with(|l| l.set(0));
        EMPTY.store(std::ptr::null_mut(), Ordering::Relaxed);
        // The parent's aggregate stays in the parent's state; the child's callsites start again.
        FOLDED.store(std::ptr::null_mut(), Ordering::Relaxed);
        TABLE_LEN.store(0, Ordering::Relaxed);
        NEXT_FOLD.store(MAX.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    for shard in &TABLE {
        if clear {
            // The callsites themselves stay allocated (live records of other threads that no
            // longer exist in the child may point at them); only the index is forgotten.
            // SAFETY: `hold` holds the shard's lock on this thread, so nothing else reaches the
            // data; `clear` is the fork child's handler, where the lock is reset.
            unsafe {
                *shard.data_ptr() = None;
                lock::let_go_in_child(shard);
            }
        } else {
            // SAFETY: `hold` took this shard's lock on this thread (this function's contract).
            unsafe { lock::let_go_in_parent(shard) };
        }
    }
    if clear {
        // SAFETY: as for the shards above: all held by `hold`, in the child's handler.
        unsafe {
            *RETIRED.data_ptr() = Vec::new();
            lock::let_go_in_child(&RETIRED);
            *MODULES.data_ptr() = Vec::new();
            lock::let_go_in_child(&MODULES);
            *LIMBO.data_ptr() = std::collections::VecDeque::new();
            lock::let_go_in_child(&LIMBO);
            lock::let_go_in_child(&FOLDING);
        }
    } else {
        // SAFETY: `hold` took these locks on this thread (this function's contract).
        unsafe {
            lock::let_go_in_parent(&RETIRED);
            lock::let_go_in_parent(&MODULES);
            lock::let_go_in_parent(&LIMBO);
            lock::let_go_in_parent(&FOLDING);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_callsites_beyond_the_most_are_folded_live_ones_kept_and_old_tags_refused() {
        set_max(8);
        let key = |i: usize| [0x1000 + i, 0x7a5e_0000, 0x7a5e_0008];
        let live = intern(&key(1000));
        live.level.live(0, 4096, 1);
        let first = intern(&key(0));
        first.level.alloc(0, 4096);
        let old = tag(first).expect("a tag for a callsite in the table");
        for i in 1..200 {
            intern(&key(i)).level.alloc(0, 4096);
        }
        // SAFETY: `old` comes from `tag`.
        let named = unsafe { from_tag(old) };
        assert!(named.is_none(), "a folded callsite's tag names nothing");
        assert!(
            std::ptr::eq(intern(&key(1000)), live),
            "a callsite with a live allocation stays"
        );
        let f = folded().expect("an aggregate");
        let listed: u64 = all()
            .iter()
            .filter(|c| c.frames().get(1) == Some(&0x7a5e_0000))
            .map(|c| c.level.alloc_count())
            .sum();
        assert_eq!(
            listed + f.alloc_count.load(Ordering::Relaxed),
            200,
            "every call counted once"
        );
        assert!(
            f.count.load(Ordering::Relaxed) >= 180,
            "{}",
            f.count.load(Ordering::Relaxed)
        );
        assert!(
            TABLE_LEN.load(Ordering::Relaxed) <= 12,
            "{}",
            TABLE_LEN.load(Ordering::Relaxed)
        );
        // A folded stack that comes back is interned anew, with nothing of its old figures.
        let again = intern(&key(0));
        assert_eq!(
            (again.frames(), again.level.alloc_count()),
            (&key(0)[..], 0)
        );
        live.level.release(0, 4096);
        set_max(pinguard_common::vars::DEFAULT_MAX_CALLSITES);
    }
}
