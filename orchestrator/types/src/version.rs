//! Firmware versions and their ordering.
//!
//! Vendor firmware versions are not semver: `96.00.5E.00.01` (hex segments),
//! `24.04.1-rc2` (leading zeros, release candidates), `1.2.3.4`, `U59 v2.20`.
//! Ordering them wrongly downgrades a fleet, so this type is deliberately
//! strict: it parses every string into one comparable key with a single
//! algorithm (so the order is transitive across schemes), and it never calls
//! two different strings equal. A missing segment ranks below any present
//! one (`1.2` < `1.2.0`); strings that differ only in spelling (`01.2` and
//! `1.2`, or in build metadata) share precedence, are still ordered by their
//! text, and [`FirmwareVersion::is_equivalent`] says when that happened.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest version string accepted; real ones are under 40 characters and a
/// bound keeps hostile input (an API body, a Redfish response) cheap.
pub const MAX_VERSION_LEN: usize = 128;

/// A parsed firmware version with a total order.
#[derive(Clone)]
pub struct FirmwareVersion {
    raw: String,
    key: VersionKey,
}

/// Why a version string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("firmware version is empty")]
    Empty,
    #[error("firmware version is longer than {MAX_VERSION_LEN} characters")]
    TooLong,
    #[error("firmware version {raw:?} contains the character {ch:?}, which no vendor scheme uses")]
    BadCharacter { raw: String, ch: char },
    #[error("firmware version {raw:?} has no digits")]
    NoDigits { raw: String },
    #[error("firmware version {raw:?} has an empty segment")]
    EmptySegment { raw: String },
    #[error("firmware version {raw:?} has a number too large to compare")]
    NumberTooLarge { raw: String },
}

/// One comparable piece of a version.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Num(u128),
    Text(String),
}

impl Segment {
    /// Numbers rank above words at the same position (`1.0.1` > `1.0.beta`),
    /// the usual rule of RPM and Debian; words compare case-insensitively.
    fn cmp_release(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Segment::Num(a), Segment::Num(b)) => a.cmp(b),
            (Segment::Text(a), Segment::Text(b)) => a.cmp(b),
            (Segment::Num(_), Segment::Text(_)) => Ordering::Greater,
            (Segment::Text(_), Segment::Num(_)) => Ordering::Less,
        }
    }

    /// Semver precedence for pre-release identifiers: numbers rank *below*
    /// words (`1.0.0-1` < `1.0.0-alpha`).
    fn cmp_pre(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Segment::Num(_), Segment::Text(_)) => Ordering::Less,
            (Segment::Text(_), Segment::Num(_)) => Ordering::Greater,
            _ => self.cmp_release(other),
        }
    }
}

/// The comparable form of a version.
#[derive(Debug, Clone, PartialEq, Eq)]
struct VersionKey {
    release: Vec<Segment>,
    /// Pre-release identifiers (`rc2` in `24.04.1-rc2`); a version with any
    /// ranks below the same release without.
    pre: Vec<Vec<Segment>>,
    /// Build metadata after `+`; ignored by precedence, as in semver.
    has_build: bool,
}

impl VersionKey {
    fn cmp_precedence(&self, other: &Self) -> Ordering {
        let release = cmp_segments(&self.release, &other.release, Segment::cmp_release);
        if release != Ordering::Equal {
            return release;
        }
        match (self.pre.is_empty(), other.pre.is_empty()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => {
                for (a, b) in self.pre.iter().zip(&other.pre) {
                    let ord = cmp_segments(a, b, Segment::cmp_pre);
                    if ord != Ordering::Equal {
                        return ord;
                    }
                }
                self.pre.len().cmp(&other.pre.len())
            }
        }
    }
}

/// Segment-wise comparison; a missing trailing segment ranks below any
/// present one, so `1.2` < `1.2.0` < `1.2.1`.
fn cmp_segments(a: &[Segment], b: &[Segment], cmp: fn(&Segment, &Segment) -> Ordering) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let ord = cmp(x, y);
        if ord != Ordering::Equal {
            return ord;
        }
    }
    a.len().cmp(&b.len())
}

