//! Retries for tower services that cannot turn into a retry storm.
//!
//! This crate is being built: it will provide a retry layer with exponential
//! backoff and full jitter, capped by a 10% retry budget shared by all clones,
//! retrying only transient failures of idempotent requests and never past the
//! caller's deadline (read through `tower-deadline`).
