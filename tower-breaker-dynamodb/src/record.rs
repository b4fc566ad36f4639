//! The circuit's item, decoded, and the decisions taken from it. Pure
//! functions of the item and the writer's clock, so the semantics are
//! tested without a server; `mod.rs` does the conditional writes.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;

use tower_breaker::store::{Decision, FleetRule, Segment, StoreError};

/// An item as DynamoDB returns it.
pub(super) type Item = HashMap<String, AttributeValue>;

// Attribute names (the item's schema, documented in the module docs).
pub(super) const PK: &str = "pk";
pub(super) const STATE: &str = "state";
pub(super) const UNTIL: &str = "until_ms";
pub(super) const SINCE: &str = "since_ms";
pub(super) const PERIOD: &str = "period_ms";
pub(super) const VERSION: &str = "ver";
pub(super) const REOPENS: &str = "reopens";
pub(super) const LEASE: &str = "lease_until_ms";
pub(super) const LEASE_LEN: &str = "lease_ms";
pub(super) const EXPIRES: &str = "expires_at";

const OPEN: &str = "open";
pub(super) const CLOSED: &str = "closed";

/// What the item says, with its numbers read. A number that cannot be
/// read is `None` and makes the record `unreadable`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Record {
    /// The version of the last state write (the elected prober's token
    /// while it probes); `None` on an item that only holds a window.
    pub(super) version: Option<u64>,
    pub(super) phase: Phase,
    pub(super) until: u64,
    pub(super) period: u64,
    pub(super) reopens: u32,
    /// When the elected prober's lease ends, writer's clock (0: none).
    pub(super) lease_until: u64,
    /// The lease's length, for a contender that measures it itself.
    pub(super) lease_len: u64,
    /// The TTL attribute, seconds since the epoch (0: none).
    pub(super) expires_at: u64,
    /// A field the store writes could not be read.
    pub(super) unreadable: bool,
}

/// The `state` attribute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Phase {
    /// No state: no opening since the item was created (a window only).
    #[default]
    None,
    Open,
    Closed,
}

/// The most buckets the fleet's window keeps in one item: a longer window
/// is kept in fewer, longer buckets (see [`Window`]), so the item stays
/// under 1 KB (one write capacity unit per write).
pub(super) const MAX_BUCKETS: u32 = 20;

/// What one unit of failures and of slow calls weighs in a packed bucket:
/// a bucket is one number, calls + failures x 10^12 + slow x 10^24, so one
/// `ADD` counts all three at once (DynamoDB numbers hold 38 digits).
const PACK: u128 = 1_000_000_000_000;

/// The fleet's window in the item: one number attribute per bucket of
/// time, named `w` and the bucket's tick (its start over its length), with
/// the packed counts. A report `ADD`s to its tick's attribute, which needs
/// no condition and creates the attribute when it is the tick's first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    pub(super) buckets: u64,
    pub(super) len_ms: u64,
}

/// The window's counts as the item holds them.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    /// Calls, failures and slow calls in the window ending at the tick.
    pub(super) sums: (u64, u64, u64),
    /// The newest tick of any bucket (0: none).
    pub(super) newest: u64,
    /// Buckets older than the window: removed by the next report.
    pub(super) stale: Vec<u64>,
}

impl Window {
    /// The rule's window in at most [`MAX_BUCKETS`] buckets: `buckets`
    /// buckets of `bucket` are merged `k` at a time when there are more.
    pub(super) fn of(rule: &FleetRule) -> Self {
        let buckets = u64::from(rule.buckets.max(1));
        let merge = buckets.div_ceil(u64::from(MAX_BUCKETS));
        Self {
            buckets: buckets.div_ceil(merge),
            len_ms: millis(rule.bucket).max(1) * merge,
        }
    }

    /// The tick of `now`.
    pub(super) fn tick(&self, now: u64) -> u64 {
        now / self.len_ms
    }

    /// The whole window's length.
    pub(super) fn window_ms(&self) -> u64 {
        self.buckets * self.len_ms
    }

    /// Reads the buckets of `item` for the window ending at `tick`.
    pub(super) fn counts(&self, item: &Item, tick: u64) -> Counts {
        let mut counts = Counts::default();
        for (name, value) in item {
            let Some(t) = name.strip_prefix('w').and_then(|t| t.parse::<u64>().ok()) else {
                continue;
            };
            counts.newest = counts.newest.max(t);
            if t + self.buckets <= tick {
                counts.stale.push(t);
                continue;
            }
            if t > tick {
                continue; // from a clock ahead of this one
            }
            let Some((calls, failures, slow)) = value.as_n().ok().and_then(|n| unpack(n)) else {
                continue;
            };
            counts.sums.0 += calls;
            counts.sums.1 += failures;
            counts.sums.2 += slow;
        }
        counts
    }
}

