//! Configuration: built-in defaults, then a TOML file, then environment
//! variables, then command-line flags — each overriding the one before.
//! Clap reads flags and their `WAVEGUARD_*` variables together; the file
//! only fills in what neither gave.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
pub use orchestrator_engine::bmc_access::CredentialSource;
use serde::Deserialize;

/// The database used when nothing else is configured: a file beside the
/// working directory, created on first start.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://waveguard.db";

/// Loopback by default: the API must be put behind TLS and authentication
/// deliberately, not exposed by accident.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// The configuration file's shape. Every key is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub database_url: Option<String>,
    pub listen: Option<SocketAddr>,
    pub log_format: Option<LogFormat>,
    pub log_level: Option<String>,
    /// Named BMC credentials that nodes refer to by `credential_ref`.
    #[serde(default)]
    pub credentials: BTreeMap<String, CredentialSource>,
    /// Where rollout policies come from.
    pub policy: Option<PolicySourceConfig>,
    /// The Alertmanager webhook receiver; without it no alert is accepted.
    pub alertmanager: Option<AlertmanagerConfig>,
    /// The workload scheduler nodes are drained through before a flash
    /// (`[scheduler]`, see `orchestrator_scheduler::config`); without it
    /// nodes are flashed as they are.
    pub scheduler: Option<orchestrator_scheduler::config::SchedulerSettings>,
    /// The RMA monitor (`[rma]`): parts discovery, candidates, defect clusters.
    pub rma: Option<RmaSection>,
    /// `[bmc]`: the bound on the controller's open BMC connections.
    pub bmc: Option<BmcSection>,
    /// `[retention]`: when health samples are reduced to daily aggregates.
    pub retention: Option<RetentionSection>,
}

/// `[retention]`: health-sample retention (`orchestrator_engine::retention`), run by the
/// executor-lease holder. Hourly health windows nothing refers to any more (a finished rollout
/// whose evidence package is stored, no open RMA case on the node, no pre-period baseline of an
/// unfinished rollout) are reduced to per-node daily aggregates once older than `raw_days`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSection {
    /// Days hourly windows are kept before they may be reduced (default 14, at least 1).
    pub raw_days: Option<u32>,
    /// How far before an unfinished rollout's start its nodes' windows are kept as a pre-period
    /// baseline, e.g. `7d` (the default).
    pub pre_period: Option<String>,
    /// Real time between passes, e.g. `10m` (the default).
    pub interval: Option<String>,
    /// Hourly windows reduced per transaction (default 2000).
    pub batch: Option<u64>,
    /// Transactions per pass (default 10): bounds one pass's work.
    pub batches_per_pass: Option<u32>,
}

impl RetentionSection {
    /// The job's configuration: the defaults with the section's keys over them.
    pub fn job_config(
        section: Option<&RetentionSection>,
    ) -> anyhow::Result<orchestrator_engine::retention::RetentionConfig> {
        let mut config = orchestrator_engine::retention::RetentionConfig::default();
        let Some(section) = section else {
            return Ok(config);
        };
        if let Some(days) = section.raw_days {
            anyhow::ensure!(days >= 1, "[retention] raw_days: must be at least 1");
            config.raw_days = days;
        }
        let duration = |key: &str, text: &Option<String>| -> anyhow::Result<Option<chrono::TimeDelta>> {
            text.as_deref()
                .map(|t| orchestrator_policy::parse_duration(t).map_err(|e| anyhow::anyhow!("[retention] {key}: {e}")))
                .transpose()
        };
        if let Some(d) = duration("pre_period", &section.pre_period)? {
            config.pre_period = d;
        }
        if let Some(d) = duration("interval", &section.interval)? {
            config.pass_interval = d
                .to_std()
                .ok()
                .filter(|d| !d.is_zero())
                .context("[retention] interval: must be positive")?;
        }
        if let Some(batch) = section.batch {
            anyhow::ensure!(batch >= 1, "[retention] batch: must be at least 1");
            config.batch = batch;
        }
        if let Some(batches) = section.batches_per_pass {
            anyhow::ensure!(batches >= 1, "[retention] batches_per_pass: must be at least 1");
            config.batches_per_pass = batches;
        }
        Ok(config)
    }
}

/// `[bmc]`: how many connections to BMCs the controller keeps open at once, fleet-wide (the engine,
/// the health collector and the RMA monitor share them). By default the soft open-file limit less a
/// reserve for everything else, at most [`orchestrator_bmc::DEFAULT_MAX_CONNECTIONS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcSection {
    /// An explicit bound (at least 2).
    pub max_connections: Option<usize>,
    /// Descriptors kept out of the bound for the database, listeners and files (default 256, or a
    /// quarter of a smaller open-file limit).
    pub file_reserve: Option<u64>,
}

