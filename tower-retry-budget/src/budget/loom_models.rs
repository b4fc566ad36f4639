//! Loom models of the retry budget's buckets: racing deposits, withdrawals
//! and refunds, in one bucket and across a bucket boundary. Run with
//! `scripts/loom`.
//!
//! Every loom thread runs on one OS thread, so all of them count requests
//! on the same stripe: the contended case of `bump`.

use std::sync::Arc;

use loom::thread;
use tower_resilience_base::loom_sync::model;

use super::*;

/// A budget of one retry per request (no floor) over ten buckets of 1 s.
fn budget() -> Arc<RetryBudget> {
    Arc::new(RetryBudget::build(Some(PPM), 0, Duration::from_secs(10)))
}

/// The instant at the start of bucket `index`.
fn at(b: &RetryBudget, index: u64) -> Instant {
    b.start + Duration::from_nanos(b.bucket_nanos * index)
}

/// The retries the ring holds for the window that ends at bucket `index`.
fn retries_in_window(b: &RetryBudget, index: u64) -> u64 {
    window_sum(&b.retries, index, b.layout)
}

/// One request, so one retry of room; three withdrawals race in its
/// bucket. Exactly one is granted (never more than the allowance, and the
/// room is not lost either), and the counters and the ring agree with the
/// answers: one retry paid for, two refused.
#[test]
fn racing_withdrawals_in_one_bucket_grant_exactly_the_allowance() {
    model(|| {
        let b = budget();
        b.deposit_at(at(&b, 0));
        let calls: Vec<_> = (0..3)
            .map(|_| {
                let b = b.clone();
                thread::spawn(move || b.withdraw_at(at(&b, 0)))
            })
            .collect();
        let granted = calls
            .into_iter()
            .map(|call| call.join().unwrap())
            .filter(|&granted| granted)
            .count() as u64;
        assert_eq!(granted, 1);
        let counters = b.counters();
        assert_eq!((counters.retries, counters.refused_by_budget), (1, 2));
        assert_eq!(retries_in_window(&b, 0), 1);
    });
}

/// One request in bucket 0, so one retry of room in every window that
/// holds it; two withdrawals race on either side of the boundary between
/// buckets 0 and 1 (two threads whose clocks read either side of it). At
/// most one is granted (both may be refused: the documented cost of the
/// race), and every claim that was not granted was given back: the ring
/// holds exactly the retries granted.
#[test]
fn withdrawals_across_a_bucket_boundary_never_exceed_the_allowance() {
    model(|| {
        let b = budget();
        b.deposit_at(at(&b, 0));
        let calls: Vec<_> = [0, 1]
            .into_iter()
            .map(|index| {
                let b = b.clone();
                thread::spawn(move || b.withdraw_at(at(&b, index)))
            })
            .collect();
        let granted = calls
            .into_iter()
            .map(|call| call.join().unwrap())
            .filter(|&granted| granted)
            .count() as u64;
        assert!(granted <= 1, "{granted} retries granted for one request");
        assert_eq!(b.counters().retries, granted);
        assert_eq!(retries_in_window(&b, 1), granted, "a claim was left behind");
    });
}

/// The requests the stripes hold for the window that ends at bucket
/// `index`.
fn requests_in_window(b: &RetryBudget, index: u64) -> u64 {
    b.stripes
        .iter()
        .map(|s| window_sum(&s.buckets, index, b.layout))
        .sum()
}

/// Deposits in the bucket of `index` from one thread each, racing, after
/// three in bucket 0 (the same slot of the ring, one lap earlier).
fn race_deposits(indices: [u64; 2]) -> Arc<RetryBudget> {
    let b = budget();
    for _ in 0..3 {
        b.deposit_at(at(&b, 0));
    }
    let deposits: Vec<_> = indices
        .into_iter()
        .map(|index| {
            let b = b.clone();
            thread::spawn(move || b.deposit_at(at(&b, index)))
        })
        .collect();
    for deposit in deposits {
        deposit.join().unwrap();
    }
    assert_eq!(
        b.counters().requests,
        5,
        "a request missing from the totals"
    );
    b
}

/// A bucket of the previous lap holds three requests; two deposits of the
/// new lap race to recycle it. The window then holds exactly the new lap's
/// two requests: none of the old lap's, and none lost to a racing reset.
#[test]
fn racing_deposits_recycle_a_stale_bucket_without_losing_a_request() {
    model(|| {
        let b = race_deposits([10, 10]);
        assert_eq!(requests_in_window(&b, 10), 2);
    });
}

/// A deposit of the new lap races with one whose clock reading is a whole
/// lap late (the same slot of the ring). The late one lands in its own
/// bucket (then recycled away) or, if the slot was already recycled, in
/// the new one (late rather than lost); it never wipes the new lap's
/// request, nor brings back the old lap's.
#[test]
fn a_late_deposit_never_wipes_a_newer_bucket() {
    model(|| {
        let b = race_deposits([10, 0]);
        let requests = requests_in_window(&b, 10);
        assert!(
            (1..=2).contains(&requests),
            "the window of bucket 10: {requests}"
        );
    });
}

/// Two requests, one retry granted; its refund races with a second
/// withdrawal on the same bucket, which always fits. The refund gives back
/// exactly one retry, and never the one the racing withdrawal claimed:
/// afterwards the ring holds one retry, as do the paid retries, and one
/// refund is counted (no retry lost or made up).
#[test]
fn a_refund_racing_a_withdrawal_gives_back_exactly_one_retry() {
    model(|| {
        let b = budget();
        b.deposit_at(at(&b, 0));
        b.deposit_at(at(&b, 0));
        assert!(b.withdraw_at(at(&b, 0)));
        let refund = {
            let b = b.clone();
            thread::spawn(move || b.refund_at(at(&b, 0)))
        };
        let other = {
            let b = b.clone();
            thread::spawn(move || b.withdraw_at(at(&b, 0)))
        };
        refund.join().unwrap();
        assert!(other.join().unwrap(), "two requests allow two retries");
        let counters = b.counters();
        assert_eq!((counters.retries, counters.refunded), (1, 1));
        assert_eq!(retries_in_window(&b, 0), 1);
    });
}
