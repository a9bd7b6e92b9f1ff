//! The host reserve (`PINGUARD_HOST_RESERVE`): pins never take the host's available memory below
//! a floor. The host is never touched: each program runs in a private mount namespace with a
//! stand-in file bind-mounted over `/proc/meminfo`, whose `MemAvailable` the emulated runtime
//! lowers as it pins and raises as it releases, from its own count (`EMU_MEMINFO`). That needs
//! root and `unshare -m`; without them every test here says NOT RUN and passes.

use crate::common;
use common::*;
use pinguard_common::{Event, EventKind, Limit};
use std::path::PathBuf;
use std::process::Command;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
/// The stand-in host: 1 GiB of memory, all of it available at the start.
const BASE_KB: u64 = 1024 * 1024;
const BASE: u64 = BASE_KB * KIB;

/// Whether this machine lets the tests bind a file over `/proc/meminfo` in a private mount
/// namespace (root, `unshare -m`); says NOT RUN when it does not.
fn can_fake_meminfo() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *OK.get_or_init(|| {
        // SAFETY: geteuid has no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return false;
        }
        let dir = fresh_dir("host-probe");
        let f = dir.join("meminfo");
        std::fs::write(&f, "probe\n").unwrap();
        Command::new("unshare")
            .args([
                "-m",
                "--",
                "sh",
                "-c",
                r#"mount --bind "$0" /proc/meminfo && cat /proc/meminfo"#,
            ])
            .arg(&f)
            .output()
            .is_ok_and(|o| o.status.success() && o.stdout == b"probe\n")
    });
    if !ok {
        eprintln!("NOT RUN: needs root and unshare -m");
    }
    ok
}

/// The stand-in's text, as the emulated runtime writes it (fixed-width lines).
fn meminfo_text(total_kb: u64, avail_kb: u64) -> String {
    format!("MemTotal:       {total_kb:>12} kB\nMemFree:        {avail_kb:>12} kB\nMemAvailable:   {avail_kb:>12} kB\n")
}

/// A stand-in host in a fresh directory: `meminfo` (what the programs read as `/proc/meminfo`)
/// and `meminfo.count` (the runtimes' pinned bytes now and at most, written by them).
struct Host {
    dir: PathBuf,
    meminfo: PathBuf,
    base_kb: u64,
}

impl Host {
    fn new(tag: &str) -> Host {
        Host::with_base(tag, BASE_KB)
    }

    /// A host of `base_kb` KiB, all available at the start.
    fn with_base(tag: &str, base_kb: u64) -> Host {
        let h = Host::with_text(tag, &meminfo_text(base_kb, base_kb));
        Host { base_kb, ..h }
    }

    /// A host whose `/proc/meminfo` is `text`, which the runtime leaves alone.
    fn with_text(tag: &str, text: &str) -> Host {
        let dir = fresh_dir(tag);
        let meminfo = dir.join("meminfo");
        std::fs::write(&meminfo, text).unwrap();
        Host {
            dir,
            meminfo,
            base_kb: BASE_KB,
        }
    }

    /// The most the runtimes ever held pinned at once, by their own count.
    fn max_pinned(&self) -> u64 {
        let b = std::fs::read(self.dir.join("meminfo.count")).unwrap();
        i64::from_ne_bytes(b[8..16].try_into().unwrap()) as u64
    }

    fn pinned_now(&self) -> u64 {
        let b = std::fs::read(self.dir.join("meminfo.count")).unwrap();
        i64::from_ne_bytes(b[0..8].try_into().unwrap()) as u64
    }

