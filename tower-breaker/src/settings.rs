//! [`BreakerConfig`] and [`ThrottleConfig`] as settings (feature `serde`).
//!
//! Both deserialize from any format serde reads, with durations and
//! shares in a human form ([`tower_resilience_base::settings`]), every
//! setting optional (absent means the default), unknown keys refused and
//! out-of-range values refused with a message naming the setting (where
//! the setters would clamp them: a file that says `failure_rate = "150%"`
//! is a mistake to report, not a value to guess at). Both serialize every
//! setting, so a configuration written out reads back the same.
//!
//! ```toml
//! window = { count = 50 }            # or { time = "60s", buckets = 60 }
//! minimum_calls = 20
//! failure_rate = "25%"
//! slow_calls = { duration = "800ms", rate = "50%" }
//! slow_call_end = "body"             # or "head"
//! consecutive_failures = 5
//! open_period = "2s"
//! max_open_period = "30s"
//! open_growth = 2.0
//! jitter = "10%"
//! permitted_probes = 2
//! successes_to_close = 2
//! max_half_open_wait = "30s"
//! ramp_up = "5s"
//! rejection_event_interval = "1s"
//! coarse_clock = false
//! ```
//!
//! What is code, not settings, stays in code: the fleet's store (a
//! connection) and the random source and listener. A file read into a
//! configuration that code then completes:
//!
//! ```
//! use tower_breaker::BreakerConfig;
//!
//! let config: BreakerConfig = serde_json::from_str(
//!     r#"{ "failure_rate": "25%", "open_period": "2s", "window": { "count": 50 } }"#,
//! )?;
//! assert_eq!(config.get_failure_rate(), 0.25);
//!
//! let err = serde_json::from_str::<BreakerConfig>(r#"{ "failure_rate": "150%" }"#).unwrap_err();
//! assert!(err.to_string().contains("invalid share \"150%\": above 100%"), "{err}");
//! let err = serde_json::from_str::<BreakerConfig>(r#"{ "open_perod": "2s" }"#).unwrap_err();
//! assert!(err.to_string().starts_with("unknown field `open_perod`"), "{err}");
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::settings::{HumanDuration, Share};

use crate::config::{BreakerConfig, CallEnd, WindowKind};
use crate::throttle::ThrottleConfig;

#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window: Option<RawWindow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    minimum_calls: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failure_rate: Option<Share>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    slow_calls: Option<RawSlowCalls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    slow_call_end: Option<RawCallEnd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    consecutive_failures: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    open_period: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_open_period: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    open_growth: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jitter: Option<Share>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    permitted_probes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    successes_to_close: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_half_open_wait: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ramp_up: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rejection_event_interval: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    coarse_clock: Option<bool>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    count: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    time: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    buckets: Option<usize>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlowCalls {
    duration: HumanDuration,
    rate: Share,
}

#[derive(Serialize, Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum RawCallEnd {
    Head,
    Body,
}

/// The time window's default number of buckets in a settings file.
const DEFAULT_TIME_BUCKETS: usize = 10;

fn positive(name: &str, d: Option<HumanDuration>) -> Result<Option<Duration>, String> {
    match d {
        Some(HumanDuration(d)) if d.is_zero() => Err(format!("{name} must be above 0s")),
        d => Ok(d.map(Duration::from)),
    }
}

fn at_least_one(name: &str, n: Option<u32>) -> Result<Option<u32>, String> {
    match n {
        Some(0) => Err(format!("{name} must be at least 1, got 0")),
        n => Ok(n),
    }
}

impl TryFrom<RawBreaker> for BreakerConfig {
    type Error = String;

