//! The host and cgroup reserves of a group member: shared readings in the ledger, each over the
//! bytes of the members it counts, decided under the lock and read afresh with it let go.

use super::super::floor::{self, Verdict};
use super::super::{cgroup, host, FloorKind, Refused};
use super::lock::Locked;
use crate::runtime::clock::monotonic_ms;
use crate::runtime::kernel;
use pinguard_common::group::{self as layout, MAX_MEMBERS};
use std::sync::atomic::Ordering;

/// A shared reading as a decision needs it: the host's (the header's `host_*`) or a cgroup's
/// (`layout::Cgroup`), with the bytes of the members it counts.
#[derive(Clone, Copy)]
pub(super) struct Figures {
    available: u64,
    settled: u64,
    read_ms: u64,
    pub(super) released: u64,
    /// The bytes of the members the reading is for (the group's, or its cgroup's members').
    pub(super) used: u64,
}

impl Figures {
    /// Whether `bytes` more keep above `reserve`: a reading is asked for (`Room::Read`) when it
    /// is due, and before a refusal, unless one was taken for this call (`fresh`). The refusal
    /// gives the figure as the reading and the calls since count it.
    pub(super) fn room(&self, bytes: u64, reserve: u64, fresh: bool) -> Room {
        let next = self.used.checked_add(bytes);
        let cap =
            floor::cap_of(self.settled, self.available, reserve).saturating_sub(self.released);
        // The clock is read only when the reading's age can change the answer.
        let due = next.is_some() && !fresh && self.due(reserve);
        match floor::decide(next, cap, due, fresh) {
            Verdict::Fits => Room::Fits,
            Verdict::Read => Room::Read,
            Verdict::Short => Room::Short(self.now()),
        }
    }

    /// The reading is older than `floor::READING_MS` (or from a clock that is not ours), or the
    /// members' bytes moved by more than a `floor::MOVE_SHARE`th of the headroom it left.
    pub(super) fn due(&self, reserve: u64) -> bool {
        let now = monotonic_ms();
        let slack = self.available.saturating_sub(reserve) / floor::MOVE_SHARE;
        let moved = self.used.abs_diff(self.settled) > slack || self.released > slack;
        self.read_ms == 0
            || now.saturating_sub(self.read_ms) >= floor::READING_MS
            || self.read_ms > now
            || moved
    }

    pub(super) fn now(&self) -> u64 {
        self.settled
            .saturating_add(self.available)
            .saturating_sub(self.used)
            .saturating_sub(self.released)
    }
}

/// A reading for a shared floor, taken with the lock let go: what the ledger said when it was
/// started, and what the file said.
struct Reading {
    /// The shared reading when this one was started (time, figure, settled bytes): another
    /// member's reading installed since is used instead.
    pub(super) was: (u64, u64, u64),
    /// The members' bytes the reading reflects (`Locked::settled_now`).
    settled: u64,
    /// The shared `released` when it was started: releases since stay counted.
    pub(super) released: u64,
    /// The figure, once read.
    available: u64,
}

impl Reading {
    pub(super) fn start(f: Figures, settled: u64) -> Reading {
        Reading {
            was: (f.read_ms, f.available, f.settled),
            settled,
            released: f.released,
            available: 0,
        }
    }
}

/// A reading of the cgroup's headroom for the group's cgroup reserve: for the member's entry
/// when it was started (`None`: it had none), and what was read.
struct CgReading {
    pub(super) entry: Option<usize>,
    pub(super) r: Reading,
    head: Option<crate::runtime::cgroup::Headroom>,
}

/// What a shared floor says of `bytes` more.
pub(super) enum Room {
    Fits,
    /// No: the figure as counted for the refusal.
    Short(u64),
    /// A reading is due first: the lock is to be let go while the file is read.
    Read,
}

impl Locked {
    /// A floor's refusal, unless other members' calls in flight count against it and no room
    /// scan ran in this call or the last interval (`room_scan_due`): then a scan first.
    fn refuse_or_scan(&mut self, i: usize, done: &mut Done, why: Refused) -> Next {
        let others = self
            .in_entry(None)
            .filter(|&j| j != i)
            .any(|j| self.ledger.in_flight(j).load(Ordering::Acquire) > 0);
        if others && !done.room && self.room_scan_due() {
            done.room = true;
            return Next::Scan;
        }
        Next::Refused(why)
    }

