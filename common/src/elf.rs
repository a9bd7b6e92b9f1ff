//! What a report needs from an ELF file on disk, read with `pread` in bounded pieces: its section
//! table, its build id, how large its debug information is, and the functions holding a set of
//! addresses from its symbol tables. Nothing is mapped and no section is read whole, so naming
//! frames of a library with hundreds of MiB of symbols and debug information costs a few hundred
//! KiB of memory, whatever the file holds (the library names a live process's frames this way).

use std::fs::File;
use std::os::unix::fs::FileExt;

const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_NOTE: u32 = 7;
const SHT_NOBITS: u32 = 8;
const SHT_DYNAMIC: u32 = 6;
const SHT_DYNSYM: u32 = 11;
const DT_NEEDED: u64 = 1;
const SHF_COMPRESSED: u64 = 0x800;
const STT_FUNC: u8 = 2;
const STT_GNU_IFUNC: u8 = 10;
const ELF_DATA: u8 = if cfg!(target_endian = "little") { 1 } else { 2 };
/// Symbols read per `pread` (24 bytes each): 64 KiB.
const SYMS_PER_READ: usize = 2730;
/// A section table or section-name table larger than this is not an object this process loaded.
const TABLE_MAX: u64 = 4 << 20;
/// A symbol's name is read up to this many bytes (C++ names run to a few KiB).
const NAME_MAX: u64 = 16 << 10;

/// One entry of the section table.
#[derive(Clone, Debug)]
pub struct Section {
    pub name: String,
    pub kind: u32,
    pub flags: u64,
    pub offset: u64,
    pub size: u64,
    pub link: u32,
    pub entsize: u64,
}

/// A 64-bit ELF file in this machine's byte order (the only kind this process can have loaded),
/// opened for reading, with its section table.
pub struct Elf {
    file: File,
    pub sections: Vec<Section>,
}

impl Elf {
    /// Links are followed (objects and their `.build-id` debug files are links by design), but
    /// only a regular file is opened, never waited on (`crate::untrusted`).
    pub fn open(path: &str) -> Option<Elf> {
        let (file, _) =
            crate::untrusted::open(path.as_ref(), crate::untrusted::Links::Follow).ok()?;
        let mut eh = [0u8; 64];
        file.read_exact_at(&mut eh, 0).ok()?;
        if eh[..4] != *b"\x7fELF" || eh[4] != 2 || eh[5] != ELF_DATA {
            return None;
        }
        let (shoff, shentsize, shstrndx) = (
            u64_at(&eh, 0x28),
            u16_at(&eh, 0x3a) as u64,
            u16_at(&eh, 0x3e) as u64,
        );
        let mut shnum = u16_at(&eh, 0x3c) as u64;
        if shentsize < 64 || shoff == 0 {
            return Some(Elf {
                file,
                sections: Vec::new(),
            });
        }
        if shnum == 0 {
            // More than 65,279 sections: the count is section 0's size.
            let mut sh = [0u8; 64];
            file.read_exact_at(&mut sh, shoff).ok()?;
            shnum = u64_at(&sh, 0x20);
        }
        let table = read_at(
            &file,
            shoff,
            shnum.checked_mul(shentsize).filter(|&n| n <= TABLE_MAX)?,
        )?;
        let raw: Vec<&[u8]> = table.chunks_exact(shentsize as usize).collect();
        let names = raw
            .get(shstrndx as usize)
            .and_then(|sh| read_at(&file, u64_at(sh, 0x18), u64_at(sh, 0x20).min(TABLE_MAX)));
        let sections = raw
            .iter()
            .map(|sh| Section {
                name: names
                    .as_deref()
                    .and_then(|n| c_str(n, u32_at(sh, 0) as usize))
                    .unwrap_or_default(),
                kind: u32_at(sh, 4),
                flags: u64_at(sh, 8),
                offset: u64_at(sh, 0x18),
                size: u64_at(sh, 0x20),
                link: u32_at(sh, 0x28),
                entsize: u64_at(sh, 0x38),
            })
            .collect();
        Some(Elf { file, sections })
    }

    /// The GNU build id, in lowercase hex, as the loader's note has it.
    pub fn build_id(&self) -> Option<String> {
        self.sections
            .iter()
            .filter(|s| s.kind == SHT_NOTE && s.size <= 1 << 16)
            .find_map(|s| {
                let notes = read_at(&self.file, s.offset, s.size)?;
                let mut p = 0usize;
                while p + 12 <= notes.len() {
                    let (namesz, descsz, ty) = (
                        u32_at(&notes, p) as usize,
                        u32_at(&notes, p + 4) as usize,
                        u32_at(&notes, p + 8),
                    );
                    let desc = p + 12 + ((namesz + 3) & !3);
                    let next = desc.checked_add((descsz + 3) & !3)?;
                    if next > notes.len() {
                        return None;
                    }
                    if ty == 3 && namesz == 4 && notes[p + 12..p + 16] == *b"GNU\0" {
                        return Some(
                            notes[desc..desc + descsz]
                                .iter()
                                .map(|b| format!("{b:02x}"))
                                .collect(),
                        );
                    }
                    p = next;
                }
                None
            })
    }

