//! The controller's HTTP clients for BMCs: TLS trust parsed once per setting and shared, one small
//! client per BMC under the fleet-wide connection bound (`connections`), and the seam through which
//! tests inject the controller's own connect faults.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{BmcEndpoint, TlsTrust};
use crate::connections::{BmcLane, CONNECTIONS_PER_BMC, ConnectionBudget, ConnectionLimit, ConnectionUsage};
use crate::error::BmcError;

/// How long an idle pooled connection is kept. BMC web servers drop idle connections after ~60 s;
/// reusing a connection they already closed costs a failed attempt, so stay below that. Shorter
/// still, because idle sockets add up across a fleet: discovery passes hundreds of BMCs a second,
/// and every idle socket it leaves behind holds a file descriptor here and a connection slot on
/// the BMC (a 10,000-node discovery with 45 s of idle sockets exhausted a simulator's limits).
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(20);

/// Idle connections kept per BMC: as many as its lease covers, no more.
const POOL_MAX_IDLE_PER_BMC: usize = CONNECTIONS_PER_BMC;

/// What every BMC driver is built from: TLS configurations parsed once per trust setting (building a
/// client from a parsed one takes microseconds; parsing the system's trust store takes tens of
/// milliseconds) and the fleet-wide bound on open connections that every BMC's client is leased
/// under. One per controller process, shared by the engine, the health collector, discovery and the
/// RMA monitor.
#[derive(Debug)]
pub struct HttpClients {
    tls: Mutex<HashMap<TlsTrust, Arc<rustls::ClientConfig>>>,
    faults: Option<Arc<dyn ConnectFaults>>,
    budget: Arc<ConnectionBudget>,
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

impl Default for HttpClients {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClients {
    /// Clients under a bound sized from this process's open-file limit (less
    /// [`crate::connections::default_reserve`]); the smallest bound when that limit cannot be read or
    /// is tiny.
    pub fn new() -> Self {
        let limit = ConnectionLimit::from_open_files(None).unwrap_or_else(|err| {
            tracing::warn!(error = %err, "BMC connections limited to one BMC at a time");
            ConnectionLimit::MIN
        });
        Self::with_connection_limit(limit)
    }

    /// Clients under an explicit bound on open BMC connections.
    pub fn with_connection_limit(limit: ConnectionLimit) -> Self {
        Self {
            tls: Mutex::default(),
            faults: None,
            budget: ConnectionBudget::new(limit),
        }
    }

    /// As [`HttpClients::new`], with clients that consult `faults` before every new connection.
    pub fn with_connect_faults(faults: Arc<dyn ConnectFaults>) -> Self {
        Self::new().connect_faults(faults)
    }

    /// The same clients, consulting `faults` before every new connection.
    pub fn connect_faults(mut self, faults: Arc<dyn ConnectFaults>) -> Self {
        self.faults = Some(faults);
        self
    }

    /// The bound on open BMC connections and how much of it is in use.
    pub fn usage(&self) -> ConnectionUsage {
        self.budget.usage()
    }

    /// One BMC's lane: its clients are built from the endpoint's (cached) TLS configuration and
    /// leased under the shared bound. A TLS setting that cannot be used fails here, before any I/O.
    pub(crate) fn lane(&self, endpoint: &BmcEndpoint, label: &str) -> Result<Arc<BmcLane>, BmcError> {
        let tls = self.tls_config(&endpoint.tls, label)?;
        let connect_timeout = endpoint.timeouts.connect;
        let faults = self.faults.clone();
        let label = label.to_owned();
        Ok(BmcLane::new(
            self.budget.clone(),
            Box::new(move || build_client(&tls, connect_timeout, &label, faults.clone())),
        ))
    }

    fn tls_config(&self, trust: &TlsTrust, label: &str) -> Result<Arc<rustls::ClientConfig>, BmcError> {
        // A poisoned lock only means another thread panicked while inserting; the map is still valid.
        let mut configs = self.tls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = configs.get(trust) {
            return Ok(config.clone());
        }
        let config = Arc::new(tls_config(trust, label)?);
        if let TlsTrust::InsecureSkipVerify { reason } = trust {
            tracing::warn!(endpoint = label, reason, "TLS verification disabled for this BMC");
        }
        configs.insert(trust.clone(), config.clone());
        Ok(config)
    }
}

fn build_client(
    tls: &rustls::ClientConfig,
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
        .user_agent(concat!("waveguard-bmc/", env!("CARGO_PKG_VERSION")))
        .tls_backend_preconfigured(tls.clone());
    if let Some(faults) = faults {
        builder = builder.connector_layer(FaultLayer(faults));
    }
    builder.build().map_err(|e| BmcError::Config {
        endpoint: label.to_string(),
        reason: "cannot build HTTP client".to_string(),
        source: Some(Box::new(e)),
    })
}

/// The rustls configuration reqwest would build for this trust setting (HTTP/1.1 only, every
/// protocol version the provider offers), built here once so that a BMC's client is cheap to make.
fn tls_config(trust: &TlsTrust, label: &str) -> Result<rustls::ClientConfig, BmcError> {
    let config_error = |reason: String, source: Option<Box<dyn std::error::Error + Send + Sync>>| BmcError::Config {
        endpoint: label.to_string(),
        reason,
        source,
    };
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(|e| config_error("no usable TLS protocol version".into(), Some(Box::new(e))))?;
    let mut config = match trust {
        TlsTrust::System => {
            let verifier = rustls_platform_verifier::Verifier::new(provider)
                .map_err(|e| config_error("cannot load the system trust store".into(), Some(Box::new(e))))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth()
        }
        TlsTrust::CaBundle { path } => {
            use rustls::pki_types::CertificateDer;
            use rustls::pki_types::pem::PemObject as _;
            let pem = std::fs::read(path)
                .map_err(|e| config_error(format!("cannot read CA bundle {}", path.display()), Some(Box::new(e))))?;
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    config_error(
                        format!("CA bundle {} is not valid PEM", path.display()),
                        Some(Box::new(e)),
                    )
                })?;
            if certs.is_empty() {
                return Err(config_error(
                    format!("CA bundle {} holds no certificate", path.display()),
                    None,
                ));
            }
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    config_error(
                        format!(
                            "CA bundle {} holds a certificate that is not a usable CA",
                            path.display()
                        ),
                        Some(Box::new(e)),
                    )
                })?;
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsTrust::InsecureSkipVerify { .. } => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerifier(provider)))
            .with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepts any certificate: only for a BMC explicitly marked `InsecureSkipVerify` with a reason.
/// Signatures are still checked, so the handshake itself stays sound.
#[derive(Debug)]
struct NoVerifier(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerifier {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