impl BmcSection {
    /// The bound: `flag` (command line or environment), else the file's `max_connections`, else the
    /// soft open-file limit less the reserve.
    pub fn connection_limit(
        section: Option<&BmcSection>,
        flag: Option<usize>,
    ) -> anyhow::Result<orchestrator_bmc::ConnectionLimit> {
        let section = section.copied().unwrap_or_default();
        let limit = match flag.or(section.max_connections) {
            Some(n) => orchestrator_bmc::ConnectionLimit::new(n).context("[bmc] max_connections")?,
            None => orchestrator_bmc::ConnectionLimit::from_open_files(section.file_reserve)
                .context("sizing the BMC connection bound from the open-file limit")?,
        };
        Ok(limit)
    }
}

/// `[rma]`: the RMA monitor's settings. It runs unless `enabled = false`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RmaSection {
    /// Run the monitor (default true).
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Real time between passes, e.g. `60s` (the default).
    #[serde(default)]
    pub interval: Option<String>,
    /// Pull the BMC's diagnostic data into a new case (default true).
    #[serde(default)]
    pub collect_diagnostics: Option<bool>,
    /// Length of the fixed periods the defect-cluster scan tests, e.g. `7d` (the default).
    #[serde(default)]
    pub cluster_period: Option<String>,
    /// Samples older than this are deleted unless an open case holds them, e.g. `30d`.
    #[serde(default)]
    pub retention: Option<String>,
}

impl RmaSection {
    /// The monitor's configuration, or `None` when disabled.
    pub fn monitor_config(section: Option<&RmaSection>) -> anyhow::Result<Option<orchestrator_engine::rma::RmaConfig>> {
        let mut config = orchestrator_engine::rma::RmaConfig::default();
        let Some(section) = section else {
            return Ok(Some(config));
        };
        if section.enabled == Some(false) {
            return Ok(None);
        }
        let duration = |key: &str, text: &Option<String>| -> anyhow::Result<Option<chrono::TimeDelta>> {
            text.as_deref()
                .map(|t| orchestrator_policy::parse_duration(t).map_err(|e| anyhow::anyhow!("[rma] {key}: {e}")))
                .transpose()
        };
        if let Some(d) = duration("interval", &section.interval)? {
            config.pass_interval = d
                .to_std()
                .ok()
                .filter(|d| !d.is_zero())
                .context("[rma] interval: must be positive")?;
        }
        if let Some(d) = duration("cluster_period", &section.cluster_period)? {
            anyhow::ensure!(
                d >= chrono::TimeDelta::hours(1),
                "[rma] cluster_period: must be at least 1h"
            );
            config.cluster_period = d;
        }
        if let Some(d) = duration("retention", &section.retention)? {
            anyhow::ensure!(
                d >= config.lookback,
                "[rma] retention: must be at least the rules' lookback (16d)"
            );
            config.retention = d;
        }
        if let Some(collect) = section.collect_diagnostics {
            config.collect_diagnostics = collect;
        }
        Ok(Some(config))
    }
}

/// A git repository of policy files.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySourceConfig {
    /// A local path or a URL.
    pub repo: String,
    /// Branch, tag or commit; default `main`.
    #[serde(default = "default_ref", rename = "ref")]
    pub git_ref: String,
    /// Directory inside the repository holding the policies; default the root.
    #[serde(default)]
    pub path: Option<String>,
    /// How often `serve` syncs, e.g. `60s`.
    #[serde(default = "default_sync_interval")]
    pub sync_interval: String,
    /// Where URL repositories are cloned for a sync (a fresh directory per
    /// sync, removed afterwards); default a directory under the system
    /// temporary directory.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
}

/// The Alertmanager webhook receiver (`POST /api/v1/alerts/alertmanager`).
/// The bearer token is never in the file: only the name of the environment
/// variable holding it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerConfig {
    /// Environment variable holding the token Alertmanager sends as
    /// `Authorization: Bearer ...` (`http_config.authorization`).
    pub token_env: Option<String>,
    /// The alert label naming the node; default `node`.
    #[serde(default)]
    pub node_label: Option<String>,
    /// How long after its flash a node still counts as recently updated,
    /// e.g. `24h` (the default).
    #[serde(default)]
    pub recent: Option<String>,
}

