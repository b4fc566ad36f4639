//! Whether a hedge may go out now, apart from the future that sends it
//! (STYLE 49): from the attempts sent, what the servers said, the pause,
//! the deadline and the time to "send" or "no, because". It reads no
//! clock and polls nothing; the breaker's hook and the budget, which have
//! effects, are asked by the future afterwards, in that order.

use std::time::Duration;

use tokio::time::Instant;

use super::shared::Refusal;

/// What one call has seen so far, as the decision needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Race {
    /// Hedges sent so far.
    pub(crate) sent: u32,
    /// The most hedges per call.
    pub(crate) max: u32,
    /// An answer of this call pushed back (`Retry-After`,
    /// `grpc-retry-pushback-ms`, the do-not-retry mark) or an attempt was
    /// rejected below for overload.
    pub(crate) pushed_back: bool,
}

/// Whether one more hedge may be sent at `now`: `Ok` to go on and ask the
/// hook and the budget, or the reason not to (which also ends the call's
/// hedging).
///
/// `paused` says whether a server's pushback to any call of the layer
/// still holds; `deadline` is the call's, if any, and a hedge needs at
/// least `min_remaining` of it.
pub(crate) fn may_hedge(
    race: Race,
    paused: bool,
    deadline: Option<Instant>,
    now: Instant,
    min_remaining: Duration,
) -> Result<(), Refusal> {
    if race.sent >= race.max {
        return Err(Refusal::Other);
    }
    if race.pushed_back || paused {
        return Err(Refusal::Pushback);
    }
    if deadline.is_some_and(|d| d.saturating_duration_since(now) < min_remaining) {
        return Err(Refusal::Deadline);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn race(sent: u32) -> Race {
        Race {
            sent,
            max: 2,
            pushed_back: false,
        }
    }

    #[test]
    fn hedges_until_the_maximum() {
        let now = Instant::now();
        assert_eq!(may_hedge(race(0), false, None, now, MS), Ok(()));
        assert_eq!(may_hedge(race(1), false, None, now, MS), Ok(()));
        assert_eq!(
            may_hedge(race(2), false, None, now, MS),
            Err(Refusal::Other)
        );
    }

    #[test]
    fn pushback_of_the_call_or_of_the_layer_stops_hedging() {
        let now = Instant::now();
        let pushed = Race {
            pushed_back: true,
            ..race(0)
        };
        assert_eq!(
            may_hedge(pushed, false, None, now, MS),
            Err(Refusal::Pushback)
        );
        assert_eq!(
            may_hedge(race(0), true, None, now, MS),
            Err(Refusal::Pushback)
        );
    }

    #[test]
    fn needs_the_minimum_slice_of_the_deadline() {
        let now = Instant::now();
        let deadline = Some(now + 10 * MS);
        assert_eq!(
            may_hedge(race(0), false, deadline, now, 10 * MS),
            Ok(()),
            "exactly enough"
        );
        assert_eq!(
            may_hedge(race(0), false, deadline, now + MS, 10 * MS),
            Err(Refusal::Deadline),
            "one millisecond less"
        );
        assert_eq!(
            may_hedge(race(0), false, deadline, now + 20 * MS, 10 * MS),
            Err(Refusal::Deadline),
            "already passed"
        );
    }
}
