//! The state word: the circuit's state, its manual mode, a generation number
//! and the deadline of the current state, packed into one `u64` so that one
//! atomic load tells a call everything it needs.

use std::fmt;
use std::ops::Deref;

/// The automatic state of a circuit.
///
/// While the breaker is in [`Mode::Automatic`] (or [`Mode::MetricsOnly`]),
/// this is the state its window and timers have moved it to; see the
/// [crate docs](crate#semantics) for the state machine.
///
/// # Example
///
/// ```
/// use tower_breaker::{Breaker, State};
///
/// let breaker = Breaker::new("payments");
/// assert_eq!(breaker.snapshot().state, State::Closed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Calls pass and their outcomes are counted.
    Closed,
    /// Calls are rejected without calling the inner service until the open
    /// period ends.
    Open,
    /// A bounded number of probe calls pass; everyone else is rejected.
    HalfOpen,
}

/// A manual override of the state machine, switchable at run time with
/// [`Breaker::set_mode`](crate::Breaker::set_mode).
///
/// # Example
///
/// ```
/// use tower_breaker::{Breaker, Mode};
///
/// let breaker = Breaker::new("search");
/// breaker.set_mode(Mode::ForcedOpen);
/// assert!(breaker.try_acquire().is_err());
/// breaker.set_mode(Mode::Automatic);
/// assert!(breaker.try_acquire().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// The state machine decides (the default).
    #[default]
    Automatic,
    /// Every call is rejected, as if open, with no probe ever.
    ForcedOpen,
    /// Every call passes and is counted, but the circuit never opens.
    ForcedClosed,
    /// Every call passes and nothing is counted: the breaker is not there.
    Disabled,
    /// The state machine runs, counts and emits its events as usual, but
    /// calls it would reject pass anyway: a dry run of the thresholds.
    MetricsOnly,
}

pub(crate) const CLOSED: u64 = 0;
pub(crate) const OPEN: u64 = 1;
pub(crate) const HALF_OPEN: u64 = 2;
/// Open, its period over, while a shared store elects the fleet's prober.
pub(crate) const ELECTING: u64 = 3;

const STATE_MASK: u64 = 0b111;
const MODE_SHIFT: u32 = 3;
const MODE_MASK: u64 = 0b111 << MODE_SHIFT;
const GEN_SHIFT: u32 = 6;
/// Bits of the generation number.
pub(crate) const GEN_BITS: u32 = 20;
pub(crate) const GEN_MASK: u32 = (1 << GEN_BITS) - 1;
const DEADLINE_SHIFT: u32 = GEN_SHIFT + GEN_BITS;
/// The largest deadline, in milliseconds since the breaker was created
/// (about 8.7 years).
pub(crate) const MAX_DEADLINE_MS: u64 = (1 << (64 - DEADLINE_SHIFT)) - 1;
/// A word whose bits under this mask are all zero is closed, automatic and
/// not ramping up: the fast path.
const SLOW_MASK: u64 = STATE_MASK | MODE_MASK | (u64::MAX << DEADLINE_SHIFT);

/// The automatic state of a word, decoded once at the boundary where a
/// decision is made: each variant names what the word's deadline means in
/// it (milliseconds since the breaker was built).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Closed; ramping up until `ramp_until_ms` after closing (0: not
    /// ramping).
    Closed { ramp_until_ms: u64 },
    /// Open until `until_ms`; the first call after it moves on.
    Open { until_ms: u64 },
    /// Half-open; the latest probe times out at `probe_deadline_ms`.
    HalfOpen { probe_deadline_ms: u64 },
    /// Open with its period over, while the shared store elects the
    /// fleet's prober; the election is given up at `until_ms`.
    Electing { until_ms: u64 },
}

/// One packed state word.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Word(pub(crate) u64);

// === impl Word ===

impl Word {
    pub(crate) fn new(state: u64, mode: Mode, gen: u32, deadline_ms: u64) -> Self {
        Self(
            state
                | (mode_code(mode) << MODE_SHIFT)
                | (u64::from(gen & GEN_MASK) << GEN_SHIFT)
                | (deadline_ms.min(MAX_DEADLINE_MS) << DEADLINE_SHIFT),
        )
    }

    /// Closed, automatic, not ramping up.
    #[inline]
    pub(crate) fn is_fast(self) -> bool {
        self.0 & SLOW_MASK == 0
    }

