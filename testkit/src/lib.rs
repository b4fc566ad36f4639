//! Helpers shared by the workspace's test suites. Not published: every
//! crate lists it as a path-only dev-dependency, which `cargo package`
//! leaves out.

use std::sync::OnceLock;

use tracing::dispatcher::{DefaultGuard, Dispatch};
use tracing::subscriber::NoSubscriber;
use tracing::Subscriber;

/// Makes `subscriber` this thread's default until the guard drops, as
/// [`tracing::subscriber::set_default`] does, and keeps the events it
/// sees independent of the other tests of the binary.
///
/// `tracing-core` caches each call site's interest globally. While only
/// one dispatcher is registered it takes a shortcut: a call site first
/// reached on a thread computes its interest from *that thread's*
/// default. A test without a subscriber of its own (whose thread's
/// default is the no-op one) that reaches a call site first, while one
/// other test's subscriber is the only registered dispatcher, then
/// caches "never" for everybody, and the capturing test sees none of
/// that call site's events (seen in CI: `circuit_half_open` and
/// `circuit_closed` missing from `tower-breaker`'s events test). A
/// second dispatcher that lives for the whole process (a no-op one,
/// which answers "never" and so makes the combined interest
/// "sometimes") turns the shortcut off: every call site's interest is
/// then computed from every registered dispatcher, and each event asks
/// its thread's default.
///
/// # Example
///
/// ```
/// let _guard = resilience_testkit::set_default(tracing::subscriber::NoSubscriber::default());
/// tracing::info!("seen by this thread's subscriber only");
/// ```
pub fn set_default<S>(subscriber: S) -> DefaultGuard
where
    S: Subscriber + Send + Sync + 'static,
{
    static KEEPER: OnceLock<Dispatch> = OnceLock::new();
    KEEPER.get_or_init(|| Dispatch::new(NoSubscriber::default()));
    tracing::subscriber::set_default(subscriber)
}
