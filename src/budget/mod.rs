//! The process budget: an atomic count of pinned bytes, live plus reserved by calls in flight.
//!
//! A call reserves before the real function runs and gives the reservation back if the call fails,
//! so no interleaving of threads can make the runtime hold more than the budget. The host reserve
//! (`host`) and the cgroup reserve (`cgroup`), both floors (`floor`), cap the same count, in the
//! same compare-and-swap.

pub mod cgroup;
pub mod floor;
pub mod group;
pub mod host;

use floor::Verdict;
use std::ops::{Index, IndexMut};
use std::sync::atomic::{AtomicU64, Ordering};

/// `LIMIT` when nothing is counted: no budget, no host reserve.
const NONE: u64 = u64::MAX;
/// `LIMIT` without a budget while the host reserve counts the bytes: no sum a call can make
/// reaches it, and the hot path without either keeps its one comparison.
const COUNT_ONLY: u64 = u64::MAX - 1;

static LIMIT: AtomicU64 = AtomicU64::new(NONE);
static USED: AtomicU64 = AtomicU64::new(0);
/// `PINGUARD_STRICT` and a setting that cannot be used: the budget is 0 for the process's life,
/// and its refusals say `config_error`. Read only once a call is refused, so the steady path is
/// the budget's own comparison, no more.
static CLOSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The process budget; after `host::init`, whose reserve needs the bytes counted too.
pub fn set_limit(limit: Option<u64>) {
    let word = match limit {
        Some(l) => l,
        None if floors_on() => COUNT_ONLY,
        None => NONE,
    };
    LIMIT.store(word, Ordering::Relaxed);
}

/// Fails closed (`PINGUARD_STRICT`): a budget of 0, whose every refusal is a `config_error`.
pub fn fail_closed() {
    CLOSED.store(true, Ordering::Relaxed);
    LIMIT.store(0, Ordering::Relaxed);
}

/// Whether the process failed closed (`fail_closed`): a refusal by the budget is then by that.
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// Whether any limit (the process's budget, the group's, the host or cgroup reserve) is in force.
pub fn limited() -> bool {
    limit().is_some() || group::limited() || floors_on()
}

/// Whether a floor (the host reserve, the cgroup reserve) is in force.
#[inline(always)]
fn floors_on() -> bool {
    host::on() || cgroup::floor().on()
}

/// Which limit refused a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The process's budget (`PINGUARD_BUDGET`).
    Budget,
    /// The group's budget (`PINGUARD_GROUP_BUDGET`).
    Group,
    /// The group's ledger could not be reached in time (its lock held past
    /// `group::LOCK_WAIT_MS`, by a member that does not run): the group's budget cannot be
    /// checked, so it is not to be exceeded.
    GroupUnavailable,
    /// The host reserve: the host's `available` bytes, as counted for the decision, would fall
    /// below it.
    Host { available: u64 },
    /// The cgroup reserve: the cgroup's headroom, as counted for the decision, would fall below it.
    Cgroup { headroom: u64 },
}

/// A floor under some memory figure, which pinning calls never push through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloorKind {
    /// The host reserve (`PINGUARD_HOST_RESERVE`), under `MemAvailable`.
    Host,
    /// The cgroup reserve (`PINGUARD_CGROUP_RESERVE`), under the cgroup's headroom.
    Cgroup,
}

impl FloorKind {
    /// Every floor, in the order a reservation checks them.
    pub const ALL: [FloorKind; 2] = [FloorKind::Host, FloorKind::Cgroup];

    pub fn floor(self) -> &'static floor::Floor {
        match self {
            FloorKind::Host => host::floor(),
            FloorKind::Cgroup => cgroup::floor(),
        }
    }

    /// Whether the group's shared reading decides this floor for this process (under the group's
    /// lock: `group::floors`), rather than the process's own reading.
    fn shared(self) -> bool {
        match self {
            FloorKind::Host => group::seated(),
            FloorKind::Cgroup => group::cgroup_shared(),
        }
    }

    /// The refusal, with the figure as counted for it.
    pub fn refused(self, figure: u64) -> Refused {
        match self {
            FloorKind::Host => Refused::Host { available: figure },
            FloorKind::Cgroup => Refused::Cgroup { headroom: figure },
        }
    }

    /// The refusal by the process's own reading, with `cur` reserved now.
    fn refused_now(self, cur: u64) -> Refused {
        self.refused(self.floor().available_now(cur))
    }
}

/// One `T` for each floor.
#[derive(Clone, Copy, Default)]
pub struct PerFloor<T>([T; 2]);