impl FirmwareVersion {
    /// Parses a vendor version string.
    pub fn parse(raw: &str) -> Result<Self, VersionError> {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Err(VersionError::Empty);
        }
        if trimmed.len() > MAX_VERSION_LEN {
            return Err(VersionError::TooLong);
        }
        if let Some(ch) = trimmed
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+' | ' ' | '~')))
        {
            return Err(VersionError::BadCharacter {
                raw: trimmed.to_owned(),
                ch,
            });
        }
        if !trimmed.chars().any(|c| c.is_ascii_digit()) {
            return Err(VersionError::NoDigits {
                raw: trimmed.to_owned(),
            });
        }
        let key = parse_key(trimmed)?;
        Ok(Self {
            raw: trimmed.to_owned(),
            key,
        })
    }

    /// The version exactly as the vendor wrote it (trimmed).
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// True when the two versions have the same precedence although their
    /// text differs (`1.2` vs `1.2.0`, or differing build metadata). Such
    /// pairs are still ordered by text; callers that must treat them as the
    /// same release (for example "already at target") ask this explicitly.
    pub fn is_equivalent(&self, other: &Self) -> bool {
        self.key.cmp_precedence(&other.key) == Ordering::Equal
    }

    /// True for a pre-release (`-rc2`, `-beta.1`).
    pub fn is_prerelease(&self) -> bool {
        !self.key.pre.is_empty()
    }

    /// True when build metadata (`+build.5`) is present.
    pub fn has_build_metadata(&self) -> bool {
        self.key.has_build
    }
}

/// Splits the string into release, pre-release and build parts, then each
/// part into segments.
fn parse_key(s: &str) -> Result<VersionKey, VersionError> {
    let bad_segment = || VersionError::EmptySegment { raw: s.to_owned() };
    let (main, build) = match s.split_once('+') {
        Some((main, build)) => (main, Some(build)),
        None => (s, None),
    };
    if build.is_some_and(|b| b.is_empty() || b.contains('+')) || main.is_empty() {
        return Err(bad_segment());
    }
    // A pre-release starts at the first `-` or `~` followed by a letter
    // (`-rc2`, `~beta`); a `-` followed by a digit is an ordinary separator
    // (`2023-10-01`, `1.0-1`).
    let bytes = main.as_bytes();
    let pre_start = (0..bytes.len()).find(|&i| {
        matches!(bytes[i], b'-' | b'~') && bytes.get(i + 1).is_some_and(|b| b.is_ascii_alphabetic()) && i > 0
    });
    let (release_text, pre_text) = match pre_start {
        Some(i) => (&main[..i], Some(&main[i + 1..])),
        None => (main, None),
    };
    if !release_text.chars().any(|c| c.is_ascii_digit()) {
        return Err(VersionError::NoDigits { raw: s.to_owned() });
    }
    let fields: Vec<&str> = release_text.split(['.', '-', '_', ' ', '~']).collect();
    if fields.iter().any(|f| f.is_empty()) {
        return Err(bad_segment());
    }
    let hex = is_hex_scheme(&fields);
    let mut release = Vec::new();
    for field in &fields {
        if hex {
            let value = u128::from_str_radix(field, 16).map_err(|_| bad_segment())?;
            release.push(Segment::Num(value));
        } else {
            split_natural(field, &mut release, s)?;
        }
    }
    let mut pre = Vec::new();
    if let Some(pre_text) = pre_text {
        for ident in pre_text.split(['.', '-', '_', '~']) {
            if ident.is_empty() {
                return Err(bad_segment());
            }
            let mut segs = Vec::new();
            split_natural(ident, &mut segs, s)?;
            pre.push(segs);
        }
    }
    // A planner holds one parsed version per component of the fleet (800,000 at 100,000 nodes):
    // the growth slack of a five-segment key is 96 of its 256 bytes.
    release.shrink_to_fit();
    Ok(VersionKey {
        release,
        pre,
        has_build: build.is_some(),
    })
}

