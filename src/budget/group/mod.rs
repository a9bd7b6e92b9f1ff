//! A budget shared by every process of a group on the host (`PINGUARD_GROUP`), through a ledger
//! in shared memory (layout: `pinguard_common::group`).
//!
//! A process-shared robust mutex guards the group's total and each member's share: a member
//! killed while holding it is detected by the next locker (`EOWNERDEAD`), and a member killed at
//! any other time is found by a later look for dead members and its bytes go back to the group.
//! A member holds its slot's semaphore in the group's System V set (`SEM_UNDO`: the kernel lowers
//! it when the process ends), so a look tells the living from the dead in any PID namespace;
//! without one (another IPC namespace, semaphores denied) by its pid and start time, from its
//! own PID namespace only, and from elsewhere it is never taken for dead (`live::judge`). A look
//! is rationed: once when a process joins, and, while the group is full, once per `RESCAN_MS`
//! for the whole group.
//!
//! The counters are exact: `used` is the sum of the members' shares, a reservation that would
//! pass `u64::MAX` is refused (never saturated), and a release takes back exactly what it names,
//! never more than the member holds.
//!
//! Everything here runs inside hooked calls: no cancellation point (raw system calls for `/proc`,
//! cancellation disabled while the lock is held) and no allocation under the lock.

mod file;
mod floors;
mod lock;
mod members;

pub use lock::LOCK_WAIT_MS;

use super::{FloorKind, Refused};
use crate::runtime::sys;
use file::{ext_at, header, member_at, Shared, LEDGER_DEV, LEDGER_INO, MAP, PATH};
use floors::{Done, Next, Pending};
use lock::{Locked, NoLock, Wait, TIMEOUTS};
use members::{
    forget_previous_image, let_go_semaphore, liveness, open_live, seat, warn_no_semaphore,
    warn_unverified, Dead, Joining, Scan, Seat, FORGET, HELD_ID, IPC_NS, MY_PID, NOT_JOINED,
    NO_SEM, NO_SLOT, PENDING_ADD, PENDING_RELEASE, REOPENS, SLOT,
};
use pinguard_common::group::{self as layout, Header, Member, MAX_MEMBERS};
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// This image made the ledger in use (it alone may remove it while nobody ever joined it).
static CREATED: AtomicBool = AtomicBool::new(false);

/// This process's own `PINGUARD_GROUP_BUDGET` (`u64::MAX`: none), for a ledger it makes anew.
static OWN_BUDGET: AtomicU64 = AtomicU64::new(u64::MAX);

/// How the ledger was had at start-up, for `PINGUARD_LOG=debug` (`how_opened`).
static HOW: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Opens or creates the group's ledger. Problems become lines in `errors`; the process then runs
/// with its own budget only.
pub fn init(name: &str, budget: Option<u64>, errors: &mut Vec<String>) {
    // Start-up may run inside the application's first hooked call, on a thread that can be
    // cancelled: the file work below is not to be a cancellation point.
    let _nc = sys::NoCancel::new();
    let path = layout::path(name);
    if let Ok(c) = CString::new(path.as_str()) {
        let _ = PATH.set(c);
    }
    OWN_BUDGET.store(budget.unwrap_or(u64::MAX), Ordering::Relaxed);
    match open_live(&path, budget) {
        Ok((o, removed)) => {
            let Some(h) = std::ptr::NonNull::new(o.h).map(Shared) else { return };
            let stored = h.budget();
            if let (Some(b), false) = (budget, o.created) {
                if b != stored {
                    errors.push(format!(
                        "PINGUARD_GROUP_BUDGET={b}: group {name} already has a budget of {stored} bytes, set by its first member; using that"
                    ));
                }
            }
            let _ = HOW.set(format!(
                "group {name}: {} {path}{}, budget {}",
                if o.created { "created its ledger" } else { "opened its ledger" },
                if removed { " (after removing one whose members were all gone)" } else { "" },
                if stored == u64::MAX { "none".to_string() } else { format!("{stored} bytes") }
            ));
            let _ = NAME.set(name.to_string());
            // Before the ledger is this image's to use: no thread can have joined yet, so every
            // slot with this process's pid and start time is the previous image's.
            forget_previous_image(h);
            LEDGER_DEV.store(o.id.0, Ordering::Relaxed);
            LEDGER_INO.store(o.id.1, Ordering::Relaxed);
            CREATED.store(o.created, Ordering::Relaxed);
            MAP.store(h.0.as_ptr(), Ordering::Release);
        }
        Err(why) => errors.push(format!("PINGUARD_GROUP={name:?}: the ledger {path} {why}; running WITHOUT the group budget (the process budget only)")),
    }
}

