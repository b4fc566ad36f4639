//! The breaker's thresholds and periods, changeable while it runs.
//!
//! Each setting is a word of a [`SeqWords`] that the hot path reads with
//! one relaxed load. A reader that needs several settings to agree (the
//! judgement that opens the circuit reads the thresholds together; the
//! open period reads its base, growth, cap and jitter) takes them with
//! [`LiveSettings::get`], under the sequence lock: a judgement never sees
//! half of an old configuration and half of a new one.

use tower_resilience_base::seq::SeqWords;

use super::{nanos, PPM};
use crate::config::{BreakerConfig, CallEnd, WindowKind};

/// The configuration in the units the hot path uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Settings {
    pub(super) minimum_calls: u64,
    pub(super) failure_ppm: u64,
    pub(super) slow_ppm: u64,
    /// 0 when slow-call detection is off.
    pub(super) slow_ns: u64,
    /// Whether a call's duration ends at its response head
    /// ([`CallEnd::Head`](crate::config::CallEnd::Head)) rather than its body's end.
    pub(super) slow_at_head: bool,
    /// 0 when off.
    pub(super) consecutive: u64,
    pub(super) open_ns: u64,
    pub(super) max_open_ns: u64,
    pub(super) growth: f64,
    pub(super) jitter: f64,
    pub(super) probes: u64,
    pub(super) successes: u64,
    pub(super) half_open_ns: u64,
    /// How long a probe election may take (with a store; at most
    /// `half_open_ns`).
    pub(super) election_ns: u64,
    /// 0 when off.
    pub(super) ramp_ns: u64,
    pub(super) rejection_event_ms: u64,
}

impl Settings {
    /// The settings of `config`.
    pub(super) fn of(config: &BreakerConfig) -> Self {
        let minimum_calls = match config.window {
            WindowKind::Count { size } => u64::from(config.minimum_calls).min(size as u64),
            WindowKind::Time { .. } => u64::from(config.minimum_calls),
        };
        Settings {
            minimum_calls,
            failure_ppm: (config.failure_rate * PPM as f64).round() as u64,
            slow_ppm: (config.slow_call_rate * PPM as f64).round() as u64,
            slow_ns: config.slow_call_duration.map_or(0, |d| nanos(d).max(1)),
            slow_at_head: config.slow_call_end == CallEnd::Head,
            consecutive: config.consecutive_failures.map_or(0, u64::from),
            open_ns: nanos(config.open_period),
            max_open_ns: nanos(config.max_open_period),
            growth: config.open_growth,
            jitter: config.jitter,
            probes: u64::from(config.permitted_probes),
            successes: u64::from(config.successes_to_close),
            half_open_ns: nanos(config.max_half_open_wait),
            election_ns: config.fleet.as_ref().map_or(0, |fleet| {
                nanos(fleet.election_timeout).min(nanos(config.max_half_open_wait))
            }),
            ramp_ns: config.ramp_up.map_or(0, nanos),
            rejection_event_ms: config.rejection_event_interval.as_millis() as u64,
        }
    }
}

/// [`Settings`] as words behind a sequence lock
/// ([`SeqWords`]): one load for a single setting, one consistent set for
/// a judgement.
#[derive(Debug)]
pub(super) struct LiveSettings(SeqWords<16>);

/// The word of each setting.
mod at {
    pub(super) const MINIMUM_CALLS: usize = 0;
    pub(super) const FAILURE_PPM: usize = 1;
    pub(super) const SLOW_PPM: usize = 2;
    pub(super) const SLOW_NS: usize = 3;
    pub(super) const SLOW_AT_HEAD: usize = 4;
    pub(super) const CONSECUTIVE: usize = 5;
    pub(super) const OPEN_NS: usize = 6;
    pub(super) const MAX_OPEN_NS: usize = 7;
    pub(super) const GROWTH: usize = 8;
    pub(super) const JITTER: usize = 9;
    pub(super) const PROBES: usize = 10;
    pub(super) const SUCCESSES: usize = 11;
    pub(super) const HALF_OPEN_NS: usize = 12;
    pub(super) const ELECTION_NS: usize = 13;
    pub(super) const RAMP_NS: usize = 14;
    pub(super) const REJECTION_EVENT_MS: usize = 15;
}

