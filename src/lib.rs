//! pinguard: an `LD_PRELOAD` library that intercepts every way a process takes host-pinned
//! memory, records it with its callsite, enforces a pinned-memory budget and writes reports.
//!
//! Data flows one way: a hook (`hooks/`) enters `track::Hook` (reentrancy guard, lazy start),
//! which captures the callsite (`capture`), asks the budget for a reservation (`budget`), calls
//! the real function (`runtime::resolve`) or serves pageable memory, and records the outcome
//! (`accounting`). `output` turns the records into a report, naming addresses then (only the
//! `warn` line names one earlier, cheaply: `output::quick`).
//! The stages are folders that import only from the ones before them (runtime, capture,
//! accounting, budget, output); this file, `hooks/`, `track/`, `lifecycle.rs` (which wires the
//! stages together at start-up), `api.rs` and `capi.rs` compose them.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]
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
