//! The reads the cockpit's pages make at scale, on every backend: a page of
//! a rollout's steps with node names and filters, counts per wave in one
//! query, the failure trends grouped by the database, and the version
//! distribution, node counts, failed reads and trends kept between requests
//! only while what they count is unchanged.

use std::sync::Arc;

use chrono::Duration;
use orchestrator_db::Db;
use orchestrator_db::execution::{StepChange, StepFilter, StepPageQuery, StepState, total_counts};
use orchestrator_db::testing::{TestDb, fixtures};
use orchestrator_types::{Clock, ManualClock, NodeId, NodeState};
use serde_json::json;

/// A rollout over `nodes` nodes (4 in the canary, the rest in a second wave), every step
/// pending, and the executor's fence to move them with.
struct Seeded {
    rollout: orchestrator_db::execution::ExecRollout,
    nodes: Vec<orchestrator_db::model::Node>,
    steps: Vec<orchestrator_db::execution::ExecStep>,
    fence: orchestrator_db::execution::Fence,
}

async fn seeded(db: &Db, nodes: usize) -> Seeded {
    let nodes = fixtures::gpu_nodes(nodes).racks(2).seed(db).await.unwrap();
    let release = fixtures::add_qualified_release(db, &fixtures::release("96.00.61.00.01"), "alice")
        .await
        .unwrap();
    let (first, rest) = nodes.split_at(4);
    let rollout = fixtures::store_rollout(
        db,
        release.id,
        vec![
            fixtures::wave("canary", 60, 0, 4, fixtures::steps(first, "GPU0", "96.00.5E.00.01")),
            fixtures::wave("rest", 60, 0, 4, fixtures::steps(rest, "GPU0", "96.00.5E.00.01")),
        ],
        "alice",
    )
    .await
    .unwrap();
    let fence = db
        .acquire_lease("executor", "test", Duration::days(30))
        .await
        .unwrap()
        .unwrap();
    let steps = db
        .steps(&StepFilter {
            rollout_id: Some(rollout.id),
            ..Default::default()
        })
        .await
        .unwrap();
    Seeded {
        rollout,
        nodes,
        steps,
        fence,
    }
}

#[tokio::test]
async fn a_page_of_steps_carries_names_filters_and_counts() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        let Seeded {
            rollout,
            nodes,
            steps: all,
            fence,
        } = seeded(db, 12).await;
        assert_eq!(all.len(), 12);
        // Two canary steps flashing, one failed.
        for (step, to) in all
            .iter()
            .take(3)
            .zip([StepState::Flashing, StepState::Flashing, StepState::Failed])
        {
            let change = StepChange {
                state: Some(to),
                ..Default::default()
            };
            db.transition_step(&fence, step.id, StepState::Pending, &change, json!({}))
                .await
                .unwrap();
        }

        let page = |filter: StepFilter, name: Option<&str>, offset: u64, limit: u64| {
            let query = StepPageQuery {
                filter,
                node_name_contains: name.map(str::to_owned),
                offset,
                limit,
            };
            async move { db.step_page(&query).await.unwrap() }
        };
        let in_rollout = StepFilter {
            rollout_id: Some(rollout.id),
            ..Default::default()
        };
        let first = page(in_rollout.clone(), None, 0, 5).await;
        assert_eq!(
            first.iter().map(|s| s.step.id).collect::<Vec<_>>(),
            all.iter().take(5).map(|s| s.id).collect::<Vec<_>>(),
            "by id"
        );
        let names: std::collections::HashMap<NodeId, &str> = nodes.iter().map(|n| (n.id, n.name.as_str())).collect();
        assert!(
            first.iter().all(|s| names[&s.step.node_id] == s.node_name),
            "each with its node's name"
        );
        let second = page(in_rollout.clone(), None, 10, 5).await;
        assert_eq!(second.len(), 2, "the last page holds the rest");

        let flashing = StepFilter {
            state: Some(StepState::Flashing),
            ..in_rollout.clone()
        };
        assert_eq!(page(flashing.clone(), None, 0, 100).await.len(), 2);
        assert_eq!(db.count_steps(&flashing).await.unwrap(), 2);
        assert_eq!(db.count_steps(&in_rollout).await.unwrap(), 12);

        let one = &nodes[7].name;
        let named = page(in_rollout.clone(), Some(one), 0, 100).await;
        assert_eq!(
            named.iter().map(|s| s.node_name.as_str()).collect::<Vec<_>>(),
            [one.as_str()]
        );

        let by_wave = db.step_counts_by_wave(rollout.id).await.unwrap();
        let waves = db.rollout_waves(rollout.id).await.unwrap();
        for wave in &waves {
            assert_eq!(
                by_wave.get(&wave.id).cloned().unwrap_or_default(),
                db.step_counts(rollout.id, Some(wave.id)).await.unwrap(),
                "wave {}",
                wave.name
            );
        }
        assert_eq!(total_counts(&by_wave), db.step_counts(rollout.id, None).await.unwrap());
    }
}

