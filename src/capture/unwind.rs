//! The fast stack walk behind `stack::capture`: framehop over each loaded object's
//! `.eh_frame_hdr` and `.eh_frame`, read where the loader mapped them, with a rule cache per
//! thread.
//!
//! Why not libgcc's unwinder (`backtrace`): about 2.9 µs for 32 frames, and the loader's lock on
//! every walk. A walk here takes no lock and writes no shared memory: each thread keeps its own
//! copy of the object list and its own rule cache, and refreshes them when the process-wide
//! generation moves; the generation moves on `dlclose` (our hook) and when a return address lies
//! in no known object while the loader's load count has changed (a `dlopen`; `dlopen` itself is
//! not hooked, because glibc resolves `$ORIGIN` and namespaces from its caller's address). A
//! thread that ends leaves its copies to the next one to start (`SPARE`).
//!
//! What keeps a walk from faulting: stack words are read only inside the calling thread's own
//! stack, above the walk's own stack pointer, so a corrupt frame pointer or CFA ends the walk.
//! Unwind tables are read in place, and an object's tables are read only for an address inside
//! it, that is while its code is on this thread's stack (it cannot be unloaded under us); a
//! `dlclose` moves the generation before another object can be mapped at the same address, so a
//! stale table is never read for new code. A hook whose frame is outside its thread's known
//! stack (a signal's alternate stack, a coroutine's) gets `None` and the caller falls back to
//! libgcc's unwinder.

use crate::runtime::lock::Mutex;
use framehop::{ExplicitModuleSectionInfo, MayAllocateDuringUnwind, Module, Unwinder};
use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

type Tables = framehop::UnwinderNative<&'static [u8], MayAllocateDuringUnwind>;
type Cache = framehop::CacheNative<MayAllocateDuringUnwind>;

/// The generation every thread should be on; bumped by `dlclose` and by a changed load count.
static WANTED: AtomicU64 = AtomicU64::new(1);

struct Shared {
    generation: u64,
    tables: Tables,
    /// Sorted address ranges of the executable segments of the objects in `tables`: a return
    /// address lies in one, and a walk stops at a frame that does not (`walk_from`).
    ranges: Vec<(u64, u64)>,
    /// The loader's (adds, subs) when `tables` was built.
    loads: (u64, u64),
}

static SHARED: Mutex<Option<Shared>> = Mutex::new(None);

/// Aligned to 128 bytes (and so a multiple of it long): a walk writes here, and a line shared
/// with another thread's data (its walker, its memos) would pass between their cores on every
/// call when two threads pin at once.
#[repr(align(128))]
struct Local {
    generation: u64,
    tables: Tables,
    ranges: Vec<(u64, u64)>,
    loads: (u64, u64),
    cache: Cache,
    /// The rule cache of `remember`'s test walks, made on the first. Not `cache`: where a rule
    /// cannot be cached (libffi's `ffi_call_unix64`, whose frame is found from the frame pointer
    /// plus 32), framehop caches its frame-pointer fallback when evaluating it fails, and a
    /// garbled frame pointer makes it fail. In `cache`, every later walk through that address
    /// would take the fallback and end in a stack address (issue 34, item 4; docs/field-notes.md).
    scratch: Option<Cache>,
    /// The highest address of this thread's stack (0: unknown, the walk is not attempted).
    stack_top: u64,
    stack_bottom: u64,
    /// The stack words the current walk read, in order.
    reads: Vec<(u64, u64)>,
    /// Recent walks and the stack words each read (see `recall`).
    /// Most recently used first.
    memos: Vec<Memo>,
    /// The memo the latest walk matched or made (`usize::MAX`: none), for `tag`.
    hit: usize,
}

/// A finished walk. A walk is a function of its start registers, the object tables (one
/// generation) and the stack words it reads: when all of those are as they were, its frames are
/// too. Checking that costs a load per word read, where walking costs a rule look-up per frame,
/// and a DWARF parse whenever two return addresses share a slot of framehop's direct-mapped rule
/// cache (which, with address-space randomisation, some runs of a loop always hit).
struct Memo {
    from: Regs,
    /// The walk did not depend on the start frame pointer (see `remember`): code without frame
    /// pointers keeps arbitrary values in that register, which must not defeat the memo.
    fp_free: bool,
    generation: u64,
    depth: usize,
    reads: Vec<(u64, u64)>,
    /// The same words as `reads`, as checked (`still`): each word's offset from the start stack
    /// pointer, and the value read there.
    offsets: Vec<u32>,
    values: Vec<u64>,
    frames: Vec<usize>,
    /// What the caller made of these frames (its callsite), handed back by `recall_tag` instead
    /// of the frames: 0 until `tag` sets it.
    tag: usize,
}

const MEMOS: usize = 8;

/// This thread's walker and whether it is walking, in one thread-local: one look-up per walk.
struct Walker {
    /// This thread's walker, made on its first walk. The thread-local itself has no destructor:
    /// one with a destructor registers it through `__cxa_thread_atexit_impl`, which `calloc`s,
    /// and a first walk can run inside a signal handler that interrupted `malloc`. The walker is
    /// freed by a pthread key's destructor instead (`KEY`).
    local: Cell<*mut Local>,
    /// Set while this thread walks: a nested walk (none is expected: hooks do not nest) gets `None`.
    walking: Cell<bool>,
}

thread_local! {
    static WALKER: Walker = const { Walker { local: Cell::new(std::ptr::null_mut()), walking: Cell::new(false) } };
}

/// This thread's `Walker`.
#[inline(always)]
fn walker() -> &'static Walker {
    // SAFETY: a destructor-less thread-local lives as long as its thread, and `Walker` is !Sync,
    // so the reference never leaves the thread that owns it.
    WALKER.with(|w| unsafe { &*(w as *const Walker) })
}

static KEY: std::sync::OnceLock<Option<libc::pthread_key_t>> = std::sync::OnceLock::new();

