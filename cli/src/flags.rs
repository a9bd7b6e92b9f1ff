//! The options of `pinguard run` that set a `PINGUARD_*` variable: one table of (flag, variable),
//! each value checked by its variable's own parser in the registry (`pinguard_common::vars`), so
//! that `--budget 12Q` is refused with the words `PINGUARD_BUDGET=12Q` gets from the library.

use clap::builder::{PossibleValue, TypedValueParser};
use clap::{Arg, ArgMatches, Command};
use pinguard_common::vars::{self, Parse, Var};
use std::ffi::OsStr;

/// One option that sets one variable to its value, unchanged.
pub struct Flag {
    pub long: &'static str,
    pub var: &'static Var,
    pub value_name: &'static str,
    /// `{var}` stands for the variable's name, `{min}` and `{max}` for a count's bounds.
    pub help: &'static str,
}

/// `run`'s options for variables, in the order `--help` lists them.
pub const FLAGS: [Flag; 8] = [
    Flag { long: "budget", var: &vars::BUDGET, value_name: "BUDGET", help: "Cap on live pinned bytes per process ({var}): 512Mi, 8Gi, 1.5GiB, 10%; 0 lets nothing be pinned (every pinning call gets the policy)" },
    Flag { long: "host-reserve", var: &vars::HOST_RESERVE, value_name: "HOST_RESERVE", help: "A floor under the host's available memory ({var}): a pinning call that would take MemAvailable below it gets the policy, as over the budget. 8G, 10% (of MemTotal)" },
    Flag { long: "cgroup-reserve", var: &vars::CGROUP_RESERVE, value_name: "CGROUP_RESERVE", help: "A floor under the headroom of the command's memory cgroup before its OOM killer ({var}): a pinning call that would take it below gets the policy. 2Gi, 10% (of the tightest cgroup limit)" },
    Flag { long: "downgrade-match", var: &vars::DOWNGRADE_MATCH, value_name: "PATTERNS", help: "Under downgrade, downgrade only callsites matching these glob patterns ({var}), e.g. '*torch/utils/data/_utils/pin_memory.py'" },
    Flag { long: "policy", var: &vars::POLICY, value_name: "POLICY", help: "What an over-budget call gets ({var})" },
    Flag { long: "depth", var: &vars::DEPTH, value_name: "DEPTH", help: "Frames per stack, {min} to {max} ({var})" },
    Flag { long: "interval", var: &vars::INTERVAL, value_name: "INTERVAL", help: "Also rewrite the reports periodically ({var}): 500ms, 30s" },
    Flag { long: "signal", var: &vars::SIGNAL, value_name: "SIGNAL", help: "Also write a report when this signal arrives ({var}): USR1, SIGUSR2, 10" },
];

impl Flag {
    fn help(&self) -> String {
        let (min, max) = match self.var.parse {
            Parse::Count { min, max, .. } => (min, max),
            _ => (0, 0),
        };
        self.help
            .replace("{var}", self.var.name)
            .replace("{min}", &min.to_string())
            .replace("{max}", &max.to_string())
    }
}

/// The option that sets `var`, as `--help` names it.
pub fn option_for(var: &str) -> Option<String> {
    FLAGS
        .iter()
        .find(|f| f.var.name == var)
        .map(|f| format!("--{}", f.long))
}

/// A value as `var`'s parser takes it, unchanged (the library reads it again); for a choice of
/// names, `--help` lists them.
#[derive(Clone)]
pub struct ByRegistry(pub &'static Var);

impl TypedValueParser for ByRegistry {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &Command,
        arg: Option<&Arg>,
        value: &OsStr,
    ) -> Result<String, clap::Error> {
        let var = self.0;
        // clap's own function parser: its message names the option and the value.
        (move |s: &str| var.check(s).map(|()| s.to_string())).parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        match self.0.parse {
            Parse::OneOf { names, .. } => Some(Box::new(names.iter().map(PossibleValue::new))),
            _ => None,
        }
    }
}

