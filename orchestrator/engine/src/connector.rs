use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use orchestrator_bmc::{Bmc, BmcEndpoint, BmcError, HttpClients, RedfishBmc};
use orchestrator_db::execution::PlacedStep;

use crate::bmc_access::AccessError;

/// Why a node's BMC has no endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// The configured credential profiles refuse it (unknown or bad profile,
    /// bad URL, host not bound).
    #[error(transparent)]
    Access(#[from] AccessError),
    /// A resolver of a simulation or test said why, in its own words.
    #[error("{0}")]
    Other(String),
}

impl From<String> for ResolveError {
    fn from(reason: String) -> Self {
        ResolveError::Other(reason)
    }
}

/// Why no driver was handed out for a node's BMC; the step fails with it as
/// its reason, the health collector records it as a poll error.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// No endpoint for the node.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// The driver could not be built for the endpoint (TLS trust, client).
    /// Boxed: a step's result carries it, and most results are not errors.
    #[error(transparent)]
    Driver(Box<BmcError>),
}

impl From<BmcError> for ConnectError {
    fn from(err: BmcError) -> Self {
        ConnectError::Driver(Box::new(err))
    }
}

impl From<String> for ConnectError {
    fn from(reason: String) -> Self {
        ConnectError::Resolve(ResolveError::Other(reason))
    }
}

impl From<&str> for ConnectError {
    fn from(reason: &str) -> Self {
        ConnectError::from(reason.to_owned())
    }
}

/// Where the health collector gets a BMC driver for a node (read-only use: sensors, logs, inventory).
pub trait HealthBmcs: Send + Sync + std::fmt::Debug {
    /// A driver for the BMC at `bmc_url` with credential profile `credential_ref`.
    fn bmc(&self, bmc_url: &str, credential_ref: &str) -> Result<Arc<dyn Bmc>, ConnectError>;
}

/// Where the engine gets a driver for a node's BMC.
pub trait BmcConnector: Send + Sync + std::fmt::Debug {
    /// A driver for the BMC of the step's node; an error says why the node
    /// cannot be addressed (unknown credential profile, bad URL).
    fn connect(&self, step: &PlacedStep) -> Result<Arc<dyn Bmc>, ConnectError>;

    /// Every driver handed out so far, for closing their sessions on shutdown.
    fn drivers(&self) -> Vec<Arc<dyn Bmc>> {
        Vec::new()
    }

    /// Forgets the drivers nobody holds and nobody asked for in the last `idle`, and returns them for
    /// their sessions to be deleted: what the connector keeps follows the BMCs in use, not every BMC it
    /// ever reached.
    fn take_idle(&self, _idle: std::time::Duration) -> Vec<Arc<dyn Bmc>> {
        Vec::new()
    }
}

/// How long shutdown waits for one BMC to delete its session. A BMC that does not answer keeps a
/// session until its own timeout; waiting longer would hold up a restart.
const LOGOUT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Session deletions in flight at once during shutdown.
const LOGOUT_CONCURRENCY: usize = 32;

/// Deletes the session of every driver (BMCs allow a handful of sessions each; a controller that
/// walks away from them locks itself and others out until they expire).
pub async fn logout_all(connector: &dyn BmcConnector) {
    logout_each(connector.drivers()).await;
}

/// Deletes the sessions of the drivers idle for `idle` and forgets them ([`BmcConnector::take_idle`]).
pub async fn logout_idle(connector: &dyn BmcConnector, idle: std::time::Duration) {
    let drivers = connector.take_idle(idle);
    if !drivers.is_empty() {
        tracing::debug!(drivers = drivers.len(), "closing the sessions of idle BMC drivers");
        logout_each(drivers).await;
    }
}

