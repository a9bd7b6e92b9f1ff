//! The run record: what `pinguard run` knows of a run that no report says (the command, how it
//! ended, when, which processes left reports and which did not), written into the run's folder
//! as it ends. A folder holding only a record is a run in which no process pinned anything, and
//! `report`, `check` and `diff` read it as such, so that `run ... && check DIR` passes a clean
//! program as LeakSanitizer passes a program that leaks nothing.

use serde::{Deserialize, Serialize};

/// The `schema` value of a run record.
pub const SCHEMA: &str = "pinguard.run.v1";

/// A record's file name starts with this (then `run`'s pid and `.json`), so that runs sharing a
/// `--report` folder keep one record each.
pub const PREFIX: &str = "pinguard-run.";

/// A process `run` knows of that left no report, and what is known of why.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NoReport {
    pub pid: u32,
    pub why: String,
}

/// A process that left a report or a state file in the folder.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Found {
    pub pid: u32,
    pub exe: String,
    /// The report's `reason`: `exit`, `killed` (read from the state it left), ...
    pub reason: String,
    /// The file, relative to the record's folder.
    pub file: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    pub schema: String,
    pub pinguard_version: String,
    /// The command and its arguments, as given.
    pub command: Vec<String>,
    /// The command's pid.
    pub pid: u32,
    pub hostname: String,
    /// Its exit status, when it exited.
    pub exit_status: Option<i32>,
    /// The signal that ended it (`"SIGKILL"`), when one did.
    pub signal: Option<String>,
    pub start_unix_ms: u64,
    pub end_unix_ms: u64,
    /// `PINGUARD_REPORT` as the processes got it.
    pub report_template: String,
    /// `PINGUARD_DISABLE` switched pinguard off: nothing was recorded, whatever was pinned.
    #[serde(default)]
    pub disabled: bool,
    /// Why pinguard could not be loaded into the command itself, when its file says so (a
    /// statically linked program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unwatched: Option<String>,
    /// Why the command runs in secure mode (set-user-ID, set-group-ID, file capabilities), where
    /// the loader ignores `LD_PRELOAD`: pinguard never saw it, whatever it pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_mode: Option<String>,
    /// The group the run's processes shared (`run --group-budget`), and its budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_budget: Option<String>,
    /// Every process `run` saw: the command, and each one that left a report or a state.
    pub pids_seen: Vec<u32>,
    /// The processes known to have pinned (each leaves a report or a state once it pins).
    pub reports_expected: usize,
    /// The reports and states found, one per process.
    pub reports_found: Vec<Found>,
    /// The processes `run` knows of that left none, with what is known of why.
    pub no_report: Vec<NoReport>,
}

/// Whether these bytes are a run record (and not a report): decided on the schema alone.
pub fn is_record(bytes: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct SchemaOnly<'a> {
        #[serde(borrow)]
        schema: Option<std::borrow::Cow<'a, str>>,
    }
    // Cheap first: a report of a million callsites is not parsed twice.
    if memchr::memmem::find(bytes, SCHEMA.as_bytes()).is_none() {
        return false;
    }
    serde_json::from_slice::<SchemaOnly>(bytes).is_ok_and(|h| h.schema.as_deref() == Some(SCHEMA))
}

pub fn parse(bytes: &[u8]) -> Result<RunRecord, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("malformed run record ({e})"))
}

impl RunRecord {
    /// How the command ended, as `run` says it.
    pub fn ended(&self) -> String {
        match (self.exit_status, &self.signal) {
            (_, Some(s)) => format!("killed by {s}"),
            (Some(c), None) => format!("exited with status {c}"),
            (None, None) => "ended".into(),
        }
    }

    /// `run of `workload --fast` (pid 12)`: the command as typed, its program by file name.
    pub fn name(&self) -> String {
        let program = self
            .command
            .first()
            .map(|a| a.rsplit('/').next().unwrap_or(a).to_string());
        let cmd = program
            .into_iter()
            .chain(self.command.iter().skip(1).cloned())
            .collect::<Vec<_>>()
            .join(" ");
        format!("run of `{cmd}` (pid {})", self.pid)
    }

    /// One line for `report` and `check`: which run, how it ended, what it left.
    /// Whether nothing of this run was watched: pinguard was off, or could not be loaded into the
    /// command and no process left a report. A gate on such a run checked nothing.
    pub fn unchecked(&self) -> bool {
        self.disabled || (self.not_loaded().is_some() && self.reports_found.is_empty())
    }

    /// Why pinguard could not be loaded into the command itself, when it could not.
    pub fn not_loaded(&self) -> Option<&String> {
        self.secure_mode.as_ref().or(self.unwatched.as_ref())
    }

    pub fn line(&self) -> String {
        let secs = self.end_unix_ms.saturating_sub(self.start_unix_ms) as f64 / 1000.0;
        let what = if self.disabled {
            "PINGUARD_DISABLE was set: pinguard recorded nothing".to_string()
        } else if let (Some(why), true) = (self.not_loaded(), self.reports_found.is_empty()) {
            format!("no report: {why}")
        } else if self.reports_found.is_empty() {
            "no process left a report (a process that pins leaves one): nothing was pinned"
                .to_string()
        } else {
            crate::out::count(
                self.reports_found.len() as u64,
                "process left a report",
                "processes left reports",
            )
        };
        format!(
            "{}: {} after {secs:.1} s; {what}",
            self.name(),
            self.ended()
        )
    }
}
