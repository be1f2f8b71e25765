//! Health-sample retention on every backend (issue 23): windows something
//! refers to are kept, the rest become per-node daily aggregates with the
//! same counts, sums, minima and maxima; a batch cut short by a crash is
//! replayed without counting anything twice or losing anything; a finished
//! rollout's evidence download is the same bytes before and after.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use chrono::{DateTime, Duration, Utc};
use orchestrator_db::execution::{ExecRollout, Fence};
use orchestrator_db::health::{Cohort, HealthSample, LevelAgg, SampleScope, WindowDelta, window_start};
use orchestrator_db::model::Node;
use orchestrator_db::retention::{ReduceRequest, ReduceSeam, ReducedBatch, day_start};
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{
    add_qualified_release, gpu_nodes, release, rma_candidate, steps, store_rollout, wave,
};
use orchestrator_db::{Db, DbError};
use orchestrator_types::{Clock, ManualClock, NodeId, RolloutId, RolloutState, WaveId};

const XID: &str = "xid_errors_per_gpu_hour";
const TEMP: &str = "gpu_temp_c";

/// Moves the test clock to `to` (backwards too: each backend's world starts at `t0`).
fn set(clock: &ManualClock, to: DateTime<Utc>) {
    clock.advance(to - clock.now());
}

fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-03-01T00:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

/// What a retention pass of the controller asks with the defaults: windows
/// of days older than 14, a 7-day pre-period.
fn request(now: DateTime<Utc>, batch: u64) -> ReduceRequest {
    ReduceRequest {
        before: day_start(now - Duration::days(14)),
        pre_period: Duration::days(7),
        batch,
    }
}

/// Two days of hourly windows for `node` in `rollout`'s first wave: a rate
/// metric (events attributed to GPUs) and a level metric (two GPUs' readings).
/// Values are integers and halves, so every sum is exact in any order.
async fn record_two_days(db: &Db, rollout: &ExecRollout, wave: WaveId, node: NodeId, cohort: Cohort) {
    for hour in 0..48_i64 {
        let at = t0() + Duration::hours(hour);
        let events = u64::try_from((hour + node.0) % 4).unwrap();
        let mut xid_units = BTreeMap::new();
        if events > 0 {
            xid_units.insert(
                "GPU_0".to_owned(),
                LevelAgg {
                    n: events,
                    sum: events as f64,
                    min: 1.0,
                    max: 1.0,
                },
            );
        }
        let temp = |gpu: i64| 50.0 + ((hour * 7 + node.0 * 3 + gpu) % 20) as f64 * 0.5;
        let level = |v: f64| {
            let mut agg = LevelAgg::of(v);
            agg.merge(&LevelAgg::of(v + 1.0));
            agg
        };
        let temps: BTreeMap<String, LevelAgg> = (0..2).map(|g| (format!("GPU_{g}"), level(temp(g)))).collect();
        db.record_health_samples(
            rollout.id,
            wave,
            node,
            cohort,
            &[
                WindowDelta {
                    metric: XID.into(),
                    window_start: window_start(at),
                    events,
                    exposure: 8.0,
                    units: xid_units,
                },
                WindowDelta {
                    metric: TEMP.into(),
                    window_start: window_start(at),
                    events: 0,
                    exposure: 0.0,
                    units: temps,
                },
            ],
        )
        .await
        .unwrap();
    }
}

/// The daily aggregates the hourly `samples` should become, computed here
/// on their own (not by the code under test).
/// A sample's key: wave, node, metric and window (or day) start.
type Key = (WaveId, NodeId, String, DateTime<Utc>);

