//! Login throttling kept in the database, so every replica enforces the
//! same counts and a restart forgets nothing. Three counters, each with its
//! own effect, chosen so that guessing stops without handing anyone a
//! denial of service:
//!
//! - per (account, address) pair: the guesser is locked out of that account
//!   after `pair_max_failures` within the window; no one else is;
//! - per account: exponential backoff from any address, capped at
//!   `account_max_delay`, never a hard lock, so anyone can slow an account
//!   down but no one can lock its owner out;
//! - per address: a growing slowdown (the caller waits before the password
//!   is checked), capped, that never refuses, so one noisy proxy cannot lock
//!   out the other users behind it.

use chrono::{DateTime, Duration, Utc};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, EntityTrait, IntoActiveModel, QueryFilter, QueryOrder, QuerySelect, Set,
    TransactionTrait,
};
use serde::Serialize;

use crate::entity::login_throttles;
use crate::{Db, DbError};

/// The numbers of the three throttles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottlePolicy {
    /// Failures are counted within this window from the first one.
    pub window: Duration,
    /// Failures of one account from one address before that pair is locked
    /// for the rest of the window.
    pub pair_max_failures: u32,
    /// Failures of an account (any address) before backoff starts.
    pub account_free_failures: u32,
    /// The first backoff; it doubles with each further failure.
    pub account_base_delay: Duration,
    /// The longest backoff: an attacker can slow an account by this much
    /// per attempt, never more.
    pub account_max_delay: Duration,
    /// Failures from an address (any account) before it is slowed.
    pub address_free_failures: u32,
    /// The first slowdown; it doubles with each further failure.
    pub address_base_delay: Duration,
    /// The longest slowdown of one attempt from an address.
    pub address_max_delay: Duration,
}

impl Default for ThrottlePolicy {
    fn default() -> Self {
        Self {
            window: Duration::minutes(15),
            // Enough for typos, far too few for guessing.
            pair_max_failures: 5,
            account_free_failures: 3,
            account_base_delay: Duration::seconds(1),
            account_max_delay: Duration::seconds(30),
            // A shared proxy sees many users' typos before it is slowed.
            address_free_failures: 20,
            address_base_delay: Duration::milliseconds(250),
            address_max_delay: Duration::seconds(4),
        }
    }
}

/// What a login attempt may do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginGate {
    /// Check the password, after waiting `slow_down` (zero when the address
    /// is not throttled).
    Allowed { slow_down: Duration },
    /// Refuse without checking the password.
    Refused { retry_after: Duration, reason: Refusal },
}

/// Why an attempt was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// Too many failures for this account from this address.
    PairLocked,
    /// The account is backing off after recent failures.
    AccountBackoff,
}

/// One throttle row, as an admin sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LoginThrottle {
    /// `account`, `pair` or `address`.
    pub scope: String,
    pub username: String,
    pub address: String,
    pub failures: u32,
    pub window_started_at: DateTime<Utc>,
    pub last_failure_at: DateTime<Utc>,
    /// Attempts in this scope are refused (pair) or delayed (account) until then.
    pub blocked_until: Option<DateTime<Utc>>,
}

const ACCOUNT: &str = "account";
const PAIR: &str = "pair";
const ADDRESS: &str = "address";

/// Most rows an admin listing returns.
const MAX_LISTED: u64 = 1000;

/// `base * 2^(failures - free - 1)` past the free failures, capped at `max`.
pub fn backoff(failures: u32, free: u32, base: Duration, max: Duration) -> Duration {
    if failures <= free {
        return Duration::zero();
    }
    let doublings = (failures - free - 1).min(30);
    let delay = base.checked_mul(1 << doublings).unwrap_or(max);
    delay.min(max)
}

fn key(scope: &str, username: &str, address: &str) -> (String, String, String) {
    (scope.to_owned(), username.to_owned(), address.to_owned())
}

impl Db {
    async fn throttle_row(
        &self,
        scope: &str,
        username: &str,
        address: &str,
    ) -> Result<Option<login_throttles::Model>, DbError> {
        Ok(login_throttles::Entity::find_by_id(key(scope, username, address))
            .one(&self.reader)
            .await?)
    }

