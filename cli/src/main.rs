//! `pinguard`: runs programs under the preload library and reads its reports.
//!
//! Exit status: 0 success, 1 a check failed, 2 bad usage or unreadable input; `run` passes on
//! its command's (`EXIT_*` below are what `--help` says).

#![deny(clippy::undocumented_unsafe_blocks)]

mod cdi;
mod check;
mod diff;
mod doctor;
mod doctor_facts;
mod doctor_node;
mod doctor_probe;
mod export;
mod flags;
mod flamegraph;
mod group;
mod input;
mod interp;
mod latest;
mod merge;
mod out;
mod plot;
mod prune;
mod record;
mod report;
mod run;
mod secure;
mod suppress;
mod top;
mod top_list;
mod writers;

use clap::{Args, Parser, Subcommand};
use pinguard_common::units;
use pinguard_common::vars;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

const EXIT_ALL: &str = "Exit status:
  0  success
  1  `check`: a limit was exceeded
  2  bad usage, or an input that is not a readable report
  `run` exits with its command's status (see `pinguard run --help`).";
const EXIT_DIFF: &str =
    "Exit status: 0 success; 1 a callsite grew by more than --fail-on-growth (one line each); \
2 bad usage, or an input that is not a readable report.";
const EXIT_READ: &str =
    "Exit status: 0 success; 2 bad usage, or an input that is not a readable report \
(a file that a directory scan finds and that is not a pinguard report is skipped with a note).";
const EXIT_CHECK: &str =
    "Exit status: 0 every limit holds; 1 a limit was exceeded (one line each); 2 bad usage, \
or an input that is not a readable report.";
const EXIT_RUN: &str = "Exit status: the command's own; 128+N when signal N ended it; 126 when it is not executable, \
127 when it does not exist; 2 when pinguard cannot run it (a bad option, no library, nowhere to write reports).";
const EXIT_DOCTOR: &str = "Exit status: 0 contained (a memory limit, and every pinning path probed is counted by it); \
1 a path pins outside the limit, or there is no limit; 2 could not tell (no cgroup, or no --probe).";
const EXIT_CDI: &str = "Exit status: 0 the spec was written; 2 bad usage, no library at the path given (or beside this \
binary), or the spec could not be written.";
const EXIT_TOP: &str = "Exit status: 0 success; 2 bad usage, or no such group or directory.";
const EXIT_GROUP: &str =
    "Exit status: 0 success; 1 `rm`: a member still runs, or the group is another user's; \
2 bad usage, or no such group.";
const EXIT_PRUNE: &str = "Exit status: 0 success (whether or not a file was removed); 2 bad usage, or DIR cannot be read.";

#[derive(Parser)]
#[command(name = "pinguard", version, about = "Track, cap and report host-pinned memory (CUDA, Ascend ACL, mlock)", after_help = EXIT_ALL)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

fn bytes(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| format!("{e}; expected {}", units::SIZE_FORMS))
}

/// The suppression rules: `--suppressions`, else the file `PINGUARD_SUPPRESSIONS` names (read by
/// `check` alone: the library knows the name and leaves it be).
fn check_suppressions(given: Option<PathBuf>) -> Result<Vec<suppress::Rule>, String> {
    let from_env = std::env::var_os(vars::SUPPRESSIONS.name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    match given.or(from_env) {
        Some(p) => suppress::load(&p),
        None => Ok(Vec::new()),
    }
}

/// A count in a limit: clap's own message for `-1` would be "unexpected argument".
fn count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err("negative counts are not allowed".into());
    }
    t.parse()
        .map_err(|_| "expected a whole number of calls, such as 0 or 10".into())
}

fn duration(s: &str) -> Result<String, String> {
    units::parse_duration_ms(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("{e}; expected {}", units::DURATION_FORMS))
}

