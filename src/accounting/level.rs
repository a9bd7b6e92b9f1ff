//! One level's live figures and peak (the process, an entry point, a callsite), kept so that
//! threads pinning at the same time write no common cache line.
//!
//! Each level is split into stripes. A thread writes the stripe of its slot (`ledger::blocks::Block`):
//! the first `K - 1` slots own theirs and write it with plain stores; later slots share the last
//! stripe with atomic adds. A figure is the sum over the stripes, exact whenever no call is in
//! flight.
//!
//! The peak cannot come from one running sum without a shared write per call (which halves what
//! two threads can do). Instead every stripe keeps `high`, at least the most it has held, and the
//! level keeps `bound`, the sum of the highs, which is never below the live figure. A call that
//! raises its stripe checks `bound` against the peak: at or below it, no new peak is possible and
//! nothing shared is written. Above it, the thread sums the stripes of the slots handed out so far
//! (`slot_made`) and raises the peak; a sum that finds no new peak (a level's first such, then
//! one in `LOWER_EVERY`) also brings every stripe's high down to what the stripe holds (a stripe of a thread that went quiet too, with a fence on every thread so that
//! no owner's pin in flight is lost: `lower_all`), so that the calls after it, from any thread,
//! are back under the peak. The peak is therefore exact when one thread at a time changes the
//! level (any single-threaded program); with threads pinning at the same moment, it is the sum
//! of the stripes as read, off by at most the calls in flight, and never above the process
//! budget when one is set.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};

/// One past the highest slot handed out (`slot_made`): no thread has written a stripe past it,
/// and a sum leaves those out (two threads' sum reads two or three stripes, not sixteen).
static SLOTS: AtomicUsize = AtomicUsize::new(0);

/// A thread was given `slot` (`ledger::blocks::Block`), before it writes any stripe.
pub fn slot_made(slot: usize) {
    SLOTS.fetch_max(slot.saturating_add(1), Relaxed);
}

/// A fork child numbers its threads again, its levels zeroed and its callsites made anew.
pub fn forget_slots() {
    SLOTS.store(0, Relaxed);
}

/// What the budget has handed out (live plus in flight), where a budget counts it: no level can
/// truly be above it. The budget stage's figure, handed in by the composition layer at start-up
/// (`ceiling`), asked only when a new peak is possible.
static CEILING: std::sync::OnceLock<fn() -> Option<u64>> = std::sync::OnceLock::new();

pub fn ceiling(f: fn() -> Option<u64>) {
    let _ = CEILING.set(f);
}

/// 128 bytes: the adjacent-line prefetcher moves lines in pairs, so two threads writing
/// neighbouring 64-byte lines still pass the pair between their cores.
#[repr(C, align(128))]
pub struct Stripe {
    bytes: AtomicI64,
    count: AtomicI64,
    /// At least the most `bytes` has held (a stripe can go negative: a thread may release what
    /// another pinned).
    high: AtomicI64,
    alloc_count: AtomicU64,
    alloc_bytes: AtomicU64,
    /// The sums that found no new peak (`recheck`) made by the threads writing this stripe: each
    /// thread counts its own, so that two threads summing write no common line. In the stripe's
    /// padding, past what the state file's readers know.
    sums: AtomicU64,
    /// The most and least `bytes` held since the timeline last took them (`take_tick`): the
    /// process's level only keeps them (`grow_ticked`, `release_ticked`), in the padding.
    tick_high: AtomicI64,
    tick_low: AtomicI64,
}

/// A level's highs are lowered on its first sum that finds no new peak and on every this many
/// such after. Threads that take turns without ever holding at once keep the bound above the
/// peak whatever is done (each raises its high again at its next pin), and lowering the others'
/// highs on every sum would add to each a fence on every thread of the process (`membarrier`, an
/// interrupt of each thread running on another CPU) and a locked write to each other thread's
/// stripe; a thread that runs alone for a while (threads time-sliced on one CPU) sums at most
/// this many times before the others' highs come down. Each thread counts its sums in its own
/// stripe, and a sum adds the counts up with the figures it reads anyway (a count on the level
/// was a line every summing thread wrote; a thread's own count alone, lowering on its own 64th,
/// made a thread back from a time slice sum 63 times before lowering, where the level's count
/// is anywhere in its 64).
const LOWER_EVERY: u64 = 64;

