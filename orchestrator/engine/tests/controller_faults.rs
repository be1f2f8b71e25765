//! Fault attribution: an EMFILE storm (the controller out of file
//! descriptors) injected through the BMC transport's connector seam while
//! flashes run pauses flashing, marks the controller degraded and resumes
//! after it, with no node's budget spent, no brick timer started and every
//! node flashed exactly once.
//!
//! The storm lasts longer in real time than the brick timeout (20 simulated
//! minutes are 5 real seconds at the harness speed-up) and than five backoffs
//! of the retry budget, so before fault attribution it quarantined nodes as
//! bricked or failed their steps.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use integration_tests::{GPU_FROM, GPU_TO, Harness, policy};
use orchestrator_bmc::{ConnectFaults, HttpClients};
use orchestrator_db::Db;
use orchestrator_db::execution::{ExecStep, RolloutState, StepFilter, StepState};
use orchestrator_types::{NodeState, RolloutId};

/// While `storm` is set every new connection fails with EMFILE, as
/// `socket(2)` does when the process is at its `ulimit -n`.
#[derive(Debug, Default)]
struct Emfile {
    storm: AtomicBool,
    injected: AtomicUsize,
}

impl ConnectFaults for Emfile {
    fn on_connect(&self) -> Option<std::io::Error> {
        if !self.storm.load(Ordering::SeqCst) {
            return None;
        }
        self.injected.fetch_add(1, Ordering::SeqCst);
        Some(std::io::Error::from_raw_os_error(24))
    }
}

async fn steps(db: &Db, rollout: RolloutId) -> Vec<ExecStep> {
    db.steps(&StepFilter {
        rollout_id: Some(rollout),
        ..Default::default()
    })
    .await
    .expect("steps")
}

/// No step carries evidence of the storm: no brick timer, no error text
/// from it (a retry charged to the node records the error), nothing failed,
/// no attempt spent beyond the one reset that activates a GPU image (a
/// charged retry, or a reset reissued because the storm outlasted the
/// activation timeout, would make it two).
fn assert_nothing_charged(steps: &[ExecStep], when: &str) {
    for s in steps {
        assert!(
            s.attempts <= 1,
            "{when}: step {:?} spent {} attempts: {:?}",
            s.id,
            s.attempts,
            s.error
        );
        assert!(
            s.unreachable_since.is_none(),
            "{when}: brick timer started on {:?}",
            s.id
        );
        assert_ne!(
            s.state,
            StepState::Failed,
            "{when}: step {:?} failed: {:?}",
            s.id,
            s.error
        );
        let error = s.error.as_deref().unwrap_or("");
        assert!(
            !error.contains("exhausted on this host") && !error.contains("os error 24"),
            "{when}: step {:?} charged with {error}",
            s.id
        );
    }
}

fn positions(steps: &[ExecStep]) -> BTreeMap<String, StepState> {
    steps.iter().map(|s| (format!("{:?}", s.id), s.state)).collect()
}

#[tokio::test]
async fn emfile_storm_during_flashes_pauses_degrades_and_resumes_without_charging_nodes() {
    let Some(mut h) = Harness::start(30, "", false).await else {
        return;
    };
    let release = h.add_release(GPU_TO, true).await;
    h.add_release(GPU_FROM, true).await;
    let rollout = h.start_rollout(release.id, policy("1m", "approval: auto"), 5).await;

    let faults = Arc::new(Emfile::default());
    let connector = h.connector_with(HttpClients::with_connect_faults(faults.clone()));
    let mut config = h.config();
    config.controller_fault_hold = Duration::from_secs(2);
    h.start_engine_on(config, connector);

    // Wait until flashes are under way.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let all = steps(&h.db, rollout.id).await;
        if all
            .iter()
            .any(|s| matches!(s.state, StepState::Flashing | StepState::Activating))
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no flash started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    faults.storm.store(true, Ordering::SeqCst);
    let storm_ends = tokio::time::Instant::now() + Duration::from_secs(8);
    let engine = h.engine.as_ref().expect("engine");

    // Degraded soon: in-flight polls and prechecks open new connections.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !engine.controller_status().degraded {
        assert!(
            tokio::time::Instant::now() < deadline,
            "controller never reported degraded"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = engine.controller_status();
    assert_eq!(status.reason.as_deref(), Some("controller_resource"));

    // Paused: while degraded (the hold is 2 s of real time, and nothing
    // moves to open a new connection), no step moves and no flash starts.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = positions(&steps(&h.db, rollout.id).await);
    let flashes_before: u32 = h
        .fleet
        .endpoints()
        .iter()
        .map(|e| h.fleet.flash_counts(&e.name).expect("sim node").values().sum::<u32>())
        .sum();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let during = steps(&h.db, rollout.id).await;
    let flashes_during: u32 = h
        .fleet
        .endpoints()
        .iter()
        .map(|e| h.fleet.flash_counts(&e.name).expect("sim node").values().sum::<u32>())
        .sum();
    let status_now = engine.controller_status();
    assert!(status_now.degraded, "still within the hold");
    assert_eq!(status_now.episodes_total, status.episodes_total, "one episode");
    assert_eq!(positions(&during), before, "no step moved while degraded");
    assert_eq!(flashes_during, flashes_before, "no flash started while degraded");
    assert_nothing_charged(&during, "during the storm");

    // The storm goes on past the brick timeout in real time; each time the
    // hold lapses the engine tries again, hits EMFILE, and pauses again.
    while tokio::time::Instant::now() < storm_ends {
        assert_nothing_charged(&steps(&h.db, rollout.id).await, "during the storm");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    faults.storm.store(false, Ordering::SeqCst);
    let injected = faults.injected.load(Ordering::SeqCst);
    assert!(injected > 0, "the storm hit no connection");

    let done = h
        .wait_for(
            rollout.id,
            &[RolloutState::Completed, RolloutState::Halted],
            Duration::from_secs(120),
        )
        .await;
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    let engine = h.engine.as_ref().expect("engine");
    let status = engine.controller_status();
    assert!(!status.degraded, "resumed: {status:?}");
    assert!(status.faults_total > 0 && status.episodes_total >= 1, "{status:?}");

    let all = steps(&h.db, rollout.id).await;
    assert!(
        all.iter().all(|s| s.state == StepState::Succeeded),
        "every step succeeded"
    );
    assert_nothing_charged(&all, "after the storm");
    for s in &all {
        let node = h.db.node(s.node_id).await.expect("node");
        assert_ne!(node.state, NodeState::Quarantined, "{}", node.name);
    }
    for e in h.fleet.endpoints() {
        let counts = h.fleet.flash_counts(&e.name).expect("sim node");
        assert_eq!(
            counts.values().sum::<u32>(),
            1,
            "{}: flashed exactly once: {counts:?}",
            e.name
        );
    }
    eprintln!(
        "storm: {injected} connects refused with EMFILE, {} controller faults, {} degraded episodes",
        status.faults_total, status.episodes_total
    );
    h.shutdown().await;
}
