//! Which native frames are the CPython interpreter's own: under a Python callsite they repeat in
//! every stack (the Python block above says where the call came from), so `report` folds them at
//! display time; the reports keep every frame.

use crate::merge::basename;
use pinguard_common::Frame;

/// Symbols of the interpreter's evaluation loop and call machinery, wherever it is linked.
const PREFIXES: &[&str] = &[
    "_PyEval_",
    "PyEval_",
    "_PyObject_",
    "PyObject_",
    "_PyFunction_",
    "PyVectorcall_",
    "_PyVectorcall_",
    "method_vectorcall",
    "cfunction_call",
    "cfunction_vectorcall",
    "slot_tp_",
    "vectorcall_",
    "_PyRun_",
    "PyRun_",
    "pyrun_",
    "run_mod",
    "run_eval_code_obj",
    "pymain_",
    "Py_RunMain",
    "Py_BytesMain",
    "Py_Main",
];

/// The process's start below `main`: it only ever sits under the interpreter's frames here.
const START: &[&str] = &["__libc_start_call_main", "__libc_start_main", "_start"];

/// Whether `f` is CPython's: in `libpython3*` or a `python3*` executable, or one of its symbols.
pub fn is_interpreter(f: &Frame) -> bool {
    if f.module.as_deref().map(basename).is_some_and(|m| {
        m.starts_with("libpython3") || (m.starts_with("python3") && !m.contains(".so"))
    }) {
        return true;
    }
    f.symbol
        .as_deref()
        .is_some_and(|s| PREFIXES.iter().any(|p| s.starts_with(p)))
}

fn is_start(f: &Frame) -> bool {
    f.symbol
        .as_deref()
        .is_some_and(|s| START.iter().any(|p| s.starts_with(p)))
}

/// The native frames as shown: `(index, Some(frame))` for a frame, `(index, None)` with the
/// index of the first of a folded run and the run's length for interpreter frames (and the
/// process start beneath them). `fold` false shows every frame.
pub fn folded(frames: &[Frame], fold: bool) -> Vec<Shown<'_>> {
    let mut out = Vec::with_capacity(frames.len());
    let mut i = 0;
    while i < frames.len() {
        let run = frames[i..]
            .iter()
            .take_while(|f| is_interpreter(f) || is_start(f))
            .count();
        let interp = frames[i..i + run]
            .iter()
            .filter(|f| is_interpreter(f))
            .count();
        if fold && run > 1 && interp > 0 {
            out.push(Shown::Folded(run));
            i += run;
        } else {
            out.push(Shown::Frame(i, &frames[i]));
            i += 1;
        }
    }
    out
}

/// A line of a native stack as `report` shows it.
pub enum Shown<'a> {
    /// The frame and its index in the whole stack.
    Frame(usize, &'a Frame),
    /// This many interpreter frames in a row, not shown.
    Folded(usize),
}
