//! The scheduler section of the controller's configuration, ready for
//! `serve` to read (TOML `[scheduler]`), and building the adapter from it.
//!
//! ```toml
//! [scheduler]
//! kind = "slurm"                       # or "command"
//! [scheduler.slurm]
//! slurm_conf = "/etc/slurm/slurm.conf" # optional; default: the system's
//! state_source = "sinfo_json"          # or "scontrol_show_node"
//! timeout_seconds = 30
//! [scheduler.names]
//! template = "{short}"                 # {node}: Waveguard name, {short}: before the first dot
//! explicit = { "odd-host.dc1" = "r12u07" }
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::Scheduler;
use crate::command::{CommandConfig, CommandScheduler};
use crate::error::SchedulerError;
use crate::name::NameMapping;
use crate::slurm::{SlurmConfig, SlurmScheduler, StateSource};

/// Which adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchedulerKind {
    /// Slurm through its client commands.
    Slurm,
    /// Site-configured commands.
    Command,
}

/// `[scheduler]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerSettings {
    /// Which adapter.
    pub kind: SchedulerKind,
    /// `[scheduler.slurm]` (used when `kind = "slurm"`).
    #[serde(default)]
    pub slurm: SlurmSettings,
    /// `[scheduler.command]` (required when `kind = "command"`).
    #[serde(default)]
    pub command: Option<CommandConfig>,
    /// `[scheduler.names]`: Waveguard node name -> scheduler node name.
    #[serde(default)]
    pub names: NameMapping,
}

/// `[scheduler.slurm]`; every field optional.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmSettings {
    /// `scontrol` program.
    pub scontrol: PathBuf,
    /// `sinfo` program.
    pub sinfo: PathBuf,
    /// `SLURM_CONF` for the commands.
    pub slurm_conf: Option<PathBuf>,
    /// `sinfo_json` (default) or `scontrol_show_node`.
    pub state_source: StateSource,
    /// Per-command limit.
    pub timeout_seconds: u64,
}

impl Default for SlurmSettings {
    fn default() -> Self {
        let d = SlurmConfig::default();
        Self {
            scontrol: d.scontrol,
            sinfo: d.sinfo,
            slurm_conf: d.slurm_conf,
            state_source: d.state_source,
            timeout_seconds: d.timeout.as_secs(),
        }
    }
}

impl SchedulerSettings {
    /// Builds the configured adapter.
    pub fn build(&self) -> Result<Arc<dyn Scheduler>, SchedulerError> {
        match self.kind {
            SchedulerKind::Slurm => {
                let s = &self.slurm;
                Ok(Arc::new(SlurmScheduler::new(SlurmConfig {
                    scontrol: s.scontrol.clone(),
                    sinfo: s.sinfo.clone(),
                    slurm_conf: s.slurm_conf.clone(),
                    state_source: s.state_source,
                    timeout: Duration::from_secs(s.timeout_seconds.max(1)),
                })))
            }
            SchedulerKind::Command => {
                let config = self.command.clone().ok_or_else(|| SchedulerError::Config {
                    detail: "kind = \"command\" needs a [scheduler.command] section".to_owned(),
                })?;
                Ok(Arc::new(CommandScheduler::new(config)?))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SchedulerSettings, toml::de::Error> {
        #[derive(Deserialize)]
        struct Top {
            scheduler: SchedulerSettings,
        }
        toml::from_str::<Top>(text).map(|t| t.scheduler)
    }

    #[test]
    fn slurm_settings_with_defaults_and_name_mapping() {
        let s = parse(
            r#"
            [scheduler]
            kind = "slurm"
            [scheduler.slurm]
            slurm_conf = "/etc/slurm/slurm.conf"
            state_source = "scontrol_show_node"
            [scheduler.names]
            template = "{short}"
            explicit = { "odd.dc1" = "r12u07" }
            "#,
        )
        .unwrap();
        assert_eq!(s.kind, SchedulerKind::Slurm);
        assert_eq!(s.slurm.state_source, StateSource::ScontrolShowNode);
        assert_eq!(s.slurm.timeout_seconds, 30);
        assert_eq!(s.slurm.scontrol, PathBuf::from("scontrol"));
        assert_eq!(s.names.map("gpu-1.dc1").unwrap().as_str(), "gpu-1");
        assert_eq!(s.names.map("odd.dc1").unwrap().as_str(), "r12u07");
        assert_eq!(s.build().unwrap().kind(), "slurm");
    }

    #[test]
    fn command_settings_and_refusals() {
        let s = parse(
            r#"
            [scheduler]
            kind = "command"
            [scheduler.command]
            state = ["/usr/local/bin/sched", "state", "{node}"]
            drain = ["/usr/local/bin/sched", "drain", "{node}", "{reason}"]
            resume = ["/usr/local/bin/sched", "resume", "{node}"]
            "#,
        )
        .unwrap();
        assert_eq!(s.build().unwrap().kind(), "command");
        assert_eq!(s.names, NameMapping::default());

        let missing = parse("[scheduler]\nkind = \"command\"\n").unwrap();
        assert!(matches!(missing.build(), Err(SchedulerError::Config { .. })));
        assert!(parse("[scheduler]\nkind = \"kubernetes\"\n").is_err());
        assert!(parse("[scheduler]\nkind = \"slurm\"\n[scheduler.slurm]\nscontrl = \"x\"\n").is_err());
    }
}
