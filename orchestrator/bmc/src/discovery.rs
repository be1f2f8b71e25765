//! Fleet-wide inventory reads with bounded concurrency (`waveguard fleet discover`).

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, Stream, StreamExt};
use tokio::time::Instant;

use crate::Bmc;
use crate::config::BmcEndpoint;
use crate::error::BmcError;
use crate::redfish_bmc::RedfishBmc;
use crate::transport::HttpClients;
use crate::types::FirmwareComponent;

/// Default number of BMCs read at once. Each in-flight node costs one TCP (+TLS) connection and a few
/// KB; 64 keeps a 2-core controller busy without flooding the management network's switches, and a
/// 10,000-node fleet still takes only minutes at real BMC speeds (~1-3 s per inventory).
pub const DEFAULT_DISCOVERY_CONCURRENCY: usize = 64;

/// The outcome for one node: its inventory or why it could not be read.
#[derive(Debug)]
pub struct DiscoveryResult<K> {
    /// The caller's key for the node (e.g. its `NodeId`).
    pub node: K,
    /// The BMC's base URL.
    pub endpoint: String,
    /// The inventory, or the error (unreachable nodes are reported here; the rest continue).
    pub result: Result<Vec<FirmwareComponent>, BmcError>,
    /// Wall time spent on this node.
    pub elapsed: Duration,
}

/// Reads inventory from every BMC, at most `max_in_flight` at a time, yielding each result as soon as
/// it is ready (completion order) so the caller can record progress as it goes.
///
/// `per_node_deadline` bounds the time one node can hold a slot, whatever its retry policy says.
pub fn discover_inventory_stream<K>(
    nodes: impl IntoIterator<Item = (K, Arc<dyn Bmc>)>,
    max_in_flight: usize,
    per_node_deadline: Duration,
) -> impl Stream<Item = DiscoveryResult<K>>
where
    K: Send,
{
    stream::iter(nodes)
        .map(move |(node, bmc)| async move {
            let started = Instant::now();
            let result = match tokio::time::timeout(per_node_deadline, bmc.firmware_inventory()).await {
                Ok(result) => result,
                Err(_) => Err(BmcError::Timeout {
                    endpoint: bmc.endpoint().to_string(),
                    method: "GET".to_string(),
                    path: "/redfish/v1/UpdateService/FirmwareInventory".to_string(),
                    attempts: 0,
                }),
            };
            // Free the BMC's session slot; a failure here changes nothing about the inventory read.
            if let Err(e) = bmc.logout().await {
                tracing::debug!(endpoint = bmc.endpoint(), error = %e, "logout after discovery failed");
            }
            DiscoveryResult {
                node,
                endpoint: bmc.endpoint().to_string(),
                result,
                elapsed: started.elapsed(),
            }
        })
        .buffer_unordered(max_in_flight.max(1))
}

/// [`discover_inventory_stream`], collected.
pub async fn discover_with<K>(
    nodes: impl IntoIterator<Item = (K, Arc<dyn Bmc>)>,
    max_in_flight: usize,
    per_node_deadline: Duration,
) -> Vec<DiscoveryResult<K>>
where
    K: Send,
{
    discover_inventory_stream(nodes, max_in_flight, per_node_deadline)
        .collect()
        .await
}

/// Reads inventory from every endpoint over Redfish, at most `max_in_flight` at a time.
///
/// A node whose configuration is invalid is reported with a `Config` error; it does not stop the
/// others. The per-node deadline is each endpoint's own retry deadline plus its request timeout.
pub async fn discover_inventory<K>(
    clients: &HttpClients,
    endpoints: impl IntoIterator<Item = (K, BmcEndpoint)>,
    max_in_flight: usize,
) -> Vec<DiscoveryResult<K>>
where
    K: Send,
{
    let mut ready: Vec<(K, Arc<dyn Bmc>)> = Vec::new();
    let mut failed = Vec::new();
    let mut deadline = Duration::ZERO;
    for (node, endpoint) in endpoints {
        deadline = deadline.max(endpoint.retry.deadline + endpoint.timeouts.request);
        match RedfishBmc::new(&endpoint, clients) {
            Ok(bmc) => ready.push((node, Arc::new(bmc))),
            Err(e) => failed.push(DiscoveryResult {
                node,
                endpoint: without_user_info(&endpoint.base_url),
                result: Err(e),
                elapsed: Duration::ZERO,
            }),
        }
    }
    let mut results = discover_with(ready, max_in_flight, deadline).await;
    results.extend(failed);
    results
}

/// The URL as text with any user info removed, so a misconfigured URL cannot leak a password.
fn without_user_info(url: &url::Url) -> String {
    let mut url = url.clone();
    // Both setters only fail for URLs that cannot have user info, which is fine to ignore.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}
