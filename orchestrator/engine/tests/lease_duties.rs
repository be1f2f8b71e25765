//! Duties only the executor-lease holder runs (issue 23): the RMA monitor
//! and health-sample retention do nothing on a controller without the lease
//! (no BMC read, nothing stored), and run once it holds it, on both backends.

use std::time::Duration;

use chrono::TimeDelta;
use integration_tests::Harness;
use orchestrator_db::parts::PartFilter;
use orchestrator_engine::retention::{RetentionConfig, RetentionJob};
use orchestrator_engine::rma::{RmaConfig, RmaMonitor};
use orchestrator_engine::{EXECUTOR_LEASE, GatelessJudge, LeaseHolder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rma_monitor_and_retention_act_only_on_the_lease_holder() {
    for postgres in [false, true] {
        let Some(mut h) = Harness::start(3, "", postgres).await else {
            continue;
        };
        let monitor = RmaMonitor::new(h.db.clone(), h.redfish(), None, RmaConfig::default());
        let retention = RetentionJob::new(h.db.clone(), RetentionConfig::default());
        // Long on the harness's accelerated clock: a pass reads BMCs in real time.
        let ttl = TimeDelta::days(1);

        // Nobody has ever held the lease: nothing runs.
        let me = LeaseHolder::new(h.db.clone(), "me");
        assert_eq!(monitor.pass_if_holder(&me).await.unwrap(), None);

        // Another controller holds it.
        let other =
            h.db.acquire_lease(EXECUTOR_LEASE, "other", ttl)
                .await
                .unwrap()
                .expect("free");
        assert_eq!(monitor.pass_if_holder(&me).await.unwrap(), None);
        assert_eq!(retention.pass_if_holder(&me).await.unwrap(), None);
        assert!(
            h.db.parts(&PartFilter::default()).await.unwrap().is_empty(),
            "no BMC was read and no part stored without the lease (postgres: {postgres})"
        );

        // The other gives it up and this controller takes it, as its engine would.
        h.db.release_lease(&other).await.unwrap();
        h.db.acquire_lease(EXECUTOR_LEASE, "me", ttl)
            .await
            .unwrap()
            .expect("released");
        let report = monitor
            .pass_if_holder(&me)
            .await
            .unwrap()
            .expect("the holder's pass runs");
        assert_eq!(report.nodes_read, 3, "{report:?}");
        assert!(!h.db.parts(&PartFilter::default()).await.unwrap().is_empty());
        assert!(retention.pass_if_holder(&me).await.unwrap().is_some());

        // An engine's own lease is what its duties check: once its loop holds
        // the lease, `Engine::lease` says so, and another holder's does not.
        h.db.release_lease(&h.db.acquire_lease(EXECUTOR_LEASE, "me", ttl).await.unwrap().unwrap())
            .await
            .unwrap();
        h.start_engine_with(h.config(), std::sync::Arc::new(GatelessJudge));
        let lease = h.engine.as_ref().unwrap().lease();
        let mut held = false;
        for _ in 0..200 {
            if lease.current().await.unwrap().is_some() {
                held = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(held, "the engine took the lease");
        assert_eq!(
            monitor.pass_if_holder(&me).await.unwrap(),
            None,
            "the engine holds it, not \"me\""
        );
        assert!(monitor.pass_if_holder(&lease).await.unwrap().is_some());
        h.engine.take().unwrap().shutdown().await;
        assert_eq!(
            monitor.pass_if_holder(&lease).await.unwrap(),
            None,
            "given up at shutdown"
        );
    }
}
