//! Capture: what a hooked call's callsite is, gathered cheaply in the call itself (native frames
//! by frame-pointer walk or unwind tables, Python frames read from the interpreter). Addresses
//! stay raw; `output::symbolize` names them only when a report is written.

pub mod python;
pub mod stack;
pub mod unwind;
