//! Addresses to modules, symbols and lines, done only when a report is written and only once per
//! distinct address.
//!
//! Each report takes the list of loaded objects afresh, so an object opened after the previous
//! report is named and one closed since is not taken for whatever now sits at its addresses
//! (`backtrace`'s resolver keeps the list it saw first, for the life of the process).
//!
//! The memory this takes is bounded whatever the process has loaded: the addresses are named
//! module by module, each module's files opened, read and closed before the next, and nothing is
//! kept between reports. A module whose debug information and symbol tables are small
//! (`LINES_MAX_BYTES`) is read with `addr2line` (function, file, line, inlined functions); a
//! larger one (libtorch: hundreds of MiB) only has its symbol tables read, in 64 KiB pieces, for
//! its functions' names: its frames' file and line are filled in afterwards by the readers
//! (`pinguard report` and the other commands) from the report's module list and build ids.

use crate::runtime::objects::{for_each_object, Object};
use pinguard_common::elf::Elf;
use pinguard_common::{symbols, Addr, Frame, Module};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// A module whose debug sections and symbol tables together are larger than this (compressed
/// sections counted at their uncompressed size), or whose line tables are larger than
/// `LINE_TABLES_MAX_BYTES`, is named from its symbol tables alone. Parsing debug information
/// takes memory in proportion to it: the pages read, each line-table row (24 bytes on the heap,
/// from as little as one byte of `.debug_line`), each function and inlined call. See
/// `docs/internals.md`, "Naming frames", for what these limits cost at most.
pub const LINES_MAX_BYTES: u64 = 4 << 20;
pub const LINE_TABLES_MAX_BYTES: u64 = 256 << 10;

pub struct Symbolizer {
    objects: Vec<(Object, String)>,
    cache: FxHashMap<usize, Vec<Frame>>,
    used: BTreeMap<usize, usize>,
}

impl Symbolizer {
    pub fn new() -> Symbolizer {
        let exe = crate::runtime::kernel::exe();
        let mut objects = Vec::new();
        for_each_object(|o| {
            let name = o.name.to_string_lossy();
            let path = if name.is_empty() {
                exe.clone()
            } else {
                name.into_owned()
            };
            objects.push((
                Object {
                    name: o.name.clone(),
                    base: o.base,
                    start: o.start,
                    end: o.end,
                    build_id: o.build_id.clone(),
                    dynamic: o.dynamic,
                },
                path,
            ));
        });
        // A library opened by a relative path (ctypes.CDLL("lib/x.so")) has that name in the loader's
        // list; the kernel's map of the process has the file's absolute path.
        if objects
            .iter()
            .any(|(_, p): &(Object, String)| !p.starts_with('/') && !p.is_empty())
        {
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
            for (o, path) in objects.iter_mut().filter(|(_, p)| !p.starts_with('/')) {
                if let Some(abs) = mapped_file(&maps, o.start) {
                    *path = abs;
                }
            }
        }
        Symbolizer {
            objects,
            cache: FxHashMap::default(),
            used: BTreeMap::new(),
        }
    }

    /// Names every address of `addrs` not named yet, one module at a time: call it with all the
    /// addresses a report will show before asking for their `frames`, or each module is read
    /// once per address.
    pub fn name_all(&mut self, addrs: impl IntoIterator<Item = usize>) {
        let mut by_object: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for a in addrs {
            if self.cache.contains_key(&a) {
                continue;
            }
            match self.objects.iter().position(|(o, _)| o.contains(a)) {
                Some(i) => by_object.entry(i).or_default().push(a),
                None => {
                    self.cache.insert(a, vec![unnamed(a, None, None)]);
                }
            }
        }
        for (i, mut addrs) in by_object {
            addrs.sort_unstable();
            addrs.dedup();
            self.used.insert(self.objects[i].0.base, i);
            let (o, path) = &self.objects[i];
            for (a, frames) in addrs.iter().zip(name_in(o, path, &addrs)) {
                self.cache.insert(*a, frames);
            }
        }
    }

    /// The frames for one return address: more than one when functions were inlined there,
    /// innermost first.
    pub fn frames(&mut self, addr: usize) -> &[Frame] {
        if !self.cache.contains_key(&addr) {
            self.name_all([addr]);
        }
        &self.cache[&addr]
    }

