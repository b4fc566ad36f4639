//! Fail-fast concurrency compartments (bulkheads) for tower services.
//!
//! This crate is being built: it will provide a bulkhead layer that caps the
//! calls in flight to one dependency (or one key: host, route, tenant) and
//! rejects at once when the compartment is full instead of queueing.
