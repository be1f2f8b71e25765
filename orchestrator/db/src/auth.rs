//! Browser sessions and API tokens.
//!
//! Invariant: only hashes of session and API tokens are stored (the web
//! crate hashes them; this crate never sees a raw secret), so reading the
//! database does not let anyone act as a user. A session or token of a
//! disabled user authenticates nobody.

use chrono::{DateTime, Duration, Utc};
use orchestrator_types::{Role, UserId};
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set, TransactionTrait};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::audit;
use crate::entity::{api_tokens, sessions, users};
use crate::error::is_unique_violation;
use crate::model::User;
use crate::{Db, DbError};

/// How stale an API token's recorded last use may be: a use within this
/// of the recorded one is not written again.
pub const TOKEN_USE_PRECISION: Duration = Duration::minutes(1);

/// A live browser session.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub id: i64,
    pub user_id: UserId,
    /// The per-session CSRF token every state-changing form must echo.
    pub csrf_token: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

// The CSRF token is a secret of the session: keep it out of logs.
impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("user_id", &self.user_id)
            .field("csrf_token", &"<redacted>")
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// An API token's public facts (never the token or its hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiToken {
    pub id: i64,
    pub user_id: UserId,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked: bool,
}

fn to_user(row: users::Model) -> Result<User, DbError> {
    Ok(User {
        id: UserId(row.id),
        role: row.role.parse().map_err(|e| DbError::corrupt("user role", e))?,
        username: row.username,
        display_name: row.display_name,
        disabled: row.disabled,
        created_at: row.created_at,
    })
}

fn to_session(row: sessions::Model) -> Session {
    Session {
        id: row.id,
        user_id: UserId(row.user_id),
        csrf_token: row.csrf_token,
        created_at: row.created_at,
        expires_at: row.expires_at,
    }
}

fn to_token(row: api_tokens::Model) -> ApiToken {
    ApiToken {
        id: row.id,
        user_id: UserId(row.user_id),
        name: row.name,
        created_at: row.created_at,
        last_used_at: row.last_used_at,
        revoked: row.revoked,
    }
}

