//! Members and their liveness: joining (a slot, its semaphore), the previous image's slot after
//! `execve`, a member's booked share, the look for dead members and their burial, and a ledger
//! nobody lives in any more.

use super::file::{self, Opened, Shared, PATH};
use super::lock::{Locked, NoLock, Wait};
use crate::runtime::clock::monotonic_ms;
use crate::runtime::kernel::{self, proc_start};
use crate::runtime::sys;
use pinguard_common::group::live::{self, Here, Proc, Set, Verdict};
use pinguard_common::group::{self as layout, Header, Member, MAX_MEMBERS};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

pub(super) static SLOT: AtomicUsize = AtomicUsize::new(NOT_JOINED);
pub(super) const NOT_JOINED: usize = usize::MAX;
pub(super) const NO_SLOT: usize = usize::MAX - 1;

/// The pid this process joined with: a slot whose pid is another is no longer this process's.
pub(super) static MY_PID: AtomicU32 = AtomicU32::new(0);

/// Removals of an abandoned ledger one opening makes at most before it gives up.
pub(super) const REOPENS: u32 = 3;

/// The group's ledger, opened or created. One that nobody lives in (every member gone: the last
/// was killed, or a pinguard before this one left it) is removed first, under its lock, and made
/// anew with this process's budget; whether that happened.
pub(super) fn open_live(path: &str, budget: Option<u64>) -> Result<(Opened, bool), String> {
    let mut removed = false;
    for _ in 0..REOPENS {
        let o = file::open_or_create(path, budget)?;
        let Some(h) = std::ptr::NonNull::new(o.h).map(Shared) else {
            return Err("cannot be mapped".into());
        };
        // Not removed (its lock held, a member joined meanwhile): someone is in it, and it is
        // this process's group.
        if o.created || !abandoned(h) || !remove_abandoned(h, o.id) {
            return Ok((o, removed));
        }
        removed = true;
        // SAFETY: unmaps the mapping made just above, which nothing else refers to (never
        // published to this process's threads).
        unsafe { libc::munmap(o.h as *mut _, layout::SIZE) };
    }
    Err("keeps being removed under us".into())
}

/// Whether nobody lives in the ledger: it is closed, or it was joined and every member in it is
/// gone (read without the lock; `remove_abandoned` checks again under it). One nobody joined yet
/// is its creator's, which joins at its first pin: the processes of a group start together, and
/// each replacing the one before would leave some without the group.
fn abandoned(h: Shared) -> bool {
    if h.u32_at(std::mem::offset_of!(Header, closed)) != 0 {
        return true;
    }
    if h.u64_at(std::mem::offset_of!(Header, joins)) == 0 {
        return false;
    }
    let here = here();
    (0..MAX_MEMBERS).all(|i| {
        let (seen, _) = h.member_seen(i);
        seen.pid == 0 || {
            let value = |key: i32| Set::open(key).ok()?.value(i).ok();
            live::judge(&seen, here, value, proc_start) == Verdict::Gone
        }
    })
}

/// Buries the gone members of an abandoned ledger (found without the lock, as any look) and, when
/// that leaves none, closes it and unlinks its name. Only tries the lock: a ledger whose lock is
/// held has someone in it. Whether it was removed.
fn remove_abandoned(h: Shared, id: (u64, u64)) -> bool {
    let mut dead = Dead::look(h, Scan::Join);
    for _ in 0..MAX_MEMBERS / Dead::MAX + 1 {
        let Ok(mut l) = Locked::any(h, &mut Wait::once()) else {
            return false;
        };
        l.bury(&dead);
        if l.h().closed != 0 || (l.empty() && l.h().joins != 0) {
            l.close(id);
            return true;
        }
        if dead.n < Dead::MAX {
            return false; // someone joined since the look
        }
        drop(l);
        dead = Dead::look(h, Scan::Join); // more gone members than one look holds
    }
    false
}

/// Bytes this process pinned whatever the limits (`force`) while the ledger could not be reached,
/// and bytes it released meanwhile: folded into its share at its next taking of the lock, so the
/// group's figures heal (`Locked::settle`).
pub(super) static PENDING_ADD: AtomicU64 = AtomicU64::new(0);
pub(super) static PENDING_RELEASE: AtomicU64 = AtomicU64::new(0);

/// Whether a previous image's slot (`forget_previous_image`) is still to be emptied: start-up only
/// tries the lock, and the first taking of it does the rest.
pub(super) static FORGET: AtomicBool = AtomicBool::new(false);