    /// The members in cgroup entry `k` (`None`: every member): a scan of the slots under the
    /// lock, arithmetic only (256 slots).
    fn in_entry(&self, k: Option<usize>) -> impl Iterator<Item = usize> + '_ {
        let h = self.h();
        (0..MAX_MEMBERS).filter(move |&i| {
            h.members[i].pid != 0 && k.is_none_or(|k| h.ext[i].cgroup as usize == k + 1)
        })
    }

    /// The bytes of the members in cgroup entry `k`.
    fn cgroup_used(&self, k: usize) -> u64 {
        self.in_entry(Some(k))
            .fold(0u64, |a, i| a.saturating_add(self.h().members[i].bytes))
    }

    /// The members' bytes a reading started now reflects: theirs less their calls in flight
    /// (each member books a call's bytes as in flight and takes them off when the call returns,
    /// its pages charged by then). Counted before the file is read: a call that lands in between
    /// is in the file and not in the settled bytes, which errs on the side of the floor.
    fn settled_now(&self, k: Option<usize>) -> u64 {
        let used = match k {
            Some(k) => self.cgroup_used(k),
            None => self.h().used,
        };
        // Acquire, paired with `landed`: a call seen landed has its pages in the file read next.
        let flying = self.in_entry(k).fold(0u64, |a, i| {
            a.saturating_add(self.ledger.in_flight(i).load(Ordering::Acquire))
        });
        used.saturating_sub(flying)
    }

    fn host_figures(&self) -> Figures {
        let h = self.h();
        Figures {
            available: h.host_available,
            settled: h.host_settled,
            read_ms: h.host_read_ms,
            released: h.host_released,
            used: h.used,
        }
    }

    /// Whether the host reserve `reserve` (this member's) lets the group have `bytes` more: the
    /// group's bytes stay at or below what the shared reading settled plus the headroom it left.
    fn host_room(&self, bytes: u64, reserve: u64, fresh: bool) -> Room {
        self.host_figures().room(bytes, reserve, fresh)
    }

    fn start_reading(&self) -> Reading {
        Reading::start(self.host_figures(), self.settled_now(None))
    }

    /// Installs reading `r` (the lock was let go while it was taken), unless another member
    /// installed one meanwhile.
    fn install(&mut self, r: Reading, reserve: u64) {
        let h = self.h_mut();
        h.host_lowest_available = h.host_lowest_available.min(r.available);
        h.host_reserve = h.host_reserve.max(reserve);
        if (h.host_read_ms, h.host_available, h.host_settled) != r.was {
            return; // newer than when ours started: as fresh as a refusal needs
        }
        h.host_available = r.available;
        h.host_settled = r.settled;
        // Releases until the file was read are in it (or, made after, counted twice: towards the floor).
        h.host_released = h.host_released.saturating_sub(r.released);
        h.host_read_ms = monotonic_ms().max(1);
    }

    pub(super) fn cgroup_figures(&self, k: usize) -> Figures {
        let c = &self.h().cgroups[k];
        Figures {
            available: c.available,
            settled: c.settled,
            read_ms: c.read_ms,
            released: c.released,
            used: self.cgroup_used(k),
        }
    }

    /// Whether the cgroup reserve `reserve` (this member's) lets member `i`'s cgroup have `bytes`
    /// more: as `host_room`, over the members whose readings name the same cgroup. A member
    /// without an entry reads first; after that (`fresh`) its own reading decides (`cgroup_shared`).
    fn cgroup_room(&self, i: usize, bytes: u64, reserve: u64, fresh: bool) -> Room {
        match self.entry_of(i) {
            Some(k) => self.cgroup_figures(k).room(bytes, reserve, fresh),
            None if fresh => Room::Fits,
            None => Room::Read,
        }
    }

    fn start_cgroup_reading(&self, i: usize) -> CgReading {
        let entry = self.entry_of(i);
        let r = match entry {
            Some(k) => Reading::start(self.cgroup_figures(k), self.settled_now(Some(k))),
            None => Reading {
                was: (0, 0, 0),
                settled: 0,
                released: 0,
                available: 0,
            },
        };
        CgReading {
            entry,
            r,
            head: None,
        }
    }

    /// The entry for the cgroup folder `(dev, ino)`: its own, else a free one (never used, or
    /// no member's any more), emptied for it. `None`: the table is full.
    fn entry_for(&mut self, dev: u64, ino: u64) -> Option<usize> {
        let h = self.h();
        if let Some(k) = h.cgroups.iter().position(|c| (c.dev, c.ino) == (dev, ino)) {
            return Some(k);
        }
        let used = |k: usize| {
            h.members
                .iter()
                .zip(h.ext.iter())
                .any(|(m, e)| m.pid != 0 && e.cgroup as usize == k + 1)
        };
        let k = (0..layout::MAX_CGROUPS)
            .find(|&k| (h.cgroups[k].dev, h.cgroups[k].ino) == (0, 0) || !used(k))?;
        let c = &mut self.h_mut().cgroups[k];
        // SAFETY: `Cgroup` is plain data; all zeroes is a free entry.
        *c = unsafe { std::mem::zeroed() };
        (c.dev, c.ino, c.lowest) = (dev, ino, u64::MAX);
        Some(k)
    }

    /// Installs cgroup reading `c` for member `i` (the lock was let go while it was taken):
    /// into the entry of the folder it names, which becomes the member's. Whether the decision
    /// may now be made (`false`: the member's entry changed, so the reading was started for
    /// another; `last` installs it anyway, with the bytes settled now).
    fn install_cgroup(&mut self, i: usize, c: CgReading, reserve: u64, last: bool) -> bool {
        let Some(head) = c.head else { return true };
        let Some(k) = Some((head.dev, head.ino))
            .filter(|&id| id != (0, 0))
            .and_then(|(d, n)| self.entry_for(d, n))
        else {
            self.h_mut().ext[i].cgroup = 0; // no shared reading: its own decides
            return true;
        };
        let mut r = c.r;
        if c.entry != Some(k) {
            self.h_mut().ext[i].cgroup = k as u32 + 1; // its share counts here from now on
            if !last {
                return false;
            }
            let f = self.cgroup_figures(k);
            r = Reading::start(f, self.settled_now(Some(k)));
        }
        let e = &mut self.h_mut().cgroups[k];
        (e.limit, e.reserve, e.lowest) =
            (head.limit, e.reserve.max(reserve), e.lowest.min(head.bytes));
        if (e.read_ms, e.available, e.settled) == r.was {
            e.available = head.bytes;
            e.settled = r.settled;
            e.released = e.released.saturating_sub(r.released);
            e.read_ms = monotonic_ms().max(1);
        }
        true
    }
}