#[tokio::test]
async fn trends_are_grouped_by_day_version_and_outcome() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = &t.db;
        let Seeded {
            rollout, steps, fence, ..
        } = seeded(db, 6).await;
        let since = clock.now() - Duration::days(1);
        // Day one: two succeeded, one failed; day two: one succeeded.
        for (i, step) in steps.iter().take(4).enumerate() {
            if i == 3 {
                clock.advance(Duration::days(1));
            }
            let to = if i == 2 {
                StepState::Failed
            } else {
                StepState::Succeeded
            };
            let change = StepChange {
                state: Some(to),
                finished_at: Some(clock.now()),
                ..Default::default()
            };
            db.transition_step(&fence, step.id, StepState::Pending, &change, json!({}))
                .await
                .unwrap();
        }
        let days = db.daily_step_outcomes(since).await.unwrap();
        assert_eq!(
            days.iter().map(|d| (d.succeeded, d.failed)).collect::<Vec<_>>(),
            [(2, 1), (1, 0)]
        );
        assert_eq!(days[1].day - days[0].day, Duration::days(1));
        assert_eq!(days[1].day, clock.now().date_naive());
        let by_version = db.daily_outcomes_by_version(since).await.unwrap();
        assert_eq!(
            by_version
                .iter()
                .map(|v| (v.version.as_str(), v.succeeded, v.failed))
                .collect::<Vec<_>>(),
            [("96.00.61.00.01", 2, 1), ("96.00.61.00.01", 1, 0)]
        );
        assert!(
            db.daily_step_outcomes(clock.now() + Duration::days(1))
                .await
                .unwrap()
                .is_empty()
        );
    }
}

#[tokio::test]
async fn the_version_distribution_follows_every_inventory_change() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = &t.db;
        let nodes = fixtures::gpu_nodes(3).seed(db).await.unwrap();
        let count = |db: Db| async move {
            db.version_distribution()
                .await
                .unwrap()
                .into_iter()
                .map(|c| (c.version, c.nodes))
                .collect::<Vec<_>>()
        };
        let before = count(db.clone()).await;
        assert_eq!(before.iter().map(|(_, n)| n).sum::<u64>(), 3);
        assert_eq!(count(db.clone()).await, before, "read again, unchanged");

        // The clock has not moved: this process's own write still shows.
        db.record_inventory(nodes[0].id, &fixtures::gpu_inventory("96.00.61.00.01"))
            .await
            .unwrap();
        let after = count(db.clone()).await;
        assert!(after.contains(&("96.00.61.00.01".into(), 1)), "{after:?}");

        // Another controller's write (its own handle) shows once its time moved.
        let other = Db::connect(&t.url, clock.clone()).await.unwrap();
        clock.advance(Duration::seconds(1));
        other
            .record_inventory(nodes[1].id, &fixtures::gpu_inventory("96.00.61.00.01"))
            .await
            .unwrap();
        let later = count(db.clone()).await;
        assert!(later.contains(&("96.00.61.00.01".into(), 2)), "{later:?}");
        other.close().await.ok();
    }
}

#[tokio::test]
async fn counts_per_wave_follow_every_step_write() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = &t.db;
        let Seeded {
            rollout, steps, fence, ..
        } = seeded(db, 6).await;
        let flashing = |n: u64| Some(n).filter(|n| *n > 0);
        let count = |db: Db| async move {
            let by_wave = db.step_counts_by_wave(rollout.id).await.unwrap();
            total_counts(&by_wave).get(&StepState::Flashing).copied()
        };
        assert_eq!(count(db.clone()).await, flashing(0));
        let to_flashing = StepChange {
            state: Some(StepState::Flashing),
            ..Default::default()
        };
        // Same instant: this process's own write shows.
        db.transition_step(&fence, steps[0].id, StepState::Pending, &to_flashing, json!({}))
            .await
            .unwrap();
        assert_eq!(count(db.clone()).await, flashing(1));
        let in_state = StepFilter {
            rollout_id: Some(rollout.id),
            state: Some(StepState::Flashing),
            ..Default::default()
        };
        assert_eq!(db.count_steps(&in_state).await.unwrap(), 1);
        // Another controller's write shows once its time moved.
        let other = Db::connect(&t.url, clock.clone()).await.unwrap();
        clock.advance(Duration::seconds(1));
        other
            .transition_step(&fence, steps[1].id, StepState::Pending, &to_flashing, json!({}))
            .await
            .unwrap();
        assert_eq!(count(db.clone()).await, flashing(2));
        assert_eq!(db.count_steps(&in_state).await.unwrap(), 2);
        other.close().await.ok();
    }
}

