//! Shared pieces of the examples: the helpers every example uses
//! ([`demo`]). reqwest goes through the stack with the published
//! `tower_shield::reqwest` module (feature `reqwest`).
//!
//! The binaries in `src/bin/` are the examples; see `examples/README.md`.

pub mod demo;
