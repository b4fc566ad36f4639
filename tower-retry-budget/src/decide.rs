//! The retry decision after an attempt, apart from the future that drives
//! it (STYLE 49): from the attempt's class, the attempt number, the time and the
//! deadline to "stop, and why" or "wait this long". It reads no clock and
//! polls nothing, so it is unit-tested directly.

use std::time::Duration;

use tokio::time::Instant;

use crate::layer::Config;
use crate::outcome::StopReason;
use crate::policy::Class;

/// What to do with an attempt's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Not a failure: return the outcome as it is.
    Return,
    /// Stop, returning the outcome: why, and whether the failure itself was
    /// one worth retrying (then a limit ended the retries, and the answer
    /// says so with the do-not-retry mark).
    Stop { reason: StopReason, retryable: bool },
    /// Retry after `delay`, if the breaker's hook and the budget agree
    /// (asked in that order by the future, which only then spends a token).
    Wait {
        delay: Duration,
        reason: &'static str,
    },
}

/// The plan after attempt number `attempt` (1 for the first) ended with
/// an outcome of class `class`.
///
/// `replayable` says whether the request may be sent again at all (an
/// idempotent request whose body can be replayed); `now` and `backoff` are
/// asked only for a retryable failure (the clock read and the jitter drawn
/// only then).
pub(crate) fn plan(
    class: Class,
    attempt: u32,
    replayable: bool,
    config: &Config,
    deadline: Option<Instant>,
    now: impl FnOnce() -> Instant,
    backoff: impl FnOnce() -> Duration,
) -> Plan {
    if class == Class::Success {
        return Plan::Return;
    }
    if !class.is_retryable() {
        return Plan::Stop {
            reason: StopReason::NotRetryable,
            retryable: false,
        };
    }
    let (reason, after) = (class.reason(), class.retry_after());
    let stop = |reason| Plan::Stop {
        reason,
        retryable: true,
    };
    if !replayable {
        return stop(StopReason::NotRetryable);
    }
    if attempt >= config.max_attempts.get() {
        return stop(StopReason::Attempts);
    }
    if after.is_some_and(|a| a > config.max_server_delay) {
        return stop(StopReason::NotRetryable);
    }
    let delay = backoff().max(after.unwrap_or_default());
    if let Some(deadline) = deadline {
        let left = deadline.saturating_duration_since(now());
        if left < delay.saturating_add(config.min_remaining) {
            return stop(StopReason::Deadline);
        }
    }
    Plan::Wait { delay, reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RetryLayer;

    const MS: Duration = Duration::from_millis(1);

    fn config() -> Config {
        RetryLayer::new().config().clone()
    }

    fn retry() -> Class {
        Class::Transient {
            reason: "503",
            after: None,
        }
    }

    fn at(now: Instant) -> impl FnOnce() -> Instant {
        move || now
    }

    #[test]
    fn successes_return_and_failures_stop_without_reading_the_clock() {
        let never = || -> Instant { panic!("the clock was read") };
        let no_jitter = || -> Duration { panic!("jitter was drawn") };
        let c = config();
        assert_eq!(
            plan(Class::Success, 1, true, &c, None, never, no_jitter),
            Plan::Return
        );
        for class in [
            Class::Rejected,
            Class::Failed,
            Class::Local,
            Class::Throttled { after: None },
        ] {
            assert_eq!(
                plan(class, 1, true, &c, None, never, no_jitter),
                Plan::Stop {
                    reason: StopReason::NotRetryable,
                    retryable: false
                },
                "{class:?}"
            );
        }
    }

    #[test]
    fn a_retryable_failure_waits_the_backoff_or_the_servers_delay() {
        let now = Instant::now();
        let c = config();
        assert_eq!(
            plan(retry(), 1, true, &c, None, at(now), || 40 * MS),
            Plan::Wait {
                delay: 40 * MS,
                reason: "503"
            }
        );
        let asked = Class::Throttled {
            after: Some(300 * MS),
        };
        assert_eq!(
            plan(asked, 1, true, &c, None, at(now), || 40 * MS),
            Plan::Wait {
                delay: 300 * MS,
                reason: "429"
            }
        );
    }

    #[test]
    fn limits_stop_in_order_attempts_server_delay_deadline() {
        let now = Instant::now();
        let c = config(); // 3 attempts, 10 ms minimum slice, 30 s server delay
        let stopped = |reason| Plan::Stop {
            reason,
            retryable: true,
        };
        assert_eq!(
            plan(retry(), 1, false, &c, None, at(now), || MS),
            stopped(StopReason::NotRetryable)
        );
        assert_eq!(
            plan(retry(), 3, true, &c, None, at(now), || MS),
            stopped(StopReason::Attempts)
        );
        let too_long = Class::Transient {
            reason: "503",
            after: Some(Duration::from_secs(31)),
        };
        assert_eq!(
            plan(too_long, 1, true, &c, None, at(now), || MS),
            stopped(StopReason::NotRetryable)
        );
        // The deadline at t: a 40 ms backoff needs 40 + 10 ms left.
        let deadline = Some(now + 50 * MS);
        assert_eq!(
            plan(retry(), 1, true, &c, deadline, at(now), || 40 * MS),
            Plan::Wait {
                delay: 40 * MS,
                reason: "503"
            },
            "exactly enough left"
        );
        assert_eq!(
            plan(retry(), 1, true, &c, deadline, at(now + MS), || 40 * MS),
            stopped(StopReason::Deadline),
            "one millisecond less"
        );
    }
}
