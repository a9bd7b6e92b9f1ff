//! Addresses to modules, symbols and lines, done only when a report is written and only once per
//! distinct address.

use crate::resolve::{for_each_object, Object};
use pinguard_report::{Addr, Frame, Module};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

pub struct Symbolizer {
    objects: Vec<(Object, String)>,
    cache: FxHashMap<usize, Vec<Frame>>,
    used: BTreeMap<usize, usize>,
}

impl Symbolizer {
    pub fn new() -> Symbolizer {
        let exe = crate::kernel::exe();
        let mut objects = Vec::new();
        for_each_object(|o| {
            let name = o.name.to_string_lossy();
            let path = if name.is_empty() { exe.clone() } else { name.into_owned() };
            objects.push((
                Object { name: o.name.clone(), base: o.base, start: o.start, end: o.end, build_id: o.build_id.clone(), dynamic: o.dynamic },
                path,
            ));
        });
        Symbolizer { objects, cache: FxHashMap::default(), used: BTreeMap::new() }
    }

    /// The frames for one return address: more than one when functions were inlined there,
    /// innermost first.
    pub fn frames(&mut self, addr: usize) -> &[Frame] {
        if !self.cache.contains_key(&addr) {
            let v = self.resolve(addr);
            self.cache.insert(addr, v);
        }
        &self.cache[&addr]
    }

    fn resolve(&mut self, addr: usize) -> Vec<Frame> {
        let obj = self.objects.iter().position(|(o, _)| o.contains(addr));
        let (module, offset) = match obj {
            Some(i) => {
                self.used.insert(self.objects[i].0.base, i);
                (Some(self.objects[i].1.clone()), Some(Addr((addr - self.objects[i].0.base) as u64)))
            }
            None => (None, None),
        };
        let mut frames = Vec::new();
        // A return address points after the call; the call itself is one byte earlier.
        let lookup = addr.saturating_sub(1) as *mut std::ffi::c_void;
        unsafe {
            backtrace::resolve_unsynchronized(lookup, |sym| {
                frames.push(Frame {
                    addr: Addr(addr as u64),
                    module: module.clone(),
                    offset,
                    symbol: sym.name().map(|n| n.to_string()),
                    file: sym.filename().map(|f| f.display().to_string()),
                    line: sym.lineno(),
                });
            });
        }
        if frames.is_empty() {
            frames.push(Frame { addr: Addr(addr as u64), module, offset, symbol: None, file: None, line: None });
        }
        frames
    }

    /// Every module that a resolved frame fell in.
    pub fn modules(&self) -> Vec<Module> {
        self.used
            .values()
            .map(|&i| {
                let (o, path) = &self.objects[i];
                Module { path: path.clone(), base: Addr(o.base as u64), build_id: o.build_id.clone() }
            })
            .collect()
    }
}
