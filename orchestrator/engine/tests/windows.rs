//! Maintenance windows on the shared simulated clock: outside a window no
//! new flash starts and the wave says when the next window opens; when it
//! opens, the held steps start.

use std::time::Duration;

use chrono::{DurationRound, TimeDelta, Timelike};
use integration_tests::{GPU_TO, Harness, policy};
use orchestrator_db::execution::{RolloutState, StepFilter, StepState, WaveState};
use orchestrator_engine::Blocker;

const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flashes_wait_for_the_maintenance_window_and_start_when_it_opens() {
    let mut h = Harness::start(20, "", false).await.unwrap();
    let release = h.add_release(GPU_TO, true).await;
    // A daily two-hour window opening 15 simulated minutes from now (about
    // four real seconds at the harness's speed-up).
    let opens = (h.now() + TimeDelta::minutes(16))
        .duration_trunc(TimeDelta::minutes(1))
        .unwrap();
    let source = format!(
        "{}maintenance_windows:\n  - cron: \"0 {} {} * * *\"\n    duration: 2h\n    timezone: UTC\n",
        policy("1m", "approval: auto"),
        opens.minute(),
        opens.hour()
    );
    let id = h.start_rollout(release.id, source, 11).await.id;
    h.start_engine();

    // The canary starts but holds every flash, naming the window's opening.
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let waves = h.db.rollout_waves(id).await.unwrap();
        if waves[0].state == WaveState::Running && waves[0].blockers == [Blocker::WindowOpensAt { at: Some(opens) }] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no window blocker: {:?}",
            waves
                .iter()
                .map(|w| (&w.name, w.state, &w.blockers))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Until shortly before it opens, nothing is admitted or flashed.
    while h.now() < opens - TimeDelta::minutes(2) {
        let counts = h.db.step_counts(id, None).await.unwrap();
        assert_eq!(
            counts.keys().copied().collect::<Vec<_>>(),
            [StepState::Pending],
            "at {}: {counts:?}",
            h.now()
        );
        for e in h.fleet.endpoints() {
            assert!(
                h.fleet.flash_counts(&e.name).unwrap().is_empty(),
                "{} flashed early",
                e.name
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let done = h
        .wait_for(id, &[RolloutState::Completed, RolloutState::Halted], LIMIT)
        .await;
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    let steps =
        h.db.steps(&StepFilter {
            rollout_id: Some(id),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(steps.len(), 20);
    for step in &steps {
        assert_eq!(step.state, StepState::Succeeded, "{step:?}");
        let started = step.started_at.expect("a flashed step records its start");
        assert!(
            started >= opens,
            "step {} started at {started}, before the window opened at {opens}",
            step.id
        );
    }
    for e in h.fleet.endpoints() {
        assert_eq!(
            h.fleet.flash_counts(&e.name).unwrap().values().sum::<u32>(),
            1,
            "{}",
            e.name
        );
    }
    h.shutdown().await;
}
