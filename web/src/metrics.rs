//! The controller's own Prometheus metrics, in an explicit registry (no
//! process globals, so every test app has its own).

use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::AppState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    /// The route template (`/api/v1/releases/{id}`), never the raw path, so
    /// cardinality stays bounded.
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

fn latency_histogram() -> Histogram {
    // 1 ms to ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Metrics registry and the instruments the web layer updates.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RequestLabels, Histogram, fn() -> Histogram>,
    /// 1 while the engine has paused flashing for a fault of the controller's
    /// own (EMFILE, database pool, image source), read from the engine at
    /// each scrape.
    controller_degraded: Gauge,
    /// Controller faults seen since start (never charged to a node).
    controller_faults: Gauge,
    /// Nodes drained in their scheduler with a Waveguard tag but no drain
    /// record of Waveguard's (left for a human).
    scheduler_orphaned_drains: Gauge,
    /// The bound on open BMC connections and its use, read from the engine's
    /// BMC clients at each scrape.
    bmc_connections_limit: Gauge,
    bmc_connections_reserved: Gauge,
    bmc_requests_in_flight: Gauge,
    bmc_connection_waiters: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with the HTTP and build-info metrics registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("waveguard");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_owned(),
            })
            .set(1);
        registry.register("http_requests", "HTTP requests served", requests.clone());
        registry.register("http_request_duration_seconds", "HTTP request latency", latency.clone());
        registry.register("build_info", "Waveguard build", build);
        let controller_degraded = Gauge::default();
        let controller_faults = Gauge::default();
        registry.register(
            "controller_degraded",
            "1 while flashing is paused for a fault of the controller's own",
            controller_degraded.clone(),
        );
        registry.register(
            "controller_faults",
            "Faults of the controller's own seen since start (never charged to a node)",
            controller_faults.clone(),
        );
        let scheduler_orphaned_drains = Gauge::default();
        registry.register(
            "scheduler_orphaned_drains",
            "Nodes drained with a Waveguard reason tag and no Waveguard drain record (left for a human)",
            scheduler_orphaned_drains.clone(),
        );
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let bmc_connections_limit = gauge(
            &mut registry,
            "bmc_connections_limit",
            "The bound on BMC connections open at once, fleet-wide",
        );
        let bmc_connections_reserved = gauge(
            &mut registry,
            "bmc_connections_reserved",
            "BMC connections reserved by BMCs holding a lease (at least as many as are open)",
        );
        let bmc_requests_in_flight = gauge(&mut registry, "bmc_requests_in_flight", "BMC requests in flight");
        let bmc_connection_waiters = gauge(
            &mut registry,
            "bmc_connection_waiters",
            "BMCs waiting for a share of the connection bound (waiting is never charged to a node)",
        );
        Self {
            registry: Mutex::new(registry),
            bmc_connections_limit,
            bmc_connections_reserved,
            bmc_requests_in_flight,
            bmc_connection_waiters,
            requests,
            latency,
            controller_degraded,
            controller_faults,
            scheduler_orphaned_drains,
        }
    }

    /// Lets other components (engine, collectors) add their metrics.
    pub fn with_registry<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        let mut registry = self.registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut registry)
    }

    /// The exposition text.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut text = String::new();
        self.with_registry(|registry| prometheus_client::encoding::text::encode(&mut text, registry))?;
        Ok(text)
    }
}

/// The method as a label from a closed set: any made-up method (`FOO`,
/// random tokens) is `other`, so unauthenticated requests cannot grow the
/// label space, and with it the registry's memory, without bound.
fn method_label(method: &axum::http::Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => "other",
    }
}

pub(crate) async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(request.method()).to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let labels = RequestLabels {
        method,
        route,
        status: response.status().as_u16(),
    };
    state.metrics.requests.get_or_create(&labels).inc();
    state
        .metrics
        .latency
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    response
}

pub(crate) async fn render(State(state): State<AppState>) -> Response {
    if let Some(nudge) = &state.engine_nudge {
        let status = nudge.controller_status();
        state.metrics.controller_degraded.set(i64::from(status.degraded));
        state
            .metrics
            .controller_faults
            .set(i64::try_from(status.faults_total).unwrap_or(i64::MAX));
        state
            .metrics
            .scheduler_orphaned_drains
            .set(i64::try_from(status.orphaned_drains.len()).unwrap_or(i64::MAX));
    }
    if let Some(bmcs) = &state.bmcs {
        let usage = bmcs.connection_usage();
        let set = |g: &Gauge, v: usize| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        set(&state.metrics.bmc_connections_limit, usage.limit);
        set(&state.metrics.bmc_connections_reserved, usage.reserved);
        set(&state.metrics.bmc_requests_in_flight, usage.in_flight);
        set(&state.metrics.bmc_connection_waiters, usage.waiting);
    }
    match state.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_outside_the_standard_set_share_one_label() {
        assert_eq!(method_label(&axum::http::Method::GET), "GET");
        assert_eq!(method_label(&axum::http::Method::DELETE), "DELETE");
        for made_up in ["FOO", "GETX", "X1234567"] {
            let method = axum::http::Method::from_bytes(made_up.as_bytes()).unwrap();
            assert_eq!(method_label(&method), "other");
        }
    }
}
