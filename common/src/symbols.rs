//! Return addresses to function, file and line, from an object file on disk: shared by the
//! library (its reports) and the readers, which name the frames of a dead process's state, and
//! fill in the file and line a report's frames were written without, from the module list the
//! state and the report keep.

use crate::{Addr, Frame, Module, Report};

/// Where distributions ship an object's debug information under its build id (libc6-dbg and the
/// like).
pub fn separate_path(build_id: Option<&str>) -> Option<String> {
    build_id
        .filter(|id| id.len() > 2)
        .map(|id| format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]))
}

/// The file to read an object's debug information from: the separate one under its build id when
/// there is one, else the object file itself.
pub fn debug_file(path: &str, build_id: Option<&str>) -> String {
    separate_path(build_id)
        .filter(|p| std::path::Path::new(p).is_file())
        .unwrap_or_else(|| path.to_string())
}

/// The debug information for a loaded object (`debug_file`), parsed.
pub fn open(path: &str, build_id: Option<&str>) -> Option<addr2line::Loader> {
    if !path.starts_with('/') {
        return None; // the vDSO, or a name the loader did not resolve to a file
    }
    let debug = debug_file(path, build_id);
    load(&debug).or_else(|| (debug != path).then(|| load(path)).flatten())
}

/// The loader opens the file by name: it is given the descriptor's own name
/// (`/proc/self/fd/N`), opened and judged a regular file first (`crate::untrusted`), so that a
/// FIFO or a device a report names is never opened to wait on, nor a name swapped in between.
fn load(path: &str) -> Option<addr2line::Loader> {
    use std::os::fd::AsRawFd;
    let (file, _) = crate::untrusted::open(path.as_ref(), crate::untrusted::Links::Follow).ok()?;
    addr2line::Loader::new(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// Whether the file at `path` is the object a process had loaded with this build id: the same
/// build id (neither having one counts: nothing tells them apart), or a separate debug file
/// under that id. A rebuilt or upgraded file would name frames wrongly.
pub fn is_module(path: &str, build_id: Option<&str>) -> bool {
    if separate_path(build_id).is_some_and(|p| std::path::Path::new(&p).is_file()) {
        return true;
    }
    crate::elf::Elf::open(path)
        .map(|e| e.build_id())
        .is_some_and(|id| id.as_deref() == build_id)
}

/// How many parsed files `Offline` keeps.
const OFFLINE_KEEP: usize = 16;

/// Names frames after the fact from the files on disk: frames of a dead process's state, and the
/// file and line (and inlined functions) that a report's frames were written without (the
/// library names frames of large objects from their symbol tables alone: see `docs/design.md`,
/// "Naming frames"). A file on disk that is not the module the process loaded (`is_module`) is
/// not used.
#[derive(Default)]
pub struct Offline {
    /// Parsed files, most recently opened last.
    loaders: Vec<(ModuleKey, Option<addr2line::Loader>)>,
}

/// A module's file and build id.
type ModuleKey = (String, Option<String>);

impl Offline {
    fn loader(&mut self, m: &Module) -> Option<&addr2line::Loader> {
        let key = (m.path.clone(), m.build_id.clone());
        let i = match self.loaders.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                if self.loaders.len() >= OFFLINE_KEEP {
                    self.loaders.remove(0);
                }
                let loader = if is_module(&m.path, m.build_id.as_deref()) {
                    open(&m.path, m.build_id.as_deref())
                } else {
                    None
                };
                self.loaders.push((key, loader));
                self.loaders.len() - 1
            }
        };
        self.loaders[i].1.as_ref()
    }

    /// The frames for the return address `addr` in the module `m`, named as far as its file
    /// allows (at least one).
    pub fn frames(&mut self, m: &Module, addr: u64) -> Vec<Frame> {
        let base = m.base.0 as usize;
        frames(self.loader(m), addr as usize, base, Some(m.path.clone()))
    }

    /// Names the native frames of `report` that have no file yet, from its `modules`: each
    /// return address's frames are replaced by what the module's debug information says (more
    /// than one where functions were inlined) when that names a file, or a function the report
    /// did not have. Returns whether anything changed.
    pub fn fill(&mut self, report: &mut Report) -> bool {
        let mut changed = false;
        for c in &mut report.callsites {
            changed |= self.fill_frames(&report.modules, &mut c.frames);
        }
        changed
    }

    /// `fill` for one callsite's `frames`.
    pub fn fill_frames(&mut self, modules: &[Module], frames: &mut Vec<Frame>) -> bool {
        if !frames
            .iter()
            .any(|f| f.file.is_none() && f.offset.is_some())
        {
            return false;
        }
        let mut changed = false;
        let mut out = Vec::with_capacity(frames.len());
        // The frames of one return address are consecutive (inlined functions, innermost first).
        for group in frames.chunk_by(|a, b| a.addr == b.addr) {
            match self.group(modules, group) {
                Some(named) => {
                    changed = true;
                    out.extend(named);
                }
                None => out.extend_from_slice(group),
            }
        }
        *frames = out;
        changed
    }

    /// Better frames for one return address's `group`, if its module's file gives some.
    fn group(&mut self, modules: &[Module], group: &[Frame]) -> Option<Vec<Frame>> {
        let f = &group[0];
        if group.iter().any(|g| g.file.is_some()) {
            return None;
        }
        let (path, offset) = (f.module.as_deref()?, f.offset?);
        let base = f.addr.0.checked_sub(offset.0)?;
        let m = modules
            .iter()
            .find(|m| m.path == path && m.base.0 == base)?;
        let named = self.frames(m, f.addr.0);
        let better = named.iter().any(|g| g.file.is_some())
            || (f.symbol.is_none() && named.iter().any(|g| g.symbol.is_some()));
        better.then_some(named)
    }
}