fn expected_days(samples: &[HealthSample]) -> BTreeMap<Key, (u64, HealthSample)> {
    let mut out: BTreeMap<_, (u64, HealthSample)> = BTreeMap::new();
    for s in samples {
        let key = (s.wave_id, s.node_id, s.metric.clone(), day_start(s.window_start));
        let entry = out.entry(key).or_insert_with(|| {
            (
                0,
                HealthSample::empty(
                    s.rollout_id,
                    s.wave_id,
                    s.node_id,
                    s.cohort,
                    s.metric.clone(),
                    day_start(s.window_start),
                ),
            )
        });
        entry.0 += 1;
        let day = &mut entry.1;
        day.events += s.events;
        day.exposure += s.exposure;
        day.readings += s.readings;
        day.sum += s.sum;
        day.min = match (day.min, s.min) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        day.max = match (day.max, s.max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        for (unit, agg) in &s.units {
            let u = day.units.entry(unit.clone()).or_insert(LevelAgg::EMPTY);
            u.merge(agg);
        }
    }
    out
}

fn by_key(samples: Vec<HealthSample>) -> BTreeMap<Key, HealthSample> {
    samples
        .into_iter()
        .map(|s| ((s.wave_id, s.node_id, s.metric.clone(), s.window_start), s))
        .collect()
}

struct World {
    nodes: Vec<Node>,
    /// Completed: nodes 0..4 (node 2 gets an open RMA case, node 3 is updated by `open` too).
    done: ExecRollout,
    /// Still running: nodes 3 and 4.
    open: ExecRollout,
}

async fn world(db: &Db, clock: &ManualClock) -> World {
    let nodes = gpu_nodes(6).seed(db).await.unwrap();
    let rel = add_qualified_release(db, &release("96.00.61.00.01"), "alice")
        .await
        .unwrap();
    let done = store_rollout(
        db,
        rel.id,
        vec![wave(
            "canary",
            3600,
            0,
            5,
            steps(&nodes[0..4], "HGX_FW_GPU_0", "96.00.5E.00.01"),
        )],
        "alice",
    )
    .await
    .unwrap();
    let done_wave = db.rollout_waves(done.id).await.unwrap()[0].id;
    for node in &nodes[0..4] {
        record_two_days(db, &done, done_wave, node.id, Cohort::Canary).await;
    }
    // A control node of the finished rollout, whose windows go the same way.
    record_two_days(db, &done, done_wave, nodes[5].id, Cohort::Control).await;
    let done = db
        .user_set_rollout_state(
            done.id,
            &[RolloutState::Running],
            RolloutState::Completed,
            None,
            "alice",
        )
        .await
        .unwrap();
    // Five days later another rollout starts over nodes 3 and 4: its
    // pre-period reaches back over the finished rollout's windows of node 3.
    set(clock, t0() + Duration::days(5));
    let open = store_rollout(
        db,
        rel.id,
        vec![wave(
            "canary",
            3600,
            0,
            5,
            steps(&nodes[3..5], "HGX_FW_GPU_0", "96.00.5E.00.01"),
        )],
        "alice",
    )
    .await
    .unwrap();
    let open_wave = db.rollout_waves(open.id).await.unwrap()[0].id;
    record_two_days(db, &open, open_wave, nodes[4].id, Cohort::Canary).await;
    // Node 2's GPU is an RMA case, still open.
    db.open_rma_case(
        &rma_candidate("SN-2", "node-2", "row_remap_failure", orchestrator_rma::Severity::High),
        "detector",
    )
    .await
    .unwrap();
    World { nodes, done, open }
}

async fn fence(db: &Db) -> Fence {
    db.acquire_lease("executor", "retention-test", Duration::seconds(60))
        .await
        .unwrap()
        .expect("the lease is free")
}

async fn reduce_all(db: &Db, fence: &Fence, batch: u64) -> u64 {
    let now = db.clock().now();
    let mut windows = 0;
    loop {
        let done = db.reduce_health_samples(fence, &request(now, batch)).await.unwrap();
        if done.windows == 0 {
            return windows;
        }
        windows += done.windows;
    }
}

fn nodes_of(samples: &[HealthSample]) -> std::collections::BTreeSet<NodeId> {
    samples.iter().map(|s| s.node_id).collect()
}

#[tokio::test]
async fn only_windows_nothing_refers_to_become_exact_daily_aggregates() {
    let clock = Arc::new(ManualClock::new(t0()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        set(&clock, t0());
        let db = &t.db;
        let w = world(db, &clock).await;
        let done_before = db.health_samples(SampleScope::Rollout(w.done.id)).await.unwrap();
        let open_before = db.health_samples(SampleScope::Rollout(w.open.id)).await.unwrap();
        assert_eq!(done_before.len(), 5 * 48 * 2);

        set(&clock, t0() + Duration::days(30));
        let fence = fence(db).await;
        // The finished rollout's evidence is not stored yet: its windows are what it is built from.
        assert_eq!(reduce_all(db, &fence, 50).await, 0, "{:?}", t.backend());
        assert_eq!(
            db.health_samples(SampleScope::Rollout(w.done.id)).await.unwrap(),
            done_before
        );

        let download = db.rollout_evidence(w.done.id).await.unwrap();
        // Small batches split days across transactions: a day is added to, never replaced.
        let reduced = reduce_all(db, &fence, 37).await;

        let done_after = db.health_samples(SampleScope::Rollout(w.done.id)).await.unwrap();
        // Kept: node 2 (open RMA case) and node 3 (pre-period of the running rollout).
        assert_eq!(
            nodes_of(&done_after),
            [w.nodes[2].id, w.nodes[3].id].into_iter().collect(),
            "{:?}",
            t.backend()
        );
        assert_eq!(reduced, (done_before.len() - done_after.len()) as u64);
        // The running rollout's windows are all kept.
        assert_eq!(
            db.health_samples(SampleScope::Rollout(w.open.id)).await.unwrap(),
            open_before
        );
        assert!(
            db.health_daily(SampleScope::Rollout(w.open.id))
                .await
                .unwrap()
                .is_empty()
        );

        let reduced_hourly: Vec<HealthSample> = done_before
            .iter()
            .filter(|s| !nodes_of(&done_after).contains(&s.node_id))
            .cloned()
            .collect();
        let expected = expected_days(&reduced_hourly);
        let daily = by_key(db.health_daily(SampleScope::Rollout(w.done.id)).await.unwrap());
        assert_eq!(daily.len(), 3 * 2 * 2, "3 nodes x 2 days x 2 metrics");
        assert_eq!(daily.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
        for (key, (windows, want)) in &expected {
            assert_eq!(*windows, 24);
            assert_eq!(&daily[key], want, "{key:?} on {:?}", t.backend());
        }
        // A level day holds 24 windows x 2 GPUs x 2 readings.
        let temp_day = daily.values().find(|s| s.metric == TEMP).unwrap();
        assert_eq!(temp_day.readings, 96);
        assert!(temp_day.min.unwrap() < temp_day.max.unwrap());

        // The download is the same bytes after retention.
        assert_eq!(db.rollout_evidence(w.done.id).await.unwrap(), download);
        // History readers see every reading once: totals over hourly + daily are unchanged.
        let history = db.health_history(SampleScope::Rollout(w.done.id)).await.unwrap();
        let events: u64 = history.all().map(|s| s.events).sum();
        let readings: u64 = history.all().map(|s| s.readings).sum();
        assert_eq!(events, done_before.iter().map(|s| s.events).sum::<u64>());
        assert_eq!(readings, done_before.iter().map(|s| s.readings).sum::<u64>());

        // The running rollout finishes: node 3's pre-period reference goes with it;
        // node 2's case is still open, so its windows stay.
        db.user_set_rollout_state(
            w.open.id,
            &[RolloutState::Running],
            RolloutState::Completed,
            None,
            "alice",
        )
        .await
        .unwrap();
        reduce_all(db, &fence, 1000).await;
        assert_eq!(
            nodes_of(&db.health_samples(SampleScope::Rollout(w.done.id)).await.unwrap()),
            [w.nodes[2].id].into_iter().collect()
        );
        // The other rollout's evidence is not stored: still hourly.
        assert_eq!(
            db.health_samples(SampleScope::Rollout(w.open.id)).await.unwrap(),
            open_before
        );
    }
}

/// Fails the batch before its commit once, on the `at`-th batch: a crash
/// after the deletes and the daily writes, before anything is committed.
struct CrashOn {
    calls: AtomicUsize,
    at: usize,
}

impl ReduceSeam for CrashOn {
    fn before_commit(&self, _: &ReducedBatch) -> Result<(), DbError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
            return Err(DbError::Invalid {
                field: "test".into(),
                reason: "crashed before commit".into(),
            });
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_pass_cut_short_is_replayed_without_double_counting_or_loss() {
    let clock = Arc::new(ManualClock::new(t0()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        set(&clock, t0());
        let db = &t.db;
        let w = world(db, &clock).await;
        let done_before = db.health_samples(SampleScope::Rollout(w.done.id)).await.unwrap();
        set(&clock, t0() + Duration::days(30));
        let fence = fence(db).await;
        db.rollout_evidence(w.done.id).await.unwrap();
        let now = db.clock().now();

        // Batches of 30 windows; the third crashes before its commit.
        let crash = CrashOn {
            calls: AtomicUsize::new(0),
            at: 3,
        };
        let mut committed = 0;
        let crashed = loop {
            match db.reduce_health_samples_with(&fence, &request(now, 30), &crash).await {
                Ok(batch) => committed += batch.windows,
                Err(err) => break err,
            }
        };
        assert!(matches!(crashed, DbError::Invalid { .. }), "{crashed:?}");
        assert_eq!(committed, 60, "two batches committed before the crash");
        let hourly_left = db.health_samples(SampleScope::Rollout(w.done.id)).await.unwrap();
        assert_eq!(
            hourly_left.len(),
            done_before.len() - 60,
            "the crashed batch deleted nothing"
        );
        let daily = db.health_daily(SampleScope::Rollout(w.done.id)).await.unwrap();
        let folded: u64 = daily.iter().map(|d| d.readings).sum::<u64>() + daily.iter().map(|d| d.events).sum::<u64>();
        let gone: Vec<HealthSample> = done_before
            .iter()
            .filter(|s| !hourly_left.contains(s))
            .cloned()
            .collect();
        assert_eq!(
            folded,
            gone.iter().map(|s| s.readings + s.events).sum::<u64>(),
            "the crashed batch added nothing to any day"
        );

        // A controller whose lease was taken over reduces nothing.
        set(&clock, now + Duration::minutes(5));
        let other = db
            .acquire_lease("executor", "other", Duration::seconds(60))
            .await
            .unwrap()
            .expect("the first lease expired");
        let fenced = db.reduce_health_samples(&fence, &request(now, 30)).await;
        assert!(matches!(fenced, Err(DbError::Fenced { .. })), "{fenced:?}");
        assert_eq!(
            db.health_samples(SampleScope::Rollout(w.done.id)).await.unwrap(),
            hourly_left
        );

        // The replay (on the new holder) finishes the job: every unreferenced
        // window folded exactly once.
        reduce_all(db, &other, 30).await;
        let kept = db.health_samples(SampleScope::Rollout(w.done.id)).await.unwrap();
        let reduced: Vec<HealthSample> = done_before.iter().filter(|s| !kept.contains(s)).cloned().collect();
        let daily = by_key(db.health_daily(SampleScope::Rollout(w.done.id)).await.unwrap());
        let expected = expected_days(&reduced);
        assert_eq!(daily.len(), expected.len(), "{:?}", t.backend());
        for (key, (_, want)) in &expected {
            assert_eq!(&daily[key], want, "{key:?} on {:?}", t.backend());
        }
    }
}

#[tokio::test]
async fn a_finished_rollout_download_is_stored_once_and_an_unknown_one_is_not_found() {
    let clock = Arc::new(ManualClock::new(t0()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        set(&clock, t0());
        let db = &t.db;
        let w = world(db, &clock).await;
        assert_eq!(
            db.rollouts_without_evidence(10).await.unwrap(),
            vec![(w.done.id, RolloutState::Completed)]
        );
        let first = db.rollout_evidence(w.done.id).await.unwrap();
        assert!(db.rollouts_without_evidence(10).await.unwrap().is_empty());
        // Later downloads serve the stored bytes, not a new build (whose time would differ).
        clock.advance(Duration::hours(3));
        assert_eq!(db.rollout_evidence(w.done.id).await.unwrap(), first);
        assert_ne!(db.build_rollout_evidence(w.done.id).await.unwrap(), first);
        // A running rollout's package is built each time: it still changes.
        let open_a = db.rollout_evidence(w.open.id).await.unwrap();
        clock.advance(Duration::hours(1));
        assert_ne!(db.rollout_evidence(w.open.id).await.unwrap(), open_a);
        assert!(matches!(
            db.rollout_evidence(RolloutId(9999)).await,
            Err(DbError::NotFound { .. })
        ));
    }
}

/// The fleet's measured base rates read control nodes' events and exposure since a time, from the
/// hourly windows and the days retention reduced them into alike: the same totals before and after a
/// reduction, and never an updated node's.
#[tokio::test]
async fn control_totals_count_hourly_and_reduced_days_once_and_only_controls() {
    let clock = Arc::new(ManualClock::new(t0()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        set(&clock, t0());
        let db = &t.db;
        let w = world(db, &clock).await;
        let mut hourly = db.health_samples(SampleScope::Rollout(w.done.id)).await.unwrap();
        hourly.extend(db.health_samples(SampleScope::Rollout(w.open.id)).await.unwrap());
        // Computed here from the stored windows: the control's XID events and exposure since `since`.
        let expected = |since: DateTime<Utc>| {
            let controls = hourly
                .iter()
                .filter(|s| s.cohort == Cohort::Control && s.metric == XID && s.window_start >= since);
            controls.fold((0.0, 0.0), |(e, x), s| (e + s.events as f64, x + s.exposure))
        };
        let xid = |totals: Vec<(String, f64, f64)>| {
            totals
                .into_iter()
                .find(|(m, _, _)| m == XID)
                .map(|(_, e, x)| (e, x))
                .unwrap_or_default()
        };
        let second_day = t0() + Duration::days(1);
        let (all, later) = (expected(t0()), expected(second_day));
        assert!(all.0 > later.0 && later.0 > 0.0, "{all:?} {later:?}");
        // Every canary's windows outnumber the control's: a total that counted them would show.
        assert_eq!(all.1, 48.0 * 8.0, "{:?}", t.backend());
        assert_eq!(
            xid(db.control_rate_totals(t0()).await.unwrap()),
            all,
            "{:?}",
            t.backend()
        );
        assert_eq!(xid(db.control_rate_totals(second_day).await.unwrap()), later);

        // Reduced to days (the finished rollout's control node among them), the totals stay.
        set(&clock, t0() + Duration::days(30));
        let fence = fence(db).await;
        db.rollout_evidence(w.done.id).await.unwrap();
        assert!(reduce_all(db, &fence, 50).await > 0);
        let control = w.nodes[5].id;
        assert!(
            db.health_samples(SampleScope::Rollout(w.done.id))
                .await
                .unwrap()
                .iter()
                .all(|s| s.node_id != control),
            "the control's windows were reduced"
        );
        assert_eq!(
            xid(db.control_rate_totals(t0()).await.unwrap()),
            all,
            "{:?}",
            t.backend()
        );
        assert_eq!(xid(db.control_rate_totals(second_day).await.unwrap()), later);
    }
}
