//! The simulated fleet's state and the pure-ish model that derives everything else from simulated time.
//!
//! Invariant: nothing here runs on a timer. A task stores its start, its flash duration and its outcome
//! (drawn when the flash starts); readers call [`Node::settle`] which applies whatever has become true by
//! `clock.now()`. Health readings and event-log entries are functions of (seed, node, time bucket, firmware
//! active at that time), so any clock speed works and the answers do not depend on request order.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Duration, Utc};
use orchestrator_types::{Clock, ComponentKind};
use serde::Serialize;

use crate::rng::{self, Purpose};
use crate::scenario::{DurationRange, Metric, Scenario};

pub(crate) mod hardware;

/// The XIDs of `baseline.xid_errors_per_gpu_hour`: application and driver noise. XID 79 (fallen off
/// the bus) is a hardware failure, which the `hardware:` key schedules per part; as noise it would
/// make healthy GPUs RMA candidates.
pub const BASELINE_XID_CODES: [u16; 10] = [13, 31, 43, 45, 48, 63, 74, 109, 92, 94];

/// Health gauges keep their noise draw for this long, like a sensor's polling interval.
pub(crate) const GAUGE_BUCKET_SECS: i64 = 60;
/// Cap on entries per bucket so entry ids (`bucket * 10_000 + i`) stay unique.
const MAX_EVENTS_PER_BUCKET: usize = 9_999;

/// Labels describing where a node sits; used for blast-radius limits by the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct NodeLabels {
    /// Region.
    pub region: String,
    /// Cluster name.
    pub cluster: String,
    /// Rack name.
    pub rack: String,
    /// NVLink domain name.
    pub nvlink_domain: String,
    /// Platform SKU.
    pub sku: String,
}

/// Faults injected at runtime through the control API (bit flags in [`Node::injected`]).
pub(crate) mod fault {
    pub const UNAVAILABLE: u8 = 1;
    pub const TIMEOUT: u8 = 2;
    pub const MALFORMED: u8 = 4;
    pub const BRICK: u8 = 8;
    /// The event log's `Members@odata.nextLink` repeats the same page forever.
    pub const LOOPING_NEXT_LINK: u8 = 16;
}

/// One firmware inventory entry's state.
#[derive(Debug, Clone)]
pub(crate) struct ComponentState {
    pub id: String,
    pub kind: ComponentKind,
    pub updateable: bool,
    /// Reported as `LowestSupportedVersion` when set.
    pub lowest_supported_version: Option<String>,
    /// (active since, version), oldest first; the last entry is the active version.
    pub history: Vec<(DateTime<Utc>, String)>,
    /// Flashed but not yet active.
    pub pending: Option<Pending>,
}

impl ComponentState {
    pub fn active(&self) -> &str {
        self.history.last().map(|(_, v)| v.as_str()).unwrap_or("")
    }

    fn version_at(&self, t: DateTime<Utc>) -> Option<(DateTime<Utc>, &str)> {
        self.history
            .iter()
            .rev()
            .find(|(since, _)| *since <= t)
            .map(|(s, v)| (*s, v.as_str()))
    }
}

/// A staged version waiting for its reset.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    pub version: String,
    /// Set once the reset that activates it has been requested (or at flash end for `Immediate`).
    pub activate_at: Option<DateTime<Utc>>,
}

/// How a flash ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlashOutcome {
    Success,
    Fail,
    Brick,
}

/// Where a task is.
#[derive(Debug, Clone)]
pub(crate) enum TaskPhase {
    /// SimpleUpdate: the BMC is still downloading the image.
    Fetching,
    /// The image was refused before flashing (download failed, corrupt, wrong SKU, no targets...).
    Rejected {
        at: DateTime<Utc>,
        message_id: &'static str,
        message: String,
    },
    /// `LogService.CollectDiagnosticData`: collecting until `end`, then diagnostic entry `entry` exists.
    Collecting {
        end: DateTime<Utc>,
        /// The log entry it creates.
        entry: String,
        /// The action's URI and the request's parameters without credentials (the task's `Payload`).
        target: String,
        json_body: String,
    },
    /// Flashing from `start` to `end`; the outcome was drawn at start.
    Flashing {
        start: DateTime<Utc>,
        end: DateTime<Utc>,
        outcome: FlashOutcome,
        version: String,
    },
}

