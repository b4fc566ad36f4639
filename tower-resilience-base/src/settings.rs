//! The value types that settings files are written in (feature `serde`):
//! durations in a human form and shares as fractions or percentages, each
//! refusing what is out of range with a message that says what was given
//! and what was expected.
//!
//! Every layer's configuration deserializes from any format serde reads
//! (TOML, YAML, JSON...) through these: `open_period = "5s"`,
//! `failure_rate = "50%"` or `failure_rate = 0.5`.
//!
//! # Durations
//!
//! A number followed by a unit: `ns`, `us` (or `µs`), `ms`, `s`, `m`,
//! `h`, `d`, with an optional fraction (`"1.5s"`) and several parts added
//! up (`"1m30s"`). A bare number is refused (which unit would it be?), as
//! are negative durations.
//!
//! ```
//! use std::time::Duration;
//! use tower_resilience_base::settings::{parse_duration, HumanDuration};
//!
//! assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
//! assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
//! assert_eq!(
//!     parse_duration("-2s").unwrap_err().to_string(),
//!     "invalid duration \"-2s\": a duration cannot be negative"
//! );
//! assert_eq!(HumanDuration(Duration::from_millis(1500)).to_string(), "1500ms");
//! ```
//!
//! # Shares
//!
//! A fraction within `0.0..=1.0`, or a percentage within `"0%"..="100%"`:
//!
//! ```
//! use tower_resilience_base::settings::parse_share;
//!
//! assert_eq!(parse_share("25%"), Ok(0.25));
//! assert_eq!(
//!     parse_share("150%").unwrap_err().to_string(),
//!     "invalid share \"150%\": above 100%"
//! );
//! ```

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A settings value that could not be read: what was given and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    kind: &'static str,
    given: String,
    reason: String,
}

impl ValueError {
    fn new(kind: &'static str, given: &str, reason: impl Into<String>) -> Self {
        Self {
            kind,
            given: given.to_owned(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} {:?}: {}", self.kind, self.given, self.reason)
    }
}

impl std::error::Error for ValueError {}

/// A setting out of range, in a layer's settings type: the setting's
/// name (as in the file, a path within the layer's settings:
/// `backoff.cap`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSetting {
    /// The setting.
    pub setting: &'static str,
    /// What is wrong, with the value given.
    pub message: String,
}

impl fmt::Display for InvalidSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.setting, self.message)
    }
}

impl std::error::Error for InvalidSetting {}

/// Parses a human duration (see the [module docs](self)).
///
/// # Errors
///
/// A [`ValueError`] for an empty or negative duration, a number without a
/// unit, an unknown unit or a duration too long for [`Duration`].
pub fn parse_duration(text: &str) -> Result<Duration, ValueError> {
    let err = |reason: &str| ValueError::new("duration", text, reason);
    let s = text.trim();
    if s.is_empty() {
        return Err(err("empty; write a number and a unit, e.g. \"250ms\""));
    }
    if s.starts_with('-') {
        return Err(err("a duration cannot be negative"));
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        if number.is_empty() {
            return Err(err("expected a number, e.g. \"250ms\""));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let nanos_per_unit: u128 = match unit.trim() {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" | "min" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "d" => 86_400_000_000_000,
            "" => {
                return Err(err(
                    "a number needs a unit (ns, us, ms, s, m, h, d), e.g. \"250ms\"",
                ))
            }
            other => {
                return Err(err(&format!(
                    "unknown unit {other:?}; use ns, us, ms, s, m, h or d"
                )))
            }
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return Err(err("not a number"));
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| err("too long"))?
        };
        let mut part = whole
            .checked_mul(nanos_per_unit)
            .ok_or_else(|| err("too long"))?;
        let mut scale = nanos_per_unit;
        for digit in fraction.chars().take(18) {
            scale /= 10;
            part += u128::from(digit.to_digit(10).unwrap_or(0)) * scale;
        }
        total = total.checked_add(part).ok_or_else(|| err("too long"))?;
        rest = next;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| err("too long"))?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Writes `duration` in the largest unit that keeps it whole (`"250ms"`,
/// `"2s"`, `"1500ms"`, `"90s"`), which [`parse_duration`] reads back
/// exactly.
#[must_use]
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    for (unit, per) in [
        ("h", 3_600_000_000_000u128),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
    ] {
        if nanos.is_multiple_of(per) {
            return format!("{}{unit}", nanos / per);
        }
    }
    format!("{nanos}ns")
}

/// Parses a share: a fraction within `0.0..=1.0` or a percentage (see the
/// [module docs](self)).
///
/// # Errors
///
/// A [`ValueError`] for a value that is not a number or not within range.
pub fn parse_share(text: &str) -> Result<f64, ValueError> {
    let err = |reason: &str| ValueError::new("share", text, reason);
    let s = text.trim();
    let (number, percent) = match s.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (s, false),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| err("expected a fraction (0.25) or a percentage (\"25%\")"))?;
    let share = if percent { value / 100.0 } else { value };
    check_share(share).map_err(err)
}