impl<T> Index<FloorKind> for PerFloor<T> {
    type Output = T;
    fn index(&self, k: FloorKind) -> &T {
        &self.0[k as usize]
    }
}

impl<T> IndexMut<FloorKind> for PerFloor<T> {
    fn index_mut(&mut self, k: FloorKind) -> &mut T {
        &mut self.0[k as usize]
    }
}

/// The bytes the process budget has handed out (live plus in flight), when it counts them.
pub fn reserved() -> Option<u64> {
    (LIMIT.load(Ordering::Relaxed) != NONE).then(|| USED.load(Ordering::Relaxed))
}

pub fn limit() -> Option<u64> {
    match LIMIT.load(Ordering::Relaxed) {
        NONE | COUNT_ONLY => None,
        l => Some(l),
    }
}

/// Bytes taken from the budgets (the process's and the group's) for one call. Given back when
/// dropped, unless `commit` says the call pinned them: a call that fails, returns early or unwinds
/// (a cancellation inside the runtime) can never leave its reservation behind.
#[must_use = "a reservation is given back when dropped"]
pub struct Reservation {
    bytes: u64,
}

impl Reservation {
    /// Nothing reserved: a call that pins nothing new (every page locked already, or more than
    /// the figures can hold under `warn`, which the kernel or the runtime rejects).
    pub fn none() -> Reservation {
        Reservation { bytes: 0 }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The call pinned the bytes: they stay counted until `release`, and are no longer in flight
    /// for the group's readings.
    #[inline]
    pub fn commit(self) {
        group::landed(self.bytes);
        std::mem::forget(self);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // Given back first: a reading between the two counts the bytes as in flight, not as in
        // the figure it reads, which errs on the side of the floor.
        release(self.bytes);
        group::landed(self.bytes);
    }
}

/// Runs a budget operation that is more than a few atomics (the group's ledger: shared memory
/// behind a lock, found with reads of `/proc`; the host reserve's reading of `/proc/meminfo`) on
/// this thread's own stack: the hooks call the budget from the caller's, and these are the only
/// parts that need more than a few hundred bytes of it. `f` calls a function kept out of line, so
/// that none of its frame lands in the caller's where the thread is already on its own stack.
#[inline(always)]
fn own_stack<R>(f: impl FnOnce() -> R) -> R {
    crate::runtime::workstack::run(crate::runtime::guard::here(), f)
}

// The three ways to take bytes: `reserve` (within every limit), `reserve_over` (whatever the
// limits, under `warn`) and `force` (locked already, no call to give them back).

/// Takes `bytes` if they fit every limit (the process budget, the group's, the host and cgroup
/// reserves), else says which limit refused.
#[inline]
pub fn reserve(bytes: u64) -> Result<Reservation, Refused> {
    try_reserve(bytes).map(|()| Reservation { bytes })
}

/// Takes `bytes` whatever the limits (`warn`), but only if the figures can hold them: a request
/// no machine can satisfy (SIZE_MAX) is left to the runtime, which rejects it, and no counter
/// ever saturates.
pub fn reserve_over(bytes: u64) -> Option<Reservation> {
    force_checked(bytes).then(|| Reservation { bytes })
}

/// Takes `bytes` if they fit every limit: the process budget, the group's, the host reserve.
// Always inlined: with no group and no reserve it is two loads and a test, and out of line the
// call cost a CUDA pair 19 instructions (callgrind).
#[inline(always)]
fn try_reserve(bytes: u64) -> Result<(), Refused> {
    try_reserve_process(bytes)?;
    if let Err(why) = group::reserve(bytes, false) {
        release_process(bytes);
        return Err(why);
    }
    Ok(())
}

/// Takes `bytes` if they fit the process budget and the host reserve's cap (a group member's
/// reserve is the group's to check). A compare-and-swap loop rather than add-then-roll-back: two
/// racing threads near the limit must not both be refused when one of them fits.
#[inline(always)]
fn try_reserve_process(bytes: u64) -> Result<(), Refused> {
    let limit = LIMIT.load(Ordering::Relaxed);
    if limit == NONE {
        // No budget, no reserve: nothing to refuse, whatever the size (SIZE_MAX is the runtime's
        // to reject), and nothing to count (the ledger has the live figures).
        return Ok(());
    }
    if floors_on() {
        return reserve_capped_on_own_stack(limit, bytes);
    }
    let mut cur = USED.load(Ordering::Relaxed);
    loop {
        let Some(next) = cur.checked_add(bytes).filter(|&n| n <= limit) else {
            return Err(Refused::Budget);
        };
        match USED.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Ok(()),
            Err(seen) => cur = seen,
        }
    }
}