/// Frees a thread's walker when the thread ends.
unsafe extern "C" fn free_local(p: *mut c_void) {
    let w = walker();
    if w.local.get() == p as *mut Local {
        w.local.set(std::ptr::null_mut());
    }
    let p = p as *mut Local;
    let empty = |slot: &AtomicPtr<Local>| {
        slot.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    };
    if !SPARE.iter().any(empty) {
        // SAFETY: `p` came from `Box::into_raw` in `make_local` and is handed to this destructor
        // once; no slot took it.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Walkers of ended threads, for the next threads to start (`spare`): a new thread's first walks
/// with a fresh walker cost about 30,000 instructions more at 32 frames than with a used one
/// (copying the object tables, allocating and zeroing two rule caches of 509 entries, and parsing
/// the DWARF rule of every frame twice or three times into them: the walk and `remember`'s test
/// walks), which threads of 1,000 pairs each pay 30 times a pair. A rule cache holds rules by
/// code address and table generation, the same for every thread, so an ended thread's is as good
/// as new, and warm. At most `SPARE.len()` wait here (a walker's caches and buffers: some tens of KiB
/// each at 32 frames); the rest are freed. Atomic swaps, no lock: a slot is taken
/// or given whole, in a signal handler too, and a fork child finds each slot full or empty.
static SPARE: [AtomicPtr<Local>; 4] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 4];

/// An ended thread's walker made this thread's, for a stack `[bottom, top)`: what holds for any
/// thread (the tables of its generation, its rule caches) stays. Its memos stay where this
/// thread's stack is the mapping the other thread's was (glibc hands an ended thread's stack to the
/// next thread it starts): a memo only reads words between its start frame, which must lie on this
/// thread's stack to match, and the top, now this stack's top; and a memo is a function of the
/// registers, the generation and the words it reads, whichever thread reads them. Else they go.
fn spare(bottom: u64, top: u64) -> Option<Box<Local>> {
    SPARE.iter().find_map(|slot| {
        let p = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: a slot holds null or a walker `free_local` gave up (from `Box::into_raw`), and the
        // swap took it out of the slot: this thread owns it alone now.
        let mut local = (!p.is_null()).then(|| unsafe { Box::from_raw(p) })?;
        if (local.stack_bottom, local.stack_top) != (bottom, top) {
            local.memos.clear();
        }
        local.stack_bottom = bottom;
        local.stack_top = top;
        local.reads.clear();
        local.hit = usize::MAX;
        Some(local)
    })
}

/// This thread's walker, made on first use. `None`: its stack is unknown.
#[inline(always)]
fn local(w: &Walker, sp: u64) -> Option<&'static mut Local> {
    let p = w.local.get();
    if !p.is_null() {
        // SAFETY: made in `make_local` for this thread and freed only at its end; `walking`
        // keeps the mutable borrow unique.
        return Some(unsafe { &mut *p });
    }
    make_local(w, sp)
}

/// Reading `/proc/self/maps`, building the rule cache and the key take kilobytes of stack: all of
/// it on pinguard's own (a hook asks for its memo on the caller's).
#[cold]
#[inline(never)]
fn make_local(w: &Walker, sp: u64) -> Option<&'static mut Local> {
    let t = crate::runtime::guard::here();
    crate::runtime::workstack::run(t, || make_local_here(w, sp))
}

fn make_local_here(w: &Walker, sp: u64) -> Option<&'static mut Local> {
    let (bottom, top) = thread_stack(sp)?;
    let p = Box::into_raw(spare(bottom, top).unwrap_or_else(|| Box::new(Local::new(bottom, top))));
    w.local.set(p);
    let key = KEY.get_or_init(|| {
        let mut key = 0;
        // SAFETY: `key` is a valid out-pointer; the destructor has the signature pthread wants.
        (unsafe { libc::pthread_key_create(&mut key, Some(free_local)) } == 0).then_some(key)
    });
    // glibc `calloc`s a second-level block for keys from 32 up: then the walker stays with the
    // ended thread rather than risk that inside a signal handler.
    if let Some(key) = key.filter(|&k| (k as usize) < crate::runtime::guard::PTHREAD_KEY_INLINE) {
        // SAFETY: a key of ours; the value is this thread's walker.
        unsafe { libc::pthread_setspecific(key, p as *const c_void) };
    }
    // SAFETY: as above.
    Some(unsafe { &mut *p })
}

/// Whether every stack word a walk from `sp` read (at `sp + offsets[i]`) still holds the value it
/// read (`values[i]`). Four words at a time, a few instructions a word; a memo of another stack
/// from the same frame (the same function called from elsewhere) stops at the first four that
/// differ.
///
/// # Safety
/// Every `sp + offset` must be a readable word: the caller's memo is of a walk from this same
/// stack pointer, which only read words in `[sp, stack_top)`, and that frame is live on this
/// thread's stack.
#[inline]
unsafe fn still(sp: u64, offsets: &[u32], values: &[u64]) -> bool {
    let base = sp as *const u8;
    // SAFETY: the caller's contract: each `base + offset` is a readable word of this stack.
    let word = |o: u32| unsafe { std::ptr::read_volatile(base.add(o as usize) as *const u64) };
    let (o4, v4) = (offsets.chunks_exact(4), values.chunks_exact(4));
    let (orest, vrest) = (o4.remainder(), v4.remainder());
    for (o, v) in o4.zip(v4) {
        if (word(o[0]) ^ v[0]) | (word(o[1]) ^ v[1]) | (word(o[2]) ^ v[2]) | (word(o[3]) ^ v[3])
            != 0
        {
            return false;
        }
    }
    orest.iter().zip(vrest).all(|(&o, &v)| word(o) == v)
}

/// What a word read becomes when `remember` tests whether it mattered: no stack address or
/// frame pointer stays one after this (its high bits flip).
const GARBAGE: u64 = 0x5a5a_0000_0a50;

/// Upper bound on frames visited, own frames included: a cycle in a corrupt stack ends here.
const MAX_VISITED: usize = 512;