#[tokio::test]
async fn node_counts_and_failed_reads_follow_every_node_write() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = &t.db;
        let nodes = fixtures::gpu_nodes(3).seed(db).await.unwrap();
        let seen = |db: Db| async move {
            let counts = db.node_counts().await.unwrap();
            let failed: Vec<String> = db
                .nodes_with_discovery_errors(10)
                .await
                .unwrap()
                .into_iter()
                .map(|n| n.name)
                .collect();
            (
                counts.by_state.get("quarantined").copied().unwrap_or(0),
                counts.discovery_errors,
                failed,
            )
        };
        assert_eq!(seen(db.clone()).await, (0, 0, vec![]));
        assert_eq!(seen(db.clone()).await, (0, 0, vec![]), "read again, unchanged");

        // The clock has not moved: this process's own writes still show.
        db.record_discovery_error(nodes[0].id, "timeout").await.unwrap();
        assert_eq!(seen(db.clone()).await, (0, 1, vec![nodes[0].name.clone()]));
        db.set_node_state(nodes[1].id, NodeState::Quarantined, Some("fan"), "test")
            .await
            .unwrap();
        assert_eq!(seen(db.clone()).await, (1, 1, vec![nodes[0].name.clone()]));
        db.record_inventory(nodes[0].id, &fixtures::gpu_inventory("96.00.61.00.01"))
            .await
            .unwrap();
        assert_eq!(seen(db.clone()).await, (1, 0, vec![]), "a good read clears the error");

        // Another controller's writes (its own handle) show once its time moved.
        let other = Db::connect(&t.url, clock.clone()).await.unwrap();
        clock.advance(Duration::seconds(1));
        other.record_discovery_error(nodes[2].id, "refused").await.unwrap();
        assert_eq!(seen(db.clone()).await, (1, 1, vec![nodes[2].name.clone()]));
        clock.advance(Duration::seconds(1));
        other
            .set_node_state(nodes[1].id, NodeState::Active, None, "test")
            .await
            .unwrap();
        assert_eq!(seen(db.clone()).await, (0, 1, vec![nodes[2].name.clone()]));
        other.close().await.ok();
    }
}

#[tokio::test]
async fn trends_follow_every_finished_step() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = &t.db;
        let Seeded {
            rollout, steps, fence, ..
        } = seeded(db, 6).await;
        let since = clock.now() - Duration::days(1);
        let totals = |db: Db| async move {
            let days = db.daily_step_outcomes(since).await.unwrap();
            let by_version = db.daily_outcomes_by_version(since).await.unwrap();
            (
                days.iter().map(|d| (d.succeeded, d.failed)).collect::<Vec<_>>(),
                by_version.iter().map(|v| (v.succeeded, v.failed)).collect::<Vec<_>>(),
            )
        };
        assert_eq!(totals(db.clone()).await, (vec![], vec![]));
        let finish = |to: StepState, at| StepChange {
            state: Some(to),
            finished_at: Some(at),
            ..Default::default()
        };
        // Same instant: this process's own write shows.
        db.transition_step(
            &fence,
            steps[0].id,
            StepState::Pending,
            &finish(StepState::Succeeded, clock.now()),
            json!({}),
        )
        .await
        .unwrap();
        assert_eq!(totals(db.clone()).await, (vec![(1, 0)], vec![(1, 0)]));
        db.transition_step(
            &fence,
            steps[1].id,
            StepState::Pending,
            &finish(StepState::Failed, clock.now()),
            json!({}),
        )
        .await
        .unwrap();
        assert_eq!(totals(db.clone()).await, (vec![(1, 1)], vec![(1, 1)]));
        // Another controller's finish shows once its time moved.
        let other = Db::connect(&t.url, clock.clone()).await.unwrap();
        clock.advance(Duration::seconds(1));
        other
            .transition_step(
                &fence,
                steps[2].id,
                StepState::Pending,
                &finish(StepState::Succeeded, clock.now()),
                json!({}),
            )
            .await
            .unwrap();
        assert_eq!(totals(db.clone()).await, (vec![(2, 1)], vec![(2, 1)]));
        other.close().await.ok();
    }
}
