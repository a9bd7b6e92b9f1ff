//! Callsites: distinct stacks, deduplicated, each with its own counters.
//!
//! A callsite is allocated once and never freed, so live records and events hold a plain
//! `&'static Callsite` and update its counters without taking any lock.

use crate::api::Api;
use crate::runtime::lock::{self, Mutex};
use rustc_hash::{FxHashMap, FxHasher};
use std::cell::Cell;
use std::hash::{Hash, Hasher};
use crate::accounting::level::Level;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Callsites live in the state file (`arena`), in the layout its readers know
/// (`pinguard_report::state::site`, checked below), with their frames and their Python frames as
/// text; the fields after `level` are the process's own.
#[repr(C)]
pub struct Callsite {
    /// The next older callsite in the state file's list.
    state_next: AtomicU64,
    pub id: u32,
    /// The key (`frames()`), in the arena.
    frames_at: *const usize,
    frames_len: usize,
    /// The Python frames as text, for readers of the state file only.
    py_at: *const u8,
    py_len: usize,
    pub denied_count: AtomicU64,
    pub downgraded_count: AtomicU64,
    /// Bit per `Api` this callsite called.
    pub apis: AtomicU64,
    /// Calls pinned over the budget under `warn`.
    pub over_budget_count: AtomicU64,
    /// Live bytes and count, their peak, allocations: striped by thread (`level`).
    pub level: Level<4>,
    /// Set once the `warn` policy has logged this callsite.
    pub warned: AtomicBool,
    /// Set when an object its frames lie in was closed (`unload`).
    pub retired: AtomicBool,
    /// Whether `PINGUARD_DOWNGRADE_MATCH` takes it in: 0 not asked yet, 1 yes, 2 no (the patterns
    /// are the process's for its whole life, and so are the callsite's frames).
    pub scope: AtomicU8,
    /// The names those frames had while the object was loaded.
    pub closed: Mutex<Vec<Closed>>,
}

const _: () = {
    use pinguard_report::state::site as s;
    use std::mem::offset_of;
    assert!(offset_of!(Callsite, state_next) == s::NEXT && offset_of!(Callsite, id) == s::ID && offset_of!(Callsite, apis) == s::APIS);
    assert!(offset_of!(Callsite, frames_at) == s::FRAMES && offset_of!(Callsite, frames_len) == s::NFRAMES);
    assert!(offset_of!(Callsite, py_at) == s::PY && offset_of!(Callsite, py_len) == s::PY_LEN);
    assert!(offset_of!(Callsite, denied_count) == s::DENIED && offset_of!(Callsite, downgraded_count) == s::DOWNGRADED);
    assert!(offset_of!(Callsite, over_budget_count) == s::OVER_BUDGET);
    assert!(offset_of!(Callsite, level) == s::LEVEL && offset_of!(Callsite, apis) == s::APIS);
    assert!(Api::COUNT <= 64, "a bit per entry point in `apis`");
};

// SAFETY: the raw pointers point at immutable data that lives as long as the process (the
// arena, or leaked heap memory); everything mutable is atomic or behind a lock.
unsafe impl Sync for Callsite {}
// SAFETY: as above.
unsafe impl Send for Callsite {}

/// Frames of a callsite inside an object that has since been closed, named while it was loaded.
pub struct Closed {
    pub frames: Vec<(usize, Vec<pinguard_report::Frame>)>,
    pub module: pinguard_report::Module,
}

/// Separates the native return addresses from the Python frame ids in a callsite's key.
pub const PYTHON: usize = usize::MAX;

impl Callsite {
    /// The key: return addresses, innermost first (the first is in the code that called the
    /// hooked API), then `PYTHON` and the Python frame ids when there are any.
    #[inline]
    pub fn frames(&self) -> &'static [usize] {
        if self.frames_len == 0 {
            return &[];
        }
        // SAFETY: `frames_at` and `frames_len` come from one `arena::leak_slice`, never freed.
        unsafe { std::slice::from_raw_parts(self.frames_at, self.frames_len) }
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
        let bit = 1u64 << api as u32;
        if self.apis.load(Ordering::Relaxed) & bit == 0 {
            self.apis.fetch_or(bit, Ordering::Relaxed);
        }
    }
}

/// A callsite as a plain word, for a cache outside this stage to hold (`stack::tag`): never 0.
pub fn tag(cs: &'static Callsite) -> usize {
    cs as *const Callsite as usize
}

/// The callsite a `tag` names, unless it has been retired since (its object was closed).
///
/// # Safety
/// `tag` must come from `tag` (callsites are leaked, never freed).
#[inline]
pub unsafe fn from_tag(tag: usize) -> Option<&'static Callsite> {
    // SAFETY: the caller's contract: `tag` is the address of a leaked callsite.
    let cs = unsafe { &*(tag as *const Callsite) };
    (!cs.retired.load(Ordering::Relaxed)).then_some(cs)
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
    (cs.frames() == frames && !cs.retired.load(Ordering::Relaxed)).then_some(cs)
}

