//! Maintenance windows: a cron schedule of window starts, a duration and a
//! time zone. No new flash starts outside an open window; flashes already
//! running are allowed to finish.
//!
//! The schedule uses the `cron` crate's syntax, which has a seconds field:
//! `sec min hour day-of-month month day-of-week [year]`, e.g.
//! `0 0 2 * * Tue-Thu` is 02:00:00 Tuesday to Thursday.

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use cron::Schedule;

/// One recurring window.
#[derive(Debug, Clone)]
pub struct MaintenanceWindow {
    /// When windows open, in `timezone` local time.
    pub schedule: Schedule,
    /// How long each stays open.
    pub duration: TimeDelta,
    /// The zone the schedule is read in (so `02:00` follows daylight saving).
    pub timezone: Tz,
}

impl MaintenanceWindow {
    /// If a window is open at `at`, the instant it closes.
    ///
    /// The window that opened last before `at` is the only candidate worth
    /// checking when windows do not overlap themselves; to also handle a
    /// duration longer than the schedule's period, the earliest start in
    /// `(at - duration, at]` is used, whose window closes last.
    pub fn open_until(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let from = at.checked_sub_signed(self.duration)?.with_timezone(&self.timezone);
        // `after` is exclusive, so a window that started exactly `duration`
        // ago has just closed: windows are half-open `[start, start+duration)`.
        let start = self.schedule.after(&from).next()?.with_timezone(&Utc);
        (start <= at).then(|| start + self.duration)
    }

    /// The first window start strictly after `at`.
    pub fn next_start_after(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = at.with_timezone(&self.timezone);
        self.schedule.after(&local).next().map(|t| t.with_timezone(&Utc))
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn window(expr: &str, hours: i64, tz: &str) -> MaintenanceWindow {
        MaintenanceWindow {
            schedule: Schedule::from_str(expr).unwrap(),
            duration: TimeDelta::hours(hours),
            timezone: tz.parse().unwrap(),
        }
    }

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn half_open_window_in_utc() {
        // 02:00-06:00 UTC on Tuesdays; 2025-01-07 is a Tuesday.
        let w = window("0 0 2 * * Tue", 4, "UTC");
        assert_eq!(w.open_until(utc("2025-01-07T01:59:59Z")), None);
        assert_eq!(
            w.open_until(utc("2025-01-07T02:00:00Z")),
            Some(utc("2025-01-07T06:00:00Z"))
        );
        assert_eq!(
            w.open_until(utc("2025-01-07T05:59:59Z")),
            Some(utc("2025-01-07T06:00:00Z"))
        );
        assert_eq!(w.open_until(utc("2025-01-07T06:00:00Z")), None);
        assert_eq!(w.open_until(utc("2025-01-08T03:00:00Z")), None, "Wednesday");
        assert_eq!(
            w.next_start_after(utc("2025-01-07T03:00:00Z")),
            Some(utc("2025-01-14T02:00:00Z"))
        );
    }

    #[test]
    fn local_time_follows_daylight_saving() {
        // 02:00 in Los Angeles is 10:00 UTC in winter and 09:00 UTC in summer.
        let w = window("0 0 2 * * *", 2, "America/Los_Angeles");
        assert!(w.open_until(utc("2025-01-15T10:30:00Z")).is_some());
        assert!(w.open_until(utc("2025-01-15T09:30:00Z")).is_none());
        assert!(w.open_until(utc("2025-07-15T09:30:00Z")).is_some());
        assert!(w.open_until(utc("2025-07-15T11:30:00Z")).is_none());
    }

    #[test]
    fn window_longer_than_its_period_is_always_open() {
        let w = window("0 0 * * * *", 2, "UTC");
        assert!(w.open_until(utc("2025-01-07T02:30:00Z")).is_some());
    }
}
