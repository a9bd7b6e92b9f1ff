//! Accounting: what is pinned now and what happened so far. The ledger's counters and levels,
//! the callsite table, the live-allocation tables and the locked-page view, all kept in the
//! state file's arena so that a killed process still leaves them. Records only: the budget's
//! decisions are made by `track`, which feeds the figures here.

pub mod addr_map;
pub mod arena;
pub mod callsite;
pub mod ledger;
pub mod level;
pub mod physical;
pub mod pools;
pub mod ranges;
