//! Wire formats of a relative budget: gRPC's `grpc-timeout` and a plain
//! millisecond header.
//!
//! Both carry a *relative* duration rather than an absolute time, because
//! absolute times suffer from clock skew between machines. Parsing is strict
//! and never panics: anything that is not exactly the documented grammar is a
//! [`MalformedTimeout`] that says what was wrong. A header that carries
//! several values (two lines, or a comma-separated list) is read with
//! [`parse_list`], whose [`BudgetList`] gives the shortest valid value or the
//! first malformed one.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use tower_deadline::codec;
//!
//! assert_eq!(codec::parse_grpc_timeout(b"250m"), Ok(Duration::from_millis(250)));
//! assert_eq!(codec::format_grpc_timeout(Duration::from_secs(3)), "3S");
//! assert!(codec::parse_grpc_timeout(b"-5S").is_err());
//!
//! assert_eq!(codec::parse_millis(b"1500"), Ok(Duration::from_millis(1500)));
//! assert_eq!(codec::format_millis(Duration::from_micros(1_999)), "1");
//!
//! let list = codec::parse_list([&b"200, 100"[..]], codec::parse_millis);
//! assert_eq!(list.shortest(), Some(Duration::from_millis(100)));
//! ```

use std::fmt;
use std::time::Duration;

/// The largest number of digits `grpc-timeout` allows (the gRPC spec's
/// `TimeoutValue → {positive integer as ASCII string of at most 8 digits}`).
pub const GRPC_TIMEOUT_MAX_DIGITS: usize = 8;

/// The largest number of digits accepted in a millisecond header: ten digits
/// is about 115 days, far beyond any sensible budget, and keeps the value
/// well inside `u64`.
pub const MILLIS_MAX_DIGITS: usize = 10;

const MAX_GRPC_VALUE: u64 = 99_999_999;

/// gRPC timeout units, finest first, with their length in nanoseconds.
const GRPC_UNITS: [(u8, u128); 6] = [
    (b'n', 1),
    (b'u', 1_000),
    (b'm', 1_000_000),
    (b'S', 1_000_000_000),
    (b'M', 60 * 1_000_000_000),
    (b'H', 3_600 * 1_000_000_000),
];

/// A budget header whose value does not follow its grammar.
///
/// The value is never echoed back (it is attacker-controlled); the error
/// says which rule it broke.
///
/// # Example
///
/// ```
/// use tower_deadline::codec::{parse_grpc_timeout, MalformedTimeout};
///
/// let err: MalformedTimeout = parse_grpc_timeout(b"123456789S").unwrap_err();
/// assert_eq!(err.to_string(), "malformed timeout: more than 8 digits");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MalformedTimeout {
    reason: Reason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Empty,
    NoDigits,
    TooManyGrpcDigits,
    TooManyMillisDigits,
    NotADigit,
    MissingUnit,
    UnknownUnit,
}

// === impl MalformedTimeout ===

impl MalformedTimeout {
    const fn new(reason: Reason) -> Self {
        Self { reason }
    }

    /// A short, lowercase description of the broken rule, such as
    /// `"more than 8 digits"` or `"unknown unit"`.
    pub fn reason(&self) -> &'static str {
        match self.reason {
            Reason::Empty => "empty value",
            Reason::NoDigits => "no digits before the unit",
            Reason::TooManyGrpcDigits => "more than 8 digits",
            Reason::TooManyMillisDigits => "more than 10 digits",
            Reason::NotADigit => "a character that is not an ASCII digit",
            Reason::MissingUnit => "missing unit",
            Reason::UnknownUnit => "unknown unit",
        }
    }
}

impl fmt::Display for MalformedTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed timeout: {}", self.reason())
    }
}

impl std::error::Error for MalformedTimeout {}

