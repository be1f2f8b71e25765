//! Shared HTTP clients: connection pools and parsed trust stores shared between BMCs with the same TLS
//! settings, and the seam through which tests inject the controller's own connect faults.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{BmcEndpoint, TlsTrust};
use crate::error::BmcError;
use crate::limits::PER_BMC_FETCH_CONCURRENCY;

/// How long an idle pooled connection is kept. BMC web servers drop idle connections after ~60 s;
/// reusing a connection they already closed costs a failed attempt, so stay below that. Shorter
/// still, because idle sockets add up across a fleet: discovery passes hundreds of BMCs a second,
/// and every idle socket it leaves behind holds a file descriptor here and a connection slot on
/// the BMC (a 10,000-node discovery with 45 s of idle sockets exhausted a simulator's limits).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

/// Idle connections kept per BMC: as many as one BMC's parallel fetches use, no more.
const POOL_MAX_IDLE_PER_BMC: usize = PER_BMC_FETCH_CONCURRENCY;

/// Shares `reqwest::Client`s (and with them connection pools and parsed trust stores) between BMCs
/// with the same TLS settings: building one per node would reload the trust store ten thousand times.
#[derive(Debug, Default)]
pub struct HttpClients {
    clients: Mutex<HashMap<(TlsTrust, Duration), reqwest::Client>>,
    faults: Option<Arc<dyn ConnectFaults>>,
}

/// The seam where the controller's own connect failures can be injected: consulted before every
/// new connection the clients open, below reqwest and hyper, so an injected error travels the same
/// source chain a real `EMFILE` from `socket(2)` does. Tests use it instead of a process-wide
/// `setrlimit`, which would hit every other test running in the same process.
pub trait ConnectFaults: Send + Sync + std::fmt::Debug {
    /// The error this connection attempt fails with, as the OS would report it; `None` connects.
    fn on_connect(&self) -> Option<std::io::Error>;
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
struct FaultLayer(Arc<dyn ConnectFaults>);

impl<S> tower::Layer<S> for FaultLayer {
    type Service = FaultService<S>;

    fn layer(&self, inner: S) -> FaultService<S> {
        FaultService {
            inner,
            faults: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct FaultService<S> {
    inner: S,
    faults: Arc<dyn ConnectFaults>,
}

impl<S, R> tower::Service<R> for FaultService<S>
where
    S: tower::Service<R, Error = BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        if let Some(err) = self.faults.on_connect() {
            return Box::pin(std::future::ready(Err(Box::new(err) as BoxError)));
        }
        Box::pin(self.inner.call(req))
    }
}

impl HttpClients {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache whose clients consult `faults` before every new connection.
    pub fn with_connect_faults(faults: Arc<dyn ConnectFaults>) -> Self {
        Self {
            clients: Mutex::default(),
            faults: Some(faults),
        }
    }

    pub(crate) fn get(&self, endpoint: &BmcEndpoint, label: &str) -> Result<reqwest::Client, BmcError> {
        let key = (endpoint.tls.clone(), endpoint.timeouts.connect);
        // A poisoned lock only means another thread panicked while inserting; the map is still valid.
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let client = build_client(&endpoint.tls, endpoint.timeouts.connect, label, self.faults.clone())?;
        clients.insert(key, client.clone());
        Ok(client)
    }
}

fn build_client(
    tls: &TlsTrust,
    connect_timeout: Duration,
    label: &str,
    faults: Option<Arc<dyn ConnectFaults>>,
) -> Result<reqwest::Client, BmcError> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE_PER_BMC)
        // Redfish needs no redirects, and following one could carry our X-Auth-Token to another host.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("waveguard-bmc/", env!("CARGO_PKG_VERSION")));
    if let Some(faults) = faults {
        builder = builder.connector_layer(FaultLayer(faults));
    }
    match tls {
        TlsTrust::System => {}
        TlsTrust::CaBundle { path } => {
            let pem = std::fs::read(path).map_err(|e| BmcError::Config {
                endpoint: label.to_string(),
                reason: format!("cannot read CA bundle {}", path.display()),
                source: Some(Box::new(e)),
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| BmcError::Config {
                endpoint: label.to_string(),
                reason: format!("CA bundle {} is not valid PEM", path.display()),
                source: Some(Box::new(e)),
            })?;
            if certs.is_empty() {
                return Err(BmcError::Config {
                    endpoint: label.to_string(),
                    reason: format!("CA bundle {} holds no certificate", path.display()),
                    source: None,
                });
            }
            builder = builder.tls_certs_only(certs);
        }
        TlsTrust::InsecureSkipVerify { reason } => {
            tracing::warn!(endpoint = label, reason, "TLS verification disabled for this BMC");
            builder = builder.tls_danger_accept_invalid_certs(true);
        }
    }
    builder.build().map_err(|e| BmcError::Config {
        endpoint: label.to_string(),
        reason: "cannot build HTTP client".to_string(),
        source: Some(Box::new(e)),
    })
}
