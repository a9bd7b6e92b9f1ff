//! Where pinguard's own mappings go: away from the program's.
//!
//! pinguard maps its heap and work stacks at its first pinning call, not at load. The kernel puts
//! a mapping without a hint at the top of the lowest free gap below the others (the "frontier"),
//! exactly where the program's last `munmap` left room: a program that unmaps a range and then
//! asks the kernel about it (`mlock` of what it just unmapped, for ENOMEM) would find pinguard's
//! memory there. A hint well below the loaded objects keeps pinguard's mappings out of the
//! program's way; where the hinted range is taken (a large reservation of the program's) the
//! kernel places the mapping as without a hint, which is no worse than before.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// How far below pinguard's own object its mappings start: far beyond a program's ordinary
/// mappings, well inside a 39-bit address space (512 GiB) where the objects sit near the top.
const BELOW: usize = 64 << 30;

/// The next hint's top: pinguard's mappings go downwards from `own start - BELOW`.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A hint for a mapping of `len` bytes (a multiple of the page size), or 0 (none).
pub fn hint(len: usize) -> usize {
    let page = crate::runtime::sys::page_size();
    let len = len.div_ceil(page) * page;
    loop {
        let seen = NEXT.load(Relaxed);
        let top = match seen {
            0 => crate::runtime::objects::own_range().0.saturating_sub(BELOW) & !(page - 1),
            t => t,
        };
        let Some(at) = top.checked_sub(len).filter(|&a| a >= BELOW) else {
            return 0;
        };
        if NEXT
            .compare_exchange_weak(seen, at, Relaxed, Relaxed)
            .is_ok()
        {
            return at;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hints_go_down_and_never_overlap() {
        let a = super::hint(8192);
        let b = super::hint(4096);
        assert!(a != 0 && b + 4096 <= a, "{a:#x} {b:#x}");
    }
}
