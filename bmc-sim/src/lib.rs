//! bmc-sim: a fleet of simulated Redfish BMCs with fault injection, for Waveguard's tests and demos.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use bmc_sim::{Fleet, FleetOptions, Scenario, SimClock};
//!
//! let scenario = Scenario::from_yaml_str(include_str!("../scenarios/small.yaml"))?;
//! let clock = Arc::new(SimClock::starting_now(60.0)); // one simulated minute per second
//! let fleet = Fleet::start(scenario, FleetOptions::new(clock)).await?;
//! for ep in fleet.endpoints() {
//!     println!("{} {}/redfish/v1", ep.name, ep.bmc_url);
//! }
//! println!("control: {}/sim/nodes, metrics: {}/metrics", fleet.control_url(), fleet.control_url());
//! fleet.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Every BMC listens on its own loopback port and serves ServiceRoot, SessionService, Systems/1 (GPU
//! processors, event log), Chassis/1 (thermal subsystem, sensors), Managers/1, UpdateService (SimpleUpdate,
//! multipart push, FirmwareInventory), TaskService and a read-only AccountService, with the protocol rules
//! of DSP0266 (headers, query parameters, session expiry) applied to every resource; a platform profile's
//! [`platform::RedfishLayout`] moves the GPUs, sensors and event log (HGX: host system first, GPUs under
//! `Systems/HGX_Baseboard_0`, a chassis per GPU). State is derived from simulated time on each read (see
//! [`SimClock`]), and every random draw is keyed by (seed, node, purpose, time bucket), so a run is
//! reproducible for a seed. Firmware images use the format in [`image`]. The control server is described in
//! [`control`](crate::control) (module docs) and in `bmc-sim/README.md`.

pub mod cli;
mod conn;
mod control;
mod dcgm;
mod fleet;
pub mod image;
pub mod image_server;
pub mod platform;
pub mod processes;
mod redfish;
mod rng;
pub mod scenario;
mod state;
mod tls;
mod update;

pub use conn::{BmcConn, FleetListener, SimIo};
pub use control::{ComponentVersions, InjectedFaults};
pub use fleet::{Endpoint, Fleet, FleetError, FleetOptions, RunningFleet};
pub use image_server::ImageServer;
/// The controller's accelerated rollout clock under the name the harnesses
/// know: one implementation, so a fleet and a controller sharing it agree on
/// now (and on how long a simulated span takes in real time).
pub use orchestrator_types::AcceleratedClock as SimClock;
pub use processes::{FleetProcesses, ProcessError, ProcessOptions};
pub use scenario::{DcgmSpec, HardwareFailureMode, Metric, Scenario, ScenarioError};
pub use state::hardware::{GpuPart, HardwareFailure, PARTS_MANIFEST_COLUMNS, ReplaceError};
pub use state::{BASELINE_XID_CODES, NodeLabels};
pub use update::MAX_IMAGE_BYTES;

/// CSV header of the endpoint list (`waveguard fleet import` reads this format).
pub const ENDPOINTS_CSV_HEADER: &str = "name,bmc_url,credential_ref,platform_sku,region,cluster,rack,nvlink_domain";

/// Renders endpoints as the CSV `waveguard fleet import` reads; `credential_ref` names the credential set.
pub fn endpoints_csv(endpoints: &[Endpoint], credential_ref: &str) -> String {
    let mut out = String::from(ENDPOINTS_CSV_HEADER);
    out.push('\n');
    for e in endpoints {
        let fields = [
            e.name.as_str(),
            e.bmc_url.as_str(),
            credential_ref,
            e.labels.sku.as_str(),
            e.labels.region.as_str(),
            e.labels.cluster.as_str(),
            e.labels.rack.as_str(),
            e.labels.nvlink_domain.as_str(),
        ];
        let row: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

pub(crate) fn csv_field(f: &str) -> String {
    if f.contains([',', '"', '\n']) {
        format!("\"{}\"", f.replace('"', "\"\""))
    } else {
        f.to_owned()
    }
}
