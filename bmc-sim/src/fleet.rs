//! Starting and stopping a simulated fleet: one listening socket per BMC, one shared Redfish router.
//!
//! Every BMC has its own loopback port, so a client sees N independent Redfish services. Behind them, a
//! small accept task per port tags each accepted connection with the BMC's index and hands it to a single
//! `axum::serve` loop through a channel; the router reads the tag from the connection info. That keeps 10,000
//! BMCs at one router and one hyper server instead of 10,000.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use orchestrator_types::{Clock, ComponentKind, SystemClock};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::conn::{BmcConn, FleetListener, accept_loop};
use crate::control::ComponentVersions;
use crate::scenario::{Metric, Scenario};
use crate::state::hardware::{GpuPart, HardwareFailure, ReplaceError};
use crate::state::{ComponentState, EventCache, FleetState, Node, NodeLabels, NodeMut};

/// Why a fleet could not start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The slice of the fleet to serve is empty or reaches past the fleet's end.
    #[error("cannot serve nodes {start}..{end} of a fleet of {nodes}")]
    Slice {
        /// First node index asked for.
        start: usize,
        /// One past the last.
        end: usize,
        /// The fleet's size.
        nodes: usize,
    },
    /// The process may not open enough sockets for the requested number of BMCs.
    #[error(
        "open-file limit is {available} but {needed} BMCs need at least {needed} sockets; raise `ulimit -n` (hard limit) or simulate fewer nodes"
    )]
    FileLimit {
        /// Sockets needed (one listener per BMC plus headroom).
        needed: u64,
        /// The soft limit after trying to raise it.
        available: u64,
    },
    /// Binding a BMC's listening socket failed.
    #[error("binding a listening socket on {addr} for {what}")]
    Bind {
        /// Address tried.
        addr: SocketAddr,
        /// Which listener (BMC name or "control").
        what: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Generating the TLS certificates failed.
    #[error("generating the self-signed TLS certificates")]
    Tls(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The HTTP client used to fetch `ImageURI` could not be built.
    #[error("building the HTTP client for image downloads")]
    HttpClient(#[source] reqwest::Error),
    /// `parts.serial_digits` is too small for the fleet's GPUs to have distinct serials.
    #[error("{gpus} GPUs need more serials than parts.serial_digits = {digits} allows")]
    Serials {
        /// GPUs in the fleet.
        gpus: usize,
        /// The scenario's `parts.serial_digits`.
        digits: u32,
    },
}

/// How to run a fleet.
#[derive(Clone)]
pub struct FleetOptions {
    /// Source of simulated time; share it with an in-process controller.
    pub clock: Arc<dyn Clock>,
    /// What a session's `SessionTimeout` is measured on. Real BMCs time sessions out in real time, so
    /// the default is the wall clock: on a sped-up fleet clock (7,200x) the 30-minute timeout would be
    /// 0.25 real seconds, less than a loaded machine's round trip, and a session would expire between
    /// the login and the request it was made for. Tests that move expiry explicitly pass their
    /// `ManualClock` here.
    pub session_clock: Arc<dyn Clock>,
    /// Loopback address every BMC binds (each on its own ephemeral port).
    pub bind: IpAddr,
    /// Redfish user name every BMC accepts.
    pub username: String,
    /// Redfish password every BMC accepts.
    pub password: String,
    /// Serve HTTPS with a freshly generated self-signed CA (see [`RunningFleet::ca_pem`]).
    pub tls: bool,
    /// Overrides the scenario's node count.
    pub nodes: Option<usize>,
    /// Serve only the fleet's nodes in this range (names, labels, parts and random draws stay those
    /// of the whole fleet), so a fleet larger than one process's open-file limit runs as several
    /// processes, each on its own address. `None`: every node.
    pub slice: Option<std::ops::Range<usize>>,
    /// The same clock as `clock`, given when the control API may move it forward
    /// (`POST /sim/clock/skip`): a fleet in processes of its own follows its controller's skips.
    pub skips: Option<Arc<orchestrator_types::AcceleratedClock>>,
    /// How long a "timeout" fault hangs a request (real time); ends early on shutdown.
    pub hang_for: Duration,
    /// Keep connections open between requests (HTTP keep-alive). When false every BMC answers with
    /// `Connection: close`, as some BMC web servers do; a fleet of 10,000 BMCs in one process then
    /// holds no idle connections, only its listeners.
    pub keep_alive: bool,
}

impl FleetOptions {
    /// Defaults: 127.0.0.1, user `admin` / password `admin`, plain HTTP, 60 s hangs, sessions timed
    /// out in real time.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            session_clock: Arc::new(SystemClock),
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            username: "admin".to_owned(),
            password: "admin".to_owned(),
            tls: false,
            nodes: None,
            slice: None,
            skips: None,
            hang_for: Duration::from_secs(60),
            keep_alive: true,
        }
    }
}

