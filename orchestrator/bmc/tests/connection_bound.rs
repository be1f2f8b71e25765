//! The fleet-wide bound on open BMC connections, counted where it matters: at the simulated BMCs.
//! A fleet several times larger than the bound is read over and over, many BMCs at once (as the
//! engine, the health collector and discovery do together), and bmc-sim's own count of open client
//! connections never passes the bound; every read still succeeds, because waiting for a share of
//! the bound is not a failure.

use std::sync::Arc;
use std::time::Duration;

use bmc_sim::{Fleet, FleetOptions, Scenario};
use chrono::Utc;
use futures::StreamExt as _;
use orchestrator_bmc::{
    Bmc, BmcEndpoint, CONNECTIONS_PER_BMC, ConnectionLimit, Credentials, HttpClients, RedfishBmc, Timeouts,
};
use orchestrator_types::ManualClock;

const SMALL: &str = include_str!("../../../bmc-sim/scenarios/small.yaml");

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fleet_larger_than_the_bound_never_holds_more_connections_than_it() {
    const NODES: usize = 48;
    const BOUND: usize = 4 * CONNECTIONS_PER_BMC;
    let scenario = Scenario::from_yaml_str(SMALL).expect("scenario");
    let mut options = FleetOptions::new(Arc::new(ManualClock::new(Utc::now())));
    options.nodes = Some(NODES);
    // Keep-alive on: idle pooled connections are what a per-request limit would miss.
    options.keep_alive = true;
    let fleet = Fleet::start(scenario, options).await.expect("fleet starts");
    let clients = HttpClients::with_connection_limit(ConnectionLimit::new(BOUND).expect("bound"));
    let bmcs: Vec<Arc<RedfishBmc>> = fleet
        .endpoints()
        .iter()
        .map(|e| {
            let endpoint = BmcEndpoint::new(e.bmc_url.parse().expect("url"), Credentials::new("admin", "admin"))
                .with_timeouts(Timeouts {
                    connect: Duration::from_secs(2),
                    request: Duration::from_secs(5),
                    upload: Duration::from_secs(10),
                    probe: Duration::from_secs(1),
                });
            Arc::new(RedfishBmc::new(&endpoint, &clients).expect("driver"))
        })
        .collect();
    // Three rounds over the whole fleet, 32 BMC operations at once, each reading the inventory
    // (paged member GETs, two at a time per BMC) and the sensors.
    for _ in 0..3 {
        let results: Vec<_> = futures::stream::iter(bmcs.iter().cloned())
            .map(|bmc| async move {
                let inventory = bmc.firmware_inventory().await?;
                let sensors = bmc.read_sensors().await?;
                Ok::<_, orchestrator_bmc::BmcError>((inventory.len(), sensors.len()))
            })
            .buffer_unordered(32)
            .collect()
            .await;
        for r in &results {
            let (inventory, _) = r.as_ref().expect("every read succeeds; queueing is not a failure");
            assert!(*inventory > 0);
        }
        let usage = clients.usage();
        assert!(usage.reserved <= BOUND, "{usage:?}");
    }
    let (_, peak) = fleet.connections();
    assert!(peak > 0, "the fleet saw connections");
    // bmc-sim counts a connection until its task reads the close, which on a loaded machine can
    // come after the controller has closed it and handed the lease on: one lease's worth of
    // connections in that state is the server's lag, not the controller's use (the controller's
    // own count is `usage.reserved` above).
    let server_lag = CONNECTIONS_PER_BMC;
    assert!(
        peak <= BOUND + server_lag,
        "{peak} connections were open at the BMCs at once, bound {BOUND}"
    );
    // The same work without a bound opens far more at once: the test can fail.
    let unbounded = HttpClients::with_connection_limit(ConnectionLimit::new(100 * NODES).expect("bound"));
    let before = fleet.connections().1;
    let loose: Vec<Arc<RedfishBmc>> = fleet
        .endpoints()
        .iter()
        .map(|e| {
            let endpoint = BmcEndpoint::new(e.bmc_url.parse().expect("url"), Credentials::new("admin", "admin"));
            Arc::new(RedfishBmc::new(&endpoint, &unbounded).expect("driver"))
        })
        .collect();
    futures::stream::iter(loose)
        .map(|bmc| async move { bmc.firmware_inventory().await })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    assert!(
        fleet.connections().1 > (BOUND + server_lag).max(before),
        "without the bound more than {BOUND} connections open at once (peak {})",
        fleet.connections().1
    );
    fleet.shutdown().await;
}
