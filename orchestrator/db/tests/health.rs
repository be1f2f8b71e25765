//! Health watch storage on every backend: window aggregation, the poll
//! cursor's optimistic concurrency, looks recorded once.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use orchestrator_db::DbError;
use orchestrator_db::health::{
    Cohort, HealthCursor, LevelAgg, NewHealthLook, NodePoll, SampleScope, WindowDelta, window_start,
};
use orchestrator_db::testing::TestDb;
use orchestrator_types::{ManualClock, NodeId, RolloutId, WaveId};
use serde_json::json;

fn start() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-03-01T10:20:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

fn cursor(node: i64, polls: i64, until: DateTime<Utc>) -> HealthCursor {
    HealthCursor {
        rollout_id: RolloutId(1),
        wave_id: WaveId(1),
        node_id: NodeId(node),
        cohort: Cohort::Canary,
        exposure_start: start(),
        accounted_until: until,
        event_cursor: Some(json!({ "last_created": null, "ids_at_last": [] })),
        gpus: 8,
        polls,
        last_error: None,
    }
}

fn delta(metric: &str, at: DateTime<Utc>, events: u64, exposure: f64, temps: &[(&str, f64)]) -> WindowDelta {
    WindowDelta {
        metric: metric.into(),
        window_start: window_start(at),
        events,
        exposure,
        units: temps.iter().map(|(u, v)| ((*u).to_owned(), LevelAgg::of(*v))).collect(),
    }
}

#[tokio::test]
async fn polls_fold_into_windows_and_a_stale_poll_writes_nothing() {
    for t in TestDb::all_backends_with_clock(Arc::new(ManualClock::new(start()))).await {
        let db = &t.db;
        let at = start();
        db.record_health_poll(&NodePoll {
            cursor: cursor(7, 0, at + Duration::minutes(10)),
            first: true,
            deltas: vec![
                delta("xid_errors_per_gpu_hour", at, 2, 1.5, &[]),
                delta("gpu_temp_c", at, 0, 0.0, &[("GPU_0", 60.0), ("GPU_1", 70.0)]),
            ],
        })
        .await
        .unwrap();
        // The same node polled again: same window, folded in.
        db.record_health_poll(&NodePoll {
            cursor: cursor(7, 1, at + Duration::minutes(20)),
            first: false,
            deltas: vec![
                delta("xid_errors_per_gpu_hour", at, 1, 1.0, &[]),
                delta("gpu_temp_c", at, 0, 0.0, &[("GPU_0", 64.0)]),
            ],
        })
        .await
        .unwrap();
        // A second controller that read the cursor at poll 1 too: refused, nothing counted twice.
        let stale = db
            .record_health_poll(&NodePoll {
                cursor: cursor(7, 1, at + Duration::minutes(20)),
                first: false,
                deltas: vec![delta("xid_errors_per_gpu_hour", at, 1, 1.0, &[])],
            })
            .await;
        assert!(matches!(stale, Err(DbError::Stale { .. })), "{stale:?}");
        let first_again = db
            .record_health_poll(&NodePoll {
                cursor: cursor(7, 0, at),
                first: true,
                deltas: vec![delta("xid_errors_per_gpu_hour", at, 5, 1.0, &[])],
            })
            .await;
        assert!(matches!(first_again, Err(DbError::Stale { .. })), "{first_again:?}");

        let samples = db.health_samples(SampleScope::Wave(WaveId(1))).await.unwrap();
        assert_eq!(samples.len(), 2, "{samples:#?}");
        let xid = samples.iter().find(|s| s.metric == "xid_errors_per_gpu_hour").unwrap();
        assert_eq!((xid.events, xid.exposure), (3, 2.5));
        let temp = samples.iter().find(|s| s.metric == "gpu_temp_c").unwrap();
        assert_eq!(temp.readings, 3);
        assert_eq!((temp.min, temp.max), (Some(60.0), Some(70.0)));
        assert_eq!(temp.units["GPU_0"].mean(), Some(62.0));
        assert_eq!(temp.units["GPU_1"].n, 1);

        let cursors = db.health_cursors(WaveId(1)).await.unwrap();
        assert_eq!(cursors.len(), 1);
        assert_eq!(cursors[0].polls, 2);
        assert_eq!(cursors[0].accounted_until, at + Duration::minutes(20));

        // Rollout scope sees the same rows; another wave sees none.
        assert_eq!(
            db.health_samples(SampleScope::Rollout(RolloutId(1)))
                .await
                .unwrap()
                .len(),
            2
        );
        assert!(
            db.health_samples(SampleScope::Wave(WaveId(2)))
                .await
                .unwrap()
                .is_empty()
        );
    }
}