/// This image's pid and start time, for that.
static IMAGE_PID: AtomicU32 = AtomicU32::new(0);
static IMAGE_TICKS: AtomicU64 = AtomicU64::new(0);

/// This image's executable's name, for the slot it takes over from the previous image.
static IMAGE_EXE: std::sync::OnceLock<[u8; layout::EXE_BYTES]> = std::sync::OnceLock::new();

/// This process's IPC and PID namespaces (0: not read yet; read again in a fork child, which a
/// `clone` may have put in new ones).
pub(super) static IPC_NS: AtomicU64 = AtomicU64::new(0);
static PID_NS: AtomicU64 = AtomicU64::new(0);

/// The set and slot in which this process holds a semaphore (-1: none): what `leave` lowers.
pub(super) static HELD_ID: AtomicI32 = AtomicI32::new(-1);
static HELD_SLOT: AtomicUsize = AtomicUsize::new(0);

/// Why this process holds no semaphore though it joined (0: it holds one, or has not joined):
/// an errno of `semget`/`semop` (a sandbox denying them, the kernel's limit on sets), or one of
/// `NO_SEM_*`. Its liveness is then told by its pid (`Snapshot::liveness`).
pub(super) static NO_SEM: AtomicI32 = AtomicI32::new(0);
const NO_SEM_OTHER_NS: i32 = -1;
const NO_SEM_NS_UNKNOWN: i32 = -2;

/// This process's namespaces, read once (a `stat` of each `/proc/self/ns` file, no descriptor).
fn here() -> Here {
    let ipc = IPC_NS.load(Ordering::Relaxed);
    if ipc != 0 {
        return Here {
            ipc_ns: ipc,
            pid_ns: PID_NS.load(Ordering::Relaxed),
        };
    }
    let h = Here::read();
    PID_NS.store(h.pid_ns, Ordering::Relaxed);
    IPC_NS.store(h.ipc_ns, Ordering::Relaxed);
    h
}

/// Raises slot `i`'s semaphore for this process (`SEM_UNDO`), in the group's set, creating the
/// set when there is none in this IPC namespace. Under the lock, before the slot is written: a
/// look that reads the slot then finds the semaphore raised. The set's key, or 0 (none held:
/// `NO_SEM` says why).
fn hold_semaphore(l: &mut Locked, i: usize, here: Here) -> i32 {
    let why = match open_or_create_set(l, here) {
        Ok(set) => match set.hold(i) {
            Ok(()) => {
                HELD_SLOT.store(i, Ordering::Relaxed);
                HELD_ID.store(set.id, Ordering::Relaxed);
                NO_SEM.store(0, Ordering::Relaxed);
                return set.key;
            }
            Err(e) => e,
        },
        Err(e) => e,
    };
    NO_SEM.store(why, Ordering::Relaxed);
    0
}

