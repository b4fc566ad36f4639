//! What to inject: a [`FaultPlan`], checked by [`FaultPlan::validate`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::grpc::GrpcCode;

/// The default [`max_hang`](FaultPlan::max_hang): 30 s.
pub const DEFAULT_MAX_HANG: Duration = Duration::from_secs(30);

/// The kinds of fault a [`FaultPlan`] injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultKind {
    /// The answer comes later by the plan's delay.
    Latency,
    /// The call fails with an [`InjectedFault`](crate::InjectedFault)
    /// error (a connection reset, as classifiers see it), without reaching
    /// the service.
    Error,
    /// The call is answered with the plan's status (HTTP, or gRPC
    /// trailers-only for gRPC requests), without reaching the service.
    Status,
    /// The call does not answer: it waits until the caller's deadline
    /// cuts it, or fails after [`max_hang`](FaultPlan::max_hang), without
    /// reaching the service.
    Hang,
    /// The service answers, and its response body fails after the plan's
    /// number of frames.
    AbortBody,
}

impl FaultKind {
    /// Every kind, in the order of [`index`](Self::index).
    pub const ALL: [FaultKind; 5] = [
        FaultKind::Latency,
        FaultKind::Error,
        FaultKind::Status,
        FaultKind::Hang,
        FaultKind::AbortBody,
    ];