/// NVIDIA-style VBIOS versions (`96.00.5E.00.01`) are four or more fields of
/// exactly two hex digits. Reading every such field as hex is safe for the
/// all-decimal ones too: for equal-width fields hex and decimal readings
/// order identically, and it keeps `96.00.61` above `96.00.5E`.
fn is_hex_scheme(fields: &[&str]) -> bool {
    fields.len() >= 4
        && fields
            .iter()
            .all(|f| f.len() == 2 && f.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Splits `U59` into `U`, `59` and `rc10` into `rc`, `10` so that numbers
/// inside words compare numerically (`rc10` > `rc2`).
fn split_natural(field: &str, out: &mut Vec<Segment>, raw: &str) -> Result<(), VersionError> {
    let mut rest = field;
    while let Some(first) = rest.chars().next() {
        let is_digit = first.is_ascii_digit();
        let end = rest
            .find(|c: char| c.is_ascii_digit() != is_digit)
            .unwrap_or(rest.len());
        let (run, tail) = rest.split_at(end);
        if is_digit {
            let value = run
                .parse::<u128>()
                .map_err(|_| VersionError::NumberTooLarge { raw: raw.to_owned() })?;
            out.push(Segment::Num(value));
        } else {
            out.push(Segment::Text(run.to_ascii_lowercase()));
        }
        rest = tail;
    }
    Ok(())
}

impl PartialEq for FirmwareVersion {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl Eq for FirmwareVersion {}

impl std::hash::Hash for FirmwareVersion {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.raw.hash(state);
    }
}

impl PartialOrd for FirmwareVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FirmwareVersion {
    /// Precedence first; equal precedence falls back to the text so that
    /// `Ord` agrees with `Eq` and sorting is deterministic.
    fn cmp(&self, other: &Self) -> Ordering {
        self.key
            .cmp_precedence(&other.key)
            .then_with(|| self.raw.cmp(&other.raw))
    }
}

impl fmt::Display for FirmwareVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.raw)
    }
}

impl fmt::Debug for FirmwareVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FirmwareVersion({:?})", self.raw)
    }
}

impl FromStr for FirmwareVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl TryFrom<String> for FirmwareVersion {
    type Error = VersionError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::parse(&s)
    }
}

impl Serialize for FirmwareVersion {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.raw)
    }
}