/// Where a walk starts: the program counter, stack pointer and frame pointer of one frame.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Regs {
    pc: u64,
    sp: u64,
    fp: u64,
    /// aarch64's link register: the return address while the function has not saved it yet
    /// (the compiler may take these registers before the prologue); 0 on x86-64.
    // Read on aarch64 only.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    lr: u64,
}

impl Regs {
    /// No frame: for a call that never walks (a release), which need not take the registers.
    pub const NONE: Regs = Regs {
        pc: 0,
        sp: 0,
        fp: 0,
        lr: 0,
    };

    /// This point of the calling function (inlined into it). A walk may start from here as long
    /// as that function has not returned: its frame, and the return address and saved registers
    /// in it, stay as they are while it runs deeper calls. The hooks take it on entry, so a walk
    /// does not unwind pinguard's own frames one by one.
    #[inline(always)]
    pub fn here() -> Regs {
        registers()
    }
}

/// Fills `out` with up to `out.len()` return addresses, starting from `from` (the frame of a
/// hook, still running) and leaving out pinguard's own frames at the start. `None`: this thread
/// cannot walk here (see the module's comment).
#[inline(never)]
pub fn walk(from: Regs, out: &mut [usize]) -> Option<usize> {
    on_own_stack(from, |local| {
        local.hit = usize::MAX;
        if let Some(n) = local.recall(from, out) {
            return Some(n);
        }
        let (mut n, mut missed) = local.walk_from(from, out, &[], false);
        if missed.is_some() && local.loads != loader_counts() {
            WANTED.fetch_add(1, Ordering::AcqRel);
            local.refresh();
            (n, missed) = local.walk_from(from, out, &[], false);
        }
        if missed.is_some_and(|a| a >= local.stack_bottom && a < local.stack_top) {
            // A stack address where a return address belongs: a rule the cache took from an
            // earlier walk through a broken frame (framehop caches its frame-pointer fallback
            // where evaluating a rule failed) may have read it. Once more with a fresh cache.
            local.cache = Cache::new();
            (n, missed) = local.walk_from(from, out, &[], false);
        }
        if missed.is_none() {
            local.remember(from, &out[..n], out.len());
        }
        Some(n)
    })
}

/// The tag (`tag`) of a remembered walk of `depth` frames from `from` that still holds, without
/// copying its frames: what the caller made of them last time is what it would make now.
#[inline(never)]
pub fn recall_tag(from: &Regs, depth: usize) -> Option<usize> {
    let from = *from;
    on_own_stack(from, |local| {
        let i = local.find(from, depth)?;
        Some(local.memos[i].tag).filter(|&t| t != 0)
    })
}

/// Tags the walk this thread just made or recalled from `from` (`walk`) with what the caller made
/// of its frames, for `recall_tag`.
pub fn tag(from: Regs, tag: usize) {
    let p = walker().local.get();
    // SAFETY: `local` holds null or this thread's walker, made and freed only on this thread;
    // no walk runs while this one borrows it (hooks do not nest on a thread).
    let Some(local) = (unsafe { p.as_mut() }) else {
        return;
    };
    if let Some(m) = local.memos.get_mut(local.hit) {
        if m.from.pc == from.pc && m.from.sp == from.sp {
            m.tag = tag;
        }
    }
}

/// Runs `f` with this thread's walker, when `from` is a live frame on this thread's own stack and
/// no other walk of this thread is under way.
#[inline(always)]
fn on_own_stack<T>(from: Regs, f: impl FnOnce(&mut Local) -> Option<T>) -> Option<T> {
    let w = walker();
    if w.walking.replace(true) {
        return None;
    }
    let n = (|| {
        let local = local(w, from.sp)?;
        local.refresh();
        // The start frame must be on this thread's stack and still live: above this frame, when
        // this runs on that stack too; when it runs on pinguard's own (`workstack`), the start
        // frame is the hook's, which switched there and waits for this work to return.
        if from.sp < local.stack_bottom || from.sp >= local.stack_top {
            return None;
        }
        // (`here` below the stack's bottom needs no test of its own: `from.sp`, at or above the
        // bottom, is then above it.)
        let here = stack_pointer();
        if from.sp < here && here < local.stack_top {
            return None;
        }
        f(local)
    })();
    w.walking.set(false);
    n
}

/// `dlclose` has returned: an object may be gone, and another may take its addresses.
pub fn objects_removed() {
    WANTED.fetch_add(1, Ordering::AcqRel);
}

/// Fork prepare: no thread is half-way through building the tables. Taken before the gate
/// closes, since a build passes the gate while holding this lock.
pub fn hold() {
    crate::runtime::lock::hold(&SHARED);
}

/// # Safety
/// Only after `hold`, in the fork handlers.
pub unsafe fn let_go(child: bool) {
    // SAFETY: after `hold`, in the fork handler `child` names (this function's contract).
    unsafe { crate::runtime::lock::let_go(&SHARED, child) }
}

impl Local {
    fn new(bottom: u64, top: u64) -> Local {
        Local {
            generation: 0,
            tables: Tables::new(),
            ranges: Vec::new(),
            loads: (0, 0),
            cache: Cache::new(),
            scratch: None,
            stack_top: top,
            stack_bottom: bottom,
            reads: Vec::new(),
            memos: Vec::new(),
            hit: usize::MAX,
        }
    }

    #[inline(always)]
    fn refresh(&mut self) {
        let wanted = WANTED.load(Ordering::Acquire);
        if self.generation != wanted {
            self.rebuild(wanted);
        }
    }

    /// On pinguard's own stack: a scan of the mappings takes kilobytes of stack, and a memo's
    /// look-up (`recall_tag`) runs on the caller's.
    #[cold]
    #[inline(never)]
    fn rebuild(&mut self, wanted: u64) {
        let t = crate::runtime::guard::here();
        crate::runtime::workstack::run(t, || self.rebuild_here(wanted))
    }