// A constant initialiser for arrays, copied into each slot, never shared.
#[allow(clippy::declare_interior_mutable_const)]
const STRIPE: Stripe = Stripe {
    bytes: AtomicI64::new(0),
    count: AtomicI64::new(0),
    high: AtomicI64::new(0),
    alloc_count: AtomicU64::new(0),
    alloc_bytes: AtomicU64::new(0),
    sums: AtomicU64::new(0),
    tick_high: AtomicI64::new(0),
    tick_low: AtomicI64::new(0),
};

/// `repr(C)`: levels live in the state file, whose readers know this layout
/// (`pinguard_common::state::level`, checked below).
#[repr(C)]
pub struct Level<const K: usize> {
    stripes: [Stripe; K],
    /// The sum of the stripes' `high`: never below the live figure.
    bound: AtomicI64,
    /// The peak since the level's start, or since its last `restart_peak`.
    peak: AtomicU64,
    /// The highest peak before the last `restart_peak` (0: never restarted); the level's peak
    /// over its whole life is the higher of this and `peak`. In the padding of the bound's line,
    /// where state files written before it hold 0.
    earlier: AtomicU64,
}

const _: () = {
    use pinguard_common::state::level as l;
    use std::mem::{offset_of, size_of};
    assert!(size_of::<Stripe>() == l::STRIPE);
    assert!(
        offset_of!(Stripe, bytes) == l::BYTES
            && offset_of!(Stripe, count) == l::COUNT
            && offset_of!(Stripe, high) == l::HIGH
    );
    assert!(
        offset_of!(Stripe, alloc_count) == l::ALLOC_COUNT
            && offset_of!(Stripe, alloc_bytes) == l::ALLOC_BYTES
    );
    assert!(
        offset_of!(Level<16>, bound) == l::bound(16)
            && offset_of!(Level<16>, peak) == l::peak(16)
            && offset_of!(Level<16>, earlier) == l::earlier(16)
    );
    assert!(size_of::<Level<16>>() == l::size(16) && size_of::<Level<4>>() == l::size(4));
};

/// Adds to a counter: a plain load and store on a counter only this thread writes (`owned`), an
/// atomic add otherwise. Returns the new value.
pub trait Add {
    type V;
    fn add(&self, v: Self::V, owned: bool) -> Self::V;
}

macro_rules! add_for {
    ($($atomic:ty => $v:ty),*) => {$(
        impl Add for $atomic {
            type V = $v;
            #[inline(always)]
            fn add(&self, v: $v, owned: bool) -> $v {
                if owned {
                    let n = self.load(Relaxed).wrapping_add(v);
                    self.store(n, Relaxed);
                    n
                } else {
                    self.fetch_add(v, Relaxed).wrapping_add(v)
                }
            }
        }
    )*};
}
add_for!(AtomicI64 => i64, AtomicU64 => u64);

/// Raises a peak to `now`. A load first: a peak that is not being raised stays a shared cache
/// line that no thread writes.
#[inline]
pub fn raise(peak: &AtomicU64, now: i64) {
    let now = now.max(0) as u64;
    if now > peak.load(Relaxed) {
        peak.fetch_max(now, Relaxed);
    }
}

/// A level's figures at a tick of the timeline (`Level::take_tick`).
pub struct Tick {
    pub live: u64,
    pub high: u64,
    pub low: u64,
    pub peak: u64,
}

/// A stripe rose to `now`: its tick's highest follows (a plain store from its owner, who alone
/// raises it; `fetch_max` on the shared stripe). Measured against a `fetch_max` for both, and
/// against the raise out of line: this way adds the fewest instructions to the pair.
#[inline(always)]
fn tick_high(s: &Stripe, owned: bool, now: i64) {
    if now > s.tick_high.load(Relaxed) {
        if owned {
            s.tick_high.store(now, Relaxed);
        } else {
            s.tick_high.fetch_max(now, Relaxed);
        }
    }
}