/// The attribute of a part of the fleet's count window placed at `at_ms`
/// (writer's clock): `g{at_ms}` for a report's calls before its failures in
/// a row, `g{at_ms}f` for those failures. Reports placed at the same
/// millisecond `ADD` to the same attribute, as to a bucket.
pub(super) fn segment_attr(segment: &Segment) -> String {
    let tail = segment.failures == segment.calls && segment.calls > 0;
    format!("g{}{}", segment.at_ms, if tail { "f" } else { "" })
}

/// The parts of the fleet's count window that `item` holds, each with its
/// attribute.
pub(super) fn segments(item: &Item) -> Vec<(String, Segment)> {
    let mut parts = Vec::new();
    for (name, value) in item {
        let Some(at) = name.strip_prefix('g') else {
            continue;
        };
        let Ok(at_ms) = at.strip_suffix('f').unwrap_or(at).parse::<u64>() else {
            continue;
        };
        let Some((calls, failures, slow)) = value.as_n().ok().and_then(|n| unpack(n)) else {
            continue;
        };
        parts.push((name.clone(), Segment::new(at_ms, calls, failures, slow)));
    }
    parts
}

/// A packed number's calls, failures and slow calls.
fn unpack(n: &str) -> Option<(u64, u64, u64)> {
    let packed = n.parse::<u128>().ok()?;
    let part = |shift: u32| u64::try_from(packed / PACK.pow(shift) % PACK).unwrap_or(0);
    Some((part(0), part(1), part(2)))
}

/// The attribute of the bucket of `tick`.
pub(super) fn bucket_attr(tick: u64) -> String {
    format!("w{tick}")
}

/// A report's counts as one number to `ADD` (each below 10^12).
pub(super) fn pack(calls: u64, failures: u64, slow: u64) -> String {
    let cap = |n: u64| u128::from(n).min(PACK - 1);
    (cap(calls) + cap(failures) * PACK + cap(slow) * PACK * PACK).to_string()
}

impl Record {
    /// Reads an item; unreadable numbers make it `unreadable`.
    pub(super) fn decode(item: &Item) -> Self {
        let mut unreadable = false;
        let mut num = |name: &str| match number(item, name) {
            Ok(n) => n,
            Err(()) => {
                unreadable = true;
                None
            }
        };
        let version = num(VERSION);
        let until = num(UNTIL);
        let period = num(PERIOD).unwrap_or(0);
        let reopens = num(REOPENS).unwrap_or(0);
        let lease_until = num(LEASE).unwrap_or(0);
        let lease_len = num(LEASE_LEN).unwrap_or(0);
        let expires_at = num(EXPIRES).unwrap_or(0);
        let phase = match item.get(STATE).map(AttributeValue::as_s) {
            None => Phase::None,
            Some(Ok(s)) if s == OPEN => Phase::Open,
            Some(Ok(s)) if s == CLOSED => Phase::Closed,
            Some(_) => {
                unreadable = true;
                Phase::None
            }
        };
        if phase == Phase::Open && until.is_none() {
            unreadable = true;
        }
        Self {
            version,
            phase,
            until: until.unwrap_or(0),
            period,
            reopens: u32::try_from(reopens).unwrap_or(u32::MAX),
            lease_until,
            lease_len,
            expires_at,
            unreadable,
        }
    }

    /// Whether the table's TTL has passed: DynamoDB deletes such items
    /// only eventually and still returns them, so they read as missing.
    pub(super) fn ttl_passed(&self, now: u64) -> bool {
        self.expires_at != 0 && self.expires_at.saturating_mul(1000) <= now
    }

    /// Whether the item is gone for the store's decisions: past its TTL
    /// (DynamoDB deletes such items lazily, up to days later), or holding
    /// an opening whose own time to live (its T or lease plus `cleanup_ms`)
    /// has passed even though a later report moved the item's TTL (a
    /// report `ADD`s to the window of an item whose TTL passed, which
    /// revives it with its old state).
    pub(super) fn gone(&self, now: u64, cleanup_ms: u64) -> bool {
        self.ttl_passed(now)
            || self.phase == Phase::Open
                && !self.unreadable
                && self.until.max(self.lease_until).saturating_add(cleanup_ms) < now
    }

    /// Whether it holds an opening whose T is still ahead.
    pub(super) fn open_ahead(&self, now: u64) -> bool {
        self.phase == Phase::Open && !self.unreadable && self.until > now
    }

    /// The time left until T, as this process's clock sees it, never more
    /// than the opening's own length: a reader whose clock runs behind the
    /// writer's does not stay open longer than one period.
    pub(super) fn remaining(&self, now: u64) -> u64 {
        let left = self.until.saturating_sub(now);
        if self.period > 0 {
            left.min(self.period)
        } else {
            left
        }
    }