    fn rebuild_here(&mut self, wanted: u64) {
        let mut shared = SHARED.lock();
        let stale = shared.as_ref().is_none_or(|s| s.generation != wanted);
        if stale {
            *shared = Some(scan(wanted));
        }
        let s = shared.as_ref().expect("just built");
        self.tables = s.tables.clone();
        self.ranges = s.ranges.clone();
        self.loads = s.loads;
        self.generation = s.generation;
    }

    fn range_of(&self, addr: u64) -> Option<(u64, u64)> {
        range_in(&self.ranges, addr)
    }

    /// The memo of an earlier walk of `depth` frames from the same registers whose stack words
    /// all hold the same values now. Those words lie between the start frame's stack pointer and
    /// the top of this thread's stack, which is live memory while the start frame runs.
    #[inline]
    fn find(&mut self, from: Regs, depth: usize) -> Option<usize> {
        let generation = self.generation;
        let mut i = self.memos.iter().position(|m| {
            m.from.pc == from.pc
                && m.from.sp == from.sp
                && m.from.lr == from.lr
                && (m.fp_free || m.from.fp == from.fp)
                && m.generation == generation
                && m.depth == depth
                // SAFETY: a memo of a walk from the same `sp` only read words in `[sp, stack_top)`;
                // `on_own_stack` checked that this start frame is live on this thread's stack.
                && unsafe { still(from.sp, &m.offsets, &m.values) }
        })?;
        if i > 0 {
            // Most recently used first: a loop pinning from one place checks one memo, and the
            // last one is the one a new walk replaces.
            self.memos[..=i].rotate_right(1);
            i = 0;
        }
        Some(i)
    }

    /// The frames of an earlier walk that still holds (`find`).
    fn recall(&mut self, from: Regs, out: &mut [usize]) -> Option<usize> {
        let i = self.find(from, out.len())?;
        self.hit = i;
        let m = &self.memos[i];
        out[..m.frames.len()].copy_from_slice(&m.frames);
        Some(m.frames.len())
    }

    fn remember(&mut self, from: Regs, frames: &[usize], depth: usize) {
        let reads = std::mem::take(&mut self.reads);
        // Which of the inputs mattered, found by walking again with them changed to garbage: a
        // garbage frame pointer, or a garbage saved register, that some step used would have
        // sent the walk elsewhere. First the start frame pointer and every word read that holds
        // no code address (saved frame pointers and other saved registers, which code built
        // without frame pointers never uses to unwind) together; if that walk reads the same
        // words and finds the same frames, the memo keeps only the return addresses and does
        // not depend on the frame pointer (code without frame pointers keeps arbitrary values
        // in that register, which must not defeat the memo). Else the frame pointer alone.
        let mut loose: Vec<u64> = reads
            .iter()
            .filter(|&&(_, v)| self.range_of(v).is_none())
            .map(|&(a, _)| a)
            .collect();
        loose.sort_unstable();
        loose.dedup();
        let mut other = vec![0usize; depth];
        let garbage = Regs {
            fp: from.fp ^ GARBAGE,
            ..from
        };
        let (n, _) = self.walk_from(garbage, &mut other, &loose, true);
        let same = |a: &[(u64, u64)], b: &[(u64, u64)], loose: &[u64]| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(p, q)| p.0 == q.0 && (p.1 == q.1 || loose.binary_search(&p.0).is_ok()))
        };
        let (fp_free, kept) = if other[..n] == *frames && same(&self.reads, &reads, &loose) {
            (
                true,
                reads
                    .iter()
                    .filter(|r| loose.binary_search(&r.0).is_err())
                    .copied()
                    .collect::<Vec<_>>(),
            )
        } else {
            let (n, _) = self.walk_from(garbage, &mut other, &[], true);
            (other[..n] == *frames && self.reads == reads, reads.clone())
        };
        // Every word read lies in `[sp, stack_top)` (`walk_from`), and a thread's stack is far
        // smaller than 4 GiB: the offsets fit.
        let offsets = kept
            .iter()
            .map(|&(a, _)| u32::try_from(a - from.sp).unwrap_or(u32::MAX))
            .collect::<Vec<_>>();
        if offsets.contains(&u32::MAX) {
            return;
        }
        let values = kept.iter().map(|&(_, v)| v).collect();
        let memo = Memo {
            from,
            fp_free,
            generation: self.generation,
            depth,
            reads,
            offsets,
            values,
            frames: frames.to_vec(),
            tag: 0,
        };
        if self.memos.len() < MEMOS {
            self.memos.push(memo);
        } else {
            // The least recently used goes (`find` keeps them in that order).
            self.reads = std::mem::replace(&mut self.memos[MEMOS - 1], memo).reads;
            // keep the allocation
        }
        self.memos.rotate_right(1);
        self.hit = 0;
    }

    /// Returns the frames written and the first address in no known object's code, if any: a
    /// frame all the same (a JIT's code, or code a `dlopen` mapped since the tables were built),
    /// unless it lies on this thread's stack, where the walk stops without writing it. The words at `garbled` (sorted) read as garbage, and
    /// `test` walks use the scratch rule cache (`remember`).
    fn walk_from(
        &mut self,
        from: Regs,
        out: &mut [usize],
        garbled: &[u64],
        test: bool,
    ) -> (usize, Option<u64>) {
        let (lo, hi) = (from.sp, self.stack_top);
        let reads = &mut self.reads;
        reads.clear();
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            if addr < lo || addr.checked_add(8).is_none_or(|e| e > hi) || !addr.is_multiple_of(8) {
                return Err(());
            }
            // SAFETY: inside this thread's own stack, above the live stack pointer.
            let mut v = unsafe { std::ptr::read_volatile(addr as *const u64) };
            if !garbled.is_empty() && garbled.binary_search(&addr).is_ok() {
                v ^= GARBAGE;
            }
            reads.push((addr, v));
            Ok(v)
        };
        let cache = if test {
            self.scratch.get_or_insert_with(Cache::new)
        } else {
            &mut self.cache
        };
        let mut frames =
            self.tables
                .iter_frames(from.pc, initial_regs(from), cache, &mut read_stack);
        let (own_lo, own_hi) = crate::runtime::objects::own_range();
        let (ranges, stack) = (&self.ranges, (self.stack_bottom, self.stack_top));
        let (mut n, mut in_own, mut missed) = (0usize, true, None);
        // Neighbouring frames are mostly in one object: the last one's range first.
        let mut last = (0u64, 0u64);
        for _ in 0..MAX_VISITED {
            let addr = match frames.next() {
                Ok(Some(f)) => f.address(),
                _ => break,
            };
            let a = addr as usize;
            if in_own {
                if a >= own_lo && a < own_hi {
                    continue;
                }
                in_own = false;
            }
            if n == out.len() {
                break;
            }
            if !(addr >= last.0 && addr < last.1) {
                match range_in(ranges, addr) {
                    Some(r) => last = r,
                    // A word of this thread's stack where a return address belongs: never a
                    // frame, and nothing past it can be trusted.
                    None if addr >= stack.0 && addr < stack.1 => return (n, Some(addr)),
                    // Garbage: no page there. One system call, on this rare path only.
                    None if !page_mapped(addr) => return (n, Some(addr)),
                    // Code outside every object (a JIT's, or one a `dlopen` mapped since the
                    // tables were built): a frame all the same, as its callers are.
                    None => missed = missed.or(Some(addr)),
                }
            }
            out[n] = a;
            n += 1;
        }
        (n, missed)
    }
}

