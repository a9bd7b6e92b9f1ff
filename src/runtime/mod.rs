//! Runtime plumbing: what every stage stands on. The configuration, the per-thread state and the
//! reentrancy guard, locks that survive `fork`, raw system calls and `/proc`, the clock, the
//! loaded objects and the real functions behind the hooks, pinguard's own heap and the pageable
//! memory a downgrade serves. Nothing here imports from another stage.

pub mod cgroup;
pub mod clock;
pub mod config;
pub mod copies;
pub mod devices;
pub mod dl;
pub mod front;
pub mod gate;
pub mod guard;
pub mod heap;
pub mod kernel;
pub mod lock;
pub mod log;
pub mod node;
pub mod objects;
pub mod own_maps;
pub mod pageable;
pub mod resolve;
pub mod room;
pub mod space;
pub mod sys;
#[cfg(not(any(test, feature = "fuzzing")))]
pub mod unwinder;
pub mod workstack;