// The password must never appear in Debug output (logs, panics).
impl std::fmt::Debug for FleetOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetOptions")
            .field("clock", &self.clock)
            .field("session_clock", &self.session_clock)
            .field("bind", &self.bind)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("tls", &self.tls)
            .field("nodes", &self.nodes)
            .field("slice", &self.slice)
            .field("hang_for", &self.hang_for)
            .field("keep_alive", &self.keep_alive)
            .finish()
    }
}

/// One simulated BMC, as a client (or `waveguard fleet import`) needs to know it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Endpoint {
    /// Node name.
    pub name: String,
    /// Redfish base URL, e.g. `http://127.0.0.1:40123` (append `/redfish/v1`).
    pub bmc_url: String,
    /// Placement labels.
    #[serde(flatten)]
    pub labels: NodeLabels,
}

/// Entry point: see [`Fleet::start`].
#[derive(Debug)]
pub struct Fleet;

/// A running fleet. Dropping it without [`RunningFleet::shutdown`] aborts the servers.
pub struct RunningFleet {
    state: Arc<FleetState>,
    endpoints: Vec<Endpoint>,
    control_url: String,
    ca_pem: Option<String>,
    shutdown: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    accept_loops: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for RunningFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningFleet")
            .field("nodes", &self.endpoints.len())
            .field("control_url", &self.control_url)
            .field("tls", &self.ca_pem.is_some())
            .finish_non_exhaustive()
    }
}

/// Head-room for client connections, control server, image downloads, stdio.
const FD_HEADROOM: u64 = 256;

fn node_labels(scenario: &Scenario, nodes: usize, i: usize) -> NodeLabels {
    let f = &scenario.fleet;
    let racks = f.racks.min(nodes).max(1);
    let rack = i * racks / nodes;
    let cluster = rack * f.clusters.min(racks) / racks;
    let rack_first = (rack * nodes).div_ceil(racks);
    let domain = f.nodes_per_nvlink_domain.map_or(0, |k| (i - rack_first) / k);
    NodeLabels {
        region: f.region.clone(),
        cluster: format!("cluster-{cluster:02}"),
        rack: format!("rack-{rack:04}"),
        nvlink_domain: format!("rack-{rack:04}-nvl{domain}"),
        sku: f.sku.clone(),
    }
}

fn initial_components(scenario: &Scenario, epoch: DateTime<Utc>) -> Vec<ComponentState> {
    scenario
        .fleet
        .components
        .iter()
        .map(|c| ComponentState {
            id: c.id.clone(),
            kind: c.kind,
            updateable: c.updateable,
            lowest_supported_version: c.lowest_supported_version.clone(),
            history: vec![(epoch, c.version.clone())],
            pending: None,
        })
        .collect()
}

fn bind_std(addr: SocketAddr, what: &str) -> Result<TcpListener, FleetError> {
    let err = |source| FleetError::Bind {
        addr,
        what: what.to_owned(),
        source,
    };
    let l = std::net::TcpListener::bind(addr).map_err(err)?;
    l.set_nonblocking(true).map_err(err)?;
    TcpListener::from_std(l).map_err(err)
}

/// Fleets up to this size bind port 0 (the kernel picks); bigger ones scan [`SCAN_PORTS`] themselves.
const EPHEMERAL_MAX_NODES: usize = 256;
/// Ports below the kernel's usual ephemeral range (32768-60999), so outgoing connections never compete.
const SCAN_PORTS: std::ops::RangeInclusive<u16> = 10_000..=32_767;