/// An update task.
#[derive(Debug, Clone)]
pub(crate) struct TaskRec {
    pub id: u64,
    pub created: DateTime<Utc>,
    pub targets: Vec<usize>,
    pub immediate: bool,
    pub phase: TaskPhase,
    /// Whether a finished flash has been applied to the components.
    pub applied: bool,
    /// For `Immediate` apply time: activation this long after the flash ends (the BMC's own reboot).
    pub activate_delay: Duration,
}

/// What a reader sees of a task at a given instant.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TaskView {
    pub state: &'static str,
    pub percent: u32,
    pub end: Option<DateTime<Utc>>,
    pub messages: Vec<(&'static str, String, &'static str)>,
}

impl TaskRec {
    /// `Location` of the log entry a finished diagnostic collection created.
    pub fn created_entry(&self, now: DateTime<Utc>) -> Option<&str> {
        match &self.phase {
            TaskPhase::Collecting { end, entry, .. } if *end <= now => Some(entry),
            _ => None,
        }
    }

    /// Whether the task updates firmware (a diagnostic collection holds no component).
    pub fn is_update(&self) -> bool {
        !matches!(self.phase, TaskPhase::Collecting { .. })
    }

    pub fn view(&self, now: DateTime<Utc>, components: &[ComponentState]) -> TaskView {
        let targets: Vec<&str> = self
            .targets
            .iter()
            .filter_map(|&i| components.get(i))
            .map(|c| c.id.as_str())
            .collect();
        match &self.phase {
            TaskPhase::Collecting { end, entry, .. } => {
                if now < *end {
                    TaskView {
                        state: "Running",
                        percent: (((now - self.created).num_milliseconds().max(0) * 100)
                            / (*end - self.created).num_milliseconds().max(1))
                        .clamp(0, 99) as u32,
                        end: None,
                        messages: vec![],
                    }
                } else {
                    TaskView {
                        state: "Completed",
                        percent: 100,
                        end: Some(*end),
                        messages: vec![(
                            "Base.1.18.ResourceCreated",
                            format!("The resource {entry} has been created successfully."),
                            "OK",
                        )],
                    }
                }
            }
            TaskPhase::Fetching => TaskView {
                state: "Running",
                percent: 0,
                end: None,
                messages: vec![],
            },
            TaskPhase::Rejected {
                at,
                message_id,
                message,
            } => {
                if now < *at {
                    TaskView {
                        state: "Running",
                        percent: 0,
                        end: None,
                        messages: vec![],
                    }
                } else {
                    TaskView {
                        state: "Exception",
                        percent: 0,
                        end: Some(*at),
                        messages: vec![(message_id, message.clone(), "Critical")],
                    }
                }
            }
            TaskPhase::Flashing {
                start,
                end,
                outcome,
                version,
            } => {
                let total = (*end - *start).num_milliseconds().max(1);
                let done = (now - *start).num_milliseconds();
                if now < *end {
                    // Real BMCs sit in New for a moment before work starts.
                    let state = if done < (total / 100).min(5_000) {
                        "New"
                    } else {
                        "Running"
                    };
                    let percent = ((done.max(0) * 100) / total).clamp(0, 99) as u32;
                    let msgs = targets
                        .iter()
                        .map(|t| {
                            (
                                "Update.1.0.ApplyingOnComponent",
                                format!("Image '{version}' is being applied on '{t}'."),
                                "OK",
                            )
                        })
                        .collect();
                    return TaskView {
                        state,
                        percent,
                        end: None,
                        messages: msgs,
                    };
                }
                match outcome {
                    FlashOutcome::Success | FlashOutcome::Brick => {
                        let mut msgs: Vec<_> = targets
                            .iter()
                            .map(|t| {
                                (
                                    "Update.1.0.UpdateSuccessful",
                                    format!("Device '{t}' successfully updated with image '{version}'."),
                                    "OK",
                                )
                            })
                            .collect();
                        if !self.immediate {
                            msgs.extend(targets.iter().map(|t| {
                                (
                                    "Update.1.0.AwaitToActivate",
                                    format!(
                                        "Awaiting for an action to proceed with activating image '{version}' on '{t}'."
                                    ),
                                    "OK",
                                )
                            }));
                        }
                        TaskView {
                            state: "Completed",
                            percent: 100,
                            end: Some(*end),
                            messages: msgs,
                        }
                    }
                    FlashOutcome::Fail => TaskView {
                        state: "Exception",
                        percent: 100,
                        end: Some(*end),
                        messages: targets
                            .iter()
                            .map(|t| {
                                (
                                    "Update.1.0.ApplyFailed",
                                    format!("Installation of image '{version}' to '{t}' failed."),
                                    "Critical",
                                )
                            })
                            .collect(),
                    },
                }
            }
        }
    }
}

