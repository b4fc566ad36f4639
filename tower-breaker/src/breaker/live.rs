//! The breaker's thresholds and periods, changeable while it runs.
//!
//! Each setting is an atomic that the hot path reads with one relaxed load
//! (a plain load on x86 and ARM). A reader that needs several settings to
//! agree (the judgement that opens the circuit reads the thresholds
//! together; the open period reads its base, growth, cap and jitter)
//! takes them with [`LiveSettings::get`], a sequence lock: it reads the
//! sequence, the settings, then the sequence again, and reads again if a
//! change was being written meanwhile. So a judgement never sees half of
//! an old configuration and half of a new one.
//!
//! These are `std` atomics, not the crate's `sync` ones: the loom models
//! explore the state machine's races, not its settings.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering::*};
use std::sync::Mutex;

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

/// [`Settings`] as atomics, behind a sequence lock.
#[derive(Debug)]
pub(super) struct LiveSettings {
    /// Even when no change is being written; odd while one is.
    seq: AtomicU64,
    minimum_calls: AtomicU64,
    failure_ppm: AtomicU64,
    slow_ppm: AtomicU64,
    slow_ns: AtomicU64,
    slow_at_head: AtomicBool,
    consecutive: AtomicU64,
    open_ns: AtomicU64,
    max_open_ns: AtomicU64,
    growth: AtomicU64,
    jitter: AtomicU64,
    probes: AtomicU64,
    successes: AtomicU64,
    half_open_ns: AtomicU64,
    election_ns: AtomicU64,
    ramp_ns: AtomicU64,
    rejection_event_ms: AtomicU64,
    /// One writer at a time.
    writer: Mutex<()>,
}

macro_rules! getters {
    ($($name:ident),* $(,)?) => {
        $(
            #[inline]
            pub(super) fn $name(&self) -> u64 {
                self.$name.load(Relaxed)
            }
        )*
    };
}

impl LiveSettings {
    pub(super) fn new(s: &Settings) -> Self {
        Self {
            seq: AtomicU64::new(0),
            minimum_calls: AtomicU64::new(s.minimum_calls),
            failure_ppm: AtomicU64::new(s.failure_ppm),
            slow_ppm: AtomicU64::new(s.slow_ppm),
            slow_ns: AtomicU64::new(s.slow_ns),
            slow_at_head: AtomicBool::new(s.slow_at_head),
            consecutive: AtomicU64::new(s.consecutive),
            open_ns: AtomicU64::new(s.open_ns),
            max_open_ns: AtomicU64::new(s.max_open_ns),
            growth: AtomicU64::new(s.growth.to_bits()),
            jitter: AtomicU64::new(s.jitter.to_bits()),
            probes: AtomicU64::new(s.probes),
            successes: AtomicU64::new(s.successes),
            half_open_ns: AtomicU64::new(s.half_open_ns),
            election_ns: AtomicU64::new(s.election_ns),
            ramp_ns: AtomicU64::new(s.ramp_ns),
            rejection_event_ms: AtomicU64::new(s.rejection_event_ms),
            writer: Mutex::new(()),
        }
    }

    getters!(
        slow_ns,
        consecutive,
        open_ns,
        probes,
        successes,
        half_open_ns,
        election_ns,
        ramp_ns,
        rejection_event_ms,
    );

    #[inline]
    pub(super) fn slow_at_head(&self) -> bool {
        self.slow_at_head.load(Relaxed)
    }

    /// Every setting, all from the same configuration.
    pub(super) fn get(&self) -> Settings {
        loop {
            let before = self.seq.load(Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let s = self.read();
            fence(Acquire);
            if self.seq.load(Relaxed) == before {
                return s;
            }
        }
    }

    fn read(&self) -> Settings {
        Settings {
            minimum_calls: self.minimum_calls.load(Relaxed),
            failure_ppm: self.failure_ppm.load(Relaxed),
            slow_ppm: self.slow_ppm.load(Relaxed),
            slow_ns: self.slow_ns.load(Relaxed),
            slow_at_head: self.slow_at_head.load(Relaxed),
            consecutive: self.consecutive.load(Relaxed),
            open_ns: self.open_ns.load(Relaxed),
            max_open_ns: self.max_open_ns.load(Relaxed),
            growth: f64::from_bits(self.growth.load(Relaxed)),
            jitter: f64::from_bits(self.jitter.load(Relaxed)),
            probes: self.probes.load(Relaxed),
            successes: self.successes.load(Relaxed),
            half_open_ns: self.half_open_ns.load(Relaxed),
            election_ns: self.election_ns.load(Relaxed),
            ramp_ns: self.ramp_ns.load(Relaxed),
            rejection_event_ms: self.rejection_event_ms.load(Relaxed),
        }
    }

    /// Replaces every setting; readers of [`get`](Self::get) see the old
    /// set or the new one, never a mix.
    pub(super) fn set(&self, s: &Settings) {
        let _writer = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let seq = self.seq.load(Relaxed);
        self.seq.store(seq.wrapping_add(1), Relaxed);
        fence(Release);
        self.minimum_calls.store(s.minimum_calls, Relaxed);
        self.failure_ppm.store(s.failure_ppm, Relaxed);
        self.slow_ppm.store(s.slow_ppm, Relaxed);
        self.slow_ns.store(s.slow_ns, Relaxed);
        self.slow_at_head.store(s.slow_at_head, Relaxed);
        self.consecutive.store(s.consecutive, Relaxed);
        self.open_ns.store(s.open_ns, Relaxed);
        self.max_open_ns.store(s.max_open_ns, Relaxed);
        self.growth.store(s.growth.to_bits(), Relaxed);
        self.jitter.store(s.jitter.to_bits(), Relaxed);
        self.probes.store(s.probes, Relaxed);
        self.successes.store(s.successes, Relaxed);
        self.half_open_ns.store(s.half_open_ns, Relaxed);
        self.election_ns.store(s.election_ns, Relaxed);
        self.ramp_ns.store(s.ramp_ns, Relaxed);
        self.rejection_event_ms.store(s.rejection_event_ms, Relaxed);
        self.seq.store(seq.wrapping_add(2), Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn settings(n: u64) -> Settings {
        Settings {
            minimum_calls: n,
            failure_ppm: n,
            slow_ppm: n,
            slow_ns: n,
            slow_at_head: n.is_multiple_of(2),
            consecutive: n,
            open_ns: n,
            max_open_ns: n,
            growth: n as f64,
            jitter: n as f64,
            probes: n,
            successes: n,
            half_open_ns: n,
            election_ns: n,
            ramp_ns: n,
            rejection_event_ms: n,
        }
    }

    #[test]
    fn readers_never_see_a_mix_of_two_configurations() {
        let live = Arc::new(LiveSettings::new(&settings(1)));
        let writer = {
            let live = Arc::clone(&live);
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    live.set(&settings(1 + i % 2));
                }
            })
        };
        let mut seen = [0u64; 2];
        while !writer.is_finished() {
            let s = live.get();
            assert!(s == settings(1) || s == settings(2), "a torn read: {s:?}");
            seen[(s.minimum_calls - 1) as usize] += 1;
        }
        writer.join().unwrap();
        assert!(seen[0] > 0, "the reader ran: {seen:?}");
    }
}