    /// Its name in events, metrics and the
    /// [`INJECTED_FAULT_HEADER`](crate::INJECTED_FAULT_HEADER):
    /// `latency`, `error`, `status`, `hang`, `abort_body`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            FaultKind::Latency => "latency",
            FaultKind::Error => "error",
            FaultKind::Status => "status",
            FaultKind::Hang => "hang",
            FaultKind::AbortBody => "abort_body",
        }
    }

    /// Its position in [`ALL`](Self::ALL) and in the snapshot's counts.
    #[must_use]
    pub const fn index(self) -> usize {
        match self {
            FaultKind::Latency => 0,
            FaultKind::Error => 1,
            FaultKind::Status => 2,
            FaultKind::Hang => 3,
            FaultKind::AbortBody => 4,
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a fault layer injects, into which share of the requests.
///
/// Latency is drawn on its own: a delayed call may also get one of the
/// other faults. Error, status, hang and aborted body are drawn together,
/// so their shares add up to at most 1: a call gets at most one of them.
/// A plan may be narrowed to some criticalities
/// ([`only_criticalities`](Self::only_criticalities)) and to some keys
/// ([`only_keys`](Self::only_keys): the host of an HTTP request's URI, or
/// its `Host` header); the other requests are left alone.
///
/// The setters store what they are given; [`validate`](Self::validate)
/// (and so [`FaultHandle::set`](crate::FaultHandle::set)) refuses a plan
/// whose shares are not between 0 and 1 or whose exclusive shares add up
/// to more than 1, with a [`FaultPlanError`].
///
/// | setting | default |
/// |---|---|
/// | [`latency`](Self::latency) | none |
/// | [`error`](Self::error) | 0 |
/// | [`status`](Self::status) | 0 (503 when set without a status) |
/// | [`hang`](Self::hang) | 0 |
/// | [`max_hang`](Self::max_hang) | 30 s ([`DEFAULT_MAX_HANG`]) |
/// | [`abort_body`](Self::abort_body) | 0 |
/// | [`only_criticalities`](Self::only_criticalities) | every criticality |
/// | [`only_keys`](Self::only_keys) | every key |
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_chaos::{FaultHandle, FaultPlan};
///
/// let faults = FaultHandle::new("payments");
/// assert!(!faults.is_on()); // off until a plan is set
/// faults
///     .set(
///         FaultPlan::new()
///             .latency(0.2, Duration::from_millis(300))
///             .error(0.05)
///             .status(0.05, http::StatusCode::SERVICE_UNAVAILABLE),
///     )
///     .expect("a valid plan");
/// assert!(faults.is_on());
/// // Shares above 1 in all are refused.
/// assert!(faults.set(FaultPlan::new().error(0.6).hang(0.6)).is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct FaultPlan {
    pub(crate) latency: (f64, Duration),
    pub(crate) error: f64,
    pub(crate) status: (f64, StatusCode),
    pub(crate) hang: f64,
    pub(crate) max_hang: Duration,
    pub(crate) abort: (f64, u32),
    /// A bit per criticality ([`Criticality::index`]).
    pub(crate) criticalities: u8,
    pub(crate) keys: Option<Arc<[String]>>,
}

impl Default for FaultPlan {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultPlan {
    /// A plan that injects nothing; add faults with the setters.
    pub fn new() -> Self {
        Self {
            latency: (0.0, Duration::ZERO),
            error: 0.0,
            status: (0.0, StatusCode::SERVICE_UNAVAILABLE),
            hang: 0.0,
            max_hang: DEFAULT_MAX_HANG,
            abort: (0.0, 0),
            criticalities: 0b1111,
            keys: None,
        }
    }

    /// Delays the answer of a `share` of the calls by `delay`.
    pub fn latency(mut self, share: f64, delay: Duration) -> Self {
        self.latency = (share, delay);
        self
    }

    /// Fails a `share` of the calls with an
    /// [`InjectedFault`](crate::InjectedFault) error.
    pub fn error(mut self, share: f64) -> Self {
        self.error = share;
        self
    }

    /// Answers a `share` of the calls with `status` (on gRPC requests: a
    /// trailers-only answer whose `grpc-status` is the code that status
    /// maps to: 503 UNAVAILABLE, 429 RESOURCE_EXHAUSTED, 504
    /// DEADLINE_EXCEEDED, 500 INTERNAL, 501 UNIMPLEMENTED, others
    /// UNKNOWN).
    pub fn status(mut self, share: f64, status: StatusCode) -> Self {
        self.status = (share, status);
        self
    }

    /// Makes a `share` of the calls hang: they answer nothing until the
    /// caller's deadline cuts them, or fail with an
    /// [`InjectedFault`](crate::InjectedFault) after
    /// [`max_hang`](Self::max_hang).
    pub fn hang(mut self, share: f64) -> Self {
        self.hang = share;
        self
    }

    /// How long a hung call waits before it fails by itself (default 30 s),
    /// for callers without a deadline.
    pub fn max_hang(mut self, max: Duration) -> Self {
        self.max_hang = max;
        self
    }

    /// Lets a `share` of the calls reach the service, and makes their
    /// response body fail after `after_frames` frames (0: at its first
    /// read) with an [`InjectedFault`](crate::InjectedFault). On services
    /// whose responses are not HTTP ([`PlainFaultLayer`](crate::PlainFaultLayer)),
    /// the call fails with the error instead.
    pub fn abort_body(mut self, share: f64, after_frames: u32) -> Self {
        self.abort = (share, after_frames);
        self
    }

    /// Injects only into requests of these criticalities (the request's
    /// extension, else the one in scope, else `Critical`: see
    /// [`Criticality::of`]).
    pub fn only_criticalities(
        mut self,
        criticalities: impl IntoIterator<Item = Criticality>,
    ) -> Self {
        self.criticalities = criticalities
            .into_iter()
            .fold(0, |mask, c| mask | 1 << c.index());
        self
    }

    /// Injects only into requests to these keys: the host of an HTTP
    /// request's URI, else its `Host` header (without the port). A plain
    /// service ([`PlainFaultLayer`](crate::PlainFaultLayer)) has no key:
    /// a plan with keys injects nothing there.
    pub fn only_keys<K: Into<String>>(mut self, keys: impl IntoIterator<Item = K>) -> Self {
        self.keys = Some(keys.into_iter().map(Into::into).collect());
        self
    }

    /// Checks the shares.
    ///
    /// # Errors
    ///
    /// A [`FaultPlanError`] naming the setting when a share is not a
    /// number between 0 and 1, or when the shares of error, status, hang
    /// and aborted body add up to more than 1.
    pub fn validate(&self) -> Result<(), FaultPlanError> {
        for (setting, share) in [
            ("latency", self.latency.0),
            ("error", self.error),
            ("status", self.status.0),
            ("hang", self.hang),
            ("abort_body", self.abort.0),
        ] {
            if !(0.0..=1.0).contains(&share) {
                return Err(FaultPlanError {
                    setting,
                    problem: Problem::Share(share),
                });
            }
        }
        let exclusive = self.exclusive();
        if exclusive > 1.0 + 1e-9 {
            return Err(FaultPlanError {
                setting: "error + status + hang + abort_body",
                problem: Problem::Sum(exclusive),
            });
        }
        Ok(())
    }

    /// The share of calls that get one of the exclusive faults.
    fn exclusive(&self) -> f64 {
        self.error + self.status.0 + self.hang + self.abort.0
    }

    /// Whether this plan injects anything at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.latency.0 == 0.0 && self.exclusive() == 0.0
    }

    /// Whether a request of `criticality` to `key` is in the plan's scope.
    pub(crate) fn covers(&self, criticality: Criticality, key: Option<&str>) -> bool {
        if self.criticalities & 1 << criticality.index() == 0 {
            return false;
        }
        match (&self.keys, key) {
            (None, _) => true,
            (Some(keys), Some(key)) => keys.iter().any(|k| k.eq_ignore_ascii_case(key)),
            (Some(_), None) => false,
        }
    }

    /// The fault for the draws `latency_draw` and `draw` (each uniform in
    /// `[0, 1)`).
    pub(crate) fn pick(&self, latency_draw: f64, draw: f64) -> Injection {
        let delay =
            (latency_draw < self.latency.0 && !self.latency.1.is_zero()).then_some(self.latency.1);
        let slices = [
            (self.error, Action::Error),
            (
                self.status.0,
                Action::Status(self.status.1, grpc_code(self.status.1)),
            ),
            (self.hang, Action::Hang(self.max_hang)),
            (self.abort.0, Action::Abort(self.abort.1)),
        ];
        let mut edge = 0.0;
        let mut action = Action::None;
        for (share, fault) in slices {
            edge += share;
            if draw < edge {
                action = fault;
                break;
            }
        }
        Injection { delay, action }
    }
}

/// The gRPC code an injected HTTP status is answered with on gRPC
/// requests.
fn grpc_code(status: StatusCode) -> GrpcCode {
    match status.as_u16() {
        503 => GrpcCode::Unavailable,
        429 => GrpcCode::ResourceExhausted,
        504 => GrpcCode::DeadlineExceeded,
        500 => GrpcCode::Internal,
        501 => GrpcCode::Unimplemented,
        _ => GrpcCode::Unknown,
    }
}

/// What one call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Injection {
    pub(crate) delay: Option<Duration>,
    pub(crate) action: Action,
}

