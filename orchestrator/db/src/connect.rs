use std::sync::Arc;
use std::time::Duration;

use migrations::{Migrator, MigratorTrait};
use orchestrator_types::{Clock, RolloutClock, WallClock};
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::DbError;

/// Which database engine is behind a [`Db`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// An embedded SQLite file: the default, for one controller.
    Sqlite,
    /// PostgreSQL: for several controllers sharing one database.
    Postgres,
}

/// How long a SQLite writer waits for another before giving up. Long enough
/// to ride out a WAL checkpoint, short enough that a stuck writer surfaces.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Default for [`ConnectTuning::pg_idle_in_transaction`].
pub const DEFAULT_PG_IDLE_IN_TRANSACTION: Duration = Duration::from_secs(10);

/// Connection settings beyond the URL.
#[derive(Debug, Clone, Copy)]
pub struct ConnectTuning {
    /// How long a PostgreSQL session of ours may sit idle inside a
    /// transaction before the server ends it (rolling the transaction
    /// back). A fenced write locks the lease row until it commits; a
    /// controller frozen mid-write (SIGSTOP, a paused VM, a stalled host)
    /// would otherwise keep that lock, and so block every standby's
    /// takeover, for as long as it stays frozen. Our transactions never
    /// wait on anything but the database between statements, so a short
    /// limit only ends stalled ones.
    pub pg_idle_in_transaction: Duration,
}

impl Default for ConnectTuning {
    fn default() -> Self {
        Self {
            pg_idle_in_transaction: DEFAULT_PG_IDLE_IN_TRANSACTION,
        }
    }
}

/// How many read-only SQLite connections serve reads beside the one
/// writer. WAL lets each read a committed snapshot while the writer writes,
/// so a page or a status read never queues behind an engine transaction;
/// more than a few only queue on the machine's cores instead.
const SQLITE_READERS: u32 = 4;

/// A handle on the datastore; cheap to clone.
///
/// Invariant: every statement outside a transaction that only reads goes
/// to `reader`, every write and every transaction to `writer`. A read sees
/// every write committed before it started (WAL snapshots on SQLite, read
/// committed on PostgreSQL), so a request that writes and then reads sees
/// its own write; what a read never sees is a transaction still open, and
/// no code reads through `reader` inside one of its own transactions.
#[derive(Debug, Clone)]
pub struct Db {
    /// Writes and transactions. SQLite: one connection, the one writer.
    pub(crate) writer: DatabaseConnection,
    /// Plain reads. SQLite (file): a pool of `query_only` connections to
    /// the same file; SQLite in memory and PostgreSQL: the writer's pool
    /// (an in-memory database is private to its connection, and a
    /// PostgreSQL pool already reads beside its writes).
    pub(crate) reader: DatabaseConnection,
    pub(crate) clock: RolloutClock,
    /// What browser sessions and login throttles run on. The same clock as
    /// `clock` unless set apart: a demo on an accelerated rollout clock
    /// keeps sessions on real time, or a 12-hour session would end within a
    /// minute.
    pub(crate) session_clock: WallClock,
    backend: Backend,
    /// Aggregates kept between requests (`cache`).
    pub(crate) caches: Arc<crate::cache::Caches>,
    /// Step transitions waiting to be committed together (`execution::step_batch`).
    pub(crate) step_writes: Arc<crate::group_commit::GroupCommit>,
}

impl Db {
    /// Connects without migrating. `sqlite://PATH` (created if missing) or
    /// `postgres://...`.
    pub async fn connect(url: &str, clock: Arc<dyn Clock>) -> Result<Db, DbError> {
        Self::connect_tuned(url, clock, ConnectTuning::default()).await
    }

