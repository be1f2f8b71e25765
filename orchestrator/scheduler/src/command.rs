//! The generic command adapter, for schedulers without a built-in adapter
//! (or a site's own wrapper around one): each operation is a configured
//! command line whose arguments may contain `{node}` (the scheduler's node
//! name) and, for drains, `{reason}`. Commands run without a shell, so the
//! substituted values stay single arguments.
//!
//! Protocol: exit status 0 is success; [`CommandConfig::unknown_node_exit_code`]
//! means "no such node"; anything else is a failure whose standard error is
//! quoted. The state command prints one JSON object on standard output:
//!
//! ```json
//! {"state": "draining", "reason": "waveguard rollout=7 firmware maintenance",
//!  "reason_set_by": "root", "jobs": 2}
//! ```
//!
//! with `state` one of `in_service`, `draining`, `drained`, `down`,
//! `not_responding`; `reason`, `reason_set_by` and `jobs` (running jobs)
//! optional. The list command prints a JSON array of such objects, each
//! with a `"name"`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use crate::Scheduler;
use crate::error::{ParseError, SchedulerError};
use crate::exec::{Output, Runner};
use crate::name::SchedulerNodeName;
use crate::state::{BaseState, NodeState, Reason, ReasonTag};

/// The configured commands, each an argument vector (program first).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    /// Prints the node's state as JSON. `{node}` is substituted.
    pub state: Vec<String>,
    /// Drains the node. `{node}` and `{reason}` are substituted.
    pub drain: Vec<String>,
    /// Returns the node to service. `{node}` is substituted. Must succeed
    /// when the node is already in service (a replayed resume).
    pub resume: Vec<String>,
    /// Optional: prints every node's state as a JSON array (used by the
    /// periodic check for drains left behind).
    #[serde(default)]
    pub list: Option<Vec<String>>,
    /// Exit status meaning "no such node" (default 3).
    #[serde(default = "default_unknown_exit")]
    pub unknown_node_exit_code: i32,
    /// Per-command time limit in seconds (default 30).
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
}

fn default_unknown_exit() -> i32 {
    3
}

fn default_timeout() -> u64 {
    30
}

/// A scheduler driven by the site's own commands.
#[derive(Debug, Clone)]
pub struct CommandScheduler {
    config: CommandConfig,
    runner: Runner,
}

impl CommandScheduler {
    /// Checks the configuration: every command has a program, which is a
    /// literal (not a placeholder).
    pub fn new(config: CommandConfig) -> Result<Self, SchedulerError> {
        let mut commands = vec![
            ("state", &config.state),
            ("drain", &config.drain),
            ("resume", &config.resume),
        ];
        if let Some(list) = &config.list {
            commands.push(("list", list));
        }
        for (what, argv) in commands {
            match argv.first() {
                None => {
                    return Err(SchedulerError::Config {
                        detail: format!("the {what} command is empty"),
                    });
                }
                Some(program) if program.contains('{') => {
                    return Err(SchedulerError::Config {
                        detail: format!("the {what} command's program {program:?} must be literal, not a placeholder"),
                    });
                }
                Some(_) => {}
            }
        }
        if !config.drain.iter().any(|a| a.contains("{reason}")) {
            return Err(SchedulerError::Config {
                detail: "the drain command must pass {reason}: it carries the rollout id operators see".to_owned(),
            });
        }
        let runner = Runner {
            timeout: Duration::from_secs(config.timeout_seconds.max(1)),
            env: Vec::new(),
        };
        Ok(Self { config, runner })
    }

    async fn run(
        &self,
        what: &str,
        argv: &[String],
        node: Option<&SchedulerNodeName>,
        reason: Option<&str>,
    ) -> Result<Output, SchedulerError> {
        let args: Vec<String> = argv[1..]
            .iter()
            .map(|a| {
                let a = match node {
                    Some(n) => a.replace("{node}", n.as_str()),
                    None => a.clone(),
                };
                match reason {
                    Some(r) => a.replace("{reason}", r),
                    None => a,
                }
            })
            .collect();
        let program = Path::new(&argv[0]);
        let out = self.runner.run(program, &args).await?;
        if out.success() {
            return Ok(out);
        }
        if let Some(node) = node
            && out.code == Some(self.config.unknown_node_exit_code)
        {
            return Err(SchedulerError::UnknownNode { node: node.to_string() });
        }
        Err(SchedulerError::Failed {
            program: PathBuf::from(program),
            action: match node {
                Some(n) => format!("{what} {n}"),
                None => what.to_owned(),
            },
            status: out.status,
            stderr: out.stderr,
        })
    }
}

