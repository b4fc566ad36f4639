//! The clauses of the store contract, one `async fn` each: `store` is the
//! store under test, `name` a breaker name no other clause uses. Each
//! panics, with what the store did, when the store breaks its clause.
//!
//! The contract, as [`Store`]'s documentation states it:
//!
//! - **Decisions** ([`Store::read`]): a name never written is
//!   [`Decision::Missing`]; an opening is [`Decision::Open`] with the time
//!   left until its T, then [`Decision::Expired`] once T has passed; a
//!   close is [`Decision::Closed`].
//! - **Opening** ([`Store::try_open`]): T = now + the period, unless the
//!   circuit is open until later: concurrent openers adopt the first T.
//! - **The election** ([`Store::try_acquire_probe`]): before T, every
//!   candidate loses with the time left; once T has passed exactly one
//!   wins, with a token and a lease during which every other candidate
//!   loses, even past T.
//! - **Leases** ([`Store::renew_probe`], where
//!   [`Store::renews_leases`]): the winner's renewals keep other
//!   candidates off; a lease no longer renewed lapses and is taken over,
//!   and its old holder's renewals are fenced.
//! - **Fencing**: only the winner's token closes ([`Store::close`]) or
//!   re-opens ([`Store::reopen`]); after a close, elections report
//!   [`Election::Closed`] and a stale re-open writes nothing.
//! - **Re-opens**: a failed probe re-opens for at least its period and
//!   counts one more re-open in a row, which the next winner's token
//!   carries; the time left it answers is the one the next read tells.
//! - **The fleet's window** ([`Store::report`]): reports add up within the
//!   rule's buckets and open the circuit when the rule breaks; reports
//!   while open are not evidence; an opening, an election and a close each
//!   start the window empty, so evidence from before them never counts
//!   after the circuit closes again. With a
//!   [`count_window`](FleetRule::count_window), the window is the fleet's
//!   newest calls, each report's failures in a row placed after its other
//!   calls ([`Report::segments`]): healthy history never dilutes a burst
//!   of failures.
//! - **The fleet's retry budget** ([`Store::claim_retry`]): racing claims
//!   are granted up to the larger of the floor and the credit that reports
//!   carried ([`Report::credit`]), never more; retries a report returns
//!   ([`Report::returned`]) can be claimed again.
//! - **The clock** is the store's own (its server's, or the process's for
//!   a store without one); every duration in and out is relative to it.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::sleep;
use tower_breaker::store::{BudgetRule, Decision, Election, FleetRule, ProbeToken, Report, Store};

/// The period of a clause's openings.
const PERIOD: Duration = Duration::from_millis(400);
/// A period short enough to wait out.
const SHORT: Duration = Duration::from_millis(200);
/// What the clauses allow for a store's round trips and timers.
const SLACK: Duration = Duration::from_millis(150);

/// Opens `name` for [`SHORT`] and waits until its T has passed.
async fn open_and_wait(store: &dyn Store, name: &str) {
    store.try_open(name, SHORT).await.expect("try_open");
    sleep(SHORT + SLACK).await;
}

/// Wins the election of `name` (its T must have passed), for `open_for`
/// with a lease of `lease`.
async fn win(store: &dyn Store, name: &str, open_for: Duration, lease: Duration) -> ProbeToken {
    match store.try_acquire_probe(name, open_for, lease).await {
        Ok(Election::Won(token)) => token,
        other => panic!("{name}: the election should be won, got {other:?}"),
    }
}

fn open_left(decision: Decision) -> Duration {
    match decision {
        Decision::Open { remaining } => remaining,
        other => panic!("the circuit should be open, got {other:?}"),
    }
}

/// A read of a name never written is [`Decision::Missing`].
pub async fn a_name_never_written_reads_missing(store: &Arc<dyn Store>, name: &str) {
    assert_eq!(store.read(name).await.expect("read"), Decision::Missing);
}

/// [`Store::try_open`] sets T = now + the period; a second opener, even
/// with a longer period, adopts the first T and learns the time left.
pub async fn an_opening_lasts_its_period_and_concurrent_openers_adopt_it(
    store: &Arc<dyn Store>,
    name: &str,
) {
    let first = store.try_open(name, PERIOD).await.expect("try_open");
    assert!(
        first <= PERIOD && first + SLACK > PERIOD,
        "the first opener gets its period: {first:?}"
    );
    let second = store.try_open(name, PERIOD * 10).await.expect("try_open");
    assert!(
        second <= first,
        "T is not pushed forward: {second:?} > {first:?}"
    );
    let read = open_left(store.read(name).await.expect("read"));
    assert!(read <= second && read > Duration::ZERO, "{read:?}");
}

