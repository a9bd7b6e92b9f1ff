//! Callsites: distinct stacks, deduplicated, each with its own counters.
//!
//! A callsite is allocated once and never freed, so live records and events hold a plain
//! `&'static Callsite` and update its counters without taking any lock.

use crate::api::Api;
use crate::lock::{self, Mutex};
use rustc_hash::{FxHashMap, FxHasher};
use std::cell::Cell;
use std::hash::{Hash, Hasher};
use crate::level::Level;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};

pub struct Callsite {
    pub id: u32,
    /// The key: return addresses, innermost first (the first is in the code that called the
    /// hooked API), then `PYTHON` and the Python frame ids when there are any.
    pub frames: Box<[usize]>,
    /// Live bytes and count, their peak, allocations: striped by thread (`level`).
    pub level: Level<4>,
    pub denied_count: AtomicU64,
    pub downgraded_count: AtomicU64,
    /// Bit per `Api` this callsite called.
    pub apis: AtomicU32,
    /// Set once the `warn` policy has logged this callsite.
    pub warned: AtomicBool,
    /// Set when an object its frames lie in was closed (`unload`).
    pub retired: AtomicBool,
    /// The names those frames had while the object was loaded.
    pub closed: Mutex<Vec<Closed>>,
}

/// Frames of a callsite inside an object that has since been closed, named while it was loaded.
pub struct Closed {
    pub frames: Vec<(usize, Vec<pinguard_report::Frame>)>,
    pub module: pinguard_report::Module,
}

/// Separates the native return addresses from the Python frame ids in a callsite's key.
pub const PYTHON: usize = usize::MAX;

impl Callsite {
    /// The native return addresses, innermost first.
    pub fn native(&self) -> &[usize] {
        let end = self.frames.iter().position(|&a| a == PYTHON).unwrap_or(self.frames.len());
        &self.frames[..end]
    }

    /// The interned Python frames (`python::frame`), innermost first.
    pub fn python(&self) -> &[usize] {
        match self.frames.iter().position(|&a| a == PYTHON) {
            Some(i) => &self.frames[i + 1..],
            None => &[],
        }
    }

    pub fn note_api(&self, api: Api) {
        let bit = 1 << api as u32;
        if self.apis.load(Ordering::Relaxed) & bit == 0 {
            self.apis.fetch_or(bit, Ordering::Relaxed);
        }
    }
}

const SHARDS: usize = 16;

static TABLE: [Mutex<Option<FxHashMap<&'static [usize], &'static Callsite>>>; SHARDS] =
    [const { Mutex::new(None) }; SHARDS];
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
    let cs = intern(&[]);
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
    let recent: &Cell<[(u64, usize)]> = RECENT_SITES.with(|r| unsafe { &*(r as *const Cell<[(u64, usize); RECENT]>) });
    let recent = recent.as_slice_of_cells();
    let cs = match recent.iter().map(Cell::get).find(|&(rh, _)| rh == hash).and_then(|(_, p)| live_match(p, frames)) {
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

/// The callsite at `p` (0: none) if it has exactly these frames and is still in the table.
#[inline]
fn live_match(p: usize, frames: &[usize]) -> Option<&'static Callsite> {
    // SAFETY: `p` is 0 or the address of a callsite from `intern_slow`, which leaks every callsite
    // and never frees one (retired ones included).
    let cs = unsafe { (p as *const Callsite).as_ref()? };
    (*cs.frames == *frames && !cs.retired.load(Ordering::Relaxed)).then_some(cs)
}

fn intern_slow(hash: u64, frames: &[usize]) -> &'static Callsite {
    let shard = &TABLE[hash as usize % SHARDS];
    let mut map = shard.lock();
    let map = map.get_or_insert_with(FxHashMap::default);
    if let Some(cs) = map.get(frames) {
        return cs;
    }
    let cs: &'static Callsite = Box::leak(Box::new(Callsite {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        frames: frames.into(),
        level: Level::NEW,
        denied_count: AtomicU64::new(0),
        downgraded_count: AtomicU64::new(0),
        apis: AtomicU32::new(0),
        warned: AtomicBool::new(false),
        retired: AtomicBool::new(false),
        closed: Mutex::new(Vec::new()),
    }));
    map.insert(&cs.frames, cs);
    cs
}

/// Callsites taken out of the table by `retire`: still reported, never found by `intern`.
static RETIRED: Mutex<Vec<&'static Callsite>> = Mutex::new(Vec::new());

/// Takes callsites out of the table, with the names of their frames in a closed object.
pub fn retire(sites: Vec<(&'static Callsite, Closed)>) {
    for (cs, closed) in sites {
        cs.closed.lock().push(closed);
        if cs.retired.swap(true, Ordering::AcqRel) {
            continue;
        }
        let mut h = FxHasher::default();
        cs.frames.hash(&mut h);
        if let Some(map) = TABLE[h.finish() as usize % SHARDS].lock().as_mut() {
            if map.get(&*cs.frames).is_some_and(|c| std::ptr::eq(*c, cs)) {
                map.remove(&*cs.frames);
            }
        }
        RETIRED.lock().push(cs);
    }
}

pub fn all() -> Vec<&'static Callsite> {
    let mut v = RETIRED.lock().clone();
    for shard in &TABLE {
        if let Some(map) = shard.lock().as_ref() {
            v.extend(map.values().copied());
        }
    }
    v.sort_by_key(|c| c.id);
    v
}

/// Fork support: hold every shard across `fork()` so the child never inherits a held lock.
pub fn lock_all() {
    lock::hold(&RETIRED);
    for shard in &TABLE {
        lock::hold(shard);
    }
}

/// # Safety
/// Only after `lock_all` on this thread.
pub unsafe fn unlock_all(clear: bool) {
    if clear {
        NEXT_ID.store(0, Ordering::Relaxed);
        // The forking thread's cache points at the parent's callsites, with the parent's figures.
        RECENT_SITES.with(|r| r.set([(0, 0); RECENT]));
        LAST.with(|l| l.set(0));
        EMPTY.store(std::ptr::null_mut(), Ordering::Relaxed);
    }
    for shard in &TABLE {
        if clear {
            // The callsites themselves stay allocated (live records of other threads that no
            // longer exist in the child may point at them); only the index is forgotten.
            *shard.data_ptr() = None;
            lock::release_in_child(shard);
        } else {
            lock::release_in_parent(shard);
        }
    }
    if clear {
        *RETIRED.data_ptr() = Vec::new();
        lock::release_in_child(&RETIRED);
    } else {
        lock::release_in_parent(&RETIRED);
    }
}
