//! Addresses to modules, symbols and lines, done only when a report is written and only once per
//! distinct address.
//!
//! Each report takes the list of loaded objects afresh, so an object opened after the previous
//! report is named and one closed since is not taken for whatever now sits at its addresses
//! (`backtrace`'s resolver keeps the list it saw first, for the life of the process). Parsed
//! debug information is kept across reports, keyed by file identity, since parsing a large
//! library costs far more than one report.

use crate::runtime::lock::Mutex;
use crate::runtime::objects::{for_each_object, Object};
use pinguard_report::{Addr, Frame, Module};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

/// (path, device, inode, modification time): a file replaced on disk is parsed again.
type FileKey = (String, u64, u64, i64);

struct Parsed(Option<addr2line::Loader>);

// SAFETY: a `Loader` owns everything it points into; it is only used by the one thread that
// took it out of `PARSED` (under the lock, or after `take`).
unsafe impl Send for Parsed {}

/// How many parsed files are kept between reports.
const KEEP: usize = 12;

static PARSED: Mutex<Vec<(FileKey, Parsed)>> = Mutex::new(Vec::new());

/// Fork handlers: a callsite's frames are named outside the report's lock too (under
/// `PINGUARD_DOWNGRADE_MATCH`, on the over-budget path), so the parsed files' lock is held across
/// `fork`, after the ledger's locks and before the heap's.
pub fn hold() {
    crate::runtime::lock::hold(&PARSED);
}

/// # Safety
/// Only after `hold`, in the fork handlers.
pub unsafe fn release(child: bool) {
    // SAFETY: after `hold`, in the fork handler `child` names (this function's contract).
    unsafe { crate::runtime::lock::release(&PARSED, child) }
}

pub struct Symbolizer {
    objects: Vec<(Object, String)>,
    /// Parsed files by object index; taken from `PARSED` and given back on drop.
    files: Vec<(FileKey, Parsed)>,
    by_object: FxHashMap<usize, Option<usize>>,
    cache: FxHashMap<usize, Vec<Frame>>,
    used: BTreeMap<usize, usize>,
}

impl Symbolizer {
    pub fn new() -> Symbolizer {
        let exe = crate::runtime::kernel::exe();
        let mut objects = Vec::new();
        for_each_object(|o| {
            let name = o.name.to_string_lossy();
            let path = if name.is_empty() { exe.clone() } else { name.into_owned() };
            objects.push((
                Object { name: o.name.clone(), base: o.base, start: o.start, end: o.end, build_id: o.build_id.clone(), dynamic: o.dynamic },
                path,
            ));
        });
        // A library opened by a relative path (ctypes.CDLL("lib/x.so")) has that name in the loader's
        // list; the kernel's map of the process has the file's absolute path.
        if objects.iter().any(|(_, p): &(Object, String)| !p.starts_with('/') && !p.is_empty()) {
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
            for (o, path) in objects.iter_mut().filter(|(_, p)| !p.starts_with('/')) {
                if let Some(abs) = mapped_file(&maps, o.start) {
                    *path = abs;
                }
            }
        }
        let files = std::mem::take(&mut *PARSED.lock());
        Symbolizer { objects, files, by_object: FxHashMap::default(), cache: FxHashMap::default(), used: BTreeMap::new() }
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

    /// The address range of the loaded object with this load bias and loader name.
    pub fn object_at(&self, base: usize, name: &[u8]) -> Option<(usize, usize)> {
        self.objects.iter().find(|(o, _)| o.base == base && o.name.as_bytes() == name).map(|(o, _)| (o.start, o.end))
    }

    /// The module entry for the object `addr` lies in.
    pub fn module_of(&self, addr: usize) -> Option<Module> {
        let (o, path) = self.objects.iter().find(|(o, _)| o.contains(addr))?;
        Some(Module { path: path.clone(), base: Addr(o.base as u64), build_id: o.build_id.clone() })
    }

    fn parsed(&mut self, object: usize) -> Option<&addr2line::Loader> {
        let slot = match self.by_object.get(&object) {
            Some(s) => *s,
            None => {
                let s = self.open(object);
                self.by_object.insert(object, s);
                s
            }
        };
        self.files.get(slot?)?.1 .0.as_ref()
    }

    fn open(&mut self, object: usize) -> Option<usize> {
        let path = &self.objects[object].1;
        if !path.starts_with('/') {
            return None; // the vDSO, or a name the loader did not resolve to a file
        }
        let meta = std::fs::metadata(path).ok()?;
        let key: FileKey = (path.clone(), meta.dev(), meta.ino(), meta.mtime());
        if let Some(i) = self.files.iter().position(|(k, _)| *k == key) {
            return Some(i);
        }
        let loader = pinguard_report::symbols::open(path, self.objects[object].0.build_id.as_deref());
        self.files.push((key, Parsed(loader)));
        Some(self.files.len() - 1)
    }

    fn resolve(&mut self, addr: usize) -> Vec<Frame> {
        let Some(i) = self.objects.iter().position(|(o, _)| o.contains(addr)) else {
            return vec![Frame { addr: Addr(addr as u64), module: None, offset: None, symbol: None, file: None, line: None }];
        };
        self.used.insert(self.objects[i].0.base, i);
        let base = self.objects[i].0.base;
        let module = Some(self.objects[i].1.clone());
        pinguard_report::symbols::frames(self.parsed(i), addr, base, module)
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

/// The file mapped at `addr` in a `/proc/PID/maps` text.
fn mapped_file(maps: &str, addr: usize) -> Option<String> {
    maps.lines().find_map(|l| {
        let (range, rest) = l.split_once(' ')?;
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (usize::from_str_radix(lo, 16).ok()?, usize::from_str_radix(hi, 16).ok()?);
        // The path is the last field and may hold spaces; no field before it holds " /".
        let path = &rest[rest.find(" /")? + 1..];
        (addr >= lo && addr < hi).then(|| path.to_string())
    })
}

impl Drop for Symbolizer {
    fn drop(&mut self) {
        let mut files = std::mem::take(&mut self.files);
        // Keep the most recently parsed ones; what this report opened last is at the end.
        let drop_n = files.len().saturating_sub(KEEP);
        files.drain(..drop_n);
        let mut kept = PARSED.lock();
        if kept.is_empty() {
            *kept = files;
        }
    }
}