/// How the ledger was had at start-up (created, opened, an abandoned one removed first), for
/// `PINGUARD_LOG=debug`.
pub fn how_opened() -> Option<&'static str> {
    HOW.get().map(String::as_str)
}

/// Takes `bytes` from the group's budget if they fit, and if the host reserve (when this process
/// has one) lets the group have them (or whatever the limits, with `force`). `Err`: refused, and
/// nothing was taken; the caller must not release these bytes. A sum past `u64::MAX` is refused
/// even with `force`, and so is a process that cannot join because it cannot read its own start
/// time (the group's budget is not to be escaped that way). `Ok` with no ledger or no slot:
/// nothing to refuse. A ledger whose lock is held past `LOCK_WAIT_MS`: `out_of_reach`.
#[inline]
pub fn reserve(bytes: u64, force: bool) -> Result<(), Refused> {
    match header() {
        None => Ok(()),
        Some(h) => reserve_on_own_stack(h, bytes, force),
    }
}

/// `reserve_in` on this thread's own stack. Out of line, with plain arguments: the hooks' steady
/// path (no group) builds no closure for it, and the switch's frame stays out of theirs.
#[inline(never)]
fn reserve_on_own_stack(h: Shared, bytes: u64, force: bool) -> Result<(), Refused> {
    super::own_stack(|| reserve_in(h, bytes, force))
}

/// What a reservation does while the ledger cannot be reached: with a limit the group decides
/// (its budget, or the host reserve, which a member checks against the group's reading) the
/// call is refused (`GroupUnavailable`: the caller's policy answers it), for the group's budget
/// is never to be exceeded; otherwise, and for bytes taken whatever the limits (`force`), the
/// bytes are booked later (`Locked::settle`).
#[cold]
fn out_of_reach(h: Shared, bytes: u64, force: bool) -> Result<(), Refused> {
    if !force && (h.budget() != u64::MAX || FloorKind::ALL.iter().any(|k| k.floor().on())) {
        return Err(Refused::GroupUnavailable);
    }
    match PENDING_ADD.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
        p.checked_add(bytes)
    }) {
        Ok(_) => Ok(()),
        Err(_) => Err(Refused::Group),
    }
}

#[inline(never)]
fn reserve_in(h: Shared, bytes: u64, force: bool) -> Result<(), Refused> {
    let mut h = h;
    let mut reopens = 0;
    let mut w = Wait::new();
    let mut done = Done::default();
    let mut joining = None;
    let mut dead = Dead::none();
    let mut pending = Pending::default();
    let mut freed = 0;
    loop {
        let mut l = match Locked::new(h, &mut w) {
            Ok(l) => l,
            Err(NoLock::Gone) => return Ok(()),
            Err(NoLock::Busy) => return out_of_reach(h, bytes, force),
            Err(NoLock::Closed) => {
                reopens += 1;
                match (reopens <= REOPENS).then(|| reopen(h)).flatten() {
                    Some(n) => h = n,
                    None => return Ok(()),
                }
                dead = Dead::none();
                continue;
            }
        };
        freed += l.bury(&dead);
        dead = Dead::none();
        let (mut l, i) = match take_seat(l, h, &mut joining, &mut dead, &mut done) {
            Ok(seat) => seat,
            Err(Round::Again) => continue,
            Err(Round::Answer(a)) => return a,
        };
        let fits = |l: &Locked| {
            l.h()
                .used
                .checked_add(bytes)
                .is_some_and(|n| n <= l.h().budget)
        };
        if !force && !fits(&l) {
            if !done.room && l.room_scan_due() {
                drop(l);
                dead = Dead::look(h, Scan::Room);
                done.room = true;
                continue;
            }
            drop(l);
            log_freed(freed);
            return Err(Refused::Group);
        }
        let mut l = match floors::floors(l, i, bytes, force, &mut done, &mut pending) {
            Next::Book(l) => l,
            Next::Again => continue,
            Next::Scan => {
                dead = Dead::look(h, Scan::Room);
                continue;
            }
            Next::Refused(why) => {
                log_freed(freed);
                return Err(why);
            }
        };
        if !l.book(i, bytes) {
            return Err(Refused::Group);
        }
        // In flight until the call returns (`landed`): other members' readings meanwhile count
        // these bytes as not yet in the figures they read.
        h.in_flight(i).fetch_add(bytes, Ordering::Relaxed);
        drop(l);
        log_freed(freed);
        return Ok(());
    }
}