/// The lets-go a reservation may make: a join's reads, a room look, a reading of the host's
/// memory, at most once each, and at most two of the cgroup's (the second when the first found
/// the member in another cgroup than its reading was started for), so a reservation takes the
/// lock at most six times, all within one `Wait`. A join reads only once the lock was had: a
/// process that cannot reach the ledger reads nothing.
#[derive(Default)]
pub(super) struct Done {
    pub(super) joined: bool,
    pub(super) room: bool,
    pub(super) read: bool,
    cgroup_reads: u8,
    /// A cgroup reading taken in this call decides (a refusal needs no other).
    cgroup_fresh: bool,
}

/// Readings taken with the lock let go, installed at the next taking of it.
#[derive(Default)]
pub(super) struct Pending {
    host: Option<Reading>,
    cgroup: Option<CgReading>,
}

/// What the floors say of a reservation.
pub(super) enum Next {
    /// It fits them all: book it (the lock still held).
    Book(Locked),
    /// A reading was taken (the lock let go): decide again.
    Again,
    /// Short, while other members have calls in flight: look for dead members first (the lock
    /// let go), since a member killed inside a call leaves its bytes in flight for good.
    Scan,
    Refused(Refused),
}

/// The floors' say on `bytes` more for member `i` (none with `force`), in `FloorKind::ALL`'s
/// order: the host reserve over the group's bytes, then the cgroup reserve over the bytes of the
/// members in this member's cgroup, each against its shared reading (`floor::decide`), read afresh
/// (with the lock let go) when due and before a refusal. A reading that cannot be used turns its
/// reserve off: it refuses nothing.
pub(super) fn floors(
    mut l: Locked,
    i: usize,
    bytes: u64,
    force: bool,
    done: &mut Done,
    p: &mut Pending,
) -> Next {
    if force {
        return Next::Book(l);
    }
    for kind in FloorKind::ALL {
        let Some(reserve) = kind.floor().reserve() else {
            continue;
        };
        let room = match kind {
            FloorKind::Host => {
                if let Some(r) = p.host.take() {
                    l.install(r, reserve);
                }
                l.host_room(bytes, reserve, done.read)
            }
            FloorKind::Cgroup => {
                if let Some(c) = p.cgroup.take() {
                    done.cgroup_fresh = l.install_cgroup(i, c, reserve, done.cgroup_reads >= 2);
                }
                l.cgroup_room(i, bytes, reserve, done.cgroup_fresh)
            }
        };
        match room {
            Room::Fits => {}
            Room::Read => {
                read(l, kind, i, done, p);
                return Next::Again;
            }
            Room::Short(figure) => return l.refuse_or_scan(i, done, kind.refused(figure)),
        }
    }
    Next::Book(l)
}

/// Reads floor `kind`'s figure for member `i` with the lock let go; the reading is installed at
/// the next taking of it (`Pending`). A reading that cannot be used turns the floor off.
fn read(l: Locked, kind: FloorKind, i: usize, done: &mut Done, p: &mut Pending) {
    match kind {
        FloorKind::Host => {
            let mut r = l.start_reading();
            drop(l);
            done.read = true;
            match kernel::host_memory() {
                Ok(m) => {
                    host::noted(m.available);
                    r.available = m.available;
                    p.host = Some(r);
                }
                Err(why) => host::turn_off(why),
            }
        }
        FloorKind::Cgroup => {
            let mut c = l.start_cgroup_reading(i);
            drop(l);
            done.cgroup_reads += 1;
            match crate::runtime::cgroup::headroom() {
                Ok(head) => {
                    cgroup::floor().noted(head.bytes);
                    c.head = Some(head);
                    p.cgroup = Some(c);
                }
                Err(why) => cgroup::floor().turn_off(why as usize),
            }
        }
    }
}
