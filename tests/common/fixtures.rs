//! The C fixtures, built from the table `tests/fixtures.txt` (which `scripts/build-fixtures.sh`
//! reads too) into one folder named by the content of the table and of every file it names: both
//! test binaries, and every later run while nothing changed, find them built. Each set is built
//! once, under a lock that test threads and other processes (the CLI's tests, a second `cargo
//! test`) share; a stamp written after its last fixture says it is complete.

use super::{cc_in, root};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// The table's fixtures, in its order: (sets, output, compiler arguments).
type Row = (Vec<String>, String, Vec<String>);

fn table() -> &'static [Row] {
    static T: OnceLock<Vec<Row>> = OnceLock::new();
    T.get_or_init(|| {
        let text = std::fs::read_to_string(root().join("tests/fixtures.txt")).unwrap();
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                let mut words = l.split_whitespace().map(String::from);
                let sets = words.next().unwrap();
                let out = words.next().unwrap_or_else(|| panic!("no output in {l:?}"));
                let sets = sets.split(',').map(String::from).collect();
                (sets, out, words.collect())
            })
            .collect()
    })
}

/// The repository file an argument names (`@tests/emul/cudart.c`, `-I@include`), if any.
fn named_file(arg: &str) -> Option<PathBuf> {
    let (_, rest) = arg.split_once('@')?;
    Some(root().join(rest))
}

/// FNV-1a: a key that stays the same from one toolchain to the next.
fn fnv(h: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *h = (*h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
}

/// What the fixtures are built from: the table, the compiler's name, every file the table names
/// and every header beside the sources (which they may include).
fn content_key(compiler: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325;
    fnv(&mut h, compiler.as_bytes());
    fnv(
        &mut h,
        &std::fs::read(root().join("tests/fixtures.txt")).unwrap(),
    );
    let mut files: Vec<PathBuf> = table()
        .iter()
        .flat_map(|(_, _, args)| args.iter().filter_map(|a| named_file(a)))
        .filter(|p| p.is_file())
        .collect();
    for dir in ["tests/emul", "tests/progs", "include"] {
        for e in std::fs::read_dir(root().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "h") {
                files.push(p);
            }
        }
    }
    files.sort();
    files.dedup();
    for f in files {
        fnv(&mut h, f.to_string_lossy().as_bytes());
        fnv(&mut h, &std::fs::read(&f).unwrap());
    }
    h
}

/// The folder of the fixtures as the table and its files now are, under this test binary's
/// `target/<profile>/fixtures/` (created; its sets are built by `build_set`).
pub fn fixture_dir(compiler: &str, tag: &str) -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let profile = exe.parent().unwrap().parent().unwrap();
        let dir = profile
            .join("fixtures")
            .join(format!("{tag}{:016x}", content_key(compiler)));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

/// Holds the folder's lock file locked (`flock`) until dropped: one builder at a time, whichever
/// process it is in.
struct Lock(std::fs::File);

impl Lock {
    fn take(dir: &Path) -> Lock {
        use std::os::fd::AsRawFd;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(".lock"))
            .unwrap();
        // SAFETY: no pointers; the descriptor is the file's, open while `Lock` lives.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
        Lock(f)
    }
}

/// Builds the set `set` of the table into `dir`, unless a stamp says it was (by this process or
/// another, from the same content).
pub fn build_set(dir: &Path, set: &str) {
    static BUILT: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashSet::new);
    if built.contains(set) {
        return;
    }
    let stamp = dir.join(format!(".built-{set}"));
    let _lock = Lock::take(dir);
    if !stamp.exists() {
        compile_set(dir, set);
        let mut s = std::fs::File::create(&stamp).unwrap();
        s.write_all(b"built\n").unwrap();
    }
    built.insert(set.to_string());
}

/// Compiles each fixture of `set`, in the table's order, to a temporary name renamed into place:
/// a program another test is running is never overwritten.
fn compile_set(dir: &Path, set: &str) {
    let rows: Vec<&Row> = table()
        .iter()
        .filter(|(sets, _, _)| sets.iter().any(|s| s == set))
        .collect();
    assert!(!rows.is_empty(), "no set {set:?} in tests/fixtures.txt");
    let root = format!("{}/", root().display());
    for (_, out, args) in rows {
        let target = dir.join(out);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let tmp = format!("{out}.tmp-{}", std::process::id());
        let mut a = vec!["-o".to_string(), tmp.clone()];
        a.extend(args.iter().map(|x| x.replace('@', &root)));
        cc_in(dir, &a.iter().map(String::as_str).collect::<Vec<_>>());
        std::fs::rename(dir.join(&tmp), &target).unwrap();
    }
}