/// Whether the page holding `addr` is mapped at all (the kernel's answer, errno kept).
fn page_mapped(addr: u64) -> bool {
    let page = crate::runtime::sys::page_size();
    let start = addr as usize & !(page - 1);
    crate::runtime::kernel::mapped(start, start + page)
}

/// The range of `ranges` (sorted, disjoint) that holds `addr`.
#[inline]
fn range_in(ranges: &[(u64, u64)], addr: u64) -> Option<(u64, u64)> {
    let i = ranges.partition_point(|r| r.0 <= addr);
    (i > 0 && addr < ranges[i - 1].1).then(|| ranges[i - 1])
}

#[cfg(target_arch = "x86_64")]
fn initial_regs(r: Regs) -> framehop::UnwindRegsNative {
    framehop::UnwindRegsNative::new(r.pc, r.sp, r.fp)
}

#[cfg(target_arch = "aarch64")]
fn initial_regs(r: Regs) -> framehop::UnwindRegsNative {
    // Where the frame has saved the link register already, the first frame's rule reads it from
    // the stack and this value is not used.
    framehop::UnwindRegsNative::new(r.lr, r.sp, r.fp)
}

/// The registers a walk needs, at this point of the caller (inlined, so that they describe one
/// consistent frame).
#[inline(always)]
fn registers() -> Regs {
    let (pc, sp, fp, lr): (u64, u64, u64, u64);
    // SAFETY: the asm only copies registers into outputs (`nomem`, `nostack`, flags preserved):
    // it touches no memory and leaves the Rust-visible state as it was.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::asm!("lea {pc}, [rip]", "mov {sp}, rsp", "mov {fp}, rbp",
                pc = out(reg) pc, sp = out(reg) sp, fp = out(reg) fp, options(nomem, nostack, preserves_flags));
            lr = 0;
        }
        #[cfg(target_arch = "aarch64")]
        std::arch::asm!("adr {pc}, .", "mov {sp}, sp", "mov {fp}, x29", "mov {lr}, x30",
            pc = out(reg) pc, sp = out(reg) sp, fp = out(reg) fp, lr = out(reg) lr, options(nomem, nostack, preserves_flags));
    }
    Regs { pc, sp, fp, lr }
}

/// The stack pointer at this point of the caller (inlined): `registers`' `sp` alone, where the
/// other registers are not wanted (two instructions fewer per walk or memo look-up).
#[inline(always)]
fn stack_pointer() -> u64 {
    let sp: u64;
    // SAFETY: the asm only copies the stack pointer into an output (`nomem`, `nostack`, flags
    // preserved): it touches no memory and leaves the Rust-visible state as it was.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        std::arch::asm!("mov {sp}, rsp", sp = out(reg) sp, options(nomem, nostack, preserves_flags));
        #[cfg(target_arch = "aarch64")]
        std::arch::asm!("mov {sp}, sp", sp = out(reg) sp, options(nomem, nostack, preserves_flags));
    }
    sp
}

/// This thread's stack as `[bottom, top)`, once per thread: the mapping that holds the hook's
/// stack pointer `sp` (the walk itself runs on pinguard's own stack), from `/proc/self/maps` read with raw system calls.
///
/// Not `pthread_getattr_np`: glibc's reads `/proc/self/maps` with `fopen` for the main thread and
/// `realloc`s a CPU set for every thread, and the first walk of a thread can run inside a signal
/// handler that interrupted `malloc`. A stack that grows later (the main thread's) only ends
/// walks from below the mapping early; words are never read outside `[sp, top)`.
fn thread_stack(sp: u64) -> Option<(u64, u64)> {
    stack_in_maps(&crate::runtime::sys::read_file(c"/proc/self/maps")?, sp)
}

/// The `[start, end)` of the line of `maps` (`/proc/self/maps`' text, its lines in the order of
/// their start addresses) whose range holds `sp`. Every new thread's first walk runs this: a
/// binary search over the text's bytes, each step a `memchr` to the next line's start and the
/// parse of its start address, a few hundred instructions, where checking each line took about
/// 10,000 at 60 lines (and splitting the text and checking it as UTF-8, 65,000 before that).
fn stack_in_maps(maps: &[u8], sp: u64) -> Option<(u64, u64)> {
    let start = |at: usize| hex_prefix(&maps[at..]).map(|(v, _)| v);
    // `lo`: a line's start at or below `sp`; no line starting at or past `hi` starts at or below it.
    let (mut lo, mut hi) = (0, maps.len());
    start(0).filter(|&v| v <= sp)?;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let from = &maps[mid - 1..hi - 1];
        // SAFETY: `from` is a live slice; memchr reads at most `from.len()` bytes of it.
        let nl =
            unsafe { libc::memchr(from.as_ptr() as *const c_void, b'\n' as c_int, from.len()) };
        if nl.is_null() {
            hi = mid; // no line starts in [mid, hi)
            continue;
        }
        let next = nl as usize - maps.as_ptr() as usize + 1; // in [mid, hi)
        match start(next) {
            Some(v) if v <= sp => lo = next,
            _ => hi = next,
        }
    }
    let (first, n) = hex_prefix(&maps[lo..])?;
    let (end, _) = (maps.get(lo + n) == Some(&b'-')).then(|| hex_prefix(&maps[lo + n + 1..]))??;
    (first <= sp && sp < end).then_some((first, end))
}