fn open_or_create_set(l: &mut Locked, here: Here) -> Result<Set, c_int> {
    if here.ipc_ns == 0 {
        return Err(NO_SEM_NS_UNKNOWN);
    }
    let (key, ns) = (l.h().sem_key, l.h().sem_ipc_ns);
    if key != 0 && ns != here.ipc_ns {
        return Err(NO_SEM_OTHER_NS);
    }
    if key != 0 {
        match Set::open(key) {
            Ok(set) => return Ok(set),
            // Removed (`ipcrm`), or its namespace ended and another got its number: a new set.
            // Members that hold a semaphore in the old one keep its key in their slots.
            Err(libc::ENOENT) | Err(libc::EIDRM) | Err(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    let set = Set::create()?;
    let h = l.h_mut();
    h.sem_key = set.key;
    h.sem_ipc_ns = here.ipc_ns;
    Ok(set)
}

/// Lowers the semaphore this process holds (leaving, or joining again in another slot), so that
/// the slot's next member is not taken for alive on its account.
pub(super) fn let_go_semaphore() {
    let id = HELD_ID.swap(-1, Ordering::Relaxed);
    if id >= 0 {
        let _ = Set { id, key: 0 }.let_go(HELD_SLOT.load(Ordering::Relaxed));
    }
}

impl Locked {
    /// The ledger, locked within `w`'s bound, with this process's pending figures folded in;
    /// `Closed` for a ledger that was removed (nothing of this process's is booked in it).
    pub(super) fn new(ledger: Shared, w: &mut Wait) -> Result<Locked, NoLock> {
        let mut l = Locked::any(ledger, w)?;
        if l.h().closed != 0 {
            return Err(NoLock::Closed);
        }
        l.settle();
        Ok(l)
    }

    /// Whether no slot is taken.
    pub(super) fn empty(&self) -> bool {
        self.h().members.iter().all(|m| m.pid == 0)
    }

    /// Removes the ledger, which no member holds a slot in: closed first (a process that mapped it
    /// and joins later sees the mark and opens the group's name again), then its semaphore set
    /// and its name, while the name is still this file's (`id`). Under the lock, which every
    /// joiner takes: nobody joins between the check that it is empty and the mark.
    pub(super) fn close(&mut self, id: (u64, u64)) {
        self.remove_set_if_empty();
        self.h_mut().closed = 1;
        let Some(path) = PATH.get() else { return };
        if sys::path_id(path).is_some_and(|f| (f.dev, f.ino) == id) {
            // SAFETY: a NUL-terminated path; the name is the group's ledger, this very file.
            unsafe { libc::unlink(path.as_ptr()) };
        }
    }

    /// Applies what this process could not while the ledger was out of reach: the previous
    /// image's slot to empty, bytes pinned and released meanwhile.
    pub(super) fn settle(&mut self) {
        if FORGET.load(Ordering::Relaxed) && FORGET.swap(false, Ordering::Relaxed) {
            self.forget_image();
        }
        if PENDING_ADD.load(Ordering::Relaxed) == 0 && PENDING_RELEASE.load(Ordering::Relaxed) == 0
        {
            return;
        }
        let i = SLOT.load(Ordering::Relaxed);
        if !self.owns(i) {
            return; // not joined yet: a join folds them in
        }
        let add = PENDING_ADD.swap(0, Ordering::Relaxed);
        if add > 0 {
            self.book(i, add);
        }
        let released = PENDING_RELEASE.swap(0, Ordering::Relaxed);
        if released > 0 {
            let _ = self.unbook(i, released);
        }
    }

    /// Adds `bytes` to member `i`'s share and the group's total; `false` (nothing changed) for
    /// a sum past `u64::MAX`.
    pub(super) fn book(&mut self, i: usize, bytes: u64) -> bool {
        let (Some(used), Some(share)) = (
            self.h().used.checked_add(bytes),
            self.h().members[i].bytes.checked_add(bytes),
        ) else {
            return false;
        };
        let h = self.h_mut();
        h.used = used;
        h.peak = h.peak.max(used);
        let m = &mut h.members[i];
        m.bytes = share;
        m.peak = m.peak.max(share);
        true
    }

    /// Takes `bytes` off member `i`'s share; `Err(share)` (nothing changed) for more than it holds.
    pub(super) fn unbook(&mut self, i: usize, bytes: u64) -> Result<(), u64> {
        let m = &mut self.h_mut().members[i];
        let Some(share) = m.bytes.checked_sub(bytes) else {
            return Err(m.bytes);
        };
        m.bytes = share;
        self.h_mut().used = match self.h().used.checked_sub(bytes) {
            Some(u) => u,
            None => self.sum_of_shares(),
        };
        if self.h().host_reserve > 0 {
            let h = self.h_mut();
            h.host_released = h.host_released.saturating_add(bytes);
        }
        if let Some(k) = self
            .entry_of(i)
            .filter(|&k| self.h().cgroups[k].reserve > 0)
        {
            let c = &mut self.h_mut().cgroups[k];
            c.released = c.released.saturating_add(bytes);
        }
        Ok(())
    }

    /// The previous image's slot (this image's pid and start time): its share goes back to the
    /// group, and this image takes the slot over with a share of 0. The semaphore the previous
    /// image raised is still raised (`SEM_UNDO` adjustments survive `execve`), so it is this
    /// image's: a new slot would leave it raised for as long as the process lives.
    fn forget_image(&mut self) {
        let (pid, ticks) = (
            IMAGE_PID.load(Ordering::Relaxed),
            IMAGE_TICKS.load(Ordering::Relaxed),
        );
        // Pid 1 of two containers can start in the same clock tick: the PID namespace tells them apart.
        let pid_ns = here().pid_ns;
        for i in 0..MAX_MEMBERS {
            let m = &self.h().members[i];
            if m.pid != pid
                || m.start_ticks != ticks
                || m.pid_ns != pid_ns
                || (i == SLOT.load(Ordering::Relaxed) && self.owns(i))
            {
                continue;
            }
            if SLOT.load(Ordering::Relaxed) == NOT_JOINED {
                self.take_over(i, pid);
            } else {
                self.vacate(i);
            }
        }
    }

    /// The last member to leave removes the group's semaphore set (a set outlives its
    /// processes, until its IPC namespace ends): the next to join makes a new one. Only a member
    /// in the set's namespace can; a member that holds a semaphore has a slot.
    fn remove_set_if_empty(&mut self) {
        let (key, ns) = (self.h().sem_key, self.h().sem_ipc_ns);
        if key == 0 || ns != here().ipc_ns || self.h().members.iter().any(|m| m.pid != 0) {
            return;
        }
        match Set::open(key) {
            Ok(set) => set.remove(),
            Err(libc::ENOENT) => {}
            Err(_) => return, // denied to this member (a sandbox): left to the next to leave
        }
        let h = self.h_mut();
        (h.sem_key, h.sem_ipc_ns) = (0, 0);
    }

    /// Makes slot `i`, the previous image's, this image's with a share of 0.
    fn take_over(&mut self, i: usize, pid: u32) {
        let bytes = self.h().members[i].bytes;
        let used = self
            .h()
            .used
            .checked_sub(bytes)
            .unwrap_or_else(|| self.sum_of_shares().saturating_sub(bytes));
        let exe = IMAGE_EXE.get().copied().unwrap_or([0; layout::EXE_BYTES]);
        let here = here();
        self.clear_ext(i);
        let h = self.h_mut();
        h.used = used;
        let m = &mut h.members[i];
        (
            m.bytes,
            m.peak,
            m.denied,
            m.downgraded,
            m.host_reserve,
            m.exe,
        ) = (0, 0, 0, 0, 0, exe);
        if m.sem_key != 0 && m.ipc_ns == here.ipc_ns {
            if let Ok(set) = Set::open(m.sem_key) {
                HELD_SLOT.store(i, Ordering::Relaxed);
                HELD_ID.store(set.id, Ordering::Relaxed);
            }
        }
        MY_PID.store(pid, Ordering::Relaxed);
        SLOT.store(i, Ordering::Relaxed);
    }

    /// Empties slot `i`, giving its share back to the group.
    pub(super) fn vacate(&mut self, i: usize) {
        let bytes = self.h().members[i].bytes;
        // SAFETY: `Member` is plain data; all zeroes is a free slot.
        self.h_mut().members[i] = unsafe { std::mem::zeroed() };
        self.clear_ext(i);
        self.h_mut().used = match self.h().used.checked_sub(bytes) {
            Some(u) => u,
            None => self.sum_of_shares(), // a ledger someone edited: back to the truth
        };
    }

    /// Empties slot `i`'s figures beyond version 4's (`in_flight` atomically: its member may be
    /// taking bytes off it now, and then takes off none that are not its own).
    fn clear_ext(&mut self, i: usize) {
        let e = &mut self.h_mut().ext[i];
        (e.cgroup, e.cgroup_reserve) = (0, 0);
        self.ledger.in_flight(i).store(0, Ordering::Relaxed);
    }

    /// Whether slot `i` is still this process's (a member wrongly taken for dead, or a second
    /// copy of pinguard in the process, may have lost it).
    pub(super) fn owns(&self, i: usize) -> bool {
        i < MAX_MEMBERS && self.h().members[i].pid == MY_PID.load(Ordering::Relaxed)
    }

    /// Empties the slots `dead` found, those still held by the very process found gone; returns
    /// the bytes freed.
    pub(super) fn bury(&mut self, dead: &Dead) -> u64 {
        match dead.why {
            None => return 0,
            Some(Scan::Join) => self.h_mut().join_scans = self.h().join_scans.wrapping_add(1),
            Some(Scan::Room) => self.h_mut().room_scans = self.h().room_scans.wrapping_add(1),
        }
        let mut freed = 0u64;
        for &(i, pid, ticks, serial) in &dead.found[..dead.n] {
            let m = &self.h().members[i as usize];
            if m.pid == pid && m.start_ticks == ticks && m.serial == serial {
                freed = freed.saturating_add(m.bytes);
                self.vacate(i as usize);
            }
        }
        freed
    }

    /// Whether a member that needs room may look for dead members now: once per `RESCAN_MS` for
    /// the whole group, so a full group's refusals cost a clock read, not a `/proc` walk.
    pub(super) fn room_scan_due(&mut self) -> bool {
        let now = monotonic_ms();
        let after = self.h().rescan_after_ms;
        // A deadline further ahead than one interval was set by a clock that is not ours (another
        // time namespace): it must not silence the scan.
        if now >= after || after > now.saturating_add(layout::RESCAN_MS) {
            self.h_mut().rescan_after_ms = now.saturating_add(layout::RESCAN_MS);
            return true;
        }
        false
    }
}

/// Members found gone by a look made without the lock: slot, pid, start time and join serial,
/// so that only a slot still held by that very member is emptied (`Locked::bury`). Bounded: more
/// dead members than this wait for the next look.
pub(super) struct Dead {
    pub(super) why: Option<Scan>,
    pub(super) n: usize,
    pub(super) found: [(u16, u32, u64, u64); Dead::MAX],
}

impl Dead {
    const MAX: usize = 16;

    pub(super) fn none() -> Dead {
        Dead {
            why: None,
            n: 0,
            found: [(0, 0, 0, 0); Dead::MAX],
        }
    }

    /// Judges every member (`live::judge`): the ledger's fields read one at a time, without the
    /// lock, each slot before its semaphore (a slot that changes meanwhile is not emptied, as
    /// `bury` checks it again). One reading of every semaphore first spares the living a call
    /// each: a member whose semaphore was raised then is not looked at again.
    pub(super) fn look(h: Shared, why: Scan) -> Dead {
        let mut d = Dead {
            why: Some(why),
            ..Dead::none()
        };
        let me = SLOT.load(Ordering::Relaxed);
        let here = here();
        let mut raised = [0u16; MAX_MEMBERS];
        let set = h.set_here(here).filter(|s| s.values(&mut raised).is_ok());
        for (i, &raised_i) in raised.iter().enumerate() {
            let (seen, serial) = h.member_seen(i);
            if seen.pid == 0 || (i == me && seen.pid == MY_PID.load(Ordering::Relaxed)) {
                continue;
            }
            if set.is_some_and(|s| s.key == seen.sem_key && raised_i > 0) {
                continue;
            }
            let value = |key: i32| match set.filter(|s| s.key == key) {
                Some(s) => s.value(i).ok(),
                None => Set::open(key).ok()?.value(i).ok(),
            };
            if live::judge(&seen, here, value, proc_start) == Verdict::Gone {
                d.found[d.n] = (i as u16, seen.pid, seen.start_ticks, serial);
                d.n += 1;
                if d.n == Dead::MAX {
                    break;
                }
            }
        }
        d
    }
}

impl Locked {
    /// Member `i`'s cgroup entry.
    pub(super) fn entry_of(&self, i: usize) -> Option<usize> {
        (self.h().ext[i].cgroup as usize)
            .checked_sub(1)
            .filter(|&k| k < layout::MAX_CGROUPS)
    }
}

#[derive(Clone, Copy)]
pub(super) enum Scan {
    Join,
    Room,
}

/// After `execve` the process keeps its pid and start time, and pinguard starts afresh in the new
/// image. A live member with this process's pid and start time is therefore its previous image
/// (a process is never a member twice), whose pinned memory the kernel released at exec: its
/// share goes back to the group, and the new image starts with none. Start-up only tries the
/// lock (a process that pins nothing never waits): held, the work is left to the first taking.
pub(super) fn forget_previous_image(h: Shared) {
    // SAFETY: no arguments; it cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let Proc::Started(ticks) = proc_start(pid) else {
        return;
    };
    let mut exe = [0u8; layout::EXE_BYTES];
    kernel::exe_name(&mut exe);
    let _ = IMAGE_EXE.set(exe);
    here(); // read now, not under the lock that taking the slot over holds
    IMAGE_PID.store(pid, Ordering::Relaxed);
    IMAGE_TICKS.store(ticks, Ordering::Relaxed);
    FORGET.store(true, Ordering::Relaxed);
    // `settle` empties the slot when the lock is had, now or at the first taking.
    drop(Locked::new(h, &mut Wait::once()));
}

/// Where this process sits in the group.
pub(super) enum Seat {
    /// Its slot.
    In(usize),
    /// Out of the group (every slot was taken when it joined): its own budget only. `true` when
    /// that was found just now.
    Out(bool),
    /// It cannot say when it started (`/proc` unreadable: out of descriptors, say), so it cannot
    /// be recorded: a member without its start time would be taken for dead by the next look.
    Unverified,
    /// It is to join, and has not read what a join needs (its start time, the dead members):
    /// the caller reads them with the lock let go.
    Join,
}

/// What a join needs, read before the lock: this process's start time, executable's name and
/// namespaces.
pub(super) struct Joining {
    pub(super) pid: u32,
    ticks: Proc,
    exe: [u8; layout::EXE_BYTES],
    pub(super) here: Here,
}

impl Joining {
    pub(super) fn read() -> Joining {
        // SAFETY: no arguments; it cannot fail.
        let pid = unsafe { libc::getpid() } as u32;
        let mut exe = [0u8; layout::EXE_BYTES];
        kernel::exe_name(&mut exe);
        Joining {
            pid,
            ticks: proc_start(pid),
            exe,
            here: here(),
        }
    }
}

/// This process's slot, joining the group on first use (and again in a fork child, or when the
/// slot was lost) with what `joining` read.
pub(super) fn seat(l: &mut Locked, joining: Option<&Joining>) -> Seat {
    match SLOT.load(Ordering::Relaxed) {
        NO_SLOT => return Seat::Out(false),
        NOT_JOINED => {}
        s if l.owns(s) => return Seat::In(s),
        _ => {} // taken from us: join again, with a share of 0 (what we held is no longer booked)
    }
    let Some(j) = joining else { return Seat::Join };
    let Proc::Started(ticks) = j.ticks else {
        return Seat::Unverified;
    };
    let Some(i) = l.h().members.iter().position(|m| m.pid == 0) else {
        SLOT.store(NO_SLOT, Ordering::Relaxed);
        return Seat::Out(true);
    };
    let_go_semaphore(); // a slot that was taken from us
    let sem_key = hold_semaphore(l, i, j.here);
    let serial = l.h().joins.wrapping_add(1);
    l.h_mut().joins = serial;
    l.clear_ext(i);
    let m: &mut Member = &mut l.h_mut().members[i];
    // SAFETY: `Member` is plain data; all zeroes is a free slot.
    *m = unsafe { std::mem::zeroed() };
    (m.serial, m.sem_key, m.ipc_ns, m.pid_ns) = (serial, sem_key, j.here.ipc_ns, j.here.pid_ns);
    m.start_ticks = ticks;
    m.exe = j.exe;
    // The pid last: a look that finds it finds the rest, and the semaphore raised.
    std::sync::atomic::fence(Ordering::Release);
    m.pid = j.pid;
    MY_PID.store(j.pid, Ordering::Relaxed);
    SLOT.store(i, Ordering::Relaxed);
    l.settle(); // what was pinned while the ledger could not be reached
    Seat::In(i)
}

pub(super) fn warn_unverified() {
    static ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !ONCE.swap(true, Ordering::Relaxed) {
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::warn!("group: this process cannot read its start time in /proc, so it cannot join the group; its pinning calls are refused until it can");
    }
}

/// How this member is told alive (`Snapshot::liveness`).
pub(super) fn liveness() -> Option<String> {
    if SLOT.load(Ordering::Relaxed) >= MAX_MEMBERS {
        return None;
    }
    if HELD_ID.load(Ordering::Relaxed) >= 0 {
        return Some("semaphore".into());
    }
    Some(format!(
        "pid ({})",
        no_semaphore_reason(NO_SEM.load(Ordering::Relaxed))
    ))
}

fn no_semaphore_reason(why: i32) -> String {
    match why {
        NO_SEM_OTHER_NS => "the group's semaphore set is in another IPC namespace".into(),
        NO_SEM_NS_UNKNOWN => "this process's IPC namespace cannot be read".into(),
        0 => "no semaphore held".into(),
        e => format!(
            "System V semaphores unavailable: {}",
            std::io::Error::from_raw_os_error(e)
        ),
    }
}

/// Once, when the kernel or a sandbox refused this member a semaphore (not merely another IPC
/// namespace): called with the lock let go.
pub(super) fn warn_no_semaphore() {
    static ONCE: AtomicBool = AtomicBool::new(false);
    let why = NO_SEM.load(Ordering::Relaxed);
    if why > 0 && !ONCE.swap(true, Ordering::Relaxed) {
        let _nc = sys::NoCancel::new(); // writing the line is a cancellation point
        tracing::warn!("group: {}; other members tell this one alive by its pid, only from its own PID namespace", no_semaphore_reason(why));
    }
}
