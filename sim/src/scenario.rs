//! What one seed decides: the load, the stacks' settings, how the
//! dependency behaves over time and which network faults strike when.

use std::fmt;
use std::time::Duration;

/// A small deterministic generator (splitmix64): every choice of a run
/// comes from the seed, so a seed replays exactly.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A duration of `lo..=hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.between(lo, hi))
    }

    /// An exponentially distributed duration of mean `mean` (Poisson
    /// arrivals), at least a microsecond.
    pub fn exponential(&mut self, mean: Duration) -> Duration {
        let u = self.unit().max(1e-12);
        mean.mul_f64(-u.ln()).max(Duration::from_micros(1))
    }
}

/// How the dependency answers during a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// 1 to 10 ms, 200.
    Healthy,
    /// 50 ms to 2 s, then 200: past most deadlines.
    Slow,
    /// 70% of the answers fail at once: 500s and 502s, half and half.
    Failing,
    /// The head at once, a first chunk, then a body that never ends.
    Stalling,
    /// Half the answers are 503 with `Retry-After`, the rest 20 to 200 ms.
    Overloaded,
    /// A body of 20 chunks 2 ms apart: slow but steady, inside most
    /// deadlines.
    Dribbling,
    /// 30% of the answers are 503s without `Retry-After`, at once: below
    /// the breaker's threshold, so the retries and their budget work.
    Flaky,
}

impl Phase {
    const ALL: [Phase; 7] = [
        Phase::Healthy,
        Phase::Slow,
        Phase::Failing,
        Phase::Stalling,
        Phase::Overloaded,
        Phase::Dribbling,
        Phase::Flaky,
    ];
}

/// A network fault, struck at a time and lifted after a duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Every message between client and server is dropped.
    Partition,
    /// Messages between client and server are held, then delivered at
    /// once when the fault lifts.
    Hold,
    /// The server's host crashes (its connections and tasks vanish) and
    /// restarts when the fault lifts.
    Crash,
    /// Each message between client and server is lost with this
    /// probability.
    Loss(f64),
    /// The link's latency becomes this (instead of the run's range).
    Latency(Duration),
}

/// A fault in the schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Strike {
    /// When it strikes, from the start of the simulation.
    pub at: Duration,
    /// For how long.
    pub lasts: Duration,
    /// What.
    pub fault: Fault,
}

/// Everything one seed decides.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The seed.
    pub seed: u64,
    /// Calls the client makes.
    pub calls: u32,
    /// Mean time between two calls (Poisson arrivals).
    pub mean_gap: Duration,
    /// The client stack's timeout for the whole call, body included.
    pub timeout: Duration,
    /// Attempts per call (retries plus one).
    pub max_attempts: u32,
    /// The client's bulkhead.
    pub client_concurrency: usize,
    /// The server's bulkhead.
    pub server_concurrency: usize,
    /// The client breaker's window size and minimum calls.
    pub window: usize,
    /// The client breaker's open period.
    pub open_period: Duration,
    /// Probes in flight at once in half-open.
    pub probes: u32,
    /// Probe successes that close the circuit.
    pub successes_to_close: u32,
    /// The network's latency range outside a `Latency` fault.
    pub latency: (Duration, Duration),
    /// The dependency's phases: each starts at its time and lasts until
    /// the next one's.
    pub phases: Vec<(Duration, Phase)>,
    /// The network faults.
    pub strikes: Vec<Strike>,
    /// The share of the calls made over gRPC (tonic) rather than HTTP
    /// (hyper): 0, a half or all, through one client stack.
    pub grpc_share: f64,
    /// A deliberate fault in the stack the client builds, never from a
    /// seed: the simulation's own tests use it to show that the checks
    /// notice a stack that breaks its promises.
    pub sabotage: Option<Sabotage>,
}

/// A stack built wrong on purpose (see [`Scenario::sabotage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// The stack's timeout is 50 ms longer than the one checked.
    LateDeadline,
    /// The breaker lets one more probe out at once than the one checked.
    ExtraProbe,
}

