//! `BreakerConfig` and `ThrottleConfig` as settings: round trips, defaults
//! for what is absent, and every refusal with its message.
#![cfg(feature = "serde")]

use std::time::Duration;

use tower_breaker::config::CallEnd;
use tower_breaker::throttle::ThrottleConfig;
use tower_breaker::BreakerConfig;
use tower_resilience_base::criticality::Criticality;

fn json(config: &BreakerConfig) -> serde_json::Value {
    serde_json::to_value(config).unwrap()
}

#[test]
fn breaker_config_round_trips() {
    for config in [
        BreakerConfig::new(),
        BreakerConfig::new()
            .time_window(30, Duration::from_secs(2))
            .minimum_calls(40)
            .failure_rate(0.25)
            .slow_calls(Duration::from_millis(800), 0.5)
            .slow_call_end(CallEnd::Head)
            .consecutive_failures(7)
            .open_period(Duration::from_millis(1500))
            .max_open_period(Duration::from_secs(90))
            .open_growth(3.0)
            .jitter(0.2)
            .permitted_probes(3)
            .successes_to_close(2)
            .max_half_open_wait(Duration::from_secs(12))
            .ramp_up(Duration::from_secs(4))
            .rejection_event_interval(Duration::from_millis(250)),
    ] {
        let written = serde_json::to_string(&config).unwrap();
        let read: BreakerConfig = serde_json::from_str(&written).unwrap();
        assert_eq!(json(&read), json(&config), "{written}");
    }
}

#[test]
fn an_empty_document_is_the_defaults() {
    let read: BreakerConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(json(&read), json(&BreakerConfig::new()));
    assert_eq!(
        json(&BreakerConfig::new()),
        serde_json::json!({
            "window": { "count": 20 },
            "minimum_calls": 10,
            "failure_rate": "50%",
            "slow_call_end": "body",
            "open_period": "5s",
            "max_open_period": "1m",
            "open_growth": 2.0,
            "jitter": "10%",
            "permitted_probes": 1,
            "successes_to_close": 1,
            "max_half_open_wait": "30s",
            "rejection_event_interval": "1s",
            "coarse_clock": false,
        })
    );
}

#[test]
fn the_human_forms_are_read() {
    let read: BreakerConfig = serde_json::from_str(
        r#"{ "window": { "time": "60s" }, "failure_rate": 0.3, "slow_calls": { "duration": "1.5s", "rate": "80%" } }"#,
    )
    .unwrap();
    assert_eq!(read.get_failure_rate(), 0.3);
    assert_eq!(
        read.get_slow_call_duration(),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(read.get_slow_call_rate(), 0.8);
    assert_eq!(
        read.get_window(),
        tower_breaker::config::WindowKind::Time {
            buckets: 10,
            bucket: Duration::from_secs(6)
        }
    );
}

#[test]
fn every_invalid_value_is_refused_with_its_reason() {
    for (document, message) in [
        (
            r#"{"failure_rate": "150%"}"#,
            "invalid share \"150%\": above 100%",
        ),
        (r#"{"failure_rate": 1.5}"#, "invalid share 1.5: above 100%"),
        (r#"{"jitter": "-5%"}"#, "invalid share \"-5%\": below 0%"),
        (r#"{"open_period": "-1s"}"#, "a duration cannot be negative"),
        (r#"{"open_period": 5}"#, "a number needs a unit"),
        (r#"{"open_period": "0s"}"#, "open_period must be above 0s"),
        (
            r#"{"open_period": "2m"}"#,
            "max_open_period (1m) is shorter than open_period (2m)",
        ),
        (
            r#"{"minimum_calls": 0}"#,
            "minimum_calls must be at least 1, got 0",
        ),
        (r#"{"minimum_calls": -3}"#, "invalid value: integer `-3`"),
        (
            r#"{"permitted_probes": 0}"#,
            "permitted_probes must be at least 1",
        ),
        (
            r#"{"successes_to_close": 0}"#,
            "successes_to_close must be at least 1",
        ),
        (
            r#"{"consecutive_failures": 0}"#,
            "consecutive_failures must be at least 1",
        ),
        (
            r#"{"open_growth": 0.5}"#,
            "open_growth must be at least 1.0",
        ),
        (
            r#"{"window": {"count": 0}}"#,
            "window.count must be at least 1, got 0",
        ),
        (
            r#"{"window": {"count": 20000}}"#,
            "window.count must be at most 16383",
        ),
        (
            r#"{"window": {"count": 5, "time": "1s"}}"#,
            "either `count` or `time`, not both",
        ),
        (r#"{"window": {}}"#, "give `count` (calls) or `time`"),
        (
            r#"{"window": {"time": "10s", "buckets": 0}}"#,
            "window.buckets must be within 1..=3600",
        ),
        (
            r#"{"slow_calls": {"duration": "0s", "rate": "50%"}}"#,
            "slow_calls.duration must be above 0s",
        ),
        (
            r#"{"slow_calls": {"duration": "1s"}}"#,
            "missing field `rate`",
        ),
        (
            r#"{"slow_call_end": "tail"}"#,
            "unknown variant `tail`, expected `head` or `body`",
        ),
        (
            r#"{"open_perod": "2s"}"#,
            "unknown field `open_perod`, expected one of",
        ),
        (r#"{"window": {"size": 5}}"#, "unknown field `size`"),
    ] {
        let err = serde_json::from_str::<BreakerConfig>(document)
            .unwrap_err()
            .to_string();
        assert!(err.contains(message), "{document}: {err}");
    }
}

#[test]
fn throttle_config_round_trips_and_refuses() {
    let config = ThrottleConfig::new()
        .window(Duration::from_secs(30))
        .k(3.0)
        .criticality_k(Criticality::Sheddable, 1.5)
        .max_rejection(0.8)
        .min_requests(20);
    let written = serde_json::to_value(&config).unwrap();
    assert_eq!(
        written,
        serde_json::json!({
            "window": "30s", "k": 3.0, "criticality_k": { "sheddable": 1.5 },
            "max_rejection": "80%", "min_requests": 20,
        })
    );
    let read: ThrottleConfig = serde_json::from_value(written.clone()).unwrap();
    assert_eq!(serde_json::to_value(&read).unwrap(), written);
    assert_eq!(read.get_k(Criticality::Sheddable), 1.5);

    for (document, message) in [
        (r#"{"k": 0.5}"#, "throttle K"),
        (r#"{"window": "1ms"}"#, "window"),
        (r#"{"max_rejection": "120%"}"#, "above 100%"),
        (
            r#"{"criticality_k": {"sheddable": 3.0}}"#,
            "is above the K of sheddable-plus",
        ),
        (
            r#"{"criticality_k": {"batch": 1.0}}"#,
            "unknown field `batch`",
        ),
        (r#"{"K": 2}"#, "unknown field `K`"),
    ] {
        let err = serde_json::from_str::<ThrottleConfig>(document)
            .unwrap_err()
            .to_string();
        assert!(err.contains(message), "{document}: {err}");
    }
}