    fn try_from(raw: RawBreaker) -> Result<Self, String> {
        let mut c = BreakerConfig::new();
        if let Some(w) = raw.window {
            c = match (w.count, w.time) {
                (Some(_), Some(_)) => {
                    return Err("window: give either `count` or `time`, not both".into())
                }
                (None, None) => {
                    return Err("window: give `count` (calls) or `time` (a duration)".into())
                }
                (Some(_), None) if w.buckets.is_some() => {
                    return Err("window: `buckets` goes with a `time` window".into())
                }
                (Some(0), None) => return Err("window.count must be at least 1, got 0".into()),
                (Some(n), None) if n > 16_383 => {
                    return Err(format!("window.count must be at most 16383, got {n}"))
                }
                (Some(n), None) => c.count_window(n),
                (None, Some(HumanDuration(time))) => {
                    let buckets = w.buckets.unwrap_or(DEFAULT_TIME_BUCKETS);
                    if !(1..=3_600).contains(&buckets) {
                        return Err(format!(
                            "window.buckets must be within 1..=3600, got {buckets}"
                        ));
                    }
                    let bucket = time / buckets as u32;
                    if bucket < Duration::from_millis(1) {
                        return Err(format!(
                            "window.time must give each of its {buckets} buckets at least 1ms"
                        ));
                    }
                    c.time_window(buckets, bucket)
                }
            };
        }
        if let Some(n) = at_least_one("minimum_calls", raw.minimum_calls)? {
            c = c.minimum_calls(n);
        }
        if let Some(Share(rate)) = raw.failure_rate {
            c = c.failure_rate(rate);
        }
        if let Some(slow) = raw.slow_calls {
            if slow.duration.0.is_zero() {
                return Err("slow_calls.duration must be above 0s".into());
            }
            c = c.slow_calls(slow.duration.0, slow.rate.0);
        }
        if let Some(end) = raw.slow_call_end {
            c = c.slow_call_end(match end {
                RawCallEnd::Head => CallEnd::Head,
                RawCallEnd::Body => CallEnd::Body,
            });
        }
        if let Some(n) = at_least_one("consecutive_failures", raw.consecutive_failures)? {
            c = c.consecutive_failures(n);
        }
        if let Some(d) = positive("open_period", raw.open_period)? {
            c = c.open_period(d);
        }
        if let Some(d) = positive("max_open_period", raw.max_open_period)? {
            c = c.max_open_period(d);
        }
        if c.max_open_period < c.open_period {
            return Err(format!(
                "max_open_period ({}) is shorter than open_period ({})",
                HumanDuration(c.max_open_period),
                HumanDuration(c.open_period)
            ));
        }
        if let Some(g) = raw.open_growth {
            if !(g.is_finite() && g >= 1.0) {
                return Err(format!(
                    "open_growth must be at least 1.0 (no growth), got {g}"
                ));
            }
            c = c.open_growth(g);
        }
        if let Some(Share(j)) = raw.jitter {
            c = c.jitter(j);
        }
        if let Some(n) = at_least_one("permitted_probes", raw.permitted_probes)? {
            c = c.permitted_probes(n);
        }
        if let Some(n) = at_least_one("successes_to_close", raw.successes_to_close)? {
            c = c.successes_to_close(n);
        }
        if let Some(d) = positive("max_half_open_wait", raw.max_half_open_wait)? {
            c = c.max_half_open_wait(d);
        }
        if let Some(d) = positive("ramp_up", raw.ramp_up)? {
            c = c.ramp_up(d);
        }
        if let Some(d) = raw.rejection_event_interval {
            c = c.rejection_event_interval(d.0);
        }
        if let Some(on) = raw.coarse_clock {
            c = c.coarse_clock(on);
        }
        Ok(c)
    }
}

