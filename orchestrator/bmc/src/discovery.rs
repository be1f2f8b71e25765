//! Fleet-wide inventory reads with bounded concurrency (`waveguard fleet discover`).

use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, Stream, StreamExt};
use tokio::time::Instant;

use crate::Bmc;
use crate::clients::HttpClients;
use crate::config::BmcEndpoint;
use crate::error::BmcError;
use crate::redfish_bmc::RedfishBmc;
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
                // The deadline bounds the whole read (several requests and
                // their retries), so it is reported as a time bound of the
                // operation, not as a request that timed out "after 0 attempts".
                Err(_) => Err(BmcError::ReadLimit {
                    endpoint: bmc.endpoint().to_string(),
                    operation: "firmware inventory".to_string(),
                    limit: "time",
                    detail: format!("not read in full within the per-node discovery deadline of {per_node_deadline:?}"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResetKind;
    use crate::types::{
        EventBatch, EventCursor, ResetTarget, SensorReading, ServiceInfo, TaskHandle, TaskStatus, UpdateRequest,
    };

    /// A BMC that accepts the connection and never sends the inventory.
    #[derive(Debug)]
    struct Silent;

    impl Silent {
        fn unsupported<T>(&self) -> Result<T, BmcError> {
            Err(BmcError::Unsupported {
                endpoint: self.endpoint().to_string(),
                feature: "anything but hanging".to_string(),
            })
        }
    }

    #[async_trait::async_trait]
    impl Bmc for Silent {
        fn endpoint(&self) -> &str {
            "https://silent.bmc.test"
        }
        async fn probe(&self) -> Result<ServiceInfo, BmcError> {
            self.unsupported()
        }
        async fn firmware_inventory(&self) -> Result<Vec<FirmwareComponent>, BmcError> {
            std::future::pending().await
        }
        async fn start_update(&self, _: &UpdateRequest) -> Result<TaskHandle, BmcError> {
            self.unsupported()
        }
        async fn poll_task(&self, _: &TaskHandle) -> Result<TaskStatus, BmcError> {
            self.unsupported()
        }
        async fn reset(&self, _: &ResetTarget, _: ResetKind) -> Result<Option<TaskHandle>, BmcError> {
            self.unsupported()
        }
        async fn read_sensors(&self) -> Result<Vec<SensorReading>, BmcError> {
            self.unsupported()
        }
        async fn read_events(&self, _: &EventCursor) -> Result<EventBatch, BmcError> {
            self.unsupported()
        }
        async fn logout(&self) -> Result<(), BmcError> {
            Ok(())
        }
    }

    /// Issue 24: the per-node deadline used to be reported as a request
    /// timeout "after 0 attempts"; it names the deadline it enforced.
    #[tokio::test]
    async fn a_silent_bmc_is_reported_against_the_discovery_deadline() {
        let bmc: Arc<dyn Bmc> = Arc::new(Silent);
        let results = discover_with([(1u32, bmc)], 4, Duration::from_millis(50)).await;
        assert_eq!(results.len(), 1);
        let err = results[0].result.as_ref().unwrap_err();
        let text = err.to_string();
        assert_eq!(
            text,
            "BMC https://silent.bmc.test: firmware inventory went past its time bound \
             (not read in full within the per-node discovery deadline of 50ms)"
        );
        assert!(!text.contains("0 attempts"), "{text}");
        assert!(err.is_transient(), "a slow BMC may answer next time");
    }

    #[test]
    fn attempt_counts_read_as_english() {
        let timeout = |attempts| BmcError::Timeout {
            endpoint: "http://x".into(),
            method: "GET".into(),
            path: "/redfish/v1".into(),
            attempts,
        };
        assert_eq!(
            timeout(1).to_string(),
            "BMC http://x did not answer GET /redfish/v1 in time after 1 attempt"
        );
        assert_eq!(
            timeout(3).to_string(),
            "BMC http://x did not answer GET /redfish/v1 in time after 3 attempts"
        );
        let busy = BmcError::Unavailable {
            endpoint: "http://x".into(),
            method: "PATCH".into(),
            path: "/redfish/v1/UpdateService".into(),
            status: 409,
            retry_after: None,
            attempts: 0,
        };
        assert_eq!(
            busy.to_string(),
            "BMC http://x stayed unavailable (HTTP 409) for PATCH /redfish/v1/UpdateService before any attempt"
        );
    }
}
