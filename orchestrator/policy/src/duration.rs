//! Human durations as written in policies: `90s`, `30m`, `2h`, `1d`, `1w`,
//! and compounds such as `1h30m`.

use chrono::TimeDelta;

/// Longest duration a policy may state. Bake times and windows are hours to
/// days; a bound keeps arithmetic on them far from overflow.
pub const MAX_DURATION_DAYS: i64 = 366;

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing to parse.
    #[error("duration is empty; write e.g. `30m`, `2h`, `1d`")]
    Empty,
    /// Not of the form `<number><unit>...`.
    #[error("invalid duration {raw:?}; write a number followed by a unit s, m, h, d or w, e.g. `30m`, `1h30m`")]
    Syntax {
        /// The text as written.
        raw: String,
    },
    /// Zero length; every duration in a policy must be positive.
    #[error("duration {raw:?} must be positive")]
    NotPositive {
        /// The text as written.
        raw: String,
    },
    /// Longer than [`MAX_DURATION_DAYS`].
    #[error("duration {raw:?} is longer than {MAX_DURATION_DAYS} days")]
    TooLong {
        /// The text as written.
        raw: String,
    },
}

/// Parses a policy duration. Units: `s`, `m` (minutes), `h`, `d`, `w`;
/// several `<number><unit>` groups add up (`1h30m`).
pub fn parse_duration(raw: &str) -> Result<TimeDelta, DurationError> {
    let text = raw.trim();
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    let syntax = || DurationError::Syntax { raw: raw.to_owned() };
    let too_long = || DurationError::TooLong { raw: raw.to_owned() };
    let max_seconds = MAX_DURATION_DAYS * 86_400;
    let mut total: i64 = 0;
    let mut digits = String::new();
    for ch in text.chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
            continue;
        }
        let unit_seconds: i64 = match ch {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return Err(syntax()),
        };
        if digits.is_empty() {
            return Err(syntax());
        }
        // More than 12 digits is over the bound whatever the unit.
        let amount: i64 = if digits.len() > 12 {
            return Err(too_long());
        } else {
            digits.parse().map_err(|_| syntax())?
        };
        digits.clear();
        total = amount
            .checked_mul(unit_seconds)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(too_long)?;
        if total > max_seconds {
            return Err(too_long());
        }
    }
    if !digits.is_empty() {
        // A bare number: the unit is ambiguous (seconds? minutes?), so refuse.
        return Err(syntax());
    }
    if total == 0 {
        return Err(DurationError::NotPositive { raw: raw.to_owned() });
    }
    Ok(TimeDelta::seconds(total))
}

/// Formats a duration back in the policy notation (`1h30m`), for messages.
pub fn format_duration(d: TimeDelta) -> String {
    let mut secs = d.num_seconds();
    if secs <= 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if secs >= size {
            out.push_str(&format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_units_and_compounds() {
        let cases = [
            ("90s", 90),
            ("30m", 1_800),
            ("2h", 7_200),
            ("1d", 86_400),
            ("1w", 604_800),
            ("1h30m", 5_400),
            (" 15m ", 900),
        ];
        for (text, secs) in cases {
            assert_eq!(parse_duration(text), Ok(TimeDelta::seconds(secs)), "{text}");
        }
    }

    #[test]
    fn refuses_bad_forms() {
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        for bad in ["30", "m", "1x", "-5m", "1.5h", "h1", "1 h"] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Syntax { .. })),
                "{bad}: {:?}",
                parse_duration(bad)
            );
        }
        assert!(matches!(parse_duration("0m"), Err(DurationError::NotPositive { .. })));
        assert!(matches!(parse_duration("367d"), Err(DurationError::TooLong { .. })));
        assert!(matches!(
            parse_duration("99999999999999999999s"),
            Err(DurationError::TooLong { .. })
        ));
    }

    #[test]
    fn formats_round_trip() {
        for text in ["90s", "30m", "2h", "1d", "1h30m", "1d2h3m4s"] {
            let d = parse_duration(text).unwrap();
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        assert_eq!(format_duration(TimeDelta::seconds(5_400)), "1h30m");
    }
}