async fn logout_each(drivers: Vec<Arc<dyn Bmc>>) {
    use futures::StreamExt;
    futures::stream::iter(drivers)
        .for_each_concurrent(LOGOUT_CONCURRENCY, |bmc| async move {
            match tokio::time::timeout(LOGOUT_TIMEOUT, bmc.logout()).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::warn!(endpoint = bmc.endpoint(), error = %err, "session not deleted"),
                Err(_) => tracing::warn!(endpoint = bmc.endpoint(), "session deletion timed out"),
            }
        })
        .await;
}

/// Turns a node's BMC URL and credential reference into an endpoint.
pub type EndpointResolver = dyn Fn(&str, &str) -> Result<BmcEndpoint, ResolveError> + Send + Sync;

/// Redfish drivers over one shared connection pool, one driver (and
/// session) per BMC, kept between passes and shared with the health
/// collector ([`HealthBmcs`]); a driver idle for long is logged out and
/// forgotten ([`BmcConnector::take_idle`]), so decommissioned BMCs and
/// finished rollouts do not accumulate.
pub struct RedfishConnector {
    clients: HttpClients,
    resolve: Arc<EndpointResolver>,
    cache: Mutex<HashMap<(String, String), CachedDriver>>,
}

struct CachedDriver {
    bmc: Arc<dyn Bmc>,
    last_used: tokio::time::Instant,
}

impl std::fmt::Debug for RedfishConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishConnector").finish_non_exhaustive()
    }
}

impl RedfishConnector {
    /// `resolve(bmc_url, credential_ref)` builds the endpoint (and reads the secret).
    pub fn new(clients: HttpClients, resolve: Arc<EndpointResolver>) -> Self {
        Self {
            clients,
            resolve,
            cache: Mutex::new(HashMap::new()),
        }
    }
}

impl RedfishConnector {
    /// The bound on open BMC connections every driver here shares, and how much of it is in use.
    pub fn connection_usage(&self) -> orchestrator_bmc::ConnectionUsage {
        self.clients.usage()
    }
}

impl BmcConnector for RedfishConnector {
    fn drivers(&self) -> Vec<Arc<dyn Bmc>> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        cache.values().map(|cached| cached.bmc.clone()).collect()
    }

    fn take_idle(&self, idle: std::time::Duration) -> Vec<Arc<dyn Bmc>> {
        let now = tokio::time::Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut taken = Vec::new();
        // Held elsewhere means a step or a poll is using it now, whatever its age: its session stays.
        cache.retain(|_, cached| {
            let keep = now.duration_since(cached.last_used) < idle || Arc::strong_count(&cached.bmc) > 1;
            if !keep {
                taken.push(cached.bmc.clone());
            }
            keep
        });
        taken
    }

    fn connect(&self, step: &PlacedStep) -> Result<Arc<dyn Bmc>, ConnectError> {
        self.driver(&step.bmc_url, &step.credential_ref)
    }
}

impl RedfishConnector {
    /// The one driver (and so the one session) for the BMC at `bmc_url` reached with the credential
    /// profile `credential_ref`, created on first use. The engine's steps and the health collector both
    /// come here, so a node that is flashed and watched holds one session, and shutdown deletes all.
    pub fn driver(&self, bmc_url: &str, credential_ref: &str) -> Result<Arc<dyn Bmc>, ConnectError> {
        let key = (bmc_url.to_owned(), credential_ref.to_owned());
        let now = tokio::time::Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cached) = cache.get_mut(&key) {
            cached.last_used = now;
            return Ok(cached.bmc.clone());
        }
        let endpoint = (self.resolve)(bmc_url, credential_ref)?;
        let bmc: Arc<dyn Bmc> = Arc::new(RedfishBmc::new(&endpoint, &self.clients)?);
        cache.insert(
            key,
            CachedDriver {
                bmc: bmc.clone(),
                last_used: now,
            },
        );
        Ok(bmc)
    }
}

impl HealthBmcs for RedfishConnector {
    fn bmc(&self, bmc_url: &str, credential_ref: &str) -> Result<Arc<dyn Bmc>, ConnectError> {
        self.driver(bmc_url, credential_ref)
    }
}
