//! `PINGUARD_DOWNGRADE_MATCH`: under `downgrade`, which callsites pageable memory may serve. A
//! staging buffer that is only copied from (PyTorch's DataLoader pin-memory thread) is safe to
//! downgrade; memory a kernel reads directly (every `cudaHostAlloc` allocation is
//! device-accessible under unified addressing) is not. A callsite is in scope when one of the
//! patterns matches, anywhere in its stack, a Python frame's file or qualified name, or a native
//! frame's symbol or module file name. Asked only on the over-budget path, once per callsite.

use super::Hook;
use crate::accounting::callsite::Callsite;
use std::sync::atomic::Ordering;

/// `Callsite::scope`: 0 until asked, then one of these.
const IN: u8 = 1;
const OUT: u8 = 2;

impl Hook {
    /// Under a scoped `downgrade`, decides `site`'s scope before the locking family takes the
    /// locked-page view: naming frames takes other locks (Python's frame table, the parsed
    /// files), which must never be taken under the view's (the fork handlers take them first).
    /// Once per callsite; nothing at all without `PINGUARD_DOWNGRADE_MATCH`.
    #[inline]
    pub(crate) fn scope_ahead(&self, site: &'static Callsite) {
        if self.cfg.policy == crate::runtime::config::Policy::Downgrade
            && self.cfg.downgrade_match.is_some()
        {
            self.scope_ahead_work(site);
        }
    }

    /// `scope_ahead`'s look at the frames, on pinguard's own stack (naming them reads symbol
    /// tables); the locking family's steady path runs on the caller's.
    #[cold]
    #[inline(never)]
    fn scope_ahead_work(&self, site: &'static Callsite) {
        if site.scope.load(Ordering::Relaxed) == 0 {
            self.work(|| super::quiet(|| self.downgrade_in_scope(site)));
        }
    }

    /// Whether pageable memory may stand in for pinned memory at `site`.
    pub(crate) fn downgrade_in_scope(&self, site: &'static Callsite) -> bool {
        let Some(patterns) = &self.cfg.downgrade_match else {
            return true;
        };
        match site.scope.load(Ordering::Relaxed) {
            IN => true,
            OUT => false,
            _ => {
                let found = matches(patterns, site);
                site.scope
                    .store(if found { IN } else { OUT }, Ordering::Relaxed);
                found
            }
        }
    }
}

#[cold]
fn matches(patterns: &[glob::Pattern], site: &'static Callsite) -> bool {
    if patterns.is_empty() {
        return false;
    }
    let hit = |s: &str| patterns.iter().any(|p| p.matches(s));
    // Python frames first: they are interned text already.
    let mut found = false;
    for &id in site.python() {
        crate::capture::python::frame(id, |f| found = found || hit(&f.file) || hit(&f.function));
        if found {
            return true;
        }
    }
    // Native frames: named as a report names them. Reading the objects' files is not to be a
    // cancellation point inside the program's call, and the loaded objects must stay put.
    let _nc = crate::runtime::sys::NoCancel::new();
    let _open = crate::runtime::gate::enter();
    let mut sym = crate::output::symbolize::Symbolizer::new();
    sym.name_all(site.native().iter().copied());
    for &a in site.native() {
        for f in sym.frames(a) {
            let module = f
                .module
                .as_deref()
                .map(|m| m.rsplit('/').next().unwrap_or(m));
            if f.symbol.as_deref().is_some_and(hit)
                || module.is_some_and(hit)
                || f.module.as_deref().is_some_and(hit)
            {
                return true;
            }
        }
    }
    false
}
