//! What the preload library and the CLI share (hence `pinguard-common`): the report, the JSON
//! written by the library and read by the CLI, and the formats and readers both need (the
//! settings registry, units, cgroup and ELF readers, symbols, the group ledger's layout and
//! liveness, the metrics-file protocol).
//!
//! Both sides use these types, so a key can never drift between writer and reader. The key set is
//! a contract (`docs/design.md`, "The report"): keys may be added, never renamed.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cgroup;
pub mod codes;
pub mod elf;
pub mod group;
pub mod node;
pub mod state;
pub mod symbols;
pub mod textfile;
pub mod units;
pub mod untrusted;
pub mod vars;
pub mod view;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// The `schema` value of every report this crate writes or accepts.
pub const SCHEMA: &str = "pinguard.report.v1";

/// An address, written as a hex string (`"0x7f12..."`) because JSON numbers lose precision past
/// 2^53 in most readers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Addr(pub u64);

impl Serialize for Addr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Formatted on the stack: a report writes millions of these.
        let mut buf = [0u8; 18];
        let digits = (64 - self.0.leading_zeros() as usize).div_ceil(4).max(1);
        buf[0] = b'0';
        buf[1] = b'x';
        for i in 0..digits {
            let nibble = (self.0 >> (4 * (digits - 1 - i))) & 0xf;
            buf[2 + i] = b"0123456789abcdef"[nibble as usize];
        }
        s.serialize_str(std::str::from_utf8(&buf[..2 + digits]).expect("ASCII"))
    }
}

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor rather than `String::deserialize`: readers merge millions of frames.
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Addr;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a hex address string such as \"0x7f12\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Addr, E> {
                let hex = s
                    .strip_prefix("0x")
                    .ok_or_else(|| E::custom(format!("address {s:?} does not start with 0x")))?;
                u64::from_str_radix(hex, 16)
                    .map(Addr)
                    .map_err(|_| E::custom(format!("address {s:?} is not hex")))
            }
        }
        d.deserialize_str(V)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    Exit,
    Interval,
    Signal,
    Request,
    /// Read from the state a process left when it died without writing its report (`SIGKILL`,
    /// the OOM killer, any signal it did not survive): its figures as they stood at the death.
    Killed,
    /// Written as a signal whose default action ends the process was ending it
    /// (`process.signal` names it).
    #[serde(rename = "fatal_signal")]
    FatalSignal,
    /// Read from the state of a process that is still running.
    Running,
}

