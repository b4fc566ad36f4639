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

/// A subscriber that records every event as one line, `message key=value
/// ...` (values by `Debug`, so strings are quoted), for tests that check
/// the events a layer emits. Install it with [`set_default`].
///
/// # Example
///
/// ```
/// let capture = resilience_testkit::Capture::default();
/// let _guard = resilience_testkit::set_default(capture.clone());
/// tracing::info!(attempt = 2, "hedge won");
/// assert_eq!(capture.lines("hedge"), ["hedge won attempt=2"]);
/// ```
#[derive(Clone, Default)]
pub struct Capture(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

struct Line(String);

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = Line(String::new());
        event.record(&mut line);
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(line.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl Capture {
    /// The recorded lines that start with `starting`, in order.
    #[must_use]
    pub fn lines(&self, starting: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|l| l.starts_with(starting))
            .cloned()
            .collect()
    }
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture").finish_non_exhaustive()
    }
}