#[derive(Subcommand)]
enum Cmd {
    /// Will pinned memory be contained here? The memory cgroup and its tightest limit, usage and
    /// reclaimable cache, kernel-memory accounting, RLIMIT_MEMLOCK, the host's memory and the
    /// PINGUARD_* settings, each with the file it was read from; --probe measures which pinning
    /// paths the limit counts.
    #[command(after_help = EXIT_DOCTOR)]
    Doctor {
        /// Pin a bounded amount through each path this process can reach (mlock; cudaHostAlloc,
        /// cudaHostRegister, aclrtMallocHost, hipHostMalloc where a runtime loads) and say whether
        /// the cgroup counted it.
        #[arg(long)]
        probe: bool,
        /// How much each probe pins (held for a moment, three times per path). Default: 32Mi,
        /// less where a quarter of the cgroup's headroom or what RLIMIT_MEMLOCK leaves (without
        /// CAP_IPC_LOCK) is less; doctor says which.
        #[arg(long, value_parser = bytes, value_name = "BYTES")]
        probe_size: Option<u64>,
        /// Print the findings as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run CMD with pinguard preloaded, exit with its status, then summarise the reports it and its
    /// children wrote and how each of them ended.
    ///
    /// Reports go to a folder of this run's own, pinguard-reports/<start time>-<pid>/, unless
    /// --report says otherwise. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to `pinguard run` are
    /// passed on to CMD.
    #[command(after_help = EXIT_RUN)]
    Run {
        /// The options that set a variable (`flags::FLAGS`).
        #[command(flatten)]
        vars: flags::VarOptions,
        /// One budget for the command and all its descendants together: a group named after this
        /// run (PINGUARD_GROUP=run-<start time>-<pid>, PINGUARD_GROUP_BUDGET): 2Gi, 10%.
        #[arg(long, value_parser = flags::ByRegistry(&vars::GROUP_BUDGET), allow_hyphen_values = true, value_name = "SIZE")]
        group_budget: Option<String>,
        /// Report path template (PINGUARD_REPORT): %p pid, %e executable, %h host, %t start
        /// time; checked before CMD starts. Default: this run's own folder,
        /// pinguard-reports/<start time>-<pid>/%e.%p.json, under the temporary directory when
        /// the working directory is not writable.
        #[arg(long)]
        report: Option<String>,
        /// The preload library (default: libpinguard.so beside this binary).
        #[arg(long)]
        lib: Option<PathBuf>,
        /// Of the summary, print only its last line (the total, or that there were no reports).
        #[arg(long, short = 'q')]
        quiet: bool,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    },
    /// Merge reports (files or directories) and show the top callsites by live pinned bytes.
    #[command(after_help = EXIT_READ)]
    Report {
        /// How many callsites to list (the largest by live bytes, then by peak).
        #[arg(long, default_value_t = 20, value_name = "N")]
        top: usize,
        /// Print the merged figures as JSON.
        #[arg(long)]
        json: bool,
        /// What the callsites are ordered by, the largest first.
        #[arg(long, value_enum, default_value = "live")]
        sort: report::SortBy,
        /// Show every native frame: the CPython interpreter's own frames under a Python
        /// callsite are otherwise folded into one line.
        #[arg(long)]
        all_frames: bool,
        /// Skip inputs that cannot be read, and go on with the rest (each is still named on
        /// stderr); exit 2 only when none can be read.
        #[arg(long)]
        keep_going: bool,
        /// Report files (*.json, *.state) and folders to scan for them.
        #[arg(required = true, value_name = "FILES|DIRS")]
        inputs: Vec<PathBuf>,
    },
    /// Fail (exit 1) when the reports' summed figures exceed a limit: a CI gate.
    #[command(after_help = EXIT_CHECK)]
    Check(CheckArgs),
    /// Per-callsite change of live and peak pinned bytes between two runs (files or directories).
    #[command(after_help = EXIT_DIFF)]
    Diff {
        /// Exit 1 when a callsite's live or peak pinned bytes grew by more than this: a size
        /// (512Ki, 1Gi) or a percentage of the old figure (10%; a new callsite exceeds any).
        #[arg(long, value_name = "SIZE|N%", value_parser = diff::parse_growth, allow_hyphen_values = true)]
        fail_on_growth: Option<diff::Growth>,
        /// Skip inputs that cannot be read, and go on with the rest (each is still named on
        /// stderr); exit 2 only when none can be read.
        #[arg(long)]
        keep_going: bool,
        /// The earlier run: a report file or a folder of them.
        old: PathBuf,
        /// The later run: a report file or a folder of them.
        new: PathBuf,
    },
    /// Draw the merged callsites as a flame graph (SVG).
    #[command(after_help = EXIT_READ)]
    Flamegraph {
        /// Where to write the SVG; `-` for standard output.
        #[arg(short, long, value_name = "OUT.svg")]
        output: PathBuf,
        /// What the widths show.
        #[arg(long, value_enum, default_value = "live")]
        metric: flamegraph::Metric,
        /// Skip inputs that cannot be read, and go on with the rest (each is still named on
        /// stderr); exit 2 only when none can be read.
        #[arg(long)]
        keep_going: bool,
        /// Report files (*.json, *.state) and folders to scan for them.
        #[arg(required = true, value_name = "FILES|DIRS")]
        inputs: Vec<PathBuf>,
    },
    /// Write the merged reports in another tool's format: pprof (go tool pprof, Pyroscope, Parca),
    /// perfetto (Chrome trace-event JSON for the Perfetto UI and chrome://tracing), speedscope,
    /// or folded stacks (inferno, flamegraph.pl, Pyroscope).
    ///
    /// pprof carries every figure per callsite and process (sample types live, peak, calls,
    /// refused bytes, refused calls; labels process, host, api, reason); perfetto carries each
    /// process's pinned bytes over time, its limits, and every refusal and downgrade with its
    /// callsite; speedscope and folded carry the figure --weight names.
    #[command(after_help = EXIT_READ)]
    Export {
        /// The format to write.
        #[arg(long, value_enum)]
        format: export::Format,
        /// What speedscope's and folded stacks' widths show (pprof and perfetto carry all).
        #[arg(long, value_enum, default_value = "live")]
        weight: export::Weight,
        /// Where to write it; `-` (the default) for standard output.
        #[arg(short, long, value_name = "FILE", default_value = "-")]
        output: PathBuf,
        /// Skip inputs that cannot be read, and go on with the rest (each is still named on
        /// stderr); exit 2 only when none can be read.
        #[arg(long)]
        keep_going: bool,
        /// Report files (*.json, *.state) and folders to scan for them.
        #[arg(required = true, value_name = "FILES|DIRS")]
        inputs: Vec<PathBuf>,
    },
    /// A live view of a group (its shared ledger) or a directory of metrics files: processes by
    /// pinned bytes, budget use, refusals.
    #[command(after_help = EXIT_TOP)]
    Top {
        /// The group's name (PINGUARD_GROUP). With none of --group, --metrics and --pid, `top`
        /// lists what it can show.
        #[arg(long, conflicts_with_all = ["metrics", "pid"])]
        group: Option<String>,
        /// A directory of PINGUARD_METRICS files.
        #[arg(long, conflicts_with = "pid")]
        metrics: Option<PathBuf>,
        /// A process running under pinguard, read from its state file.
        #[arg(long)]
        pid: Option<u32>,
        /// Print once and exit (for scripts).
        #[arg(long)]
        once: bool,
        /// Refresh interval: 500ms, 2s.
        #[arg(long, default_value = "1s", value_parser = duration)]
        interval: String,
    },
    /// Print or write a CDI spec (Container Device Interface) that preloads the installed library
    /// into every container run with `--device pinguard.dev/preload=default`.
    ///
    /// The spec mounts the library read-only into the container and a one-line list naming it at
    /// /etc/ld.so.preload (or sets LD_PRELOAD: --preload-with env); install it as
    /// /etc/cdi/pinguard.json. Host paths are this host's: run it on the node.
    #[command(after_help = EXIT_CDI)]
    Cdi(CdiArgs),
    /// Remove the metrics files (PINGUARD_METRICS) of processes that have ended without removing
    /// their own (SIGKILL, the OOM killer): for a node agent to run now and then, where a folder's
    /// last writer may die with no other writer to remove its file. Only files that start with
    /// pinguard's writer line; a writer in another PID namespace is dead once its file is older
    /// than two of its intervals and 5 s. Prints one line per file removed; exit 0, or 2 when
    /// DIR cannot be read.
    #[command(after_help = EXIT_PRUNE)]
    MetricsPrune {
        /// The folder of the metrics files (node_exporter's textfile directory).
        dir: PathBuf,
    },
    /// The groups on this host (PINGUARD_GROUP, `run --group-budget`): list them, or remove one
    /// whose members have all ended (its ledger in /dev/shm and its System V semaphore set),
    /// such as the group of a run that was itself killed.
    #[command(after_help = EXIT_GROUP)]
    Group {
        #[command(subcommand)]
        action: GroupAction,
    },
    /// Draw pinned bytes over time, one line per process, budgets dashed (SVG).
    #[command(after_help = EXIT_READ)]
    Plot {
        /// Where to write the SVG.
        #[arg(short, long, value_name = "OUT.svg")]
        output: PathBuf,
        /// Time on the x axis as wall-clock time (to compare runs side by side) instead of the
        /// time since each process started.
        #[arg(long)]
        wall_clock: bool,
        /// Skip inputs that cannot be read, and go on with the rest (each is still named on
        /// stderr); exit 2 only when none can be read.
        #[arg(long)]
        keep_going: bool,
        /// Report files (*.json, *.state) and folders to scan for them.
        #[arg(required = true, value_name = "FILES|DIRS")]
        inputs: Vec<PathBuf>,
    },
}

/// `pinguard check`'s flags and inputs.
#[derive(Args)]
struct CheckArgs {
    /// Most live pinned bytes left at the reports' end, summed over processes: 512Mi, 1Gi.
    #[arg(long, value_parser = bytes, value_name = "BYTES", allow_hyphen_values = true)]
    max_live: Option<u64>,
    /// Most pinned bytes at any moment: each process's peak, and what processes alive at the
    /// same time on one host held together (from their timelines): 512Mi, 1Gi.
    #[arg(long, value_parser = bytes, value_name = "BYTES", allow_hyphen_values = true)]
    max_peak: Option<u64>,
    /// Most pinning calls refused by a budget (policy error, or downgrade out of scope).
    #[arg(long, value_name = "N", value_parser = count, allow_hyphen_values = true)]
    max_denied: Option<u64>,
    /// Most pinning calls served with pageable memory instead (policy downgrade).
    #[arg(long, value_name = "N", value_parser = count, allow_hyphen_values = true)]
    max_downgraded: Option<u64>,
    /// Most pinning calls that went over the budget and were pinned anyway (policy warn).
    #[arg(long, value_name = "N", value_parser = count, allow_hyphen_values = true)]
    max_over_budget: Option<u64>,
    /// Most pinning calls the host reserve stopped (PINGUARD_HOST_RESERVE), whatever the
    /// policy did with them.
    #[arg(long, value_name = "N", value_parser = count, allow_hyphen_values = true)]
    max_host_reserve: Option<u64>,
    /// Most pinning calls the cgroup reserve stopped (PINGUARD_CGROUP_RESERVE), whatever the
    /// policy did with them.
    #[arg(long, value_name = "N", value_parser = count, allow_hyphen_values = true)]
    max_cgroup_reserve: Option<u64>,
    /// Skip inputs that cannot be read, and go on with the rest (each is still named on
    /// stderr); exit 2 only when none can be read.
    #[arg(long)]
    keep_going: bool,
    /// Pass even when a process could not use a setting (a rejected PINGUARD_BUDGET, say);
    /// by default that fails the check, since the limits it meant were not in force.
    #[arg(long)]
    allow_config_errors: bool,
    /// Pass even a run whose command pinguard could not be loaded into (a set-user-ID,
    /// set-group-ID or file-capability program in secure mode, a statically linked one); by
    /// default that fails the check, since what it pinned was never seen.
    #[arg(long)]
    allow_unwatched: bool,
    /// Of each folder, check only the newest run: the one `pinguard run` recorded last, or
    /// for reports without a record, the last group of processes alive together.
    #[arg(long)]
    latest: bool,
    /// Callsite figures to leave out of the limits, shown apart (PINGUARD_SUPPRESSIONS):
    /// lines `KIND:PATTERN [ALLOWANCE]`, KIND live, leak, peak, pinned, denied, downgraded or
    /// over_budget, PATTERN a glob on a frame's function, file, file:function or file:line,
    /// e.g. `live:*serve.py:load_model* 8GiB`.
    #[arg(long, value_name = "FILE")]
    suppressions: Option<PathBuf>,
    /// Report files (*.json, *.state) and folders to scan for them.
    #[arg(required = true, value_name = "FILES|DIRS")]
    inputs: Vec<PathBuf>,
}

/// `pinguard cdi`'s flags.
#[derive(Args)]
struct CdiArgs {
    /// Where to write the spec (replaced atomically); `-` for standard output, the default.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The library on the host (default: libpinguard.so beside this binary, or in ../lib/).
    #[arg(long, value_name = "PATH")]
    lib: Option<PathBuf>,
    /// Where the library appears inside the containers (LD_PRELOAD's value).
    #[arg(long, value_name = "PATH", default_value = cdi::CONTAINER_PATH)]
    container_path: String,
    /// node_exporter's textfile folder on the host: mounted read-write at the same path, with
    /// PINGUARD_METRICS=HOSTDIR/pinguard.%h.%n.%p.prom (%n: the PID namespace, so that the
    /// containers of a pod, which share the host name and each run pid 1, write apart).
    #[arg(long, value_name = "HOSTDIR")]
    metrics_dir: Option<PathBuf>,
    /// A folder on the host for the containers' reports: mounted read-write at the same path,
    /// with PINGUARD_REPORT=HOSTDIR/pinguard.%h.%e.%n.%p.json, so that no report lands in a
    /// container's working directory.
    #[arg(long, value_name = "HOSTDIR")]
    report_dir: Option<PathBuf>,
    /// A setting for every container, KEY=VALUE; repeat for more (PINGUARD_GROUP=inference).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = cdi::env_pair)]
    env: Vec<(String, String)>,
    /// How the containers' processes load the library: a one-line list mounted read-only at
    /// /etc/ld.so.preload (an LD_PRELOAD the image sets keeps working beside it), or
    /// LD_PRELOAD in the environment (which replaces the image's own).
    #[arg(long, value_enum, value_name = "WAY", default_value = "ld.so.preload")]
    preload_with: cdi::PreloadWith,
    /// The host's file for that list, written (only when it changes) by this command
    /// (default: ld.so.preload beside the library).
    #[arg(long, value_name = "FILE")]
    preload_list: Option<PathBuf>,
    /// Preload the first stage, libpinguard-lazy.so beside the library, mounted beside it in
    /// the containers: their processes that never pin pay for it alone, and the library is
    /// loaded at a process's first call that can pin.
    #[arg(long)]
    stage: bool,
}

#[derive(Subcommand)]
enum GroupAction {
    /// One line per group: pinned bytes and budget, members running, owner, semaphore set.
    List,
    /// Remove groups none of whose members runs: the ledger and its semaphore set (only this
    /// user's, never a set a process still holds).
    Rm {
        /// The groups' names.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
}

fn write_file(path: &PathBuf, text: &str) -> ExitCode {
    match std::fs::write(path, text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pinguard: {}: {e}", path.display());
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Doctor {
            probe,
            probe_size,
            json,
        } => doctor_command(probe.then_some(probe_size), json),
        Cmd::Run {
            vars,
            group_budget,
            report,
            lib,
            quiet,
            cmd,
        } => {
            let code = run::run(run::Options {
                env: vars.0,
                report,
                group_budget,
                lib,
                cmd,
                quiet,
            });
            ExitCode::from(code.clamp(0, 255) as u8)
        }
        Cmd::Report {
            top,
            json,
            sort,
            all_frames,
            keep_going,
            inputs,
        } => report_command(
            &inputs,
            keep_going,
            json,
            report::Show {
                top,
                by: sort,
                all_frames,
            },
        ),
        Cmd::Check(args) => check_command(args),
        Cmd::Diff {
            fail_on_growth,
            keep_going,
            old,
            new,
        } => diff_command(fail_on_growth, keep_going, old, new),
        Cmd::Flamegraph {
            output,
            metric,
            keep_going,
            inputs,
        } => flamegraph_command(&inputs, keep_going, metric, &output),
        Cmd::Export {
            format,
            weight,
            output,
            keep_going,
            inputs,
        } => export_command(&inputs, keep_going, format, weight, &output),
        Cmd::Top {
            group,
            metrics,
            pid,
            once,
            interval,
        } => top_command(group, metrics, pid, once, &interval),
        Cmd::Cdi(args) => cdi_command(args),
        Cmd::Group {
            action: GroupAction::List,
        } => ExitCode::from(group::list() as u8),
        Cmd::Group {
            action: GroupAction::Rm { names },
        } => ExitCode::from(group::rm(&names) as u8),
        Cmd::MetricsPrune { dir } => ExitCode::from(prune::run(&dir) as u8),
        Cmd::Plot {
            output,
            wall_clock,
            keep_going,
            inputs,
        } => plot_command(&inputs, keep_going, wall_clock, &output),
    }
}

fn diff_command(
    fail_on_growth: Option<diff::Growth>,
    keep_going: bool,
    old: PathBuf,
    new: PathBuf,
) -> ExitCode {
    let Ok(a) = merge::merge_inputs(&[old], keep_going) else {
        return ExitCode::from(2);
    };
    let Ok(b) = merge::merge_inputs(&[new], keep_going) else {
        return ExitCode::from(2);
    };
    out::print(&diff::render(&a, &b));
    let grew = fail_on_growth
        .map(|g| diff::growth_violations(&a, &b, g))
        .unwrap_or_default();
    out::print(&grew.iter().map(|l| format!("{l}\n")).collect::<String>());
    ExitCode::from(u8::from(!grew.is_empty()))
}

fn flamegraph_command(
    inputs: &[PathBuf],
    keep_going: bool,
    metric: flamegraph::Metric,
    output: &std::path::Path,
) -> ExitCode {
    let Ok(m) = merge::merge_inputs(inputs, keep_going) else {
        return ExitCode::from(2);
    };
    match flamegraph::render(&m, metric, output) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pinguard flamegraph: {e}");
            ExitCode::from(2)
        }
    }
}

