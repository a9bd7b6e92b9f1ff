//! Return addresses to function, file and line, from an object file on disk: shared by the
//! library (its reports) and the readers of a dead process's state, which name its frames
//! afterwards from the module list the state keeps.

use crate::{Addr, Frame};

/// The debug information for a loaded object: the separate file distributions ship under the
/// build id (libc6-dbg and the like) when there is one, else the object file itself.
pub fn open(path: &str, build_id: Option<&str>) -> Option<addr2line::Loader> {
    if !path.starts_with('/') {
        return None; // the vDSO, or a name the loader did not resolve to a file
    }
    let separate = build_id.filter(|id| id.len() > 2).map(|id| format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]));
    separate
        .filter(|p| std::path::Path::new(p).is_file())
        .and_then(|p| addr2line::Loader::new(p).ok())
        .or_else(|| addr2line::Loader::new(path).ok())
}

/// The frames for the return address `addr` in the object loaded at `base` (more than one where
/// functions were inlined, innermost first); at least one, named as far as `loader` allows.
pub fn frames(loader: Option<&addr2line::Loader>, addr: usize, base: usize, module: Option<String>) -> Vec<Frame> {
    // A base above the address (a corrupt module list): the frame stays unnamed.
    let Some(rel) = addr.checked_sub(base) else {
        return vec![Frame { addr: Addr(addr as u64), module, offset: None, symbol: None, file: None, line: None }];
    };
    let offset = Some(Addr(rel as u64));
    // A return address points after the call; the call itself is one byte earlier.
    let probe = rel.saturating_sub(1) as u64;
    let mut frames = Vec::new();
    if let Some(loader) = loader {
        if let Ok(mut it) = loader.find_frames(probe) {
            while let Ok(Some(f)) = it.next() {
                let symbol = f.function.as_ref().and_then(|n| n.demangle().ok()).map(|s| s.into_owned());
                let (file, line) = f.location.as_ref().map_or((None, None), |l| (l.file.map(str::to_string), l.line));
                frames.push(Frame { addr: Addr(addr as u64), module: module.clone(), offset, symbol, file, line });
            }
        }
        // No debug information for it: the symbol table still names the function.
        if frames.iter().all(|f| f.symbol.is_none()) {
            if let Some(name) = loader.find_symbol(probe) {
                let symbol = Some(addr2line::demangle_auto(name.into(), None).into_owned());
                match frames.first_mut() {
                    Some(f) => f.symbol = symbol,
                    None => frames.push(Frame { addr: Addr(addr as u64), module: module.clone(), offset, symbol, file: None, line: None }),
                }
            }
        }
    }
    if frames.is_empty() {
        frames.push(Frame { addr: Addr(addr as u64), module, offset, symbol: None, file: None, line: None });
    }
    frames
}
