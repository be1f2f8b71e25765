//! Issue 20 item 6: the Trainium platform end to end. The demo's default fleet size, 300 Trn2 servers (75 UltraServers), on the
//! `trn2` bmc-sim profile (an assumed layout, 16 accelerators each), four servers per UltraServer
//! (the scale-up domain, carried in the node's `nvlink_domain` label), rolled out under a policy
//! capping one flash per UltraServer with `concurrency.per_domain`. The cap is watched from the
//! database while the rollout runs: at no sample do two steps of one UltraServer count as in flight.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bmc_sim::Scenario;
use integration_tests::fixtures::{PolicyYaml, WaveSize, WaveYaml};
use integration_tests::{Harness, ScenarioYaml};
use orchestrator_db::execution::{RolloutState, StepFilter, StepState};
use orchestrator_db::model::ReleaseRollback;
use orchestrator_engine::{StartRollout, start_rollout};

/// The trn2 platform profile's SKU label and its accelerator firmware pair.
const TRN2_SKU: &str = "trn2-48xl";
const TRN2_FROM: &str = "2.20.0.0";
const TRN2_TO: &str = "2.21.0.0";
const NODES: usize = 300;
const SERVERS_PER_ULTRASERVER: usize = 4;
const LIMIT: Duration = Duration::from_secs(240);

fn scenario() -> Scenario {
    ScenarioYaml::profile("trn2", TRN2_SKU, NODES)
        .seed(20)
        .layout(15, 1)
        .nodes_per_nvlink_domain(SERVERS_PER_ULTRASERVER)
        .gpu_firmware(TRN2_TO, "{min: 2m, max: 4m}")
        .gpu_firmware(TRN2_FROM, "{min: 2m, max: 4m}")
        .build()
}

/// Generous global and per-rack caps, so only the UltraServer cap can bind.
fn policy() -> String {
    PolicyYaml::two_waves("trn2-demo")
        .inventory_id("NeuronDevice_*")
        .platforms(&[TRN2_SKU])
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(4))
                .stratify_by(&["nvlink_domain"])
                .bake("1m")
                .max_in_flight(4),
            WaveYaml::new("rest", WaveSize::Rest).bake("1m").max_in_flight(96),
        ])
        .concurrency(96, &["per_rack: 16", "per_domain: 1"])
        .max_failed(2)
        .automatic_rollback(false)
        .render()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trn2_fleet_rolls_out_with_one_flash_per_ultraserver() {
    let mut h = Harness::start_with(scenario(), false).await.unwrap();
    let domain_of: BTreeMap<_, _> =
        h.db.list_nodes(&Default::default())
            .await
            .unwrap()
            .into_iter()
            .map(|n| (n.id, format!("{}/{}", n.labels.cluster, n.labels.nvlink_domain)))
            .collect();
    let ultraservers: BTreeSet<_> = domain_of.values().cloned().collect();
    assert_eq!(domain_of.len(), NODES);
    assert_eq!(ultraservers.len(), NODES / SERVERS_PER_ULTRASERVER);
    for e in h.fleet.endpoints() {
        let chips = h
            .fleet
            .versions(&e.name)
            .unwrap()
            .into_iter()
            .filter(|c| c.id.starts_with("NeuronDevice_"))
            .count();
        assert_eq!(chips, 16, "{}", e.name);
    }

    let release = h
        .add_release_on(TRN2_SKU, TRN2_TO, true, &ReleaseRollback::default())
        .await;
    let id = start_rollout(
        &h.db,
        &StartRollout {
            release_id: release.id,
            policy_source: policy(),
            policy_commit: Some("abc".into()),
            policy_blob: Some("def".into()),
            seed: 3,
        },
        "alice",
    )
    .await
    .expect("rollout starts")
    .id;
    h.start_engine();

    // Sample the in-flight steps until the rollout ends: the largest count per UltraServer and
    // across the fleet.
    let filter = StepFilter {
        rollout_id: Some(id),
        ..Default::default()
    };
    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut worst_per_ultraserver = 0;
    let mut most_in_flight = 0;
    let done = loop {
        let steps = h.db.steps(&filter).await.unwrap();
        let mut per: BTreeMap<&str, usize> = BTreeMap::new();
        for s in steps.iter().filter(|s| s.state.is_in_flight()) {
            *per.entry(domain_of[&s.node_id].as_str()).or_default() += 1;
        }
        worst_per_ultraserver = worst_per_ultraserver.max(per.values().copied().max().unwrap_or(0));
        most_in_flight = most_in_flight.max(per.values().sum::<usize>());
        let rollout = h.db.exec_rollout(id).await.unwrap();
        if matches!(rollout.state, RolloutState::Completed | RolloutState::Halted) {
            break rollout;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rollout still {:?} after {LIMIT:?}",
            rollout.state
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let steps = h.db.steps(&filter).await.unwrap();
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    assert_eq!(steps.len(), NODES);
    assert!(steps.iter().all(|s| s.state == StepState::Succeeded), "{steps:#?}");
    assert_eq!(
        worst_per_ultraserver, 1,
        "per_domain: 1 was exceeded (or nothing was seen in flight)"
    );
    // The cap binds, not an accident of timing: several UltraServers flashed at once.
    assert!(most_in_flight > 1, "at most {most_in_flight} in flight");
    for e in h.fleet.endpoints() {
        for c in h.fleet.versions(&e.name).unwrap() {
            if c.id.starts_with("NeuronDevice_") {
                assert_eq!(c.active, TRN2_TO, "{} {}", e.name, c.id);
            }
        }
    }
    h.shutdown().await;
}