/// `SessionService.SessionTimeout`: seconds of inactivity after which a session ends.
pub(crate) const SESSION_TIMEOUT_SECS: i64 = 1800;

/// A login session.
#[derive(Debug, Clone)]
pub(crate) struct SessionRec {
    pub id: u64,
    pub token: String,
    pub created: DateTime<Utc>,
    /// The last request made with this session (session clock, [`FleetState::session_now`]), from
    /// which its timeout runs.
    pub last_used: DateTime<Utc>,
}

/// Kind of event-log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventKind {
    Xid { gpu: u8, code: u16 },
    Aer { correctable: bool },
    LinkDegraded { width: u8 },
}

/// One generated event-log entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogEvent {
    pub id: u64,
    pub created: DateTime<Utc>,
    pub kind: EventKind,
}

/// Completed buckets are immutable, so they are generated once.
#[derive(Debug, Default)]
pub(crate) struct EventCache {
    pub next_bucket: u64,
    pub events: Vec<LogEvent>,
}

/// Mutable per-node state.
#[derive(Debug)]
pub(crate) struct NodeMut {
    pub components: Vec<ComponentState>,
    pub tasks: Vec<TaskRec>,
    pub sessions: HashMap<String, SessionRec>,
    pub next_session: u64,
    /// version -> number of flashes started with it.
    pub flash_counts: BTreeMap<String, u32>,
    pub flashes: u64,
    pub resets: u64,
    /// Host reboot in progress until this instant.
    pub reboot_until: Option<DateTime<Utc>>,
    pub events: EventCache,
    /// The UpdateService's global `HttpPushUri` settings.
    pub http_push: HttpPushSettings,
    /// Per GPU, the parts installed in it, oldest first (see [`hardware`]).
    pub gpu_parts: Vec<Vec<hardware::InstalledPart>>,
    /// Diagnostic data collected through `LogService.CollectDiagnosticData`, oldest first.
    pub diagnostics: Vec<DiagRecord>,
}

/// One `CollectDiagnosticData` result: a log entry once `done`, with its archive.
#[derive(Debug, Clone)]
pub(crate) struct DiagRecord {
    pub id: u64,
    /// `Manager` or `OEM`.
    pub kind: &'static str,
    pub oem_kind: Option<String>,
    pub done: DateTime<Utc>,
    /// Built when the request came in (what was collected), served unchanged on every download.
    pub archive: Arc<Vec<u8>>,
}

impl NodeMut {
    /// Ends every session idle for `SESSION_TIMEOUT_SECS` or longer at `now`, read from the session
    /// clock ([`FleetState::session_now`]): real time unless a test hands its own clock.
    pub(crate) fn expire_sessions(&mut self, now: DateTime<Utc>) {
        let timeout = chrono::Duration::seconds(SESSION_TIMEOUT_SECS);
        self.sessions.retain(|_, r| now - r.last_used < timeout);
    }
}

/// `HttpPushUriTargets` and its reservation flag, with the generation that makes the ETag.
#[derive(Debug, Clone, Default)]
pub(crate) struct HttpPushSettings {
    pub targets: Vec<String>,
    pub busy: bool,
    pub apply_immediate: bool,
    pub generation: u64,
}