/// Parses a `grpc-timeout` value: 1 to 8 ASCII digits followed by exactly one
/// unit, `H` (hours), `M` (minutes), `S` (seconds), `m` (milliseconds), `u`
/// (microseconds) or `n` (nanoseconds).
///
/// Signs, spaces, decimal points, empty values, more than 8 digits and any
/// other unit are rejected. Leading zeros are allowed (`"007S"` is 7 seconds).
///
/// # Errors
///
/// Returns [`MalformedTimeout`] when the value does not match the grammar.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_deadline::codec::parse_grpc_timeout;
///
/// assert_eq!(parse_grpc_timeout(b"1H"), Ok(Duration::from_secs(3600)));
/// assert_eq!(parse_grpc_timeout(b"99999999n"), Ok(Duration::from_nanos(99_999_999)));
/// assert!(parse_grpc_timeout(b"10 S").is_err());
/// assert!(parse_grpc_timeout(b"10s").is_err()); // units are case sensitive
/// ```
pub fn parse_grpc_timeout(value: &[u8]) -> Result<Duration, MalformedTimeout> {
    let Some((&unit, digits)) = value.split_last() else {
        return Err(MalformedTimeout::new(Reason::Empty));
    };
    if unit.is_ascii_digit() {
        return Err(MalformedTimeout::new(Reason::MissingUnit));
    }
    let Some(&(_, unit_nanos)) = GRPC_UNITS.iter().find(|(u, _)| *u == unit) else {
        return Err(MalformedTimeout::new(Reason::UnknownUnit));
    };
    let n = parse_digits(digits, GRPC_TIMEOUT_MAX_DIGITS, Reason::TooManyGrpcDigits)?;
    // At most 99_999_999 hours: about 3.6e20 ns, which fits u128 and, as
    // seconds, fits u64.
    Ok(duration_from_nanos(u128::from(n) * unit_nanos))
}

/// Formats a duration as a `grpc-timeout` value in the shortest form that is
/// exact, or, when no unit represents it exactly within 8 digits, in the
/// finest unit that fits, rounded *up*.
///
/// Rounding up means the value written is never shorter than the budget: a
/// propagated deadline is never made tighter by the encoding. The error is
/// below one part in a hundred thousand. Durations beyond `99999999H` (over eleven
/// thousand years) are written as `99999999H`. Zero is written as `0n`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_deadline::codec::format_grpc_timeout;
///
/// assert_eq!(format_grpc_timeout(Duration::from_millis(1500)), "1500m");
/// assert_eq!(format_grpc_timeout(Duration::from_secs(120)), "2M");
/// assert_eq!(format_grpc_timeout(Duration::from_nanos(1_000_000_001)), "1000001u");
/// ```
pub fn format_grpc_timeout(duration: Duration) -> String {
    let mut buf = [0; GRPC_TIMEOUT_MAX_DIGITS + 1];
    let len = write_grpc_timeout(duration, &mut buf);
    // Digits and one ASCII unit letter.
    buf[..len].iter().map(|&b| char::from(b)).collect()
}

/// Writes the `grpc-timeout` form of `duration` (see
/// [`format_grpc_timeout`]) into `buf` without allocating; returns its
/// length.
pub(crate) fn write_grpc_timeout(
    duration: Duration,
    buf: &mut [u8; GRPC_TIMEOUT_MAX_DIGITS + 1],
) -> usize {
    let nanos = duration.as_nanos();
    if nanos == 0 {
        return render(0, b'n', buf);
    }
    // Exact forms, coarsest unit first: fewest digits.
    for &(unit, unit_nanos) in GRPC_UNITS.iter().rev() {
        if nanos.is_multiple_of(unit_nanos) && nanos / unit_nanos <= u128::from(MAX_GRPC_VALUE) {
            return render(nanos / unit_nanos, unit, buf);
        }
    }
    // Inexact: the finest unit whose rounded-up value fits.
    for &(unit, unit_nanos) in GRPC_UNITS.iter() {
        let value = nanos.div_ceil(unit_nanos);
        if value <= u128::from(MAX_GRPC_VALUE) {
            return render(value, unit, buf);
        }
    }
    render(u128::from(MAX_GRPC_VALUE), b'H', buf)
}

/// What the values of one budget header say, read as one list: how many
/// values there were, the shortest valid one and the first malformed one.
///
/// Built by [`parse_list`]. The caller picks the reading: the lenient one
/// ([`shortest`](BudgetList::shortest), malformed values skipped) or the
/// strict one ([`strict`](BudgetList::strict), any malformed value is an
/// error).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_deadline::codec::{parse_list, parse_millis};
///
/// let list = parse_list([&b"200, 100"[..], b"banana"], parse_millis);
/// assert_eq!(list.len(), 3);
/// assert_eq!(list.shortest(), Some(Duration::from_millis(100)));
/// assert!(list.strict().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BudgetList {
    len: usize,
    shortest: Option<Duration>,
    malformed: Option<MalformedTimeout>,
}

// === impl BudgetList ===