/// A stripe fell to `now`: its tick's lowest follows.
#[inline(always)]
fn tick_low(s: &Stripe, owned: bool, now: i64) {
    if now < s.tick_low.load(Relaxed) {
        if owned {
            s.tick_low.store(now, Relaxed);
        } else {
            s.tick_low.fetch_min(now, Relaxed);
        }
    }
}

impl<const K: usize> Level<K> {
    // A constant initialiser for arrays, copied into each slot, never shared.
    #[allow(clippy::declare_interior_mutable_const)]
    pub const NEW: Self = Level {
        stripes: [STRIPE; K],
        bound: AtomicI64::new(0),
        peak: AtomicU64::new(0),
        earlier: AtomicU64::new(0),
    };

    #[inline(always)]
    fn stripe(&self, slot: usize) -> (&Stripe, bool) {
        if slot < K - 1 {
            (&self.stripes[slot], true)
        } else {
            (&self.stripes[K - 1], false)
        }
    }

    /// Moves `bytes` and `count` in (positive) or out of the live figures, from the thread in `slot`.
    #[inline]
    pub fn live(&self, slot: usize, bytes: i64, count: i64) {
        let (s, owned) = self.stripe(slot);
        self.live_in(slot, s, owned, bytes, count)
    }

    /// The sign is tested first, so that each way (and each of owned and shared) is a straight
    /// line: a release never reaches the peak's checks.
    #[inline(always)]
    fn live_in(&self, slot: usize, s: &Stripe, owned: bool, bytes: i64, count: i64) {
        if bytes > 0 {
            let now = s.bytes.add(bytes, owned);
            s.count.add(count, owned);
            self.raised(slot, s, owned, now);
        } else {
            s.bytes.add(bytes, owned);
            s.count.add(count, owned);
        }
    }

    /// The stripe `s` went up to `now`: its high and the level's bound follow, and a new peak is
    /// checked for. The high moves with a locked instruction even on an owned stripe: `recheck`
    /// lowers highs from other threads, and a plain store here could undo a lowering after the
    /// bound had followed it (the bound would then stay below the sum of the highs). Only a
    /// stripe going above its high pays for it, never a steady pin-and-release. (The owned and
    /// shared paths differ on purpose: merged, the steady path took a jump more per level.)
    #[inline(always)]
    fn raised(&self, slot: usize, s: &Stripe, owned: bool, now: i64) {
        // The figure is stored before the high is read, in program order: `lower_all`'s fence on
        // every thread relies on it (no instruction; the compiler keeps the order).
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        if now > s.high.load(Relaxed) {
            if owned {
                self.lift_owned(s, now);
            } else {
                self.lift(s, now);
            }
        }
        if self.bound.load(Relaxed) > self.peak.load(Relaxed) as i64 {
            self.recheck(slot);
        }
    }

    /// `lift`, from the stripe's owner (the same work, a separate body: see `raised`).
    #[cold]
    #[inline(never)]
    fn lift_owned(&self, s: &Stripe, now: i64) {
        let high = s.high.load(Relaxed);
        if now > high && s.high.compare_exchange(high, now, Relaxed, Relaxed).is_ok() {
            self.bound.fetch_add(now - high, Relaxed);
        } else {
            self.lift(s, now);
        }
    }

    /// Raises a stripe's high to `now`, and the bound with it.
    #[cold]
    #[inline(never)]
    fn lift(&self, s: &Stripe, now: i64) {
        let old = s.high.fetch_max(now, Relaxed);
        if now > old {
            self.bound.fetch_add(now - old, Relaxed);
        }
    }