    /// `prog` (a fixture) with the library preloaded, in a mount namespace of its own where this
    /// host's stand-in is `/proc/meminfo`; reports go to this host's directory. The runtime keeps
    /// the stand-in up to date unless `frozen`.
    fn command(&self, prog: &str, args: &[&str], env: &[(&str, &str)], frozen: bool) -> Command {
        let f = fixtures();
        let path = f.dir.join(prog);
        // Only the program gets the library: not unshare, sh or mount.
        let inner = if aarch64() {
            program(&path, Some(f.lib.as_os_str()))
        } else {
            let mut c = Command::new("env");
            let mut preload = std::ffi::OsString::from("LD_PRELOAD=");
            preload.push(&f.lib);
            c.arg(preload).arg(&path);
            c
        };
        let mut cmd = Command::new("unshare");
        cmd.args([
            "-m",
            "--",
            "sh",
            "-c",
            r#"mount --bind "$0" /proc/meminfo && exec "$@""#,
        ])
        .arg(&self.meminfo);
        cmd.arg(inner.get_program())
            .args(inner.get_args())
            .args(args);
        cmd.current_dir(&self.dir);
        clear_pinguard_env(&mut cmd);
        cmd.env_remove("LD_PRELOAD");
        cmd.env("PINGUARD_REPORT", self.dir.join("report.%p.json"));
        if !frozen {
            cmd.env("EMU_MEMINFO", &self.meminfo)
                .env("EMU_MEMINFO_BASE_KB", self.base_kb.to_string());
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    fn run(&self, prog: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
        let out = run_bounded(
            &mut self.command(prog, args, env, false),
            std::time::Duration::from_secs(60),
        );
        Run::from_output(out, self.dir.clone())
    }

    fn run_frozen(&self, prog: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
        let out = run_bounded(
            &mut self.command(prog, args, env, true),
            std::time::Duration::from_secs(60),
        );
        Run::from_output(out, self.dir.clone())
    }
}

fn reserve_leaving(headroom: u64) -> String {
    (BASE - headroom).to_string()
}

fn events_of(rep: &Report) -> &Vec<Event> {
    &rep.events
}

#[test]
fn threads_racing_to_the_floor_stop_within_one_call_of_it() {
    if !can_fake_meminfo() {
        return;
    }
    let h = Host::new("host-race");
    let size = 64 * KIB;
    let headroom = 4 * MIB;
    let reserve = BASE - headroom;
    // Eight threads, each call reading a driver file inside the runtime (EMU_DRIVER_IO): many
    // calls in flight at every reading.
    let env = [
        ("PINGUARD_HOST_RESERVE", reserve.to_string()),
        ("PINGUARD_DEPTH", "4".into()),
        ("EMU_DRIVER_IO", "1".into()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = h.run("host_fill", &["8", &size.to_string(), "1000", "0"], &env);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    let s = r.stats();
    let max = h.max_pinned();
    let lowest = BASE - max;
    assert!(lowest + size >= reserve, "the runtime held {max} bytes at once: the host fell to {lowest}, more than one call below the reserve of {reserve}");
    // Tighter than the contract: one process that releases nothing while it fills stops exactly
    // at the floor, because a reading's cap counts only the calls that had landed (a cap from
    // the bytes reserved, in flight included, overshot by up to five calls here).
    assert!(
        max <= headroom,
        "{max} bytes pinned at once, past the {headroom} bytes of headroom"
    );
    assert!(max + 8 * size > headroom, "the threads stopped far above the floor ({max} of {headroom} bytes pinned): the test proves nothing");
    assert_eq!(s["refused"], 8, "each thread ends with one refusal: {s}");
    assert_eq!(s["rc"], 2, "the runtime's own out-of-memory code");
    assert_eq!(h.pinned_now(), 0);
    let rep = r.typed_report();
    assert_eq!(rep.totals.host_reserve_count, 8);
    assert_eq!(rep.totals.denied_count, 8);
    assert_eq!(rep.totals.alloc_count, s["pinned"]);
    assert!(
        events_of(&rep)
            .iter()
            .all(|e| e.reason == Some(Limit::HostReserve) && e.kind == EventKind::Denied),
        "{:?}",
        rep.events
    );
}

#[test]
fn a_refusal_lifts_when_memory_is_released() {
    if !can_fake_meminfo() {
        return;
    }
    let h = Host::new("host-lift");
    let reserve = reserve_leaving(MIB);
    let ops = [
        "cuda_alloc:524288",
        "cuda_alloc:524288",
        "cuda_alloc:524288",
        "cuda_free:0",
        "cuda_alloc:524288",
        "cuda_alloc:4096",
    ];
    let r = h.run("scenario", &ops, &[("PINGUARD_HOST_RESERVE", &reserve)]);
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.rcs(), vec![0, 0, 2, 0, 0, 2], "{}", r.stdout);
    assert_eq!(h.max_pinned(), MIB);
    let rep = r.typed_report();
    assert_eq!(rep.totals.host_reserve_count, 2);
    assert_eq!(rep.totals.denied_count, 2);
}

#[test]
fn each_policy_answers_a_call_over_the_reserve_as_over_a_budget() {
    if !can_fake_meminfo() {
        return;
    }
    let reserve = reserve_leaving(512 * KIB);
    // error: every family gets its own out-of-memory answer, and the runtime is never called.
    let h = Host::new("host-error");
    let ops = [
        "cuda_alloc:524288",
        "cuda_alloc:4096",
        "acl_malloc:4096",
        "mlock:0:1",
    ];
    let r = h.run("scenario", &ops, &[("PINGUARD_HOST_RESERVE", &reserve)]);
    assert_eq!(
        r.rcs(),
        vec![0, 2, 207001, -1],
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    let line = r
        .stdout
        .lines()
        .find(|l| l.starts_with("mlock:0:1 "))
        .unwrap();
    assert_eq!(field(line, "errno"), libc::ENOMEM as i64);
    let s = r.stats();
    assert_eq!(
        (
            s["cuda"]["alloc_calls"].as_i64(),
            s["cuda"]["failed_calls"].as_i64(),
            s["acl"]["alloc_calls"].as_i64()
        ),
        (Some(1), Some(0), Some(0)),
        "{s}"
    );
    assert_eq!(
        s["vmlck"], 524288,
        "the runtime's own pages, and not the refused mlock's"
    );
    assert_eq!(r.typed_report().totals.host_reserve_count, 3);

    // downgrade: pageable memory, which the runtime never sees and the host reserve does not count.
    let h = Host::new("host-downgrade");
    let r = h.run(
        "scenario",
        &["cuda_alloc:524288", "cuda_alloc:65536", "cuda_free:1"],
        &[
            ("PINGUARD_HOST_RESERVE", &reserve),
            ("PINGUARD_POLICY", "downgrade"),
        ],
    );
    assert_eq!(r.rcs(), vec![0, 0, 0], "{}\n{}", r.stdout, r.stderr);
    let s = r.stats();
    assert_eq!(
        s["cuda"]["alloc_calls"], 1,
        "the downgraded call is not the runtime's: {s}"
    );
    assert_eq!(h.max_pinned(), 512 * KIB);
    let rep = r.typed_report();
    assert_eq!(
        (rep.totals.downgraded_count, rep.totals.host_reserve_count),
        (1, 1)
    );
    let e = &events_of(&rep)[0];
    assert_eq!(
        (e.kind, e.reason),
        (EventKind::Downgraded, Some(Limit::HostReserve))
    );

    // warn: pinned anyway, counted, and one line that names the host reserve (a host of
    // 100.5 MiB, for round figures).
    let h = Host::with_base("host-warn", 100 * 1024 + 512);
    let r = h.run(
        "scenario",
        &["cuda_alloc:524288", "cuda_alloc:65536", "cuda_alloc:65536"],
        &[
            ("PINGUARD_HOST_RESERVE", "100M"),
            ("PINGUARD_POLICY", "warn"),
        ],
    );
    assert_eq!(r.rcs(), vec![0, 0, 0], "{}\n{}", r.stdout, r.stderr);
    assert_eq!(r.stats()["cuda"]["alloc_calls"], 3);
    assert_eq!(h.max_pinned(), 640 * KIB);
    let rep = r.typed_report();
    assert_eq!(
        (rep.totals.over_budget_count, rep.totals.host_reserve_count),
        (2, 2)
    );
    let warned: Vec<&str> = pinguard_lines(&r.stderr)
        .into_iter()
        .filter(|l| l.contains("warning:"))
        .collect();
    assert_eq!(warned.len(), 1, "once per callsite: {}", r.stderr);
    assert!(
        warned[0].contains("cudaHostAlloc of 64.0 KiB would leave the host 99.9 MiB available, below the reserve of 100 MiB at main; allowed (policy warn"),
        "{}",
        warned[0]
    );
}

#[test]
fn two_processes_of_a_group_share_the_headroom() {
    if !can_fake_meminfo() {
        return;
    }
    let h = Host::new("host-group");
    let group = format!("test-host-{}", std::process::id());
    let ledger = pinguard_common::group::path(&group);
    let _ = std::fs::remove_file(&ledger);
    let size = 64 * KIB;
    let headroom = 4 * MIB;
    let reserve = (BASE - headroom).to_string();
    // Single-threaded members: a reading counts the other member's call in flight, if any, as
    // landed, so together they may pass the floor by that one call, never more.
    let env = [
        ("PINGUARD_HOST_RESERVE", reserve.as_str()),
        ("PINGUARD_GROUP", group.as_str()),
        ("PINGUARD_DEPTH", "4"),
        ("EMU_DRIVER_IO", "1"),
    ];
    let children: Vec<_> = (0..2)
        .map(|_| {
            h.command(
                "host_fill",
                &["1", &size.to_string(), "1000", "300"],
                &env,
                false,
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let mut pinned = 0;
    let mut refused = 0;
    let mut said = String::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let r = Run::from_output(out, h.dir.clone());
        assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
        said += &r.stderr;
        let s = r.stats();
        pinned += s["pinned"].as_u64().unwrap();
        refused += s["refused"].as_u64().unwrap();
    }
    let max = h.max_pinned();
    let ledger_bytes = std::fs::read(&ledger).ok();
    remove_semaphores(&ledger);
    let _ = std::fs::remove_file(&ledger);
    assert!(BASE - max + size >= BASE - headroom, "together the members held {max} bytes at once, more than one call past the {headroom} bytes of headroom");
    assert!(
        pinned * size + 4 * size > headroom,
        "the members stopped far above the floor ({pinned} calls pinned): the test proves nothing"
    );
    assert_eq!(refused, 2, "each member ends with one refusal");
    let mut stopped = 0;
    for p in reports_in(&h.dir) {
        let rep = read_report(&p);
        let g = rep.group.as_ref().unwrap_or_else(|| {
            panic!(
                "{}: no group: {:?}\nwhat the members said:\n{said}",
                p.display(),
                rep.config
            )
        });
        assert_eq!(
            g.name,
            group.as_str(),
            "{}: {:?}\nwhat the members said:\n{said}",
            p.display(),
            rep.config
        );
        assert_eq!(g.host_reserve_bytes, Some(BASE - headroom));
        assert!(
            g.host_lowest_available_bytes.unwrap() + size >= BASE - headroom,
            "{g:?}"
        );
        stopped += rep.totals.host_reserve_count;
    }
    assert_eq!(stopped, 2);
    // The group's figures are in its members' reports (above); the ledger went with the last
    // member (issue 46 item 5).
    assert!(ledger_bytes.is_none(), "the last member removed the ledger");
}

#[test]
fn a_meminfo_that_cannot_be_used_turns_the_reserve_off_with_one_line() {
    if !can_fake_meminfo() {
        return;
    }
    let ops = [
        "cuda_alloc:524288",
        "cuda_alloc:524288",
        "cuda_alloc:524288",
    ];
    for (tag, text, why) in [
        (
            "host-garbage",
            "\u{1}\u{2} garbage, not meminfo\nMemAvailable: lots kB\n",
            "MemAvailable",
        ),
        (
            "host-no-available",
            "MemTotal:        1048576 kB\nMemFree:          524288 kB\n",
            "MemAvailable",
        ),
    ] {
        let h = Host::with_text(tag, text);
        let r = h.run_frozen("scenario", &ops, &[("PINGUARD_HOST_RESERVE", "1G")]);
        assert_eq!(
            r.rcs(),
            vec![0, 0, 0],
            "{tag}: never a refusal from a bad reading\n{}\n{}",
            r.stdout,
            r.stderr
        );
        let lines = pinguard_lines(&r.stderr);
        let about: Vec<&&str> = lines
            .iter()
            .filter(|l| l.contains("PINGUARD_HOST_RESERVE"))
            .collect();
        assert_eq!(about.len(), 1, "{tag}: one line\n{}", r.stderr);
        assert!(
            about[0].contains("/proc/meminfo") && about[0].contains(why),
            "{tag}: {}",
            about[0]
        );
        let rep = r.typed_report();
        assert!(rep.config.host_reserve_bytes.is_none(), "{tag}");
        assert!(
            rep.config
                .errors
                .iter()
                .any(|e| e.contains("/proc/meminfo")),
            "{tag}: {:?}",
            rep.config
        );
        assert_eq!(rep.totals.denied_count, 0);
        assert!(rep.host.is_none(), "{tag}: no reserve was ever in force");
    }

    // A process that pins nothing says nothing, bad reading or not.
    let h = Host::with_text("host-quiet", "garbage\n");
    let r = h.run_frozen("scenario", &["vmlck"], &[("PINGUARD_HOST_RESERVE", "1G")]);
    assert!(pinguard_lines(&r.stderr).is_empty(), "{}", r.stderr);

    // Good at the start, garbage later: the reserve goes off at the next reading, with one line.
    let h = Host::new("host-clobbered");
    let reserve = reserve_leaving(MIB);
    let r = h.run_frozen(
        "scenario",
        &[
            "cuda_alloc:524288",
            "clobber:HOST_MEMINFO",
            "sleep_ms:250",
            "cuda_alloc:524288",
            "cuda_alloc:524288",
            "cuda_alloc:524288",
        ],
        &[
            ("PINGUARD_HOST_RESERVE", &reserve),
            ("HOST_MEMINFO", h.meminfo.to_str().unwrap()),
        ],
    );
    assert_eq!(
        r.rcs(),
        vec![0, 0, 0, 0, 0, 0],
        "{}\n{}",
        r.stdout,
        r.stderr
    );
    let lines = pinguard_lines(&r.stderr);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("PINGUARD_HOST_RESERVE"))
            .count(),
        1,
        "{}",
        r.stderr
    );
    let rep = r.typed_report();
    assert!(rep.config.host_reserve_bytes.is_none());
    assert!(
        rep.config
            .errors
            .iter()
            .any(|e| e.contains("/proc/meminfo")),
        "{:?}",
        rep.config
    );
    assert_eq!(
        rep.host.map(|h| h.reserve_bytes),
        Some(BASE - MIB),
        "the reserve was in force until then"
    );
}

#[test]
fn the_report_metrics_and_exit_line_show_the_reserve() {
    if !can_fake_meminfo() {
        return;
    }
    let h = Host::new("host-report");
    let reserve = BASE - MIB;
    let metrics = h.dir.join("metrics.%p.prom");
    // The metrics file lives as long as its process: the program waits on its stdin after the
    // calls, while the file is read.
    let mut cmd = h.command(
        "scenario",
        &[
            "cuda_alloc:524288",
            "cuda_alloc:524288",
            "cuda_alloc:524288",
            "wait_stdin:0",
        ],
        &[
            ("PINGUARD_HOST_RESERVE", &reserve.to_string()),
            ("PINGUARD_METRICS", metrics.to_str().unwrap()),
            ("PINGUARD_INTERVAL", "100ms"),
        ],
        false,
    );
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut stdout = String::new();
    while !stdout.ends_with("waiting\n") {
        assert!(
            std::io::BufRead::read_line(&mut out, &mut stdout).unwrap() > 0,
            "{stdout}"
        );
    }
    let prom = || -> Vec<PathBuf> {
        std::fs::read_dir(&h.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "prom"))
            .collect()
    };
    until("the metrics after every call", || {
        prom()
            .first()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .is_some_and(|t| {
                t.contains("pinguard_host_reserve_stopped_total{")
                    && t.lines().any(|l| {
                        l.starts_with("pinguard_host_reserve_stopped_total{") && l.ends_with(" 1")
                    })
            })
    });
    let prom = prom();
    let text = std::fs::read_to_string(&prom[0]).unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"\n").unwrap();
    std::io::Read::read_to_string(&mut out, &mut stdout).unwrap();
    let mut output = child.wait_with_output().unwrap();
    output.stdout = stdout.into_bytes();
    let r = Run::from_output(output, h.dir.clone());
    assert_eq!(r.rcs()[..3], [0, 0, 2], "{}\n{}", r.stdout, r.stderr);
    let rep = r.typed_report();
    assert_eq!(rep.config.host_reserve_bytes, Some(reserve));
    assert_eq!(rep.totals.host_reserve_count, 1);
    let host = rep.host.as_ref().expect("a host reserve in force");
    assert_eq!(
        (host.reserve_bytes, host.total_bytes),
        (reserve, BASE),
        "{host:?}"
    );
    assert_eq!(
        host.lowest_available_bytes, reserve,
        "read afresh before the refusal: {host:?}"
    );
    assert!(host.readings >= 2, "{host:?}");
    let e = &events_of(&rep)[0];
    assert_eq!(
        (e.kind, e.reason, e.host_available_bytes),
        (EventKind::Denied, Some(Limit::HostReserve), Some(reserve)),
        "{e:?}"
    );
    let exit = pinguard_lines(&r.stderr)
        .into_iter()
        .find(|l| l.contains("at exit"))
        .unwrap_or_else(|| panic!("{}", r.stderr));
    assert!(exit.contains("; 1 denied, 0 downgraded; 1 stopped by the host reserve of 1023 MiB (lowest available 1023 MiB); last refused: "), "{exit}");
    assert!(exit.contains("; report: "), "{exit}");
    assert!(!prom[0].exists(), "the metrics file went with its process");
    for (name, v) in [
        ("pinguard_host_reserve_bytes", reserve),
        ("pinguard_host_lowest_available_bytes", reserve),
        ("pinguard_host_reserve_stopped_total", 1),
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("{name}{{")) && l.ends_with(&format!(" {v}"))),
            "{name} {v} in:\n{text}"
        );
    }
    assert!(
        text.contains("# TYPE pinguard_host_available_bytes gauge"),
        "{text}"
    );
    // And as a Prometheus parser reads it, where one is installed (tests/group.rs requires it).
    let script = "import sys\nfrom prometheus_client.parser import text_string_to_metric_families\nfor f in text_string_to_metric_families(open(sys.argv[1]).read()):\n    for s in f.samples: print(f.type, s.name, int(s.value))";
    let copy = h.dir.join("metrics-copy.txt");
    std::fs::write(&copy, &text).unwrap();
    if let Ok(out) = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(&copy)
        .output()
    {
        if out.status.success() {
            let parsed = String::from_utf8_lossy(&out.stdout);
            for want in [
                format!("gauge pinguard_host_reserve_bytes {reserve}"),
                "counter pinguard_host_reserve_stopped_total 1".into(),
            ] {
                assert!(parsed.lines().any(|l| l == want), "{want} in:\n{parsed}");
            }
        }
    }
}

