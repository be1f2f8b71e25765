//! Rollouts that drain nodes through a real Slurm (Debian's 22.05 on
//! loopback, one `slurmd -N` per simulated node) before flashing them over
//! Redfish (bmc-sim), and resume them after:
//!
//! - a node running a job is flashed only once it is DRAINED; an operator's
//!   drain is left alone (the step is deferred, never a failure) and never
//!   resumed; every node Waveguard drained is back in service at the end;
//!   the capacity cap holds at every moment (from the audited drain records);
//! - a node that never empties is skipped (and resumed) or held for a human,
//!   per the wave's `on_drain_timeout`, without spending the failure budget;
//! - a controller killed between drain and flash, and between flash and
//!   resume, leaves nothing drained once a new controller has taken over.
//!
//! Skips loudly without the Slurm programs unless `WAVEGUARD_REQUIRE_ALL=1`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use integration_tests::fixtures::{PolicyYaml, WaveSize, WaveYaml};
use integration_tests::{GPU_FROM, GPU_TO, Harness, ScenarioYaml};
use orchestrator_db::AuditFilter;
use orchestrator_db::execution::{ExecStep, RolloutState, StepFilter, StepState};
use orchestrator_engine::{Blocker, EngineConfig, GatelessJudge, WorkloadScheduler};
use orchestrator_scheduler::slurm::{SlurmScheduler, StateSource};
use orchestrator_scheduler::testing::{LoopbackSlurm, slurm_present};
use orchestrator_scheduler::{NameMapping, NodeState, ReasonTag, Scheduler, SchedulerError, SchedulerNodeName};
use orchestrator_types::{DrainPhase, RolloutId};

const LIMIT: Duration = Duration::from_secs(120);

fn node_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i:05}")).collect()
}

fn start_slurm(nodes: &[String]) -> LoopbackSlurm {
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    LoopbackSlurm::start(&names, 2).expect("start the loopback Slurm cluster")
}

/// A Slurm adapter that goes dark (every call fails) right after it has
/// drained and read back `dark_after`: the engine's drain work stops there
/// while its steps keep moving, as when a controller dies between the flash
/// and the resume.
#[derive(Debug)]
struct Switchable {
    inner: SlurmScheduler,
    dark_after: String,
    armed: AtomicBool,
    reads_fail: AtomicBool,
}

