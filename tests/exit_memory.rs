//! The exit report's memory (issue 31, item 2): naming the frames of a library with tens of MiB
//! of debug information adds at most 32 MiB to the process's peak memory, and `pinguard report`
//! still names every frame by function, file and line.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How deep the generated library's call chain is, below `bulk_chain_0`.
const DEPTH: usize = 12;
/// The most the exit report may add to the process's peak memory.
const BOUND_KIB: i64 = 32 << 10;

/// The generated library's source: a call chain whose bottom pins through the emulated CUDA
/// runtime, one function per line (`chain_line`), then large structure types (44 MB of DWARF),
/// each used by a function so that their debug information is kept, in the same compilation
/// unit: a reader that parses the unit of a frame's address reads all of it.
fn bulk_source() -> String {
    let mut s = String::from("#include <stddef.h>\nint cudaHostAlloc(void **p, size_t n, unsigned f);\nextern int bulk_sink;\n");
    for d in 0..DEPTH {
        s.push_str(&format!("__attribute__((noinline)) int bulk_chain_{d}(int n) {{ int r = bulk_chain_{}(n + 1); bulk_sink += r; return r; }}\n", d + 1));
    }
    s.push_str(&format!("__attribute__((noinline)) int bulk_chain_{DEPTH}(int n) {{ void *p = 0; int rc = cudaHostAlloc(&p, 65536, 0); bulk_sink += n; return rc; }}\n"));
    for t in 0..100 {
        s.push_str(&format!("struct bulk{t} {{"));
        for m in 0..20_000 {
            s.push_str(&format!(" int m{t}_{m};"));
        }
        s.push_str(&format!(
            " }};\nint bulk_use{t}(struct bulk{t} *p) {{ return p->m{t}_0; }}\n"
        ));
    }
    s.push_str("int bulk_sink;\n");
    s
}

/// The line of `bulk_chain_d`'s call.
fn chain_line(d: usize) -> usize {
    d + 4
}

/// The library's source (built again only when it changes: compiling it takes a while), the
/// program that calls it, and `peak_rss`.
fn build() -> (PathBuf, PathBuf, PathBuf) {
    let f = fixtures();
    let src = f.dir.join("bulk_debug.c");
    let lib = f.dir.join("libbulk_debug.so");
    let text = bulk_source();
    if std::fs::read_to_string(&src).ok().as_deref() != Some(text.as_str()) || !lib.exists() {
        let _ = std::fs::remove_file(&lib);
        let tmp = f.dir.join("libbulk_debug.so.tmp");
        std::fs::write(&src, &text).unwrap();
        let d = f.dir.to_string_lossy().into_owned();
        cc(&[
            "-g",
            "-O1",
            "-fPIC",
            "-shared",
            "-o",
            &tmp.to_string_lossy(),
            &src.to_string_lossy(),
            "-L",
            &d,
            "-Wl,-rpath,$ORIGIN",
            "-lcudart",
        ]);
        std::fs::rename(&tmp, &lib).unwrap();
    }
    let prog = f.dir.join("deep_debug");
    let d = f.dir.to_string_lossy().into_owned();
    let main = root()
        .join("tests/progs/deep_debug.c")
        .to_string_lossy()
        .into_owned();
    cc(&[
        "-g",
        "-O1",
        "-o",
        &prog.to_string_lossy(),
        &main,
        "-L",
        &d,
        "-Wl,-rpath,$ORIGIN",
        "-lbulk_debug",
        "-lcudart",
    ]);
    let peak_rss = fixture_set("exit_memory").join("peak_rss");
    (src, prog, peak_rss)
}

/// What one run left: exit status, stdout, stderr, its peak resident memory (KiB) and its wall
/// time (µs), from `peak_rss`.
struct Measured {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    max_rss_kib: i64,
    wall_us: i64,
}