fn check_share(share: f64) -> Result<f64, &'static str> {
    if share.is_nan() {
        Err("not a number")
    } else if share < 0.0 {
        Err("below 0%")
    } else if share > 1.0 {
        Err("above 100%")
    } else {
        Ok(share)
    }
}

/// A [`Duration`] that reads and writes the human form (see the
/// [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl From<HumanDuration> for Duration {
    fn from(d: HumanDuration) -> Self {
        d.0
    }
}

impl From<Duration> for HumanDuration {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HumanDuration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration with its unit, e.g. \"250ms\" or \"2s\"")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                parse_duration(v).map(HumanDuration).map_err(E::custom)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<HumanDuration, E> {
                Err(E::custom(format!(
                    "invalid duration {v}: a number needs a unit, e.g. \"{v}ms\" or \"{v}s\""
                )))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<HumanDuration, E> {
                Err(E::custom(format!(
                    "invalid duration {v}: a number needs a unit, e.g. \"{v}ms\" or \"{v}s\""
                )))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<HumanDuration, E> {
                Err(E::custom(format!(
                    "invalid duration {v}: a number needs a unit, e.g. \"{v}s\""
                )))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A share within `0.0..=1.0` that reads a fraction or a percentage and
/// writes a percentage (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub struct Share(pub f64);

impl fmt::Display for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Rounded to a millionth of a percent: 0.1 + 0.2 reads as 30%.
        let percent = (self.0 * 100.0 * 1e6).round() / 1e6;
        write!(f, "{percent}%")
    }
}

impl Serialize for Share {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Share {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Share;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fraction within 0.0..=1.0 or a percentage such as \"50%\"")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Share, E> {
                parse_share(v).map(Share).map_err(E::custom)
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Share, E> {
                check_share(v)
                    .map(Share)
                    .map_err(|reason| E::custom(format!("invalid share {v}: {reason}")))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Share, E> {
                self.visit_f64(v as f64)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Share, E> {
                self.visit_f64(v as f64)
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde::de::value::{
        BoolDeserializer, F64Deserializer, I64Deserializer, StrDeserializer, U64Deserializer,
    };

    type E = serde::de::value::Error;

    /// What a settings file's value turns into, through serde's own
    /// deserializers: a value, or the error's message.
    fn read<'de, T: Deserialize<'de>>(de: impl Deserializer<'de, Error = E>) -> Result<T, String> {
        T::deserialize(de).map_err(|e| e.to_string())
    }

    #[test]
    fn a_duration_reads_from_text_and_a_bare_number_is_refused_with_a_hint() {
        let ms = Duration::from_millis(250);
        assert_eq!(
            read(StrDeserializer::<E>::new("250ms")),
            Ok(HumanDuration(ms))
        );
        let refused = |r: Result<HumanDuration, String>| r.expect_err("refused");
        assert!(refused(read(StrDeserializer::<E>::new("5"))).contains("needs a unit"));
        assert_eq!(
            refused(read(U64Deserializer::<E>::new(5))),
            "invalid duration 5: a number needs a unit, e.g. \"5ms\" or \"5s\""
        );
        assert_eq!(
            refused(read(I64Deserializer::<E>::new(-5))),
            "invalid duration -5: a number needs a unit, e.g. \"-5ms\" or \"-5s\""
        );
        assert_eq!(
            refused(read(F64Deserializer::<E>::new(1.5))),
            "invalid duration 1.5: a number needs a unit, e.g. \"1.5s\""
        );
        let wrong = refused(read(BoolDeserializer::<E>::new(true)));
        assert!(
            wrong.contains("expected a duration with its unit"),
            "{wrong}"
        );
        // Both ways to and from `Duration`, and written as it is read.
        assert_eq!(Duration::from(HumanDuration(ms)), ms);
        assert_eq!(HumanDuration::from(ms), HumanDuration(ms));
        assert_eq!(HumanDuration(ms).to_string(), format_duration(ms));
        assert_eq!(parse_duration(&HumanDuration(ms).to_string()), Ok(ms));
    }

    #[test]
    fn a_share_reads_from_a_fraction_or_a_percentage_within_bounds() {
        assert_eq!(read(StrDeserializer::<E>::new("50%")), Ok(Share(0.5)));
        assert_eq!(read(F64Deserializer::<E>::new(0.25)), Ok(Share(0.25)));
        assert_eq!(read(U64Deserializer::<E>::new(1)), Ok(Share(1.0)));
        assert_eq!(read(I64Deserializer::<E>::new(1)), Ok(Share(1.0)));
        let refused = |r: Result<Share, String>| r.expect_err("refused");
        assert!(refused(read(StrDeserializer::<E>::new("150%"))).contains("above 100%"));
        assert_eq!(
            refused(read(F64Deserializer::<E>::new(1.5))),
            "invalid share 1.5: above 100%"
        );
        assert_eq!(
            refused(read(U64Deserializer::<E>::new(2))),
            "invalid share 2: above 100%"
        );
        assert_eq!(
            refused(read(I64Deserializer::<E>::new(-1))),
            "invalid share -1: below 0%"
        );
        let wrong = refused(read(BoolDeserializer::<E>::new(true)));
        assert!(
            wrong.contains("expected a fraction within 0.0..=1.0"),
            "{wrong}"
        );
    }

    #[test]
    fn an_invalid_setting_names_the_setting_before_its_message() {
        let e = InvalidSetting {
            setting: "backoff.cap",
            message: "(1s) is below backoff.base (2s)".to_owned(),
        };
        assert_eq!(
            e.to_string(),
            "backoff.cap: (1s) is below backoff.base (2s)"
        );
    }

    #[test]
    fn durations_in_every_unit_and_their_round_trip() {
        for (text, expected) in [
            ("0s", Duration::ZERO),
            ("15ns", Duration::from_nanos(15)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("250ms", Duration::from_millis(250)),
            ("1.5s", Duration::from_millis(1500)),
            (".5s", Duration::from_millis(500)),
            ("2m", Duration::from_secs(120)),
            ("1h30m", Duration::from_secs(5400)),
            ("1d", Duration::from_secs(86_400)),
            (" 2s ", Duration::from_secs(2)),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
            let written = format_duration(expected);
            assert_eq!(parse_duration(&written), Ok(expected), "{written}");
        }
    }

    #[test]
    fn bad_durations_say_why() {
        for (text, reason) in [
            ("", "empty"),
            ("-1s", "negative"),
            ("5", "needs a unit"),
            ("5 parsecs", "unknown unit"),
            ("1.2.3s", "not a number"),
            ("s", "expected a number"),
            ("99999999999999999999999d", "too long"),
        ] {
            let message = parse_duration(text).unwrap_err().to_string();
            assert!(message.contains(reason), "{text}: {message}");
        }
    }

    #[test]
    fn shares_as_fractions_and_percentages() {
        assert_eq!(parse_share("0.5"), Ok(0.5));
        assert_eq!(parse_share("100%"), Ok(1.0));
        assert_eq!(parse_share("0%"), Ok(0.0));
        assert!(parse_share("1.01")
            .unwrap_err()
            .to_string()
            .contains("above 100%"));
        assert!(parse_share("-1%")
            .unwrap_err()
            .to_string()
            .contains("below 0%"));
        assert!(parse_share("half").is_err());
        assert_eq!(Share(0.3).to_string(), "30%");
        assert_eq!(parse_share(&Share(0.123_456).to_string()), Ok(0.123_456));
    }
}
