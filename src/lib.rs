//! pinguard: an `LD_PRELOAD` library that intercepts every way a process takes host-pinned
//! memory, records it with its callsite, enforces a pinned-memory budget and writes reports.
//!
//! Data flows one way: a hook (`hooks/`) enters `track::Hook` (reentrancy guard, lazy start),
//! which captures the callsite (`stack`, `callsite`), asks the `budget`, calls the real function
//! (`resolve`) or the `pageable` fallback, and records the outcome in the `ledger`. `report`
//! turns the ledger into JSON (`symbolize` resolves addresses then, and only then).

#![deny(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(any(test, feature = "fuzzing"), allow(dead_code))] // built without the hooks

mod addr_map;
mod arena;
mod api;
mod budget;
mod callsite;
mod capi;
mod config;
mod dl;
mod gate;
mod group;
mod guard;
mod heap;
#[cfg(not(any(test, feature = "fuzzing")))]
mod hooks;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod kernel;
mod ledger;
mod level;
mod lifecycle;
mod lock;
mod log;
mod metrics;
mod pageable;
mod python;
mod ranges;
mod report;
mod reporter;
mod resolve;
mod stack;
mod symbolize;
mod sys;
mod track;
mod unload;
mod unwind;

/// All of pinguard's allocations, away from the application's `malloc` (see `heap`).
#[cfg(not(any(test, feature = "fuzzing")))]
#[global_allocator]
static HEAP: heap::Heap = heap::Heap;