    /// A new peak is possible: sum the stripes. Then (on the level's first sum that finds none,
    /// and one in `LOWER_EVERY` after) the stripes' highs come down
    /// to what they hold, whichever thread owns them, so that the bound is the live figure again
    /// and the calls after this one, from any thread, skip the sum. Without this, a stripe whose
    /// thread pinned once and went quiet (a main thread before its pin-memory thread starts, a
    /// worker that ended) kept the bound above the peak for good, and every call of every other
    /// thread summed the stripes (about 225 instructions a pair over the three levels). `slot`
    /// is the caller's, whose stripe counts its sums.
    #[cold]
    #[inline(never)]
    fn recheck(&self, slot: usize) {
        // Only the slots handed out so far have written a stripe; a slot handed out while this
        // runs belongs to a call in flight.
        let used = SLOTS.load(Relaxed).clamp(1, K);
        let (mut total, mut sums) = (0i64, 0u64);
        for s in &self.stripes[..used] {
            total = total.wrapping_add(s.bytes.load(Relaxed));
            sums = sums.wrapping_add(s.sums.load(Relaxed));
        }
        if total > self.peak.load(Relaxed) as i64 {
            self.new_peak(total);
        } else {
            // Counted in the caller's own stripe. (The slot, not its stripe, is what the pinning
            // path hands down: computing the stripe's address for the call took an instruction a
            // level on the steady path.)
            let (s, owned) = self.stripe(slot);
            s.sums.add(1, owned);
            if sums.is_multiple_of(LOWER_EVERY) {
                self.lower_all();
            }
        }
    }

    /// The stripes summed to `total`, above the peak.
    #[cold]
    #[inline(never)]
    fn new_peak(&self, total: i64) {
        // What the budget has handed out bounds what can be live; a sum read while other threads
        // move their stripes can exceed it, the true figure cannot.
        let total = match CEILING.get().and_then(|f| f()) {
            Some(reserved) => total.min(reserved as i64),
            None => total,
        };
        raise(&self.peak, total);
    }

    /// Brings every stripe's high down to what it holds. An owner may be pinning within its old
    /// high at this moment: it stores its figure, then reads its high, with no fence between (its
    /// fast path), so it may read the old high while this thread has not yet seen its figure.
    /// A fence on every running thread of the process, after the highs are lowered, settles it:
    /// each owner either reads its high lowered (and raises it itself) or has its figure read
    /// here (and raised back). Where no such fence can be had, nothing is lowered: the peak
    /// stays exact, and threads that took turns keep summing.
    #[cold]
    #[inline(never)]
    fn lower_all(&self) {
        if !crate::runtime::kernel::fence_all_threads() {
            return;
        }
        let mut held = [-1i64; K];
        for (s, h) in self.stripes.iter().zip(held.iter_mut()) {
            let (high, now) = (s.high.load(Relaxed), s.bytes.load(Relaxed).max(0));
            if now < high && s.high.compare_exchange(high, now, Relaxed, Relaxed).is_ok() {
                self.bound.fetch_sub(high - now, Relaxed);
                *h = now;
            }
        }
        if held.iter().all(|&h| h < 0) {
            return;
        }
        crate::runtime::kernel::fence_all_threads();
        for (s, &h) in self.stripes.iter().zip(held.iter()) {
            let again = s.bytes.load(Relaxed);
            if h >= 0 && again > h {
                self.lift(s, again);
            }
        }
    }

    /// `bytes` and one allocation leave the live figures (a release: no new peak is possible).
    #[inline(always)]
    pub fn release(&self, slot: usize, bytes: u64) {
        let (s, owned) = self.stripe(slot);
        s.bytes.add((bytes as i64).wrapping_neg(), owned);
        s.count.add(-1, owned);
    }

    /// `bytes` and one allocation join the live figures (`live` of a positive amount), the
    /// stripe's highest of the timeline's tick kept as well: the process's level, whose extremes
    /// the timeline keeps (one compare more than `live`; a store only on a new high).
    #[inline(always)]
    pub fn grow_ticked(&self, slot: usize, bytes: u64) {
        let (s, owned) = self.stripe(slot);
        let now = s.bytes.add(bytes as i64, owned);
        s.count.add(1, owned);
        tick_high(s, owned, now);
        self.raised(slot, s, owned, now);
    }

    /// `release`, keeping the stripe's lowest of the timeline's tick as well.
    #[inline(always)]
    pub fn release_ticked(&self, slot: usize, bytes: u64) {
        let (s, owned) = self.stripe(slot);
        let now = s.bytes.add((bytes as i64).wrapping_neg(), owned);
        s.count.add(-1, owned);
        tick_low(s, owned, now);
    }