impl<'de> Deserialize<'de> for FirmwareVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// `(older, newer)` pairs of real vendor versions: the data-driven table the
/// ordering is tested against, here and on both databases.
#[doc(hidden)]
pub const ORDERED_EXAMPLES: &[(&str, &str)] = &[
    // NVIDIA VBIOS-style hex segments.
    ("96.00.5E.00.01", "96.00.61.00.01"),
    ("96.00.09.00.01", "96.00.0A.00.01"),
    ("96.00.5e.00.01", "96.00.5F.00.01"),
    ("96.00.61.00.01", "96.00.61.00.02"),
    ("95.FF.FF.FF.FF", "96.00.00.00.00"),
    // Dotted decimal with leading zeros and release candidates.
    ("24.04.1-rc2", "24.04.1"),
    ("24.04.1-rc2", "24.04.1-rc10"),
    ("24.04.1", "24.04.2-rc1"),
    ("24.04.1", "24.10.0"),
    ("23.12.9", "24.01"),
    // Four-part versions.
    ("1.2.3.4", "1.2.3.5"),
    ("1.2.3.4", "1.2.10.0"),
    ("1.2.3", "1.2.3.4"),
    // Two-part versions compare numerically, not as decimals.
    ("2.9", "2.20"),
    ("2.20", "2.100"),
    ("1.2", "1.2.0"),
    // Semver with pre-release precedence from the semver spec.
    ("1.0.0-alpha", "1.0.0-alpha.1"),
    ("1.0.0-alpha.1", "1.0.0-alpha.beta"),
    ("1.0.0-alpha.beta", "1.0.0-beta"),
    ("1.0.0-beta", "1.0.0-beta.2"),
    ("1.0.0-beta.2", "1.0.0-beta.11"),
    ("1.0.0-beta.11", "1.0.0-rc.1"),
    ("1.0.0-rc.1", "1.0.0"),
    ("1.0.0", "1.0.1"),
    ("1.9.0", "1.10.0"),
    ("1.10.0", "2.0.0"),
    // Vendor prefixes.
    ("U59 v2.20", "U59 v2.21"),
    ("U59 v2.20", "U60 v1.00"),
    ("v1.9", "v1.10"),
    // Numbers outrank words at the same position.
    ("1.0.beta", "1.0.1"),
    // Build metadata is not precedence; text breaks the tie.
    ("1.0.0+build.1", "1.0.0+build.2"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(s: &str) -> FirmwareVersion {
        FirmwareVersion::parse(s).unwrap_or_else(|e| panic!("{s:?} should parse: {e}"))
    }

    #[test]
    fn vendor_versions_order_as_vendors_intend() {
        for (lo, hi) in ORDERED_EXAMPLES {
            let (a, b) = (v(lo), v(hi));
            assert!(a < b, "{lo} should be older than {hi}");
            assert!(b > a, "{hi} should be newer than {lo}");
            assert_ne!(a, b);
        }
    }

    #[test]
    fn different_strings_are_never_equal() {
        for (a, b) in [
            ("1.02.3", "1.2.3"),
            ("01.2", "1.2"),
            ("1.0.0+a", "1.0.0+b"),
            ("96.00.5E.00.01", "96.00.5e.00.01"),
        ] {
            let (x, y) = (v(a), v(b));
            assert_ne!(x, y, "{a} vs {b}");
            assert_ne!(x.cmp(&y), Ordering::Equal, "{a} vs {b}");
            assert!(x.is_equivalent(&y), "{a} and {b} share precedence");
        }
    }

    #[test]
    fn a_missing_segment_ranks_below_zero() {
        assert!(v("1.2") < v("1.2.0"));
        assert!(!v("1.2").is_equivalent(&v("1.2.0")));
    }

    #[test]
    fn surrounding_whitespace_is_not_part_of_the_version() {
        assert_eq!(v(" 1.2.3 "), v("1.2.3"));
    }

    #[test]
    fn malformed_versions_are_refused_with_a_reason() {
        let cases: &[(&str, VersionError)] = &[
            ("", VersionError::Empty),
            ("   ", VersionError::Empty),
            ("beta", VersionError::NoDigits { raw: "beta".into() }),
            ("1..2", VersionError::EmptySegment { raw: "1..2".into() }),
            ("1.2.", VersionError::EmptySegment { raw: "1.2.".into() }),
            (
                "1.2/3",
                VersionError::BadCharacter {
                    raw: "1.2/3".into(),
                    ch: '/',
                },
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(FirmwareVersion::parse(input).unwrap_err(), *expected, "input {input:?}");
        }
        assert!(FirmwareVersion::parse(&"1".repeat(200)).is_err());
        assert!(matches!(
            FirmwareVersion::parse("99999999999999999999999999999999999999999999.1"),
            Err(VersionError::NumberTooLarge { .. })
        ));
    }

    #[test]
    fn serde_round_trips_and_refuses_garbage() {
        let parsed: FirmwareVersion = serde_json::from_str("\"96.00.5E.00.01\"").unwrap();
        assert_eq!(parsed.as_str(), "96.00.5E.00.01");
        assert_eq!(serde_json::to_string(&parsed).unwrap(), "\"96.00.5E.00.01\"");
        assert!(serde_json::from_str::<FirmwareVersion>("\"../etc\"").is_err());
    }

    fn version_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9]{1,3}(\\.[0-9]{1,3}){0,4}",
            "[0-9][0-9A-F](\\.[0-9A-F]{2}){3,4}",
            "[0-9]{1,2}\\.[0-9]{1,2}\\.[0-9]{1,2}-(alpha|beta|rc)[0-9]{0,2}(\\.[0-9a-z]{1,3}){0,2}",
            "[A-Z][0-9]{1,2} v[0-9]\\.[0-9]{2}",
        ]
    }

    proptest! {
        #[test]
        fn order_is_total_and_consistent_with_eq(a in version_strategy(), b in version_strategy(), c in version_strategy()) {
            let (a, b, c) = (v(&a), v(&b), v(&c));
            prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
            prop_assert_eq!(a.cmp(&b) == Ordering::Equal, a == b);
            if a <= b && b <= c {
                prop_assert!(a <= c, "transitivity: {a} <= {b} <= {c}");
            }
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,64}") {
            let _ = FirmwareVersion::parse(&s);
        }
    }
}
