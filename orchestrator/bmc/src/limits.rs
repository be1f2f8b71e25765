//! Every read from a BMC is bounded in bytes, pages, requests and time, per response and per
//! operation. A BMC is outside the controller's trust boundary: a broken or hostile one can stream an
//! endless body, a collection with thousands of pages, or a `nextLink` that points back at itself. The
//! bounds below turn each of those into a typed error ([`crate::BmcError::ReadLimit`]) instead of a
//! controller that runs out of memory or holds a worker forever.
//!
//! The figures are far above what real services send (measured on public mockups of DGX H100, GB200,
//! Dell iDRAC and HPE iLO services) and far below what hurts a controller that talks to thousands of
//! BMCs at once.

use std::time::Duration;

/// How many member GETs one BMC gets at once when a collection lists links only. BMC web servers are
/// small embedded processes; more parallelism mostly earns 503s.
pub(crate) const PER_BMC_FETCH_CONCURRENCY: usize = 2;

/// Largest single response body accepted. Redfish resources are kilobytes; the largest real ones (an
/// expanded event log page, `$metadata`) are a few MiB. A longer body is refused, never truncated:
/// a truncated document would parse as something else or not at all, and hide the reason.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

/// Total response bytes one operation (an inventory read, a sensor sweep, an event-log read, a task
/// list) may read over all its pages and member GETs. An expanded DGX H100 inventory is ~200 KiB and
/// its sensors ~2 MiB; two maximal responses are allowed, so peak memory per operation stays near
/// twice [`MAX_RESPONSE_BYTES`] however many pages a BMC claims to have.
pub const MAX_OPERATION_BYTES: usize = 2 * MAX_RESPONSE_BYTES;

/// `Members@odata.nextLink` pages followed for one collection. Real BMCs page at 50-1000 members;
/// 64 pages covers any event log they keep.
pub const MAX_COLLECTION_PAGES: usize = 64;

/// HTTP requests one operation may make (pages plus member GETs on BMCs that do not expand). A DGX
/// H100 without `$expand` needs ~600 for its sensors; more means the BMC is listing garbage.
pub const MAX_OPERATION_REQUESTS: usize = 4096;

/// Wall time one read operation may take, retries included. Every request also has its own timeout
/// (`Timeouts::request`); this bounds the sum, so a BMC that answers each request just in time
/// cannot hold a health-collection worker for hours.
pub const MAX_OPERATION_TIME: Duration = Duration::from_secs(300);

/// Largest firmware image the controller downloads to push itself (multipart or `HttpPushUri`).
/// The image is held in memory for the upload and its retries; GPU baseboard bundles are a few
/// hundred MiB. A BMC's own `MaxImageSizeBytes` lowers this further.
pub const MAX_PUSH_IMAGE_BYTES: usize = 1024 * 1024 * 1024;

/// The running total of one read operation against the bounds above. Shared by the concurrent member
/// GETs of the operation, hence atomics.
#[derive(Debug)]
pub(crate) struct ReadBudget {
    operation: &'static str,
    started: tokio::time::Instant,
    bytes: std::sync::atomic::AtomicUsize,
    requests: std::sync::atomic::AtomicUsize,
}

impl ReadBudget {
    pub(crate) fn new(operation: &'static str) -> Self {
        Self {
            operation,
            started: tokio::time::Instant::now(),
            bytes: std::sync::atomic::AtomicUsize::new(0),
            requests: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Called before each request: refuses once the request count or the time is used up.
    pub(crate) fn before_request(&self, endpoint: &str) -> Result<(), crate::BmcError> {
        use std::sync::atomic::Ordering;
        let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        if n > MAX_OPERATION_REQUESTS {
            return Err(self.exceeded(
                endpoint,
                "requests",
                format!("more than {MAX_OPERATION_REQUESTS} requests"),
            ));
        }
        let elapsed = self.started.elapsed();
        if elapsed > MAX_OPERATION_TIME {
            return Err(self.exceeded(
                endpoint,
                "time",
                format!(
                    "{}s elapsed, bound {}s",
                    elapsed.as_secs(),
                    MAX_OPERATION_TIME.as_secs()
                ),
            ));
        }
        Ok(())
    }

    /// Called with each body read: refuses once the operation's bytes are used up.
    pub(crate) fn charge(&self, endpoint: &str, body_len: usize) -> Result<(), crate::BmcError> {
        use std::sync::atomic::Ordering;
        let total = self
            .bytes
            .fetch_add(body_len, Ordering::Relaxed)
            .saturating_add(body_len);
        if total > MAX_OPERATION_BYTES {
            return Err(self.exceeded(
                endpoint,
                "bytes",
                format!("{total} bytes read, bound {MAX_OPERATION_BYTES}"),
            ));
        }
        Ok(())
    }

    pub(crate) fn exceeded(&self, endpoint: &str, limit: &'static str, detail: String) -> crate::BmcError {
        crate::BmcError::ReadLimit {
            endpoint: endpoint.to_string(),
            operation: self.operation.to_string(),
            limit,
            detail,
        }
    }
}