    /// `live`, keeping the stripe's extremes of the timeline's tick as well.
    #[inline]
    pub fn live_ticked(&self, slot: usize, bytes: i64, count: i64) {
        let (s, owned) = self.stripe(slot);
        let now = s.bytes.add(bytes, owned);
        s.count.add(count, owned);
        if bytes > 0 {
            tick_high(s, owned, now);
            self.raised(slot, s, owned, now);
        } else {
            tick_low(s, owned, now);
        }
    }

    /// What the level holds, and the highest and lowest it held since the last call (summed over
    /// the stripes: exact when one thread at a time changes the level, else bounds, off by the
    /// calls in flight at this moment), each stripe's starting again from what it holds. Once
    /// per tick, cold: one pass over the stripes.
    #[cold]
    pub fn take_tick(&self) -> Tick {
        let (mut live, mut high, mut low) = (0i64, 0i64, 0i64);
        for s in &self.stripes {
            let now = s.bytes.load(Relaxed);
            live = live.wrapping_add(now);
            high = high.wrapping_add(s.tick_high.swap(now, Relaxed).max(now));
            low = low.wrapping_add(s.tick_low.swap(now, Relaxed).min(now));
        }
        let live = live.max(0) as u64;
        Tick {
            live,
            high: high.max(0) as u64,
            low: low.max(0) as u64,
            // `peak` without a second pass: never below the live figure just summed.
            peak: self
                .peak
                .load(Relaxed)
                .max(self.earlier.load(Relaxed))
                .max(live),
        }
    }

    /// A successful pinning call of `bytes` that stays live: `alloc` and `live` with one look-up
    /// of the thread's stripe.
    #[inline(always)]
    pub fn alloc_live(&self, slot: usize, bytes: u64) {
        let (s, owned) = self.stripe(slot);
        s.alloc_count.add(1, owned);
        s.alloc_bytes.add(bytes, owned);
        let now = s.bytes.add(bytes as i64, owned);
        s.count.add(1, owned);
        self.raised(slot, s, owned, now);
    }

    /// A successful pinning call of `bytes`, from the thread in `slot`.
    #[inline]
    pub fn alloc(&self, slot: usize, bytes: u64) {
        let (s, owned) = self.stripe(slot);
        s.alloc_count.add(1, owned);
        s.alloc_bytes.add(bytes, owned);
    }

    fn sum(&self, f: impl Fn(&Stripe) -> i64) -> i64 {
        self.stripes.iter().map(f).fold(0i64, i64::wrapping_add)
    }

    pub fn bytes(&self) -> u64 {
        self.sum(|s| s.bytes.load(Relaxed)).max(0) as u64
    }

    pub fn count(&self) -> u64 {
        self.sum(|s| s.count.load(Relaxed)).max(0) as u64
    }

    /// The peak over the level's whole life, never below the live figure as read now.
    pub fn peak(&self) -> u64 {
        self.window_peak().max(self.earlier.load(Relaxed))
    }

    /// The peak since the last `restart_peak` (or the start), never below the live figure.
    pub fn window_peak(&self) -> u64 {
        self.peak.load(Relaxed).max(self.bytes())
    }

    /// Starts the peak again from the live figure, the earlier peak kept apart (`peak` still
    /// answers the whole life's): a test's own peak (the C API's `pinguard_peak_window_start`).
    /// The highs come down first, so that the next call above the live figure sums the stripes.
    /// With threads pinning at that moment, the new peak is off by at most their calls in
    /// flight, as every peak here is. Nothing on the pinning path reads `earlier`.
    #[cold]
    pub fn restart_peak(&self) {
        self.lower_all();
        let was = self.peak.swap(self.bytes(), Relaxed);
        self.earlier.fetch_max(was, Relaxed);
    }

    pub fn alloc_count(&self) -> u64 {
        self.sum(|s| s.alloc_count.load(Relaxed) as i64) as u64
    }