impl From<&BreakerConfig> for RawBreaker {
    fn from(c: &BreakerConfig) -> Self {
        RawBreaker {
            window: Some(match c.window {
                WindowKind::Count { size } => RawWindow {
                    count: Some(size),
                    time: None,
                    buckets: None,
                },
                WindowKind::Time { buckets, bucket } => RawWindow {
                    count: None,
                    time: Some(HumanDuration(bucket * buckets as u32)),
                    buckets: Some(buckets),
                },
            }),
            minimum_calls: Some(c.minimum_calls),
            failure_rate: Some(Share(c.failure_rate)),
            slow_calls: c.slow_call_duration.map(|d| RawSlowCalls {
                duration: HumanDuration(d),
                rate: Share(c.slow_call_rate),
            }),
            slow_call_end: Some(match c.slow_call_end {
                CallEnd::Head => RawCallEnd::Head,
                CallEnd::Body => RawCallEnd::Body,
            }),
            consecutive_failures: c.consecutive_failures,
            open_period: Some(HumanDuration(c.open_period)),
            max_open_period: Some(HumanDuration(c.max_open_period)),
            open_growth: Some(c.open_growth),
            jitter: Some(Share(c.jitter)),
            permitted_probes: Some(c.permitted_probes),
            successes_to_close: Some(c.successes_to_close),
            max_half_open_wait: Some(HumanDuration(c.max_half_open_wait)),
            ramp_up: c.ramp_up.map(HumanDuration),
            rejection_event_interval: Some(HumanDuration(c.rejection_event_interval)),
            coarse_clock: Some(c.coarse_clock.is_some()),
        }
    }
}

impl Serialize for BreakerConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RawBreaker::from(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for BreakerConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawBreaker::deserialize(deserializer)?;
        BreakerConfig::try_from(raw).map_err(serde::de::Error::custom)
    }
}

// === ThrottleConfig ===

#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawThrottle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    k: Option<f64>,
    /// K by criticality name (`critical-plus`, `critical`, `sheddable-plus`,
    /// `sheddable`: the names of the `x-criticality` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    criticality_k: Option<RawCriticalityK>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_rejection: Option<Share>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min_requests: Option<u64>,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCriticalityK {
    #[serde(
        default,
        rename = "critical-plus",
        skip_serializing_if = "Option::is_none"
    )]
    critical_plus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    critical: Option<f64>,
    #[serde(
        default,
        rename = "sheddable-plus",
        skip_serializing_if = "Option::is_none"
    )]
    sheddable_plus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sheddable: Option<f64>,
}

impl TryFrom<RawThrottle> for ThrottleConfig {
    type Error = String;

    fn try_from(raw: RawThrottle) -> Result<Self, String> {
        let mut c = ThrottleConfig::new();
        if let Some(w) = raw.window {
            c = c.window(w.0);
        }
        if let Some(k) = raw.k {
            c = c.k(k);
        }
        if let Some(ks) = raw.criticality_k {
            for (criticality, k) in [
                (Criticality::CriticalPlus, ks.critical_plus),
                (Criticality::Critical, ks.critical),
                (Criticality::SheddablePlus, ks.sheddable_plus),
                (Criticality::Sheddable, ks.sheddable),
            ] {
                if let Some(k) = k {
                    c = c.criticality_k(criticality, k);
                }
            }
        }
        if let Some(Share(max)) = raw.max_rejection {
            c = c.max_rejection(max);
        }
        if let Some(min) = raw.min_requests {
            c = c.min_requests(min);
        }
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }
}

impl From<&ThrottleConfig> for RawThrottle {
    fn from(c: &ThrottleConfig) -> Self {
        let k = |criticality: Criticality| c.criticality_k[criticality.index()];
        let ks = RawCriticalityK {
            critical_plus: k(Criticality::CriticalPlus),
            critical: None,
            sheddable_plus: k(Criticality::SheddablePlus),
            sheddable: k(Criticality::Sheddable),
        };
        let any =
            ks.critical_plus.is_some() || ks.sheddable_plus.is_some() || ks.sheddable.is_some();
        RawThrottle {
            window: Some(HumanDuration(c.window)),
            k: Some(c.k),
            criticality_k: any.then_some(ks),
            max_rejection: Some(Share(c.max_rejection)),
            min_requests: Some(c.min_requests),
        }
    }
}

impl Serialize for ThrottleConfig {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RawThrottle::from(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ThrottleConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawThrottle::deserialize(deserializer)?;
        ThrottleConfig::try_from(raw).map_err(serde::de::Error::custom)
    }
}
