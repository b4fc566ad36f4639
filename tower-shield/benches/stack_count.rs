//! One variant of the stack benches (see `stack`), called a given number of
//! times, for `valgrind --tool=callgrind`: instructions per call repeat
//! from run to run, where times on a shared virtual machine do not. Take
//! the difference of two runs (say 20,000 and 10,000 calls) over the
//! difference of their calls, so that the setup cancels out.
//!
//! ```text
//! cargo bench -p tower-shield --bench stack_count --no-run
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/deps/stack_count-<hash> "client_stack (one line)" bare 20000
//! ```
//!
//! A fourth argument, `clone`, clones the service for every call (as a
//! client that hands each request a copy of the stack does). With no
//! arguments it lists the variants, each with the size of its response
//! future.

#![allow(missing_docs)]

#[path = "support/stack.rs"]
#[macro_use]
mod stack;

use stack::*;
use tower_breaker::Breaker;

macro_rules! one {
    ($($name:literal => $make:expr),* $(,)?) => {
        fn main() {
            let args: Vec<String> = std::env::args().skip(1).collect();
            let (Some(variant), Some(shape), Some(calls)) = (args.first(), args.get(1), args.get(2))
            else {
                eprintln!("usage: stack_count VARIANT bare|real CALLS [clone]; variants, with their response future's size:");
                $(eprintln!("  {} ({} bytes)", $name, future_size(&$make));)*
                return;
            };
            let shape = if shape == "real" { Shape::Real } else { Shape::Bare };
            let calls: u64 = calls.parse().expect("CALLS is a number");
            let cloned = args.get(3).is_some_and(|a| a == "clone");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            $(
                if variant == $name {
                    if cloned {
                        rt.block_on(run_cloned($make, shape, calls));
                    } else {
                        rt.block_on(run($make, shape, calls));
                    }
                    return;
                }
            )*
            eprintln!("no variant named {variant:?}");
            std::process::exit(2);
        }
    };
}

/// The size of `S`'s response future: what every caller's `await` moves.
fn future_size<S: tower::Service<http::Request<()>>>(_: &S) -> usize {
    std::mem::size_of::<S::Future>()
}

for_each_variant!(one);