fn export_command(
    inputs: &[PathBuf],
    keep_going: bool,
    format: export::Format,
    weight: export::Weight,
    output: &std::path::Path,
) -> ExitCode {
    if let Err(e) = export::check_output(format, output) {
        eprintln!("pinguard export: {e}");
        return ExitCode::from(2);
    }
    let Ok(d) = export::load(inputs, keep_going) else {
        return ExitCode::from(2);
    };
    match export::render(&d, format, weight).and_then(|bytes| export::write(&bytes, output)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pinguard export: {e}");
            ExitCode::from(2)
        }
    }
}

fn cdi_command(a: CdiArgs) -> ExitCode {
    let written = cdi::spec(&cdi::Options {
        lib: a.lib,
        container_path: a.container_path,
        metrics_dir: a.metrics_dir,
        report_dir: a.report_dir,
        env: a.env,
        preload_with: a.preload_with,
        preload_list: a.preload_list,
        stage: a.stage,
    })
    .and_then(|spec| cdi::write(&format!("{spec:#}\n"), a.output.as_deref()));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pinguard cdi: {e}");
            ExitCode::from(2)
        }
    }
}

fn doctor_command(probe: Option<Option<u64>>, json: bool) -> ExitCode {
    let f = doctor::examine(probe);
    if json {
        out::print(&format!(
            "{}\n",
            serde_json::to_string_pretty(&f).unwrap_or_default()
        ));
    } else {
        out::print(&doctor::render(&f));
    }
    ExitCode::from(f.exit_status)
}

