//! The store contract, clause by clause, on the memory store.

use std::sync::Arc;

use tower_breaker::store::MemoryStore;
use tower_breaker_conformance::Fixture;

async fn memory(_clause: &'static str) -> Option<Fixture> {
    Some(Fixture::new(Arc::new(MemoryStore::new())))
}

tower_breaker_conformance::tests!(memory);