impl BudgetList {
    /// How many values the header carried, valid or not: one per header
    /// line, plus one per comma inside a line.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether the header carried no value at all (it was absent).
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The shortest valid value, ignoring malformed ones; `None` when no
    /// value is valid. The shortest is the only reading no hop can
    /// lengthen by adding a value.
    pub const fn shortest(&self) -> Option<Duration> {
        self.shortest
    }

    /// The first malformed value's error, if any value was malformed.
    pub const fn malformed(&self) -> Option<MalformedTimeout> {
        self.malformed
    }

    /// The strict reading: the shortest value, or `None` when the header
    /// was absent.
    ///
    /// # Errors
    ///
    /// Returns the first malformed value's [`MalformedTimeout`] when any
    /// value is malformed, even if others are valid.
    pub const fn strict(&self) -> Result<Option<Duration>, MalformedTimeout> {
        match self.malformed {
            Some(e) => Err(e),
            None => Ok(self.shortest),
        }
    }
}

/// Reads every value of one budget header (all its lines, each split at
/// commas) with `parse` ([`parse_grpc_timeout`] or [`parse_millis`]).
///
/// A header sent twice is, in HTTP, the same as one line holding both
/// values joined by a comma (RFC 9110, section 5.3), and proxies may join or
/// split lines freely, so both spellings read the same: `200` and `100` on
/// two lines, or `200, 100` on one. Spaces and tabs are allowed around a
/// comma, nowhere else: an element is parsed as strictly as a single value,
/// so an empty element (`"200,,100"`, `"100,"`) is malformed, and so is a
/// line with a leading or trailing space (an HTTP parser strips those
/// before the value reaches us). Neither grammar contains a comma, so the
/// split never cuts a valid value in two.
///
/// Never panics and never allocates; the work is linear in the length of
/// the values.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_deadline::codec::{parse_grpc_timeout, parse_list};
///
/// let list = parse_list([&b"1S"[..], b"250m"], parse_grpc_timeout);
/// assert_eq!(list.strict(), Ok(Some(Duration::from_millis(250))));
///
/// let none = parse_list(std::iter::empty::<&[u8]>(), parse_grpc_timeout);
/// assert!(none.is_empty());
/// assert_eq!(none.strict(), Ok(None));
/// ```
pub fn parse_list<'a, I>(
    values: I,
    parse: fn(&[u8]) -> Result<Duration, MalformedTimeout>,
) -> BudgetList
where
    I: IntoIterator<Item = &'a [u8]>,
{
    let mut list = BudgetList::default();
    for line in values {
        for element in list_elements(line) {
            list.len += 1;
            match parse(element) {
                Ok(d) => list.shortest = Some(list.shortest.map_or(d, |s| s.min(d))),
                Err(e) => {
                    list.malformed.get_or_insert(e);
                }
            }
        }
    }
    list
}

/// Splits one header line at commas, trimming spaces and tabs on the
/// sides of each element that touch a comma (never the line's own ends).
fn list_elements(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    let last = line.iter().filter(|&&b| b == b',').count();
    line.split(|&b| b == b',')
        .enumerate()
        .map(move |(i, mut element)| {
            let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
            if i > 0 {
                while let Some((first, rest)) = element.split_first() {
                    if !is_ows(first) {
                        break;
                    }
                    element = rest;
                }
            }
            if i < last {
                while let Some((end, rest)) = element.split_last() {
                    if !is_ows(end) {
                        break;
                    }
                    element = rest;
                }
            }
            element
        })
}

/// Parses a relative budget in whole milliseconds: 1 to 10 ASCII digits and
/// nothing else (no sign, unit, space or fraction).
///
/// # Errors
///
/// Returns [`MalformedTimeout`] when the value does not match the grammar.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_deadline::codec::parse_millis;
///
/// assert_eq!(parse_millis(b"300"), Ok(Duration::from_millis(300)));
/// assert!(parse_millis(b"300ms").is_err());
/// assert!(parse_millis(b"+300").is_err());
/// ```
pub fn parse_millis(value: &[u8]) -> Result<Duration, MalformedTimeout> {
    if value.is_empty() {
        return Err(MalformedTimeout::new(Reason::Empty));
    }
    parse_digits(value, MILLIS_MAX_DIGITS, Reason::TooManyMillisDigits).map(Duration::from_millis)
}

