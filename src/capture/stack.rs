//! Stack capture at allocation time: raw return addresses only, resolved when a report is
//! written. framehop (`unwind`) walks the stack; libgcc's unwinder (`backtrace`) is the fallback
//! where that walk cannot run (a thread off its own stack, or during thread teardown).

use crate::runtime::objects::is_own;

pub const MAX_FRAMES: usize = 128;

/// Fills `out` with up to `out.len()` return addresses, starting at the code that called the
/// intercepted function: pinguard's own frames, and the unwinder's above them, are skipped.
#[inline(never)]
pub fn capture(from: crate::capture::unwind::Regs, out: &mut [usize]) -> usize {
    if out.is_empty() {
        return 0;
    }
    if let Some(n) = crate::capture::unwind::walk(from, out) {
        return n;
    }
    slow(out)
}

/// What the caller made of the frames of its last walk from `from` (`tag`), when that walk, of
/// `depth` frames, still holds: a loop pinning from one place then skips the frames altogether.
/// `from` by reference: the hook's registers are not copied for the call.
#[inline]
pub fn recall(from: &crate::capture::unwind::Regs, depth: usize) -> Option<usize> {
    crate::capture::unwind::recall_tag(from, depth)
}

/// Tags the walk just made from `from` (`capture`) with what the caller made of its frames (not 0).
pub fn tag(from: crate::capture::unwind::Regs, tag: usize) {
    crate::capture::unwind::tag(from, tag)
}

#[inline(never)]
fn slow(out: &mut [usize]) -> usize {
    let depth = out.len();
    let _open = crate::runtime::gate::enter(); // the unwinder takes the loader's lock
    let mut n = 0;
    let mut seen_own = false;
    // `trace_unsynchronized`: `trace` takes a process-wide mutex, which a fork in another thread
    // would leave locked in the child forever (docs/field-notes.md).
    // SAFETY: The lock `trace` adds only serializes unwinders that are not thread-safe (Windows'
    // dbghelp); libgcc's `_Unwind_Backtrace`, used here, is safe to run concurrently.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as usize;
            if ip == 0 {
                return false;
            }
            if n == 0 && is_own(ip) {
                seen_own = true;
                return true;
            }
            if !seen_own {
                return true; // unwinder frames (libgcc) before pinguard's own
            }
            out[n] = ip;
            n += 1;
            n < depth
        });
    }
    n
}