    /// The address range of the loaded object with this load bias and loader name.
    pub fn object_at(&self, base: usize, name: &[u8]) -> Option<(usize, usize)> {
        self.objects
            .iter()
            .find(|(o, _)| o.base == base && o.name.as_bytes() == name)
            .map(|(o, _)| (o.start, o.end))
    }

    /// The module entry for the object `addr` lies in.
    pub fn module_of(&self, addr: usize) -> Option<Module> {
        let (o, path) = self.objects.iter().find(|(o, _)| o.contains(addr))?;
        Some(Module {
            path: path.clone(),
            base: Addr(o.base as u64),
            build_id: o.build_id.clone(),
        })
    }

    /// Every module that a resolved frame fell in.
    pub fn modules(&self) -> Vec<Module> {
        self.used
            .values()
            .map(|&i| {
                let (o, path) = &self.objects[i];
                Module {
                    path: path.clone(),
                    base: Addr(o.base as u64),
                    build_id: o.build_id.clone(),
                }
            })
            .collect()
    }
}

fn unnamed(addr: usize, module: Option<String>, offset: Option<Addr>) -> Frame {
    Frame {
        addr: Addr(addr as u64),
        module,
        offset,
        symbol: None,
        file: None,
        line: None,
    }
}

/// The frames of `addrs` (sorted, distinct, all in the object `o` whose file is `path`). The
/// object's files are opened and read here and closed on return.
fn name_in(o: &Object, path: &str, addrs: &[usize]) -> Vec<Vec<Frame>> {
    let module = Some(path.to_string());
    if !path.starts_with('/') {
        // The vDSO, or a name the loader did not resolve to a file.
        return addrs
            .iter()
            .map(|&a| {
                vec![unnamed(
                    a,
                    module.clone(),
                    Some(Addr(a.wrapping_sub(o.base) as u64)),
                )]
            })
            .collect();
    }
    let debug = symbols::debug_file(path, o.build_id.as_deref());
    if lines_fit(&debug) {
        let loader = addr2line::Loader::new(&debug).ok();
        return addrs
            .iter()
            .map(|&a| symbols::frames(loader.as_ref(), a, o.base, module.clone()))
            .collect();
    }
    // A return address points after the call; the call itself is one byte earlier.
    let probes: Vec<u64> = addrs
        .iter()
        .map(|&a| (a - o.base).saturating_sub(1) as u64)
        .collect();
    let mut names = Elf::open(path)
        .map(|e| e.function_names(&probes))
        .unwrap_or_else(|| vec![None; addrs.len()]);
    if debug != path && names.iter().any(Option::is_none) {
        // A stripped object: its separate debug file has the full symbol table.
        if let Some(more) = Elf::open(&debug).map(|e| e.function_names(&probes)) {
            for (n, m) in names.iter_mut().zip(more) {
                if n.is_none() {
                    *n = m;
                }
            }
        }
    }
    addrs
        .iter()
        .zip(names)
        .map(|(&a, name)| {
            let mut f = unnamed(a, module.clone(), Some(Addr((a - o.base) as u64)));
            f.symbol = name.map(|n| addr2line::demangle_auto(n.into(), None).into_owned());
            vec![f]
        })
        .collect()
}

/// Whether the debug information in `debug` (and the DWARF package beside it, which `addr2line`
/// also reads) is small enough to parse here.
fn lines_fit(debug: &str) -> bool {
    let Some(elf) = Elf::open(debug) else {
        return false;
    };
    let package = std::fs::metadata(format!("{debug}.dwp")).map_or(0, |m| m.len());
    elf.debug_bytes().saturating_add(package) <= LINES_MAX_BYTES
        && elf.debug_section_bytes(".debug_line") <= LINE_TABLES_MAX_BYTES
}

/// The file mapped at `addr` in a `/proc/PID/maps` text.
fn mapped_file(maps: &str, addr: usize) -> Option<String> {
    maps.lines().find_map(|l| {
        let (range, rest) = l.split_once(' ')?;
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        // The path is the last field and may hold spaces; no field before it holds " /".
        let path = &rest[rest.find(" /")? + 1..];
        (addr >= lo && addr < hi).then(|| path.to_string())
    })
}
