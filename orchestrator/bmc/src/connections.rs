//! The one bound on the controller's BMC connections: how many sockets to BMCs may be open at once,
//! fleet-wide, whoever opens them (the engine's steps, the health collector, discovery, the RMA
//! monitor all reach BMCs through the same [`crate::HttpClients`]).
//!
//! Why a lease per BMC and not a permit per request: idle keep-alive connections hold descriptors
//! too, and a shared connection pool keeps one per recently used BMC (a health sweep over 10,000
//! BMCs leaves 10,000 idle sockets), which no per-request permit sees. So each BMC gets its own small
//! HTTP client only while it holds a lease of [`CONNECTIONS_PER_BMC`] permits; the client, and with
//! it every connection it pooled, is dropped when the lease goes back. A BMC with nothing in flight
//! keeps its lease (and its warm connections) until someone else waits for permits: then it gives
//! the lease back at once, or is evicted, least recently idle first, by the waiter.
//!
//! Waiting for a lease or for one of the BMC's own slots happens before any request timeout or retry
//! deadline starts, so a queue in the controller is never a BMC's timeout.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit};

use crate::error::BmcError;
use crate::limits::PER_BMC_FETCH_CONCURRENCY;

/// Connections (and requests in flight) one BMC may have at once: as many as its parallel fetches
/// use. A lease reserves this many from the fleet-wide bound.
pub const CONNECTIONS_PER_BMC: usize = PER_BMC_FETCH_CONCURRENCY;

/// Descriptors kept out of the BMC bound by default: the database pool (16 PostgreSQL connections,
/// or SQLite's file, WAL and shared memory), the HTTP listener and its clients, the image server,
/// log and policy files, and the resolver. Generous on purpose: a controller that runs out of
/// descriptors for its own database is far worse off than one that queues BMC requests.
pub const DEFAULT_FILE_RESERVE: u64 = 256;

/// The default bound's ceiling, whatever the open-file limit would allow. An open BMC connection
/// costs the controller about 40 KB of its own memory (hyper's read and write buffers and its request
/// channel; heaptrack, 4,000 nodes) besides the kernel's socket buffers, and the bound is what keeps
/// them open: idle leases hold their warm connections until someone needs the permits. Past what the
/// engine and the collector keep in flight (each in-flight BMC holds [`CONNECTIONS_PER_BMC`]; a
/// 512-node wave with its polls stays under 1,200), a larger bound only keeps more idle sockets warm,
/// and a fleet-wide sweep evicts them before it comes back to the same BMC. Sized by the file limit
/// alone, a 20,000-node run held ~9,800 sockets and 1.2 GB. `[bmc] max_connections` sets any bound.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// This process's soft `RLIMIT_NOFILE`: the bound the kernel enforces (`EMFILE`).
pub fn soft_open_file_limit() -> Result<u64, LimitError> {
    let (soft, _hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).map_err(LimitError::Unreadable)?;
    Ok(soft)
}

/// Descriptors kept for everything but BMC connections under a soft limit of `soft`:
/// [`DEFAULT_FILE_RESERVE`], or a quarter of a smaller limit (a controller under `ulimit -n 256`
/// still gets 192 BMC connections and keeps 64 for itself).
pub fn default_reserve(soft: u64) -> u64 {
    DEFAULT_FILE_RESERVE.min(soft / 4)
}

/// The fleet-wide bound on open BMC connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimit {
    connections: usize,
}

/// Why a bound cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    /// Fewer connections than one BMC needs.
    #[error("the BMC connection limit must be at least {min} (one BMC's connections), not {given}")]
    TooSmall {
        /// What was asked for.
        given: usize,
        /// The smallest usable bound.
        min: usize,
    },
    /// The open-file limit leaves nothing for BMC connections after the reserve.
    #[error(
        "the open-file limit (soft) is {soft}, which leaves fewer than {min} descriptors for BMC connections after \
         reserving {reserve}; raise `ulimit -n` or lower the reserve"
    )]
    FileLimit {
        /// The soft `RLIMIT_NOFILE`.
        soft: u64,
        /// Descriptors kept for everything else.
        reserve: u64,
        /// The smallest usable bound.
        min: usize,
    },
    /// `getrlimit` failed.
    #[error("cannot read the open-file limit")]
    Unreadable(#[source] std::io::Error),
}

