//! Property: however requests arrive, the quota never admits more than its limit in any window of
//! its period, and a refused request always names a position within the queue.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use orchestrator_rma::{Quota, QuotaError, Severity, Waiting, request_submission};
use proptest::prelude::*;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().expect("valid")
}

proptest! {
    #[test]
    fn never_more_than_the_limit_per_period(
        limit in 1u64..8,
        period_hours in 1i64..200,
        gaps in proptest::collection::vec(0i64..50, 1..120),
        severities in proptest::collection::vec(0u8..4, 1..120),
    ) {
        let quota = Quota { submissions: limit, period: TimeDelta::hours(period_hours) };
        let mut now = t0();
        let mut admitted: Vec<DateTime<Utc>> = Vec::new();
        let mut waiting: Vec<Waiting> = Vec::new();
        for (i, gap) in gaps.iter().enumerate() {
            now += TimeDelta::hours(*gap);
            let severity = match severities[i % severities.len()] {
                0 => Severity::Low,
                1 => Severity::Medium,
                2 => Severity::High,
                _ => Severity::Critical,
            };
            waiting.push(Waiting { case_id: format!("c{i}"), severity, opened_at: now });
            // Every waiting case asks; the queue decides who goes.
            for id in waiting.iter().map(|w| w.case_id.clone()).collect::<Vec<_>>() {
                match request_submission(&quota, "v", &admitted, &waiting, &id, now) {
                    Ok(a) => {
                        admitted.push(a.at());
                        waiting.retain(|w| w.case_id != id);
                    }
                    Err(QuotaError::Refused { position, queue_len, .. }) => {
                        prop_assert!(position >= 1 && position <= queue_len);
                    }
                    Err(other) => prop_assert!(false, "unexpected {other}"),
                }
            }
            for (k, t) in admitted.iter().enumerate() {
                let in_window = admitted[..=k].iter().filter(|s| **s > *t - quota.period).count() as u64;
                prop_assert!(in_window <= limit, "{in_window} admissions in a window of {period_hours} h");
            }
        }
    }
}
