//! A fleet split over several `bmc-sim` processes, each serving a slice of it on its own loopback
//! address (127.0.0.2, 127.0.0.3, ...).
//!
//! Why: every simulated BMC holds a listening socket, and every connection to it one more descriptor,
//! in the process that serves it; a process here may hold 20,000 open files, so 100,000 BMCs need
//! several processes. Each binds its ports on its own address, so the processes never compete for
//! ports, and the controller, in a process of its own, counts only its own descriptors.
//!
//! The processes run on one clock: each is started with the same `--clock-epoch` and `--speedup`, so
//! they compute the same simulated now without talking to each other. A skip forward (see
//! [`FleetProcesses::skip_to`]) is sent to each over its control API.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::Endpoint;
use crate::control::ComponentVersions;

/// BMCs one process serves by default: half of this machine's 20,000 open files, the other half for
/// the connections to them.
pub const DEFAULT_NODES_PER_PROCESS: usize = 10_000;

/// How long a process may take to bind its ports and say where it listens.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The environment variable the processes read the Redfish password from (never the command line).
const PASSWORD_ENV: &str = "BMC_SIM_PASSWORD";

/// How to start the processes.
#[derive(Clone)]
pub struct ProcessOptions {
    /// The executable that runs bmc-sim: the `bmc-sim` binary, or `waveguard` with
    /// `leading_args` `["bmc-sim"]`.
    pub program: PathBuf,
    /// Arguments that come first (the subcommand, for `waveguard`).
    pub leading_args: Vec<String>,
    /// The scenario, as YAML (written to a file the processes read).
    pub scenario_yaml: String,
    /// The fleet's size (overrides the scenario's).
    pub nodes: usize,
    /// How many processes; the fleet is cut into this many slices of (nearly) equal size.
    pub processes: usize,
    /// The first process's address; the others follow it (127.0.0.2, 127.0.0.3, ...).
    pub first_address: Ipv4Addr,
    /// Simulated time equals real time at this instant; shared by every process and the caller.
    pub clock_epoch: DateTime<Utc>,
    /// Simulated seconds per real second.
    pub speedup: f64,
    /// HTTP keep-alive (false: every response closes its connection).
    pub keep_alive: bool,
    /// How long a "timeout" fault hangs a request.
    pub hang_for: Duration,
    /// Redfish user name and password of every BMC.
    pub username: String,
    /// See [`ProcessOptions::username`]; never shown by `Debug`.
    pub password: String,
}

impl std::fmt::Debug for ProcessOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessOptions")
            .field("program", &self.program)
            .field("nodes", &self.nodes)
            .field("processes", &self.processes)
            .field("first_address", &self.first_address)
            .field("clock_epoch", &self.clock_epoch)
            .field("speedup", &self.speedup)
            .field("keep_alive", &self.keep_alive)
            .field("hang_for", &self.hang_for)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl ProcessOptions {
    /// Processes enough for `nodes`, each within the open-file limit it inherits from this process:
    /// a controller started under `ulimit -n 4096` hands that hard limit to its children, and a
    /// process of 10,000 BMCs would then not even bind its listeners.
    pub fn processes_for(nodes: usize) -> usize {
        let inherited = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(u64::MAX, |(_soft, hard)| hard);
        processes_within(nodes, inherited)
    }
}

/// Processes for `nodes` when each may open `hard_limit` files: half for the BMCs' listeners, half
/// for the connections to them, and never more than [`DEFAULT_NODES_PER_PROCESS`] BMCs in one.
fn processes_within(nodes: usize, hard_limit: u64) -> usize {
    let per_process = usize::try_from(hard_limit / 2)
        .unwrap_or(usize::MAX)
        .clamp(1, DEFAULT_NODES_PER_PROCESS);
    nodes.div_ceil(per_process).max(1)
}

