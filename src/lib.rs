//! pinguard: an `LD_PRELOAD` library that intercepts every way a process takes host-pinned
//! memory, records it with its callsite, enforces a pinned-memory budget and writes reports.
//!
//! Data flows one way: a hook (`hooks/`) enters `track::Hook` (reentrancy guard, lazy start),
//! which captures the callsite (`stack`, `callsite`), asks the `budget`, calls the real function
//! (`resolve`) or the `pageable` fallback, and records the outcome in the `ledger`. `report`
//! turns the ledger into JSON (`symbolize` resolves addresses then, and only then).

#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(any(test, feature = "fuzzing"), allow(dead_code))] // built without the hooks

mod accounting;
mod api;
mod budget;
mod capi;
mod capture;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
#[cfg(not(any(test, feature = "fuzzing")))]
mod hooks;
mod lifecycle;
mod output;
mod runtime;
mod track;

/// All of pinguard's allocations, away from the application's `malloc` (see `heap`).
#[cfg(not(any(test, feature = "fuzzing")))]
#[global_allocator]
static HEAP: runtime::heap::Heap = runtime::heap::Heap;