const WHAT: &str = "command adapter state";

#[derive(Debug, Deserialize)]
struct Reported {
    #[serde(default)]
    name: Option<String>,
    state: ReportedState,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    reason_set_by: Option<String>,
    #[serde(default)]
    jobs: Option<u32>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ReportedState {
    InService,
    Draining,
    Drained,
    Down,
    NotResponding,
}

impl Reported {
    fn into_state(self, name: String) -> NodeState {
        let jobs = self.jobs.unwrap_or(0);
        let (base, drain, responding) = match self.state {
            ReportedState::InService if jobs > 0 => (BaseState::Allocated, false, true),
            ReportedState::InService => (BaseState::Idle, false, true),
            // Draining with no job count still means "not empty yet".
            ReportedState::Draining => (BaseState::Allocated, true, true),
            ReportedState::Drained => (BaseState::Idle, true, true),
            ReportedState::Down => (BaseState::Down, false, true),
            ReportedState::NotResponding => (BaseState::Unknown, false, false),
        };
        let alloc_cpus = match self.state {
            ReportedState::Draining => jobs.max(1),
            _ => jobs,
        };
        NodeState {
            name,
            base,
            drain,
            responding,
            completing: false,
            reboot_pending: false,
            alloc_cpus,
            reason: self.reason.filter(|r| !r.is_empty()).map(|text| Reason {
                text,
                set_by: self.reason_set_by,
                set_at: None,
            }),
            boot_time: None,
        }
    }
}

/// Parses the state command's output for `node`.
pub fn parse_command_state(node: &str, text: &str) -> Result<NodeState, ParseError> {
    let reported: Reported = serde_json::from_str(text).map_err(|source| ParseError::Json { what: WHAT, source })?;
    Ok(reported.into_state(node.to_owned()))
}

/// Parses the list command's output.
pub fn parse_command_list(text: &str) -> Result<Vec<NodeState>, ParseError> {
    let reported: Vec<Reported> =
        serde_json::from_str(text).map_err(|source| ParseError::Json { what: WHAT, source })?;
    reported
        .into_iter()
        .map(|r| {
            let name = r.name.clone().ok_or(ParseError::Field {
                what: WHAT,
                detail: "a listed node has no \"name\"".to_owned(),
            })?;
            Ok(r.into_state(name))
        })
        .collect()
}

#[async_trait]
impl Scheduler for CommandScheduler {
    fn kind(&self) -> &'static str {
        "command"
    }

    async fn node_state(&self, node: &SchedulerNodeName) -> Result<NodeState, SchedulerError> {
        let out = self.run("state", &self.config.state, Some(node), None).await?;
        parse_command_state(node.as_str(), &out.stdout).map_err(|source| SchedulerError::Parse {
            node: node.to_string(),
            source,
        })
    }

    fn can_list(&self) -> bool {
        self.config.list.is_some()
    }

    async fn all_states(&self) -> Result<Vec<NodeState>, SchedulerError> {
        let Some(list) = &self.config.list else {
            return Err(SchedulerError::Config {
                detail: "no list command configured".to_owned(),
            });
        };
        let out = self.run("list", list, None, None).await?;
        parse_command_list(&out.stdout).map_err(|source| SchedulerError::Parse {
            node: "*".to_owned(),
            source,
        })
    }

    async fn drain(&self, node: &SchedulerNodeName, reason: &ReasonTag) -> Result<(), SchedulerError> {
        self.run("drain", &self.config.drain, Some(node), Some(&reason.render()))
            .await
            .map(drop)
    }

    async fn resume(&self, node: &SchedulerNodeName) -> Result<(), SchedulerError> {
        self.run("resume", &self.config.resume, Some(node), None)
            .await
            .map(drop)
    }
}
