//! The engine's loop: hold the executor lease, run a pass whenever woken
//! (periodically or by a nudge), stop cleanly on shutdown.

use std::future::Future;
use std::sync::Arc;

use orchestrator_db::Db;
use orchestrator_db::execution::Fence;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::config::{DRIVER_IDLE_LOGOUT, DRIVER_SWEEP_INTERVAL, EXECUTOR_LEASE, EngineConfig};
use crate::connector::BmcConnector;
use crate::controller::{ControllerHealth, ControllerStatus};
use crate::executor::Executor;
use crate::health::HealthJudge;

/// Wakes the engine before its next periodic pass (after an API command),
/// and reads the controller's own health for whoever holds it (the web
/// layer's `/metrics` and status API).
#[derive(Debug, Clone, Default)]
pub struct Nudge(Arc<Notify>, Arc<ControllerHealth>);

impl Nudge {
    /// Asks for a pass as soon as the current one ends.
    pub fn nudge(&self) {
        self.0.notify_one();
    }

    /// Whether the controller is degraded by a fault of its own, and why.
    pub fn controller_status(&self) -> ControllerStatus {
        self.1.status()
    }

    /// A handle reading `health` and waking nothing: for a process (or a
    /// test) that shows a controller's health without running its engine.
    pub fn for_health(health: Arc<ControllerHealth>) -> Nudge {
        Nudge(Arc::new(Notify::new()), health)
    }
}

/// Whether this process holds the executor lease now, for the duties only
/// the lease holder runs beside the engine's passes (the RMA monitor,
/// health-sample retention): one controller reads the fleet's BMCs and
/// reduces samples, however many replicas run. The engine's loop takes and
/// renews the lease ([`Engine`]); a duty only reads the lease row, so it
/// stands down within one of its passes of the engine losing it, and its
/// writes are idempotent (or fenced, for retention) in case a pass outlives it.
#[derive(Debug, Clone)]
pub struct LeaseHolder {
    db: Db,
    holder: String,
}

impl LeaseHolder {
    /// The lease as held by `holder` (the engine's `EngineConfig::holder`).
    pub fn new(db: Db, holder: impl Into<String>) -> Self {
        Self {
            db,
            holder: holder.into(),
        }
    }

    /// The fence while this holder has the executor lease and it has not
    /// expired on the database's clock; `None` otherwise.
    pub async fn current(&self) -> Result<Option<Fence>, orchestrator_db::DbError> {
        let now = self.db.clock().now();
        Ok(match self.db.lease_holder(EXECUTOR_LEASE).await? {
            Some((holder, token, expires_at)) if holder == self.holder && expires_at > now => Some(Fence {
                lease: EXECUTOR_LEASE.to_owned(),
                holder,
                token,
                expires_at,
            }),
            _ => None,
        })
    }
}

/// A running engine.
#[derive(Debug)]
pub struct Engine {
    nudge: Nudge,
    stop: Arc<Notify>,
    task: JoinHandle<()>,
    driver_sweep: JoinHandle<()>,
    connector: Arc<dyn BmcConnector>,
    lease: LeaseHolder,
}

impl Engine {
    /// Starts the loop. Every replica may start one; only the holder of the
    /// executor lease executes, the others wait to take over.
    pub fn start(
        db: Db,
        config: EngineConfig,
        connector: Arc<dyn BmcConnector>,
        judge: Arc<dyn HealthJudge>,
    ) -> Engine {
        let stop = Arc::new(Notify::new());
        let lease = LeaseHolder::new(db.clone(), config.holder.clone());
        let executor = Executor::new(db, config, connector.clone(), judge);
        let nudge = Nudge(Arc::new(Notify::new()), executor.health.clone());
        let task = tokio::spawn(run(executor, nudge.clone(), stop.clone()));
        let driver_sweep = spawn_idle_driver_sweep(connector.clone());
        Engine {
            nudge,
            stop,
            task,
            driver_sweep,
            connector,
            lease,
        }
    }

