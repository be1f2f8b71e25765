use orchestrator_types::{Role, UserId};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, Set, TransactionTrait};
use serde_json::json;

use crate::audit;
use crate::entity::users;
use crate::error::is_unique_violation;
use crate::model::User;
use crate::{Db, DbError};

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

impl Db {
    /// Creates a local user. `password_hash` is a PHC string made by the
    /// caller (the web crate owns hashing); it is stored, never returned.
    pub async fn add_user(
        &self,
        username: &str,
        display_name: &str,
        role: Role,
        password_hash: Option<&str>,
        actor: &str,
    ) -> Result<User, DbError> {
        let username = username.trim();
        if username.is_empty()
            || username.len() > 64
            || !username.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(DbError::Invalid {
                field: "username".into(),
                reason: "use 1 to 64 letters, digits, '.', '_' or '-'".into(),
            });
        }
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let inserted = users::ActiveModel {
            username: Set(username.to_owned()),
            display_name: Set(display_name.to_owned()),
            role: Set(role.as_str().to_owned()),
            password_hash: Set(password_hash.map(str::to_owned)),
            disabled: Set(false),
            created_at: Set(now),
            ..Default::default()
        }
        .insert(&txn)
        .await;
        let row = match inserted {
            Ok(row) => row,
            Err(err) if is_unique_violation(&err) => {
                return Err(DbError::AlreadyExists {
                    what: "user",
                    key: username.to_owned(),
                });
            }
            Err(err) => return Err(err.into()),
        };
        audit::append(&txn, now, actor, "user.add", "user", username, json!({ "role": role })).await?;
        txn.commit().await?;
        to_user(row)
    }

    /// One user by name, with the stored password hash for verification.
    pub async fn user_with_password_hash(&self, username: &str) -> Result<(User, Option<String>), DbError> {
        let row = users::Entity::find()
            .filter(users::Column::Username.eq(username))
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "user",
                key: username.to_owned(),
            })?;
        let hash = row.password_hash.clone();
        Ok((to_user(row)?, hash))
    }

    /// Every user, by name.
    pub async fn list_users(&self) -> Result<Vec<User>, DbError> {
        let rows = users::Entity::find()
            .order_by_asc(users::Column::Username)
            .all(&self.reader)
            .await?;
        rows.into_iter().map(to_user).collect()
    }
}
