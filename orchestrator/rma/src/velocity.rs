//! Velocity of the replacement pipeline: days spent in each state (p50/p90 of completed stays),
//! acceptance rate per vendor and failure mode, open cases per state, quota used and left.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::case::{Case, CaseState};
use crate::criteria::Criteria;
use crate::queue::{QuotaStatus, quota_status};

/// Time spent in one state over completed stays.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StateDays {
    /// The state.
    pub state: CaseState,
    /// Completed stays counted.
    pub stays: usize,
    /// Median days (None without stays).
    pub p50_days: Option<f64>,
    /// 90th percentile days.
    pub p90_days: Option<f64>,
}

/// Vendor answers for one vendor and failure mode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Acceptance {
    /// Vendor.
    pub vendor: String,
    /// Failure mode.
    pub failure_mode: String,
    /// Acceptances recorded.
    pub accepted: u64,
    /// Rejections recorded.
    pub rejected: u64,
    /// accepted / (accepted + rejected); None before the first answer.
    pub rate: Option<f64>,
}

/// The pipeline's figures at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Velocity {
    /// Days per state, in pipeline order (terminal states omitted: nothing leaves them).
    pub days_in_state: Vec<StateDays>,
    /// Acceptance per vendor and failure mode.
    pub acceptance: Vec<Acceptance>,
    /// Open cases per state.
    pub open_by_state: BTreeMap<CaseState, usize>,
    /// The oldest open case and when it was opened.
    pub oldest_open: Option<(String, DateTime<Utc>)>,
    /// Quota per vendor (for every vendor with criteria).
    pub quota: BTreeMap<String, QuotaStatus>,
}

/// Linear-interpolation percentile (the "type 7" of R and NumPy's default) of sorted values.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let h = (n - 1) as f64 * q;
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    Some(sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo]))
}

/// Times of submissions to `vendor` recorded in the cases' histories.
pub fn submissions_of(cases: &[Case], vendor: &str) -> Vec<DateTime<Utc>> {
    cases
        .iter()
        .filter(|c| c.vendor == vendor)
        .flat_map(|c| c.history.iter().filter(|t| t.to == CaseState::Submitted).map(|t| t.at))
        .collect()
}

/// Computes the figures from every case (open and closed) at `now`.
pub fn velocity(cases: &[Case], criteria: &[Criteria], now: DateTime<Utc>) -> Velocity {
    let mut stays: BTreeMap<CaseState, Vec<f64>> = BTreeMap::new();
    let mut answers: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    let mut open_by_state: BTreeMap<CaseState, usize> = BTreeMap::new();
    let mut oldest_open: Option<(String, DateTime<Utc>)> = None;
    for case in cases {
        let mut entered = case.opened_at;
        for t in &case.history {
            let days = (t.at - entered).num_seconds() as f64 / 86_400.0;
            stays.entry(t.from).or_default().push(days.max(0.0));
            entered = t.at;
            let entry = answers
                .entry((case.vendor.clone(), case.failure_mode.clone()))
                .or_default();
            match t.to {
                CaseState::Accepted => entry.0 += 1,
                CaseState::Rejected => entry.1 += 1,
                _ => {}
            }
        }
        if case.state.is_open() {
            *open_by_state.entry(case.state).or_default() += 1;
            if oldest_open.as_ref().is_none_or(|(_, at)| case.opened_at < *at) {
                oldest_open = Some((case.id.clone(), case.opened_at));
            }
        }
    }
    let days_in_state = CaseState::ALL
        .iter()
        .filter(|s| s.is_open())
        .map(|s| {
            let mut v = stays.remove(s).unwrap_or_default();
            v.sort_by(f64::total_cmp);
            StateDays {
                state: *s,
                stays: v.len(),
                p50_days: percentile(&v, 0.5),
                p90_days: percentile(&v, 0.9),
            }
        })
        .collect();
    let acceptance = answers
        .into_iter()
        .filter(|(_, (a, r))| a + r > 0)
        .map(|((vendor, failure_mode), (accepted, rejected))| Acceptance {
            vendor,
            failure_mode,
            accepted,
            rejected,
            rate: Some(accepted as f64 / (accepted + rejected) as f64),
        })
        .collect();
    let mut quota = BTreeMap::new();
    for c in criteria {
        // Several part kinds of one vendor share the vendor's quota; the first file's figure is used.
        quota
            .entry(c.vendor.clone())
            .or_insert_with(|| quota_status(&c.quota, &submissions_of(cases, &c.vendor), now));
    }
    Velocity {
        days_in_state,
        acceptance,
        open_by_state,
        oldest_open,
        quota,
    }
}