    /// Whether this engine holds the executor lease: what the duties run
    /// only on the lease holder check before each of their passes.
    pub fn lease(&self) -> LeaseHolder {
        self.lease.clone()
    }

    /// A handle to wake the engine.
    pub fn nudge(&self) -> Nudge {
        self.nudge.clone()
    }

    /// Whether the controller is degraded by a fault of its own, and why.
    pub fn controller_status(&self) -> ControllerStatus {
        self.nudge.controller_status()
    }

    /// Stops after the current pass, gives the lease up so a standby takes
    /// over at once, and deletes the BMC sessions it opened.
    pub async fn shutdown(self) {
        self.stop.notify_one();
        if let Err(err) = self.task.await {
            tracing::error!(error = %err, "engine task ended abnormally");
        }
        // A sweep cut mid-way leaves the sessions it had taken to the BMCs' own timeout.
        self.driver_sweep.abort();
        let _ = self.driver_sweep.await;
        crate::connector::logout_all(self.connector.as_ref()).await;
    }

    /// Stops at once, as a crash would: the pass in progress is cut at its
    /// next await point, the lease is kept until it expires and no BMC
    /// session is deleted. For crash tests; a real stop is
    /// [`Engine::shutdown`].
    pub async fn kill(self) {
        self.task.abort();
        self.driver_sweep.abort();
        let _ = self.task.await;
        let _ = self.driver_sweep.await;
    }

    /// Runs until `shutdown` resolves.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) {
        shutdown.await;
        self.shutdown().await;
    }
}

/// Logs out idle BMC drivers on every replica (standbys hold drivers too: the API reads inventory
/// through them), apart from the passes so a BMC slow to delete a session never delays one.
fn spawn_idle_driver_sweep(connector: Arc<dyn BmcConnector>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(DRIVER_SWEEP_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            crate::connector::logout_idle(connector.as_ref(), DRIVER_IDLE_LOGOUT).await;
        }
    })
}

async fn run(executor: Executor, nudge: Nudge, stop: Arc<Notify>) {
    let db = executor.db.clone();
    let config = executor.config.clone();
    let mut fence: Option<Fence> = None;
    loop {
        // Renew (or take) the lease before every pass; a pass never starts
        // with less than half the lease left.
        match db.acquire_lease(EXECUTOR_LEASE, &config.holder, config.lease_ttl).await {
            Ok(Some(new)) => {
                if fence.as_ref().map(|f| f.token) != Some(new.token) {
                    tracing::info!(holder = %new.holder, token = new.token, "executor lease acquired");
                }
                fence = Some(new);
            }
            Ok(None) => {
                if fence.take().is_some() {
                    tracing::warn!("executor lease lost to another controller");
                }
            }
            Err(err) => {
                tracing::warn!(error = %orchestrator_types::error_chain(&err), "cannot renew the executor lease");
                // Keep the fence: every write checks it, so a stale one fails safely.
            }
        }
        if let Some(current) = &fence
            && let Err(err) = executor.pass(current).await
        {
            if matches!(err, orchestrator_db::DbError::Fenced { .. }) {
                tracing::warn!("executor lease lost mid-pass; standing down");
                fence = None;
            } else {
                tracing::warn!(error = %orchestrator_types::error_chain(&err), "executor pass failed");
                if err.is_controller_fault() {
                    executor.health.report_fault("database", db.clock().now());
                }
            }
        }
        tokio::select! {
            () = stop.notified() => break,
            () = nudge.0.notified() => {}
            () = tokio::time::sleep(config.pass_interval) => {}
        }
    }
    if let Some(fence) = fence
        && let Err(err) = db.release_lease(&fence).await
    {
        tracing::warn!(error = %orchestrator_types::error_chain(&err), "could not release the executor lease");
    }
    tracing::info!("engine stopped");
}
