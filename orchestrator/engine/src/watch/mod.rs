//! The health watch: collects Redfish health of baking waves and their
//! control cohorts, and judges each wave with `orchestrator_detect`.
//!
//! - [`classify`]: pure mapping of event-log entries and sensors to the
//!   policy's metrics and of time to exposure.
//! - [`Collector`]: polls BMCs with bounded concurrency and stores window
//!   aggregates (`orchestrator_db::health`).
//! - [`DetectorJudge`]: the engine's [`crate::HealthJudge`]; looks are
//!   planned at the gates' interval, evaluated once, recorded and audited;
//!   a crossed boundary fails the wave mid-bake (the engine acts on it).

pub mod classify;
mod collector;
mod judge;
mod prom_rate;

pub use crate::connector::HealthBmcs;
pub use collector::{CollectReport, Collector, DEFAULT_GPUS_PER_NODE};
pub use judge::{
    DEFAULT_POLL_CONCURRENCY, DETECTOR_ACTOR, DetectorEvidence, DetectorJudge, GateLook, MAX_LOOKS,
    MIN_CANARY_EVENTS_FOR_FAIL, MIN_EXPOSURE, MIN_LEVEL_UNITS, PollError, max_bake_seconds,
};