impl Reason {
    /// The name the report's `reason` key holds.
    pub fn name(self) -> &'static str {
        match self {
            Reason::Exit => "exit",
            Reason::Interval => "interval",
            Reason::Signal => "signal",
            Reason::Request => "request",
            Reason::Killed => "killed",
            Reason::FatalSignal => "fatal_signal",
            Reason::Running => "running",
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    pub exe: String,
    pub cmdline: Vec<String>,
    pub hostname: String,
    pub start_unix_ms: u64,
    pub write_unix_ms: u64,
    /// The signal that ended the process (`"SIGTERM"`), when the report says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Config {
    pub budget_bytes: Option<u64>,
    pub policy: String,
    pub depth: u32,
    #[serde(default)]
    pub py_depth: u32,
    pub hooks: Vec<String>,
    pub errors: Vec<String>,
    /// `PINGUARD_REPORT` as given (or the default), before expansion.
    #[serde(default)]
    pub report_template: String,
    #[serde(default)]
    pub interval_ms: Option<u64>,
    #[serde(default)]
    pub signal: Option<i32>,
    /// `PINGUARD_DOWNGRADE_MATCH`: the callsites `downgrade` may serve with pageable memory
    /// (absent: every one; empty after a bad value: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downgrade_match: Option<Vec<String>>,
    /// `PINGUARD_HOST_RESERVE` in bytes, while it is in force (`null`: unset, rejected, or turned
    /// off by a reading of `/proc/meminfo` that could not be used: `errors` says which).
    #[serde(default)]
    pub host_reserve_bytes: Option<u64>,
    /// `PINGUARD_CGROUP_RESERVE` in bytes, while it is in force (`null`: unset, rejected, or
    /// turned off by a reading that could not be used: `errors` says which).
    #[serde(default)]
    pub cgroup_reserve_bytes: Option<u64>,
}

/// The event counters every thread keeps, declared once, in their order in a thread's counter
/// block (the library's `ledger::Block`, a state file's `state::block`): `$m` is called with
/// their names, and makes whatever needs the list (the block's fields, its sums, the names a
/// reader looks for, `Totals::counter_mut`). A counter added here is a field of `Totals` too.
/// `downgraded_live_bytes` goes down as well as up: its sum is read as signed
/// (`state::block::SIGNED`).
#[macro_export]
macro_rules! with_total_counters {
    ($m:ident) => {
        $m! { alloc_count, alloc_bytes, release_count, failed_count, denied_count, denied_bytes, downgraded_count, downgraded_bytes, downgraded_live_bytes, over_budget_count, unknown_release_count, host_reserve_count, group_unavailable_count, cgroup_reserve_count }
    };
}

/// Each entry point's event counters, as `with_total_counters` (fields of `ApiStats` too).
#[macro_export]
macro_rules! with_api_counters {
    ($m:ident) => {
        $m! { failed_count, denied_count, downgraded_count, unknown_release_count }
    };
}

/// `counter_mut`: a counter of `with_total_counters`/`with_api_counters` by name.
macro_rules! counter_mut {
    ($($f:ident),*) => {
        /// The event counter of this name (`None`: not one of them).
        pub fn counter_mut(&mut self, name: &str) -> Option<&mut u64> {
            match name {
                $(stringify!($f) => Some(&mut self.$f),)*
                _ => None,
            }
        }
    };
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub live_bytes: u64,
    pub live_count: u64,
    pub peak_live_bytes: u64,
    pub alloc_count: u64,
    pub alloc_bytes: u64,
    pub release_count: u64,
    pub failed_count: u64,
    pub denied_count: u64,
    pub denied_bytes: u64,
    pub downgraded_count: u64,
    pub downgraded_bytes: u64,
    pub downgraded_live_bytes: u64,
    pub over_budget_count: u64,
    pub unknown_release_count: u64,
    /// Locking calls made while their thread was already inside pinguard (a signal handler that
    /// interrupted a hook): passed through to the kernel, not tracked.
    #[serde(default)]
    pub untracked_count: u64,
    /// Pinning calls that would have taken the host's available memory below
    /// `PINGUARD_HOST_RESERVE`: refused, downgraded, or (`warn`) pinned anyway. Each is also in
    /// `denied_count`, `downgraded_count` or `over_budget_count`.
    #[serde(default)]
    pub host_reserve_count: u64,
    /// Requests of pinguard's own for memory that the kernel refused (`RLIMIT_AS`, no memory, a
    /// sandbox denying the call). Each left something out: pinning calls then pass through
    /// untracked (`untracked_count`) until memory is found again, and a report written short of
    /// memory names no frames or is partial (`config.errors` says which).
    #[serde(default)]
    pub out_of_memory_count: u64,
    /// Pinning calls answered by the policy because the group's ledger could not be reached in
    /// time (its lock held by a member that does not run): refused, downgraded, or (`warn`)
    /// pinned anyway. Each is also in `denied_count`, `downgraded_count` or `over_budget_count`.
    #[serde(default)]
    pub group_unavailable_count: u64,
    /// Tracked calls whose work ran on the caller's stack, for want of a stack of pinguard's own
    /// (its mapping refused): counted, their callsite left empty (no stack walk).
    #[serde(default)]
    pub stack_short_count: u64,
    /// Pinning calls that would have taken the memory cgroup's headroom below
    /// `PINGUARD_CGROUP_RESERVE`: refused, downgraded, or (`warn`) pinned anyway. Each is also in
    /// `denied_count`, `downgraded_count` or `over_budget_count`.
    #[serde(default)]
    pub cgroup_reserve_count: u64,
    /// Bytes the kernel counts as pinned (`VmPin`) that no call pinguard saw explains (an
    /// `io_uring` ring's fixed buffers, a registration through a raw system call), as of the
    /// report: no callsite, not in `live_bytes`, counted against the budget.
    #[serde(default)]
    pub kernel_pinned_bytes: u64,
}

impl Totals {
    with_total_counters!(counter_mut);