/// The variables `run`'s options set: (name, value), in `FLAGS`' order.
#[derive(Clone, Debug, Default)]
pub struct VarOptions(pub Vec<(&'static str, String)>);

impl clap::FromArgMatches for VarOptions {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        Ok(VarOptions(
            FLAGS
                .iter()
                .filter_map(|f| m.get_one::<String>(f.long).map(|v| (f.var.name, v.clone())))
                .collect(),
        ))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for VarOptions {
    fn augment_args(cmd: Command) -> Command {
        FLAGS.iter().fold(cmd, |cmd, f| {
            let arg = Arg::new(f.long)
                .long(f.long)
                .value_name(f.value_name)
                .help(f.help())
                .value_parser(ByRegistry(f.var));
            // A size may be written `-1`: the parser's own message says why it is refused.
            cmd.arg(if matches!(f.var.parse, Parse::Size(_)) {
                arg.allow_hyphen_values(true)
            } else {
                arg
            })
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    fn run_command() -> Command {
        crate::Cli::command()
            .find_subcommand("run")
            .expect("run")
            .clone()
    }

    #[test]
    fn every_flag_sets_a_variable_of_the_registry_once() {
        for (i, f) in FLAGS.iter().enumerate() {
            // A variable declared but left out of `ALL` is no variable the library reads.
            assert!(
                vars::ALL.iter().any(|v| v.name == f.var.name),
                "--{}: {} is not in vars::ALL",
                f.long,
                f.var.name
            );
            assert!(
                FLAGS[..i]
                    .iter()
                    .all(|g| g.var.name != f.var.name && g.long != f.long),
                "--{} twice",
                f.long
            );
            assert!(
                f.help().contains(&format!("({})", f.var.name)) && !f.help().contains('{'),
                "--{}: {}",
                f.long,
                f.help()
            );
            assert_eq!(option_for(f.var.name), Some(format!("--{}", f.long)));
        }
    }

    /// Every variable an option of `run` names, generated or written by hand (`--group-budget`,
    /// `--report`), is one the library reads.
    #[test]
    fn every_variable_an_option_of_run_names_is_in_the_registry() {
        let run = run_command();
        let mut named = 0;
        for arg in run.get_arguments() {
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            for (at, _) in help.match_indices("PINGUARD_") {
                let name: String = help[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect();
                assert!(
                    vars::find(&name).is_some(),
                    "--{}: {name} is not a pinguard variable",
                    arg.get_id()
                );
                named += 1;
            }
        }
        assert!(named >= FLAGS.len() + 3, "{named}");
        for f in &FLAGS {
            assert!(
                run.get_arguments().any(|a| a.get_long() == Some(f.long)),
                "--{}",
                f.long
            );
        }
    }

    /// A bad value of an option gets the words the library gives the variable (less what the
    /// library falls back to: `run` refuses instead).
    #[test]
    fn a_bad_option_is_refused_in_the_librarys_words() {
        let flags = FLAGS
            .iter()
            .map(|f| (f.long, f.var))
            .chain([("group-budget", &vars::GROUP_BUDGET)]);
        for (long, var) in flags {
            let bad = var.parse.bad_example().expect(long);
            let why = var.parse(Some(&bad)).expect_err(long);
            let e = crate::Cli::try_parse_from([
                "pinguard",
                "run",
                &format!("--{long}"),
                &bad,
                "--",
                "true",
            ])
            .err()
            .expect(long);
            assert_eq!(e.exit_code(), 2);
            let said = e.to_string();
            let env = var.rejected(Some(&bad), &why);
            assert!(
                env.contains(&var.expected(&why)) && said.contains(&var.expected(&why)),
                "--{long} {bad}: {said}\n{env}"
            );
            let good = match var.parse {
                Parse::Duration => "30s",
                Parse::Signal => "USR2",
                _ => var.default.unwrap_or("1"),
            };
            assert!(
                crate::Cli::try_parse_from([
                    "pinguard",
                    "run",
                    &format!("--{long}"),
                    good,
                    "--",
                    "true"
                ])
                .is_ok(),
                "--{long} {good}"
            );
        }
    }

    #[test]
    fn values_pass_on_unchanged_under_their_variables() {
        let cli = crate::Cli::try_parse_from([
            "pinguard", "run", "--depth", "4", "--policy", "Warn", "--budget", "10%", "--", "true",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let crate::Cmd::Run { vars, .. } = cli.command else {
            panic!("not run")
        };
        assert_eq!(
            vars.0,
            vec![
                ("PINGUARD_BUDGET", "10%".to_string()),
                ("PINGUARD_POLICY", "Warn".to_string()),
                ("PINGUARD_DEPTH", "4".to_string())
            ]
        );
    }
}
