//! Output: the ledger's figures shaped for people and CI. The JSON report and where it goes, the
//! background thread that rewrites it, Prometheus metrics, symbolization (and the cheap naming of a
//! callsite inside the application's call), and the notes kept for a library before it is unloaded.

pub mod cgroup;
pub mod files;
pub mod metrics;
pub mod quick;
pub mod report;
pub mod reporter;
pub mod symbolize;
pub mod unload;
pub mod why;