/// The exclusive fault of one call, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    None,
    Error,
    Status(StatusCode, GrpcCode),
    Hang(Duration),
    Abort(u32),
}

/// A [`FaultPlan`] that cannot be applied: which setting, and why.
///
/// # Example
///
/// ```
/// use tower_chaos::FaultPlan;
///
/// let error = FaultPlan::new().error(1.5).validate().unwrap_err();
/// assert_eq!(error.setting(), "error");
/// assert_eq!(error.to_string(), "fault plan: `error` is 1.5, not a share between 0 and 1");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlanError {
    setting: &'static str,
    problem: Problem,
}

#[derive(Debug, Clone, PartialEq)]
enum Problem {
    Share(f64),
    Sum(f64),
}

impl FaultPlanError {
    /// The setting at fault.
    #[must_use]
    pub fn setting(&self) -> &'static str {
        self.setting
    }
}

impl fmt::Display for FaultPlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problem {
            Problem::Share(share) => write!(
                f,
                "fault plan: `{}` is {share}, not a share between 0 and 1",
                self.setting
            ),
            Problem::Sum(sum) => write!(
                f,
                "fault plan: `{}` add up to {sum}: a call gets at most one of them, so at most 1",
                self.setting
            ),
        }
    }
}

impl std::error::Error for FaultPlanError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_fall_in_consecutive_slices() {
        let plan = FaultPlan::new()
            .error(0.1)
            .status(0.2, StatusCode::TOO_MANY_REQUESTS)
            .hang(0.3)
            .abort_body(0.1, 2)
            .latency(0.5, Duration::from_millis(7));
        assert_eq!(plan.pick(0.9, 0.05).action, Action::Error);
        assert_eq!(
            plan.pick(0.9, 0.15).action,
            Action::Status(StatusCode::TOO_MANY_REQUESTS, GrpcCode::ResourceExhausted)
        );
        assert_eq!(plan.pick(0.9, 0.35).action, Action::Hang(DEFAULT_MAX_HANG));
        assert_eq!(plan.pick(0.9, 0.65).action, Action::Abort(2));
        assert_eq!(plan.pick(0.9, 0.75).action, Action::None);
        assert_eq!(plan.pick(0.4, 0.75).delay, Some(Duration::from_millis(7)));
        assert_eq!(plan.pick(0.5, 0.75).delay, None);
    }

    #[test]
    fn scope_by_criticality_and_key() {
        let plan = FaultPlan::new()
            .error(1.0)
            .only_criticalities([Criticality::Sheddable])
            .only_keys(["Search.Internal"]);
        assert!(plan.covers(Criticality::Sheddable, Some("search.internal")));
        assert!(!plan.covers(Criticality::Critical, Some("search.internal")));
        assert!(!plan.covers(Criticality::Sheddable, Some("payments.internal")));
        assert!(!plan.covers(Criticality::Sheddable, None));
        assert!(FaultPlan::new().covers(Criticality::CriticalPlus, None));
    }
}