    /// [`Db::connect`] with explicit tuning.
    pub async fn connect_tuned(url: &str, clock: Arc<dyn Clock>, tuning: ConnectTuning) -> Result<Db, DbError> {
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            return Err(DbError::UnsupportedUrl { url: redact_url(url) });
        };
        let mut options = ConnectOptions::new(url.to_owned());
        options.sqlx_logging(false).connect_timeout(Duration::from_secs(10));
        if backend == Backend::Sqlite {
            // SQLite has one writer. A single pooled connection means a write
            // transaction can never deadlock upgrading from a read lock
            // against another connection of ours (SQLITE_BUSY without
            // waiting); WAL still lets other processes read meanwhile.
            options
                .max_connections(1)
                .min_connections(1)
                .acquire_timeout(Duration::from_secs(30))
                .map_sqlx_sqlite_opts(|opts| {
                    opts.create_if_missing(true)
                        .foreign_keys(true)
                        .journal_mode(SqliteJournalMode::Wal)
                        .synchronous(SqliteSynchronous::Normal)
                        .busy_timeout(SQLITE_BUSY_TIMEOUT)
                });
        } else {
            let idle_ms = tuning.pg_idle_in_transaction.as_millis().max(1).to_string();
            options
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(30))
                .map_sqlx_postgres_opts(move |opts| {
                    opts.options([("idle_in_transaction_session_timeout", idle_ms.as_str())])
                });
        }
        let writer = Database::connect(options).await.map_err(|source| DbError::Connect {
            url: redact_url(url),
            source,
        })?;
        // The readers open the file the writer created and switched to WAL.
        let reader = if backend == Backend::Sqlite && !is_sqlite_memory(url) {
            let mut options = ConnectOptions::new(url.to_owned());
            options
                .sqlx_logging(false)
                .connect_timeout(Duration::from_secs(10))
                .max_connections(SQLITE_READERS)
                .min_connections(1)
                .acquire_timeout(Duration::from_secs(30))
                .map_sqlx_sqlite_opts(|opts| {
                    // `query_only` makes a write sent here by mistake fail
                    // at once instead of becoming a second writer that
                    // could meet the first with SQLITE_BUSY.
                    opts.foreign_keys(true)
                        .busy_timeout(SQLITE_BUSY_TIMEOUT)
                        .pragma("query_only", "ON")
                });
            Database::connect(options).await.map_err(|source| DbError::Connect {
                url: redact_url(url),
                source,
            })?
        } else {
            writer.clone()
        };
        tracing::debug!(url = %redact_url(url), ?backend, "connected to database");
        Ok(Db {
            writer,
            reader,
            session_clock: WallClock::new(clock.clone()),
            clock: RolloutClock::new(clock),
            backend,
            caches: Arc::default(),
            step_writes: Arc::default(),
        })
    }

    /// Connects and applies every pending migration.
    pub async fn connect_and_migrate(url: &str, clock: Arc<dyn Clock>) -> Result<Db, DbError> {
        Self::connect_and_migrate_tuned(url, clock, ConnectTuning::default()).await
    }

    /// [`Db::connect_and_migrate`] with explicit tuning.
    pub async fn connect_and_migrate_tuned(
        url: &str,
        clock: Arc<dyn Clock>,
        tuning: ConnectTuning,
    ) -> Result<Db, DbError> {
        let db = Self::connect_tuned(url, clock, tuning).await?;
        db.migrate().await?;
        Ok(db)
    }

    /// Applies every pending migration; a no-op when the schema is current.
    pub async fn migrate(&self) -> Result<(), DbError> {
        Migrator::up(&self.writer, None).await.map_err(DbError::Migrate)
    }

    /// Names of the migrations already applied, oldest first.
    pub async fn applied_migrations(&self) -> Result<Vec<String>, DbError> {
        let applied = Migrator::get_applied_migrations(&self.writer)
            .await
            .map_err(DbError::Migrate)?;
        Ok(applied.iter().map(|m| m.name().to_owned()).collect())
    }

    /// Which engine this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The clock every timestamp written by this handle comes from.
    pub fn clock(&self) -> &RolloutClock {
        &self.clock
    }

    /// The clock browser sessions (and anything about logging in) run on.
    pub fn session_clock(&self) -> &WallClock {
        &self.session_clock
    }

    /// The same handle with browser sessions created and expired by
    /// `clock` (e.g. the wall clock) while every other timestamp keeps this
    /// handle's clock, so the audit log still reads in one time.
    pub fn with_session_clock(mut self, clock: impl Into<WallClock>) -> Self {
        self.session_clock = clock.into();
        self
    }

    /// A cheap round trip on the writer, for health checks: the writer is
    /// what the controller cannot work without.
    pub async fn ping(&self) -> Result<(), DbError> {
        self.writer.ping().await.map_err(DbError::Query)
    }

    /// Closes the pools, waiting for connections to return.
    pub async fn close(self) -> Result<(), DbError> {
        // Where the reader is the writer's pool, closing it twice is harmless.
        self.reader.close_by_ref().await.map_err(DbError::Query)?;
        self.writer.close().await.map_err(DbError::Query)
    }
}

/// Whether a SQLite URL names an in-memory database, which exists only
/// inside the connection that opened it.
fn is_sqlite_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// The URL with its password replaced, safe for logs and error messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _password)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    /// A write sent to the reader pool by mistake fails at once rather
    /// than becoming a second SQLite writer.
    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn sqlite_readers_refuse_writes() {
        use sea_orm::ConnectionTrait as _;
        let t = crate::testing::TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
        let write = "UPDATE nodes SET state = state";
        let refused = t.db.reader.execute_unprepared(write).await;
        assert!(
            refused.as_ref().is_err_and(|e| e.to_string().contains("readonly")),
            "{refused:?}"
        );
        t.db.writer.execute_unprepared(write).await.unwrap();
    }

    #[test]
    fn passwords_never_leave_in_urls() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/wg"),
            "postgres://app:***@db:5432/wg"
        );
        assert_eq!(redact_url("postgres://app@db/wg"), "postgres://app@db/wg");
        assert_eq!(redact_url("sqlite://waveguard.db"), "sqlite://waveguard.db");
    }
}