impl Switchable {
    fn check(&self) -> Result<(), SchedulerError> {
        if self.reads_fail.load(Ordering::SeqCst) {
            // A timeout, as a scheduler that stopped answering gives.
            return Err(SchedulerError::Timeout {
                program: "scontrol".into(),
                seconds: 20,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Scheduler for Switchable {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn node_state(&self, node: &SchedulerNodeName) -> Result<NodeState, SchedulerError> {
        self.check()?;
        let state = self.inner.node_state(node).await;
        if node.as_str() == self.dark_after && self.armed.swap(false, Ordering::SeqCst) {
            self.reads_fail.store(true, Ordering::SeqCst);
        }
        state
    }
    async fn all_states(&self) -> Result<Vec<NodeState>, SchedulerError> {
        self.check()?;
        self.inner.all_states().await
    }
    async fn drain(&self, node: &SchedulerNodeName, reason: &ReasonTag) -> Result<(), SchedulerError> {
        self.check()?;
        self.inner.drain(node, reason).await?;
        if node.as_str() == self.dark_after {
            self.armed.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
    async fn resume(&self, node: &SchedulerNodeName) -> Result<(), SchedulerError> {
        self.check()?;
        self.inner.resume(node).await
    }
}

fn config_with(h: &Harness, scheduler: Arc<dyn Scheduler>) -> EngineConfig {
    EngineConfig {
        scheduler: Some(WorkloadScheduler {
            scheduler,
            names: NameMapping::default(),
        }),
        // Ten simulated minutes (2.5 s real): a killed controller's lease
        // expires quickly, a pass with scheduler calls renews it in time.
        lease_ttl: chrono::Duration::minutes(10),
        ..h.config()
    }
}

fn one_wave(drain_lines: &[&str], concurrency: &[&str]) -> String {
    let mut wave = WaveYaml::new("all", WaveSize::Rest).bake("1m");
    for line in drain_lines {
        wave = wave.line(line);
    }
    PolicyYaml::two_waves("drain")
        .waves(vec![wave])
        .concurrency(64, concurrency)
        .max_failed(0)
        .automatic_rollback(false)
        .render()
}

async fn steps_by_node(h: &Harness, rollout: RolloutId) -> BTreeMap<String, ExecStep> {
    let nodes = h.db.list_nodes(&Default::default()).await.expect("nodes");
    let names: BTreeMap<i64, String> = nodes.into_iter().map(|n| (n.id.0, n.name)).collect();
    h.db.steps(&StepFilter {
        rollout_id: Some(rollout),
        ..Default::default()
    })
    .await
    .expect("steps")
    .into_iter()
    .map(|s| (names[&s.node_id.0].clone(), s))
    .collect()
}

async fn wait_until<T>(what: &str, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Submits a long job pinned to `node` and waits until it runs.
async fn job_on(slurm: &LoopbackSlurm, node: &str) -> String {
    let job = slurm
        .client(
            "sbatch",
            &["--parsable", "-w", node, "-o", "/dev/null", "--wrap", "sleep 3600"],
        )
        .expect("sbatch");
    wait_until("the job to run", async || {
        let state = slurm.client("squeue", &["-h", "-j", &job, "-o", "%T"]).ok()?;
        (state == "RUNNING").then_some(())
    })
    .await;
    job
}

async fn slurm_state(scheduler: &dyn Scheduler, node: &str) -> NodeState {
    scheduler
        .node_state(&SchedulerNodeName::new(node).expect("name"))
        .await
        .expect("node state")
}

/// The most drain records ever open at once, replayed from the audit log.
async fn max_open_drains(h: &Harness) -> usize {
    let entries =
        h.db.audit_entries(&AuditFilter {
            action: Some("scheduler.drain".into()),
            ..Default::default()
        })
        .await
        .expect("audit");
    let mut entries: Vec<_> = entries.into_iter().collect();
    entries.sort_by_key(|e| e.id);
    let mut open = std::collections::HashSet::new();
    let mut most = 0;
    for entry in entries {
        let id = entry.details["drain_id"].as_i64().expect("drain id");
        match entry.details["to"].as_str() {
            Some("drain_intended") => {
                open.insert(id);
            }
            Some("closed") => {
                open.remove(&id);
            }
            _ => {}
        }
        most = most.max(open.len());
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_node_is_flashed_once_drained_an_operators_drain_is_left_alone_and_every_node_returns() {
    if !slurm_present("engine drain test") {
        return;
    }
    let names = node_names(5);
    let slurm = start_slurm(&names);
    // One cluster of five, so the capacity cap below is one node.
    let scenario = ScenarioYaml::hgx(5)
        .layout(3, 1)
        .gpu_firmware(GPU_TO, "{min: 2m, max: 4m}")
        .gpu_firmware(GPU_FROM, "{min: 2m, max: 4m}")
        .build();
    let mut h = Harness::start_with(scenario, false).await.expect("harness");
    let adapter: Arc<dyn Scheduler> = Arc::new(slurm.scheduler(StateSource::SinfoJson));
    // An operator took node-00001 out for a disk swap; node-00002 runs a job.
    slurm
        .client(
            "scontrol",
            &["update", "NodeName=node-00001", "State=DRAIN", "Reason=disk swap"],
        )
        .expect("operator drain");
    let job = job_on(&slurm, "node-00002").await;
    // Someone drained node-00004 with a reason that looks like Waveguard's;
    // Waveguard has no record of it, so it is theirs: reported, left alone.
    slurm
        .client(
            "scontrol",
            &[
                "update",
                "NodeName=node-00004",
                "State=DRAIN",
                "Reason=waveguard rollout=99 firmware maintenance",
            ],
        )
        .expect("look-alike drain");

    let release = h.add_release(GPU_TO, true).await;
    // 5 equal nodes, at most 25% of the cluster's GPUs out of service: one node at a time.
    let policy = one_wave(&[], &["max_out_of_service_percent: 25"]);
    let rollout = h.start_rollout(release.id, policy, 3).await.id;
    h.start_engine_with(config_with(&h, adapter.clone()), Arc::new(GatelessJudge));

    // The busy node is drained and waits: not flashed while its job runs.
    wait_until("node-00002 drained and waiting for its job", async || {
        let drains = h.db.rollout_drains(rollout).await.ok()?;
        drains
            .iter()
            .any(|d| d.scheduler_node == "node-00002" && d.phase == DrainPhase::Held)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let steps = steps_by_node(&h, rollout).await;
    assert_eq!(
        steps["node-00002"].state,
        StepState::Pending,
        "no flash while a job runs"
    );
    assert!(
        h.fleet.flash_counts("node-00002").unwrap().is_empty(),
        "node-00002 flashed with a job on it"
    );
    let state = slurm_state(adapter.as_ref(), "node-00002").await;
    assert!(state.drain && state.alloc_cpus > 0, "draining with its job: {state:?}");
    let wave = &h.db.rollout_waves(rollout).await.unwrap()[0];
    assert!(
        wave.blockers
            .iter()
            .any(|b| matches!(b, Blocker::Drain { node, .. } if node == "node-00002")),
        "the wave says what it waits on: {:?}",
        wave.blockers
    );

    slurm.client("scancel", &[&job]).expect("scancel");
    let done = h
        .wait_for(rollout, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    let status = h.engine.as_ref().expect("engine").controller_status();
    assert_eq!(status.orphaned_drains, ["node-00004"], "the periodic check reports it");
    h.stop_engine().await;

    let steps = steps_by_node(&h, rollout).await;
    assert_eq!(steps["node-00004"].state, StepState::Deferred);
    assert!(slurm_state(adapter.as_ref(), "node-00004").await.drain, "never resumed");
    let operator = &steps["node-00001"];
    assert_eq!(operator.state, StepState::Deferred);
    let why = operator.error.as_deref().unwrap_or_default();
    assert!(why.contains("disk swap"), "the operator's reason is shown: {why}");
    assert!(h.fleet.flash_counts("node-00001").unwrap().is_empty());
    let state = slurm_state(adapter.as_ref(), "node-00001").await;
    assert!(
        state.drain && state.reason.as_ref().is_some_and(|r| r.text == "disk swap"),
        "the operator's drain is untouched: {state:?}"
    );
    for node in ["node-00000", "node-00002", "node-00003"] {
        assert_eq!(steps[node].state, StepState::Succeeded, "{node}");
        assert_eq!(
            h.fleet.flash_counts(node).unwrap().values().sum::<u32>(),
            1,
            "{node} flashed once"
        );
        let state = slurm_state(adapter.as_ref(), node).await;
        assert!(!state.drain, "{node} back in service: {state:?}");
    }
    let drains = h.db.rollout_drains(rollout).await.unwrap();
    assert_eq!(drains.len(), 3, "{drains:?}");
    assert!(
        drains
            .iter()
            .all(|d| d.phase == DrainPhase::Closed && d.close_reason.as_deref() == Some("resumed")),
        "{drains:?}"
    );
    assert!(h.db.open_drains().await.unwrap().is_empty());
    assert_eq!(max_open_drains(&h).await, 1, "the capacity cap held");
    h.shutdown().await;
}

async fn never_empties(on_timeout: &str) {
    if !slurm_present("engine drain timeout test") {
        return;
    }
    let names = node_names(2);
    let slurm = start_slurm(&names);
    let mut h = Harness::start(2, "", false).await.expect("harness");
    let adapter: Arc<dyn Scheduler> = Arc::new(slurm.scheduler(StateSource::SinfoJson));
    let job = job_on(&slurm, "node-00000").await;
    let release = h.add_release(GPU_TO, true).await;
    // Ten simulated minutes are 2.5 real seconds here.
    let on_timeout_line = format!("on_drain_timeout: {on_timeout}");
    let policy = one_wave(&["drain_timeout: 10m", &on_timeout_line], &[]);
    let rollout = h.start_rollout(release.id, policy, 3).await.id;
    h.start_engine_with(config_with(&h, adapter.clone()), Arc::new(GatelessJudge));

    if on_timeout == "skip" {
        let done = h
            .wait_for(rollout, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
            .await;
        assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
        let steps = steps_by_node(&h, rollout).await;
        let busy = &steps["node-00000"];
        assert_eq!(busy.state, StepState::Deferred);
        assert!(
            busy.error.as_deref().unwrap_or_default().contains("drain_timeout"),
            "{:?}",
            busy.error
        );
        assert_eq!(steps["node-00001"].state, StepState::Succeeded);
        let state = slurm_state(adapter.as_ref(), "node-00000").await;
        assert!(
            !state.drain && state.alloc_cpus > 0,
            "given back with its job still running: {state:?}"
        );
        assert!(h.fleet.flash_counts("node-00000").unwrap().is_empty());
        let drains = h.db.rollout_drains(rollout).await.unwrap();
        assert!(drains.iter().all(|d| d.phase == DrainPhase::Closed), "{drains:?}");
    } else {
        wait_until("the wave to hold for a human", async || {
            let wave = h.db.rollout_waves(rollout).await.ok()?.remove(0);
            wave.blockers
                .iter()
                .any(|b| matches!(b, Blocker::DrainTimedOut { node } if node == "node-00000"))
                .then_some(())
        })
        .await;
        let rollout_now = h.db.exec_rollout(rollout).await.unwrap();
        assert_eq!(rollout_now.state, RolloutState::Running, "held, not halted");
        let steps = steps_by_node(&h, rollout).await;
        assert_eq!(steps["node-00000"].state, StepState::Pending);
        assert!(steps.values().all(|s| s.state != StepState::Failed));
        let state = slurm_state(adapter.as_ref(), "node-00000").await;
        assert!(state.drain, "kept drained for the human: {state:?}");
        // The job ends: the held node is flashed and returned after all.
        slurm.client("scancel", &[&job]).expect("scancel");
        let done = h
            .wait_for(rollout, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
            .await;
        assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
        let state = slurm_state(adapter.as_ref(), "node-00000").await;
        assert!(!state.drain, "returned: {state:?}");
    }
    h.stop_engine().await;
    let _ = slurm.client("scancel", &[&job]);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_empties_is_skipped_and_given_back_without_spending_the_budget() {
    never_empties("skip").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_empties_holds_the_wave_for_a_human_when_the_policy_says_hold() {
    never_empties("hold").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_between_drain_and_flash_or_flash_and_resume_strands_no_node() {
    if !slurm_present("engine drain crash test") {
        return;
    }
    let names = node_names(2);
    let slurm = start_slurm(&names);
    let mut h = Harness::start(2, "", false).await.expect("harness");
    let switchable = Arc::new(Switchable {
        inner: slurm.scheduler(StateSource::SinfoJson),
        dark_after: "node-00001".into(),
        armed: AtomicBool::new(false),
        reads_fail: AtomicBool::new(false),
    });
    let adapter: Arc<dyn Scheduler> = switchable.clone();
    let job = job_on(&slurm, "node-00000").await;
    let release = h.add_release(GPU_TO, true).await;
    let rollout = h.start_rollout(release.id, one_wave(&[], &[]), 3).await.id;

    // Controller 1 drains node-00001 (idle: flashed at once), and node-00000
    // (busy: waits for its job) or at least records the intent to. Right
    // after node-00001's drain reads back the scheduler goes dark, so the
    // flash finishes while the drain record still says held; then the
    // controller dies.
    let config = config_with(&h, adapter.clone());
    h.start_engine_with(
        EngineConfig {
            holder: "controller-1".into(),
            ..config.clone()
        },
        Arc::new(GatelessJudge),
    );
    wait_until("node-00001's flash to finish", async || {
        let steps = steps_by_node(&h, rollout).await;
        (steps["node-00001"].state == StepState::Succeeded).then_some(())
    })
    .await;
    h.engine.take().expect("engine").kill().await;

    // What the dead controller left: node-00000 drained before its flash,
    // node-00001 flashed and still drained.
    let drains = h.db.rollout_drains(rollout).await.unwrap();
    let phase = |node: &str| drains.iter().find(|d| d.scheduler_node == node).map(|d| d.phase);
    assert!(
        matches!(phase("node-00000"), Some(DrainPhase::Held | DrainPhase::DrainIntended)),
        "{drains:?}"
    );
    assert_eq!(phase("node-00001"), Some(DrainPhase::Held), "{drains:?}");
    switchable.reads_fail.store(false, Ordering::SeqCst);
    assert!(slurm_state(adapter.as_ref(), "node-00001").await.drain);
    assert_eq!(steps_by_node(&h, rollout).await["node-00000"].state, StepState::Pending);

    // Controller 2 takes over once the lease expires.
    h.start_engine_with(
        EngineConfig {
            holder: "controller-2".into(),
            ..config
        },
        Arc::new(GatelessJudge),
    );
    wait_until("node-00001 returned by the new controller", async || {
        let state = slurm_state(adapter.as_ref(), "node-00001").await;
        (!state.drain).then_some(())
    })
    .await;
    slurm.client("scancel", &[&job]).expect("scancel");
    let done = h
        .wait_for(rollout, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    h.stop_engine().await;
    for node in &names {
        let state = slurm_state(adapter.as_ref(), node).await;
        assert!(!state.drain, "{node} in service: {state:?}");
        assert_eq!(
            h.fleet.flash_counts(node).unwrap().get(GPU_TO),
            Some(&1),
            "{node} flashed exactly once"
        );
        let versions = h.fleet.versions(node).unwrap();
        assert!(
            versions
                .iter()
                .filter(|c| c.id.starts_with("HGX_FW_GPU_"))
                .all(|c| c.active == GPU_TO),
            "{node} on the intended version"
        );
    }
    assert!(h.db.open_drains().await.unwrap().is_empty());
    h.shutdown().await;
}

/// Stops a node's slurmd, as a host that does not come back after its
/// update would.
fn stop_slurmd(slurm: &LoopbackSlurm, node: &str) {
    let pid_file = slurm.dir.path().join(format!("slurmd-{node}.launcher.pid"));
    let pid = std::fs::read_to_string(&pid_file)
        .expect("slurmd pid")
        .trim()
        .to_owned();
    let status = std::process::Command::new("kill")
        .arg(&pid)
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_scheduler_daemon_never_returns_after_the_update_is_quarantined_not_waited_on() {
    if !slurm_present("engine drain quarantine test") {
        return;
    }
    let names = node_names(1);
    let slurm = start_slurm(&names);
    // A five-hour flash (75 real seconds): long enough for Slurm to notice
    // the dead slurmd (SlurmdTimeout=20) well before the update ends.
    let scenario = ScenarioYaml::hgx(1)
        .layout(3, 1)
        .gpu_firmware(GPU_TO, "{min: 5h, max: 5h}")
        .gpu_firmware(GPU_FROM, "{min: 5h, max: 5h}")
        .build();
    let mut h = Harness::start_with(scenario, false).await.expect("harness");
    let adapter: Arc<dyn Scheduler> = Arc::new(slurm.scheduler(StateSource::SinfoJson));
    let release = h.add_release(GPU_TO, true).await;
    let rollout = h.start_rollout(release.id, one_wave(&[], &[]), 3).await.id;
    let mut config = config_with(&h, adapter.clone());
    config.deadlines.task = chrono::Duration::hours(8);
    h.start_engine_with(config, Arc::new(GatelessJudge));
    wait_until("the flash under way", async || {
        let steps = steps_by_node(&h, rollout).await;
        steps["node-00000"].state.is_in_flight().then_some(())
    })
    .await;
    stop_slurmd(&slurm, "node-00000");

    let done = h
        .wait_for(rollout, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    h.stop_engine().await;
    let drain = h.db.rollout_drains(rollout).await.unwrap().remove(0);
    assert_eq!(drain.phase, DrainPhase::Quarantined, "{drain:?}");
    let why = drain.close_reason.clone().unwrap_or_default();
    assert!(why.contains("not back in its workload scheduler"), "{why}");
    let node = h.db.node_by_name("node-00000").await.unwrap();
    assert_eq!(node.state, orchestrator_types::NodeState::Quarantined);
    assert_eq!(node.state_reason.as_deref(), Some(why.as_str()));
    let state = slurm_state(adapter.as_ref(), "node-00000").await;
    assert!(state.drain && !state.responding, "left drained for a human: {state:?}");
    h.shutdown().await;
}
