//! Shared pieces of the examples: the helpers every example uses
//! ([`demo`]), and the overload harness's simulation ([`overload`]).
//! reqwest goes through the stack with the published
//! `tower_shield::reqwest` module (feature `reqwest`).
//!
//! The binaries in `src/bin/` are the examples; see `examples/README.md`.

pub mod demo;
pub mod overload;