/// Once T has passed, the opening reads [`Decision::Expired`].
pub async fn an_opening_whose_period_passed_reads_expired(store: &Arc<dyn Store>, name: &str) {
    open_and_wait(&**store, name).await;
    assert_eq!(store.read(name).await.expect("read"), Decision::Expired);
}

/// Before T, every candidate loses, with the time left until T.
pub async fn an_election_before_t_is_lost_with_the_time_left(store: &Arc<dyn Store>, name: &str) {
    store.try_open(name, PERIOD).await.expect("try_open");
    match store.try_acquire_probe(name, PERIOD, PERIOD).await {
        Ok(Election::Lost { remaining }) => assert!(
            remaining <= PERIOD && remaining > Duration::ZERO,
            "{remaining:?}"
        ),
        other => panic!("a candidate before T loses: {other:?}"),
    }
}

/// Once T has passed, exactly one of many concurrent candidates wins.
pub async fn one_caller_of_many_wins_the_election_once_t_has_passed(
    store: &Arc<dyn Store>,
    name: &str,
) {
    open_and_wait(&**store, name).await;
    let mut candidates = JoinSet::new();
    for _ in 0..16 {
        let (store, name) = (Arc::clone(store), name.to_owned());
        candidates.spawn(async move { store.try_acquire_probe(&name, PERIOD, PERIOD).await });
    }
    let (mut won, mut lost) = (0, 0);
    while let Some(result) = candidates.join_next().await {
        match result
            .expect("a candidate task")
            .expect("try_acquire_probe")
        {
            Election::Won(_) => won += 1,
            Election::Lost { remaining } | Election::Probing { remaining, .. } => {
                assert!(remaining <= PERIOD, "{remaining:?}");
                lost += 1;
            }
            other => panic!("nobody closed the circuit: {other:?}"),
        }
    }
    assert_eq!((won, lost), (1, 15), "exactly one winner");
}

/// The winner's lease holds off every other candidate, even past the T
/// the election wrote.
pub async fn the_winners_lease_holds_off_other_candidates_past_t(
    store: &Arc<dyn Store>,
    name: &str,
) {
    open_and_wait(&**store, name).await;
    let lease = Duration::from_secs(5);
    win(&**store, name, Duration::from_millis(100), lease).await;
    sleep(Duration::from_millis(100) + SLACK).await;
    match store.try_acquire_probe(name, PERIOD, lease).await {
        Ok(Election::Probing {
            remaining,
            lease: left,
        }) => {
            assert!(remaining <= lease, "{remaining:?}");
            assert!(left <= lease && left > Duration::ZERO, "{left:?}");
        }
        other => panic!("the lease still runs: {other:?}"),
    }
}

/// While the winner probes, a read says so ([`Decision::Probing`]): T the
/// election wrote, and the time left of the lease; a candidate loses the
/// same way. Once the probe ends, the reads say what it decided: open
/// (re-opened) without a prober.
pub async fn a_read_during_a_probe_says_probing_with_its_lease(store: &Arc<dyn Store>, name: &str) {
    open_and_wait(&**store, name).await;
    let (period, lease) = (Duration::from_secs(10), Duration::from_secs(2));
    let token = win(&**store, name, period, lease).await;
    match store.read(name).await.expect("read") {
        Decision::Probing {
            remaining,
            lease: left,
        } => {
            assert!(remaining <= period && remaining > lease, "T: {remaining:?}");
            assert!(left <= lease && left > lease - SLACK * 3, "lease: {left:?}");
        }
        other => panic!("the winner probes: {other:?}"),
    }
    match store.try_acquire_probe(name, period, lease).await {
        Ok(Election::Probing { lease: left, .. }) => assert!(left <= lease, "{left:?}"),
        other => panic!("the winner probes: {other:?}"),
    }
    store.reopen(name, token, period).await.expect("reopen");
    assert!(
        matches!(store.read(name).await.expect("read"), Decision::Open { .. }),
        "a failed probe ends the lease"
    );
}