    /// The libraries the object names as needed (`DT_NEEDED`), as written there (sonames such as
    /// `libasan.so.8`), in order; empty for a statically linked program. Read from the `.dynamic`
    /// section and the string table it links to, each at most `TABLE_MAX` bytes.
    pub fn needed(&self) -> Vec<String> {
        let Some(dynamic) = self.sections.iter().find(|s| s.kind == SHT_DYNAMIC) else {
            return Vec::new();
        };
        let strtab = self
            .sections
            .get(dynamic.link as usize)
            .filter(|s| s.kind == SHT_STRTAB);
        let (Some(entries), Some(names)) = (
            read_at(&self.file, dynamic.offset, dynamic.size.min(TABLE_MAX)),
            strtab.and_then(|s| read_at(&self.file, s.offset, s.size.min(TABLE_MAX))),
        ) else {
            return Vec::new();
        };
        entries
            .chunks_exact(16)
            .map(|e| (u64_at(e, 0), u64_at(e, 8)))
            .take_while(|&(tag, _)| tag != 0)
            .filter(|&(tag, _)| tag == DT_NEEDED)
            .filter_map(|(_, at)| c_str(&names, usize::try_from(at).ok()?))
            .collect()
    }

    /// The bytes a DWARF reader would have to look through: the debug sections (compressed ones
    /// at their uncompressed size) and the symbol and string tables.
    pub fn debug_bytes(&self) -> u64 {
        self.sections
            .iter()
            .filter(|s| is_debug(&s.name) || matches!(s.kind, SHT_SYMTAB | SHT_DYNSYM | SHT_STRTAB))
            .fold(0u64, |t, s| t.saturating_add(self.uncompressed_size(s)))
    }

    /// The size of the debug section `name` (`.debug_line`), uncompressed; 0 when there is none.
    pub fn debug_section_bytes(&self, name: &str) -> u64 {
        let z = name.replacen(".debug_", ".zdebug_", 1);
        self.sections
            .iter()
            .filter(|s| s.name == name || s.name == z)
            .fold(0u64, |t, s| t.saturating_add(self.uncompressed_size(s)))
    }

    /// A section's size once uncompressed (an unreadable compression header: as large as can be).
    fn uncompressed_size(&self, s: &Section) -> u64 {
        if s.kind == SHT_NOBITS {
            0
        } else if s.name.starts_with(".zdebug_") {
            // "ZLIB", then the uncompressed size, big-endian.
            let mut h = [0u8; 12];
            match self.file.read_exact_at(&mut h, s.offset) {
                Ok(()) if h[..4] == *b"ZLIB" => {
                    u64::from_be_bytes(h[4..].try_into().unwrap_or_default())
                }
                _ => u64::MAX,
            }
        } else if s.flags & SHF_COMPRESSED != 0 {
            // Elf64_Chdr: type, reserved, then the uncompressed size.
            let mut h = [0u8; 24];
            self.file
                .read_exact_at(&mut h, s.offset)
                .map_or(u64::MAX, |_| u64_at(&h, 8))
        } else {
            s.size
        }
    }

    /// For each of `addrs` (addresses in the object's own numbering, sorted, no duplicates), the
    /// name of the function whose symbol covers it: from `.symtab`, else `.dynsym`. One pass
    /// over each table, 64 KiB at a time; names read one at a time.
    pub fn function_names(&self, addrs: &[u64]) -> Vec<Option<String>> {
        // (symbol table index, string table offset of the name) per address.
        let mut found: Vec<Option<(usize, u64)>> = vec![None; addrs.len()];
        let tables: Vec<usize> = (0..self.sections.len())
            .filter(|&i| self.sections[i].kind == SHT_SYMTAB)
            .chain((0..self.sections.len()).filter(|&i| self.sections[i].kind == SHT_DYNSYM))
            .collect();
        let mut buf = vec![0u8; SYMS_PER_READ * 24];
        for t in tables {
            if found.iter().all(Option::is_some) {
                break;
            }
            let s = &self.sections[t];
            if s.entsize != 24 {
                continue;
            }
            let mut at = 0u64;
            while at + 24 <= s.size {
                let n = ((s.size - at).min(buf.len() as u64) / 24 * 24) as usize;
                if self
                    .file
                    .read_exact_at(&mut buf[..n], s.offset + at)
                    .is_err()
                {
                    break;
                }
                for sym in buf[..n].chunks_exact(24) {
                    let (kind, shndx, value, len) = (
                        sym[4] & 0xf,
                        u16_at(sym, 6),
                        u64_at(sym, 8),
                        u64_at(sym, 16),
                    );
                    if !(kind == STT_FUNC || kind == STT_GNU_IFUNC) || shndx == 0 || len == 0 {
                        continue;
                    }
                    let end = value.saturating_add(len);
                    let covered =
                        addrs.partition_point(|&a| a < value)..addrs.partition_point(|&a| a < end);
                    for f in &mut found[covered] {
                        f.get_or_insert((t, u32_at(sym, 0) as u64));
                    }
                }
                at += n as u64;
            }
        }
        found
            .into_iter()
            .map(|f| f.and_then(|(t, name)| self.name(self.sections[t].link as usize, name)))
            .collect()
    }

