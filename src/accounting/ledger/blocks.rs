//! Each thread's block of event counters: made, adopted, handed back at thread exit, summed.

use crate::api::Api;
use crate::runtime::guard::{self, Thread};
use crate::runtime::lock::Mutex;
use pinguard_common::{ApiStats, Totals};
use std::os::raw::c_void;
use std::sync::atomic::{
    AtomicPtr, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed},
};
use std::sync::OnceLock;

/// A thread's event counters, made from the one list of them (`with_total_counters!` for the
/// process's, `with_api_counters!` for each entry point's, in `pinguard_common`): the fields in
/// the block's order, the zeroed value a new block starts from, and the sum into the report's
/// figures. Counters only go up, but for `downgraded_live_bytes`, whose deltas are added as two's
/// complement and whose sum is read as signed.
macro_rules! counters {
    ($name:ident, $out:ty, $($f:ident),*) => {
        #[repr(C)]
        pub(super) struct $name {
            $(pub(super) $f: AtomicU64,)*
        }

        impl $name {
            // A constant initialiser for arrays, copied into each slot, never shared.
            #[allow(clippy::declare_interior_mutable_const)]
            const ZERO: $name = $name { $($f: AtomicU64::new(0),)* };

            /// Adds this block's counters to `out`'s.
            pub(super) fn add_to(&self, out: &mut $out) {
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
pinguard_common::with_total_counters!(total_counters);
pinguard_common::with_api_counters!(api_counters);

/// One thread's event counters. Only the owning thread writes them, with a plain load and store
/// (`add`: no locked instruction, no cache line shared with another writer); readers sum every
/// block. A thread that ends hands its block back (a `pthread` key destructor) to the next thread
/// that counts, figures and all, so the sums stay right and short-lived threads leak nothing.
///
/// Blocks live in the state file (`arena`); `repr(C)` in the layout its readers know
/// (`pinguard_common::state::block`, checked below).
#[repr(C, align(128))]
pub struct Block {
    /// The next older block in the state file's list.
    pub(super) state_next: AtomicU64,
    /// Which stripe of each `Level` this block's thread writes: blocks are numbered as they are
    /// made, so the threads alive at once hold the low numbers.
    pub slot: usize,
    pub(super) totals: Counters,
    pub(super) apis: [ApiCounters; Api::COUNT],
    /// The next older block in `BLOCKS`; set before the block is published, never changed.
    pub(super) next: AtomicPtr<Block>,
}

const _: () = {
    use pinguard_common::state::block as b;
    use std::mem::{offset_of, size_of};
    assert!(
        offset_of!(Block, state_next) == b::NEXT
            && offset_of!(Block, totals) == b::TOTALS
            && offset_of!(Block, apis) == b::APIS
    );
    assert!(
        size_of::<Counters>() == b::TOTAL_NAMES.len() * 8
            && size_of::<ApiCounters>() == b::API_SIZE
    );
};

// A constant initialiser for arrays, copied into each slot, never shared.
#[allow(clippy::declare_interior_mutable_const)]
pub(super) const BLOCK: Block = Block {
    totals: Counters::ZERO,
    apis: [ApiCounters::ZERO; Api::COUNT],
    next: AtomicPtr::new(std::ptr::null_mut()),
    state_next: AtomicU64::new(0),
    slot: 0,
};
pub(super) static MADE: AtomicUsize = AtomicUsize::new(0);

/// Every block ever made, newest first (blocks are never freed).
pub(super) static BLOCKS: AtomicPtr<Block> = AtomicPtr::new(std::ptr::null_mut());
/// Blocks whose thread has ended.
pub(super) static FREE: Mutex<Vec<&'static Block>> = Mutex::new(Vec::new());
pub(super) static KEY: OnceLock<Option<libc::pthread_key_t>> = OnceLock::new();

/// This thread's block.
#[inline]
pub(super) fn mine(t: &Thread) -> &'static Block {
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
pub(super) fn adopt(t: &Thread) -> &'static Block {
    crate::runtime::workstack::run(t, || adopt_here(t))
}

pub(super) fn adopt_here(t: &Thread) -> &'static Block {
    let b = FREE.lock().pop().unwrap_or_else(|| {
        let slot = MADE.fetch_add(1, Relaxed);
        crate::accounting::level::slot_made(slot);
        let b: &'static Block = crate::accounting::arena::leak(Block { slot, ..BLOCK });
        crate::accounting::arena::push(
            pinguard_common::state::header::BLOCKS,
            b as *const Block as *const u8,
        );
        let mut head = BLOCKS.load(Acquire);
        loop {
            b.next.store(head, Relaxed);
            match BLOCKS.compare_exchange_weak(
                head,
                b as *const Block as *mut Block,
                AcqRel,
                Acquire,
            ) {
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
pub(super) unsafe extern "C" fn hand_back(p: *mut c_void) {
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

pub(super) fn blocks() -> impl Iterator<Item = &'static Block> {
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
pub(super) fn add<A: crate::accounting::level::Add>(c: &A, v: A::V) {
    c.add(v, true);
}