/// On a store that [renews leases](Store::renews_leases): the winner's
/// renewals keep its lease running well past its first end, and every
/// other candidate loses meanwhile; a stranger's token renews nothing;
/// once the renewals stop, the lease lapses, a candidate wins, and the old
/// winner's next renewal is fenced. (A store that does not renew skips
/// this clause: its leases cover the whole probe.)
pub async fn a_renewed_lease_holds_off_candidates_and_a_lapsed_one_is_fenced(
    store: &Arc<dyn Store>,
    name: &str,
) {
    if !store.renews_leases() {
        return;
    }
    open_and_wait(&**store, name).await;
    let lease = PERIOD;
    let mut token = win(&**store, name, Duration::from_millis(100), lease).await;
    let stranger = ProbeToken::new(token.get() ^ 1);
    assert_eq!(
        store
            .renew_probe(name, stranger, lease)
            .await
            .expect("renew"),
        None,
        "a stranger's token"
    );
    // Three renewals 250 ms apart: 750 ms, past the 400 ms lease.
    for round in 0..3 {
        sleep(Duration::from_millis(250)).await;
        token = match store.renew_probe(name, token, lease).await {
            Ok(Some(next)) => next,
            other => panic!("renewal {round}: the winner renews, got {other:?}"),
        };
        match store.try_acquire_probe(name, PERIOD, lease).await {
            Ok(Election::Probing { .. }) => {}
            other => panic!("renewal {round}: the lease still runs, got {other:?}"),
        }
    }
    sleep(lease + SLACK).await;
    // A store that tolerates clock skew may add its margin once more.
    let winner = loop {
        match store.try_acquire_probe(name, PERIOD, lease).await {
            Ok(Election::Won(next)) => break next,
            Ok(
                Election::Lost { remaining }
                | Election::Probing {
                    lease: remaining, ..
                },
            ) if remaining <= Duration::from_secs(2) => {
                sleep(remaining + Duration::from_millis(10)).await;
            }
            other => panic!("the lapsed lease is taken over, got {other:?}"),
        }
    };
    assert_eq!(
        store.renew_probe(name, token, lease).await.expect("renew"),
        None,
        "the old winner is fenced"
    );
    assert!(store.close(name, winner).await.expect("close"));
}

/// A winner that gives its probe back ([`Store::release_probe`]) lets
/// the next candidate win at once, with the count of re-opens kept; a
/// stranger's token gives nothing back, and the old winner is fenced from
/// then on. (The trait's default gives nothing back, and fails this
/// clause: the fleet then waits for the election's T.)
pub async fn a_probe_given_back_is_won_by_the_next_candidate_at_once(
    store: &Arc<dyn Store>,
    name: &str,
) {
    open_and_wait(&**store, name).await;
    let (period, lease) = (Duration::from_secs(10), Duration::from_secs(10));
    let token = win(&**store, name, period, lease).await;
    let stranger = ProbeToken::new(token.get() ^ 1);
    assert!(
        !store
            .release_probe(name, stranger)
            .await
            .expect("release_probe"),
        "a stranger's token"
    );
    assert!(
        store
            .release_probe(name, token)
            .await
            .expect("release_probe"),
        "the winner's token gives the probe back"
    );
    let next = win(&**store, name, period, lease).await;
    assert_eq!(next.reopens(), token.reopens(), "no probe failed");
    assert!(
        !store
            .release_probe(name, token)
            .await
            .expect("release_probe"),
        "the old winner is fenced"
    );
    assert!(!store.close(name, token).await.expect("close"), "fenced");
    assert!(store.close(name, next).await.expect("close"));
}

/// Only the winner's token closes the circuit, once.
pub async fn the_winner_closes_and_a_stranger_cannot(store: &Arc<dyn Store>, name: &str) {
    open_and_wait(&**store, name).await;
    let token = win(&**store, name, PERIOD, PERIOD).await;
    let stranger = ProbeToken::new(token.get() ^ 1);
    assert!(
        !store.close(name, stranger).await.expect("close"),
        "a stranger's token"
    );
    assert!(
        store.close(name, token).await.expect("close"),
        "the winner's token"
    );
    assert_eq!(store.read(name).await.expect("read"), Decision::Closed);
    assert!(
        !store.close(name, token).await.expect("close"),
        "closed already"
    );
}

/// After a close, candidates learn the circuit is closed, and a stale
/// re-open writes nothing.
pub async fn a_closed_circuit_refuses_elections_and_a_stale_reopen(
    store: &Arc<dyn Store>,
    name: &str,
) {
    open_and_wait(&**store, name).await;
    let token = win(&**store, name, PERIOD, PERIOD).await;
    assert!(store.close(name, token).await.expect("close"));
    assert!(matches!(
        store.try_acquire_probe(name, PERIOD, PERIOD).await,
        Ok(Election::Closed)
    ));
    let left = store.reopen(name, token, PERIOD).await.expect("reopen");
    assert_eq!(left, Duration::ZERO, "fenced: the fleet closed since");
    assert_eq!(store.read(name).await.expect("read"), Decision::Closed);
}

