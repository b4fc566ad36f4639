//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts how many times something was dropped; put one in a future to
/// observe that the future was dropped.
#[derive(Debug, Clone, Default)]
pub struct DropCounter(Arc<AtomicUsize>);

/// A guard that bumps its counter when dropped.
#[derive(Debug)]
pub struct DropGuard(Arc<AtomicUsize>);

impl DropCounter {
    pub fn guard(&self) -> DropGuard {
        DropGuard(self.0.clone())
    }

    pub fn dropped(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Counts calls.
#[derive(Debug, Clone, Default)]
pub struct CallCounter(Arc<AtomicUsize>);

impl CallCounter {
    pub fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    pub fn calls(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A request with one header.
pub fn request_with(name: &'static str, value: &'static str) -> http::Request<()> {
    http::Request::builder()
        .header(name, value)
        .body(())
        .expect("valid request")
}

/// A gRPC request with a `grpc-timeout`.
pub fn grpc_request(timeout: &'static str) -> http::Request<()> {
    http::Request::builder()
        .header("content-type", "application/grpc")
        .header("grpc-timeout", timeout)
        .body(())
        .expect("valid request")
}

/// Header lines of a request, as `(name, value)` pairs.
pub type Lines = &'static [(&'static str, &'static str)];

/// A request carrying each `(name, value)` as its own header line, in order
/// (a name given twice gives two lines).
pub fn request_with_lines(lines: Lines) -> http::Request<()> {
    let mut builder = http::Request::builder();
    for (name, value) in lines {
        builder = builder.header(*name, *value);
    }
    builder.body(()).expect("valid request")
}
