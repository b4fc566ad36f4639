//! What counts as a failure: the replaceable classification of responses
//! and errors.
//!
//! These are the toolkit's one definition, from `tower-resilience-base`'s
//! [`outcome`](tower_resilience_base::outcome) module: the fallback layer
//! judges by the same [`Classify`] trait, so one classifier value serves
//! both.

use std::error::Error;

pub use tower_resilience_base::outcome::{
    by_class, classify_error, classify_fn, default_outcome, ByClass, Classify, ClassifyFn,
    DefaultClassifier, ErrorsOnly, Outcome,
};

/// Classifies a result with `classifier`.
pub(crate) fn outcome<Res, C: Classify<Res> + ?Sized>(
    classifier: &C,
    result: Result<&Res, &(dyn Error + 'static)>,
) -> Outcome {
    match result {
        Ok(response) => classifier.classify_response(response),
        Err(error) => classifier.classify_error(error),
    }
}
