//! How much a request matters when there is not room for all of them: the
//! four criticalities of Google's SRE book, carried by a request (an
//! extension, a header between services, a task-local inside a handler) so
//! that the layers that shed load shed the lowest first.
//!
//! | criticality | for | on the wire (`x-criticality`) |
//! |---|---|---|
//! | [`CriticalPlus`](Criticality::CriticalPlus) | the requests whose failure users see at once, and that the service's capacity is planned for | `critical-plus` |
//! | [`Critical`](Criticality::Critical) (the default) | ordinary online traffic | `critical` |
//! | [`SheddablePlus`](Criticality::SheddablePlus) | work that may be refused now and retried later (batch jobs that retry) | `sheddable-plus` |
//! | [`Sheddable`](Criticality::Sheddable) | work that may be refused often, even for long (prefetches, best-effort refreshes) | `sheddable` |
//!
//! Where a request's criticality comes from, first match wins
//! ([`Criticality::of`]): the request's extensions (set by the caller, or
//! by a server layer that read the header), then the task-local scope of
//! the request being served ([`Criticality::current`], so that the calls a
//! handler makes inherit its criticality, as they inherit its deadline),
//! then [`Critical`](Criticality::Critical).
//!
//! A server must not let any caller raise its own importance: it reads the
//! header [clamped](Criticality::clamp) to the most it grants callers
//! (by default [`Critical`](Criticality::Critical)).
//!
//! # Example
//!
//! ```
//! use http::Request;
//! use tower_resilience_base::criticality::{Criticality, CRITICALITY_HEADER};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // A server reads what the caller claims, but grants at most `Critical`.
//! let incoming = Request::builder()
//!     .header(CRITICALITY_HEADER, "critical-plus")
//!     .body(())
//!     .unwrap();
//! let granted = Criticality::from_headers(incoming.headers())
//!     .unwrap_or_default()
//!     .clamp(Criticality::Critical);
//! assert_eq!(granted, Criticality::Critical);
//!
//! // While the handler runs in its scope, its outgoing calls inherit it.
//! let outgoing = granted
//!     .scope(async { Criticality::of(&Request::new(())) })
//!     .await;
//! assert_eq!(outgoing, Criticality::Critical);
//! assert!(Criticality::Sheddable < Criticality::Critical);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::str::FromStr;

use http::{Extensions, HeaderMap, HeaderName, HeaderValue, Request};
use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static SERVING: Criticality;
}

/// The header that carries a request's criticality between services.
pub const CRITICALITY_HEADER: HeaderName = HeaderName::from_static("x-criticality");

/// How much a request matters when not all can be served; ordered from
/// least ([`Sheddable`](Self::Sheddable)) to most
/// ([`CriticalPlus`](Self::CriticalPlus)) important. See the
/// [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Criticality {
    /// May be refused often, even for long.
    Sheddable,
    /// May be refused now and retried later.
    SheddablePlus,
    /// Ordinary online traffic: the default.
    #[default]
    Critical,
    /// The traffic the service's capacity is planned for.
    CriticalPlus,
}

/// A header value that names no criticality.
///
/// # Example
///
/// ```
/// use tower_resilience_base::criticality::Criticality;
///
/// let err = "urgent".parse::<Criticality>().unwrap_err();
/// assert_eq!(
///     err.to_string(),
///     "unknown criticality `urgent` (expected critical-plus, critical, sheddable-plus or sheddable)"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseCriticalityError {
    value: String,
}

// === impl Criticality ===

impl Criticality {
    /// Every criticality, least important first.
    pub const ALL: [Criticality; 4] = [
        Criticality::Sheddable,
        Criticality::SheddablePlus,
        Criticality::Critical,
        Criticality::CriticalPlus,
    ];