#[test]
fn the_strictest_of_budget_and_reserve_refuses_first() {
    if !can_fake_meminfo() {
        return;
    }
    let ops = [
        "cuda_alloc:262144",
        "cuda_alloc:262144",
        "cuda_alloc:262144",
    ];
    // A budget smaller than the headroom: the budget refuses, with the ordinary reason.
    let h = Host::new("host-budget-first");
    let r = h.run(
        "scenario",
        &ops,
        &[
            ("PINGUARD_HOST_RESERVE", &reserve_leaving(MIB)),
            ("PINGUARD_BUDGET", "256K"),
        ],
    );
    assert_eq!(r.rcs(), vec![0, 2, 2], "{}\n{}", r.stdout, r.stderr);
    let rep = r.typed_report();
    assert_eq!(rep.totals.host_reserve_count, 0);
    assert!(
        events_of(&rep)
            .iter()
            .all(|e| e.reason == Some(Limit::Budget) && e.host_available_bytes.is_none()),
        "{:?}",
        rep.events
    );
    // A headroom smaller than the budget: the reserve refuses.
    let h = Host::new("host-reserve-first");
    let r = h.run(
        "scenario",
        &ops,
        &[
            ("PINGUARD_HOST_RESERVE", &reserve_leaving(512 * KIB)),
            ("PINGUARD_BUDGET", "4M"),
        ],
    );
    assert_eq!(r.rcs(), vec![0, 0, 2], "{}\n{}", r.stdout, r.stderr);
    let rep = r.typed_report();
    assert_eq!(rep.totals.host_reserve_count, 1);
    assert_eq!(events_of(&rep)[0].reason, Some(Limit::HostReserve));
    assert_eq!(rep.config.budget_bytes, Some(4 * MIB));
}