/// The frames for the return address `addr` in the object loaded at `base` (more than one where
/// functions were inlined, innermost first); at least one, named as far as `loader` allows.
pub fn frames(
    loader: Option<&addr2line::Loader>,
    addr: usize,
    base: usize,
    module: Option<String>,
) -> Vec<Frame> {
    // A base above the address (a corrupt module list): the frame stays unnamed.
    let Some(rel) = addr.checked_sub(base) else {
        return vec![Frame {
            addr: Addr(addr as u64),
            module,
            offset: None,
            symbol: None,
            file: None,
            line: None,
        }];
    };
    let offset = Some(Addr(rel as u64));
    // A return address points after the call; the call itself is one byte earlier.
    let probe = rel.saturating_sub(1) as u64;
    let mut frames = Vec::new();
    if let Some(loader) = loader {
        if let Ok(mut it) = loader.find_frames(probe) {
            while let Ok(Some(f)) = it.next() {
                let symbol = f
                    .function
                    .as_ref()
                    .and_then(|n| n.demangle().ok())
                    .map(|s| s.into_owned());
                let (file, line) = f
                    .location
                    .as_ref()
                    .map_or((None, None), |l| (l.file.map(str::to_string), l.line));
                frames.push(Frame {
                    addr: Addr(addr as u64),
                    module: module.clone(),
                    offset,
                    symbol,
                    file,
                    line,
                });
            }
        }
        // No debug information for it: the symbol table still names the function.
        if frames.iter().all(|f| f.symbol.is_none()) {
            if let Some(name) = loader.find_symbol(probe) {
                let symbol = Some(addr2line::demangle_auto(name.into(), None).into_owned());
                match frames.first_mut() {
                    Some(f) => f.symbol = symbol,
                    None => frames.push(Frame {
                        addr: Addr(addr as u64),
                        module: module.clone(),
                        offset,
                        symbol,
                        file: None,
                        line: None,
                    }),
                }
            }
        }
    }
    if frames.is_empty() {
        frames.push(Frame {
            addr: Addr(addr as u64),
            module,
            offset,
            symbol: None,
            file: None,
            line: None,
        });
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::tests::{bias, this_program};

    #[inline(never)]
    fn a_function_named_offline(x: u64) -> u64 {
        std::hint::black_box(x) * 5
    }

    fn unnamed_frame(addr: u64, path: &str, base: u64) -> Frame {
        Frame {
            addr: Addr(addr),
            module: Some(path.to_string()),
            offset: Some(Addr(addr - base)),
            symbol: Some("from_the_symbol_table".into()),
            file: None,
            line: None,
        }
    }

    #[test]
    fn frames_without_a_file_are_named_from_their_module_when_it_is_that_file() {
        assert_eq!(a_function_named_offline(1), 5);
        let (exe, base) = (this_program(), bias());
        let id = crate::elf::Elf::open(&exe).and_then(|e| e.build_id());
        let addr = a_function_named_offline as *const () as u64 + 1;
        let named = Frame {
            addr: Addr(7),
            module: None,
            offset: None,
            symbol: Some("kept".into()),
            file: Some("k.rs".into()),
            line: Some(3),
        };
        let mut frames = vec![
            unnamed_frame(addr, &exe, base),
            named.clone(),
            unnamed_frame(0x10, "/nowhere", 0),
        ];
        let modules = vec![Module {
            path: exe.clone(),
            base: Addr(base),
            build_id: id.clone(),
        }];
        assert!(Offline::default().fill_frames(&modules, &mut frames));
        let first = &frames[0];
        assert!(
            first
                .symbol
                .as_deref()
                .is_some_and(|s| s.contains("a_function_named_offline")),
            "{first:?}"
        );
        assert!(
            first
                .file
                .as_deref()
                .is_some_and(|f| f.ends_with("symbols.rs"))
                && first.line.is_some_and(|l| l > 0),
            "{first:?}"
        );
        // A frame with a file, and one of a module the report does not list, stay as they were.
        let rest: Vec<_> = frames
            .iter()
            .skip_while(|f| f.addr.0 == addr)
            .map(|f| (f.symbol.clone(), f.file.clone()))
            .collect();
        assert_eq!(
            rest,
            vec![
                (Some("kept".into()), Some("k.rs".into())),
                (Some("from_the_symbol_table".into()), None)
            ]
        );

        // Another build id: the file on disk is not that module.
        if id.is_some() {
            let other = vec![Module {
                path: exe.clone(),
                base: Addr(base),
                build_id: Some("00".repeat(20)),
            }];
            let mut frames = vec![unnamed_frame(addr, &exe, base)];
            assert!(!Offline::default().fill_frames(&other, &mut frames));
            assert_eq!(frames[0].file, None);
        }
    }
}
