//! Reads beside the one writer, on every backend: a read sees every write
//! committed before it (a request that writes and then reads sees its own
//! write), and reads never queue behind a write transaction, which on
//! SQLite holds the only writer connection.

use std::time::Duration as StdDuration;

use chrono::Duration;
use orchestrator_db::overview::NodePageQuery;
use orchestrator_db::testing::{TestDb, fixtures};
use orchestrator_types::NodeState;

/// Far below the pool's 30 s acquire timeout a queued read would wait.
const READ_DEADLINE: StdDuration = StdDuration::from_secs(5);

#[tokio::test]
async fn a_read_sees_every_write_committed_before_it() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        let nodes = fixtures::gpu_nodes(4).seed(db).await.unwrap();
        for round in 0..20 {
            let state = if round % 2 == 0 {
                NodeState::Quarantined
            } else {
                NodeState::Active
            };
            let node = &nodes[round % nodes.len()];
            db.set_node_state(node.id, state, Some("test"), "test").await.unwrap();
            assert_eq!(db.node(node.id).await.unwrap().state, state, "round {round}");
            let quarantined = db.node_counts().await.unwrap().by_state.get("quarantined").copied();
            assert_eq!(
                quarantined,
                (state == NodeState::Quarantined).then_some(1),
                "round {round}"
            );
            // Back to active before the next node, so one at most is quarantined.
            if state == NodeState::Quarantined {
                db.set_node_state(node.id, NodeState::Active, None, "test")
                    .await
                    .unwrap();
                assert_eq!(db.node_counts().await.unwrap().by_state.get("quarantined"), None);
            }
        }
    }
}

#[tokio::test]
async fn reads_do_not_wait_for_a_write_transaction() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        fixtures::gpu_nodes(3).seed(db).await.unwrap();
        db.acquire_lease("executor", "test", Duration::minutes(5))
            .await
            .unwrap()
            .unwrap();
        let stalled = db.stall_in_fenced_write("executor").await.unwrap();
        let reads = async {
            let counts = db.node_counts().await.unwrap();
            let page = db
                .node_page(&NodePageQuery {
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap();
            let rollouts = db.list_rollouts().await.unwrap();
            (counts.total, page.total, rollouts.len())
        };
        let read = tokio::time::timeout(READ_DEADLINE, reads).await;
        assert_eq!(
            read.expect("reads waited for the write transaction"),
            (3, 3, 0),
            "{:?}",
            db.backend()
        );
        drop(stalled);
    }
}