    /// Its name on the wire: `critical-plus`, `critical`, `sheddable-plus`
    /// or `sheddable`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Criticality::Sheddable => "sheddable",
            Criticality::SheddablePlus => "sheddable-plus",
            Criticality::Critical => "critical",
            Criticality::CriticalPlus => "critical-plus",
        }
    }

    /// Its rank, 0 ([`Sheddable`](Self::Sheddable)) to 3
    /// ([`CriticalPlus`](Self::CriticalPlus)), for tables indexed by
    /// criticality.
    #[must_use]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// At most `max`: what a server grants a caller that claims `self`.
    #[must_use]
    pub fn clamp(self, max: Criticality) -> Criticality {
        self.min(max)
    }

    /// The criticality a header map carries (`x-criticality`), if any and
    /// valid. The name is matched without regard to case; an invalid value
    /// is treated as absent.
    #[must_use]
    pub fn from_headers(headers: &HeaderMap) -> Option<Criticality> {
        headers
            .get(CRITICALITY_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
    }

    /// The criticality stored in a request's extensions, if any.
    #[must_use]
    pub fn from_extensions(extensions: &Extensions) -> Option<Criticality> {
        extensions.get::<Criticality>().copied()
    }

    /// The criticality of the request being served on this task, if a
    /// server layer put it in scope ([`scope`](Self::scope)).
    #[must_use]
    pub fn current() -> Option<Criticality> {
        SERVING.try_with(|c| *c).ok()
    }

    /// A request's criticality: its extension, else the one in scope, else
    /// [`Critical`](Self::Critical).
    #[must_use]
    pub fn of<B>(request: &Request<B>) -> Criticality {
        Self::from_extensions(request.extensions())
            .or_else(Self::current)
            .unwrap_or_default()
    }

    /// Runs `future` with this criticality in scope: the calls it makes
    /// inherit it ([`current`](Self::current)).
    pub fn scope<F: Future>(self, future: F) -> TaskLocalFuture<Criticality, F> {
        SERVING.scope(self, future)
    }

    /// Runs the closure `f` with this criticality in scope (for the
    /// synchronous part of a service's `call`).
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        SERVING.sync_scope(self, f)
    }

    /// Its header value.
    #[must_use]
    pub fn header_value(self) -> HeaderValue {
        HeaderValue::from_static(self.as_str())
    }
}

impl fmt::Display for Criticality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Criticality {
    type Err = ParseCriticalityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Criticality::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParseCriticalityError {
                value: s.to_owned(),
            })
    }
}

// === impl ParseCriticalityError ===

impl fmt::Display for ParseCriticalityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown criticality `{}` (expected critical-plus, critical, sheddable-plus or sheddable)",
            self.value
        )
    }
}

impl std::error::Error for ParseCriticalityError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_without_case() {
        for c in Criticality::ALL {
            assert_eq!(c.as_str().parse::<Criticality>(), Ok(c));
            assert_eq!(c.as_str().to_uppercase().parse::<Criticality>(), Ok(c));
            assert_eq!(Criticality::ALL[c.index()], c);
        }
    }

    #[test]
    fn an_invalid_header_is_absent_and_a_claim_is_clamped() {
        let mut headers = HeaderMap::new();
        headers.insert(CRITICALITY_HEADER, HeaderValue::from_static("urgent"));
        assert_eq!(Criticality::from_headers(&headers), None);
        headers.insert(CRITICALITY_HEADER, HeaderValue::from_static(" Sheddable "));
        assert_eq!(
            Criticality::from_headers(&headers),
            Some(Criticality::Sheddable)
        );
        assert_eq!(
            Criticality::CriticalPlus.clamp(Criticality::SheddablePlus),
            Criticality::SheddablePlus
        );
        assert_eq!(
            Criticality::Sheddable.clamp(Criticality::Critical),
            Criticality::Sheddable
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_extension_wins_over_the_scope_which_wins_over_the_default() {
        let plain = Request::new(());
        assert_eq!(Criticality::of(&plain), Criticality::Critical);
        let mut marked = Request::new(());
        marked.extensions_mut().insert(Criticality::Sheddable);
        let (scoped, explicit) = Criticality::SheddablePlus
            .scope(async { (Criticality::of(&plain), Criticality::of(&marked)) })
            .await;
        assert_eq!(scoped, Criticality::SheddablePlus);
        assert_eq!(explicit, Criticality::Sheddable);
        assert_eq!(Criticality::current(), None, "out of scope");
    }
}