/// One simulated BMC.
#[derive(Debug)]
pub struct Node {
    /// Position in the fleet (0-based); part of every random key.
    pub index: usize,
    /// Node name (`node-00042`).
    pub name: String,
    /// Placement labels.
    pub labels: NodeLabels,
    pub(crate) bmc_url: Mutex<String>,
    /// Silent window in epoch milliseconds of simulated time: [down_from, down_until).
    pub(crate) down_from: AtomicI64,
    pub(crate) down_until: AtomicI64,
    pub(crate) injected: AtomicU8,
    /// Real-time grace (nanoseconds since [`process_start`]) before a new silent window takes effect, so the
    /// answer to the `Manager.Reset` that started it still reaches the client.
    pub(crate) grace_until: AtomicU64,
    pub(crate) req_seq: AtomicU64,
    /// GETs of the GPU event log's entries collection (any page), for tests of client paging.
    pub(crate) event_log_pages: AtomicU64,
    pub(crate) inner: Mutex<NodeMut>,
}

/// Everything shared by the Redfish and control servers.
#[derive(Debug)]
pub(crate) struct FleetState {
    pub scenario: Scenario,
    pub clock: Arc<dyn Clock>,
    /// What session timeouts run on (`FleetOptions::session_clock`).
    pub session_clock: Arc<dyn Clock>,
    pub epoch: DateTime<Utc>,
    /// The nodes this process serves: the fleet's nodes `first..first + nodes.len()` (all of them
    /// unless the fleet is split over several processes).
    pub nodes: Vec<Node>,
    /// Fleet index of `nodes[0]`; a node's index is its place in the whole fleet.
    pub first: usize,
    /// The clock again, when the control API may move it forward (`POST /sim/clock/skip`).
    pub skips: Option<Arc<orchestrator_types::AcceleratedClock>>,
    pub username: String,
    pub password: String,
    pub http: reqwest::Client,
    pub hang_for: std::time::Duration,
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// GPU index -> component index, per the scenario's component order.
    pub gpu_components: Vec<usize>,
    pub gpus: usize,
    /// Effects per metric: (firmware index, effect index).
    pub effects_by_metric: HashMap<Metric, Vec<(usize, usize)>>,
    /// The simulated dcgm-exporters' restarts and stops.
    pub dcgm: DcgmState,
    /// Lots, serial scheme and scripted failures, fixed at start.
    pub parts_plan: hardware::PartsPlan,
    /// Client connections open now and at most so far, over every BMC.
    pub connections: ConnectionCount,
}

/// Connections open at the fleet's BMCs, now and at the peak: what a client's connection bound is
/// checked against.
#[derive(Debug, Default)]
pub(crate) struct ConnectionCount {
    open: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
}

