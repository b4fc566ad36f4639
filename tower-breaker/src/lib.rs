//! A circuit breaker for tower services.
//!
//! This crate is being built: it will provide a breaker (closed, open,
//! half-open with a single probe) that counts every retry attempt while stacked
//! outside the retry layer, with state that can be shared across processes
//! through Redis.
