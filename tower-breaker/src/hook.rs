//! The breaker's side of `tower-retry-budget`'s attempt hook: every attempt
//! of a retry loop below the breaker is counted, and the loop stops when
//! the circuit opens.

use std::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::Duration;

use tower_retry_budget::AttemptHook;

use crate::breaker::{Breaker, Kind, Raw};
use crate::classify::{outcome, Classify};
use crate::BoxError;

/// The per-request hook: the admission of the attempt in flight, and
/// whether the retry layer recorded anything.
pub(crate) struct Attempts<C> {
    breaker: Breaker,
    classifier: C,
    /// The admission of the attempt in flight: 0 for none.
    permit: AtomicU64,
    started_ns: AtomicU64,
    recorded: AtomicBool,
}

// === impl Attempts ===

impl<C> Attempts<C> {
    pub(crate) fn new(breaker: Breaker, classifier: C, raw: Raw, started_ns: u64) -> Self {
        Self {
            breaker,
            classifier,
            permit: AtomicU64::new(pack(raw)),
            started_ns: AtomicU64::new(started_ns),
            recorded: AtomicBool::new(false),
        }
    }

    fn take(&self) -> Option<Raw> {
        unpack(self.permit.swap(0, AcqRel))
    }

    /// The outer future completed: counts the final outcome, unless the
    /// retry layer below already counted every attempt.
    pub(crate) fn finish<Res>(&self, result: Result<&Res, &(dyn Error + 'static)>)
    where
        C: Classify<Res>,
    {
        let Some(raw) = self.take() else { return };
        if self.recorded.load(Acquire) {
            // Admitted by `before_retry`, then never sent.
            self.breaker.cancel(raw);
            return;
        }
        let core = &self.breaker.core;
        let elapsed = core.elapsed(self.started_ns.load(Relaxed));
        self.breaker
            .complete(raw, outcome(&self.classifier, result), elapsed);
    }

    /// The outer future was dropped: whatever is in flight is cancelled.
    pub(crate) fn abandon(&self) {
        if let Some(raw) = self.take() {
            self.breaker.cancel(raw);
        }
    }
}

impl<Res, C: Classify<Res>> AttemptHook<Res> for Attempts<C> {
    fn before_retry(&self) -> Result<(), BoxError> {
        if let Some(raw) = self.take() {
            self.breaker.cancel(raw);
        }
        match self.breaker.admit() {
            Ok(raw) => {
                self.started_ns
                    .store(self.breaker.core.started_ns(raw), Relaxed);
                self.permit.store(pack(raw), Release);
                Ok(())
            }
            Err(rejection) => Err(Box::new(self.breaker.open_error(rejection))),
        }
    }

    fn record(&self, result: Result<&Res, &(dyn Error + 'static)>, elapsed: Duration) {
        self.recorded.store(true, Release);
        if let Some(raw) = self.take() {
            self.breaker
                .complete(raw, outcome(&self.classifier, result), Some(elapsed));
        }
    }
}

impl<C> fmt::Debug for Attempts<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempts")
            .field("breaker", &self.breaker.name())
            .field("recorded", &self.recorded.load(Relaxed))
            .finish()
    }
}

fn pack(raw: Raw) -> u64 {
    let kind = match raw.kind {
        Kind::Tracked => 0,
        Kind::Probe => 1,
        Kind::Untracked => 2,
    };
    (1 << 63) | (kind << 32) | u64::from(raw.gen)
}

fn unpack(word: u64) -> Option<Raw> {
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