/// A failed probe re-opens for its period; a stale re-open of the same
/// election writes nothing; the next winner's token counts the re-open.
pub async fn a_failed_probe_reopens_and_the_next_prober_learns_it(
    store: &Arc<dyn Store>,
    name: &str,
) {
    open_and_wait(&**store, name).await;
    let token = win(&**store, name, SHORT, PERIOD).await;
    assert_eq!(token.reopens(), 0);
    let left = store.reopen(name, token, SHORT).await.expect("reopen");
    assert!(left <= SHORT && left + SLACK > SHORT, "{left:?}");
    let read = open_left(store.read(name).await.expect("read"));
    assert!(read <= left, "{read:?} > {left:?}");
    // The same token again: the record holds a fresh one now.
    let again = store
        .reopen(name, token, PERIOD * 10)
        .await
        .expect("reopen");
    assert!(again <= left, "a stale re-open writes nothing: {again:?}");
    sleep(SHORT + SLACK).await;
    let next = win(&**store, name, SHORT, PERIOD).await;
    assert_eq!(next.reopens(), 1, "one re-open in a row");
}

/// A re-open answers the time left until the effective T, which may be
/// the election's (later than now + the re-open's period), and the next
/// read tells the same time left, not less.
pub async fn a_reopen_and_the_next_read_agree_on_the_time_left(store: &Arc<dyn Store>, name: &str) {
    open_and_wait(&**store, name).await;
    // The election's T is far beyond the re-open's period, and the
    // margins are wide: the round trips between these calls may take long
    // on a busy machine, but never seconds.
    let election = Duration::from_secs(10);
    let margin = Duration::from_secs(2);
    let token = win(&**store, name, election, Duration::from_millis(100)).await;
    let left = store.reopen(name, token, SHORT).await.expect("reopen");
    assert!(
        left > election - margin,
        "never earlier than the election's T: {left:?}"
    );
    let read = open_left(store.read(name).await.expect("read"));
    assert!(
        read <= left && read + margin > left,
        "the read tells the time left the re-open answered: {read:?} vs {left:?}"
    );
}

/// The fleet's rule: 10 buckets of 1 s, judged from 10 calls, open at 50%.
fn rule() -> FleetRule {
    FleetRule::new(10, Duration::from_secs(1), PERIOD).with_minimum_calls(10)
}

/// Reports add up; the one that breaks the rule opens the circuit.
pub async fn reports_add_up_and_open_the_circuit_when_the_rule_breaks(
    store: &Arc<dyn Store>,
    name: &str,
) {
    let decision = store
        .report(name, Report::new(6, 2, 0), rule())
        .await
        .expect("report");
    assert!(
        matches!(decision, Decision::Missing | Decision::Closed),
        "6 calls: below the minimum, {decision:?}"
    );
    let decision = store
        .report(name, Report::new(4, 4, 0), rule())
        .await
        .expect("report");
    let left = open_left(decision);
    assert!(left <= PERIOD, "{left:?}");
    assert!(matches!(
        store.read(name).await.expect("read"),
        Decision::Open { .. }
    ));
}

/// Reports while the circuit is open are not evidence for the next closed
/// period.
pub async fn reports_while_open_are_not_evidence(store: &Arc<dyn Store>, name: &str) {
    store.try_open(name, SHORT).await.expect("try_open");
    let decision = store
        .report(name, Report::new(10, 10, 0), rule())
        .await
        .expect("report");
    assert!(matches!(decision, Decision::Open { .. }), "{decision:?}");
    sleep(SHORT + SLACK).await;
    let token = win(&**store, name, SHORT, PERIOD).await;
    assert!(store.close(name, token).await.expect("close"));
    let decision = store
        .report(name, Report::new(1, 1, 0), rule())
        .await
        .expect("report");
    assert_eq!(
        decision,
        Decision::Closed,
        "the 10 failures reported while open do not count"
    );
}

/// Evidence reported before an election (on a record that held only the
/// window, lost while the fleet knew the circuit open) never counts after
/// the probe closes the circuit: the election and the close start the
/// window empty, as an opening does.
pub async fn evidence_from_before_an_election_never_counts_after_the_close(
    store: &Arc<dyn Store>,
    name: &str,
) {
    let decision = store
        .report(name, Report::new(8, 8, 0), rule())
        .await
        .expect("report");
    assert!(
        matches!(decision, Decision::Missing | Decision::Closed),
        "8 calls: below the minimum, {decision:?}"
    );
    // A process that knew the circuit open elects itself on the record.
    let token = win(&**store, name, SHORT, PERIOD).await;
    assert!(store.close(name, token).await.expect("close"));
    let decision = store
        .report(name, Report::new(2, 0, 0), rule())
        .await
        .expect("report");
    assert_eq!(
        decision,
        Decision::Closed,
        "the 8 failures from before the election do not count with these 2 calls"
    );
}