/// What `reserve_in` does when this process has no slot to decide in.
enum Round {
    /// Joining was prepared (the lock let go): take the lock again.
    Again,
    /// The call's answer, decided without the group.
    Answer(Result<(), Refused>),
}

/// This process's slot in the ledger `l` holds, the lock kept; else what to do instead (the lock
/// let go): prepare joining once (reading this process's identity and looking for dead members
/// without the lock), or go on alone when the group is full, or refuse when this process cannot
/// prove who it is.
fn take_seat(
    l: Locked,
    h: Shared,
    joining: &mut Option<Joining>,
    dead: &mut Dead,
    done: &mut Done,
) -> Result<(Locked, usize), Round> {
    let mut l = l;
    match seat(&mut l, joining.as_ref()) {
        Seat::In(i) => Ok((l, i)),
        Seat::Join if !done.joined => {
            drop(l);
            *joining = Some(Joining::read());
            *dead = Dead::look(h, Scan::Join);
            done.joined = true;
            Err(Round::Again)
        }
        Seat::Out(now) => {
            drop(l);
            if now {
                let _nc = sys::NoCancel::new();
                tracing::warn!("group: all {MAX_MEMBERS} member slots are taken; this process uses its own budget only");
            }
            Err(Round::Answer(Ok(())))
        }
        Seat::Unverified | Seat::Join => {
            drop(l);
            warn_unverified();
            Err(Round::Answer(Err(Refused::Group)))
        }
    }
}

fn log_freed(freed: u64) {
    warn_no_semaphore();
    if freed > 0 {
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::info!("group: reclaimed {freed} bytes of members that are gone");
    }
}

/// Gives back `bytes` that `reserve` took. A release larger than this member's share cannot be
/// one of its reservations (one that `reserve` refused, or a share lost with the slot): it
/// changes nothing, so the group's other bytes stay booked. A ledger out of reach: the release is
/// applied at this process's next taking of the lock (until then the group counts the bytes
/// still, which errs on the side of the budget).
#[inline]
pub fn release(bytes: u64) {
    if let Some(h) = header() {
        release_on_own_stack(h, bytes)
    }
}

/// `release_in` on this thread's own stack (out of line, as `reserve_on_own_stack`).
#[inline(never)]
fn release_on_own_stack(h: Shared, bytes: u64) {
    super::own_stack(|| release_in(h, bytes))
}

/// Bytes pinned while the ledger was out of reach, and released before they were booked.
fn unpend(bytes: u64) -> bool {
    PENDING_ADD
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
            p.checked_sub(bytes)
        })
        .is_ok()
}

#[inline(never)]
fn release_in(h: Shared, bytes: u64) {
    let i = SLOT.load(Ordering::Relaxed);
    if i >= MAX_MEMBERS {
        unpend(bytes);
        return;
    }
    let mut l = match Locked::new(h, &mut Wait::new()) {
        Ok(l) => l,
        Err(NoLock::Gone) | Err(NoLock::Closed) => return,
        Err(NoLock::Busy) => {
            if !unpend(bytes) {
                PENDING_RELEASE.fetch_add(bytes, Ordering::Relaxed);
            }
            return;
        }
    };
    if !l.owns(i) {
        return;
    }
    if let Err(held) = l.unbook(i, bytes) {
        drop(l);
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::debug!(
            "group: a release of {bytes} bytes exceeds this member's share of {held}; ignored"
        );
    }
}