/// A collection round's polls are one write: each moves its own cursor and adds its deltas as if
/// written alone (into existing windows and new ones, two deltas of one window merged), and a poll
/// another writer got ahead of (a first poll of a node that has a cursor, a poll from an old count)
/// adds nothing while the rest of the round is recorded.
#[tokio::test]
async fn a_round_of_polls_is_one_write_and_a_stale_poll_in_it_adds_nothing() {
    for t in TestDb::all_backends_with_clock(Arc::new(ManualClock::new(start()))).await {
        let db = &t.db;
        let at = start();
        let later = at + Duration::hours(1);
        for node in [7, 9] {
            db.record_health_poll(&NodePoll {
                cursor: cursor(node, 0, at + Duration::minutes(10)),
                first: true,
                deltas: vec![
                    delta("xid_errors_per_gpu_hour", at, 1, 1.0, &[]),
                    delta("gpu_temp_c", at, 0, 0.0, &[("GPU_0", 60.0)]),
                ],
            })
            .await
            .unwrap();
        }
        let round = [
            NodePoll {
                cursor: cursor(7, 1, at + Duration::minutes(20)),
                first: false,
                deltas: vec![
                    delta("xid_errors_per_gpu_hour", at, 2, 1.0, &[]),
                    delta("gpu_temp_c", at, 0, 0.0, &[("GPU_0", 64.0), ("GPU_1", 70.0)]),
                ],
            },
            NodePoll {
                cursor: cursor(8, 0, later),
                first: true,
                deltas: vec![
                    delta("xid_errors_per_gpu_hour", at, 3, 0.5, &[]),
                    delta("xid_errors_per_gpu_hour", at, 1, 0.25, &[]),
                    delta("xid_errors_per_gpu_hour", later, 0, 1.0, &[]),
                ],
            },
            // Node 9 already has a cursor: another controller polled it first.
            NodePoll {
                cursor: cursor(9, 0, at + Duration::minutes(20)),
                first: true,
                deltas: vec![delta("xid_errors_per_gpu_hour", at, 50, 1.0, &[])],
            },
            // Node 7 as read before its poll above: already counted.
            NodePoll {
                cursor: cursor(7, 0, at + Duration::minutes(20)),
                first: false,
                deltas: vec![delta("xid_errors_per_gpu_hour", at, 50, 1.0, &[])],
            },
        ];
        assert_eq!(
            db.record_health_polls(&round).await.unwrap(),
            [true, true, false, false]
        );

        let samples = db.health_samples(SampleScope::Wave(WaveId(1))).await.unwrap();
        let row = |node: i64, metric: &str, window: DateTime<Utc>| {
            samples
                .iter()
                .find(|s| s.node_id == NodeId(node) && s.metric == metric && s.window_start == window_start(window))
                .unwrap_or_else(|| panic!("no row for node {node} {metric} at {window}: {samples:#?}"))
        };
        assert_eq!(samples.len(), 6, "{samples:#?}");
        let xid7 = row(7, "xid_errors_per_gpu_hour", at);
        assert_eq!((xid7.events, xid7.exposure), (3, 2.0));
        let temp7 = row(7, "gpu_temp_c", at);
        assert_eq!(temp7.readings, 3);
        assert_eq!((temp7.min, temp7.max), (Some(60.0), Some(70.0)));
        assert_eq!(temp7.units["GPU_0"].mean(), Some(62.0));
        assert_eq!(temp7.units["GPU_1"].n, 1);
        let xid8 = row(8, "xid_errors_per_gpu_hour", at);
        assert_eq!((xid8.events, xid8.exposure), (4, 0.75));
        let xid8_later = row(8, "xid_errors_per_gpu_hour", later);
        assert_eq!((xid8_later.events, xid8_later.exposure), (0, 1.0));
        let xid9 = row(9, "xid_errors_per_gpu_hour", at);
        assert_eq!(
            (xid9.events, xid9.exposure),
            (1, 1.0),
            "the stale first poll added nothing"
        );

        let polls: Vec<(NodeId, i64)> = db
            .health_cursors(WaveId(1))
            .await
            .unwrap()
            .iter()
            .map(|c| (c.node_id, c.polls))
            .collect();
        assert_eq!(polls, [(NodeId(7), 2), (NodeId(8), 1), (NodeId(9), 1)]);
    }
}