/// With a count window, the fleet judges its newest calls: a burst of
/// failures after a long healthy history breaks the rule as soon as it
/// fills half the window, and a report's failures in a row count as newer
/// than its own healthy calls (and everything reported before them).
pub async fn a_count_window_judges_the_newest_calls_whatever_came_before(
    store: &Arc<dyn Store>,
    name: &str,
) {
    // The fleet's newest 20 calls, judged from 10, open at 50%.
    let rule = rule().with_count_window(20);
    let decision = store
        .report(name, Report::new(3_000, 0, 0), rule)
        .await
        .expect("report");
    assert!(
        matches!(decision, Decision::Missing | Decision::Closed),
        "3,000 healthy calls: {decision:?}"
    );
    // Nine processes' first failures: 9 of the newest 20 (45%).
    for i in 0..9 {
        let decision = store
            .report(
                name,
                Report::new(1, 1, 0).with_tail(1, Duration::ZERO),
                rule,
            )
            .await
            .expect("report");
        assert!(
            matches!(decision, Decision::Missing | Decision::Closed),
            "failure {} of 9: 45% at most of the newest 20 calls, {decision:?}",
            i + 1
        );
    }
    // A tenth process: 20 healthy calls, then (the last 2 s, newer than
    // everything else it reports) one failure. Placed by its tail, the
    // newest 20 calls hold 10 failures; as one part at the report's time,
    // they would hold at most one.
    let decision = store
        .report(
            name,
            Report::new(21, 1, 0).with_tail(1, Duration::from_secs(2)),
            rule,
        )
        .await
        .expect("report");
    let left = open_left(decision);
    assert!(left <= PERIOD, "{left:?}");
    assert!(matches!(
        store.read(name).await.expect("read"),
        Decision::Open { .. }
    ));
}

/// Sends `report` (credit for the retry budget `budget`) under a rule that
/// never opens the circuit.
async fn report_credit(store: &Arc<dyn Store>, name: &str, report: Report, budget: BudgetRule) {
    let rule = rule().with_minimum_calls(1_000).with_budget(budget);
    store.report(name, report, rule).await.expect("report");
}

/// Racing claims of the fleet's retry budget are granted up to the larger
/// of the floor and the reports' credit, never more; returned retries can
/// be claimed again.
pub async fn racing_retry_claims_grant_the_larger_of_floor_and_credit(
    store: &Arc<dyn Store>,
    name: &str,
) {
    // Epochs of a day: a clause never straddles two (but at midnight).
    let budget = BudgetRule::new(Duration::from_secs(86_400), 2);
    let racing = |n: usize| {
        let mut set = JoinSet::new();
        for _ in 0..n {
            let store = Arc::clone(store);
            let name = name.to_owned();
            set.spawn(async move { store.claim_retry(&name, budget).await.expect("claim") });
        }
        set
    };
    let granted = racing(4).join_all().await;
    assert_eq!(
        granted.iter().filter(|g| **g).count(),
        2,
        "the floor alone: {granted:?}"
    );
    // 50 requests at 10%: five retries, the larger of five and two.
    let report = Report::new(50, 0, 0).with_credit(5_000_000);
    report_credit(store, name, report, budget).await;
    let granted = racing(8).join_all().await;
    assert_eq!(
        granted.iter().filter(|g| **g).count(),
        3,
        "five in all: {granted:?}"
    );
    // One granted retry was not sent: it comes back.
    let report = Report::new(1, 0, 0).with_returned(1);
    report_credit(store, name, report, budget).await;
    assert!(store.claim_retry(name, budget).await.expect("claim"));
    assert!(!store.claim_retry(name, budget).await.expect("claim"));
}

/// Credit counts in the sliding window only: a window after the report,
/// at most what was earned is granted; two windows after it, nothing.
pub async fn retry_credit_leaves_the_window_after_it(store: &Arc<dyn Store>, name: &str) {
    let budget = BudgetRule::new(Duration::from_millis(500), 0);
    let report = Report::new(100, 0, 0).with_credit(10_000_000);
    report_credit(store, name, report, budget).await;
    sleep(Duration::from_millis(500)).await;
    let mut granted = 0;
    while store.claim_retry(name, budget).await.expect("claim") {
        granted += 1;
        assert!(granted <= 10, "more than the ten retries earned");
    }
    sleep(Duration::from_millis(1_000)).await;
    assert!(
        !store.claim_retry(name, budget).await.expect("claim"),
        "two windows later, no credit is left"
    );
}