    /// Adds another process's figures (peaks add up too: a merge's peak is the sum of peaks).
    pub fn add(&mut self, o: &Totals) {
        self.live_bytes += o.live_bytes;
        self.live_count += o.live_count;
        self.peak_live_bytes += o.peak_live_bytes;
        self.alloc_count += o.alloc_count;
        self.alloc_bytes += o.alloc_bytes;
        self.release_count += o.release_count;
        self.failed_count += o.failed_count;
        self.denied_count += o.denied_count;
        self.denied_bytes += o.denied_bytes;
        self.downgraded_count += o.downgraded_count;
        self.downgraded_bytes += o.downgraded_bytes;
        self.downgraded_live_bytes += o.downgraded_live_bytes;
        self.over_budget_count += o.over_budget_count;
        self.unknown_release_count += o.unknown_release_count;
        self.untracked_count += o.untracked_count;
        self.host_reserve_count += o.host_reserve_count;
        self.out_of_memory_count += o.out_of_memory_count;
        self.group_unavailable_count += o.group_unavailable_count;
        self.stack_short_count += o.stack_short_count;
        self.cgroup_reserve_count += o.cgroup_reserve_count;
        self.kernel_pinned_bytes += o.kernel_pinned_bytes;
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiStats {
    #[serde(default)]
    pub peak_live_bytes: u64,
    pub alloc_count: u64,
    pub alloc_bytes: u64,
    pub live_count: u64,
    pub live_bytes: u64,
    pub failed_count: u64,
    pub denied_count: u64,
    pub downgraded_count: u64,
    /// Releases through this entry point of pointers pinguard never saw (or saw released already).
    #[serde(default)]
    pub unknown_release_count: u64,
}

impl ApiStats {
    with_api_counters!(counter_mut);
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Kernel {
    pub vm_lck_bytes: Option<u64>,
    pub vm_pin_bytes: Option<u64>,
    pub rlimit_memlock_bytes: Option<u64>,
    /// How many times the process read `/proc/self/smaps` to learn which pages are locked (each a
    /// walk of every mapping): it grows with what changed the locked pages, never with calls
    /// that changed nothing (a failed `mlock`).
    #[serde(default)]
    pub smaps_walk_count: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Group {
    pub name: String,
    pub budget_bytes: Option<u64>,
    pub used_bytes: u64,
    pub peak_bytes: u64,
    pub members: u64,
    /// The largest `PINGUARD_HOST_RESERVE` a member applies (absent: no member has one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_reserve_bytes: Option<u64>,
    /// The lowest `MemAvailable` any member read for the reserve (absent: none read yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_lowest_available_bytes: Option<u64>,
    /// Pinning calls of all members that the host reserve stopped (as `totals.host_reserve_count`).
    #[serde(default)]
    pub host_reserve_count: u64,
    /// The cgroup reserve as this process's cgroup's members share it: the largest
    /// `PINGUARD_CGROUP_RESERVE` a member in the cgroup applies, and the lowest headroom any of
    /// them read (absent: this member has no shared reading: no reserve, or more cgroups in the
    /// group than the ledger keeps readings of).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_reserve_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_lowest_headroom_bytes: Option<u64>,
    /// Pinning calls of all members that the cgroup reserve stopped (as
    /// `totals.cgroup_reserve_count`), whichever cgroup they are in.
    #[serde(default)]
    pub cgroup_reserve_count: u64,
    /// The ledger's lock was held when the report was written (a report never waits for it):
    /// the figures were read without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unreachable: bool,
    /// This process's waits for the ledger's lock that ran out (each bounded); its calls then
    /// went without the group (`totals.group_unavailable_count`).
    #[serde(default)]
    pub lock_timeouts: u64,
    /// How the other members tell this process alive: `semaphore` (its slot's semaphore in the
    /// group's System V set, from any PID namespace), or `pid (WHY)` (its pid and start time,
    /// only from its own PID namespace). Absent before it joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<String>,
}

/// The host reserve (`PINGUARD_HOST_RESERVE`): present in a report once a reserve was in force.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// The floor under the host's available memory, in bytes.
    pub reserve_bytes: u64,
    /// `MemTotal`, as read when the reserve was set up.
    pub total_bytes: u64,
    /// `MemAvailable` at the latest reading.
    pub available_bytes: u64,
    /// The lowest `MemAvailable` read while the reserve was in force.
    pub lowest_available_bytes: u64,
    /// Readings of `/proc/meminfo` taken for the reserve.
    pub readings: u64,
}

/// The memory cgroup the cgroup reserve keeps headroom in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cgroup {
    /// The process's memory group, as `/proc/self/cgroup` named it when the reserve was set up.
    pub path: String,
    /// The floor under the headroom, in bytes.
    pub reserve_bytes: u64,
    /// The tightest limit on the path, as read when the reserve was set up.
    pub limit_bytes: u64,
    /// The headroom before the OOM killer (limit - usage + reclaimable page cache, the least
    /// over the limited levels) at the latest reading.
    pub headroom_bytes: u64,
    /// The lowest headroom read while the reserve was in force.
    pub lowest_headroom_bytes: u64,
    /// Readings of the cgroup's files taken for the reserve.
    pub readings: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Module {
    pub path: String,
    pub base: Addr,
    pub build_id: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Frame {
    /// The return address (or the call address for the innermost frame), as captured.
    pub addr: Addr,
    pub module: Option<String>,
    pub offset: Option<Addr>,
    pub symbol: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// The event counters each callsite keeps (and the folded aggregate of callsites), declared once,
/// in the report's order: the counts, then the bytes (`Option<u64>` in a report: `None` in one
/// written before them, or in a sum with a part that lacks them), each with its doc and its
/// attributes in a report. `$m` is called with the tokens after it, then the list, and makes
/// whatever needs it: the report's fields of a callsite and of the aggregate, and the CLI's
/// merged line (`site_struct!`), their sums (`Folded::add`, the CLI's merge), the library's
/// initialisers, fold and report figures. The library's `Callsite` and `Folded` declare their
/// fields by hand where the state file's layout puts them; their initialisers come from the list,
/// so a counter there and not in the list, or the other way round, fails to compile, and so does
/// a counter of the list that a report's reader does not take.
#[macro_export]
macro_rules! with_callsite_counters {
    ($m:ident $($extra:tt)*) => {
        $m! {
            $($extra)*
            counts {
                denied_count,
                downgraded_count,
                /// Calls pinned over the budget under `warn` (absent from reports before it was
                /// added).
                #[serde(default)]
                over_budget_count,
            }
            bytes {
                /// Bytes of the calls refused here (issue 37; `None` in reports written before):
                /// unlike the events' sizes, never short when events were dropped.
                denied_bytes,
                /// Bytes served unpinned here instead (`None` in reports written before).
                downgraded_bytes,
            }
        }
    };
}

/// A struct with `with_callsite_counters!`' fields: `{ attributes struct Name { head } { mid }
/// { tail } }` makes `Name` with the head fields, the counts, the mid fields, the bytes (skipped
/// when unknown), the tail fields.
#[doc(hidden)]
#[macro_export]
macro_rules! site_struct {
    (
        { $(#[$sa:meta])* $vis:vis struct $name:ident { $($head:tt)* } { $($mid:tt)* } { $($tail:tt)* } }
        counts { $( $(#[$ca:meta])* $c:ident, )* }
        bytes { $( $(#[$ba:meta])* $b:ident, )* }
    ) => {
        $(#[$sa])*
        $vis struct $name {
            $($head)*
            $( $(#[$ca])* pub $c: u64, )*
            $($mid)*
            $(
                $(#[$ba])*
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $b: Option<u64>,
            )*
            $($tail)*
        }
    };
}

/// The names of `with_callsite_counters!`' counters, in order.
macro_rules! site_counter_names {
    (counts { $( $(#[$ca:meta])* $c:ident, )* } bytes { $( $(#[$ba:meta])* $b:ident, )* }) => {
        &[$(stringify!($c),)* $(stringify!($b),)*]
    };
}
/// Every counter a callsite keeps (`with_callsite_counters!`), by its name in a report.
pub const SITE_COUNTERS: &[&str] = with_callsite_counters!(site_counter_names);

with_callsite_counters!(site_struct {
    #[derive(Clone, Debug, Serialize, Deserialize)]
    pub struct Callsite {
        pub id: u32,
        pub frames: Vec<Frame>,
        /// The calling thread's Python stack, innermost first (`module` and `file` are the source
        /// file, `symbol` the function's qualified name); empty outside Python.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub py_frames: Vec<Frame>,
        /// The entry points this callsite called (usually one).
        #[serde(default)]
        pub apis: Vec<String>,
        pub live_bytes: u64,
        pub live_count: u64,
        pub peak_live_bytes: u64,
        pub alloc_count: u64,
        pub alloc_bytes: u64,
    } {} {}
});

/// `a + b` where both are known: a sum with a figure missing is unknown.
pub fn add_known(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(a?.saturating_add(b?))
}

with_callsite_counters!(site_struct {
    /// Callsites folded into one aggregate: how many, and their figures summed (none has anything
    /// live; its peak is the highest of theirs). Its bytes, as a callsite's, are `None` also when
    /// a part of the sum lacks them.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Folded {
        pub count: u64,
        pub alloc_count: u64,
        pub alloc_bytes: u64,
        pub peak_live_bytes: u64,
    } {
        /// The entry points any of them called.
        #[serde(default)]
        pub apis: Vec<String>,
    } {}
});

/// `$to.counter += $from.counter` for every callsite counter (`with_callsite_counters!`), on any
/// two values with their fields; bytes add up where both are known, and are `$from`'s while `$to`
/// has nothing yet (`$fresh`), `$to`'s while `$from` has nothing (`$none`).
#[doc(hidden)]
#[macro_export]
macro_rules! add_site_counters {
    (
        { $to:expr, $from:expr, $fresh:expr, $none:expr }
        counts { $( $(#[$ca:meta])* $c:ident, )* }
        bytes { $( $(#[$ba:meta])* $b:ident, )* }
    ) => {{
        let (fresh, none): (bool, bool) = ($fresh, $none);
        $( $to.$c += $from.$c; )*
        $(
            $to.$b = match (fresh, none) {
                (true, _) => $from.$b,
                (_, true) => $to.$b,
                _ => $crate::add_known($to.$b, $from.$b),
            };
        )*
    }};
}

/// A `Folded` of one callsite's figures (`with_callsite_counters!`' from the callsite's).
macro_rules! folded_of_site {
    (
        { $c:expr }
        counts { $( $(#[$ca:meta])* $n:ident, )* }
        bytes { $( $(#[$ba:meta])* $b:ident, )* }
    ) => {
        Folded {
            count: 1,
            alloc_count: $c.alloc_count,
            alloc_bytes: $c.alloc_bytes,
            peak_live_bytes: $c.peak_live_bytes,
            apis: $c.apis.clone(),
            $( $n: $c.$n, )*
            $( $b: $c.$b, )*
        }
    };
}

impl Folded {
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Takes in a callsite's figures (one folded when a report's list is capped).
    pub fn add_site(&mut self, c: &Callsite) {
        self.add(&with_callsite_counters!(folded_of_site { c }));
    }

    /// Takes in another aggregate (of this process, or of another when reports are merged).
    pub fn add(&mut self, o: &Folded) {
        // An empty aggregate's bytes are known (none), whatever its fields say.
        with_callsite_counters!(add_site_counters { self, o, self.is_empty(), o.is_empty() });
        self.count += o.count;
        self.alloc_count += o.alloc_count;
        self.alloc_bytes += o.alloc_bytes;
        self.peak_live_bytes = self.peak_live_bytes.max(o.peak_live_bytes);
        for a in &o.apis {
            if !self.apis.contains(a) {
                self.apis.push(a.clone());
            }
        }
    }
}

/// Callsites as a report lists them: the ones with live allocations all, and of the others the
/// `max` first in this order (largest live, then highest peak, then oldest id); the rest are
/// added to `folded`. Returns the list in that order.
pub fn cap_callsites(mut sites: Vec<Callsite>, max: usize, folded: &mut Folded) -> Vec<Callsite> {
    sites.sort_by(|a, b| {
        (b.live_bytes, b.peak_live_bytes, a.id).cmp(&(a.live_bytes, a.peak_live_bytes, b.id))
    });
    let mut idle = 0;
    sites.retain(|c| {
        if c.live_count > 0 || c.live_bytes > 0 {
            return true;
        }
        idle += 1;
        if idle <= max {
            return true;
        }
        folded.add_site(c);
        false
    });
    sites
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Live {
    pub addr: Addr,
    pub size: u64,
    /// Borrowed when pinguard writes (the entry point's static name), owned when read.
    pub api: std::borrow::Cow<'static, str>,
    pub callsite: u32,
    pub tid: u32,
    pub age_ms: u64,
    pub downgraded: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Denied,
    Downgraded,
    OverBudget,
    /// The runtime or the kernel failed the call (absent from reports before issue 46).
    Failed,
}

impl EventKind {
    /// The kind a report names (`denied`, `failed`, ...); `None` for one this reader does not know.
    pub fn from_name(name: &str) -> Option<EventKind> {
        [
            EventKind::Denied,
            EventKind::Downgraded,
            EventKind::OverBudget,
            EventKind::Failed,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }

    /// The name a report gives the kind.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Denied => "denied",
            EventKind::Downgraded => "downgraded",
            EventKind::OverBudget => "over_budget",
            EventKind::Failed => "failed",
        }
    }

    /// What happened to the call, as the exit line and `pinguard report` say it.
    pub fn verb(self) -> &'static str {
        match self {
            EventKind::Denied => "refused",
            EventKind::Downgraded => "downgraded",
            EventKind::Failed => "failed",
            EventKind::OverBudget => "over budget",
        }
    }
}

/// `mlock of 1.00 MiB (1048576 bytes asked, 1052672 counted in whole pages)`: a call and its
/// size, the bytes asked beside those counted where the two differ (the `mlock` family counts
/// whole pages).
pub fn call_line(api: &str, size: u64, asked: Option<u64>) -> String {
    match asked.filter(|&a| a != size) {
        Some(a) => format!(
            "{api} of {} ({a} bytes asked, {size} counted in whole pages)",
            units::format_bytes(a)
        ),
        None => format!("{api} of {} ({size} bytes)", units::format_bytes(size)),
    }
}

/// Why a call was refused or failed, as a user would otherwise gather it by hand: the API's
/// answer and the process's room then (issue 46, item 13).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Why {
    /// The API's answer: `cudaErrorMemoryAllocation (2)`, `ENOMEM`; for a downgrade, what the
    /// caller got instead.
    pub error: String,
    /// `None`: unlimited (or, with `rlimit_memlock_known` false, not known).
    #[serde(deserialize_with = "written")]
    pub rlimit_memlock_bytes: Option<u64>,
    #[serde(default)]
    pub rlimit_memlock_known: bool,
    /// `CAP_IPC_LOCK` held: `RLIMIT_MEMLOCK` then does not bind.
    pub cap_ipc_lock: bool,
    #[serde(deserialize_with = "written")]
    pub vm_lck_bytes: Option<u64>,
    #[serde(deserialize_with = "written")]
    pub vm_pin_bytes: Option<u64>,
    /// The memory cgroup's headroom before its OOM killer (`None`: no limit, or not known).
    #[serde(deserialize_with = "written")]
    pub cgroup_headroom_bytes: Option<u64>,
    /// The process budget (`None`: none).
    #[serde(deserialize_with = "written")]
    pub budget_bytes: Option<u64>,
    /// The bytes the call asked for where pinguard counted another figure (the `mlock` family
    /// counts the whole pages a range touches; the event's `size`); absent where they are equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_bytes: Option<u64>,
}

/// A figure the writer always writes, `null` where there is none: an absent key is a malformed
/// report (serde alone would read it as `None`).
fn written<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<u64>::deserialize(d)
}

impl Why {
    /// `cudaErrorMemoryAllocation (2); budget 3.00 MiB, RLIMIT_MEMLOCK 8.00 MiB (does not bind:
    /// CAP_IPC_LOCK held), VmLck 0 B, VmPin 0 B, cgroup headroom 1.20 GiB`: the one line users
    /// otherwise assemble by hand.
    pub fn line(&self) -> String {
        format!("{}; {}", self.error, self.room())
    }

    /// The room alone: budget, `RLIMIT_MEMLOCK` and whether it binds, `VmLck`, `VmPin`, the
    /// cgroup's headroom.
    pub fn room(&self) -> String {
        let b =
            |v: Option<u64>, none: &str| v.map_or_else(|| none.to_string(), units::format_bytes);
        let rlimit = match (self.rlimit_memlock_bytes, self.rlimit_memlock_known) {
            (Some(l), _) => units::format_bytes(l),
            (None, true) => "unlimited".into(),
            (None, false) => "unknown".into(),
        };
        let binds = if self.cap_ipc_lock {
            "does not bind: CAP_IPC_LOCK held"
        } else {
            "no CAP_IPC_LOCK"
        };
        format!(
            "budget {}, RLIMIT_MEMLOCK {rlimit} ({binds}), VmLck {}, VmPin {}, cgroup headroom {}",
            b(self.budget_bytes, "none"),
            b(self.vm_lck_bytes, "unknown"),
            b(self.vm_pin_bytes, "unknown"),
            b(self.cgroup_headroom_bytes, "unknown (no limit found)"),
        )
    }
}

/// Which limit an event's call went over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// The process's budget (`PINGUARD_BUDGET`).
    Budget,
    /// The group's budget (`PINGUARD_GROUP_BUDGET`).
    GroupBudget,
    /// The floor under the host's available memory (`PINGUARD_HOST_RESERVE`).
    HostReserve,
    /// The group's budget could not be checked: its ledger's lock was held past the library's
    /// bound (a member stopped while holding it).
    GroupUnavailable,
    /// The floor under the memory cgroup's headroom (`PINGUARD_CGROUP_RESERVE`).
    CgroupReserve,
    /// A setting could not be used under `PINGUARD_STRICT`: every pinning call is refused.
    ConfigError,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    pub unix_ms: u64,
    pub kind: EventKind,
    pub api: String,
    pub size: u64,
    pub callsite: u32,
    /// Live pinned bytes of the process when the event happened.
    pub live_bytes: u64,
    /// For a refusal under `downgrade` of a callsite outside `PINGUARD_DOWNGRADE_MATCH`: the
    /// patterns it did not match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downgrade_match: Option<Vec<String>>,
    /// The limit the call went over (absent from reports before it was added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Limit>,
    /// With `reason` `host_reserve`: the host's available memory (`MemAvailable`), read afresh
    /// for the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_available_bytes: Option<u64>,
    /// With `reason` `cgroup_reserve`: the cgroup's headroom before its OOM killer, read afresh
    /// for the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_headroom_bytes: Option<u64>,
    /// For a refusal, a downgrade or a failure: the API's answer and the process's room then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<Why>,
    /// For a failure: how many more calls failed the same way (entry point, callsite, size,
    /// answer, bytes asked, budget) less than 100 ms after this event, which stands for them, its
    /// `why` read once for all; absent: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub repeats: u64,
    /// With `repeats`: when the latest of them failed (unix ms, to a few ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_unix_ms: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Event {
    /// The calls this event stands for: itself and its repeats.
    pub fn calls(&self) -> u64 {
        1 + self.repeats
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub reason: Reason,
    #[serde(default)]
    pub pinguard_version: String,
    pub process: Process,
    pub config: Config,
    pub totals: Totals,
    pub apis: BTreeMap<String, ApiStats>,
    pub kernel: Kernel,
    /// The shared budget this process belongs to (`PINGUARD_GROUP`), as it stood at the write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<Group>,
    /// The host reserve, once one was in force (`PINGUARD_HOST_RESERVE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Host>,
    /// The cgroup reserve, once one was in force (`PINGUARD_CGROUP_RESERVE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<Cgroup>,
    pub modules: Vec<Module>,
    pub callsites: Vec<Callsite>,
    /// Callsites with nothing live not listed in `callsites`, summed: folded by the process once
    /// it had more than `PINGUARD_MAX_CALLSITES`, or left out of the list beyond that many.
    /// Absent when there are none (and from reports written before it was added).
    #[serde(default, skip_serializing_if = "Folded::is_empty")]
    pub callsites_folded: Folded,
    pub live: Vec<Live>,
    pub events: Vec<Event>,
    #[serde(default)]
    pub events_dropped: u64,
    /// `[unix_ms, live_bytes]` pairs, oldest first.
    pub timeline: Vec<(u64, u64)>,
    /// Per entry point, `[unix_ms, live_bytes]` of that entry point: at each timeline point its
    /// call made, and at the last point (issue 37; absent from reports written before).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub timeline_apis: BTreeMap<String, Vec<(u64, u64)>>,
    #[serde(default)]
    pub timeline_dropped: u64,
}

/// Why a file could not be read as a report; the message names the problem, the caller the file.
#[derive(Debug)]
pub struct ParseError(pub String);

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ParseError {}

impl Report {
    /// Parses a report, telling apart "not JSON", "another schema" and "a malformed report".
    pub fn from_slice(bytes: &[u8]) -> Result<Report, ParseError> {
        parse(bytes)
    }
}

/// Parses a report into `T` (the whole `Report`, or a `view` of it), telling apart "empty",
/// "not JSON", "another schema", "a newer pinguard" and "a malformed report".
pub fn parse<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ParseError> {
    #[derive(Deserialize)]
    struct SchemaOnly {
        schema: Option<String>,
    }
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ParseError("empty file".into()));
    }
    let head: SchemaOnly = match serde_json::from_slice(bytes) {
        Ok(h) => h,
        Err(e) if e.is_data() => SchemaOnly { schema: None },
        Err(e) => return Err(ParseError(format!("not valid JSON ({e})"))),
    };
    {
        match head.schema.as_deref() {
            Some(SCHEMA) => {}
            Some(other) if newer_version(other) => {
                return Err(ParseError(format!(
                    "written by a newer pinguard (schema {other:?}); this one reads {SCHEMA:?}"
                )))
            }
            Some(other) => {
                return Err(ParseError(format!(
                    "schema {other:?} is not supported (this pinguard reads {SCHEMA:?})"
                )))
            }
            None => {
                return Err(ParseError(
                    "not a pinguard report (no \"schema\" key)".into(),
                ))
            }
        }
    }
    serde_json::from_slice(bytes).map_err(|e| ParseError(format!("malformed report ({e})")))
}

/// Whether `bytes`, which did not parse as a report, are evidently some other file (another
/// tool's JSON, a config file, an empty file) rather than a damaged or newer pinguard report: a
/// folder scan skips the first kind and stops at the second.
pub fn foreign(bytes: &[u8]) -> bool {
    if state::is_state(bytes) {
        return false;
    }
    #[derive(Deserialize)]
    struct SchemaOnly {
        schema: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<SchemaOnly>(bytes) {
        Ok(h) => !h
            .schema
            .as_ref()
            .and_then(|s| s.as_str())
            .is_some_and(|s| s.starts_with("pinguard.")),
        Err(e) if e.is_data() => true,
        // Not JSON (or cut short): a report only if it names the schema.
        Err(_) => !bytes.windows(16).any(|w| w == b"pinguard.report."),
    }
}

/// `pinguard.report.vN` with N above this crate's version.
fn newer_version(schema: &str) -> bool {
    let ours: u32 = SCHEMA
        .rsplit('v')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    schema
        .strip_prefix("pinguard.report.v")
        .and_then(|v| v.parse::<u32>().ok())
        .is_some_and(|v| v > ours)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `why` reads its room's figures only where the writer wrote them, `null` included: one
    /// left out is a malformed report, not an unknown figure.
    #[test]
    fn a_why_without_one_of_its_figures_does_not_parse() {
        let full = serde_json::json!({
            "error": "ENOMEM", "rlimit_memlock_bytes": null, "rlimit_memlock_known": true,
            "cap_ipc_lock": false, "vm_lck_bytes": 0, "vm_pin_bytes": 0,
            "cgroup_headroom_bytes": null, "budget_bytes": 4096
        });
        let why: Why = serde_json::from_value(full.clone()).unwrap();
        assert_eq!(
            (why.rlimit_memlock_bytes, why.budget_bytes),
            (None, Some(4096))
        );
        for key in [
            "rlimit_memlock_bytes",
            "vm_lck_bytes",
            "vm_pin_bytes",
            "cgroup_headroom_bytes",
            "budget_bytes",
        ] {
            let mut v = full.clone();
            v.as_object_mut().unwrap().remove(key);
            let err = serde_json::from_value::<Why>(v).unwrap_err().to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
    }

    /// Refused bytes sum where every part has them; one part without them (a report written
    /// before) makes the sum unknown rather than short.
    #[test]
    fn folded_refused_bytes_sum_only_when_every_part_has_them() {
        let part = |n: u64, bytes: Option<u64>| Folded {
            count: 1,
            denied_count: n,
            denied_bytes: bytes,
            downgraded_bytes: bytes.map(|_| 0),
            ..Default::default()
        };
        let mut f = Folded::default();
        f.add(&part(2, Some(8192)));
        f.add(&part(1, Some(4096)));
        f.add(&Folded::default());
        assert_eq!(
            (f.count, f.denied_bytes, f.downgraded_bytes),
            (2, Some(12288), Some(0))
        );
        f.add(&part(1, None));
        assert_eq!((f.denied_count, f.denied_bytes), (4, None));
        f.add(&part(1, Some(1)));
        assert_eq!(f.denied_bytes, None);
    }

    #[test]
    fn other_files_are_told_from_damaged_reports() {
        for other in [
            &b""[..],
            b"  \n",
            br#"{"model": "llama"}"#,
            br#"{"schema": "heaptrack.v3"}"#,
            br#"[1, 2]"#,
            b"\x7fELF\x01",
            b"key = value",
        ] {
            assert!(foreign(other), "{:?}", String::from_utf8_lossy(other));
        }
        for ours in [
            &br#"{"schema": "pinguard.report.v1", "totals": 3}"#[..],
            br#"{"schema": "pinguard.report.v9"}"#,
            br#"{"schema": "pinguard.report.v1", "reason": "ex"#,
        ] {
            assert!(!foreign(ours), "{:?}", String::from_utf8_lossy(ours));
        }
    }

    #[test]
    fn each_reason_is_written_under_its_name() {
        for r in [
            Reason::Exit,
            Reason::Interval,
            Reason::Signal,
            Reason::Request,
            Reason::Killed,
            Reason::FatalSignal,
            Reason::Running,
        ] {
            assert_eq!(
                serde_json::to_string(&r).unwrap(),
                format!("\"{}\"", r.name())
            );
        }
        assert_eq!(Reason::FatalSignal.name(), "fatal_signal");
    }

    #[test]
    fn addr_round_trips_as_hex() {
        let s = serde_json::to_string(&Addr(0x7f12_3456_789a)).unwrap();
        assert_eq!(s, "\"0x7f123456789a\"");
        let back: Addr = serde_json::from_str(&s).unwrap();
        assert_eq!(back, Addr(0x7f12_3456_789a));
        assert!(serde_json::from_str::<Addr>("\"12\"").is_err());
        for a in [0, 1, 0xf, 0x10, 0xdead_beef, u64::MAX] {
            assert_eq!(
                serde_json::to_string(&Addr(a)).unwrap(),
                format!("\"{a:#x}\"")
            );
        }
    }

    #[test]
    fn rejects_other_schemas_and_garbage() {
        assert!(Report::from_slice(b"").unwrap_err().0.contains("empty"));
        assert!(Report::from_slice(b"{\"schema\":\"pinguard.report.v9\"}")
            .unwrap_err()
            .0
            .contains("newer pinguard"));
        assert!(Report::from_slice(b"{\"schema\":\"heaptrack\"}")
            .unwrap_err()
            .0
            .contains("not supported"));
        assert!(Report::from_slice(b"{\"a\":1}")
            .unwrap_err()
            .0
            .contains("no \"schema\""));
        assert!(Report::from_slice(b"{\"schema\":")
            .unwrap_err()
            .0
            .contains("not valid JSON"));
        assert!(Report::from_slice(b"{\"schema\":\"pinguard.report.v1\"}")
            .unwrap_err()
            .0
            .contains("malformed"));
    }
}
