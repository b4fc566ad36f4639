//! Why a fallback answers: the causes, the selection of causes, and how a
//! result is judged.

use std::error::Error;
use std::fmt;

use http::{HeaderValue, Response, StatusCode};
use tower_resilience_base::answer::is_local_answer;
use tower_resilience_base::error::{
    AttemptsExhausted, BudgetExhausted, BulkheadFull, CircuitOpen, DeadlineExceeded,
    DeadlineTooClose, InsufficientBudget, LocalRejection,
};
use tower_resilience_base::grpc::GrpcCode;

use crate::mark::FallbackServed;
use tower_resilience_base::outcome::{Classify, Outcome};

/// Why a fallback answered (or was asked to).
///
/// Every failure the layers below can report has its cause; the last one,
/// [`Exercise`](Cause::Exercise), is not a failure at all but the exercise
/// and shadow modes running the fallback on purpose on a healthy call.
///
/// How an error finds its cause: the error and its
/// [`source`](std::error::Error::source) chain are searched, outermost
/// first. A local rejection anywhere in the chain decides
/// ([`CircuitOpen`], [`BulkheadFull`], [`LocalRejection`]: the dependency
/// was not called, even if a retry layer wrapped the error); otherwise the
/// outermost of the deadline and retry errors decides; any other error is
/// a [`Failure`](Cause::Failure) when the layer's classifier says it is
/// one (the default classifiers say so of every such error).
///
/// | error (or response) | cause |
/// |---|---|
/// | [`CircuitOpen`] | [`CircuitOpen`](Cause::CircuitOpen) |
/// | [`BulkheadFull`] | [`BulkheadFull`](Cause::BulkheadFull) |
/// | [`LocalRejection`] | [`LocalRejection`](Cause::LocalRejection) |
/// | [`DeadlineExceeded`], [`InsufficientBudget`], [`DeadlineTooClose`] | [`DeadlineExceeded`](Cause::DeadlineExceeded) |
/// | [`AttemptsExhausted`] | [`RetriesExhausted`](Cause::RetriesExhausted) |
/// | [`BudgetExhausted`] | [`BudgetExhausted`](Cause::BudgetExhausted) |
/// | any other error the classifier calls a failure | [`Failure`](Cause::Failure) |
/// | a response the classifier calls a failure (a `5xx`) | [`Failure`](Cause::Failure) |
/// | an HTTP answer a layer of this process built when it refused the request ([`LocalAnswer`](tower_resilience_base::answer::LocalAnswer)) | `504` or gRPC DEADLINE_EXCEEDED: [`DeadlineExceeded`](Cause::DeadlineExceeded); gRPC RESOURCE_EXHAUSTED: [`BulkheadFull`](Cause::BulkheadFull); any other: [`LocalRejection`](Cause::LocalRejection) |
///
/// # Example
///
/// ```
/// use tower_degrade::Cause;
///
/// assert_eq!(Cause::CircuitOpen.as_str(), "circuit-open");
/// assert!(Cause::BulkheadFull.is_local());
/// assert!(!Cause::Failure.is_local());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Cause {
    /// A breaker below refused the call: its circuit is open (or half-open
    /// with its probes taken). The dependency was not called.
    CircuitOpen,
    /// A bulkhead below refused the call: too many calls in flight. The
    /// dependency was not called.
    BulkheadFull,
    /// Another layer of this process refused the call on purpose (a load
    /// shedder's [`LocalRejection`], or an HTTP answer built by a layer
    /// that refused the request). The dependency was not called.
    LocalRejection,
    /// The deadline passed during the call, or too little of it was left
    /// to start one or to retry.
    DeadlineExceeded,
    /// A retry layer below made every attempt it may and all failed.
    RetriesExhausted,
    /// A retry layer below wanted to retry, and its retry budget refused.
    BudgetExhausted,
    /// The call failed in any other way the classifier counts as a failure:
    /// a transport error, a `5xx` response.
    Failure,
    /// No failure: the exercise mode served the fallback, or the shadow
    /// mode computed it, on purpose, for a sampled healthy call. Selecting
    /// it in [`Causes`] changes nothing.
    Exercise,
}

/// A set of [`Cause`]s: the failures a [`FallbackLayer`](super::FallbackLayer)
/// answers with its fallback (see
/// [`FallbackLayer::causes`](super::FallbackLayer::causes)); the other
/// failures pass through unchanged.
///
/// # Example
///
/// ```
/// use tower_degrade::{Cause, Causes};
///
/// // Only when the dependency was not called at all.
/// let local = Causes::LOCAL;
/// assert!(local.contains(Cause::CircuitOpen));
/// assert!(!local.contains(Cause::Failure));
///
/// let some = Causes::NONE.with(Cause::CircuitOpen).with(Cause::DeadlineExceeded);
/// assert!(some.contains(Cause::DeadlineExceeded));
/// assert!(!Causes::ALL.without(Cause::Failure).contains(Cause::Failure));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Causes {
    bits: u16,
}