fn default_ref() -> String {
    "main".into()
}

fn default_sync_interval() -> String {
    "60s".into()
}

impl FileConfig {
    /// Reads and parses a TOML configuration file.
    pub fn load(path: &Path) -> anyhow::Result<FileConfig> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).map_err(|err| anyhow::anyhow!("{}: {}", path.display(), err.to_string().trim_end()))
    }
}

/// The settings in force after every source is merged.
#[derive(Debug, Clone)]
pub struct Config {
    pub database_url: String,
    pub listen: SocketAddr,
    pub log_format: LogFormat,
    pub log_level: String,
    pub credentials: BTreeMap<String, CredentialSource>,
    pub policy: Option<PolicySourceConfig>,
    pub alertmanager: Option<AlertmanagerConfig>,
    pub scheduler: Option<orchestrator_scheduler::config::SchedulerSettings>,
    pub rma: Option<RmaSection>,
    pub bmc: Option<BmcSection>,
    pub retention: Option<RetentionSection>,
}

/// Values given on the command line or in the environment (clap merges
/// those two).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub database_url: Option<String>,
    pub listen: Option<SocketAddr>,
    pub log_format: Option<LogFormat>,
    pub log_level: Option<String>,
}

impl Config {
    /// Merges overrides over the file over the defaults.
    pub fn merge(file: FileConfig, overrides: Overrides) -> anyhow::Result<Config> {
        let listen = match overrides.listen.or(file.listen) {
            Some(addr) => addr,
            None => DEFAULT_LISTEN.parse().context("default listen address")?,
        };
        Ok(Config {
            database_url: overrides
                .database_url
                .or(file.database_url)
                .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned()),
            listen,
            log_format: overrides.log_format.or(file.log_format).unwrap_or_default(),
            log_level: overrides
                .log_level
                .or(file.log_level)
                .unwrap_or_else(|| "info".to_owned()),
            credentials: file.credentials,
            policy: file.policy,
            alertmanager: file.alertmanager,
            scheduler: file.scheduler,
            rma: file.rma,
            bmc: file.bmc,
            retention: file.retention,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bmc_section_bounds_connections_and_the_flag_wins() {
        let file: FileConfig = toml::from_str("[bmc]\nmax_connections = 512\n").expect("parses");
        let section = file.bmc.expect("bmc section");
        let limit = BmcSection::connection_limit(Some(&section), None).expect("limit");
        assert_eq!(limit.connections(), 512);
        let limit = BmcSection::connection_limit(Some(&section), Some(64)).expect("limit");
        assert_eq!(limit.connections(), 64);
        let err = BmcSection::connection_limit(Some(&section), Some(1)).unwrap_err();
        assert!(format!("{err:#}").contains("at least 2"), "{err:#}");
        assert!(toml::from_str::<FileConfig>("[bmc]\nmax_conections = 5\n").is_err());
    }

    #[test]
    fn the_retention_section_sets_the_job_and_refuses_nonsense() {
        let section = |text: &str| toml::from_str::<FileConfig>(text).unwrap().retention;
        let default = RetentionSection::job_config(None).unwrap();
        assert_eq!(default.raw_days, orchestrator_engine::retention::DEFAULT_RAW_DAYS);
        let set = section("[retention]\nraw_days = 3\npre_period = \"2d\"\ninterval = \"1m\"\nbatch = 10\n");
        let config = RetentionSection::job_config(set.as_ref()).unwrap();
        assert_eq!(config.raw_days, 3);
        assert_eq!(config.pre_period, chrono::TimeDelta::days(2));
        assert_eq!(config.pass_interval, std::time::Duration::from_secs(60));
        assert_eq!(config.batch, 10);
        for bad in [
            "raw_days = 0",
            "pre_period = \"soon\"",
            "interval = \"0s\"",
            "batch = 0",
        ] {
            let err = RetentionSection::job_config(section(&format!("[retention]\n{bad}\n")).as_ref()).unwrap_err();
            assert!(err.to_string().starts_with("[retention] "), "{err}");
        }
        assert!(toml::from_str::<FileConfig>("[retention]\nraw_day = 3\n").is_err());
    }

    #[test]
    fn the_rma_section_sets_the_monitor_or_turns_it_off() {
        let section = |text: &str| toml::from_str::<FileConfig>(text).unwrap().rma;
        let default = RmaSection::monitor_config(None).unwrap().expect("on by default");
        assert!(default.collect_diagnostics);
        let set = section("[rma]\ninterval = \"5m\"\ncluster_period = \"1d\"\ncollect_diagnostics = false\n");
        let config = RmaSection::monitor_config(set.as_ref()).unwrap().unwrap();
        assert_eq!(config.pass_interval, std::time::Duration::from_secs(300));
        assert_eq!(config.cluster_period, chrono::TimeDelta::days(1));
        assert!(!config.collect_diagnostics);
        let off = section("[rma]\nenabled = false\n");
        assert!(RmaSection::monitor_config(off.as_ref()).unwrap().is_none());
        for bad in ["interval = \"soon\"", "cluster_period = \"5m\"", "retention = \"1d\""] {
            let err = RmaSection::monitor_config(section(&format!("[rma]\n{bad}\n")).as_ref()).unwrap_err();
            assert!(err.to_string().starts_with("[rma] "), "{err}");
        }
        assert!(
            toml::from_str::<FileConfig>("[rma]\nintervall = \"5m\"\n").is_err(),
            "a typo is refused"
        );
    }

    #[test]
    fn flags_and_environment_override_the_file_which_overrides_defaults() {
        let file: FileConfig = toml::from_str(
            r#"
            database_url = "postgres://wg@db/wg"
            listen = "0.0.0.0:9000"
            log_format = "json"
            [credentials.lab]
            username = "admin"
            password_env = "LAB_BMC_PASSWORD"
            "#,
        )
        .unwrap();
        let merged = Config::merge(file.clone(), Overrides::default()).unwrap();
        assert_eq!(merged.database_url, "postgres://wg@db/wg");
        assert_eq!(merged.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(merged.log_format, LogFormat::Json);
        assert_eq!(
            merged.credentials["lab"].password_env.as_deref(),
            Some("LAB_BMC_PASSWORD")
        );
        let overridden = Config::merge(
            file,
            Overrides {
                database_url: Some("sqlite://x.db".into()),
                listen: None,
                log_format: Some(LogFormat::Text),
                log_level: None,
            },
        )
        .unwrap();
        assert_eq!(overridden.database_url, "sqlite://x.db");
        assert_eq!(overridden.log_format, LogFormat::Text);
        let defaults = Config::merge(FileConfig::default(), Overrides::default()).unwrap();
        assert_eq!(defaults.database_url, DEFAULT_DATABASE_URL);
        assert_eq!(defaults.listen.to_string(), DEFAULT_LISTEN);
    }

    #[test]
    fn the_alertmanager_section_names_the_token_variable_not_the_token() {
        let file: FileConfig = toml::from_str(
            r#"
            [alertmanager]
            token_env = "WAVEGUARD_ALERTMANAGER_TOKEN"
            node_label = "hostname"
            recent = "12h"
            "#,
        )
        .unwrap();
        let merged = Config::merge(file, Overrides::default()).unwrap();
        let am = merged.alertmanager.unwrap();
        assert_eq!(am.token_env.as_deref(), Some("WAVEGUARD_ALERTMANAGER_TOKEN"));
        assert_eq!(am.node_label.as_deref(), Some("hostname"));
        assert_eq!(am.recent.as_deref(), Some("12h"));
        let err = toml::from_str::<FileConfig>("[alertmanager]\ntoken = \"abc\"\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `token`"), "{err}");
    }

    #[test]
    fn the_scheduler_section_configures_draining_through_slurm() {
        let file: FileConfig = toml::from_str(
            r#"
            [scheduler]
            kind = "slurm"
            [scheduler.slurm]
            slurm_conf = "/etc/slurm/slurm.conf"
            [scheduler.names]
            template = "{short}"
            "#,
        )
        .unwrap();
        let merged = Config::merge(file, Overrides::default()).unwrap();
        let scheduler = merged.scheduler.expect("scheduler section");
        assert_eq!(scheduler.names.map("gpu-01.dc1").unwrap().as_str(), "gpu-01");
        assert!(scheduler.build().is_ok());
        let err = toml::from_str::<FileConfig>(
            "[scheduler]
kind = \"slurm\"
slurm_conf = \"x\"
",
        )
        .unwrap_err();
        assert!(err.to_string().contains("unknown field `slurm_conf`"), "{err}");
    }

    #[test]
    fn a_typo_in_the_file_is_an_error_with_its_position() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("waveguard.toml");
        std::fs::write(&path, "databse_url = \"x\"\n").unwrap();
        let err = FileConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("line 1, column 1"), "{err}");
        assert!(err.contains("unknown field `databse_url`"), "{err}");
    }
}