    /// An opening: `until`, `period`, `reopens`, the prober's lease
    /// (`lease_until` 0: none), version `version`.
    pub(super) fn open(
        now: u64,
        until: u64,
        period: u64,
        reopens: u32,
        lease: Option<u64>,
        version: u64,
    ) -> Self {
        let lease_len = lease.unwrap_or(0);
        Self {
            version: Some(version),
            phase: Phase::Open,
            until,
            period,
            reopens,
            lease_until: if lease_len > 0 { now + lease_len } else { 0 },
            lease_len,
            expires_at: 0,
            unreadable: false,
        }
    }

    /// The closed mark.
    pub(super) fn closed(version: u64) -> Self {
        Self {
            version: Some(version),
            phase: Phase::Closed,
            ..Self::default()
        }
    }

    /// The item to put for this record, written at `now`, kept
    /// `cleanup_ms` past its T and lease (or past `now` when closed).
    pub(super) fn encode(&self, key: &str, now: u64, cleanup_ms: u64) -> Item {
        let n = |v: u64| AttributeValue::N(v.to_string());
        let mut item = Item::new();
        item.insert(PK.to_owned(), AttributeValue::S(key.to_owned()));
        if let Some(v) = self.version {
            item.insert(VERSION.to_owned(), n(v));
        }
        item.insert(SINCE.to_owned(), n(now));
        let end = match self.phase {
            Phase::Open => {
                item.insert(STATE.to_owned(), AttributeValue::S(OPEN.to_owned()));
                item.insert(UNTIL.to_owned(), n(self.until));
                item.insert(PERIOD.to_owned(), n(self.period));
                item.insert(REOPENS.to_owned(), n(u64::from(self.reopens)));
                item.insert(LEASE.to_owned(), n(self.lease_until));
                item.insert(LEASE_LEN.to_owned(), n(self.lease_len));
                self.until.max(self.lease_until)
            }
            Phase::Closed => {
                item.insert(STATE.to_owned(), AttributeValue::S(CLOSED.to_owned()));
                now
            }
            Phase::None => now,
        };
        item.insert(EXPIRES.to_owned(), n(expiry_secs(end, cleanup_ms)));
        item
    }
}

/// The decision an item (or its absence) gives at `now`.
pub(super) fn decide(
    record: Option<&Record>,
    now: u64,
    cleanup_ms: u64,
) -> Result<Decision, StoreError> {
    let Some(r) = record.filter(|r| !r.gone(now, cleanup_ms)) else {
        return Ok(Decision::Missing);
    };
    if r.unreadable {
        return Err(StoreError::new(
            "unreadable circuit record in dynamodb (a number or the state cannot be read)",
        ));
    }
    Ok(match r.phase {
        Phase::None => Decision::Missing,
        Phase::Closed => Decision::Closed,
        Phase::Open if r.until > now => Decision::Open {
            remaining: Duration::from_millis(r.remaining(now)),
        },
        Phase::Open => Decision::Expired,
    })
}

/// The TTL attribute for a record that ends at `end_ms`: seconds since the
/// epoch, rounded up.
pub(super) fn expiry_secs(end_ms: u64, cleanup_ms: u64) -> u64 {
    (end_ms + cleanup_ms).div_ceil(1000)
}

