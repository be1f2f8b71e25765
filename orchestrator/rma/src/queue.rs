//! The vendor's submission quota: how many claims it takes per period, and the queue of cases
//! waiting for a slot, ordered by severity (highest first) and then age (oldest first).
//!
//! The period is a rolling window ending now: the vendor's limit is "so many per week", and a
//! rolling window never lets a burst at a calendar boundary double it.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::criteria::{Quota, Severity};

/// Proof that a case may be submitted now. Only [`request_submission`] makes one, so a case cannot
/// reach `Submitted` around the quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Admission {
    case_id: String,
    vendor: String,
    at: DateTime<Utc>,
}

impl Admission {
    /// The case it admits.
    pub fn case_id(&self) -> &str {
        &self.case_id
    }

    /// The vendor whose quota it counts against.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// When it was granted.
    pub fn at(&self) -> DateTime<Utc> {
        self.at
    }
}

/// A case waiting to be submitted (evidence collected, not yet sent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waiting {
    /// Case id.
    pub case_id: String,
    /// Its severity.
    pub severity: Severity,
    /// When its candidate was found.
    pub opened_at: DateTime<Utc>,
}

/// Quota use in the period ending now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QuotaStatus {
    /// Submissions allowed per period.
    pub limit: u64,
    /// Submissions in the period ending now.
    pub used: u64,
    /// Submissions still possible now.
    pub left: u64,
    /// When the next slot frees up, if none is free now.
    pub next_slot_at: Option<DateTime<Utc>>,
}

/// Quota use at `now`, given the times of past submissions to this vendor (any order).
pub fn quota_status(quota: &Quota, submissions: &[DateTime<Utc>], now: DateTime<Utc>) -> QuotaStatus {
    let start = now - quota.period;
    let mut in_window: Vec<DateTime<Utc>> = submissions
        .iter()
        .copied()
        .filter(|t| *t > start && *t <= now)
        .collect();
    in_window.sort();
    let used = in_window.len() as u64;
    let left = quota.limit_left(used);
    // The slot of the k-th oldest submission in the window frees one period after it.
    let next_slot_at = (left == 0)
        .then(|| {
            let k = usize::try_from(used - quota.submissions).unwrap_or(usize::MAX);
            in_window.get(k).map(|t| *t + quota.period)
        })
        .flatten();
    QuotaStatus {
        limit: quota.submissions,
        used,
        left,
        next_slot_at,
    }
}

impl Quota {
    fn limit_left(&self, used: u64) -> u64 {
        self.submissions.saturating_sub(used)
    }
}

/// The waiting cases in submission order: severity highest first, then oldest first, then by id
/// so that the order is total and the same on every replica.
pub fn queue_order(waiting: &[Waiting]) -> Vec<&Waiting> {
    let mut q: Vec<&Waiting> = waiting.iter().collect();
    q.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.opened_at.cmp(&b.opened_at))
            .then(a.case_id.cmp(&b.case_id))
    });
    q
}

/// Why a submission waits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// The quota is used up, or cases ahead in the queue take the free slots.
    #[error(
        "case {case_id} waits for {vendor}'s quota: position {position} of {queue_len} in the queue, {used} of {limit} used this period"
    )]
    Refused {
        /// Case id.
        case_id: String,
        /// Vendor.
        vendor: String,
        /// 1-based place in the queue.
        position: usize,
        /// Cases waiting.
        queue_len: usize,
        /// Submissions in the period.
        used: u64,
        /// Allowed per period.
        limit: u64,
        /// When the next slot frees up.
        next_slot_at: Option<DateTime<Utc>>,
    },
    /// The case is not among the waiting cases (no evidence collected, or already submitted).
    #[error("case {case_id} is not waiting for submission to {vendor}")]
    NotWaiting {
        /// Case id.
        case_id: String,
        /// Vendor.
        vendor: String,
    },
}

/// Asks to submit `case_id` now. Granted when the case's place in the queue is within the free
/// slots, so a newer or less severe case never takes the slot of one ahead of it.
pub fn request_submission(
    quota: &Quota,
    vendor: &str,
    submissions: &[DateTime<Utc>],
    waiting: &[Waiting],
    case_id: &str,
    now: DateTime<Utc>,
) -> Result<Admission, QuotaError> {
    let order = queue_order(waiting);
    let Some(index) = order.iter().position(|w| w.case_id == case_id) else {
        return Err(QuotaError::NotWaiting {
            case_id: case_id.to_owned(),
            vendor: vendor.to_owned(),
        });
    };
    let status = quota_status(quota, submissions, now);
    if (index as u64) < status.left {
        return Ok(Admission {
            case_id: case_id.to_owned(),
            vendor: vendor.to_owned(),
            at: now,
        });
    }
    Err(QuotaError::Refused {
        case_id: case_id.to_owned(),
        vendor: vendor.to_owned(),
        position: index + 1,
        queue_len: order.len(),
        used: status.used,
        limit: status.limit,
        next_slot_at: status.next_slot_at,
    })
}