impl ConnectionLimit {
    /// The smallest bound: one BMC at a time.
    pub const MIN: ConnectionLimit = ConnectionLimit {
        connections: CONNECTIONS_PER_BMC,
    };

    /// At most `connections` open BMC connections.
    pub fn new(connections: usize) -> Result<Self, LimitError> {
        if connections < CONNECTIONS_PER_BMC {
            return Err(LimitError::TooSmall {
                given: connections,
                min: CONNECTIONS_PER_BMC,
            });
        }
        Ok(Self { connections })
    }

    /// The soft open-file limit of this process minus `reserve` descriptors (default
    /// [`default_reserve`]) for everything that is not a BMC connection, at most
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub fn from_open_files(reserve: Option<u64>) -> Result<Self, LimitError> {
        let soft = soft_open_file_limit()?;
        Self::default_for_file_limit(soft, reserve.unwrap_or_else(|| default_reserve(soft)))
    }

    /// As [`ConnectionLimit::from_open_files`] for a given soft limit: what it leaves after `reserve`,
    /// at most [`DEFAULT_MAX_CONNECTIONS`].
    pub fn default_for_file_limit(soft: u64, reserve: u64) -> Result<Self, LimitError> {
        let limit = Self::from_file_limit(soft, reserve)?;
        Ok(Self {
            connections: limit.connections.min(DEFAULT_MAX_CONNECTIONS),
        })
    }

    /// As [`ConnectionLimit::from_open_files`] for a given soft limit.
    pub fn from_file_limit(soft: u64, reserve: u64) -> Result<Self, LimitError> {
        let left = usize::try_from(soft.saturating_sub(reserve)).unwrap_or(usize::MAX);
        Self::new(left).map_err(|_| LimitError::FileLimit {
            soft,
            reserve,
            min: CONNECTIONS_PER_BMC,
        })
    }

    /// The bound, in connections.
    pub fn connections(&self) -> usize {
        self.connections
    }
}

/// What the bound is and how much of it is in use, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnectionUsage {
    /// The bound on open BMC connections.
    pub limit: usize,
    /// Connections reserved by the BMCs holding a lease (an upper bound on those open).
    pub reserved: usize,
    /// BMC requests in flight (retries and their backoff included).
    pub in_flight: usize,
    /// BMCs waiting for a lease.
    pub waiting: usize,
}

/// The fleet-wide bound shared by every BMC's lane.
#[derive(Debug)]
pub(crate) struct ConnectionBudget {
    permits: Arc<Semaphore>,
    limit: usize,
    waiting: AtomicUsize,
    reserved: AtomicUsize,
    in_flight: AtomicUsize,
    /// Lanes that hold a lease with nothing in flight, oldest first; entries may be stale (the lane
    /// was used again, or dropped), which eviction checks.
    idle: Mutex<VecDeque<Weak<BmcLane>>>,
}

impl ConnectionBudget {
    pub(crate) fn new(limit: ConnectionLimit) -> Arc<Self> {
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(limit.connections)),
            limit: limit.connections,
            waiting: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            idle: Mutex::new(VecDeque::new()),
        })
    }

    pub(crate) fn usage(&self) -> ConnectionUsage {
        ConnectionUsage {
            limit: self.limit,
            reserved: self.reserved.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
        }
    }

    /// A lease's permits: at once if free, else by evicting idle lanes, else in turn.
    async fn reserve(self: &Arc<Self>) -> Result<OwnedSemaphorePermit, BmcError> {
        let permits = || self.permits.clone().try_acquire_many_owned(CONNECTIONS_PER_BMC as u32);
        if let Ok(p) = permits() {
            return Ok(p);
        }
        // Counted before looking at the idle lanes: a lane that goes idle after this point sees a
        // waiter and gives its lease back itself, so no wake-up is lost.
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Decrement(&self.waiting);
        loop {
            let next = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
            let Some(lane) = next else { break };
            if let Some(lane) = lane.upgrade() {
                lane.release_if_idle();
            }
            if let Ok(p) = permits() {
                return Ok(p);
            }
        }
        self.permits
            .clone()
            .acquire_many_owned(CONNECTIONS_PER_BMC as u32)
            .await
            .map_err(|_| closed())
    }
}