impl Db {
    async fn user_row(&self, username: &str) -> Result<users::Model, DbError> {
        users::Entity::find()
            .filter(users::Column::Username.eq(username))
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "user",
                key: username.to_owned(),
            })
    }

    /// One user by name.
    pub async fn user(&self, username: &str) -> Result<User, DbError> {
        to_user(self.user_row(username).await?)
    }

    /// Opens a session for a user who just proved their password; audited
    /// as a login.
    pub async fn create_session(
        &self,
        user: UserId,
        token_hash: &str,
        csrf_token: &str,
        ttl: Duration,
    ) -> Result<Session, DbError> {
        let now = self.clock.now();
        let session_now = self.session_clock.now();
        let txn = self.writer.begin().await?;
        let user_row = users::Entity::find_by_id(user.0)
            .one(&txn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "user",
                key: user.to_string(),
            })?;
        let row = sessions::ActiveModel {
            token_hash: Set(token_hash.to_owned()),
            user_id: Set(user.0),
            csrf_token: Set(csrf_token.to_owned()),
            created_at: Set(session_now),
            expires_at: Set(session_now + ttl),
            ..Default::default()
        }
        .insert(&txn)
        .await?;
        audit::append(
            &txn,
            now,
            &user_row.username,
            "user.login",
            "user",
            &user_row.username,
            json!({}),
        )
        .await?;
        txn.commit().await?;
        Ok(to_session(row))
    }

    /// The session and its user for a token hash, if the session is live
    /// and the user enabled.
    pub async fn session(&self, token_hash: &str) -> Result<Option<(Session, User)>, DbError> {
        let Some(row) = sessions::Entity::find()
            .filter(sessions::Column::TokenHash.eq(token_hash))
            .one(&self.reader)
            .await?
        else {
            return Ok(None);
        };
        if row.expires_at <= self.session_clock.now() {
            return Ok(None);
        }
        let Some(user) = users::Entity::find_by_id(row.user_id).one(&self.reader).await? else {
            return Ok(None);
        };
        if user.disabled {
            return Ok(None);
        }
        Ok(Some((to_session(row), to_user(user)?)))
    }

    /// Ends a session (logout); audited. Unknown sessions are ignored so
    /// that logging out twice is harmless.
    pub async fn delete_session(&self, token_hash: &str) -> Result<(), DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        if let Some(row) = sessions::Entity::find()
            .filter(sessions::Column::TokenHash.eq(token_hash))
            .one(&txn)
            .await?
        {
            let username = users::Entity::find_by_id(row.user_id)
                .one(&txn)
                .await?
                .map(|u| u.username)
                .unwrap_or_default();
            sessions::Entity::delete_by_id(row.id).exec(&txn).await?;
            audit::append(&txn, now, &username, "user.logout", "user", &username, json!({})).await?;
        }
        txn.commit().await?;
        Ok(())
    }

    /// Removes expired sessions; returns how many.
    pub async fn delete_expired_sessions(&self) -> Result<u64, DbError> {
        let result = sessions::Entity::delete_many()
            .filter(sessions::Column::ExpiresAt.lte(self.session_clock.now()))
            .exec(&self.writer)
            .await?;
        Ok(result.rows_affected)
    }

    /// Stores a new API token (its hash) for a user; audited without the token.
    pub async fn add_api_token(
        &self,
        username: &str,
        name: &str,
        token_hash: &str,
        actor: &str,
    ) -> Result<ApiToken, DbError> {
        let name = name.trim();
        if name.is_empty() || name.len() > 100 {
            return Err(DbError::Invalid {
                field: "name".into(),
                reason: "give the token a name of 1 to 100 characters".into(),
            });
        }
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let user = users::Entity::find()
            .filter(users::Column::Username.eq(username))
            .one(&txn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "user",
                key: username.to_owned(),
            })?;
        let inserted = api_tokens::ActiveModel {
            token_hash: Set(token_hash.to_owned()),
            user_id: Set(user.id),
            name: Set(name.to_owned()),
            created_at: Set(now),
            last_used_at: Set(None),
            revoked: Set(false),
            ..Default::default()
        }
        .insert(&txn)
        .await;
        let row = match inserted {
            Ok(row) => row,
            Err(err) if is_unique_violation(&err) => {
                return Err(DbError::AlreadyExists {
                    what: "api token",
                    key: name.to_owned(),
                });
            }
            Err(err) => return Err(err.into()),
        };
        audit::append(
            &txn,
            now,
            actor,
            "user.token.add",
            "user",
            username,
            json!({ "token_id": row.id, "name": name }),
        )
        .await?;
        txn.commit().await?;
        Ok(to_token(row))
    }

    /// The user an API token (by hash) acts as, if the token is live and
    /// the user enabled. Records when the token was last used, to within
    /// [`TOKEN_USE_PRECISION`].
    pub async fn user_by_api_token(&self, token_hash: &str) -> Result<Option<User>, DbError> {
        let Some(row) = api_tokens::Entity::find()
            .filter(api_tokens::Column::TokenHash.eq(token_hash))
            .one(&self.reader)
            .await?
        else {
            return Ok(None);
        };
        if row.revoked {
            return Ok(None);
        }
        let Some(user) = users::Entity::find_by_id(row.user_id).one(&self.reader).await? else {
            return Ok(None);
        };
        if user.disabled {
            return Ok(None);
        }
        // To the minute: writing on every request would put each API read
        // in the queue for the one SQLite writer, behind the engine.
        let now = self.clock.now();
        if row
            .last_used_at
            .is_none_or(|last| now - last >= TOKEN_USE_PRECISION || now < last)
        {
            api_tokens::Entity::update_many()
                .col_expr(api_tokens::Column::LastUsedAt, Expr::value(Some(now)))
                .filter(api_tokens::Column::Id.eq(row.id))
                .exec(&self.writer)
                .await?;
        }
        Ok(Some(to_user(user)?))
    }

    /// A user's API tokens, oldest first.
    pub async fn api_tokens(&self, username: &str) -> Result<Vec<ApiToken>, DbError> {
        let user = self.user_row(username).await?;
        Ok(api_tokens::Entity::find()
            .filter(api_tokens::Column::UserId.eq(user.id))
            .order_by_asc(api_tokens::Column::Id)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_token)
            .collect())
    }

    /// Revokes one token of a user; audited.
    pub async fn revoke_api_token(&self, username: &str, token_id: i64, actor: &str) -> Result<(), DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let user = users::Entity::find()
            .filter(users::Column::Username.eq(username))
            .one(&txn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "user",
                key: username.to_owned(),
            })?;
        let result = api_tokens::Entity::update_many()
            .col_expr(api_tokens::Column::Revoked, Expr::value(true))
            .filter(api_tokens::Column::Id.eq(token_id))
            .filter(api_tokens::Column::UserId.eq(user.id))
            .exec(&txn)
            .await?;
        if result.rows_affected != 1 {
            return Err(DbError::NotFound {
                what: "api token",
                key: token_id.to_string(),
            });
        }
        audit::append(
            &txn,
            now,
            actor,
            "user.token.revoke",
            "user",
            username,
            json!({ "token_id": token_id }),
        )
        .await?;
        txn.commit().await?;
        Ok(())
    }

    /// Changes a user's password hash, role or disabled flag (`None` leaves
    /// it). Disabling or re-roling ends the user's sessions, so a demotion
    /// takes effect at once. Audited without the hash.
    pub async fn update_user(
        &self,
        username: &str,
        password_hash: Option<&str>,
        role: Option<Role>,
        disabled: Option<bool>,
        actor: &str,
    ) -> Result<User, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let row = users::Entity::find()
            .filter(users::Column::Username.eq(username))
            .one(&txn)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "user",
                key: username.to_owned(),
            })?;
        let id = row.id;
        let mut active: users::ActiveModel = row.into();
        if let Some(hash) = password_hash {
            active.password_hash = Set(Some(hash.to_owned()));
        }
        if let Some(role) = role {
            active.role = Set(role.as_str().to_owned());
        }
        if let Some(disabled) = disabled {
            active.disabled = Set(disabled);
        }
        let row = active.update(&txn).await?;
        if role.is_some() || disabled == Some(true) || password_hash.is_some() {
            sessions::Entity::delete_many()
                .filter(sessions::Column::UserId.eq(id))
                .exec(&txn)
                .await?;
        }
        audit::append(
            &txn,
            now,
            actor,
            "user.update",
            "user",
            username,
            json!({ "password_changed": password_hash.is_some(), "role": role, "disabled": disabled }),
        )
        .await?;
        txn.commit().await?;
        to_user(row)
    }
}