#[test]
fn a_percentage_is_of_memtotal() {
    if !can_fake_meminfo() {
        return;
    }
    // MemTotal 1 GiB, 99.9% of it: 1,072,668,082 bytes, leaving about 1 MiB of the available GiB.
    let h = Host::new("host-percent");
    let r = h.run(
        "scenario",
        &[
            "cuda_alloc:524288",
            "cuda_alloc:524288",
            "cuda_alloc:524288",
        ],
        &[("PINGUARD_HOST_RESERVE", "99.9%")],
    );
    let want = (BASE as f64 * 99.9 / 100.0) as u64;
    assert_eq!(r.typed_report().config.host_reserve_bytes, Some(want));
    assert_eq!(r.rcs(), vec![0, 0, 2], "{}\n{}", r.stdout, r.stderr);
}

/// A release lowers what the process holds at once, but gives the host memory back only if the
/// pages leave: released-then-pinned-again bytes are room only once a reading shows them. Here
/// the host gets nothing back (pages that stay resident), and the calls stop at the floor instead
/// of walking below it one cycle at a time between readings.
#[test]
fn releasing_and_pinning_again_does_not_walk_below_the_floor() {
    if !can_fake_meminfo() {
        return;
    }
    let h = Host::new("host-sticky");
    let reserve = reserve_leaving(MIB);
    // Slot i is cycle i's allocation (a refused one leaves it empty: freeing NULL is a no-op).
    let ops: Vec<String> = (0..6)
        .flat_map(|i| ["cuda_alloc:524288".to_string(), format!("cuda_free:{i}")])
        .collect();
    let ops: Vec<&str> = ops.iter().map(String::as_str).collect();
    let r = h.run(
        "scenario",
        &ops,
        &[
            ("PINGUARD_HOST_RESERVE", &reserve),
            ("EMU_MEMINFO_STICKY", "1"),
        ],
    );
    assert!(r.success(), "{}\n{}", r.stdout, r.stderr);
    // The stand-in's count is what was ever taken from the host: never more than the headroom
    // and one call.
    assert!(
        h.max_pinned() <= MIB + 512 * KIB,
        "{} bytes taken from a headroom of {MIB}:\n{}",
        h.max_pinned(),
        r.stdout
    );
    let allocs: Vec<i64> = r.rcs().into_iter().step_by(2).collect();
    assert_eq!(
        allocs.iter().filter(|&&rc| rc == 0).count(),
        2,
        "{}",
        r.stdout
    );
    assert!(allocs[2..].iter().all(|&rc| rc == 2), "{}", r.stdout);
}