    pub fn alloc_bytes(&self) -> u64 {
        self.sum(|s| s.alloc_bytes.load(Relaxed) as i64) as u64
    }

    /// The allocations' count and bytes and the peak, the level zeroed: what a folded callsite
    /// hands to the aggregate. A thread counting here at the same moment may lose its update
    /// (an owned stripe is written with a plain store); only a call that held the callsite across
    /// its fold can.
    pub fn drain(&self) -> (u64, u64, u64) {
        let got = (self.alloc_count(), self.alloc_bytes(), self.peak());
        self.reset();
        got
    }

    /// A fork child starts from nothing.
    pub fn reset(&self) {
        for s in &self.stripes {
            for c in [&s.bytes, &s.count, &s.high, &s.tick_high, &s.tick_low] {
                c.store(0, Relaxed);
            }
            s.alloc_count.store(0, Relaxed);
            s.alloc_bytes.store(0, Relaxed);
            s.sums.store(0, Relaxed);
        }
        self.bound.store(0, Relaxed);
        self.peak.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A level whose every stripe a sum reads: the slots are the test's own numbers, not handed
    /// out by the ledger (`slot_made` only ever raises the count, whichever test runs).
    fn new<const K: usize>() -> Level<K> {
        slot_made(63);
        Level::NEW
    }

    #[test]
    fn a_restarted_peak_starts_from_the_live_figure_and_the_lifes_peak_stays() {
        let l: Level<4> = new();
        l.live(0, 400, 1);
        l.live(5, 100, 1);
        l.live(0, -400, -1);
        l.restart_peak();
        assert_eq!((l.window_peak(), l.peak()), (100, 500));
        // A rise and fall after the restart, below the earlier peak, is the window's peak.
        l.live(0, 300, 1);
        l.live(0, -300, -1);
        assert_eq!((l.window_peak(), l.peak()), (400, 500));
        l.live(5, 700, 1);
        assert_eq!((l.window_peak(), l.peak()), (800, 800));
    }

    #[test]
    fn a_tick_takes_the_highest_and_lowest_since_the_last_and_starts_again() {
        let l: Level<4> = new();
        l.live_ticked(0, 100, 1);
        l.live_ticked(0, 50, 1);
        l.live_ticked(0, -100, -1);
        l.release_ticked(0, 50);
        l.grow_ticked(0, 120);
        let t = l.take_tick();
        assert_eq!((t.live, t.high, t.low, t.peak), (120, 150, 0, 150));
        // From what is held now: nothing moved, the tick's extremes are the live figure.
        let t = l.take_tick();
        assert_eq!((t.live, t.high, t.low), (120, 120, 120));
        l.release_ticked(0, 120);
        l.grow_ticked(0, 10);
        let t = l.take_tick();
        assert_eq!((t.live, t.high, t.low), (10, 120, 0));
        // Two threads' stripes: each stripe's extremes summed, bounds of the level's (it held
        // at most 40 and at least 10 here; the timeline clamps the highest to the peak).
        l.grow_ticked(0, 20);
        l.release_ticked(0, 20);
        l.grow_ticked(5, 20);
        l.release_ticked(5, 20);
        let t = l.take_tick();
        assert_eq!((t.live, t.high, t.low), (10, 50, 10));
    }

    #[test]
    fn one_thread_gets_the_exact_peak() {
        let l: Level<4> = new();
        l.live(0, 100, 1);
        l.live(0, 50, 1);
        l.live(0, -150, -2);
        l.live(0, 120, 1);
        assert_eq!((l.bytes(), l.count(), l.peak()), (120, 1, 150));
        l.live(0, 40, 1);
        assert_eq!(l.peak(), 160);
    }

    #[test]
    fn slots_sharing_the_last_stripe_still_add_up() {
        let l: Level<2> = new();
        for slot in 1..5 {
            l.live(slot, 10, 1);
            l.alloc(slot, 10);
        }
        l.live(0, -10, -1);
        assert_eq!(
            (
                l.bytes(),
                l.count(),
                l.alloc_count(),
                l.alloc_bytes(),
                l.peak()
            ),
            (30, 3, 4, 40, 40)
        );
    }

    #[test]
    fn threads_taking_turns_sum_to_the_peak_of_the_total() {
        // Slot 0 pins 100 and releases it; slot 1 then pins 60: never more than 100 at once.
        let l: Level<4> = new();
        l.live(0, 100, 1);
        l.live(0, -100, -1);
        l.live(1, 60, 1);
        assert_eq!(l.peak(), 100);
        // Slot 0 pins 70 while slot 1 holds 60: 130 at once.
        l.live(0, 70, 1);
        assert_eq!(l.peak(), 130);
        // A release by another slot than the one that pinned leaves the sums right.
        l.live(1, -70, -1);
        assert_eq!((l.bytes(), l.count()), (60, 1));
    }

    #[test]
    fn a_stripe_far_below_its_high_lowers_it() {
        let l: Level<4> = new();
        l.live(0, 1000, 1);
        l.live(0, -1000, -1);
        l.live(1, 10, 1); // bound 1010 > peak 1000: sums, and slot 1 is at its high
        l.live(0, 10, 1); // bound still above the peak: sums, and slot 0 lowers its high to 10
        assert_eq!(l.bound.load(Relaxed), 20);
        assert_eq!(l.peak(), 1000);
    }

    #[test]
    fn a_quiet_stripes_high_is_lowered_by_the_next_thread_that_sums() {
        // Slot 0 (a main thread) pins and releases once, then only slot 1 (its worker) pins: its
        // first sum brings slot 0's high down, and its later pairs sum nothing.
        let l: Level<4> = new();
        l.live(0, 4096, 1);
        l.live(0, -4096, -1);
        l.live(1, 4096, 1);
        assert_eq!(l.bound.load(Relaxed), 4096);
        for _ in 0..10 {
            l.live(1, -4096, -1);
            l.live(1, 4096, 1);
        }
        assert_eq!(
            l.stripes[1].sums.load(Relaxed),
            1,
            "the worker's pairs would sum every time"
        );
        // Slot 0 pinning again within what its high was is still seen: 8192 at once.
        l.live(0, 4096, 1);
        assert_eq!(l.peak(), 8192);
    }

    #[test]
    fn threads_taking_turns_sum_each_pin_and_lower_the_highs_one_sum_in_many() {
        // Slots 0 and 1 pin in turn and never at once: every pin can be a new peak as far as the
        // bound knows, so each sums, but lowering the other thread's high gains nothing there (it
        // pins again next) and costs a fence on every thread and a write to its line: the first
        // sum lowers, then one in LOWER_EVERY (the two threads' sums together).
        let l: Level<4> = new();
        let turns = 10_000;
        let mut lowered = 0;
        for _ in 0..turns {
            for slot in 0..2 {
                l.live(slot, 4096, 1);
                if l.stripes[1 - slot].high.load(Relaxed) == 0 {
                    lowered += 1;
                }
                l.live(slot, -4096, -1);
            }
        }
        assert_eq!(l.peak(), 4096);
        let sums = |i: usize| l.stripes[i].sums.load(Relaxed);
        assert!(
            sums(0) + sums(1) >= 2 * turns - 2,
            "every pin after the first should sum"
        );
        // (Slot 1's high is 0 at slot 0's first pin too: it has not pinned yet.)
        let most = 2 * turns / LOWER_EVERY + 2;
        assert!(lowered <= most, "lowered {lowered} times in {turns} turns");
    }

    #[test]
    fn two_threads_summing_write_only_their_own_stripes() {
        // Each thread counts its sums in its own stripe: the last stripe (shared by slots past
        // the first three) is a line both would write on every sum otherwise.
        let l: Level<4> = new();
        for _ in 0..100 {
            for slot in 0..2 {
                l.live(slot, 4096, 1);
                l.live(slot, -4096, -1);
            }
        }
        assert_eq!(l.stripes[3].sums.load(Relaxed), 0);
        assert!(l.stripes[0].sums.load(Relaxed) > 0 && l.stripes[1].sums.load(Relaxed) > 0);
    }
}