fn closed() -> BmcError {
    BmcError::Config {
        endpoint: "-".into(),
        reason: "the BMC connection bound was closed".into(),
        source: None,
    }
}

struct Decrement<'a>(&'a AtomicUsize);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Builds one BMC's HTTP client (its TLS trust, connect timeout and fault seam).
pub(crate) type ClientRecipe = Box<dyn Fn() -> Result<reqwest::Client, BmcError> + Send + Sync>;

/// One BMC's way out: its share of the bound while it holds a lease, its own client (pool) then, and
/// its own cap on requests in flight.
pub(crate) struct BmcLane {
    budget: Arc<ConnectionBudget>,
    recipe: ClientRecipe,
    slots: Semaphore,
    state: Mutex<LaneState>,
}

impl std::fmt::Debug for BmcLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BmcLane").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct LaneState {
    lease: Option<Lease>,
    in_flight: usize,
    queued_idle: bool,
}

struct Lease {
    client: reqwest::Client,
    budget: Arc<ConnectionBudget>,
    permits: Option<OwnedSemaphorePermit>,
}

/// How long a given-back lease's permits stay taken: dropping the client closes its pooled
/// connections on their own tasks, a moment later, and the next BMC must not open its own before
/// they are gone.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_millis(50);

impl Drop for Lease {
    fn drop(&mut self) {
        let budget = self.budget.clone();
        let permits = self.permits.take();
        let give_back = move || {
            budget.reserved.fetch_sub(CONNECTIONS_PER_BMC, Ordering::Relaxed);
            drop(permits);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(CLOSE_GRACE).await;
                    give_back();
                });
            }
            Err(_) => give_back(),
        }
    }
}

/// One request's (with its retries') right to talk to the BMC; gives the slot back on drop.
pub(crate) struct Slot<'a> {
    lane: &'a Arc<BmcLane>,
    client: reqwest::Client,
    _slot: SemaphorePermit<'a>,
}

impl Slot<'_> {
    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.lane.finish();
    }
}