/// Formats a duration as whole milliseconds, rounded *down*.
///
/// Rounding down is the right direction for a budget handed to a callee: it
/// never tells the callee it has more time than the caller will wait.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_deadline::codec::format_millis;
///
/// assert_eq!(format_millis(Duration::from_micros(250_900)), "250");
/// assert_eq!(format_millis(Duration::ZERO), "0");
/// ```
pub fn format_millis(duration: Duration) -> String {
    duration.as_millis().to_string()
}

fn parse_digits(
    digits: &[u8],
    max_digits: usize,
    too_many: Reason,
) -> Result<u64, MalformedTimeout> {
    if digits.is_empty() {
        return Err(MalformedTimeout::new(Reason::NoDigits));
    }
    if digits.len() > max_digits {
        return Err(MalformedTimeout::new(too_many));
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return Err(MalformedTimeout::new(Reason::NotADigit));
        }
        // At most 10 digits: cannot overflow u64.
        n = n * 10 + u64::from(b - b'0');
    }
    Ok(n)
}

fn duration_from_nanos(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX);
    // The remainder is below 1e9, so it always fits u32.
    let sub = u32::try_from(nanos % NANOS_PER_SEC).unwrap_or(0);
    Duration::new(secs, sub)
}

/// The two-digit strings "00" to "99", back to back.
const PAIRS: &[u8; 200] = b"\
    0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// Writes `value` in decimal at the end of `buf`; returns the digits
/// written (a slice of `buf`).
pub(crate) fn write_decimal(value: u64, buf: &mut [u8; 20]) -> &[u8] {
    // Two digits per division, from the right end of `buf`: a remaining
    // budget in milliseconds (5 to 7 digits) takes three divisions.
    let mut n = value;
    let mut at = buf.len();
    while n >= 100 {
        // Below 100: the cast cannot truncate.
        let pair = (n % 100) as usize * 2;
        n /= 100;
        at -= 2;
        buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        at -= 2;
        buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        at -= 1;
        // Below 10: the cast cannot truncate.
        buf[at] = b'0' + n as u8;
    }
    &buf[at..]
}