/// Why the processes could not start or answer.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Bad options (no processes, more processes than nodes, addresses past 127.255.255.255).
    #[error("{0}")]
    Options(String),
    /// The scenario could not be written for the processes.
    #[error("cannot write the scenario for the bmc-sim processes")]
    Scenario(#[source] std::io::Error),
    /// A process could not be started.
    #[error("cannot start {} (process {index})", program.display())]
    Spawn {
        /// The executable.
        program: PathBuf,
        /// Which process.
        index: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A process ended or went silent before saying it was ready.
    #[error("bmc-sim process {index} (nodes {slice}) did not become ready: {reason}")]
    NotReady {
        /// Which process.
        index: usize,
        /// Its slice, `start..end`.
        slice: String,
        /// What happened (its last output lines).
        reason: String,
    },
    /// A process's endpoint list could not be read.
    #[error("cannot read the endpoint list of bmc-sim process {index}")]
    Endpoints {
        /// Which process.
        index: usize,
        /// The reason.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A control API request failed.
    #[error("bmc-sim control API {url}")]
    Control {
        /// The URL.
        url: String,
        /// The reason.
        #[source]
        source: reqwest::Error,
    },
}

struct Member {
    child: Child,
    control_url: String,
}

/// Running `bmc-sim` processes serving one fleet. Dropping it kills them.
pub struct FleetProcesses {
    members: Vec<Member>,
    endpoints: Vec<Endpoint>,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for FleetProcesses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetProcesses")
            .field("processes", &self.members.len())
            .field("nodes", &self.endpoints.len())
            .finish_non_exhaustive()
    }
}

/// The slices `0..nodes` is cut into: `processes` runs of nearly equal length, in order.
pub fn slices(nodes: usize, processes: usize) -> Vec<std::ops::Range<usize>> {
    let processes = processes.clamp(1, nodes.max(1));
    (0..processes)
        .map(|i| (i * nodes / processes)..((i + 1) * nodes / processes))
        .collect()
}

impl FleetProcesses {
    /// Starts the processes and waits until each has bound every port and written its endpoints.
    pub async fn start(options: &ProcessOptions) -> Result<FleetProcesses, ProcessError> {
        if options.processes == 0 || options.processes > options.nodes {
            return Err(ProcessError::Options(format!(
                "{} process(es) for {} node(s): need at least one node per process",
                options.processes, options.nodes
            )));
        }
        let first = u32::from(options.first_address);
        let last = first.checked_add(options.processes as u32 - 1);
        if last.is_none_or(|l| l > u32::from(Ipv4Addr::new(127, 255, 255, 255))) || !options.first_address.is_loopback()
        {
            return Err(ProcessError::Options(format!(
                "{} processes from {} leave the loopback network 127.0.0.0/8",
                options.processes, options.first_address
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("bmc-sim-processes-")
            .tempdir()
            .map_err(ProcessError::Scenario)?;
        let scenario = dir.path().join("scenario.yaml");
        std::fs::write(&scenario, &options.scenario_yaml).map_err(ProcessError::Scenario)?;
        let mut members = Vec::with_capacity(options.processes);
        let mut pending = Vec::with_capacity(options.processes);
        let result = async {
            for (index, slice) in slices(options.nodes, options.processes).into_iter().enumerate() {
                let address = Ipv4Addr::from(first + index as u32);
                let out = dir.path().join(format!("endpoints-{index}.json"));
                let mut child = spawn(options, &scenario, index, &slice, address, &out)?;
                let stdout = child.stdout.take();
                pending.push((index, slice, out, stdout));
                members.push(Member {
                    child,
                    control_url: String::new(),
                });
            }
            let mut endpoints = Vec::with_capacity(options.nodes);
            // They start in parallel; reading their readiness in order costs nothing more.
            for (index, slice, out, stdout) in pending {
                let control_url = wait_ready(index, &slice, stdout).await?;
                members[index].control_url = control_url;
                let text = std::fs::read_to_string(&out).map_err(|e| ProcessError::Endpoints {
                    index,
                    source: Box::new(e),
                })?;
                let mut list: Vec<Endpoint> = serde_json::from_str(&text).map_err(|e| ProcessError::Endpoints {
                    index,
                    source: Box::new(e),
                })?;
                endpoints.append(&mut list);
            }
            Ok::<_, ProcessError>(endpoints)
        }
        .await;
        let endpoints = match result {
            Ok(e) => e,
            Err(err) => {
                for m in &mut members {
                    let _ = m.child.start_kill();
                }
                return Err(err);
            }
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| ProcessError::Options(format!("cannot build the control API client: {e}")))?;
        Ok(FleetProcesses {
            members,
            endpoints,
            http,
            _dir: dir,
        })
    }

    /// Every BMC, in fleet order.
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// Each process's control API base URL.
    pub fn control_urls(&self) -> Vec<String> {
        self.members.iter().map(|m| m.control_url.clone()).collect()
    }

    /// Current versions of every node's components, from every process (`GET /sim/versions`).
    pub async fn versions(&self) -> Result<std::collections::HashMap<String, Vec<ComponentVersions>>, ProcessError> {
        let mut all = std::collections::HashMap::with_capacity(self.endpoints.len());
        for m in &self.members {
            let part: std::collections::HashMap<String, Vec<ComponentVersions>> =
                self.get_json(&format!("{}/sim/versions", m.control_url)).await?;
            all.extend(part);
        }
        Ok(all)
    }

    /// Flashes started per version, per node that had any (`GET /sim/flash-counts`).
    pub async fn flash_counts(
        &self,
    ) -> Result<std::collections::HashMap<String, std::collections::BTreeMap<String, u32>>, ProcessError> {
        let mut all = std::collections::HashMap::new();
        for m in &self.members {
            let part: std::collections::HashMap<String, std::collections::BTreeMap<String, u32>> =
                self.get_json(&format!("{}/sim/flash-counts", m.control_url)).await?;
            all.extend(part);
        }
        Ok(all)
    }

    /// Every process's `GET /sim/nodes`, concatenated.
    pub async fn nodes_json(&self) -> Result<Vec<serde_json::Value>, ProcessError> {
        let mut all = Vec::with_capacity(self.endpoints.len());
        for m in &self.members {
            let part: Vec<serde_json::Value> = self.get_json(&format!("{}/sim/nodes", m.control_url)).await?;
            all.extend(part);
        }
        Ok(all)
    }

    /// Moves every process's clock forward to `at` (the caller moves its own).
    pub async fn skip_to(&self, at: DateTime<Utc>) -> Result<(), ProcessError> {
        for m in &self.members {
            let url = format!("{}/sim/clock/skip", m.control_url);
            self.http
                .post(&url)
                .json(&serde_json::json!({ "to": at.to_rfc3339() }))
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|source| ProcessError::Control { url, source })?;
        }
        Ok(())
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, ProcessError> {
        let control = |source| ProcessError::Control {
            url: url.to_owned(),
            source,
        };
        self.http
            .get(url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(control)?
            .json()
            .await
            .map_err(control)
    }

    /// CPU seconds (user + system) the processes used so far, from `/proc/PID/stat` (0 off Linux).
    pub fn cpu_seconds(&self) -> f64 {
        self.members
            .iter()
            .filter_map(|m| m.child.id())
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
            .map(|stat| {
                // `pid (comm) state ...`: split after the last ')'; utime and stime are fields 14, 15.
                let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                // USER_HZ is 100 on Linux.
                (ticks(11) + ticks(12)) / 100.0
            })
            .sum()
    }

    /// Peak resident memory of each process (`VmHWM`, MiB), in process order.
    pub fn peak_rss_mib(&self) -> Vec<f64> {
        self.members
            .iter()
            .filter_map(|m| m.child.id())
            .map(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .ok()
                    .and_then(|t| {
                        t.lines()
                            .find(|l| l.starts_with("VmHWM:"))
                            .and_then(|l| l.split_whitespace().nth(1))
                            .and_then(|v| v.parse::<f64>().ok())
                    })
                    .unwrap_or(0.0)
                    / 1024.0
            })
            .collect()
    }

    /// Stops every process (SIGKILL: they hold nothing worth a graceful end) and reaps it.
    pub async fn shutdown(mut self) {
        for m in &mut self.members {
            let _ = m.child.start_kill();
        }
        for m in &mut self.members {
            let _ = tokio::time::timeout(Duration::from_secs(10), m.child.wait()).await;
        }
    }
}

fn spawn(
    options: &ProcessOptions,
    scenario: &Path,
    index: usize,
    slice: &std::ops::Range<usize>,
    address: Ipv4Addr,
    endpoints_out: &Path,
) -> Result<Child, ProcessError> {
    let mut command = Command::new(&options.program);
    command
        .args(&options.leading_args)
        .arg("--scenario")
        .arg(scenario)
        .arg("--nodes")
        .arg(options.nodes.to_string())
        .arg("--slice")
        .arg(format!("{}..{}", slice.start, slice.end))
        .arg("--bind")
        .arg(IpAddr::V4(address).to_string())
        .arg("--speedup")
        .arg(options.speedup.to_string())
        .arg("--clock-epoch")
        .arg(options.clock_epoch.to_rfc3339())
        .arg("--hang-for-ms")
        .arg(options.hang_for.as_millis().to_string())
        .arg("--endpoints-out")
        .arg(endpoints_out)
        .arg("--username")
        .arg(&options.username)
        .arg("--password-env")
        .arg(PASSWORD_ENV)
        .env(PASSWORD_ENV, &options.password)
        .env(
            "RUST_LOG",
            std::env::var("BMC_SIM_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        // A controller that dies must not leave 100,000 BMCs listening.
        .kill_on_drop(true);
    if !options.keep_alive {
        command.arg("--no-keep-alive");
    }
    command.spawn().map_err(|source| ProcessError::Spawn {
        program: options.program.clone(),
        index,
        source,
    })
}

/// Reads the process's stdout until it names its control URL, the last thing it prints once every
/// port is bound and the endpoint list written.
async fn wait_ready(
    index: usize,
    slice: &std::ops::Range<usize>,
    stdout: Option<tokio::process::ChildStdout>,
) -> Result<String, ProcessError> {
    let not_ready = |reason: String| ProcessError::NotReady {
        index,
        slice: format!("{}..{}", slice.start, slice.end),
        reason,
    };
    let stdout = stdout.ok_or_else(|| not_ready("no stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await.map_err(|e| not_ready(e.to_string()))? {
            if let Some(url) = line.strip_prefix("control: ") {
                return Ok(url.trim().to_owned());
            }
            seen.push(line);
        }
        Err(not_ready(format!("it exited; output: {}", seen.join(" | "))))
    };
    let url = tokio::time::timeout(READY_TIMEOUT, read)
        .await
        .map_err(|_| not_ready(format!("no answer in {} s", READY_TIMEOUT.as_secs())))??;
    // Keep draining stdout so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::{DEFAULT_NODES_PER_PROCESS, processes_within, slices};

    #[test]
    fn processes_fit_the_inherited_open_file_limit() {
        // This machine's 20,000: 10,000 BMCs a process.
        assert_eq!(processes_within(100_000, 20_000), 10);
        assert_eq!(processes_within(10_000, 20_000), 1);
        // A controller under `ulimit -n 4096`: 2,048 BMCs a process, 5 for 10,000.
        assert_eq!(processes_within(10_000, 4_096), 5);
        // No limit still caps a process's share; a tiny one still gives every node a process.
        assert_eq!(
            processes_within(25_000, u64::MAX),
            25_000_usize.div_ceil(DEFAULT_NODES_PER_PROCESS)
        );
        assert_eq!(processes_within(3, 1), 3);
        assert_eq!(processes_within(0, 4_096), 1);
    }

    #[test]
    fn slices_cover_the_fleet_in_order_without_gaps() {
        for (nodes, processes) in [(10, 3), (100_000, 10), (7, 7), (5, 9), (1, 1)] {
            let s = slices(nodes, processes);
            assert_eq!(s.first().map(|r| r.start), Some(0));
            assert_eq!(s.last().map(|r| r.end), Some(nodes));
            assert!(s.windows(2).all(|w| w[0].end == w[1].start));
            assert!(s.iter().all(|r| !r.is_empty()), "{nodes}/{processes}: {s:?}");
        }
    }
}