/// `reserve_capped` on this thread's own stack. Out of line, with plain arguments: the steady
/// path without a floor builds no closure for it.
#[inline(never)]
fn reserve_capped_on_own_stack(limit: u64, bytes: u64) -> Result<(), Refused> {
    own_stack(|| reserve_capped(limit, bytes))
}

/// `try_reserve_process` with a floor in force: the same loop, also under the cap of each floor's
/// cached reading, and before a refusal under the cap of a reading taken afresh. Apart, so that
/// the paths without a floor stay as short as they were.
#[inline(never)]
fn reserve_capped(limit: u64, bytes: u64) -> Result<(), Refused> {
    let mut cur = USED.load(Ordering::Relaxed);
    let mut fresh = PerFloor::<bool>::default();
    'cas: loop {
        let Some(next) = cur.checked_add(bytes).filter(|&n| n <= limit) else {
            // Past the budget, or (floors alone) past what any host has.
            return Err(if limit == COUNT_ONLY {
                let first = if host::on() {
                    FloorKind::Host
                } else {
                    FloorKind::Cgroup
                };
                first.refused_now(cur)
            } else {
                Refused::Budget
            });
        };
        for kind in FloorKind::ALL {
            // A group member's host reserve is the group's shared reading, checked under its
            // lock; so is its cgroup reserve once the group keeps a reading of its cgroup.
            if !kind.floor().on() || kind.shared() {
                continue;
            }
            match against(kind.floor(), cur, next, &mut fresh[kind]) {
                Step::Fits => {}
                Step::ReadAgain => {
                    cur = USED.load(Ordering::Relaxed);
                    continue 'cas;
                }
                Step::Below => return Err(kind.refused_now(cur)),
            }
        }
        match USED.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return Ok(()),
            Err(seen) => cur = seen,
        }
    }
}

enum Step {
    Fits,
    /// Past a cached reading's cap: read afresh and decide again.
    ReadAgain,
    Below,
}

/// Whether `next` reserved bytes keep above floor `f`, with `cur` reserved now, by the process's
/// own reading (`floor::decide`; the reading's age was checked, and a due one taken, by `cap`).
#[inline]
fn against(f: &floor::Floor, cur: u64, next: u64, fresh: &mut bool) -> Step {
    let (cap, read_now) = f.cap(cur);
    *fresh |= read_now;
    match floor::decide(Some(next), cap, false, *fresh) {
        Verdict::Fits => Step::Fits,
        Verdict::Read => {
            *fresh = true;
            f.refresh(cur);
            Step::ReadAgain
        }
        // A reading that could not be used turned the floor off: nothing refuses.
        Verdict::Short if !f.on() => Step::Fits,
        Verdict::Short => Step::Below,
    }
}

/// Takes `bytes` whatever the limit (what the kernel reports after `mlockall`): exact, never
/// saturating; a sum past `u64::MAX` takes nothing.
pub fn force(bytes: u64) {
    // Locked already: never in flight.
    if force_checked(bytes) {
        group::landed(bytes);
    }
}

fn force_checked(bytes: u64) -> bool {
    if LIMIT.load(Ordering::Relaxed) != NONE
        && USED
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |c| {
                c.checked_add(bytes)
            })
            .is_err()
    {
        return false;
    }
    if group::reserve(bytes, true).is_err() {
        release_process(bytes);
        return false;
    }
    true
}

#[inline]
pub fn release(bytes: u64) {
    release_process(bytes);
    group::release(bytes);
}

#[inline]
fn release_process(bytes: u64) {
    if LIMIT.load(Ordering::Relaxed) == NONE {
        return;
    }
    // First: a cap never sees the room before it sees the release.
    if host::on() {
        host::floor().released(bytes);
    }
    if cgroup::floor().on() {
        cgroup::floor().released(bytes);
    }
    // Every release matches a reservation of the same size (`Reservation`, a live record), so this
    // never goes below zero; were it to, clamping keeps "everything is over budget" impossible.
    let _ = USED.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |c| {
        Some(c.saturating_sub(bytes))
    });
}

/// What a walk of the kernel's mappings found: `removed` bytes no longer locked go back, `added`
/// bytes locked behind pinguard's back are taken whatever the limit (they are locked already).
pub fn adjust(removed: u64, added: u64) {
    if removed > 0 {
        release(removed);
    }
    if added > 0 {
        force(added);
    }
}

/// In a fork child: nothing pinned yet.
pub fn reset() {
    USED.store(0, Ordering::Relaxed);
    host::floor().after_fork_child();
    cgroup::floor().after_fork_child();
}