fn report_command(
    inputs: &[PathBuf],
    keep_going: bool,
    json: bool,
    show: report::Show,
) -> ExitCode {
    let Ok(mut m) = merge::merge_inputs(inputs, keep_going) else {
        return ExitCode::from(2);
    };
    report::order(&mut m, show.by);
    out::print(&if json {
        report::json(&m, show.top)
    } else {
        report::render(&m, show)
    });
    ExitCode::SUCCESS
}

fn check_command(a: CheckArgs) -> ExitCode {
    let limits = check::Limits {
        max_live: a.max_live,
        max_peak: a.max_peak,
        max_denied: a.max_denied,
        max_downgraded: a.max_downgraded,
        max_over_budget: a.max_over_budget,
        max_host_reserve: a.max_host_reserve,
        max_cgroup_reserve: a.max_cgroup_reserve,
        allow_config_errors: a.allow_config_errors,
        allow_unwatched: a.allow_unwatched,
    };
    let (suppressions, latest, inputs, keep_going) =
        (a.suppressions, a.latest, a.inputs, a.keep_going);
    let rules = match check_suppressions(suppressions) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pinguard check: {e}");
            return ExitCode::from(2);
        }
    };
    let inputs = if latest {
        let (files, lines) = latest::select(&inputs);
        for l in lines {
            println!("{l}");
        }
        files
    } else {
        inputs
    };
    let Ok(m) = merge::merge_for_check(&inputs, keep_going) else {
        return ExitCode::from(2);
    };
    let applied = suppress::apply(&rules, &m);
    let view = check::View::new(&m, &applied);
    for l in applied.lines(&rules, &|k| view.name(k)) {
        println!("{l}");
    }
    let (violations, summary) = check::evaluate(&view, &limits);
    for v in &violations {
        println!("{v}");
    }
    if violations.is_empty() {
        println!("{summary}: within limits");
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn top_command(
    group: Option<String>,
    metrics: Option<PathBuf>,
    pid: Option<u32>,
    once: bool,
    interval: &str,
) -> ExitCode {
    let every =
        std::time::Duration::from_millis(units::parse_duration_ms(interval).unwrap_or(1000));
    if let Some(p) = pid {
        return ExitCode::from(top::run(top::Source::Pid(p), once, every) as u8);
    }
    let source = match (&group, &metrics) {
        (Some(g), _) if !pinguard_common::group::valid_name(g) => {
            eprintln!("pinguard top: {g:?} is not a group name (letters, digits, '.', '_', '-')");
            return ExitCode::from(2);
        }
        (Some(g), _) => top::Source::Group(g),
        (None, Some(d)) => top::Source::Metrics(d),
        (None, None) => return ExitCode::from(top_list::list() as u8),
    };
    ExitCode::from(top::run(source, once, every) as u8)
}

fn plot_command(
    inputs: &[PathBuf],
    keep_going: bool,
    wall_clock: bool,
    output: &PathBuf,
) -> ExitCode {
    let axis = if wall_clock {
        plot::TimeAxis::WallClock
    } else {
        plot::TimeAxis::SinceStart
    };
    let mut series = Vec::new();
    if input::for_each(inputs, keep_going, |_, r| series.push(plot::series(&r))).is_err() {
        return ExitCode::from(2);
    }
    match plot::render(&series, axis) {
        Ok(svg) => write_file(output, &svg),
        Err(e) => {
            eprintln!("pinguard plot: {e}");
            ExitCode::from(2)
        }
    }
}