    #[inline]
    pub(crate) fn state(self) -> u64 {
        self.0 & STATE_MASK
    }

    pub(crate) fn mode(self) -> Mode {
        match (self.0 & MODE_MASK) >> MODE_SHIFT {
            1 => Mode::ForcedOpen,
            2 => Mode::ForcedClosed,
            3 => Mode::Disabled,
            4 => Mode::MetricsOnly,
            _ => Mode::Automatic,
        }
    }

    #[inline]
    pub(crate) fn gen(self) -> u32 {
        ((self.0 >> GEN_SHIFT) as u32) & GEN_MASK
    }

    /// The automatic state, with what its deadline means.
    #[inline]
    pub(crate) fn phase(self) -> Phase {
        let deadline = self.deadline_ms();
        match self.state() {
            CLOSED => Phase::Closed {
                ramp_until_ms: deadline,
            },
            OPEN => Phase::Open { until_ms: deadline },
            HALF_OPEN => Phase::HalfOpen {
                probe_deadline_ms: deadline,
            },
            _ => Phase::Electing { until_ms: deadline },
        }
    }

    pub(crate) fn deadline_ms(self) -> u64 {
        self.0 >> DEADLINE_SHIFT
    }

    /// The next word: another state and deadline, the same mode, the next
    /// generation.
    pub(crate) fn next(self, state: u64, deadline_ms: u64) -> Self {
        Self::new(state, self.mode(), self.gen().wrapping_add(1), deadline_ms)
    }

    /// The same word with another deadline (ramp-up over), same generation.
    pub(crate) fn with_deadline(self, deadline_ms: u64) -> Self {
        Self::new(self.state(), self.mode(), self.gen(), deadline_ms)
    }

    pub(crate) fn public_state(self) -> State {
        match self.state() {
            CLOSED => State::Closed,
            HALF_OPEN => State::HalfOpen,
            _ => State::Open,
        }
    }

    /// Whether the state machine may move (it does in automatic and
    /// metrics-only modes).
    pub(crate) fn is_automatic(self) -> bool {
        matches!(self.mode(), Mode::Automatic | Mode::MetricsOnly)
    }
}

impl fmt::Debug for Word {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Word")
            .field("state", &self.state())
            .field("mode", &self.mode())
            .field("gen", &self.gen())
            .field("deadline_ms", &self.deadline_ms())
            .finish()
    }
}

fn mode_code(mode: Mode) -> u64 {
    match mode {
        Mode::Automatic => 0,
        Mode::ForcedOpen => 1,
        Mode::ForcedClosed => 2,
        Mode::Disabled => 3,
        Mode::MetricsOnly => 4,
    }
}

/// Whether generation (or epoch) `a` is newer than `b`, modulo 2^20.
pub(crate) fn is_newer(a: u32, b: u32) -> bool {
    let d = a.wrapping_sub(b) & GEN_MASK;
    d != 0 && d < (1 << (GEN_BITS - 1))
}

/// A value alone on its cache lines, so that atomics written by every call
/// do not slow down their neighbours.
#[repr(align(128))]
#[derive(Debug, Default)]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> Deref for Padded<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_and_unpacks() {
        let w = Word::new(HALF_OPEN, Mode::MetricsOnly, 12345, 999_999);
        assert_eq!(w.state(), HALF_OPEN);
        assert_eq!(w.mode(), Mode::MetricsOnly);
        assert_eq!(w.gen(), 12345);
        assert_eq!(w.deadline_ms(), 999_999);
        assert!(!w.is_fast());
        assert!(Word::new(CLOSED, Mode::Automatic, 77, 0).is_fast());
        assert!(!Word::new(CLOSED, Mode::Automatic, 77, 1).is_fast());
        assert!(!Word::new(CLOSED, Mode::Disabled, 77, 0).is_fast());
    }

    #[test]
    fn generation_wraps() {
        let w = Word::new(OPEN, Mode::Automatic, GEN_MASK, 5);
        let n = w.next(HALF_OPEN, 6);
        assert_eq!(n.gen(), 0);
        assert!(is_newer(0, GEN_MASK));
        assert!(!is_newer(GEN_MASK, 0));
        assert!(!is_newer(3, 3));
    }
}
