//! A callsite's name for a line on stderr written from inside the application's call (the `warn`
//! line), made cheaply: no debug information is parsed and nothing is mapped. Parsing a large
//! library's debug information (libtorch is hundreds of MiB) would hold the call up for seconds,
//! and mapping an object file would put new memory in the application's address space in the
//! middle of its run (a hole it has just unmapped may be filled; under `mlockall(MCL_FUTURE)` the
//! whole file would be read in and locked). So native frames get a function name only: from the
//! dynamic symbol tables the loader keeps in memory (`dladdr`), else from the object file's symbol
//! table, read in small pieces onto the stack; else module and offset. Reports name frames fully
//! (`symbolize`), when they are written.

use crate::accounting::callsite::Callsite;
use crate::runtime::sys;
use pinguard_common::elf::{u16_at, u32_at, u64_at};
use std::ffi::{CStr, CString};
use std::os::raw::c_int;

/// A symbol table larger than this (1.4 million symbols) is not read inside the application's
/// call: the function is then named by module and offset.
const SYMTAB_MAX_BYTES: u64 = 32 << 20;

/// A callsite's short name: its innermost Python frame and that frame's caller
/// (`cuda_pin (serve.py:7) <- load_weights (serve.py:12)`) when it has Python frames, so that the
/// paths through one helper read apart (`pinguard report`, which sees them all, adds as many
/// callers as it takes); else its innermost native frame (`function`, `module+0xOFFSET`, or the
/// bare address); `None` for a callsite without frames. Takes Python's frame table, the fork gate
/// and the loader's lock: never under a lock of pinguard's.
pub fn short_label(site: &Callsite) -> Option<String> {
    let mut label: Option<String> = None;
    for &id in site.python().iter().take(2) {
        crate::capture::python::frame(id, |f| {
            let frame = format!("{} ({}:{})", f.function, basename(&f.file), f.line);
            label = Some(match label.take() {
                Some(inner) => format!("{inner} <- {frame}"),
                None => frame,
            });
        });
    }
    label.or_else(|| site.native().first().map(|&addr| native_label(addr)))
}

/// The return address `addr`'s function, else its module and offset, else the address.
fn native_label(addr: usize) -> String {
    // Reading an object file is not to be a cancellation point inside the application's call,
    // and the loaded objects must stay put meanwhile (the loader's lock, under the fork gate).
    let _nc = sys::NoCancel::new();
    let _open = crate::runtime::gate::enter();
    let mut object = None;
    crate::runtime::objects::for_each_object(|o| {
        if object.is_none() && o.contains(addr) {
            object = Some((o.name.clone(), o.base));
        }
    });
    let Some((name, base)) = object else {
        return format!("{addr:#x}");
    };
    // The main program has no name in the loader's list.
    let path = if name.as_bytes().is_empty() {
        CString::new(crate::runtime::kernel::exe()).unwrap_or_default()
    } else {
        name
    };
    let rel = addr.wrapping_sub(base);
    // A return address points after the call; the call itself is one byte earlier (a call that
    // ends its function would otherwise be named after the next one).
    let symbol = dynamic_symbol(addr.wrapping_sub(1)).or_else(|| {
        // A name relative to some earlier working directory (`ctypes.CDLL("lib/x.so")`) may not
        // be the same file now.
        (path.as_bytes().first() == Some(&b'/'))
            .then(|| symtab_symbol(&path, rel.wrapping_sub(1) as u64))
            .flatten()
    });
    match symbol {
        Some(s) => s,
        None => format!("{}+{rel:#x}", basename(&path.to_string_lossy())),
    }
}

/// The function holding `probe`, from the dynamic symbol tables the loader has in memory (no file
/// is read; exported functions only), demangled.
fn dynamic_symbol(probe: usize) -> Option<String> {
    // SAFETY: `Dl_info` is plain data, for `dladdr` to fill.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only compares `probe` with the loaded objects' ranges (it never reads
    // there) and writes `info`; the name it points to stays while its object is loaded, which the
    // fork gate's holder keeps so, and is copied at once.
    let name = unsafe {
        // glibc answers only for a symbol whose range holds the address (a symbol of size 0 only
        // for its own address), so a function that is not exported is not taken for the one
        // before it.
        if libc::dladdr(probe as *const libc::c_void, &mut info) == 0
            || info.dli_sname.is_null()
            || (info.dli_saddr as usize) > probe
        {
            return None;
        }
        CStr::from_ptr(info.dli_sname)
            .to_string_lossy()
            .into_owned()
    };
    Some(demangle(name))
}

const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const ELF_DATA: u8 = if cfg!(target_endian = "little") { 1 } else { 2 };