/// The lowercase hex number at the start of `b` and the bytes it takes; `None` where `b` does not
/// start with one or it has more than 16 digits.
#[inline]
fn hex_prefix(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    let mut n = 0;
    while let Some(&c) = b.get(n) {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => break,
        };
        if n == 16 {
            return None;
        }
        v = v << 4 | d as u64;
        n += 1;
    }
    (n > 0).then_some((v, n))
}

/// The loader's (adds, subs) counters: they move on every `dlopen`/`dlclose` that maps or unmaps.
pub(crate) fn loader_counts() -> (u64, u64) {
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut counts` passed below, live and unaliased for the whole walk.
        let out = unsafe { &mut *(data as *mut (u64, u64)) };
        if size >= std::mem::size_of::<libc::dl_phdr_info>() {
            // SAFETY: the loader's valid `info`, which `size` says has the counters.
            *out = unsafe { ((*info).dlpi_adds, (*info).dlpi_subs) };
        }
        1 // the first object carries them; stop there
    }
    let mut counts = (0u64, 0u64);
    let _open = crate::runtime::gate::enter();
    // SAFETY: `cb` matches the callback type and casts `data` back to the `(u64, u64)` passed here,
    // which outlives the call; the gate is held across the loader's lock.
    unsafe { crate::runtime::gate::iterate_phdr(cb, &mut counts as *mut _ as *mut c_void) };
    counts
}

struct Found {
    name: String,
    start: u64,
    end: u64,
    bias: u64,
    text: Option<(u64, u64)>,
    hdr: Option<(u64, u64)>,
    /// `[start, end)` of every loaded segment, for bounding `.eh_frame`.
    segments: Vec<(u64, u64)>,
    /// `[start, end)` of every executable loaded segment: where its return addresses lie.
    code: Vec<(u64, u64)>,
}

/// Builds the tables for every loaded object.
fn scan(generation: u64) -> Shared {
    let mut found: (Vec<Found>, (u64, u64)) = (Vec::new(), (0, 0));
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut found` passed below, live and unaliased for the whole walk.
        let (objects, loads) = unsafe { &mut *(data as *mut (Vec<Found>, (u64, u64))) };
        // SAFETY: `dl_iterate_phdr` passes a valid `dl_phdr_info` for the callback's duration.
        let info = unsafe { &*info };
        if objects.is_empty() && size >= std::mem::size_of::<libc::dl_phdr_info>() {
            *loads = (info.dlpi_adds, info.dlpi_subs);
        }
        let bias = info.dlpi_addr;
        let name = if info.dlpi_name.is_null() {
            String::new()
        } else {
            // SAFETY: not null, so the loader's NUL-terminated name of the object.
            unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }
                .to_string_lossy()
                .into_owned()
        };
        let mut f = Found {
            name,
            start: u64::MAX,
            end: 0,
            bias,
            text: None,
            hdr: None,
            segments: Vec::new(),
            code: Vec::new(),
        };
        for i in 0..info.dlpi_phnum as usize {
            // SAFETY: `i < dlpi_phnum`, the length of the loader's program header array.
            let ph = unsafe { &*info.dlpi_phdr.add(i) };
            let (s, e) = (
                bias.wrapping_add(ph.p_vaddr),
                bias.wrapping_add(ph.p_vaddr).wrapping_add(ph.p_memsz),
            );
            match ph.p_type {
                libc::PT_LOAD => {
                    f.start = f.start.min(s);
                    f.end = f.end.max(e);
                    f.segments.push((s, e));
                    if ph.p_flags & libc::PF_X != 0 {
                        f.code.push((s, e));
                    }
                    if ph.p_flags & libc::PF_X != 0 && f.text.is_none() {
                        f.text = Some((ph.p_vaddr, ph.p_vaddr + ph.p_memsz));
                    }
                }
                libc::PT_GNU_EH_FRAME => f.hdr = Some((s, e)),
                _ => {}
            }
        }
        if f.start < f.end {
            objects.push(f);
        }
        0
    }
    {
        let _open = crate::runtime::gate::enter();
        // SAFETY: `cb` matches the callback type and casts `data` back to the type of `found`, which
        // outlives the call; the gate is held across the loader's lock.
        unsafe { crate::runtime::gate::iterate_phdr(cb, &mut found as *mut _ as *mut c_void) };
    }
    let (objects, loads) = found;
    let mut tables = Tables::new();
    let mut ranges = Vec::with_capacity(objects.len());
    for o in objects {
        ranges.extend_from_slice(&o.code);
        // SAFETY: the loader reported `o` just above, so it is mapped; a later `dlclose` bumps
        // `WANTED`, so these tables are rebuilt before another object's code can use those addresses.
        if let Some(module) = unsafe { module(&o) } {
            tables.add_module(module);
        }
    }
    ranges.sort_unstable();
    Shared {
        generation,
        tables,
        ranges,
        loads,
    }
}

