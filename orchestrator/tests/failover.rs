//! High availability (issue 5): two `waveguard serve` replicas on one
//! database both serve the API; exactly one holds the executor lease and
//! executes. Take the leader away mid-rollout and the standby takes over
//! within the lease TTL and finishes the rollout with no double flash and no
//! skipped step:
//!
//! - SIGKILL the leader, on PostgreSQL (the HA setup the issue asks for;
//!   skips loudly without `WAVEGUARD_TEST_POSTGRES_URL`, fails with
//!   `WAVEGUARD_REQUIRE_ALL=1`);
//! - freeze the leader (SIGSTOP) until the standby has taken over and moved
//!   on, then let it run again (SIGCONT) in the middle of its old pass: its
//!   writes are fenced out and it sends nothing to a BMC on its expired
//!   lease. On PostgreSQL and on SQLite.

mod process_harness;

use std::time::Duration;

use orchestrator_db::execution::{RolloutState, StepState};
use orchestrator_engine::EXECUTOR_LEASE;
use process_harness::{LEASE_TTL_SIM_SECS, SPEEDUP, World, policy};

const NODES: usize = 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outage {
    /// SIGKILL: the leader is gone for good.
    Kill,
    /// SIGSTOP, then SIGCONT once the standby leads: a deposed leader that
    /// does not know it yet.
    Freeze,
}

async fn healthy(url: &str) {
    let status = reqwest::get(format!("{url}/healthz"))
        .await
        .expect("healthz answers")
        .status();
    assert_eq!(status, 200, "{url}/healthz");
}

async fn succeeded(world: &World, rollout: orchestrator_types::RolloutId) -> u64 {
    let counts = world.db.step_counts(rollout, None).await.expect("counts");
    counts.get(&StepState::Succeeded).copied().unwrap_or(0)
}

async fn failover(postgres: bool, outage: Outage) {
    let Some(mut world) = World::start(NODES, postgres).await else {
        return;
    };
    let rollout = world.start_rollout(policy(10)).await;
    let mut a = world.spawn_controller("replica-a");
    let mut b = world.spawn_controller("replica-b");
    healthy(&a.url()).await;
    healthy(&b.url()).await;

    // Exactly one leads.
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
    let (mut leader, mut standby) = if leader_holder == a.holder { (a, b) } else { (b, a) };

    // It keeps the lease (renewals keep the token) until mid-rollout: some
    // nodes done, most not.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while succeeded(&world, rollout).await < 15 {
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
        assert!(tokio::time::Instant::now() < deadline, "the leader made no progress");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(world.rollout_state(rollout).await, RolloutState::Running);

    // The lease TTL in real time, plus one engine interval and slack for a
    // loaded machine.
    let ttl_real = Duration::from_secs_f64(f64::from(LEASE_TTL_SIM_SECS) / SPEEDUP);
    let mut lost_at = std::time::Instant::now();
    match outage {
        Outage::Kill => leader.kill(),
        Outage::Freeze => leader.signal("STOP"),
    }
    if outage == Outage::Freeze && !postgres {
        // SQLite has no server to end a frozen process's transaction: a
        // leader stopped inside a write keeps the file's write lock, and
        // every replica waits until it runs again (a documented limit of
        // SQLite replicas). Such a freeze is undone and tried again, so
        // the test covers the case SQLite can handle: a leader stopped
        // between transactions.
        let mut tries = 1;
        while !world
            .leads_within(&mut standby, ttl_real + Duration::from_secs(5))
            .await
        {
            assert!(
                tries < 8,
                "the standby never took over from a frozen leader in {tries} freezes"
            );
            leader.signal("CONT");
            tokio::time::sleep(Duration::from_millis(137)).await;
            lost_at = std::time::Instant::now();
            leader.signal("STOP");
            tries += 1;
        }
    }
    world.wait_leader(&mut standby, Duration::from_secs(30)).await;
    let takeover = lost_at.elapsed();
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
    // One takeover, or more when a SQLite freeze was retried (the woken
    // leader may retake its expired lease before it is frozen again).
    assert!(
        new_token == token + 1 || (!postgres && new_token > token),
        "the takeover fences the old leader out: token {token} -> {new_token}"
    );
    healthy(&standby.url()).await;

    if outage == Outage::Freeze {
        // Let the new leader move on, then wake the old one mid-pass.
        let resume_after = succeeded(&world, rollout).await + 10;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while succeeded(&world, rollout).await < resume_after
            && world.rollout_state(rollout).await == RolloutState::Running
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the new leader made no progress"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        leader.signal("CONT");
        // The old leader finds its lease gone and stands by; it serves again.
        healthy(&leader.url()).await;
        tokio::time::sleep(ttl_real * 2).await;
        let (holder, still, _) = world
            .db
            .lease_holder(EXECUTOR_LEASE)
            .await
            .expect("lease")
            .expect("held");
        assert_eq!((holder.as_str(), still), (standby.holder.as_str(), new_token));
        let name = leader.holder.split(':').next().unwrap_or_default().to_owned();
        let log = world.log_of(&name);
        assert!(
            log.contains("lease lost"),
            "the woken leader noticed it was deposed; its log:\n{log}"
        );
    }

    world
        .wait_for(
            rollout,
            &[RolloutState::Completed, RolloutState::Halted],
            Duration::from_secs(120),
        )
        .await;
    world.check_completed_exactly_once(rollout).await;
    standby.terminate();
    if outage == Outage::Freeze {
        leader.terminate();
    }
    world.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_from_a_killed_leader_on_postgres() {
    failover(true, Outage::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_leader_is_fenced_out_when_it_wakes_on_postgres() {
    failover(true, Outage::Freeze).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_leader_is_fenced_out_when_it_wakes_on_sqlite() {
    failover(false, Outage::Freeze).await;
}