impl ConnectionCount {
    pub(crate) fn opened(&self) {
        use std::sync::atomic::Ordering;
        let now = self.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    pub(crate) fn closed(&self) {
        self.open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// (open now, peak so far).
    pub(crate) fn read(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering;
        (self.open.load(Ordering::SeqCst), self.peak.load(Ordering::SeqCst))
    }
}

/// Real time a BMC keeps answering after deciding to go silent (see [`Node::grace_until`]).
pub(crate) const RESET_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

fn process_start() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

fn real_nanos() -> u64 {
    process_start().elapsed().as_nanos() as u64
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a node lock must not take the whole fleet down with poisoning.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Draws a duration uniformly from `range` with the given unit draw.
pub(crate) fn draw(range: DurationRange, u: f64) -> Duration {
    let span = range.max.saturating_sub(range.min);
    let d = range.min + span.mul_f64(u.clamp(0.0, 1.0));
    Duration::from_std(d).unwrap_or(Duration::MAX)
}

impl Node {
    pub(crate) fn lock(&self) -> MutexGuard<'_, NodeMut> {
        lock(&self.inner)
    }

    /// The node's Redfish base URL (`http://127.0.0.1:PORT`).
    pub fn bmc_url(&self) -> String {
        lock(&self.bmc_url).clone()
    }

    /// Whether the BMC is silent at `now_ms` (bricked, resetting, or injected brick).
    pub(crate) fn is_down(&self, now_ms: i64) -> bool {
        if self.injected.load(Ordering::Relaxed) & fault::BRICK != 0 {
            return true;
        }
        let from = self.down_from.load(Ordering::Relaxed);
        let until = self.down_until.load(Ordering::Relaxed);
        from <= now_ms && now_ms < until && real_nanos() >= self.grace_until.load(Ordering::Relaxed)
    }

    pub(crate) fn is_bricked(&self) -> bool {
        self.down_until.load(Ordering::Relaxed) == i64::MAX || self.injected.load(Ordering::Relaxed) & fault::BRICK != 0
    }

    /// Makes the BMC silent for [from, until); a brick (until = MAX) is never shortened. `grace` keeps it
    /// answering for [`RESET_GRACE`] of real time so the reply to the request that caused it gets out.
    pub(crate) fn set_down(&self, from: DateTime<Utc>, until: Option<DateTime<Utc>>, grace: bool) {
        if self.down_until.load(Ordering::Relaxed) == i64::MAX {
            return;
        }
        let grace = if grace { RESET_GRACE.as_nanos() as u64 } else { 0 };
        self.grace_until.store(real_nanos() + grace, Ordering::Relaxed);
        self.down_from.store(from.timestamp_millis(), Ordering::Relaxed);
        self.down_until
            .store(until.map_or(i64::MAX, |u| u.timestamp_millis()), Ordering::Relaxed);
    }

    /// Applies everything that has become true by `now`: finished flashes stage their version (or brick the
    /// BMC), requested resets activate staged versions.
    pub(crate) fn settle(&self, m: &mut NodeMut, now: DateTime<Utc>) {
        for t in m.tasks.iter_mut() {
            if t.applied {
                continue;
            }
            let TaskPhase::Flashing {
                end, outcome, version, ..
            } = &t.phase
            else {
                continue;
            };
            if *end > now {
                continue;
            }
            t.applied = true;
            if *outcome == FlashOutcome::Fail {
                continue;
            }
            for &c in &t.targets {
                if let Some(comp) = m.components.get_mut(c) {
                    comp.pending = Some(Pending {
                        version: version.clone(),
                        activate_at: if t.immediate {
                            Some(*end + t.activate_delay)
                        } else {
                            None
                        },
                    });
                }
            }
        }
        for c in m.components.iter_mut() {
            let due = matches!(&c.pending, Some(Pending { activate_at: Some(at), .. }) if *at <= now);
            if due && let Some(p) = c.pending.take() {
                let at = p.activate_at.unwrap_or(now);
                if c.active() != p.version {
                    c.history.push((at, p.version));
                }
            }
        }
        if m.reboot_until.is_some_and(|u| u <= now) {
            m.reboot_until = None;
        }
    }
}

impl FleetState {
    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Now on the session clock: the only reading session expiry uses.
    pub(crate) fn session_now(&self) -> DateTime<Utc> {
        self.session_clock.now()
    }

    /// The node with this fleet index, if this process serves it.
    pub(crate) fn node(&self, index: usize) -> Option<&Node> {
        self.nodes.get(index.checked_sub(self.first)?)
    }

    pub(crate) fn node_by_name(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// The (multiplier, addend) that firmware effects and fleet events apply to `metric` at `t`.
    pub(crate) fn adjust(
        &self,
        node: &Node,
        m: &NodeMut,
        metric: Metric,
        gpu: Option<usize>,
        t: DateTime<Utc>,
    ) -> (f64, f64) {
        let seed = self.scenario.seed;
        let n = node.index as u64;
        let (mut mult, mut add) = (1.0, 0.0);
        if let Some(list) = self.effects_by_metric.get(&metric) {
            for &(fi, ei) in list {
                let fw = &self.scenario.firmware[fi];
                let eff = &fw.effects[ei];
                if rng::unit(seed, n, Purpose::EffectShare, (fi * 64 + ei) as u64, 0) >= eff.share {
                    continue;
                }
                let onset = Duration::from_std(eff.onset).unwrap_or(Duration::MAX);
                let hit = |c: &ComponentState| {
                    c.kind == fw.kind
                        && c.version_at(t)
                            .is_some_and(|(since, v)| v == fw.version && since + onset <= t)
                };
                let active = match (gpu, fw.kind) {
                    // A GPU firmware effect on a per-GPU metric hits only the GPUs running that firmware.
                    (Some(g), ComponentKind::Gpu) if metric.is_per_gpu() => self
                        .gpu_components
                        .get(g)
                        .and_then(|&ci| m.components.get(ci))
                        .is_some_and(hit),
                    _ => m.components.iter().any(hit),
                };
                if active {
                    mult *= eff.multiply;
                    add += eff.add;
                }
            }
        }
        for (i, ev) in self.scenario.events.iter().enumerate() {
            if ev.effect.metric != metric {
                continue;
            }
            let start = self.epoch + Duration::from_std(ev.at).unwrap_or(Duration::MAX);
            let end = start + Duration::from_std(ev.duration).unwrap_or(Duration::MAX);
            if t >= start && t < end && rng::unit(seed, n, Purpose::EventShare, i as u64, 0) < ev.effect.share {
                mult *= ev.effect.multiply;
                add += ev.effect.add;
            }
        }
        (mult, add)
    }

    /// GPU temperature (Celsius) and power (W) at `t`.
    pub(crate) fn gpu_gauges(&self, node: &Node, m: &NodeMut, gpu: usize, t: DateTime<Utc>) -> (f64, f64) {
        let seed = self.scenario.seed;
        let n = node.index as u64;
        let bucket = (t - self.epoch).num_seconds().max(0) as u64 / GAUGE_BUCKET_SECS as u64;
        let b = &self.scenario.baseline;
        let (tm, ta) = self.adjust(node, m, Metric::GpuTempC, Some(gpu), t);
        let (pm, pa) = self.adjust(node, m, Metric::GpuPowerW, Some(gpu), t);
        let temp = (b.gpu_temp_c.mean + b.gpu_temp_c.sd * rng::normal(seed, n, Purpose::TempNoise, gpu as u64, bucket))
            * tm
            + ta;
        let power = (b.gpu_power_w.mean
            + b.gpu_power_w.sd * rng::normal(seed, n, Purpose::PowerNoise, gpu as u64, bucket))
            * pm
            + pa;
        ((temp * 10.0).round() / 10.0, power.max(0.0).round())
    }

    /// The scenario's `baseline.event_bucket` (validated to 1 s..24 h, so the conversion cannot fail).
    pub(crate) fn event_bucket(&self) -> Duration {
        Duration::from_std(self.scenario.baseline.event_bucket).unwrap_or(Duration::minutes(10))
    }

    fn bucket_start(&self, b: u64) -> DateTime<Utc> {
        self.epoch + self.event_bucket() * (b as i32)
    }

    /// All entries of one bucket, sorted by time, with stable ids.
    fn generate_bucket(&self, node: &Node, m: &NodeMut, b: u64) -> Vec<LogEvent> {
        use rand::Rng;
        let seed = self.scenario.seed;
        let n = node.index as u64;
        let start = self.bucket_start(b);
        let bucket = self.event_bucket();
        let hours = bucket.num_seconds() as f64 / 3600.0;
        let base = &self.scenario.baseline;
        let mut out: Vec<(DateTime<Utc>, EventKind)> = Vec::new();
        let mut emit =
            |purpose: Purpose, sub: u64, lambda: f64, make: &dyn Fn(&mut rand_chacha::ChaCha8Rng) -> EventKind| {
                // One uniform decides the count by inversion, so the common "no event" case needs no stream.
                let count = poisson_by_inversion(rng::unit(seed, n, purpose, sub, b), lambda);
                if count == 0 {
                    return;
                }
                let mut r = rng::stream(seed, n, purpose, sub, b);
                for _ in 0..count {
                    let offset_ms = (r.random::<f64>() * bucket.num_milliseconds() as f64) as i64;
                    out.push((start + Duration::milliseconds(offset_ms), make(&mut r)));
                }
            };
        for g in 0..self.gpus {
            // A GPU off the bus reports nothing through the driver until it is replaced.
            if self
                .failure_at(m, g, start)
                .is_some_and(|f| f.mode == crate::scenario::HardwareFailureMode::FallenOffBus)
            {
                continue;
            }
            let (mul, add) = self.adjust(node, m, Metric::XidErrorsPerGpuHour, Some(g), start);
            let rate = (base.xid_errors_per_gpu_hour * mul + add).max(0.0);
            emit(Purpose::Xid, g as u64, rate * hours, &|r| EventKind::Xid {
                gpu: g as u8,
                code: BASELINE_XID_CODES[r.random_range(0..BASELINE_XID_CODES.len())],
            });
        }
        let (mul, add) = self.adjust(node, m, Metric::PcieAerPerNodeHour, None, start);
        let rate = (base.pcie_aer_per_node_hour * mul + add).max(0.0);
        emit(Purpose::Aer, 0, rate * hours, &|r| EventKind::Aer {
            correctable: r.random::<f64>() < 0.9,
        });
        let (mul, add) = self.adjust(node, m, Metric::LinkDegradedPerNodeDay, None, start);
        let rate = (base.link_degraded_per_node_day * mul + add).max(0.0);
        emit(Purpose::Link, 0, rate * hours / 24.0, &|r| EventKind::LinkDegraded {
            width: if r.random::<bool>() { 8 } else { 4 },
        });
        out.extend(self.hardware_events(m, start, start + bucket));
        out.sort_by_key(|(t, _)| *t);
        out.truncate(MAX_EVENTS_PER_BUCKET);
        out.into_iter()
            .enumerate()
            .map(|(i, (created, kind))| LogEvent {
                id: b * 10_000 + i as u64 + 1,
                created,
                kind,
            })
            .collect()
    }

    /// Event-log entries up to `now`, oldest first. Completed buckets are cached.
    pub(crate) fn events_until(&self, node: &Node, m: &mut NodeMut, now: DateTime<Utc>) -> Vec<LogEvent> {
        if now < self.epoch {
            return Vec::new();
        }
        let current = ((now - self.epoch).num_milliseconds() / self.event_bucket().num_milliseconds()) as u64;
        while m.events.next_bucket < current {
            let b = m.events.next_bucket;
            let evs = self.generate_bucket(node, m, b);
            m.events.events.extend(evs);
            m.events.next_bucket += 1;
        }
        let mut all = m.events.events.clone();
        all.extend(
            self.generate_bucket(node, m, current)
                .into_iter()
                .filter(|e| e.created <= now),
        );
        all
    }
}

/// Poisson(lambda) by inverting the CDF at `u`.
pub(crate) fn poisson_by_inversion(u: f64, lambda: f64) -> u64 {
    if lambda.is_nan() || lambda <= 0.0 {
        return 0;
    }
    if lambda > 50.0 {
        // Normal approximation; the product below would underflow.
        let z = inverse_normal_approx(u);
        return (lambda + z * lambda.sqrt()).round().max(0.0) as u64;
    }
    let mut p = (-lambda).exp();
    let mut cdf = p;
    let mut k = 0u64;
    while u > cdf && k < 10_000 {
        k += 1;
        p *= lambda / k as f64;
        cdf += p;
    }
    k
}

/// Rough inverse of the standard normal CDF (logistic approximation; fine for event counts).
fn inverse_normal_approx(u: f64) -> f64 {
    let u = u.clamp(1e-9, 1.0 - 1e-9);
    (u / (1.0 - u)).ln() / 1.702
}

/// Per-node exporter state the control server changes.
#[derive(Debug, Default)]
pub(crate) struct DcgmState {
    nodes: Mutex<HashMap<usize, Exporter>>,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Exporter {
    pub(crate) restarted: Option<DateTime<Utc>>,
    pub(crate) stopped: bool,
}

impl DcgmState {
    pub(crate) fn get(&self, node: usize) -> Exporter {
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&node)
            .copied()
            .unwrap_or_default()
    }

    pub(crate) fn update(&self, node: usize, f: impl FnOnce(&mut Exporter)) {
        let mut map = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        f(map.entry(node).or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_inversion_mean() {
        let n = 20_000;
        let mean: f64 = (0..n)
            .map(|i| poisson_by_inversion(rng::unit(1, i, Purpose::Xid, 0, 0), 2.5) as f64)
            .sum::<f64>()
            / n as f64;
        assert!((mean - 2.5).abs() < 0.1, "{mean}");
        assert_eq!(poisson_by_inversion(0.5, 0.0), 0);
    }
}