impl Scenario {
    /// The scenario of `seed`.
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x5eed_5eed_5eed_5eed);
        let calls = rng.between(300, 1200) as u32;
        let mean_gap = Duration::from_micros(rng.between(2_000, 20_000));
        let span = mean_gap * calls;
        let timeout = rng.millis(40, 800);
        let min_latency = rng.millis(0, 5);
        let max_latency = min_latency + rng.millis(0, 20);

        let mut phases = vec![(Duration::ZERO, Phase::Healthy)];
        let mut at = Duration::ZERO;
        for _ in 0..rng.between(1, 6) {
            at += span.mul_f64(rng.unit() / 3.0);
            let phase = Phase::ALL[rng.between(0, Phase::ALL.len() as u64 - 1) as usize];
            phases.push((at, phase));
        }
        // Most runs end healthy, so that the circuit has a chance to close.
        if rng.chance(0.7) {
            at += span.mul_f64(rng.unit() / 3.0);
            phases.push((at, Phase::Healthy));
        }

        let mut strikes = Vec::new();
        for _ in 0..rng.between(0, 4) {
            let at = span.mul_f64(rng.unit());
            let lasts = rng.millis(10, 3_000);
            let fault = match rng.between(0, 4) {
                0 => Fault::Partition,
                1 => Fault::Hold,
                2 => Fault::Crash,
                3 => Fault::Loss(0.05 + rng.unit() * 0.5),
                _ => Fault::Latency(rng.millis(20, 400)),
            };
            strikes.push(Strike { at, lasts, fault });
        }
        strikes.sort_by_key(|s| s.at);

        let probes = rng.between(1, 3) as u32;
        Self {
            seed,
            calls,
            mean_gap,
            timeout,
            max_attempts: rng.between(1, 4) as u32,
            client_concurrency: rng.between(4, 128) as usize,
            server_concurrency: rng.between(2, 64) as usize,
            window: rng.between(5, 40) as usize,
            open_period: rng.millis(100, 3_000),
            probes,
            successes_to_close: rng.between(1, 3) as u32,
            latency: (min_latency, max_latency),
            phases,
            strikes,
            grpc_share: [0.0, 0.5, 1.0][rng.between(0, 2) as usize],
            sabotage: None,
        }
    }

    /// The phase at `at`.
    pub fn phase_at(&self, at: Duration) -> Phase {
        self.phases
            .iter()
            .rev()
            .find(|(start, _)| *start <= at)
            .map_or(Phase::Healthy, |(_, phase)| *phase)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: {} calls every {:?} on average, timeout {:?}, {} attempts, \
             bulkheads {} (client) and {} (server), window {}, open {:?}, \
             {} probes, {} to close, latency {:?}..{:?}, {}% over gRPC",
            self.seed,
            self.calls,
            self.mean_gap,
            self.timeout,
            self.max_attempts,
            self.client_concurrency,
            self.server_concurrency,
            self.window,
            self.open_period,
            self.probes,
            self.successes_to_close,
            self.latency.0,
            self.latency.1,
            self.grpc_share * 100.0,
        )?;
        write!(f, "\n  phases:")?;
        for (at, phase) in &self.phases {
            write!(f, " {phase:?}@{at:?}")?;
        }
        write!(f, "\n  faults:")?;
        if self.strikes.is_empty() {
            write!(f, " none")?;
        }
        for s in &self.strikes {
            write!(f, " {:?}@{:?}+{:?}", s.fault, s.at, s.lasts)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_decides_the_same_scenario_every_time() {
        let (a, b) = (Scenario::from_seed(7), Scenario::from_seed(7));
        assert_eq!(a.to_string(), b.to_string());
        assert_ne!(a.to_string(), Scenario::from_seed(8).to_string());
    }

    #[test]
    fn phases_start_healthy_and_are_in_order() {
        for seed in 0..200 {
            let s = Scenario::from_seed(seed);
            assert_eq!(s.phases[0], (Duration::ZERO, Phase::Healthy));
            assert!(s.phases.windows(2).all(|w| w[0].0 <= w[1].0), "{s}");
            assert!(s.strikes.windows(2).all(|w| w[0].at <= w[1].at), "{s}");
        }
    }
}