/// Chooses listening ports. The kernel's port-0 search gets slow (milliseconds per bind) and runs out near
/// 14,000 listeners because it only hands out half the ephemeral range to `bind`; an explicit scan from a
/// random start binds 10,000 ports in a fraction of a second, and `EADDRINUSE` just moves it to the next
/// port, so parallel fleets still never collide.
struct PortPicker {
    scan: bool,
    next: u16,
    tried: usize,
}

impl PortPicker {
    fn new(nodes: usize) -> Self {
        let span = (SCAN_PORTS.end() - SCAN_PORTS.start()) as u32 + 1;
        let offset = (rand::random::<u32>() % span) as u16;
        Self {
            scan: nodes > EPHEMERAL_MAX_NODES,
            next: SCAN_PORTS.start() + offset,
            tried: 0,
        }
    }

    fn bind(&mut self, ip: IpAddr, what: &str) -> Result<TcpListener, FleetError> {
        if !self.scan {
            return bind_std(SocketAddr::new(ip, 0), what);
        }
        let span = (SCAN_PORTS.end() - SCAN_PORTS.start()) as usize + 1;
        loop {
            let port = self.next;
            self.next = if port >= *SCAN_PORTS.end() {
                *SCAN_PORTS.start()
            } else {
                port + 1
            };
            self.tried += 1;
            match bind_std(SocketAddr::new(ip, port), what) {
                Ok(l) => return Ok(l),
                Err(FleetError::Bind { source, .. })
                    if source.kind() == io::ErrorKind::AddrInUse && self.tried < span => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl Fleet {
    /// Starts every BMC and the control server. Must be called inside a tokio runtime.
    pub async fn start(scenario: Scenario, options: FleetOptions) -> Result<RunningFleet, FleetError> {
        let nodes = options.nodes.unwrap_or(scenario.fleet.nodes).max(1);
        let slice = options.slice.clone().unwrap_or(0..nodes);
        if slice.is_empty() || slice.end > nodes {
            return Err(FleetError::Slice {
                start: slice.start,
                end: slice.end,
                nodes,
            });
        }
        let served = slice.len();
        let needed = served as u64 + FD_HEADROOM;
        let available = raise_fd_limit();
        if available < needed {
            return Err(FleetError::FileLimit { needed, available });
        }
        if available < 2 * served as u64 + FD_HEADROOM {
            tracing::warn!(
                available,
                nodes = served,
                "open-file limit allows every BMC to listen but not every BMC to hold a client connection at once"
            );
        }

        let tls = if options.tls {
            Some(crate::tls::generate(options.bind).map_err(FleetError::Tls)?)
        } else {
            None
        };
        let scheme = if tls.is_some() { "https" } else { "http" };

        let gpu_components: Vec<usize> = scenario
            .fleet
            .components
            .iter()
            .enumerate()
            .filter(|(_, c)| c.kind == ComponentKind::Gpu)
            .map(|(i, _)| i)
            .collect();
        // Processors GPU_0..7 exist even if the scenario lists no GPU firmware.
        let gpus = if gpu_components.is_empty() {
            8
        } else {
            gpu_components.len()
        };
        let epoch = options.clock.now();
        let names: Vec<String> = (0..nodes)
            .map(|i| format!("{}-{i:05}", scenario.fleet.name_prefix))
            .collect();
        let parts_plan = crate::state::hardware::PartsPlan::new(&scenario, &names, gpus, epoch);
        if !parts_plan.serials_suffice() {
            return Err(FleetError::Serials {
                gpus: nodes * gpus,
                digits: scenario.parts.serial_digits,
            });
        }
        let mut listeners = Vec::with_capacity(served);
        let mut node_list = Vec::with_capacity(served);
        let mut ports = PortPicker::new(served);
        for (i, name) in names.iter().enumerate().take(slice.end).skip(slice.start) {
            let name = name.clone();
            let listener = ports.bind(options.bind, &name)?;
            let port = listener
                .local_addr()
                .map_err(|source| FleetError::Bind {
                    addr: SocketAddr::new(options.bind, 0),
                    what: name.clone(),
                    source,
                })?
                .port();
            let host = match options.bind {
                IpAddr::V6(v6) => format!("[{v6}]"),
                IpAddr::V4(v4) => v4.to_string(),
            };
            node_list.push(Node {
                index: i,
                labels: node_labels(&scenario, nodes, i),
                bmc_url: Mutex::new(format!("{scheme}://{host}:{port}")),
                name,
                down_from: AtomicI64::new(0),
                down_until: AtomicI64::new(0),
                injected: AtomicU8::new(0),
                grace_until: AtomicU64::new(0),
                req_seq: AtomicU64::new(0),
                event_log_pages: AtomicU64::new(0),
                inner: Mutex::new(NodeMut {
                    components: initial_components(&scenario, epoch),
                    tasks: Vec::new(),
                    sessions: HashMap::new(),
                    next_session: 0,
                    flash_counts: Default::default(),
                    flashes: 0,
                    resets: 0,
                    reboot_until: None,
                    events: EventCache::default(),
                    http_push: Default::default(),
                    gpu_parts: parts_plan.initial_parts(&scenario, i, epoch),
                    diagnostics: Vec::new(),
                }),
            });
            listeners.push(listener);
        }

        let mut effects_by_metric: HashMap<Metric, Vec<(usize, usize)>> = HashMap::new();
        for (fi, fw) in scenario.firmware.iter().enumerate() {
            for (ei, e) in fw.effects.iter().enumerate() {
                effects_by_metric.entry(e.metric).or_default().push((fi, ei));
            }
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(FleetError::HttpClient)?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let state = Arc::new(FleetState {
            scenario,
            clock: options.clock.clone(),
            session_clock: options.session_clock.clone(),
            epoch,
            nodes: node_list,
            first: slice.start,
            skips: options.skips.clone(),
            username: options.username.clone(),
            password: options.password.clone(),
            http,
            hang_for: options.hang_for,
            shutdown: shutdown_rx.clone(),
            gpu_components,
            gpus,
            effects_by_metric,
            dcgm: Default::default(),
            parts_plan,
            connections: Default::default(),
        });

        let (tx, rx) = mpsc::channel(4096);
        let acceptor = tls
            .as_ref()
            .map(|t| tokio_rustls::TlsAcceptor::from(t.server_config.clone()));
        let mut accept_loops = Vec::with_capacity(served);
        for (i, listener) in (slice.start..).zip(listeners) {
            accept_loops.push(tokio::spawn(accept_loop(
                listener,
                i,
                state.clone(),
                tx.clone(),
                acceptor.clone(),
                shutdown_rx.clone(),
            )));
        }
        drop(tx);

        let redfish_listener = FleetListener {
            rx,
            local: SocketAddr::new(options.bind, 0),
        };
        let app = crate::redfish::router(state.clone());
        let app = if options.keep_alive {
            app
        } else {
            app.layer(axum::middleware::map_response(close_after_response))
        };
        let mut stop = shutdown_rx.clone();
        let redfish_server = tokio::spawn(async move {
            let served = axum::serve(redfish_listener, app.into_make_service_with_connect_info::<BmcConn>())
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "redfish server stopped");
            }
        });

        let control_listener = bind_std(SocketAddr::new(options.bind, 0), "control")?;
        let control_addr = control_listener.local_addr().map_err(|source| FleetError::Bind {
            addr: SocketAddr::new(options.bind, 0),
            what: "control".into(),
            source,
        })?;
        let control_app = crate::control::router(state.clone());
        let mut stop = shutdown_rx.clone();
        let control_server = tokio::spawn(async move {
            let served = axum::serve(control_listener, control_app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "control server stopped");
            }
        });

        let endpoints = state
            .nodes
            .iter()
            .map(|n| Endpoint {
                name: n.name.clone(),
                bmc_url: n.bmc_url(),
                labels: n.labels.clone(),
            })
            .collect();
        Ok(RunningFleet {
            state,
            endpoints,
            control_url: format!("http://{control_addr}"),
            ca_pem: tls.map(|t| t.ca_pem),
            shutdown: shutdown_tx,
            servers: vec![redfish_server, control_server],
            accept_loops,
        })
    }
}

/// Raises the soft open-file limit as far as the hard limit allows; returns the limit in force.
fn raise_fd_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "could not raise the open-file limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .map(|(soft, _)| soft)
                .unwrap_or(1024)
        }
    }
}

