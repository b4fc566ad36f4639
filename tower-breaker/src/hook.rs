//! The breaker's side of the attempt hook (`tower_resilience_base::hook`):
//! every attempt of a retry or hedging layer below the breaker is counted,
//! and the layer stops when the circuit opens.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use tower_resilience_base::hook::{AttemptHook, AttemptOutcome, AttemptToken};

use crate::body;
use crate::breaker::{thread_index, Breaker, Kind, Raw, STRIPES};
use crate::classify::{default_outcome, Classify, Outcome};
use crate::BoxError;

/// One breaker's hook, shared by every call through one layer: per-call
/// state travels in the tokens (the admission and its start time), so there
/// is no allocation per call.
///
/// `Res` is the response type the layer's classifier judges; an outcome of
/// another type (a `map_response` between the breaker and the retry layer)
/// is classified from its status and headers.
pub(crate) struct BreakerHook<C, Res> {
    breaker: Breaker,
    classifier: C,
    /// Whether the type-mismatch warning was given (shared by the stripes
    /// of one layer's hook, so it is given once).
    warned: Arc<AtomicBool>,
    _res: PhantomData<fn(&Res)>,
}

// === impl BreakerHook ===

impl<C, Res> BreakerHook<C, Res> {
    pub(crate) fn new(breaker: Breaker, classifier: C) -> Self {
        Self::with_warned(breaker, classifier, Arc::default())
    }

    fn with_warned(breaker: Breaker, classifier: C, warned: Arc<AtomicBool>) -> Self {
        Self {
            breaker,
            classifier,
            warned,
            _res: PhantomData,
        }
    }
}

/// One layer's hook, striped: a copy per thread stripe, each behind its own
/// `Arc`, so that calls on different threads clone (and drop) different
/// reference counts instead of bouncing one cache line between cores.
pub(crate) type HookStripes = Box<[Arc<dyn AttemptHook>]>;

/// The stripes of a new hook for `breaker` with `classifier`.
pub(crate) fn stripes<C, Res>(breaker: &Breaker, classifier: &C) -> HookStripes
where
    C: Classify<Res> + Clone,
    Res: 'static,
{
    let warned = Arc::new(AtomicBool::new(false));
    (0..STRIPES)
        .map(|_| {
            Arc::new(BreakerHook::<C, Res>::with_warned(
                breaker.clone(),
                classifier.clone(),
                Arc::clone(&warned),
            )) as Arc<dyn AttemptHook>
        })
        .collect()
}

/// This thread's stripe.
#[inline]
pub(crate) fn stripe(stripes: &HookStripes) -> &Arc<dyn AttemptHook> {
    &stripes[thread_index() % stripes.len()]
}

/// The token of an admission: the admission and the start time (for
/// slow-call detection; 0 when not needed).
pub(crate) fn token(
    breaker: &Breaker,
    raw: Raw,
) -> Result<AttemptToken, crate::error::CircuitOpen> {
    match breaker.core.started_ns(raw) {
        Ok(started_ns) => Ok(AttemptToken::new(pack(raw), started_ns)),
        Err(rejection) => Err(breaker.open_error(rejection)),
    }
}

impl<C, Res> AttemptHook for BreakerHook<C, Res>
where
    C: Classify<Res>,
    Res: 'static,
{
    fn admit(&self) -> Result<AttemptToken, BoxError> {
        match self.breaker.admit() {
            Ok(raw) => token(&self.breaker, raw).map_err(|open| Box::new(open) as BoxError),
            Err(rejection) => Err(Box::new(self.breaker.open_error(rejection))),
        }
    }

    fn check(&self) -> Result<(), BoxError> {
        self.breaker
            .peek()
            .map_err(|rejection| Box::new(self.breaker.open_error(rejection)) as BoxError)
    }

    fn record(&self, token: AttemptToken, outcome: AttemptOutcome<'_>) {
        let (raw, started_ns) = token.parts();
        let Some(raw) = unpack(raw) else { return };
        let outcome_kind = match outcome {
            AttemptOutcome::Response(_) => Reported::Response,
            AttemptOutcome::Error(_) => Reported::Error,
        };
        let outcome = match outcome {
            AttemptOutcome::Error(e) => self.classifier.classify_error(e),
            AttemptOutcome::Response(view) => match view
                .class()
                .and_then(|class| self.classifier.classify_class(class))
            {
                // Judged once, by the retry layer below.
                Some(outcome) => outcome,
                None => match self.classifier.classify_head(view.status(), view.headers()) {
                    Some(outcome) => outcome,
                    None => match view.downcast_ref::<Res>() {
                        Some(response) => self.classifier.classify_response(response),
                        None => {
                            if !self.warned.swap(true, Relaxed) {
                                tracing::warn!(
                                    breaker = %self.breaker.name(),
                                    classifier = std::any::type_name::<C>(),
                                    expected = std::any::type_name::<Res>(),
                                    "circuit_hook_type_mismatch: the retry layer below \
                                     reports responses of another type than the \
                                     classifier judges (a map_response between them?); \
                                     classifying them by status and headers instead"
                                );
                            }
                            default_outcome(view.status(), view.headers())
                        }
                    },
                },
            },
        };
        // A good answer whose body is still to come, reported while this
        // breaker's response future polls the layers below on this thread:
        // its outcome waits for the body (see `crate::body`).
        if outcome == Outcome::Success
            && matches!(outcome_kind, Reported::Response)
            && body::collecting(self.breaker.id())
        {
            body::defer(self.breaker.permit_started(raw, started_ns));
            return;
        }
        self.breaker.stop_timing(raw, started_ns);
        let elapsed = self.breaker.core.elapsed(started_ns);
        self.breaker.complete(raw, outcome, elapsed);
    }

    fn cancel(&self, token: AttemptToken) {
        let (packed, started_ns) = token.parts();
        if let Some(raw) = unpack(packed) {
            self.breaker.stop_timing(raw, started_ns);
            self.breaker.cancel(raw);
        }
    }
}

/// What an attempt reported.
enum Reported {
    Response,
    Error,
}

impl<C, Res> fmt::Debug for BreakerHook<C, Res> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerHook")
            .field("breaker", &self.breaker.name())
            .finish_non_exhaustive()
    }
}

pub(crate) fn pack(raw: Raw) -> u64 {
    let kind = match raw.kind {
        Kind::Tracked => 0,
        Kind::Probe => 1,
        Kind::Untracked => 2,
    };
    (1 << 63) | (kind << 32) | u64::from(raw.gen)
}

pub(crate) fn unpack(word: u64) -> Option<Raw> {
    if word == 0 {
        return None;
    }
    let kind = match (word >> 32) & 0b11 {
        0 => Kind::Tracked,
        1 => Kind::Probe,
        _ => Kind::Untracked,
    };
    Some(Raw {
        gen: word as u32,
        kind,
    })
}
