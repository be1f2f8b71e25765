//! Where the policies' `source: prometheus` gates read their data: one set of flags for every command
//! that talks to Prometheus (`serve`, `rollout start`), so both build the same client.

use orchestrator_engine::prometheus::{PrometheusClient, PrometheusConfig};

use super::BadInput;

/// Prometheus connection flags.
#[derive(Debug, clap::Args)]
pub struct PrometheusArgs {
    /// Prometheus server whose data the policies' `source: prometheus`
    /// health gates query (series mapped to nodes by their `node` label).
    /// Without it those gates hold their waves for a human.
    #[arg(long, env = "WAVEGUARD_PROMETHEUS_URL", value_name = "URL")]
    pub prometheus_url: Option<url::Url>,
    /// The Prometheus series label whose value is a node's name.
    #[arg(
        long,
        env = "WAVEGUARD_PROMETHEUS_NODE_LABEL",
        value_name = "LABEL",
        default_value = "node",
        requires = "prometheus_url"
    )]
    pub prometheus_node_label: String,
    /// Environment variable holding a bearer token for Prometheus (sent as
    /// `Authorization: Bearer`, never logged).
    #[arg(
        long,
        env = "WAVEGUARD_PROMETHEUS_TOKEN_ENV",
        value_name = "VAR",
        requires = "prometheus_url"
    )]
    pub prometheus_token_env: Option<String>,
    /// How long a counter series may go without a sample before its node
    /// counts as gone (a canary's gate errors, naming it; a control node is
    /// left out). A few scrape intervals at least; Prometheus' own lookback
    /// is the default.
    #[arg(
        long,
        env = "WAVEGUARD_PROMETHEUS_STALENESS",
        value_name = "DURATION",
        default_value = "5m",
        requires = "prometheus_url"
    )]
    pub prometheus_staleness: String,
}

impl PrometheusArgs {
    /// The Prometheus client for the policies' `source: prometheus` gates, if
    /// a server is configured. Errors name the variable, never the token.
    pub fn client(&self) -> anyhow::Result<Option<PrometheusClient>> {
        let Some(url) = &self.prometheus_url else {
            return Ok(None);
        };
        let label = self.prometheus_node_label.trim();
        if label.is_empty() {
            return Err(BadInput("--prometheus-node-label must not be empty".into()).into());
        }
        let mut config = PrometheusConfig::new(url.clone());
        config.node_label = label.to_owned();
        config.staleness = orchestrator_policy::parse_duration(&self.prometheus_staleness)
            .ok()
            .filter(|d| *d >= chrono::TimeDelta::seconds(1))
            .ok_or_else(|| {
                BadInput(format!(
                    "--prometheus-staleness {:?}: expected a duration of at least 1s such as 30s, 5m",
                    self.prometheus_staleness
                ))
            })?;
        if let Some(var) = &self.prometheus_token_env {
            let token = std::env::var(var)
                .ok()
                .filter(|t| !t.trim().is_empty())
                .ok_or_else(|| BadInput(format!("--prometheus-token-env names {var}, which is not set or empty")))?;
            config.bearer_token = Some(token.trim().to_owned());
        }
        let client =
            PrometheusClient::new(config).map_err(|e| anyhow::anyhow!("cannot build the Prometheus client: {e}"))?;
        Ok(Some(client))
    }
}