/// A number attribute: `Ok(None)` when absent, `Err` when not a number.
fn number(item: &Item, name: &str) -> Result<Option<u64>, ()> {
    match item.get(name) {
        None => Ok(None),
        Some(AttributeValue::N(n)) => n.parse().map(Some).map_err(drop),
        Some(_) => Err(()),
    }
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(buckets: u32, bucket_ms: u64) -> FleetRule {
        FleetRule::new(
            buckets,
            Duration::from_millis(bucket_ms),
            Duration::from_secs(5),
        )
    }

    #[test]
    fn long_windows_merge_buckets_into_at_most_twenty() {
        let w = |buckets, len_ms| Window { buckets, len_ms };
        assert_eq!(Window::of(&rule(10, 1000)), w(10, 1000));
        assert_eq!(Window::of(&rule(60, 1000)), w(20, 3000));
        assert_eq!(Window::of(&rule(21, 500)), w(11, 1000));
        assert_eq!(Window::of(&rule(0, 0)), w(1, 1));
    }

    #[test]
    fn an_open_record_round_trips_and_decides() {
        let r = Record::open(1_000, 6_000, 5_000, 2, Some(30_000), 42);
        let item = r.encode("p:x", 1_000, 600_000);
        assert_eq!(expiry_secs(31_000, 600_000), 631);
        let back = Record::decode(&item);
        assert_eq!(back.version, Some(42));
        assert_eq!(back.phase, Phase::Open);
        assert_eq!((back.until, back.period, back.reopens), (6_000, 5_000, 2));
        assert_eq!((back.lease_until, back.lease_len), (31_000, 30_000));
        assert_eq!(back.expires_at, 631);
        assert!(!back.unreadable);
        assert_eq!(
            decide(Some(&back), 2_000, 600_000).unwrap(),
            Decision::Open {
                remaining: Duration::from_secs(4)
            }
        );
        assert_eq!(
            decide(Some(&back), 6_000, 600_000).unwrap(),
            Decision::Expired
        );
        // Past the TTL the item is as good as deleted.
        assert_eq!(
            decide(Some(&back), 631_000, 600_000).unwrap(),
            Decision::Missing
        );
        assert_eq!(decide(None, 0, 600_000).unwrap(), Decision::Missing);
    }

    #[test]
    fn a_reader_whose_clock_runs_behind_waits_at_most_one_period() {
        let r = Record::open(10_000, 15_000, 5_000, 0, None, 1);
        // 3 s behind the writer: T looks 8 s away, but the opening is 5 s.
        assert_eq!(r.remaining(7_000), 5_000);
        assert_eq!(r.remaining(12_000), 3_000);
    }

    #[test]
    fn garbage_is_unreadable_not_a_decision() {
        let mut item = Record::open(0, 5_000, 5_000, 0, None, 1).encode("k", 0, 1000);
        item.insert(UNTIL.to_owned(), AttributeValue::S("soon".to_owned()));
        let r = Record::decode(&item);
        assert!(r.unreadable);
        assert!(decide(Some(&r), 1, 600_000).is_err());
        let mut item = Record::closed(1).encode("k", 0, 1000);
        item.insert(STATE.to_owned(), AttributeValue::S("ajar".to_owned()));
        assert!(Record::decode(&item).unreadable);
    }

    #[test]
    fn the_window_sums_only_the_buckets_of_its_ticks() {
        let window = Window {
            buckets: 3,
            len_ms: 1000,
        };
        let mut item = Item::new();
        let mut put = |t: u64, c: u64, f: u64, s: u64| {
            item.insert(bucket_attr(t), AttributeValue::N(pack(c, f, s)));
        };
        put(9, 5, 5, 0); // in the window ending at 10: ticks 8, 9, 10
        put(10, 4, 1, 3);
        put(5, 100, 100, 0); // too old: stale
        put(12, 7, 7, 7); // from a clock ahead
        item.insert("w11x".to_owned(), AttributeValue::N("1".to_owned()));
        item.insert(EXPIRES.to_owned(), AttributeValue::N("1".to_owned()));
        let counts = window.counts(&item, 10);
        assert_eq!(counts.sums, (9, 6, 3));
        assert_eq!(counts.newest, 12);
        assert_eq!(counts.stale, vec![5]);
        assert_eq!(window.counts(&item, 12).sums, (11, 8, 10));
        assert_eq!(window.counts(&item, 8).sums, (0, 0, 0));
        assert_eq!(window.tick(10_500), 10);
    }

    #[test]
    fn count_window_parts_round_trip_through_their_attributes() {
        let rest = Segment::new(1_000, 20, 2, 1);
        let tail = Segment::new(1_050, 3, 3, 0);
        assert_eq!(segment_attr(&rest), "g1000");
        assert_eq!(segment_attr(&tail), "g1050f");
        let mut item = Item::new();
        for s in [rest, tail] {
            item.insert(
                segment_attr(&s),
                AttributeValue::N(pack(s.calls, s.failures, s.slow)),
            );
        }
        item.insert(bucket_attr(3), AttributeValue::N(pack(9, 9, 9)));
        item.insert("gx".to_owned(), AttributeValue::N("1".to_owned()));
        item.insert("g12".to_owned(), AttributeValue::S("1".to_owned()));
        let mut parts = segments(&item);
        parts.sort_by_key(|(_, s)| s.at_ms);
        assert_eq!(
            parts,
            vec![("g1000".to_owned(), rest), ("g1050f".to_owned(), tail)]
        );
    }

    #[test]
    fn packed_counts_add_up_and_saturate_per_part() {
        let sum = pack(3, 2, 1).parse::<u128>().unwrap() + pack(4, 4, 0).parse::<u128>().unwrap();
        let mut item = Item::new();
        item.insert(bucket_attr(1), AttributeValue::N(sum.to_string()));
        let window = Window {
            buckets: 1,
            len_ms: 1,
        };
        assert_eq!(window.counts(&item, 1).sums, (7, 6, 1));
        assert_eq!(pack(u64::MAX, 0, 0), (PACK - 1).to_string());
        assert!(pack(PACK as u64, PACK as u64, PACK as u64).len() <= 38);
    }
}