impl BmcLane {
    pub(crate) fn new(budget: Arc<ConnectionBudget>, recipe: ClientRecipe) -> Arc<Self> {
        Arc::new(Self {
            budget,
            recipe,
            slots: Semaphore::new(CONNECTIONS_PER_BMC),
            state: Mutex::new(LaneState::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LaneState> {
        // Plain counters and an Option: valid even if a holder panicked.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for one of this BMC's slots and for a lease, then hands out its client.
    pub(crate) async fn acquire(self: &Arc<Self>) -> Result<Slot<'_>, BmcError> {
        let slot = self.slots.acquire().await.map_err(|_| closed())?;
        loop {
            {
                let mut state = self.lock();
                if let Some(lease) = &state.lease {
                    let client = lease.client.clone();
                    state.in_flight += 1;
                    self.budget.in_flight.fetch_add(1, Ordering::Relaxed);
                    return Ok(Slot {
                        lane: self,
                        client,
                        _slot: slot,
                    });
                }
            }
            let permits = self.budget.reserve().await?;
            let client = (self.recipe)()?;
            let mut state = self.lock();
            // The other slot's holder may have leased meanwhile; then ours goes back.
            if state.lease.is_none() {
                self.budget.reserved.fetch_add(CONNECTIONS_PER_BMC, Ordering::Relaxed);
                state.lease = Some(Lease {
                    client,
                    budget: self.budget.clone(),
                    permits: Some(permits),
                });
            }
        }
    }

    fn finish(self: &Arc<Self>) {
        let released = {
            let mut state = self.lock();
            state.in_flight = state.in_flight.saturating_sub(1);
            self.budget.in_flight.fetch_sub(1, Ordering::Relaxed);
            if state.in_flight > 0 || state.lease.is_none() {
                None
            } else if self.budget.waiting.load(Ordering::SeqCst) > 0 {
                state.lease.take()
            } else {
                if !state.queued_idle {
                    state.queued_idle = true;
                    self.budget
                        .idle
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_back(Arc::downgrade(self));
                }
                None
            }
        };
        // Dropped outside the lock: closing the pool's connections is not the lane's business.
        drop(released);
    }

    fn release_if_idle(&self) {
        let released = {
            let mut state = self.lock();
            state.queued_idle = false;
            if state.in_flight == 0 { state.lease.take() } else { None }
        };
        drop(released);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(budget: &Arc<ConnectionBudget>) -> Arc<BmcLane> {
        BmcLane::new(
            budget.clone(),
            Box::new(|| {
                reqwest::Client::builder().build().map_err(|e| BmcError::Config {
                    endpoint: "test".into(),
                    reason: "client".into(),
                    source: Some(Box::new(e)),
                })
            }),
        )
    }

    #[test]
    fn limits_from_the_file_limit_keep_the_reserve() {
        assert_eq!(ConnectionLimit::from_file_limit(4096, 256).unwrap().connections(), 3840);
        assert!(matches!(
            ConnectionLimit::from_file_limit(200, 256),
            Err(LimitError::FileLimit { soft: 200, .. })
        ));
        assert!(matches!(ConnectionLimit::new(1), Err(LimitError::TooSmall { .. })));
        assert_eq!(default_reserve(256), 64);
        assert_eq!(default_reserve(20_000), DEFAULT_FILE_RESERVE);
    }

    #[test]
    fn the_default_bound_stops_at_its_ceiling_not_at_the_file_limit() {
        let default = |soft| ConnectionLimit::default_for_file_limit(soft, default_reserve(soft)).unwrap();
        assert_eq!(default(4096).connections(), 3840);
        assert_eq!(default(20_000).connections(), DEFAULT_MAX_CONNECTIONS);
        assert_eq!(default(1 << 20).connections(), DEFAULT_MAX_CONNECTIONS);
        // An explicit bound is the operator's to size.
        assert_eq!(ConnectionLimit::new(10_000).unwrap().connections(), 10_000);
    }

    #[tokio::test]
    async fn an_idle_lease_goes_to_a_waiting_bmc_and_a_busy_one_is_kept() {
        let budget = ConnectionBudget::new(ConnectionLimit::new(2 * CONNECTIONS_PER_BMC).unwrap());
        let (a, b, c) = (lane(&budget), lane(&budget), lane(&budget));
        let slot_a = a.acquire().await.unwrap();
        let slot_b = b.acquire().await.unwrap();
        assert_eq!(budget.usage().reserved, 2 * CONNECTIONS_PER_BMC);
        // Both leases busy: c waits.
        let c2 = c.clone();
        let waiter = tokio::spawn(async move {
            let slot = c2.acquire().await.unwrap();
            drop(slot);
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "no lease should be free while both are busy");
        assert_eq!(budget.usage().waiting, 1);
        // a goes idle while c waits: a gives its lease back at once.
        drop(slot_a);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the waiter got a's lease")
            .unwrap();
        assert!(a.lock().lease.is_none(), "a's lease went to the waiter");
        assert!(b.lock().lease.is_some(), "b is busy and keeps its lease");
        drop(slot_b);
        // Nobody waits now: idle leases stay (warm connections) and are evicted on demand.
        assert!(b.lock().lease.is_some());
        let d = lane(&budget);
        let _slot_d = d.acquire().await.unwrap();
        let _slot_a = a.acquire().await.unwrap();
        assert!(budget.usage().reserved <= budget.usage().limit);
        assert_eq!(budget.usage().in_flight, 2);
    }
}
