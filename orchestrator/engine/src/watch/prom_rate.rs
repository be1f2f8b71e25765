//! Prometheus rate gates through the health-source seam: the judge's one
//! call for them ([`prometheus_rate_cohorts`]), kept out of `judge.rs` so
//! the detector's own code stays source-agnostic.

use chrono::{DateTime, Utc};
use orchestrator_db::execution::ExecWave;
use orchestrator_db::health::Cohort;
use orchestrator_detect::{RateCohorts, RateSample};
use orchestrator_policy::HealthGate;

use super::collector::Collector;
use crate::metric_source::{MetricSource, PrometheusSource, SourceError};
use crate::prometheus::PrometheusClient;

/// Canary and control events and exposure of a Prometheus rate gate up to
/// `now`, from one look of the Prometheus source; an error (naming the
/// nodes) when a watched canary node's series vanished. Control nodes
/// without data are left out of the control and logged with their count.
pub(crate) async fn prometheus_rate_cohorts(
    client: &PrometheusClient,
    collector: &Collector,
    wave: &ExecWave,
    gate: &HealthGate,
    bake_start: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<RateCohorts, String> {
    let nodes = collector
        .watched_nodes(wave, bake_start)
        .await
        .map_err(|e| format!("cannot list the wave's nodes: {}", orchestrator_types::error_chain(&e)))?;
    let source = PrometheusSource::new(client.clone());
    let look = source
        .look(gate, &nodes, now)
        .await
        .and_then(|look| look.require_watched())
        .map_err(|e: SourceError| orchestrator_types::error_chain(&e))?;
    if !look.control_gaps.is_empty() || look.unmatched_series > 0 {
        tracing::info!(
            gate = %gate.name,
            wave = %wave.name,
            control_gaps = look.control_gaps.len(),
            excluded = ?look.control_gaps,
            unmatched_series = look.unmatched_series,
            resets = look.resets,
            "Prometheus rate look: control nodes without data excluded"
        );
    }
    let side = |cohort| {
        let (events, exposure) = look.totals(&nodes, cohort);
        RateSample { events, exposure }
    };
    Ok(RateCohorts {
        canary: side(Cohort::Canary),
        control: side(Cohort::Control),
    })
}