pub fn note_denied() {
    // SAFETY: `m` points to a member slot in the mapping (`note`).
    note(|m| unsafe { std::ptr::addr_of_mut!((*m).denied) });
}

pub fn note_downgraded() {
    // SAFETY: as above.
    note(|m| unsafe { std::ptr::addr_of_mut!((*m).downgraded) });
}

/// A call the host reserve stopped (refused, downgraded or, under `warn`, pinned anyway).
pub fn note_host_reserve() {
    // SAFETY: as above.
    note(|m| unsafe { std::ptr::addr_of_mut!((*m).host_reserve) });
}

/// Whether this process holds a slot in a group: the group's shared reading then decides the host
/// reserve, under the group's lock, and the process's own cap is not needed.
#[inline]
pub fn seated() -> bool {
    SLOT.load(Ordering::Relaxed) < MAX_MEMBERS && !MAP.load(Ordering::Relaxed).is_null()
}

/// Whether this process holds a slot with a shared cgroup reading: the group's reading for its
/// cgroup then decides the cgroup reserve, under the group's lock, and its own cap is not needed.
#[inline]
pub fn cgroup_shared() -> bool {
    let (Some(h), i) = (header(), SLOT.load(Ordering::Relaxed)) else {
        return false;
    };
    i < MAX_MEMBERS && h.u32_at(ext_at(i, std::mem::offset_of!(layout::MemberExt, cgroup))) != 0
}

/// A call whose reservation this member booked returned (pinned, or failed and given back):
/// its bytes are no longer in flight. Saturating: bytes booked while the ledger was out of reach
/// were never in flight.
#[inline]
pub fn landed(bytes: u64) {
    let Some(h) = header() else { return };
    let i = SLOT.load(Ordering::Relaxed);
    if bytes > 0 && i < MAX_MEMBERS && h.member_id(i).0 == MY_PID.load(Ordering::Relaxed) {
        let _ = h
            .in_flight(i)
            .fetch_update(Ordering::Release, Ordering::Relaxed, |f| {
                Some(f.saturating_sub(bytes))
            });
    }
}

/// A call the cgroup reserve stopped (refused, downgraded or, under `warn`, pinned anyway).
pub fn note_cgroup_reserve() {
    let (Some(h), i) = (header(), SLOT.load(Ordering::Relaxed)) else {
        return;
    };
    if i < MAX_MEMBERS && h.member_id(i).0 == MY_PID.load(Ordering::Relaxed) {
        h.atomic_u64(ext_at(
            i,
            std::mem::offset_of!(layout::MemberExt, cgroup_reserve),
        ))
        .fetch_add(1, Ordering::Relaxed);
    }
}

