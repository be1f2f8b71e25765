//! The Slurm adapter: `scontrol` for changes, `sinfo --json` (or
//! `scontrol show node`) for state. slurmrestd is not used: in 22.05 it
//! cannot update nodes and refuses to run as root.

mod parse;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;

pub use self::parse::{parse_scontrol_show_node, parse_sinfo_json};
use crate::Scheduler;
use crate::error::SchedulerError;
use crate::exec::{Output, Runner};
use crate::name::SchedulerNodeName;
use crate::state::{BaseState, NodeState, ReasonTag};

/// Where node state is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateSource {
    /// `sinfo --json`: structured, with the reason's user and Unix time.
    /// Lists the whole cluster on every call (22.05 ignores `--nodes`
    /// with `--json`).
    #[default]
    SinfoJson,
    /// `scontrol show node NAME`: one node per call, text.
    ScontrolShowNode,
}

/// How to reach Slurm.
#[derive(Debug, Clone)]
pub struct SlurmConfig {
    /// The `scontrol` program (default: found on `PATH`).
    pub scontrol: PathBuf,
    /// The `sinfo` program.
    pub sinfo: PathBuf,
    /// `SLURM_CONF` for the commands, when not the system's.
    pub slurm_conf: Option<PathBuf>,
    /// Where state comes from.
    pub state_source: StateSource,
    /// Per-command time limit: a hung slurmctld must not hang a pass.
    pub timeout: Duration,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        Self {
            scontrol: PathBuf::from("scontrol"),
            sinfo: PathBuf::from("sinfo"),
            slurm_conf: None,
            state_source: StateSource::default(),
            timeout: Duration::from_secs(30),
        }
    }
}

/// A Slurm cluster, driven through its client commands.
#[derive(Debug, Clone)]
pub struct SlurmScheduler {
    config: SlurmConfig,
    runner: Runner,
}

impl SlurmScheduler {
    /// An adapter for the cluster `config` reaches.
    pub fn new(config: SlurmConfig) -> Self {
        let env = config
            .slurm_conf
            .iter()
            .map(|p| ("SLURM_CONF".to_owned(), p.display().to_string()))
            .collect();
        let runner = Runner {
            timeout: config.timeout,
            env,
        };
        Self { config, runner }
    }

    async fn scontrol(&self, action: &str, args: &[String]) -> Result<Output, SchedulerError> {
        let out = self.runner.run(&self.config.scontrol, args).await?;
        if out.success() {
            return Ok(out);
        }
        Err(SchedulerError::Failed {
            program: self.config.scontrol.clone(),
            action: action.to_owned(),
            status: out.status,
            stderr: out.stderr,
        })
    }

    async fn sinfo_all(&self) -> Result<Vec<NodeState>, SchedulerError> {
        let out = self.runner.run(&self.config.sinfo, &["--json".to_owned()]).await?;
        if !out.success() {
            return Err(SchedulerError::Failed {
                program: self.config.sinfo.clone(),
                action: "--json".to_owned(),
                status: out.status,
                stderr: out.stderr,
            });
        }
        parse_sinfo_json(&out.stdout).map_err(|source| SchedulerError::Parse {
            node: "*".to_owned(),
            source,
        })
    }

    async fn show_node(&self, node: Option<&SchedulerNodeName>) -> Result<Vec<NodeState>, SchedulerError> {
        let mut args = vec!["show".to_owned(), "node".to_owned()];
        if let Some(node) = node {
            args.push(node.as_str().to_owned());
        }
        let out = self.runner.run(&self.config.scontrol, &args).await?;
        if !out.success() {
            if let Some(node) = node
                && (out.stdout.contains("not found") || out.stderr.contains("not found"))
            {
                return Err(SchedulerError::UnknownNode { node: node.to_string() });
            }
            return Err(SchedulerError::Failed {
                program: self.config.scontrol.clone(),
                action: args.join(" "),
                status: out.status,
                stderr: out.stderr,
            });
        }
        parse_scontrol_show_node(&out.stdout).map_err(|source| SchedulerError::Parse {
            node: node.map_or_else(|| "*".to_owned(), ToString::to_string),
            source,
        })
    }
}

#[async_trait]
impl Scheduler for SlurmScheduler {
    fn kind(&self) -> &'static str {
        "slurm"
    }

    async fn node_state(&self, node: &SchedulerNodeName) -> Result<NodeState, SchedulerError> {
        let nodes = match self.config.state_source {
            StateSource::SinfoJson => self.sinfo_all().await?,
            StateSource::ScontrolShowNode => self.show_node(Some(node)).await?,
        };
        nodes
            .into_iter()
            .find(|n| n.name == node.as_str())
            .ok_or_else(|| SchedulerError::UnknownNode { node: node.to_string() })
    }

    async fn all_states(&self) -> Result<Vec<NodeState>, SchedulerError> {
        match self.config.state_source {
            StateSource::SinfoJson => self.sinfo_all().await,
            StateSource::ScontrolShowNode => self.show_node(None).await,
        }
    }

    async fn drain(&self, node: &SchedulerNodeName, reason: &ReasonTag) -> Result<(), SchedulerError> {
        // One argument per keyword: scontrol takes the rest of `Reason=...`
        // as the reason, spaces included, and no shell is involved.
        let args = vec![
            "update".to_owned(),
            format!("NodeName={node}"),
            "State=DRAIN".to_owned(),
            format!("Reason={}", reason.render()),
        ];
        self.scontrol(&format!("drain {node}"), &args).await.map(drop)
    }

    async fn resume(&self, node: &SchedulerNodeName) -> Result<(), SchedulerError> {
        let args = vec![
            "update".to_owned(),
            format!("NodeName={node}"),
            "State=RESUME".to_owned(),
        ];
        match self.scontrol(&format!("resume {node}"), &args).await {
            Ok(_) => Ok(()),
            Err(err) => {
                // scontrol refuses RESUME of a node that is not drained or
                // down ("Invalid node state specified"): a replayed resume
                // whose first attempt landed. Idempotent only in that case.
                // Right after a RESUME Slurm shows the node `idle*` until
                // it pings it, so responding is not required here.
                match self.node_state(node).await {
                    Ok(state) if !state.drain && state.base != BaseState::Down => Ok(()),
                    _ => Err(err),
                }
            }
        }
    }
}