impl RunningFleet {
    /// Every BMC, in node order.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// Base URL of the control server (`/sim/...`, `/metrics`).
    pub fn control_url(&self) -> &str {
        &self.control_url
    }

    /// PEM of the CA that signed the BMCs' certificate, when serving HTTPS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The simulated-time clock the fleet runs on.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.state.clock.clone()
    }

    /// Current versions of every component on node `name` (None: no such node).
    pub fn versions(&self, name: &str) -> Option<Vec<ComponentVersions>> {
        self.state
            .node_by_name(name)
            .map(|n| crate::control::versions_of(&self.state, n))
    }

    /// Client connections open at the fleet's BMCs now, and the most open at once so far.
    pub fn connections(&self) -> (usize, usize) {
        self.state.connections.read()
    }

    /// GETs of node `name`'s GPU event-log entries collection so far, every page counted.
    pub fn event_log_pages(&self, name: &str) -> Option<u64> {
        self.state
            .node_by_name(name)
            .map(|n| n.event_log_pages.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Redfish sessions currently held by node `name`: logged in, not deleted, and not yet found idle
    /// past `SessionTimeout` (expiry is noticed on the next request to the node).
    pub fn open_sessions(&self, name: &str) -> Option<usize> {
        self.state.node_by_name(name).map(|n| n.lock().sessions.len())
    }

    /// Flashes started per version on node `name` (None: no such node).
    pub fn flash_counts(&self, name: &str) -> Option<std::collections::BTreeMap<String, u32>> {
        self.state.node_by_name(name).map(|n| n.lock().flash_counts.clone())
    }

    /// Every GPU part ever installed, as a factory's parts manifest: CSV with the header
    /// [`crate::PARTS_MANIFEST_COLUMNS`] (what `waveguard`'s manifest import reads), one row per serial,
    /// replaced parts and their replacements included.
    pub fn parts_manifest_csv(&self) -> String {
        crate::state::hardware::manifest_csv(&self.state.all_parts())
    }

    /// Every GPU part ever installed, node by node, GPU by GPU, oldest first.
    pub fn gpu_parts(&self) -> Vec<GpuPart> {
        self.state.all_parts()
    }

    /// Hardware failures begun by now (replaced parts included, with `replaced_at`), oldest first.
    pub fn hardware_failures(&self) -> Vec<HardwareFailure> {
        self.state.failures(Some(self.state.now()))
    }

    /// Every hardware failure the run will see as things stand, begun or not: scripted ones and random
    /// ones within `hardware.horizon`; a replacement drops the old part's future failure and adds the
    /// new part's, if it draws one.
    pub fn scheduled_hardware_failures(&self) -> Vec<HardwareFailure> {
        self.state.failures(None)
    }

    /// Replaces GPU `gpu` (0-based) of node `node` now with a part from the spare lot: a new serial,
    /// the old part's failure ends (its log entries stay), telemetry counts from zero.
    pub fn replace_gpu(&self, node: &str, gpu: usize) -> Result<GpuPart, ReplaceError> {
        self.state.replace_gpu(node, gpu)
    }

    /// Stops accepting, ends hung requests and waits for the servers to finish.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for h in self.accept_loops.drain(..) {
            let _ = h.await;
        }
        for h in self.servers.drain(..) {
            // In-flight requests get a bounded grace period; hung ones were woken by the signal.
            if tokio::time::timeout(Duration::from_secs(10), h).await.is_err() {
                tracing::warn!("a server did not stop within 10 s");
            }
        }
    }
}

impl Drop for RunningFleet {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        for h in self.accept_loops.iter().chain(self.servers.iter()) {
            h.abort();
        }
    }
}

/// Makes hyper close the connection once the response is written.
async fn close_after_response(mut response: axum::response::Response) -> axum::response::Response {
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}
