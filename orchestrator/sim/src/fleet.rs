//! Where a simulated world's BMCs run: bmc-sim in this process, or in processes of its own (each
//! serving a slice of the fleet on its own loopback address), behind one face.
//!
//! In this process every BMC's listening socket and every connection's server side count against the
//! controller's open-file limit, which caps an in-process fleet near 10,000 BMCs here; in processes of
//! their own they count against theirs, and the controller holds only its own connections, within its
//! connection bound. The processes run on a clock anchored at the same wall-clock epoch as the
//! controller's, and follow its skips over their control API.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use bmc_sim::{ComponentVersions, Endpoint, FleetProcesses, ProcessError, RunningFleet};
use chrono::{DateTime, Utc};
use orchestrator_types::AcceleratedClock;

/// Where to run the fleet.
#[derive(Debug, Clone, Default)]
pub enum FleetPlacement {
    /// bmc-sim in this process (on the given runtime, if any: the benchmarks keep its CPU apart).
    #[default]
    InProcess,
    /// bmc-sim in `processes` processes started as `program leading_args... --slice ...`.
    Processes {
        /// The program: this `waveguard` (with `leading_args` `["bmc-sim"]`) or a `bmc-sim` binary.
        program: PathBuf,
        /// Arguments before bmc-sim's own.
        leading_args: Vec<String>,
        /// How many processes (each serves `nodes / processes` BMCs).
        processes: usize,
    },
}

impl FleetPlacement {
    /// `processes` processes of this very executable, run as `waveguard bmc-sim`.
    pub fn own_processes(processes: usize) -> std::io::Result<Self> {
        Ok(FleetPlacement::Processes {
            program: std::env::current_exe()?,
            leading_args: vec!["bmc-sim".into()],
            processes,
        })
    }
}

/// The running fleet.
#[derive(Debug)]
pub enum SimFleet {
    /// In this process.
    InProcess(RunningFleet),
    /// In processes of its own.
    Processes(FleetProcesses),
}

impl SimFleet {
    /// Every BMC, in fleet order.
    pub fn endpoints(&self) -> &[Endpoint] {
        match self {
            SimFleet::InProcess(f) => f.endpoints(),
            SimFleet::Processes(p) => p.endpoints(),
        }
    }

    /// The in-process fleet, for what only it offers (replacing parts, reading its state directly).
    pub fn in_process(&self) -> Option<&RunningFleet> {
        match self {
            SimFleet::InProcess(f) => Some(f),
            SimFleet::Processes(_) => None,
        }
    }

    /// Current versions of every node's components, by node name.
    pub async fn versions(&self) -> Result<HashMap<String, Vec<ComponentVersions>>, ProcessError> {
        match self {
            SimFleet::InProcess(f) => Ok(f
                .endpoints()
                .iter()
                .filter_map(|e| Some((e.name.clone(), f.versions(&e.name)?)))
                .collect()),
            SimFleet::Processes(p) => p.versions().await,
        }
    }

    /// Flashes started per version, by node name (nodes without any may be missing).
    pub async fn flash_counts(&self) -> Result<HashMap<String, BTreeMap<String, u32>>, ProcessError> {
        match self {
            SimFleet::InProcess(f) => Ok(f
                .endpoints()
                .iter()
                .filter_map(|e| Some((e.name.clone(), f.flash_counts(&e.name)?)))
                .collect()),
            SimFleet::Processes(p) => p.flash_counts().await,
        }
    }

    /// Every node as bmc-sim's control API describes it (`GET /sim/nodes`).
    pub async fn nodes_json(&self) -> Result<Vec<serde_json::Value>, String> {
        match self {
            SimFleet::InProcess(f) => {
                let url = format!("{}/sim/nodes", f.control_url());
                let response = reqwest::get(&url).await.map_err(|e| e.to_string())?;
                response.json().await.map_err(|e| e.to_string())
            }
            SimFleet::Processes(p) => p.nodes_json().await.map_err(|e| orchestrator_types::error_chain(&e)),
        }
    }

    /// Moves simulated time forward to `at` on `clock` (the controller's) and on the fleet's.
    pub async fn skip_to(&self, clock: &AcceleratedClock, at: DateTime<Utc>) {
        clock.skip_to(at);
        if let SimFleet::Processes(p) = self
            && let Err(err) = p.skip_to(at).await
        {
            tracing::warn!(error = %orchestrator_types::error_chain(&err), "the fleet processes did not skip ahead");
        }
    }

    /// CPU seconds (user + system) the fleet's processes used so far; `None` in-process (the
    /// benchmarks count its threads instead).
    pub fn process_cpu_seconds(&self) -> Option<f64> {
        match self {
            SimFleet::InProcess(_) => None,
            SimFleet::Processes(p) => Some(p.cpu_seconds()),
        }
    }

    /// Stops the fleet.
    pub async fn shutdown(self) {
        match self {
            SimFleet::InProcess(f) => f.shutdown().await,
            SimFleet::Processes(p) => {
                // Give in-flight image downloads no grace: the run is over.
                let _ = tokio::time::timeout(Duration::from_secs(15), p.shutdown()).await;
            }
        }
    }
}