fn intern_slow(hash: u64, frames: &[usize]) -> &'static Callsite {
    let shard = &TABLE[hash as usize % SHARDS];
    if let Some(cs) = shard.lock().as_ref().and_then(|m| m.get(frames).copied()) {
        return cs;
    }
    // Made outside the table's lock: its Python frames' text takes the Python table's lock, and
    // the module list walks the loaded objects.
    let py = py_text(frames);
    let py = crate::accounting::arena::leak_slice(py.as_bytes());
    let key = crate::accounting::arena::leak_slice(frames);
    let mut guard = shard.lock();
    let map = guard.get_or_insert_with(FxHashMap::default);
    if let Some(cs) = map.get(frames) {
        return cs; // another thread made it meanwhile; the copies above stay unused
    }
    let cs: &'static Callsite = crate::accounting::arena::leak(Callsite {
        state_next: AtomicU64::new(0),
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        apis: AtomicU64::new(0),
        frames_at: key.as_ptr(),
        frames_len: key.len(),
        py_at: py.as_ptr(),
        py_len: py.len(),
        denied_count: AtomicU64::new(0),
        downgraded_count: AtomicU64::new(0),
        over_budget_count: AtomicU64::new(0),
        level: Level::NEW,
        warned: AtomicBool::new(false),
        retired: AtomicBool::new(false),
        scope: AtomicU8::new(0),
        closed: Mutex::new(Vec::new()),
    });
    map.insert(cs.frames(), cs);
    drop(guard);
    note_modules(cs.native());
    crate::accounting::arena::push(pinguard_report::state::header::CALLSITES, cs as *const Callsite as *const u8);
    cs
}

/// The loaded objects the state file lists, by address range. A new callsite with a frame
/// outside all of them has the list read again, so that a dead process's frames can be named
/// from its state (`pinguard_report::state::module`).
static MODULES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// When the list was last read again and found nothing new (coarse ms).
static FRUITLESS_MS: AtomicU64 = AtomicU64::new(0);

fn note_modules(native: &[usize]) {
    let known = |m: &[(usize, usize)]| native.iter().all(|&a| m.iter().any(|&(s, e)| a >= s && a < e));
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
    crate::runtime::objects::for_each_object(|o| found.push((o.start, o.end, o.base, o.name.to_bytes().to_vec(), o.build_id.clone())));
    let mut list = MODULES.lock();
    let before = list.len();
    for (start, end, base, name, build_id) in found {
        if list.contains(&(start, end)) {
            continue;
        }
        list.push((start, end));
        let path = if name.is_empty() { crate::runtime::kernel::exe().into_bytes() } else { name };
        let path = crate::accounting::arena::leak_slice(&path);
        let id = crate::accounting::arena::leak_slice(build_id.as_deref().unwrap_or("").as_bytes());
        let rec: &'static mut [u64; 8] = crate::accounting::arena::leak([0, base as u64, start as u64, end as u64, path.as_ptr() as u64, path.len() as u64, id.as_ptr() as u64, id.len() as u64]);
        crate::accounting::arena::push(pinguard_report::state::header::MODULES, rec.as_ptr() as *const u8);
    }
    if list.len() == before {
        FRUITLESS_MS.store(now, Ordering::Relaxed);
    }
}

const _: () = {
    use pinguard_report::state::module as m;
    assert!(m::SIZE == 64 && m::BASE == 8 && m::START == 16 && m::END == 24);
    assert!(m::PATH == 32 && m::PATH_LEN == 40 && m::BUILD_ID == 48 && m::BUILD_ID_LEN == 56);
};

/// The Python frames of a key as the state file keeps them: a line each.
fn py_text(frames: &[usize]) -> String {
    let mut text = String::new();
    if let Some(i) = frames.iter().position(|&a| a == PYTHON) {
        for &id in &frames[i + 1..] {
            crate::capture::python::frame(id, |f| {
                let sep = pinguard_report::state::site::PY_SEP;
                text.push_str(&format!("{}{sep}{}{sep}{}\n", f.file, f.function, f.line));
            });
        }
    }
    text
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
        cs.frames().hash(&mut h);
        if let Some(map) = TABLE[h.finish() as usize % SHARDS].lock().as_mut() {
            if map.get(cs.frames()).is_some_and(|c| std::ptr::eq(*c, cs)) {
                map.remove(cs.frames());
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
    lock::hold(&MODULES);
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
            // SAFETY: `lock_all` holds the shard's lock on this thread, so nothing else reaches the
            // data; `clear` is the fork child's handler, where the lock is reset.
            unsafe {
                *shard.data_ptr() = None;
                lock::release_in_child(shard);
            }
        } else {
            // SAFETY: `lock_all` took this shard's lock on this thread (this function's contract).
            unsafe { lock::release_in_parent(shard) };
        }
    }
    if clear {
        // SAFETY: as for the shards above: both held by `lock_all`, in the child's handler.
        unsafe {
            *RETIRED.data_ptr() = Vec::new();
            lock::release_in_child(&RETIRED);
            *MODULES.data_ptr() = Vec::new();
            lock::release_in_child(&MODULES);
        }
    } else {
        // SAFETY: `lock_all` took both locks on this thread (this function's contract).
        unsafe {
            lock::release_in_parent(&RETIRED);
            lock::release_in_parent(&MODULES);
        }
    }
}
