//! Helpers shared by the workspace's test suites. Not published: every
//! crate lists it as a path-only dev-dependency, which `cargo package`
//! leaves out.

pub mod process;
pub mod redis;

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

    /// The recorded lines that contain `needle` anywhere (the message, a
    /// field's name or its value), in order: for checking that a value
    /// was logged somewhere, or never (a password, say).
    ///
    /// # Example
    ///
    /// ```
    /// let capture = resilience_testkit::Capture::default();
    /// let _guard = resilience_testkit::set_default(capture.clone());
    /// tracing::warn!(error = "tls: bad certificate", "store failed");
    /// assert_eq!(capture.containing("certificate").len(), 1);
    /// assert!(capture.containing("hunter2").is_empty());
    /// ```
    #[must_use]
    pub fn containing(&self, needle: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture").finish_non_exhaustive()
    }
}

/// One event an [`Events`] recorded: its message, and its other fields as
/// text (a string as it is, anything else by `Debug`, so `7` for a number).
pub type Event = (String, std::collections::BTreeMap<String, String>);

/// A subscriber that records the events at or above a level (`INFO` by
/// default), each as its message and fields, for tests that count or
/// inspect the events a layer emits. Install it with [`set_default`].
///
/// # Example
///
/// ```
/// let events = resilience_testkit::Events::default();
/// let _guard = resilience_testkit::set_default(events.clone());
/// tracing::warn!(suppressed = 3u64, "calls rejected");
/// tracing::debug!("below the level: not recorded");
/// assert_eq!(events.mentioning("rejected"), 1);
/// let seen = events.take();
/// assert_eq!(seen.len(), 1);
/// assert_eq!(seen[0].1["suppressed"], "3");
/// ```
#[derive(Debug, Clone)]
pub struct Events {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Event>>>,
    next_id: std::sync::Arc<std::sync::atomic::AtomicU64>,
    level: tracing::Level,
}

impl Default for Events {
    fn default() -> Self {
        Self::at_least(tracing::Level::INFO)
    }
}

impl Events {
    /// Records the events at `level` or above (`WARN` keeps `WARN` and
    /// `ERROR`; `TRACE` keeps all).
    pub fn at_least(level: tracing::Level) -> Self {
        Self {
            seen: std::sync::Arc::default(),
            next_id: std::sync::Arc::default(),
            level,
        }
    }

    /// The events since the last `take`, taken out.
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.lock())
    }

    /// The events since the last `take`, left in place.
    pub fn seen(&self) -> Vec<Event> {
        self.lock().clone()
    }

    /// How many events since the last `take` have a message containing
    /// `text`.
    pub fn mentioning(&self, text: &str) -> usize {
        self.lock()
            .iter()
            .filter(|(message, _)| message.contains(text))
            .count()
    }

    /// How many events since the last `take` have exactly `message`.
    pub fn count(&self, message: &str) -> usize {
        self.lock().iter().filter(|(m, _)| m == message).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Event>> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Fields(Event);

impl tracing::field::Visit for Fields {
    // A string field reads the same whether it was recorded as a `&str` or
    // with `%` (Display): unquoted.
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.record_debug(field, &format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.0 .0 = text;
        } else {
            self.0 .1.insert(field.name().to_owned(), text);
        }
    }
}

impl Subscriber for Events {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= self.level
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::span::Id::from_u64(id + 1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(Event::default());
        event.record(&mut fields);
        self.lock().push(fields.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