macro_rules! getters {
    ($($name:ident = $at:ident),* $(,)?) => {
        $(
            #[inline]
            pub(super) fn $name(&self) -> u64 {
                self.0.word(at::$at)
            }
        )*
    };
}

impl LiveSettings {
    pub(super) fn new(s: &Settings) -> Self {
        Self(SeqWords::new(encode(s)))
    }

    getters!(
        slow_ns = SLOW_NS,
        consecutive = CONSECUTIVE,
        open_ns = OPEN_NS,
        probes = PROBES,
        successes = SUCCESSES,
        half_open_ns = HALF_OPEN_NS,
        election_ns = ELECTION_NS,
        ramp_ns = RAMP_NS,
        rejection_event_ms = REJECTION_EVENT_MS,
    );

    #[inline]
    pub(super) fn slow_at_head(&self) -> bool {
        self.0.word(at::SLOW_AT_HEAD) != 0
    }

    /// Every setting, all from the same configuration.
    pub(super) fn get(&self) -> Settings {
        decode(self.0.get())
    }

    /// Replaces every setting; readers of [`get`](Self::get) see the old
    /// set or the new one, never a mix.
    pub(super) fn set(&self, s: &Settings) {
        self.0.set(encode(s));
    }
}

fn encode(s: &Settings) -> [u64; 16] {
    let mut w = [0; 16];
    w[at::MINIMUM_CALLS] = s.minimum_calls;
    w[at::FAILURE_PPM] = s.failure_ppm;
    w[at::SLOW_PPM] = s.slow_ppm;
    w[at::SLOW_NS] = s.slow_ns;
    w[at::SLOW_AT_HEAD] = u64::from(s.slow_at_head);
    w[at::CONSECUTIVE] = s.consecutive;
    w[at::OPEN_NS] = s.open_ns;
    w[at::MAX_OPEN_NS] = s.max_open_ns;
    w[at::GROWTH] = s.growth.to_bits();
    w[at::JITTER] = s.jitter.to_bits();
    w[at::PROBES] = s.probes;
    w[at::SUCCESSES] = s.successes;
    w[at::HALF_OPEN_NS] = s.half_open_ns;
    w[at::ELECTION_NS] = s.election_ns;
    w[at::RAMP_NS] = s.ramp_ns;
    w[at::REJECTION_EVENT_MS] = s.rejection_event_ms;
    w
}

fn decode(w: [u64; 16]) -> Settings {
    Settings {
        minimum_calls: w[at::MINIMUM_CALLS],
        failure_ppm: w[at::FAILURE_PPM],
        slow_ppm: w[at::SLOW_PPM],
        slow_ns: w[at::SLOW_NS],
        slow_at_head: w[at::SLOW_AT_HEAD] != 0,
        consecutive: w[at::CONSECUTIVE],
        open_ns: w[at::OPEN_NS],
        max_open_ns: w[at::MAX_OPEN_NS],
        growth: f64::from_bits(w[at::GROWTH]),
        jitter: f64::from_bits(w[at::JITTER]),
        probes: w[at::PROBES],
        successes: w[at::SUCCESSES],
        half_open_ns: w[at::HALF_OPEN_NS],
        election_ns: w[at::ELECTION_NS],
        ramp_ns: w[at::RAMP_NS],
        rejection_event_ms: w[at::REJECTION_EVENT_MS],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_reads_back_as_written() {
        let s = Settings {
            minimum_calls: 1,
            failure_ppm: 2,
            slow_ppm: 3,
            slow_ns: 4,
            slow_at_head: true,
            consecutive: 5,
            open_ns: 6,
            max_open_ns: 7,
            growth: 8.5,
            jitter: 0.25,
            probes: 9,
            successes: 10,
            half_open_ns: 11,
            election_ns: 12,
            ramp_ns: 13,
            rejection_event_ms: 14,
        };
        let live = LiveSettings::new(&s);
        assert_eq!(live.get(), s);
        assert_eq!(
            (
                live.slow_ns(),
                live.slow_at_head(),
                live.open_ns(),
                live.rejection_event_ms()
            ),
            (4, true, 6, 14)
        );
        let t = Settings {
            slow_at_head: false,
            growth: 2.0,
            ..s
        };
        live.set(&t);
        assert_eq!(live.get(), t);
    }
}