/// One object's unwind tables, as slices of its mapped segments.
///
/// # Safety
/// `o` must describe an object the loader has mapped now.
unsafe fn module(o: &Found) -> Option<Module<&'static [u8]>> {
    let (hdr_start, hdr_end) = o.hdr?;
    if hdr_end < hdr_start + 8 {
        return None;
    }
    // SAFETY: the `PT_GNU_EH_FRAME` segment of an object mapped now (this function's contract).
    let hdr = unsafe {
        std::slice::from_raw_parts(hdr_start as *const u8, (hdr_end - hdr_start) as usize)
    };
    if hdr[0] != 1 {
        return None;
    }
    // The encoded `.eh_frame` pointer follows the 4-byte header. It is decoded from the segment's
    // bytes, so that an 8-byte encoding in a segment shorter than 12 bytes is refused, not read
    // past the segment's end.
    let eh_frame = decode_encoded(hdr[1], &hdr[4..], hdr_start + 4, hdr_start)?;
    // `.eh_frame` has no length of its own here: it runs at most to the end of its segment.
    let seg_end = o
        .segments
        .iter()
        .find(|(s, e)| eh_frame >= *s && eh_frame < *e)?
        .1;
    // SAFETY: from `eh_frame` to the end of the loaded segment holding it, mapped (this function's
    // contract).
    let eh =
        unsafe { std::slice::from_raw_parts(eh_frame as *const u8, (seg_end - eh_frame) as usize) };
    let svma = |a: u64| a.wrapping_sub(o.bias);
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: o.text.map(|(s, e)| s..e),
        eh_frame_svma: Some(svma(eh_frame)..svma(seg_end)),
        eh_frame: Some(eh),
        eh_frame_hdr_svma: Some(svma(hdr_start)..svma(hdr_end)),
        eh_frame_hdr: Some(hdr),
        ..Default::default()
    };
    Some(Module::new(o.name.clone(), o.start..o.end, o.bias, info))
}

