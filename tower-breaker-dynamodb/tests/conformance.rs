//! The store contract (`tower-breaker-conformance`), clause by clause, on
//! DynamoDB: moto's server, started for the clause on a free port of
//! 127.0.0.1.

mod support;

use std::sync::Arc;

use support::moto_server::{options, MotoServer};
use tower_breaker_conformance::Fixture;

async fn moto(clause: &'static str) -> Option<Fixture> {
    let server = MotoServer::start_or_skip(clause)?;
    let store = server.store("circuits", options(0)).await;
    Some(Fixture::with_guard(Arc::new(store), server))
}

tower_breaker_conformance::tests!(moto);
