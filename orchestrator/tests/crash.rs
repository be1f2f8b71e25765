//! The crash test of issue 5: the controller is a separate `waveguard serve`
//! process, killed with SIGKILL at random moments (seeded) while it leads a
//! three-wave rollout over a simulated fleet, and restarted each time. The
//! rollout must complete with every node on the target version, exactly one
//! flash per node and step by bmc-sim's own count, no step skipped, and an
//! intact audit log.

mod process_harness;

use std::time::Duration;

use orchestrator_db::execution::RolloutState;
use process_harness::{SplitMix, World, policy};

const NODES: usize = 150;
/// Kills while the rollout runs; the issue asks for at least 20.
const KILLS: usize = 24;
/// Kill moments are drawn from this seed (printed, so a failure replays).
const SEED: u64 = 0x5EED_0005;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_controller_finishes_the_rollout_flashing_each_node_once() {
    crash_run(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_controller_finishes_the_rollout_flashing_each_node_once_postgres() {
    crash_run(true).await;
}

async fn crash_run(postgres: bool) {
    let started = std::time::Instant::now();
    let Some(mut world) = World::start(NODES, postgres).await else {
        return;
    };
    let rollout = world.start_rollout(policy(10)).await;
    let seed = std::env::var("WAVEGUARD_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEED);
    eprintln!("crash test: seed {seed:#x} (set WAVEGUARD_CRASH_SEED to replay another)");
    let mut rng = SplitMix(seed);
    let mut kills = 0;
    let mut life = 0;
    let mut led = 0;
    // Steps in flight at each kill: evidence the kills land mid-rollout.
    let mut in_flight_at_kill = Vec::new();
    loop {
        life += 1;
        let mut controller = world.spawn_controller(&format!("controller-{life}"));
        if kills == KILLS {
            // The last life runs the rollout to its end and stops gracefully.
            world
                .wait_for(
                    rollout,
                    &[RolloutState::Completed, RolloutState::Halted],
                    Duration::from_secs(150),
                )
                .await;
            controller.terminate();
            break;
        }
        // Mostly mid-pass (after it took the lease over), sometimes still
        // starting up: a kill can land on any line.
        if !rng.next_u64().is_multiple_of(8) {
            world.wait_leader(&mut controller, Duration::from_secs(30)).await;
            led += 1;
        }
        tokio::time::sleep(rng.millis(0, 900)).await;
        controller.kill();
        let counts = world.db.step_counts(rollout, None).await.expect("counts");
        in_flight_at_kill.push(
            counts
                .iter()
                .filter(|(s, _)| s.is_in_flight())
                .map(|(_, n)| *n)
                .sum::<u64>(),
        );
        kills += 1;
        if world.rollout_state(rollout).await != RolloutState::Running {
            break;
        }
    }
    eprintln!(
        "crash test ({}): {kills} SIGKILLs over {life} controller lives, {:?}; steps in flight at each kill: {in_flight_at_kill:?}",
        if postgres { "postgres" } else { "sqlite" },
        started.elapsed()
    );
    let mid_flight = in_flight_at_kill.iter().filter(|n| **n > 0).count();
    assert!(
        mid_flight >= 12,
        "only {mid_flight} kills found steps in flight: {in_flight_at_kill:?}"
    );
    assert!(
        kills >= 20,
        "the rollout ended after only {kills} kills: slow it down (more nodes, tighter caps)"
    );
    let audit = world.check_completed_exactly_once(rollout).await;
    let takeovers = audit.iter().filter(|e| e.action == "lease.takeover").count();
    assert!(
        takeovers + 1 >= led,
        "every leader after the first took the lease over ({takeovers} takeovers, {led} leaders seen)"
    );
    world.shutdown().await;
}