/// Writes `value` (at most 8 digits) and `unit` into `buf`; returns the
/// length written.
fn render(value: u128, unit: u8, buf: &mut [u8; GRPC_TIMEOUT_MAX_DIGITS + 1]) -> usize {
    let mut digits = [0u8; 20];
    // At most 99_999_999: fits u64, and 8 digits.
    let value = u64::try_from(value.min(u128::from(MAX_GRPC_VALUE))).unwrap_or(MAX_GRPC_VALUE);
    let digits = write_decimal(value, &mut digits);
    let len = digits.len();
    buf[..len].copy_from_slice(digits);
    buf[len] = unit;
    len + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_every_unit() {
        let cases: [(&[u8], Duration); 6] = [
            (b"2H", Duration::from_secs(7200)),
            (b"3M", Duration::from_secs(180)),
            (b"4S", Duration::from_secs(4)),
            (b"5m", Duration::from_millis(5)),
            (b"6u", Duration::from_micros(6)),
            (b"7n", Duration::from_nanos(7)),
        ];
        for (input, want) in cases {
            assert_eq!(parse_grpc_timeout(input), Ok(want), "{input:?}");
        }
    }

    #[test]
    fn eight_digits_are_accepted_and_nine_rejected() {
        assert_eq!(
            parse_grpc_timeout(b"99999999H"),
            Ok(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(
            parse_grpc_timeout(b"00000001m"),
            Ok(Duration::from_millis(1))
        );
        let err = parse_grpc_timeout(b"100000000n").unwrap_err();
        assert_eq!(err.reason(), "more than 8 digits");
    }

    #[test]
    fn rejects_malformed_values_with_a_reason() {
        let cases: [(&[u8], &str); 12] = [
            (b"", "empty value"),
            (b"S", "no digits before the unit"),
            (b"100", "missing unit"),
            (b"10s", "unknown unit"),
            (b"10x", "unknown unit"),
            (b"-1S", "a character that is not an ASCII digit"),
            (b"+1S", "a character that is not an ASCII digit"),
            (b" 1S", "a character that is not an ASCII digit"),
            (b"1 S", "a character that is not an ASCII digit"),
            (b"1.5S", "a character that is not an ASCII digit"),
            ("١S".as_bytes(), "a character that is not an ASCII digit"),
            (b"1S ", "unknown unit"),
        ];
        for (input, reason) in cases {
            let err = parse_grpc_timeout(input).unwrap_err();
            assert_eq!(err.reason(), reason, "{input:?}");
        }
    }

    #[test]
    fn the_error_displays_its_reason_lowercase_without_the_value() {
        let err = parse_grpc_timeout(b"12x").unwrap_err();
        assert_eq!(err.to_string(), "malformed timeout: unknown unit");
        let err = parse_millis(b"").unwrap_err();
        assert_eq!(err.to_string(), "malformed timeout: empty value");
    }

    #[test]
    fn decimal_writer_matches_display() {
        for n in [
            0,
            7,
            9,
            10,
            42,
            99,
            100,
            101,
            999,
            1_000,
            12_345,
            59_999,
            60_000,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut buf = [0; 20];
            assert_eq!(write_decimal(n, &mut buf), n.to_string().as_bytes());
        }
    }

    #[test]
    fn millis_are_strict() {
        assert_eq!(parse_millis(b"0"), Ok(Duration::ZERO));
        assert_eq!(
            parse_millis(b"9999999999"),
            Ok(Duration::from_millis(9_999_999_999))
        );
        for bad in [
            &b""[..],
            b"10000000000",
            b"-1",
            b"1.0",
            b"1ms",
            b" 1",
            b"1 ",
            b"0x10",
        ] {
            assert!(parse_millis(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn formats_exact_values_in_the_coarsest_unit() {
        assert_eq!(format_grpc_timeout(Duration::from_secs(7200)), "2H");
        assert_eq!(format_grpc_timeout(Duration::from_secs(90)), "90S");
        assert_eq!(format_grpc_timeout(Duration::from_millis(300)), "300m");
        assert_eq!(format_grpc_timeout(Duration::from_micros(1)), "1u");
        assert_eq!(
            format_grpc_timeout(Duration::from_nanos(99_999_999)),
            "99999999n"
        );
        assert_eq!(format_grpc_timeout(Duration::ZERO), "0n");
    }

    #[test]
    fn formats_inexact_values_rounded_up_in_the_finest_unit_that_fits() {
        // 100_000_001 ns needs 9 digits in n; in u it is 100000.001 -> 100001u.
        assert_eq!(
            format_grpc_timeout(Duration::from_nanos(100_000_001)),
            "100001u"
        );
        // Beyond the largest representable value: saturate.
        assert_eq!(format_grpc_timeout(Duration::MAX), "99999999H");
    }

    #[test]
    fn lists_split_at_commas_with_whitespace_only_around_them() {
        let ms = Duration::from_millis;
        // (header lines, values, shortest valid, no malformed value)
        type Case = (&'static [&'static [u8]], usize, Option<Duration>, bool);
        let cases: [Case; 9] = [
            (&[b"200", b"100"], 2, Some(ms(100)), true),
            (&[b"200, 100"], 2, Some(ms(100)), true),
            (&[b"200 ,\t100,300"], 3, Some(ms(100)), true),
            (&[b"200, banana", b"50"], 3, Some(ms(50)), false),
            (&[b"200,,100"], 3, Some(ms(100)), false),
            (&[b"100,"], 2, Some(ms(100)), false),
            // The line's own ends are not trimmed: as strict as one value.
            (&[b" 7"], 1, None, false),
            (&[b"7 , 8 "], 2, Some(ms(7)), false),
            (&[], 0, None, true),
        ];
        for (lines, len, shortest, valid) in cases {
            let list = parse_list(lines.iter().copied(), parse_millis);
            assert_eq!(list.len(), len, "{lines:?}");
            assert_eq!(list.is_empty(), len == 0, "{lines:?}");
            assert_eq!(list.shortest(), shortest, "{lines:?}");
            assert_eq!(list.strict().is_ok(), valid, "{lines:?}");
            assert_eq!(list.malformed().is_none(), valid, "{lines:?}");
        }
        let grpc = parse_list([&b"1S, 900m"[..], b"2M"], parse_grpc_timeout);
        assert_eq!(grpc.strict(), Ok(Some(ms(900))));
        let err = parse_list([&b"1S, 10s"[..]], parse_grpc_timeout).strict();
        assert_eq!(err.unwrap_err().reason(), "unknown unit");
    }

    proptest! {
        #[test]
        fn decimal_writer_matches_display_for_any_value(n in any::<u64>()) {
            let mut buf = [0; 20];
            let expected = n.to_string();
            prop_assert_eq!(write_decimal(n, &mut buf), expected.as_bytes());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
            let _ = parse_grpc_timeout(&bytes);
            let _ = parse_millis(&bytes);
            let commas = bytes.iter().filter(|&&b| b == b',').count();
            for parse in [parse_grpc_timeout, parse_millis] {
                let list = parse_list([&bytes[..], &bytes[..]], parse);
                prop_assert_eq!(list.len(), 2 * (commas + 1));
            }
        }

        #[test]
        fn a_list_reads_as_its_shortest_value_however_it_is_split(
            values in proptest::collection::vec(0u64..10_000_000_000, 1..6),
            separators in proptest::collection::vec(
                prop_oneof![Just(","), Just(", "), Just(" ,"), Just(" ,\t "), Just("\n")],
                5,
            ),
        ) {
            // Join the values into lines: "\n" starts a new header line,
            // anything else is a comma inside the line.
            let mut lines = vec![String::new()];
            for (i, value) in values.iter().enumerate() {
                if i > 0 {
                    match separators[i - 1] {
                        "\n" => lines.push(String::new()),
                        sep => lines.last_mut().unwrap().push_str(sep),
                    }
                }
                lines.last_mut().unwrap().push_str(&format_millis(Duration::from_millis(*value)));
            }
            let list = parse_list(lines.iter().map(|l| l.as_bytes()), parse_millis);
            let min = values.iter().copied().min().map(Duration::from_millis);
            prop_assert_eq!(list.len(), values.len());
            prop_assert_eq!(list.strict(), Ok(min));
            prop_assert_eq!(list.shortest(), min);

            // The same values as gRPC timeouts on one line (the format
            // may round a value up; the shortest is still the one of the
            // smallest value).
            let spelled: Vec<String> = values
                .iter()
                .map(|v| format_grpc_timeout(Duration::from_millis(*v)))
                .collect();
            let want = spelled
                .iter()
                .map(|s| parse_grpc_timeout(s.as_bytes()).unwrap())
                .min();
            let joined = spelled.join(", ");
            let grpc = parse_list([joined.as_bytes()], parse_grpc_timeout);
            prop_assert_eq!(grpc.strict(), Ok(want));
        }

        #[test]
        fn one_malformed_element_fails_the_strict_reading_only(
            values in proptest::collection::vec(0u64..10_000_000_000, 0..4),
            bad in prop_oneof![Just("banana"), Just(""), Just("-1"), Just("1.5"), Just("5ms")],
            at in 0usize..4,
        ) {
            let mut elements: Vec<String> = values.iter().map(u64::to_string).collect();
            elements.insert(at.min(elements.len()), bad.to_owned());
            let line = elements.join(", ");
            let list = parse_list([line.as_bytes()], parse_millis);
            prop_assert!(list.strict().is_err(), "{line:?}");
            prop_assert!(list.malformed().is_some());
            let min = values.iter().copied().min().map(Duration::from_millis);
            prop_assert_eq!(list.shortest(), min);
        }

        #[test]
        fn formatting_never_shortens_and_round_trips(
            secs in 0u64..(99_999_999 * 3600),
            nanos in 0u32..1_000_000_000,
        ) {
            let d = Duration::new(secs, nanos);
            let s = format_grpc_timeout(d);
            prop_assert!(s.len() <= GRPC_TIMEOUT_MAX_DIGITS + 1, "{s}");
            let back = parse_grpc_timeout(s.as_bytes()).unwrap();
            prop_assert!(back >= d, "{s} shortened {d:?} to {back:?}");
            // Rounding only happens when the next finer unit needs more
            // than 8 digits, so the error is below one part in 100_000.
            let slack = (back - d).as_nanos();
            prop_assert!(slack * 100_000 <= d.as_nanos(), "{s} for {d:?}");
        }

        #[test]
        fn exact_values_round_trip_exactly(value in 0u64..=99_999_999, unit in 0usize..6) {
            let (u, unit_nanos) = GRPC_UNITS[unit];
            let d = duration_from_nanos(u128::from(value) * unit_nanos);
            let s = format_grpc_timeout(d);
            prop_assert_eq!(parse_grpc_timeout(s.as_bytes()), Ok(d));
            // Parsing the canonical spelling gives the same duration too.
            let mut spelled = value.to_string().into_bytes();
            spelled.push(u);
            prop_assert_eq!(parse_grpc_timeout(&spelled), Ok(d));
        }

        #[test]
        fn millis_round_trip(ms in 0u64..10_000_000_000) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse_millis(format_millis(d).as_bytes()), Ok(d));
        }
    }
}