/// The function holding `vaddr` (an address in the object's own numbering) in the symbol table
/// (`.symtab`) of the ELF file at `path`: a static function of a program, which the loader does
/// not know. Read with `pread` in pieces on the stack: no mapping, no allocation but the name.
fn symtab_symbol(path: &CStr, vaddr: u64) -> Option<String> {
    let fd = sys::open_read(path).ok()?;
    let found = symtab_lookup(fd, vaddr);
    sys::close(fd);
    found.map(demangle)
}

fn symtab_lookup(fd: c_int, vaddr: u64) -> Option<String> {
    let mut eh = [0u8; 64];
    sys::read_exact_at(fd, &mut eh, 0)?;
    // 64-bit, in this machine's byte order: the only objects this process can have loaded.
    if eh[..4] != *b"\x7fELF" || eh[4] != 2 || eh[5] != ELF_DATA {
        return None;
    }
    let (shoff, shentsize, shnum) = (
        u64_at(&eh, 0x28),
        u16_at(&eh, 0x3a) as u64,
        u16_at(&eh, 0x3c) as u64,
    );
    if shentsize < 64 {
        return None;
    }
    let section = |i: u64| -> Option<(u32, u64, u64, u32, u64)> {
        let mut sh = [0u8; 64];
        sys::read_exact_at(fd, &mut sh, shoff.checked_add(i.checked_mul(shentsize)?)?)?;
        Some((
            u32_at(&sh, 4),
            u64_at(&sh, 0x18),
            u64_at(&sh, 0x20),
            u32_at(&sh, 0x28),
            u64_at(&sh, 0x38),
        ))
    };
    let (_, off, size, link, entsize) =
        (0..shnum).filter_map(section).find(|s| s.0 == SHT_SYMTAB)?;
    let (strtype, stroff, strsize, _, _) = section(link as u64)?;
    if entsize != 24 || size > SYMTAB_MAX_BYTES || strtype != SHT_STRTAB {
        return None;
    }
    let mut buf = [0u8; 24 * 170];
    let mut at = 0;
    while at + 24 <= size {
        let n = ((size - at).min(buf.len() as u64) / 24 * 24) as usize;
        sys::read_exact_at(fd, &mut buf[..n], off + at)?;
        for sym in buf[..n].chunks_exact(24) {
            let (kind, shndx, value, len) = (
                sym[4] & 0xf,
                u16_at(sym, 6),
                u64_at(sym, 8),
                u64_at(sym, 16),
            );
            if (kind == STT_FUNC || kind == STT_GNU_IFUNC)
                && shndx != 0
                && value <= vaddr
                && vaddr - value < len
            {
                return name_at(fd, stroff, strsize, u32_at(sym, 0) as u64);
            }
        }
        at += n as u64;
    }
    None
}

/// The NUL-terminated name at `at` in the string table at `off`, `len` bytes long.
fn name_at(fd: c_int, off: u64, len: u64, at: u64) -> Option<String> {
    let mut buf = [0u8; 2048];
    let n = len.checked_sub(at)?.min(buf.len() as u64) as usize;
    sys::read_exact_at(fd, &mut buf[..n], off.checked_add(at)?)?;
    let end = buf[..n].iter().position(|&b| b == 0)?;
    (end > 0).then(|| String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn demangle(name: String) -> String {
    addr2line::demangle_auto(name.into(), None).into_owned()
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Not exported, so only the program's symbol table names it.
    #[inline(never)]
    fn a_function_of_this_program(x: usize) -> usize {
        std::hint::black_box(x) * 3
    }

    #[test]
    fn exported_functions_are_named_from_the_loaders_tables() {
        let f = libc::getpid as *const () as usize;
        let name = dynamic_symbol(f);
        assert!(
            name.as_deref().is_some_and(|n| n.contains("getpid")),
            "{name:?}"
        );
        assert!(native_label(f + 1).contains("getpid"));
        // An address in no object (the heap) is itself; so is 0.
        let v = [0u8; 64];
        assert_eq!(dynamic_symbol(v.as_ptr() as usize), None);
        assert_eq!(
            native_label(v.as_ptr() as usize),
            format!("{:#x}", v.as_ptr() as usize)
        );
    }

    #[test]
    fn a_programs_own_functions_are_named_from_its_symbol_table() {
        let f = a_function_of_this_program as *const () as usize;
        assert_eq!(a_function_of_this_program(2), 6);
        assert_eq!(dynamic_symbol(f), None, "not exported");
        let label = native_label(f + 1);
        assert!(label.contains("a_function_of_this_program"), "{label}");
    }

    #[test]
    fn a_file_that_is_not_elf_names_nothing() {
        let path = CString::new(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
        assert_eq!(symtab_symbol(&path, 0x1000), None);
        assert_eq!(symtab_symbol(c"/nonexistent/file", 0x1000), None);
    }
}