    /// Whether a login for `username` from `address` may be tried now.
    /// `username` is compared lower-cased, as the login form does.
    pub async fn login_gate(
        &self,
        username: &str,
        address: &str,
        policy: &ThrottlePolicy,
    ) -> Result<LoginGate, DbError> {
        let now = self.session_clock.now();
        let username = username.trim().to_lowercase();
        let live = |row: &login_throttles::Model| row.window_started_at + policy.window > now;
        if let Some(pair) = self.throttle_row(PAIR, &username, address).await?
            && let Some(until) = pair.blocked_until
            && until > now
        {
            return Ok(LoginGate::Refused {
                retry_after: until - now,
                reason: Refusal::PairLocked,
            });
        }
        if let Some(account) = self.throttle_row(ACCOUNT, &username, "").await?
            && live(&account)
            && let Some(until) = account.blocked_until
            && until > now
        {
            return Ok(LoginGate::Refused {
                retry_after: until - now,
                reason: Refusal::AccountBackoff,
            });
        }
        let slow_down = match self.throttle_row(ADDRESS, "", address).await? {
            Some(row) if live(&row) => backoff(
                u32::try_from(row.failures).unwrap_or(0),
                policy.address_free_failures,
                policy.address_base_delay,
                policy.address_max_delay,
            ),
            _ => Duration::zero(),
        };
        Ok(LoginGate::Allowed { slow_down })
    }

    /// Counts a failed login in all three scopes, in one transaction.
    pub async fn record_login_failure(
        &self,
        username: &str,
        address: &str,
        policy: &ThrottlePolicy,
    ) -> Result<(), DbError> {
        let now = self.session_clock.now();
        let username = username.trim().to_lowercase();
        let txn = self.writer.begin().await?;
        for (scope, user, addr) in [
            (ACCOUNT, username.as_str(), ""),
            (PAIR, username.as_str(), address),
            (ADDRESS, "", address),
        ] {
            let existing = login_throttles::Entity::find_by_id(key(scope, user, addr))
                .one(&txn)
                .await?;
            let (failures, window_started_at) = match &existing {
                Some(row) if row.window_started_at + policy.window > now => (
                    u32::try_from(row.failures).unwrap_or(0).saturating_add(1),
                    row.window_started_at,
                ),
                _ => (1, now),
            };
            let blocked_until = match scope {
                PAIR if failures >= policy.pair_max_failures => Some(now + policy.window),
                ACCOUNT => Some(
                    now + backoff(
                        failures,
                        policy.account_free_failures,
                        policy.account_base_delay,
                        policy.account_max_delay,
                    ),
                )
                .filter(|until| *until > now),
                _ => None,
            };
            let failures = i32::try_from(failures).unwrap_or(i32::MAX);
            match existing {
                Some(row) => {
                    let mut active = row.into_active_model();
                    active.failures = Set(failures);
                    active.window_started_at = Set(window_started_at);
                    active.last_failure_at = Set(now);
                    active.blocked_until = Set(blocked_until);
                    active.update(&txn).await?;
                }
                None => {
                    login_throttles::ActiveModel {
                        scope: Set(scope.to_owned()),
                        username: Set(user.to_owned()),
                        address: Set(addr.to_owned()),
                        failures: Set(failures),
                        window_started_at: Set(window_started_at),
                        last_failure_at: Set(now),
                        blocked_until: Set(blocked_until),
                    }
                    .insert(&txn)
                    .await?;
                }
            }
        }
        txn.commit().await?;
        Ok(())
    }

    /// A successful login clears its account's backoff and its pair's
    /// count; the address's count stays (one success does not excuse a
    /// spray of guesses at other accounts).
    pub async fn record_login_success(&self, username: &str, address: &str) -> Result<(), DbError> {
        let username = username.trim().to_lowercase();
        login_throttles::Entity::delete_many()
            .filter(login_throttles::Column::Username.eq(username.as_str()))
            .filter(
                Condition::any().add(login_throttles::Column::Scope.eq(ACCOUNT)).add(
                    Condition::all()
                        .add(login_throttles::Column::Scope.eq(PAIR))
                        .add(login_throttles::Column::Address.eq(address)),
                ),
            )
            .exec(&self.writer)
            .await?;
        Ok(())
    }

    /// Throttles with a failure within `window`, most recent first: what an
    /// admin looks at when users say they are being refused.
    pub async fn login_throttles(&self, window: Duration) -> Result<Vec<LoginThrottle>, DbError> {
        let since = self.session_clock.now() - window;
        let rows = login_throttles::Entity::find()
            .filter(login_throttles::Column::LastFailureAt.gt(since))
            .order_by_desc(login_throttles::Column::LastFailureAt)
            .limit(MAX_LISTED)
            .all(&self.reader)
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| LoginThrottle {
                scope: row.scope,
                username: row.username,
                address: row.address,
                failures: u32::try_from(row.failures).unwrap_or(0),
                window_started_at: row.window_started_at,
                last_failure_at: row.last_failure_at,
                blocked_until: row.blocked_until,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_after_the_free_failures_and_is_capped() {
        let s = Duration::seconds;
        let check = |failures, expected| assert_eq!(backoff(failures, 3, s(1), s(30)), expected, "{failures}");
        check(0, s(0));
        check(3, s(0));
        check(4, s(1));
        check(5, s(2));
        check(7, s(8));
        check(9, s(30));
        check(u32::MAX, s(30));
    }
}
