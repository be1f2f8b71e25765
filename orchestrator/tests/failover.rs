//! High availability on PostgreSQL (issue 5): two `waveguard serve`
//! replicas on one database both serve the API; exactly one holds the
//! executor lease and executes. SIGKILL the leader mid-rollout: the standby
//! takes over within the lease TTL and finishes the rollout with no double
//! flash and no skipped step. Skips loudly without
//! `WAVEGUARD_TEST_POSTGRES_URL` (fails with `WAVEGUARD_REQUIRE_ALL=1`).

mod process_harness;

use std::time::Duration;

use orchestrator_db::execution::{RolloutState, StepState};
use orchestrator_engine::EXECUTOR_LEASE;
use process_harness::{LEASE_TTL_SIM_SECS, SPEEDUP, World, policy};

const NODES: usize = 60;

async fn healthy(url: &str) {
    let status = reqwest::get(format!("{url}/healthz"))
        .await
        .expect("healthz answers")
        .status();
    assert_eq!(status, 200, "{url}/healthz");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_replica_takes_over_from_a_killed_leader_without_double_flash() {
    let Some(mut world) = World::start(NODES, true).await else {
        return;
    };
    let rollout = world.start_rollout(policy(10)).await;
    let mut a = world.spawn_controller("replica-a");
    let mut b = world.spawn_controller("replica-b");
    let (url_a, url_b) = (a.url(), b.url());
    healthy(&url_a).await;
    healthy(&url_b).await;

    // Exactly one leads; it keeps the lease while it lives (renewals keep
    // the token), and the standby never writes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (leader_holder, token) = loop {
        if let Some((holder, token, _)) = world.db.lease_holder(EXECUTOR_LEASE).await.expect("lease")
            && (holder == a.holder || holder == b.holder)
        {
            break (holder, token);
        }
        assert!(tokio::time::Instant::now() < deadline, "no replica took the lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (leader, mut standby) = if leader_holder == a.holder { (a, b) } else { (b, a) };

    // Mid-rollout: some nodes done, most not.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let (holder, now_token, _) = world
            .db
            .lease_holder(EXECUTOR_LEASE)
            .await
            .expect("lease")
            .expect("held");
        assert_eq!(
            (holder.as_str(), now_token),
            (leader.holder.as_str(), token),
            "the leader keeps the lease"
        );
        let counts = world.db.step_counts(rollout, None).await.expect("counts");
        let done = counts.get(&StepState::Succeeded).copied().unwrap_or(0);
        if done >= 15 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader made no progress: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(world.rollout_state(rollout).await, RolloutState::Running);
    healthy(&url_a).await;
    healthy(&url_b).await;

    let killed_at = std::time::Instant::now();
    leader.kill();
    world.wait_leader(&mut standby, Duration::from_secs(30)).await;
    let takeover = killed_at.elapsed();
    // The lease TTL in real time, plus one engine interval and slack for a
    // loaded machine.
    let ttl_real = Duration::from_secs_f64(f64::from(LEASE_TTL_SIM_SECS) / SPEEDUP);
    assert!(
        takeover <= ttl_real + Duration::from_millis(1500),
        "standby took over after {takeover:?}; lease TTL is {ttl_real:?}"
    );
    let (_, new_token, _) = world
        .db
        .lease_holder(EXECUTOR_LEASE)
        .await
        .expect("lease")
        .expect("held");
    assert_eq!(new_token, token + 1, "the takeover fences the dead leader out");
    // The survivor still serves the API.
    healthy(&standby.url()).await;

    world
        .wait_for(
            rollout,
            &[RolloutState::Completed, RolloutState::Halted],
            Duration::from_secs(120),
        )
        .await;
    world.check_completed_exactly_once(rollout).await;
    standby.terminate();
    world.shutdown().await;
}
