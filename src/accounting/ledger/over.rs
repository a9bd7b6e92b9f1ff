//! Which limit a call went over.

use super::blocks::{add, Block};
use pinguard_common::Limit;

/// Which limit a call went over, for its counters and its event, and with the host reserve the
/// host's available memory as counted for the decision. One word (the limit in the low two bits):
/// the hook's decision carries it, and on the hot path a decision is no larger than a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Over(u64);

impl Over {
    const LIMITS: [Limit; 6] = [
        Limit::Budget,
        Limit::GroupBudget,
        Limit::HostReserve,
        Limit::GroupUnavailable,
        Limit::CgroupReserve,
        Limit::ConfigError,
    ];
    /// The low bits hold the limit, the rest a floor's figure.
    const BITS: u32 = 3;

    pub fn budget() -> Over {
        Over(0)
    }

    pub fn group_budget() -> Over {
        Over(1)
    }

    /// The group's ledger could not be reached in time: its budget could not be checked.
    pub fn group_unavailable() -> Over {
        Over(3)
    }

    /// A setting could not be used under `PINGUARD_STRICT`: refused whatever the figures.
    pub fn config_error() -> Over {
        Over(5)
    }

    /// Over the host reserve, with `available` bytes (kept up to 2^61, 2 EiB).
    pub fn host_reserve(available: u64) -> Over {
        Over(available.min(u64::MAX >> Self::BITS) << Self::BITS | 2)
    }

    /// Over the cgroup reserve, with `headroom` bytes (kept up to 2^61).
    pub fn cgroup_reserve(headroom: u64) -> Over {
        Over(headroom.min(u64::MAX >> Self::BITS) << Self::BITS | 4)
    }

    pub fn limit(self) -> Limit {
        Self::LIMITS[(self.0 & 7) as usize % Self::LIMITS.len()]
    }

    pub fn host_available(self) -> Option<u64> {
        (self.limit() == Limit::HostReserve).then_some(self.0 >> Self::BITS)
    }

    pub fn cgroup_headroom(self) -> Option<u64> {
        (self.limit() == Limit::CgroupReserve).then_some(self.0 >> Self::BITS)
    }

    /// A call over the host reserve also counts as one (`host_reserve_count`), and a call the
    /// group could not decide (`group_unavailable_count`).
    pub(super) fn count(self, m: &Block) {
        match self.limit() {
            Limit::HostReserve => add(&m.totals.host_reserve_count, 1),
            Limit::CgroupReserve => add(&m.totals.cgroup_reserve_count, 1),
            Limit::GroupUnavailable => add(&m.totals.group_unavailable_count, 1),
            _ => {}
        }
    }
}

#[cfg(test)]
mod over_tests {
    use super::*;

    #[test]
    fn an_over_keeps_its_limit_and_the_available_bytes() {
        assert_eq!(
            (Over::budget().limit(), Over::budget().host_available()),
            (Limit::Budget, None)
        );
        assert_eq!(
            (
                Over::group_budget().limit(),
                Over::group_budget().host_available()
            ),
            (Limit::GroupBudget, None)
        );
        for a in [0, 1, 4095, 1 << 40, u64::MAX >> 3] {
            assert_eq!(
                (
                    Over::host_reserve(a).limit(),
                    Over::host_reserve(a).host_available()
                ),
                (Limit::HostReserve, Some(a))
            );
        }
        assert_eq!(
            Over::host_reserve(u64::MAX).host_available(),
            Some(u64::MAX >> 3)
        );
        assert_eq!(
            (
                Over::cgroup_reserve(7 << 20).limit(),
                Over::cgroup_reserve(7 << 20).cgroup_headroom()
            ),
            (Limit::CgroupReserve, Some(7 << 20))
        );
        assert_eq!(Over::cgroup_reserve(7).host_available(), None);
        assert_eq!(
            (
                Over::config_error().limit(),
                Over::config_error().host_available()
            ),
            (Limit::ConfigError, None)
        );
    }
}