/// How a result of the inner service is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judged {
    /// A good answer: served, and remembered by a last-good cache.
    Good,
    /// Says nothing either way (the classifier ignores it, or it is
    /// already a fallback answer): served as is, not remembered.
    Neutral,
    /// A failure with this cause.
    Failed(Cause),
}

// === impl Cause ===

impl Cause {
    /// Every cause, in declaration order.
    pub const ALL: [Cause; 8] = [
        Cause::CircuitOpen,
        Cause::BulkheadFull,
        Cause::LocalRejection,
        Cause::DeadlineExceeded,
        Cause::RetriesExhausted,
        Cause::BudgetExhausted,
        Cause::Failure,
        Cause::Exercise,
    ];

    /// The cause's name in kebab case, as written in the
    /// [`FALLBACK_HEADER`](super::FALLBACK_HEADER) and in `tracing` events:
    /// `circuit-open`, `bulkhead-full`, `local-rejection`,
    /// `deadline-exceeded`, `retries-exhausted`, `budget-exhausted`,
    /// `failure`, `exercise`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Cause::CircuitOpen => "circuit-open",
            Cause::BulkheadFull => "bulkhead-full",
            Cause::LocalRejection => "local-rejection",
            Cause::DeadlineExceeded => "deadline-exceeded",
            Cause::RetriesExhausted => "retries-exhausted",
            Cause::BudgetExhausted => "budget-exhausted",
            Cause::Failure => "failure",
            Cause::Exercise => "exercise",
        }
    }

    /// Whether the dependency was not called at all: a local rejection
    /// ([`CircuitOpen`](Cause::CircuitOpen),
    /// [`BulkheadFull`](Cause::BulkheadFull),
    /// [`LocalRejection`](Cause::LocalRejection)).
    #[must_use]
    pub const fn is_local(self) -> bool {
        matches!(
            self,
            Cause::CircuitOpen | Cause::BulkheadFull | Cause::LocalRejection
        )
    }

    /// The cause's index in [`Cause::ALL`].
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// The header value of the cause (no allocation).
    pub(crate) const fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(self.as_str())
    }

    /// The cause of `error`, if it has one the layer answers: see the
    /// table on [`Cause`]. `is_failure` is asked about errors of no known
    /// kind.
    pub(crate) fn of_error(
        error: &(dyn Error + 'static),
        is_failure: impl FnOnce(&(dyn Error + 'static)) -> bool,
    ) -> Option<Cause> {
        let mut outermost = None;
        let mut next = Some(error);
        while let Some(e) = next {
            if e.is::<CircuitOpen>() {
                return Some(Cause::CircuitOpen);
            }
            if e.is::<BulkheadFull>() {
                return Some(Cause::BulkheadFull);
            }
            if e.is::<LocalRejection>() {
                return Some(Cause::LocalRejection);
            }
            if outermost.is_none() {
                outermost = if e.is::<DeadlineExceeded>()
                    || e.is::<InsufficientBudget>()
                    || e.is::<DeadlineTooClose>()
                {
                    Some(Cause::DeadlineExceeded)
                } else if e.is::<AttemptsExhausted>() {
                    Some(Cause::RetriesExhausted)
                } else if e.is::<BudgetExhausted>() {
                    Some(Cause::BudgetExhausted)
                } else {
                    None
                };
            }
            next = e.source();
        }
        outermost.or_else(|| is_failure(error).then_some(Cause::Failure))
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl Causes ===

impl Causes {
    /// No cause: the fallback answers only in exercise mode.
    pub const NONE: Causes = Causes { bits: 0 };

    /// Every failure (the default): local rejections, deadlines, spent
    /// retries and classified failures.
    pub const ALL: Causes = Causes {
        bits: (1 << Cause::Exercise as u16) - 1,
    };

    /// The local rejections only ([`Cause::is_local`]): the circuit is
    /// open, the bulkhead is full, a layer shed the call. The dependency
    /// was not called, so answering for it cannot hide the outcome of a
    /// write that may have happened.
    pub const LOCAL: Causes = Causes::NONE
        .with(Cause::CircuitOpen)
        .with(Cause::BulkheadFull)
        .with(Cause::LocalRejection);

    /// The set of `cause` alone.
    #[must_use]
    pub const fn only(cause: Cause) -> Causes {
        Causes::NONE.with(cause)
    }

    /// This set and `cause`.
    #[must_use]
    pub const fn with(self, cause: Cause) -> Causes {
        Causes {
            bits: self.bits | (1 << cause as u16),
        }
    }

    /// This set without `cause`.
    #[must_use]
    pub const fn without(self, cause: Cause) -> Causes {
        Causes {
            bits: self.bits & !(1 << cause as u16),
        }
    }

    /// Whether `cause` is in the set.
    #[must_use]
    pub const fn contains(self, cause: Cause) -> bool {
        self.bits & (1 << cause as u16) != 0
    }
}

impl Default for Causes {
    fn default() -> Self {
        Causes::ALL
    }
}

impl fmt::Debug for Causes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(Cause::ALL.iter().filter(|c| self.contains(**c)))
            .finish()
    }
}

impl FromIterator<Cause> for Causes {
    fn from_iter<I: IntoIterator<Item = Cause>>(iter: I) -> Self {
        iter.into_iter().fold(Causes::NONE, Causes::with)
    }
}

// === judging results ===

/// How the HTTP flavour judges a response: a fallback answer of an inner
/// layer passes untouched; an answer a layer of this process built when it
/// refused the request is a failure of the matching local cause; the rest
/// is the classifier's call.
pub(crate) fn judge_http<B: 'static>(
    classifier: &dyn Classify<Response<B>>,
    response: &Response<B>,
) -> Judged {
    if response.extensions().get::<FallbackServed>().is_some() {
        return Judged::Neutral;
    }
    if is_local_answer(response) {
        let grpc = GrpcCode::from_headers(response.headers());
        let cause = if response.status() == StatusCode::GATEWAY_TIMEOUT
            || grpc == Some(GrpcCode::DeadlineExceeded)
        {
            Cause::DeadlineExceeded
        } else if grpc == Some(GrpcCode::ResourceExhausted) {
            Cause::BulkheadFull
        } else {
            Cause::LocalRejection
        };
        return Judged::Failed(cause);
    }
    judge_plain(classifier, response)
}

/// How the plain flavour judges a response: the classifier's call.
pub(crate) fn judge_plain<Res: 'static>(classifier: &dyn Classify<Res>, response: &Res) -> Judged {
    match classifier.classify_response(response) {
        Outcome::Success => Judged::Good,
        Outcome::Failure => Judged::Failed(Cause::Failure),
        Outcome::Ignored => Judged::Neutral,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::time::Duration;
    use tower_resilience_base::BoxError;

    fn cause(error: BoxError) -> Option<Cause> {
        Cause::of_error(&*error, |_| true)
    }

    fn refused() -> BoxError {
        io::Error::from(io::ErrorKind::ConnectionRefused).into()
    }

    #[test]
    fn every_error_has_its_cause() {
        let open = || CircuitOpen::new("b", Duration::from_secs(1), false);
        let cases: Vec<(BoxError, Cause)> = vec![
            (Box::new(open()), Cause::CircuitOpen),
            (
                Box::new(BulkheadFull::new("c", 1, None)),
                Cause::BulkheadFull,
            ),
            (Box::new(LocalRejection::new("shed")), Cause::LocalRejection),
            (Box::new(DeadlineExceeded::new()), Cause::DeadlineExceeded),
            (
                Box::new(InsufficientBudget::new(Duration::ZERO, Duration::ZERO)),
                Cause::DeadlineExceeded,
            ),
            (
                Box::new(DeadlineTooClose::new(2, refused())),
                Cause::DeadlineExceeded,
            ),
            (
                Box::new(AttemptsExhausted::new(3, refused())),
                Cause::RetriesExhausted,
            ),
            (
                Box::new(BudgetExhausted::new(1, refused())),
                Cause::BudgetExhausted,
            ),
            // A local rejection inside a give-up decides.
            (
                Box::new(AttemptsExhausted::new(2, Box::new(open()))),
                Cause::CircuitOpen,
            ),
            // The outermost of the others decides.
            (
                Box::new(AttemptsExhausted::new(3, Box::new(DeadlineExceeded::new()))),
                Cause::RetriesExhausted,
            ),
            (refused(), Cause::Failure),
        ];
        for (error, expected) in cases {
            assert_eq!(cause(error), Some(expected));
        }
    }

    #[test]
    fn unknown_errors_follow_the_classifier() {
        assert_eq!(Cause::of_error(&*refused(), |_| false), None);
        let open: BoxError = Box::new(CircuitOpen::new("b", Duration::ZERO, false));
        assert_eq!(Cause::of_error(&*open, |_| false), Some(Cause::CircuitOpen));
    }

    #[test]
    fn sets() {
        for c in Cause::ALL {
            assert_eq!(Causes::ALL.contains(c), c != Cause::Exercise);
            assert_eq!(Causes::LOCAL.contains(c), c.is_local());
            assert!(Causes::only(c).contains(c));
            assert!(!Causes::NONE.contains(c));
        }
        let set: Causes = [Cause::Failure, Cause::CircuitOpen].into_iter().collect();
        assert_eq!(format!("{set:?}"), "{CircuitOpen, Failure}");
    }
}