/// A round of more cursors than one statement moves (the fleet's controls in one poll round) is
/// written whole, and a stale poll among them, past the first statement, is refused alone.
#[tokio::test]
async fn a_round_of_more_cursors_than_one_statement_moves_each_once() {
    for t in TestDb::all_backends_with_clock(Arc::new(ManualClock::new(start()))).await {
        let db = &t.db;
        let at = start();
        let nodes = 1_200;
        let first: Vec<NodePoll> = (1..=nodes)
            .map(|node| NodePoll {
                cursor: cursor(node, 0, at + Duration::minutes(10)),
                first: true,
                deltas: vec![delta("xid_errors_per_gpu_hour", at, 1, 1.0, &[])],
            })
            .collect();
        assert!(db.record_health_polls(&first).await.unwrap().iter().all(|r| *r));
        // Every node again from the count it read, except node 1,100, read before the first round.
        let second: Vec<NodePoll> = (1..=nodes)
            .map(|node| NodePoll {
                cursor: cursor(node, if node == 1_100 { 0 } else { 1 }, at + Duration::minutes(20)),
                first: node == 1_100,
                deltas: vec![delta("xid_errors_per_gpu_hour", at, 1, 1.0, &[])],
            })
            .collect();
        let recorded = db.record_health_polls(&second).await.unwrap();
        let refused: Vec<i64> = (1..=nodes)
            .zip(&recorded)
            .filter(|(_, r)| !**r)
            .map(|(n, _)| n)
            .collect();
        assert_eq!(refused, [1_100]);
        let cursors = db.health_cursors(WaveId(1)).await.unwrap();
        assert_eq!(cursors.len(), 1_200);
        assert!(
            cursors
                .iter()
                .all(|c| c.polls == if c.node_id == NodeId(1_100) { 1 } else { 2 })
        );
        let events: u64 = db
            .health_samples(SampleScope::Wave(WaveId(1)))
            .await
            .unwrap()
            .iter()
            .map(|s| s.events)
            .sum();
        assert_eq!(events, 2 * 1_200 - 1);
    }
}

/// A round whose first polls reach back over many hourly windows (a canary node's exposure runs from
/// its flash, hours before the bake) is written whole: more rows than one statement may bind.
#[tokio::test]
async fn a_round_spanning_many_windows_is_written_whole() {
    for t in TestDb::all_backends_with_clock(Arc::new(ManualClock::new(start()))).await {
        let db = &t.db;
        let at = start();
        let hours = 24;
        let round: Vec<NodePoll> = (1..=100)
            .map(|node| NodePoll {
                cursor: cursor(node, 0, at + Duration::hours(hours)),
                first: true,
                deltas: (0..hours)
                    .flat_map(|h| {
                        let w = at + Duration::hours(h);
                        [
                            delta("xid_errors_per_gpu_hour", w, 1, 8.0, &[]),
                            delta("gpu_temp_c", w, 0, 0.0, &[("GPU_0", 60.0)]),
                        ]
                    })
                    .collect(),
            })
            .collect();
        assert!(db.record_health_polls(&round).await.unwrap().iter().all(|r| *r));
        let samples = db.health_samples(SampleScope::Wave(WaveId(1))).await.unwrap();
        assert_eq!(samples.len(), 100 * 2 * 24);
        let events: u64 = samples.iter().map(|s| s.events).sum();
        assert_eq!(events, 100 * 24);
        assert!(
            samples
                .iter()
                .filter(|s| s.metric == "gpu_temp_c")
                .all(|s| s.readings == 1)
        );
    }
}

#[tokio::test]
async fn each_look_is_recorded_once_and_audited() {
    for t in TestDb::all_backends_with_clock(Arc::new(ManualClock::new(start()))).await {
        let db = &t.db;
        let look = NewHealthLook {
            rollout_id: RolloutId(1),
            wave_id: WaveId(1),
            gate: "xid_errors".into(),
            look_number: 3,
            planned_looks: 12,
            outcome: orchestrator_types::Outcome::Inconclusive,
            verdict: json!({ "outcome": "inconclusive" }),
        };
        let recorded = db.record_health_look(&look, "detector").await.unwrap();
        assert_eq!(recorded.look, look);
        // A restarted controller evaluating the same look again is refused:
        // the boundary is never spent twice.
        let again = db
            .record_health_look(
                &NewHealthLook {
                    outcome: orchestrator_types::Outcome::Fail,
                    ..look.clone()
                },
                "detector",
            )
            .await;
        assert!(matches!(again, Err(DbError::AlreadyExists { .. })), "{again:?}");
        let looks = db.health_looks(SampleScope::Wave(WaveId(1))).await.unwrap();
        assert_eq!(looks.len(), 1);
        assert_eq!(looks[0].look.outcome, orchestrator_types::Outcome::Inconclusive);
        let audit = db
            .audit_entries(&orchestrator_db::AuditFilter {
                action: Some("health.look".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(audit.len(), 1);
        let details = orchestrator_db::health::LookAuditDetails::from_audit(&audit[0].details).unwrap();
        assert_eq!(details.gate, "xid_errors");
        assert_eq!(details.outcome, orchestrator_types::Outcome::Inconclusive);
        assert_eq!((details.look, details.planned), (3, 12));
    }
}
