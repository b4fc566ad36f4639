//! Shared pieces of the examples: an adapter that puts `reqwest::Client`
//! under tower layers while callers keep writing `client.get(url).send()`,
//! and the helpers every example uses ([`demo`]).
//!
//! The binaries in `src/bin/` are the examples; see `examples/README.md`.

pub mod demo;
pub mod reqwest_adapter;
