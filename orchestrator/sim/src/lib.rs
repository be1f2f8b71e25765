//! The simulated world `waveguard simulate`, `demo` and `bench` run on.
//!
//! Everything is real except the fleet and the clock: bmc-sim serving
//! Redfish over loopback HTTP, a database (a temporary SQLite file unless a
//! URL is given), firmware images served over loopback HTTP for the BMCs to
//! pull, the planner and the engine (and its health judge). Simulated time is
//! an [`AcceleratedClock`](orchestrator_types::AcceleratedClock) that also
//! jumps over stretches where nothing can happen (waiting for a maintenance
//! window; waiting for a bake to end when no detector watches it), so days of
//! policy finish in seconds.
//!
//! - [`fleet`]: [`SimFleet`], bmc-sim in this process or in processes of its
//!   own (each serving a slice of the fleet on its own loopback address);
//! - [`world`]: [`SimWorld`], the fleet started and recorded as discovery
//!   would, releases registered with generated images, the engine's settings
//!   for accelerated time;
//! - [`watch`]: drives a rollout to its end (synthetic approvals, idle skips);
//! - [`report`]: the JSON report of `waveguard simulate` (a contract);
//! - [`error`]: [`SimError`], what a run can fail with;
//! - [`run`]: one whole simulated rollout, from release to report;
//! - [`demo`]: the story `waveguard demo` tells (releases, rollouts, narration);
//! - [`bench`]: the throughput run and the measurements behind `waveguard bench`;
//! - [`latency`]: the stores `bench --only latency` measures pages over (a
//!   100,000-node fleet with a rollout mid-way, a writer standing in for the
//!   engine) and the demo's moments.
//!
//! This is an ordinary library, not a test crate, so shipped commands may
//! depend on it.

pub mod bench;
pub mod demo;
pub mod error;
pub mod fleet;
pub mod latency;
pub mod report;
pub mod run;
pub mod watch;
pub mod world;

pub use error::SimError;
pub use fleet::{FleetPlacement, SimFleet};
pub use report::{Detection, Exposure, GateVerdict, Report, Updates, WaveReport};
pub use run::{Simulation, simulate};
pub use watch::{SIM_APPROVERS, WatchOptions, Watched, idle_until, watch};
pub use world::{JudgeChoice, SIM_AUTHOR, SimWorld, WorldError, WorldOptions, all_nodes, judge_for};