/// Runs `prog` under `peak_rss` (with pinguard preloaded when `preload`), reports going to `dir`.
fn measure(peak_rss: &Path, prog: &Path, dir: &Path, preload: bool) -> Measured {
    let f = fixtures();
    let mut cmd = command_in(peak_rss, dir, false);
    if preload {
        cmd.arg("-p").arg(&f.lib);
    }
    let out = run_bounded(cmd.arg(prog), Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = stderr.lines().last().unwrap_or("");
    Measured {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        max_rss_kib: field(last, "peak_rss_kib"),
        wall_us: field(last, "wall_us"),
        stderr,
    }
}

fn cli_output(args: &[&std::ffi::OsStr]) -> String {
    let out = pinguard_cli(args);
    assert!(
        out.status.success(),
        "pinguard {args:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_exit_report_names_a_large_librarys_frames_in_bounded_memory() {
    if aarch64() {
        // qemu-user measures itself, and `peak_rss` cannot exec a guest program.
        eprintln!("SKIPPED: peak memory is not measured under qemu");
        return;
    }
    let (src, prog, peak_rss) = build();
    let dir = fresh_dir("exit-memory");
    let without = measure(&peak_rss, &prog, &dir, false);
    assert!(reports_in(&dir).is_empty());
    let with = measure(&peak_rss, &prog, &dir, true);
    assert_eq!(without.code, Some(0), "{}", without.stderr);
    assert_eq!(with.code, Some(0), "{}", with.stderr);
    assert_eq!(with.stdout, without.stdout);
    let extra = with.max_rss_kib - without.max_rss_kib;
    println!(
        "peak RSS without pinguard {} KiB, with {} KiB: +{extra} KiB; wall time {} ms, {} ms: +{} ms (mostly the exit report)",
        without.max_rss_kib,
        with.max_rss_kib,
        without.wall_us / 1000,
        with.wall_us / 1000,
        (with.wall_us - without.wall_us) / 1000
    );
    assert!(
        extra <= BOUND_KIB,
        "the exit report added {extra} KiB to the peak (bound {BOUND_KIB} KiB)\n{}",
        with.stderr
    );

    // The report itself names the library's functions, and lists the library with its build id.
    let files = reports_in(&dir);
    assert_eq!(files.len(), 1, "{}", with.stderr);
    let rep = read_report(&files[0]);
    let site = rep
        .callsites
        .iter()
        .find(|c| c.live_bytes == 65536)
        .expect("the live callsite");
    let symbols: Vec<&str> = site
        .frames
        .iter()
        .filter_map(|f| f.symbol.as_deref())
        .collect();
    for d in 0..=DEPTH {
        assert!(
            symbols.contains(&format!("bulk_chain_{d}").as_str()),
            "bulk_chain_{d} not among {symbols:?}"
        );
    }
    let modules = &rep.modules;
    assert!(
        modules
            .iter()
            .any(|m| m.path.ends_with("/libbulk_debug.so") && m.build_id.is_some()),
        "{modules:?}"
    );

    // `pinguard report` names every frame by function, file and line, innermost first.
    let text = cli_output(&["report".as_ref(), files[0].as_os_str()]);
    let file = src.to_string_lossy();
    let mut at = 0;
    for d in (0..=DEPTH).rev() {
        let want = format!(" in bulk_chain_{d} {file}:{}\n", chain_line(d));
        let found = text[at..]
            .find(&want)
            .unwrap_or_else(|| panic!("no frame {want:?} after byte {at} in:\n{text}"));
        at += found + want.len();
    }
    assert!(
        text.contains(&format!(
            " in main {}:",
            root().join("tests/progs/deep_debug.c").display()
        )),
        "{text}"
    );
    // `pinguard report --json` is the CLI's own output, not a report file.
    let json: serde_json::Value = serde_json::from_str(&cli_output(&[
        "report".as_ref(),
        "--json".as_ref(),
        files[0].as_os_str(),
    ]))
    .unwrap();
    let frames = json["callsites"][0]["frames"].as_array().unwrap();
    let top = &frames[0];
    assert_eq!(
        (top["symbol"].as_str(), top["line"].as_u64()),
        (
            Some(format!("bulk_chain_{DEPTH}").as_str()),
            Some(chain_line(DEPTH) as u64)
        ),
        "{top}"
    );

    // A file on disk that is not the module the process loaded (another build id) names nothing
    // more than the report has.
    let mut other = rep.clone();
    for m in &mut other.modules {
        if m.path.ends_with("/libbulk_debug.so") {
            m.build_id = Some("00112233445566778899aabbccddeeff00112233".into());
        }
    }
    let moved = dir.join("other.json");
    std::fs::write(&moved, serde_json::to_vec(&other).unwrap()).unwrap();
    let text = cli_output(&["report".as_ref(), moved.as_os_str()]);
    assert!(
        !text.contains(&format!("{file}:")),
        "named from a file that is not the module:\n{text}"
    );
    assert!(
        text.contains(&format!(" in bulk_chain_{DEPTH} (libbulk_debug.so+0x")),
        "{text}"
    );
}
