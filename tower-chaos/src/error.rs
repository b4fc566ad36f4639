//! The error of an injected fault, and the marks on injected answers.

use std::error::Error;
use std::fmt;
use std::io;
use std::sync::Arc;

use crate::plan::FaultKind;

/// The header on every response a fault layer touched: its value is the
/// [`FaultKind::as_str`] of the fault (`latency`, `status` or
/// `abort_body`; several, comma-separated). An operator, a test or a
/// dashboard can tell injected answers from real ones by it.
pub const INJECTED_FAULT_HEADER: &str = "x-injected-fault";

/// The error of an injected fault: an [`Error`](FaultKind::Error) fault,
/// a [`Hang`](FaultKind::Hang) that reached its
/// [`max_hang`](crate::FaultPlan::max_hang), or an
/// [`AbortBody`](FaultKind::AbortBody) fault (as the response body's
/// error, or as the call's on a plain service).
///
/// Its [`source`](Error::source) is an [`io::Error`] of the kind a real
/// fault of that sort shows (a connection reset, a timed out read, an
/// aborted connection), so that classifiers treat it as the real thing:
/// the breaker counts it as the dependency's failure and the retry layer
/// retries it within its budget. That is the point of a game day. Tell it
/// apart with [`is_injected`], which looks along the source chain.
///
/// # Example
///
/// ```
/// use tower_chaos::{is_injected, FaultKind, InjectedFault};
/// use tower_resilience_base::classify::is_transient_error;
///
/// let fault = InjectedFault::new("payments", FaultKind::Error);
/// assert!(is_injected(&fault));
/// assert!(is_transient_error(&fault)); // a connection reset, as far as retries know
/// assert_eq!(
///     fault.to_string(),
///     "fault injected by `payments`: error (not a real failure)"
/// );
/// ```
#[derive(Debug)]
pub struct InjectedFault {
    layer: Arc<str>,
    kind: FaultKind,
    source: io::Error,
}

impl InjectedFault {
    /// The fault `kind` injected by the layer named `layer`.
    pub fn new(layer: impl Into<Arc<str>>, kind: FaultKind) -> Self {
        let io = match kind {
            FaultKind::Hang => io::ErrorKind::TimedOut,
            FaultKind::AbortBody => io::ErrorKind::ConnectionAborted,
            _ => io::ErrorKind::ConnectionReset,
        };
        Self {
            layer: layer.into(),
            kind,
            source: io::Error::new(io, "injected fault"),
        }
    }

    /// The kind of fault.
    #[must_use]
    pub fn kind(&self) -> FaultKind {
        self.kind
    }

    /// The name of the fault layer ([`FaultHandle::name`](crate::FaultHandle::name)).
    #[must_use]
    pub fn layer(&self) -> &str {
        &self.layer
    }
}

impl fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fault injected by `{}`: {} (not a real failure)",
            self.layer, self.kind
        )
    }
}

impl Error for InjectedFault {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.source)
    }
}

/// Whether `error`, or an error in its source chain, is an
/// [`InjectedFault`].
///
/// # Example
///
/// ```
/// use tower_chaos::is_injected;
///
/// let real = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
/// assert!(!is_injected(&real));
/// ```
#[must_use]
pub fn is_injected(error: &(dyn Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<InjectedFault>() {
            return true;
        }
        next = error.source();
    }
    false
}

/// The extension on every response a fault layer touched: which faults it
/// got (the same as the [`INJECTED_FAULT_HEADER`]).
///
/// # Example
///
/// ```
/// use tower_chaos::{FaultKind, Injected};
///
/// let mark = Injected::default().with(FaultKind::Latency);
/// assert!(mark.contains(FaultKind::Latency));
/// assert!(!mark.contains(FaultKind::Status));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Injected(u8);

impl Injected {
    /// This mark with `kind` added.
    #[must_use]
    pub fn with(self, kind: FaultKind) -> Self {
        Self(self.0 | 1 << kind.index())
    }

    /// Whether the response got a fault of `kind`.
    #[must_use]
    pub fn contains(self, kind: FaultKind) -> bool {
        self.0 & 1 << kind.index() != 0
    }

    /// The kinds, as the header's value.
    pub(crate) fn header_value(self) -> http::HeaderValue {
        let names: Vec<&str> = FaultKind::ALL
            .into_iter()
            .filter(|k| self.contains(*k))
            .map(FaultKind::as_str)
            .collect();
        http::HeaderValue::from_str(&names.join(","))
            .unwrap_or_else(|_| http::HeaderValue::from_static("fault"))
    }
}
