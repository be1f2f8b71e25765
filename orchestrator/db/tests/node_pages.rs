//! The node pages' queries on every backend: filters and paging in SQL, the
//! total, each listed node's versions grouped, counts per state.

use orchestrator_db::model::NewNode;
use orchestrator_db::overview::NodePageQuery;
use orchestrator_db::testing::{TestDb, fixtures};
use orchestrator_types::NodeState;

fn node(i: usize) -> NewNode {
    fixtures::node(&format!("n-{i:02}"))
        .bmc_url(&format!("https://10.0.0.{i}"))
        .sku(if i < 20 { "hgx" } else { "b200" })
        .labels("r", "c", "k", "n")
        .build()
}

#[tokio::test]
async fn node_pages_filter_and_page_in_the_database() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        db.import_nodes(&(0..25).map(node).collect::<Vec<_>>(), "test")
            .await
            .unwrap();
        for n in db.list_nodes(&Default::default()).await.unwrap() {
            let i: usize = n.name[2..].parse().unwrap();
            let version = if i.is_multiple_of(2) { "1.0" } else { "2.0" };
            db.record_inventory(n.id, &fixtures::gpus(3, version)).await.unwrap();
            if i == 3 {
                db.set_node_state(n.id, NodeState::Quarantined, Some("fan"), "test")
                    .await
                    .unwrap();
                db.record_discovery_error(n.id, "timeout").await.unwrap();
            }
        }
        let page = |query: NodePageQuery| async move { db.node_page(&query).await.unwrap() };

        let all = page(NodePageQuery {
            limit: 10,
            ..Default::default()
        })
        .await;
        assert_eq!((all.total, all.nodes.len()), (25, 10));
        assert_eq!(all.nodes[0].node.name, "n-00");
        let v = &all.nodes[0].versions;
        assert_eq!(
            (v.len(), v[0].version.as_str(), v[0].components),
            (1, "1.0", 3),
            "grouped per node"
        );
        let last = page(NodePageQuery {
            limit: 10,
            offset: 20,
            ..Default::default()
        })
        .await;
        assert_eq!((last.total, last.nodes.len()), (25, 5));
        assert_eq!(last.nodes[4].node.name, "n-24");

        let odd_hgx = page(NodePageQuery {
            platform_sku: Some("hgx".into()),
            version: Some("2.0".into()),
            limit: 100,
            ..Default::default()
        })
        .await;
        assert_eq!(odd_hgx.total, 10);
        assert!(odd_hgx.nodes.iter().all(|n| n.versions[0].version == "2.0"));
        let named = page(NodePageQuery {
            name_contains: Some("n-1".into()),
            limit: 100,
            ..Default::default()
        })
        .await;
        assert_eq!(named.total, 10);
        let quarantined = page(NodePageQuery {
            state: Some(NodeState::Quarantined),
            limit: 100,
            ..Default::default()
        })
        .await;
        assert_eq!(
            quarantined
                .nodes
                .iter()
                .map(|n| n.node.name.as_str())
                .collect::<Vec<_>>(),
            ["n-03"]
        );

        let counts = db.node_counts().await.unwrap();
        assert_eq!(counts.total, 25);
        assert_eq!(counts.by_state.get("quarantined"), Some(&1));
        assert_eq!(counts.by_state.get("active"), Some(&24));
        assert_eq!(counts.discovery_errors, 1);
        let unreadable = db.nodes_with_discovery_errors(10).await.unwrap();
        assert_eq!(unreadable.len(), 1);
        let ids: Vec<_> = all.nodes.iter().take(2).map(|n| n.node.id).collect();
        let names = db.node_names(&ids).await.unwrap();
        assert_eq!(names.values().cloned().collect::<Vec<_>>(), ["n-00", "n-01"]);
    }
}
