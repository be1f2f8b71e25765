use orchestrator_types::TransitionError;

/// What a datastore call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("could not connect to the database at {url}")]
    Connect {
        /// The URL with any password removed.
        url: String,
        #[source]
        source: sea_orm::DbErr,
    },
    #[error("database migration failed")]
    Migrate(#[source] sea_orm::DbErr),
    #[error("unsupported database URL {url:?}: use sqlite://PATH or postgres://...")]
    UnsupportedUrl { url: String },
    #[error("{what} {key} not found")]
    NotFound { what: &'static str, key: String },
    #[error("{what} {key} already exists")]
    AlreadyExists { what: &'static str, key: String },
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// The caller's role does not allow this change (decided here because
    /// only the datastore sees that a write changes a guarded field).
    #[error("{action} is an admin action: {reason}")]
    NotPermitted { action: &'static str, reason: String },
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("stored {what} is corrupt: {reason}")]
    Corrupt { what: &'static str, reason: String },
    #[error("database query failed")]
    Query(#[from] sea_orm::DbErr),
    /// An execution write carried a fencing token that is no longer the
    /// lease's: another controller has taken over, so this one must stop.
    #[error("lease {lease} is no longer held with token {token}")]
    Fenced { lease: String, token: i64 },
    /// The request does not fit the record's current state (an approval
    /// before the wave awaits one); `reason` says what would.
    #[error("{what} {key}: {reason}")]
    Conflict {
        what: &'static str,
        key: String,
        reason: String,
    },
    /// A conditional write found the row no longer in the state it expected
    /// (someone else moved it first).
    #[error("{what} {key} is no longer {expected}")]
    Stale {
        what: &'static str,
        key: String,
        expected: String,
    },
}

impl DbError {
    pub(crate) fn corrupt(what: &'static str, reason: impl std::fmt::Display) -> Self {
        DbError::Corrupt {
            what,
            reason: reason.to_string(),
        }
    }

    /// True when the controller's own side failed (its pool timed out or
    /// was closed, it could not connect to its database) rather than any
    /// row, node or caller: the engine reports itself degraded and charges
    /// no node for it.
    pub fn is_controller_fault(&self) -> bool {
        matches!(
            self,
            DbError::Connect { .. } | DbError::Query(sea_orm::DbErr::ConnectionAcquire(_) | sea_orm::DbErr::Conn(_))
        )
    }

    /// True when the caller's input was at fault (not found, duplicate,
    /// invalid, illegal transition) rather than the database.
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            DbError::NotFound { .. }
                | DbError::AlreadyExists { .. }
                | DbError::Invalid { .. }
                | DbError::NotPermitted { .. }
                | DbError::Transition(_)
                | DbError::Stale { .. }
                | DbError::Conflict { .. }
        )
    }
}

/// True when the error is a unique-constraint violation.
pub(crate) fn is_unique_violation(err: &sea_orm::DbErr) -> bool {
    matches!(err.sql_err(), Some(sea_orm::SqlErr::UniqueConstraintViolation(_)))
}

#[cfg(test)]
mod controller_fault_tests {
    use super::*;

    #[test]
    fn pool_exhaustion_is_the_controllers_and_row_errors_are_not() {
        let timeout = DbError::Query(sea_orm::DbErr::ConnectionAcquire(
            sea_orm::error::ConnAcquireErr::Timeout,
        ));
        assert!(timeout.is_controller_fault());
        let closed = DbError::Query(sea_orm::DbErr::ConnectionAcquire(
            sea_orm::error::ConnAcquireErr::ConnectionClosed,
        ));
        assert!(closed.is_controller_fault());
        assert!(!DbError::Query(sea_orm::DbErr::RecordNotFound("x".into())).is_controller_fault());
        assert!(
            !DbError::NotFound {
                what: "node",
                key: "n1".into()
            }
            .is_controller_fault()
        );
    }
}