    /// The NUL-terminated name at `at` in the string table section `strtab`.
    fn name(&self, strtab: usize, at: u64) -> Option<String> {
        let s = self.sections.get(strtab).filter(|s| s.kind == SHT_STRTAB)?;
        let mut name = Vec::new();
        let mut piece = [0u8; 256];
        while (name.len() as u64) < NAME_MAX {
            let off = at + name.len() as u64;
            let n = s.size.checked_sub(off)?.min(piece.len() as u64) as usize;
            if n == 0 {
                return None;
            }
            self.file
                .read_exact_at(&mut piece[..n], s.offset + off)
                .ok()?;
            match piece[..n].iter().position(|&b| b == 0) {
                Some(end) => {
                    name.extend_from_slice(&piece[..end]);
                    return (!name.is_empty()).then(|| String::from_utf8_lossy(&name).into_owned());
                }
                None => name.extend_from_slice(&piece[..n]),
            }
        }
        None
    }
}

fn is_debug(name: &str) -> bool {
    name.starts_with(".debug_") || name.starts_with(".zdebug_")
}

fn read_at(file: &File, offset: u64, len: u64) -> Option<Vec<u8>> {
    let mut v = vec![0u8; usize::try_from(len).ok()?];
    file.read_exact_at(&mut v, offset).ok()?;
    Some(v)
}

fn c_str(table: &[u8], at: usize) -> Option<String> {
    let rest = table.get(at..)?;
    let end = rest.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&rest[..end]).into_owned())
}

/// Native-endian fields of an ELF image's bytes (also read by the library's `warn`-line names,
/// which keep their own reader: raw system calls, no cancellation point).
pub fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_ne_bytes([b[i], b[i + 1]])
}

pub fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes(b[i..i + 4].try_into().unwrap_or_default())
}

pub fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(b[i..i + 8].try_into().unwrap_or_default())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn this_program() -> String {
        std::fs::read_link("/proc/self/exe")
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    #[inline(never)]
    fn a_function_of_this_test(x: u64) -> u64 {
        std::hint::black_box(x) + 1
    }

    /// The load bias of this program, from the kernel's map: where its first mapping starts
    /// less that mapping's file offset (a position-independent executable's first segment is at
    /// offset 0 and address 0).
    pub(crate) fn bias() -> u64 {
        let exe = this_program();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps.lines().find(|l| l.ends_with(&exe)).unwrap();
        let lo = u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap();
        let off = u64::from_str_radix(line.split_whitespace().nth(2).unwrap(), 16).unwrap();
        lo - off
    }

    #[test]
    fn needed_lists_the_libraries_this_program_links() {
        let needed = Elf::open(&this_program()).unwrap().needed();
        assert!(
            needed.iter().any(|n| n.starts_with("libc.so")),
            "{needed:?}"
        );
        // The loader's own answer for this process names each of them.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        for n in &needed {
            assert!(
                maps.lines().any(|l| l.ends_with(&format!("/{n}"))),
                "{n} not mapped"
            );
        }
    }

    #[test]
    fn names_functions_from_the_symbol_table_in_one_pass() {
        assert_eq!(a_function_of_this_test(1), 2);
        let elf = Elf::open(&this_program()).unwrap();
        let f = a_function_of_this_test as *const () as u64 - bias();
        let g = names_functions_from_the_symbol_table_in_one_pass as *const () as u64 - bias();
        let mut addrs = vec![f + 1, g + 1, 1];
        addrs.sort();
        let names = elf.function_names(&addrs);
        let of = |a: u64| names[addrs.iter().position(|&x| x == a).unwrap()].clone();
        assert!(
            of(f + 1).is_some_and(|n| n.contains("a_function_of_this_test")),
            "{:?}",
            of(f + 1)
        );
        assert!(
            of(g + 1).is_some_and(|n| n.contains("names_functions_from_the_symbol_table")),
            "{:?}",
            of(g + 1)
        );
        assert_eq!(of(1), None, "no function there");
        assert!(elf.debug_bytes() > 0);
    }

    #[test]
    fn the_build_id_is_the_loaders() {
        // The test binary's id as the kernel's note shows it.
        let elf = Elf::open(&this_program()).unwrap();
        if let Some(id) = elf.build_id() {
            assert!(
                id.len() >= 16
                    && id
                        .chars()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{id}"
            );
        }
        assert!(Elf::open(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).is_none());
        assert!(Elf::open("/nonexistent").is_none());
    }
}
