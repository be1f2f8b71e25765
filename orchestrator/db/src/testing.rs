//! Throw-away databases for tests: a SQLite file in a temporary directory
//! always, and a fresh PostgreSQL database per test when
//! `WAVEGUARD_TEST_POSTGRES_URL` is set. Each test gets its own database, so
//! tests run in parallel without seeing each other.

use std::sync::Arc;

use orchestrator_types::{Clock, SystemClock};
use rand::Rng;
use sea_orm::{ConnectionTrait, Database};

use crate::{Backend, Db};

pub mod fixtures;

/// Environment variable naming the PostgreSQL server for tests, e.g.
/// `postgres://postgres@127.0.0.1:5432/test`.
pub const POSTGRES_URL_ENV: &str = "WAVEGUARD_TEST_POSTGRES_URL";

/// When `1`, a test that would skip for lack of an external program fails.
pub const REQUIRE_ALL_ENV: &str = "WAVEGUARD_REQUIRE_ALL";

/// True when CI demands that nothing be skipped.
pub fn require_all() -> bool {
    std::env::var(REQUIRE_ALL_ENV).is_ok_and(|v| v == "1")
}

/// A migrated database that is removed when dropped.
#[derive(Debug)]
pub struct TestDb {
    /// The handle under test.
    pub db: Db,
    /// The URL the test database can be reached at (for a second process).
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    postgres_drop: Option<(String, String)>,
}

impl TestDb {
    /// A migrated SQLite database in a fresh temporary directory.
    pub async fn sqlite(clock: Arc<dyn Clock>) -> TestDb {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        let url = format!("sqlite://{}", dir.path().join("waveguard.db").display());
        let db = Db::connect_and_migrate(&url, clock)
            .await
            .unwrap_or_else(|e| panic!("cannot open test SQLite database: {e:?}"));
        TestDb {
            db,
            url,
            _dir: Some(dir),
            postgres_drop: None,
        }
    }

    /// A migrated, freshly created PostgreSQL database, or `None` (after a
    /// loud message) when no server is configured. Panics instead of
    /// skipping when `WAVEGUARD_REQUIRE_ALL=1`.
    pub async fn postgres(clock: Arc<dyn Clock>) -> Option<TestDb> {
        let Ok(admin_url) = std::env::var(POSTGRES_URL_ENV) else {
            assert!(
                !require_all(),
                "{REQUIRE_ALL_ENV}=1 but {POSTGRES_URL_ENV} is not set: cannot skip the PostgreSQL run"
            );
            eprintln!("\n*** SKIPPING the PostgreSQL run of this test: set {POSTGRES_URL_ENV} to include it ***\n");
            return None;
        };
        let name = format!("wg_test_{:016x}", rand::rng().random::<u64>());
        let admin = Database::connect(admin_url.as_str())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {POSTGRES_URL_ENV}: {e}"));
        admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("cannot create test database {name}: {e}"));
        admin.close().await.ok();
        let url = replace_database(&admin_url, &name);
        let db = Db::connect_and_migrate(&url, clock)
            .await
            .unwrap_or_else(|e| panic!("cannot open test PostgreSQL database: {e:?}"));
        Some(TestDb {
            db,
            url,
            _dir: None,
            postgres_drop: Some((admin_url, name)),
        })
    }

    /// SQLite, then PostgreSQL when configured: run a test body on each.
    pub async fn all_backends() -> Vec<TestDb> {
        Self::all_backends_with_clock(Arc::new(SystemClock)).await
    }

    /// [`TestDb::all_backends`] with a given clock.
    pub async fn all_backends_with_clock(clock: Arc<dyn Clock>) -> Vec<TestDb> {
        let mut dbs = vec![Self::sqlite(clock.clone()).await];
        dbs.extend(Self::postgres(clock).await);
        dbs
    }

    /// Which backend this is, for assertion messages.
    pub fn backend(&self) -> Backend {
        self.db.backend()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some((admin_url, name)) = self.postgres_drop.take() else {
            return;
        };
        // Drop runs inside the test's runtime, which cannot be blocked on;
        // a short-lived thread with its own runtime removes the database.
        let dropper = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            runtime.block_on(async {
                if let Ok(admin) = Database::connect(admin_url.as_str()).await {
                    let _ = admin
                        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                    let _ = admin.close().await;
                }
            });
        });
        let _ = dropper.join();
    }
}

/// Swaps the database name (the last path segment) of a PostgreSQL URL.
fn replace_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{database}?{query}"),
        None => format!("{base}/{database}"),
    }
}

impl TestDb {
    /// Runs raw SQL, to prove what the schema itself refuses.
    pub async fn execute_raw(&self, sql: &str) -> Result<(), sea_orm::DbErr> {
        self.db.writer.execute_unprepared(sql).await.map(|_| ())
    }
}

/// A transaction that took the lease row's lock, as a fenced write does,
/// and then stalls: what a controller frozen mid-write leaves behind.
/// Rolled back when dropped (or when the server ends it).
#[derive(Debug)]
pub struct StalledWrite {
    _txn: sea_orm::DatabaseTransaction,
}

impl Db {
    /// Locks lease `lease`'s row in a transaction that is then left idle.
    pub async fn stall_in_fenced_write(&self, lease: &str) -> Result<StalledWrite, crate::DbError> {
        use sea_orm::TransactionTrait as _;
        let txn = self.writer.begin().await?;
        let lock = match self.backend() {
            Backend::Postgres => "SELECT token FROM engine_leases WHERE name = $1 FOR UPDATE",
            Backend::Sqlite => "UPDATE engine_leases SET token = token WHERE name = $1",
        };
        txn.execute_raw(sea_orm::Statement::from_sql_and_values(
            txn.get_database_backend(),
            lock,
            [lease.into()],
        ))
        .await?;
        Ok(StalledWrite { _txn: txn })
    }
}

/// Moves `wave` to awaiting approval with `verdict`, as the engine does at
/// the end of a bake, for tests of approvals without an engine. Takes (and
/// releases) a lease of its own, so it never fences out a running engine
/// under test; refuses when another test holds it.
pub async fn await_approval(
    db: &Db,
    wave: orchestrator_types::WaveId,
    verdict: orchestrator_types::WaveVerdict,
) -> Result<crate::execution::ExecWave, crate::DbError> {
    use crate::execution::{WaveChange, WaveState};
    let from = db.wave(wave).await?.state;
    let fence = db
        .acquire_lease("test-await-approval", "test", chrono::Duration::minutes(1))
        .await?
        .ok_or(crate::DbError::Stale {
            what: "lease",
            key: "test-await-approval".into(),
            expected: "free".into(),
        })?;
    let moved = db
        .transition_wave(
            &fence,
            wave,
            from,
            &WaveChange {
                state: Some(WaveState::AwaitingApproval),
                verdict: Some(verdict),
                ..Default::default()
            },
            serde_json::json!({ "test": true }),
        )
        .await;
    db.release_lease(&fence).await?;
    moved
}

#[cfg(test)]
mod tests {
    use super::replace_database;

    #[test]
    fn database_name_is_replaced() {
        assert_eq!(
            replace_database("postgres://u@h:5432/test", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(replace_database("postgres://u@h:5432", "x"), "postgres://u@h:5432/x");
        assert_eq!(
            replace_database("postgres://u@h/test?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }
}