fn note(field: impl Fn(*mut Member) -> *mut u64) {
    let (Some(h), i) = (header(), SLOT.load(Ordering::Relaxed)) else {
        return;
    };
    if i < MAX_MEMBERS {
        // SAFETY: `i` is in bounds; the place is in the published ledger mapping, and no
        // reference to the member is made (other processes write it under the lock).
        let m = unsafe { std::ptr::addr_of_mut!((*h.0.as_ptr()).members[i]) };
        if h.member_id(i).0 == MY_PID.load(Ordering::Relaxed) {
            // SAFETY: an aligned u64 of this member's slot, which other processes only read
            // under the lock or change when the slot is vacated; every writer adds atomically.
            unsafe { AtomicU64::from_ptr(field(m)) }.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// At exit: the process's pinned memory goes with it, and so does its share. A ledger out of
/// reach past the bound: the share stays booked until a look finds this process gone.
pub fn leave() {
    let Some(h) = header() else { return };
    // A vfork child runs in its parent's memory: the slot and its share are the parent's.
    if SLOT.load(Ordering::Relaxed) < MAX_MEMBERS
        // SAFETY: no arguments; it cannot fail.
        && unsafe { libc::getpid() } as u32 != MY_PID.load(Ordering::Relaxed)
    {
        return;
    }
    let i = SLOT.swap(NO_SLOT, Ordering::Relaxed);
    // A process that never joined only tries the lock: one that pins nothing never waits.
    let mut w = if i < MAX_MEMBERS {
        Wait::new()
    } else {
        Wait::once()
    };
    let Ok(mut l) = Locked::new(h, &mut w) else {
        return;
    };
    let member = l.owns(i);
    if member {
        l.vacate(i);
        let_go_semaphore();
    }
    // The last member to leave removes the ledger: a group's budget does not outlive the group.
    // One nobody joined is left to its creator, whose budget it holds.
    let unjoined_own = CREATED.load(Ordering::Relaxed) && l.h().joins == 0;
    if (member || unjoined_own) && l.empty() {
        l.close((
            LEDGER_DEV.load(Ordering::Relaxed),
            LEDGER_INO.load(Ordering::Relaxed),
        ));
    }
}

/// The ledger `old` was removed: the group's name opened again (or made anew, with this
/// process's budget), with the lock let go. The old mapping stays mapped (other threads may be
/// reading it), and is not used again. `None`: this process now runs on its own budget only.
#[cold]
fn reopen(old: Shared) -> Option<Shared> {
    let _nc = sys::NoCancel::new(); // file work and a line: no cancellation point
    let path = PATH.get()?.to_str().ok()?;
    let budget = Some(OWN_BUDGET.load(Ordering::Relaxed)).filter(|&b| b != u64::MAX);
    let (o, _) = match open_live(path, budget) {
        Ok(o) => o,
        Err(why) => {
            MAP.store(std::ptr::null_mut(), Ordering::Release);
            tracing::warn!("group: the ledger {path} was removed and {why}; this process now uses its own budget only");
            return None;
        }
    };
    let new = std::ptr::NonNull::new(o.h).map(Shared)?;
    let slot = SLOT.load(Ordering::Relaxed);
    match MAP.compare_exchange(old.0.as_ptr(), o.h, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            LEDGER_DEV.store(o.id.0, Ordering::Relaxed);
            LEDGER_INO.store(o.id.1, Ordering::Relaxed);
            CREATED.store(o.created, Ordering::Relaxed);
            // No slot in the removed ledger: this process joins the new one (unless another
            // thread already did).
            let _ = SLOT.compare_exchange(slot, NOT_JOINED, Ordering::Relaxed, Ordering::Relaxed);
            tracing::debug!(
                "group: the ledger was removed under this process; joined {path} again"
            );
            Some(new)
        }
        Err(current) => {
            // Another thread opened it again first: its mapping is the one in use.
            // SAFETY: unmaps the mapping made above, which nothing else refers to.
            unsafe { libc::munmap(o.h as *mut _, layout::SIZE) };
            std::ptr::NonNull::new(current).map(Shared)
        }
    }
}

/// In a fork child: a new process, which joins as a member of its own when it first pins.
pub fn after_fork_child() {
    CREATED.store(false, Ordering::Relaxed); // the parent's ledger: it removes it
    if SLOT.load(Ordering::Relaxed) != NO_SLOT || !MAP.load(Ordering::Relaxed).is_null() {
        SLOT.store(NOT_JOINED, Ordering::Relaxed);
    }
    PENDING_ADD.store(0, Ordering::Relaxed);
    PENDING_RELEASE.store(0, Ordering::Relaxed);
    FORGET.store(false, Ordering::Relaxed);
    // A fork child holds none of its parent's semaphores (its undo list is its own).
    HELD_ID.store(-1, Ordering::Relaxed);
    NO_SEM.store(0, Ordering::Relaxed);
    IPC_NS.store(0, Ordering::Relaxed);
}

pub fn limited() -> bool {
    header().is_some_and(|h| h.budget() != u64::MAX)
}

pub struct Snapshot {
    pub name: String,
    pub budget: Option<u64>,
    pub used: u64,
    pub peak: u64,
    pub members: usize,
    /// The largest host reserve a member applies.
    pub host_reserve: Option<u64>,
    /// The lowest `MemAvailable` a member read for it.
    pub host_lowest_available: Option<u64>,
    /// Calls the host reserve stopped, summed over the members in the group now.
    pub host_reserve_count: u64,
    /// The largest cgroup reserve a member in this process's cgroup applies, and the lowest
    /// headroom any of them read (`None`: no shared cgroup reading for this process).
    pub cgroup_reserve: Option<u64>,
    pub cgroup_lowest_headroom: Option<u64>,
    /// Calls the cgroup reserve stopped, summed over the members in the group now.
    pub cgroup_reserve_count: u64,
    /// The ledger's lock was held: the figures were read without it.
    pub unreachable: bool,
    /// This process's waits for the lock that ran out.
    pub lock_timeouts: u64,
    /// How the other members tell this one alive: `semaphore`, or `pid (WHY)` (only from its own
    /// PID namespace); `None` before it joined.
    pub liveness: Option<String>,
}

/// The group's figures: under the lock when it is free, else read without it (figures of one
/// moment, as `pinguard top` reads them).
pub fn snapshot() -> Option<Snapshot> {
    let h = header()?;
    // Figures for a report only try the lock: they never wait (a process that pinned nothing
    // never waits at all, and a member's exit waits once, to leave). A ledger its last member
    // removed is still this process's group, its figures final (nobody writes a closed ledger):
    // read as they stand, as after a lock (a process that never got to join, its calls refused
    // before, reported no group at all).
    let (locked, unreachable) = match Locked::new(h, &mut Wait::once()) {
        Ok(l) => (Some(l), false),
        Err(NoLock::Gone) => return None,
        Err(NoLock::Closed) => (None, false),
        Err(NoLock::Busy) => (None, true),
    };
    use std::mem::offset_of;
    let live = || (0..MAX_MEMBERS).filter(|&i| h.member_id(i).0 != 0);
    let members = live().count();
    let stopped = live()
        .map(|i| h.u64_at(member_at(i, offset_of!(Member, host_reserve))))
        .fold(0u64, u64::saturating_add);
    let (budget, used, peak) = (
        h.budget(),
        h.u64_at(offset_of!(Header, used)),
        h.u64_at(offset_of!(Header, peak)),
    );
    let (reserve, lowest) = (
        h.u64_at(offset_of!(Header, host_reserve)),
        h.u64_at(offset_of!(Header, host_lowest_available)),
    );
    let cg_stopped = live()
        .map(|i| h.u64_at(ext_at(i, offset_of!(layout::MemberExt, cgroup_reserve))))
        .fold(0u64, u64::saturating_add);
    let (cg_reserve, cg_lowest) = cgroup_figures(h);
    drop(locked);
    Some(Snapshot {
        name: NAME.get().cloned().unwrap_or_default(),
        budget: (budget != u64::MAX).then_some(budget),
        used,
        peak,
        members,
        host_reserve: (reserve != 0).then_some(reserve),
        host_lowest_available: (lowest != u64::MAX).then_some(lowest),
        host_reserve_count: stopped,
        cgroup_reserve: cg_reserve,
        cgroup_lowest_headroom: cg_lowest,
        cgroup_reserve_count: cg_stopped,
        unreachable,
        lock_timeouts: TIMEOUTS.load(Ordering::Relaxed),
        liveness: liveness(),
    })
}

/// This process's cgroup's shared reserve and lowest headroom, read without the lock.
fn cgroup_figures(h: Shared) -> (Option<u64>, Option<u64>) {
    use std::mem::offset_of;
    let i = SLOT.load(Ordering::Relaxed);
    let k = if i < MAX_MEMBERS {
        h.u32_at(ext_at(i, offset_of!(layout::MemberExt, cgroup))) as usize
    } else {
        0
    };
    let Some(k) = k.checked_sub(1).filter(|&k| k < layout::MAX_CGROUPS) else {
        return (None, None);
    };
    let at = |f: usize| {
        h.u64_at(offset_of!(Header, cgroups) + k * std::mem::size_of::<layout::Cgroup>() + f)
    };
    let (reserve, lowest) = (
        at(offset_of!(layout::Cgroup, reserve)),
        at(offset_of!(layout::Cgroup, lowest)),
    );
    (
        (reserve != 0).then_some(reserve),
        (reserve != 0 && lowest != u64::MAX).then_some(lowest),
    )
}
