//! What the state machine tells: its `tracing` events (`circuit_opened`,
//! `circuit_half_open`, `circuit_closed`, `circuit_mode_changed` and the
//! rate-limited `circuit_rejected`), with their fields, and what a
//! listener hears of each transition.

mod support;

use std::sync::{Arc, Mutex};

use support::*;
use tokio::time::Instant;
use tower_breaker::snapshot::Cause;
use tower_breaker::{Breaker, Mode, Outcome, State, Transition};

fn event(message: &str, fields: &[(&str, &str)]) -> Event {
    let fields = fields
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    (message.to_owned(), fields)
}

/// Closed for 3 s, then two failures in a window of four: opened, with
/// the rates, the counts, how long it was closed and how long it stays
/// open; 5 s later half-open, then closed by the probe, each with its
/// figures; a mode switch is an event of its own.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_transition_is_an_event_with_its_figures() {
    let events = Events::default();
    let _guard = resilience_testkit::set_default(events.clone());
    let b = Breaker::with_config(
        "deps",
        config().count_window(4).minimum_calls(4).failure_rate(0.5),
    );
    advance(secs(3)).await;
    record(&b, Outcome::Success, 2);
    record(&b, Outcome::Failure, 2);
    assert_eq!(
        events.take(),
        [event(
            "circuit_opened",
            &[
                ("breaker", "deps"),
                ("cause", "FailureRate"),
                ("failure_rate", "0.5"),
                ("slow_rate", "0.0"),
                ("calls", "4"),
                ("failures", "2"),
                ("slow", "0"),
                ("after_ms", "3000"),
                ("open_for_ms", "5000"),
                ("times_opened", "1"),
            ],
        )]
    );

    advance(secs(5)).await;
    b.try_acquire().unwrap().record(Outcome::Success);
    assert_eq!(
        events.take(),
        [
            event(
                "circuit_half_open",
                &[
                    ("breaker", "deps"),
                    ("cause", "OpenPeriodOver"),
                    ("open_ms", "5000"),
                    ("times_opened", "1"),
                    ("rejected_total", "0"),
                ],
            ),
            event(
                "circuit_closed",
                &[
                    ("breaker", "deps"),
                    ("cause", "ProbesSucceeded"),
                    ("probes_succeeded", "1"),
                    ("after_ms", "0"),
                    ("times_opened", "1"),
                    ("rejected_total", "0"),
                ],
            ),
        ]
    );

    b.set_mode(Mode::ForcedOpen);
    assert_eq!(
        events.take(),
        [event(
            "circuit_mode_changed",
            &[("breaker", "deps"), ("mode", "ForcedOpen")]
        )]
    );
}

/// `circuit_rejected` is told at most once per `rejection_event_interval`
/// per breaker, with the total of rejections so far: at `t` and at
/// `t + interval`, not at `t + interval - 1 ms`.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn rejections_are_told_at_most_once_per_interval_with_their_total() {
    let events = Events::default();
    let _guard = resilience_testkit::set_default(events.clone());
    let b = Breaker::with_config(
        "deps",
        config()
            .count_window(1)
            .minimum_calls(1)
            .rejection_event_interval(secs(1)),
    );
    advance(secs(2)).await;
    record(&b, Outcome::Failure, 1);
    assert_eq!(events.take().len(), 1, "opened");
    let reject = |n: usize| {
        for _ in 0..n {
            assert!(b.try_acquire().is_err());
        }
    };
    let rejected = |total: &str| {
        event(
            "circuit_rejected",
            &[("breaker", "deps"), ("rejected_total", total)],
        )
    };

    reject(3);
    assert_eq!(events.take(), [rejected("1")]);
    advance(ms(999)).await;
    reject(1);
    assert_eq!(events.take(), []);
    advance(ms(1)).await;
    reject(2);
    assert_eq!(events.take(), [rejected("5")]);
}

/// A listener hears each transition with its cause, its window, how long
/// the circuit stays open and when it happened.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_listener_hears_when_why_and_for_how_long() {
    let start = Instant::now();
    let heard = Arc::new(Mutex::new(Vec::<Transition>::new()));
    let h = heard.clone();
    let b = Breaker::with_config(
        "deps",
        config()
            .count_window(4)
            .minimum_calls(4)
            .failure_rate(0.5)
            .listener(move |t: &Transition| h.lock().unwrap().push(t.clone())),
    );
    advance(secs(3)).await;
    record(&b, Outcome::Success, 2);
    record(&b, Outcome::Failure, 2);
    advance(secs(5)).await;
    b.try_acquire().unwrap().record(Outcome::Success);

    let heard = heard.lock().unwrap();
    let summary: Vec<_> = heard
        .iter()
        .map(|t| {
            let w = t.window;
            (t.from, t.to, t.cause, (w.calls, w.failures, w.slow))
        })
        .collect();
    assert_eq!(
        summary,
        [
            (State::Closed, State::Open, Cause::FailureRate, (4, 2, 0)),
            (
                State::Open,
                State::HalfOpen,
                Cause::OpenPeriodOver,
                (0, 0, 0)
            ),
            (
                State::HalfOpen,
                State::Closed,
                Cause::ProbesSucceeded,
                (1, 0, 0)
            ),
        ]
    );
    let when: Vec<_> = heard.iter().map(|t| (t.at - start, t.open_for)).collect();
    assert_eq!(
        when,
        [(secs(3), Some(secs(5))), (secs(8), None), (secs(8), None)]
    );
    assert!(heard
        .iter()
        .all(|t| &*t.name == "deps" && t.mode == Mode::Automatic));
}