/// Decodes a DWARF-encoded pointer (the subset `.eh_frame_hdr` uses) from the start of `bytes`,
/// which sit at address `at` in a table starting at `hdr`; None for an encoding outside the subset
/// (`DW_EH_PE_omit` included) or fewer bytes than it takes. The indirect bit (0x80) is ignored.
fn decode_encoded(enc: u8, bytes: &[u8], at: u64, hdr: u64) -> Option<u64> {
    fn take<const N: usize>(bytes: &[u8]) -> Option<[u8; N]> {
        bytes.get(..N)?.try_into().ok()
    }
    let value: i64 = match enc & 0x0f {
        0x00 | 0x04 | 0x0c => i64::from_ne_bytes(take(bytes)?),
        0x03 => u32::from_ne_bytes(take(bytes)?) as i64,
        0x0b => i32::from_ne_bytes(take(bytes)?) as i64,
        0x02 => u16::from_ne_bytes(take(bytes)?) as i64,
        0x0a => i16::from_ne_bytes(take(bytes)?) as i64,
        _ => return None,
    };
    let base = match enc & 0x70 {
        0x00 => 0,
        0x10 => at,
        0x30 => hdr,
        _ => return None,
    };
    Some(base.wrapping_add(value as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: u64 = 0x7f00_0000_1004;
    const HDR: u64 = 0x7f00_0000_1000;

    fn decode(enc: u8, bytes: &[u8]) -> Option<u64> {
        decode_encoded(enc, bytes, AT, HDR)
    }

    #[test]
    fn absolute_encodings() {
        let p = 0x0000_5555_dead_beefu64;
        for enc in [0x00, 0x04, 0x0c] {
            assert_eq!(decode(enc, &p.to_ne_bytes()), Some(p), "{enc:#x}");
        }
        assert_eq!(decode(0x04, &u64::MAX.to_ne_bytes()), Some(u64::MAX));
        assert_eq!(decode(0x0c, &(-8i64).to_ne_bytes()), Some(-8i64 as u64));
        assert_eq!(
            decode(0x03, &0xfedc_ba98u32.to_ne_bytes()),
            Some(0xfedc_ba98)
        );
        assert_eq!(
            decode(0x0b, &0x1234_5678i32.to_ne_bytes()),
            Some(0x1234_5678)
        );
        assert_eq!(decode(0x0b, &(-2i32).to_ne_bytes()), Some(-2i64 as u64));
        assert_eq!(decode(0x02, &0xfffeu16.to_ne_bytes()), Some(0xfffe));
        assert_eq!(decode(0x0a, &(-2i16).to_ne_bytes()), Some(-2i64 as u64));
        // Only the leading bytes count.
        assert_eq!(decode(0x03, &[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]), Some(1));
    }

    #[test]
    fn relative_encodings() {
        // pcrel: from the encoded value's own address.
        assert_eq!(decode(0x1b, &0x100i32.to_ne_bytes()), Some(AT + 0x100));
        assert_eq!(decode(0x1b, &(-0x100i32).to_ne_bytes()), Some(AT - 0x100));
        assert_eq!(
            decode(0x13, &0xffff_fff0u32.to_ne_bytes()),
            Some(AT + 0xffff_fff0)
        );
        assert_eq!(
            decode(0x1c, &(-0x1004i64).to_ne_bytes()),
            Some(0x7f00_0000_0000)
        );
        assert_eq!(decode(0x14, &0x10u64.to_ne_bytes()), Some(AT + 0x10));
        // datarel: from the start of `.eh_frame_hdr`.
        assert_eq!(decode(0x3b, &0x40i32.to_ne_bytes()), Some(HDR + 0x40));
        assert_eq!(decode(0x3b, &(-0x40i32).to_ne_bytes()), Some(HDR - 0x40));
        assert_eq!(
            decode(0x33, &0x8000_0000u32.to_ne_bytes()),
            Some(HDR + 0x8000_0000)
        );
        assert_eq!(decode(0x3c, &(-1i64).to_ne_bytes()), Some(HDR - 1));
        assert_eq!(decode(0x34, &8u64.to_ne_bytes()), Some(HDR + 8));
        // A negative offset from 0 wraps as the address arithmetic does.
        assert_eq!(
            decode_encoded(0x1b, &(-4i32).to_ne_bytes(), 2, 0),
            Some(u64::MAX - 1)
        );
    }

    #[test]
    fn omitted_and_unknown_encodings() {
        let bytes = [1u8; 8];
        assert_eq!(decode(0xff, &bytes), None); // DW_EH_PE_omit
        for format in [0x01, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0d, 0x0e, 0x0f] {
            assert_eq!(decode(format, &bytes), None, "{format:#x}");
        }
        // textrel, funcrel, aligned: no base here.
        for application in [0x20, 0x40, 0x50, 0x60, 0x70] {
            assert_eq!(decode(application | 0x03, &bytes), None, "{application:#x}");
        }
    }

    #[test]
    fn short_input() {
        let bytes = [0x11u8; 8];
        for (enc, size) in [
            (0x04, 8),
            (0x0c, 8),
            (0x00, 8),
            (0x03, 4),
            (0x0b, 4),
            (0x02, 2),
            (0x0a, 2),
        ] {
            assert!(decode(enc, &bytes[..size]).is_some(), "{enc:#x}");
            assert_eq!(decode(enc, &bytes[..size - 1]), None, "{enc:#x}");
        }
        assert_eq!(decode(0x03, &[]), None);
    }

    #[test]
    fn the_stack_line_of_the_maps() {
        let maps = b"55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 123 /usr/bin/x\n\
7f00aa000000-7f00aa800000 rw-p 00000000 00:00 0 \n\
7ffc1000f000-7ffc10030000 rw-p 00000000 00:00 0                          [stack]\n\
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]";
        assert_eq!(
            stack_in_maps(maps, 0x7f00aa000000),
            Some((0x7f00aa000000, 0x7f00aa800000))
        );
        assert_eq!(
            stack_in_maps(maps, 0x7f00aa7ffff8),
            Some((0x7f00aa000000, 0x7f00aa800000))
        );
        assert_eq!(stack_in_maps(maps, 0x7f00aa800000), None);
        assert_eq!(
            stack_in_maps(maps, 0x7ffc1002fff0),
            Some((0x7ffc1000f000, 0x7ffc10030000))
        );
        assert_eq!(
            stack_in_maps(maps, 0xffffffffff600008),
            Some((0xffffffffff600000, 0xffffffffff601000))
        );
        assert_eq!(stack_in_maps(maps, 0x1000), None);
        assert_eq!(stack_in_maps(b"", 0x1000), None);
        // A broken line is never read as a range.
        assert_eq!(stack_in_maps(b"10-\n", 0x18), None);
        assert_eq!(stack_in_maps(b"08-10 x\n10-\n", 0x18), None);
        assert_eq!(
            stack_in_maps(b"08-10 x\n10-20 x\n", 0x18),
            Some((0x10, 0x20))
        );
        assert_eq!(
            stack_in_maps(
                b"10000000000000000-20000000000000000 x\n",
                0x1800_0000_0000_0000
            ),
            None
        );
    }

    #[test]
    fn every_line_of_long_maps_is_found() {
        let mut maps = String::new();
        for i in 0..300u64 {
            let lo = 0x7f00_0000_0000 + i * 0x10_0000;
            // Lines of different lengths, as names make them.
            maps += &format!(
                "{:x}-{:x} rw-p 00000000 00:00 0 {}\n",
                lo,
                lo + 0x8000,
                "x".repeat((i * 7 % 50) as usize)
            );
        }
        for i in 0..300u64 {
            let lo = 0x7f00_0000_0000 + i * 0x10_0000;
            assert_eq!(
                stack_in_maps(maps.as_bytes(), lo),
                Some((lo, lo + 0x8000)),
                "{i}"
            );
            assert_eq!(
                stack_in_maps(maps.as_bytes(), lo + 0x7ff8),
                Some((lo, lo + 0x8000)),
                "{i}"
            );
            // In the gap after the range: none.
            assert_eq!(stack_in_maps(maps.as_bytes(), lo + 0x8000), None, "{i}");
        }
        assert_eq!(stack_in_maps(maps.as_bytes(), 0x1000), None);
        assert_eq!(
            stack_in_maps(
                maps.trim_end().as_bytes(),
                0x7f00_0000_0000 + 299 * 0x10_0000 + 8
            ),
            Some((
                0x7f00_0000_0000 + 299 * 0x10_0000,
                0x7f00_0000_0000 + 299 * 0x10_0000 + 0x8000
            ))
        );
    }

    #[test]
    fn this_threads_stack_is_found() {
        let x = 0u64;
        let sp = &x as *const u64 as u64;
        let (lo, hi) = thread_stack(sp).expect("this thread's stack is in the maps");
        assert!(lo <= sp && sp < hi);
    }

    /// `.eh_frame_hdr` of `hdr_len` bytes at the start of a 64-byte segment, saying (udata8,
    /// absolute) that `.eh_frame` is at byte 16 of it.
    fn found(segment: &[u8; 64], hdr_len: u64) -> Found {
        let start = segment.as_ptr() as u64;
        Found {
            name: "test".into(),
            start,
            end: start + 64,
            bias: 0,
            text: None,
            hdr: Some((start, start + hdr_len)),
            segments: vec![(start, start + 64)],
            code: Vec::new(),
        }
    }

    #[test]
    fn the_eh_frame_pointer_stays_in_its_segment() {
        let mut segment = [0u8; 64];
        let start = segment.as_ptr() as u64;
        segment[..4].copy_from_slice(&[1, 0x04, 0xff, 0xff]);
        segment[4..12].copy_from_slice(&(start + 16).to_ne_bytes());
        // Twelve bytes hold the whole pointer.
        // SAFETY: `found` describes `segment`, live for the call.
        assert!(unsafe { module(&found(&segment, 12)) }.is_some());
        // With eight, its last four bytes lie past the segment's end: refused, not read.
        // SAFETY: as above.
        assert!(unsafe { module(&found(&segment, 8)) }.is_none());
        // A 4-byte encoding fits in eight: pcrel sdata4, from byte 4 to byte 16.
        segment[1] = 0x1b;
        segment[4..8].copy_from_slice(&12i32.to_ne_bytes());
        // SAFETY: as above.
        assert!(unsafe { module(&found(&segment, 8)) }.is_some());
    }
}
