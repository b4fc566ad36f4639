//! The parsed service config: its method configs, their policies, the
//! retry throttling, and the A6 lookup of a method's config.

use std::collections::HashMap;
use std::error::Error;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use tower_retry_budget::Backoff;

use super::codes::StatusCodes;
use super::parse;

/// A gRPC service config (gRFC A6), as far as retries go: its method
/// configs (each with a [`RetryPolicy`] or a [`HedgingPolicy`], or
/// neither) and its [`RetryThrottling`].
///
/// Read one with [`from_json`](Self::from_json) (or `str::parse`, or serde
/// as part of a larger config); apply it to a client stack with
/// [`ClientStack::service_config`](crate::ClientStack::service_config) or
/// [`apply`](Self::apply). See the [module docs](super) for what is
/// checked, what is refused and how A6 maps onto the stack.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tower_shield::service_config::ServiceConfig;
///
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [{
///     "name": [{ "service": "shop.Stock" }],
///     "retryPolicy": {
///       "maxAttempts": 3,
///       "initialBackoff": "0.05s",
///       "maxBackoff": "1s",
///       "backoffMultiplier": 2,
///       "retryableStatusCodes": ["UNAVAILABLE"]
///     }
///   }]
/// }"#)?;
/// let policy = config.lookup("shop.Stock", "Reserve").unwrap().retry_policy().unwrap();
/// assert_eq!(policy.max_attempts(), 3);
/// assert_eq!(policy.initial_backoff(), Duration::from_millis(50));
/// assert!(policy.retryable_status_codes().contains(Code::Unavailable));
/// assert!(config.lookup("shop.Billing", "Charge").is_none());
/// # Ok::<(), tower_shield::service_config::ServiceConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub(crate) methods: Vec<MethodConfig>,
    pub(crate) throttling: Option<RetryThrottling>,
    pub(crate) adjustments: Vec<Adjustment>,
    pub(crate) table: Table,
}

/// One entry of `methodConfig`: the methods it names and their policy.
///
/// # Example
///
/// ```
/// use tower_shield::service_config::ServiceConfig;
///
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [{ "name": [{ "service": "shop.Stock", "method": "Count" }] }]
/// }"#)?;
/// let method = &config.method_configs()[0];
/// assert_eq!(method.names()[0].method(), Some("Count"));
/// assert!(method.retry_policy().is_none() && method.hedging_policy().is_none());
/// # Ok::<(), tower_shield::service_config::ServiceConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct MethodConfig {
    pub(crate) names: Vec<MethodName>,
    pub(crate) retry: Option<RetryPolicy>,
    pub(crate) hedging: Option<HedgingPolicy>,
}

/// One `name` of a method config: a service and a method (the config of
/// that method), a service alone (of every method of the service without
/// a config of its own), or neither, `{}` (the default of every method
/// without a more specific config).
///
/// # Example
///
/// ```
/// use tower_shield::service_config::ServiceConfig;
///
/// let config = ServiceConfig::from_json(r#"{ "methodConfig": [{ "name": [{}] }] }"#)?;
/// let name = &config.method_configs()[0].names()[0];
/// assert_eq!((name.service(), name.method()), (None, None));
/// # Ok::<(), tower_shield::service_config::ServiceConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MethodName {
    pub(crate) service: Box<str>,
    pub(crate) method: Box<str>,
}

/// A method's `retryPolicy`: how many attempts, the backoff between them,
/// and which status codes are retried.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_shield::service_config::ServiceConfig;
///
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [{
///     "name": [{}],
///     "retryPolicy": {
///       "maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
///       "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE", 8]
///     }
///   }]
/// }"#)?;
/// let policy = config.method_configs()[0].retry_policy().unwrap();
/// // A6: the n-th retry waits random(0, min(0.1 s * 1.5^(n-1), 1 s)).
/// let backoff = policy.backoff();
/// assert_eq!(backoff.bound(0), Duration::from_millis(100)); // 1st retry
/// assert_eq!(backoff.bound(2), Duration::from_millis(225)); // 3rd retry
/// # Ok::<(), tower_shield::service_config::ServiceConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) backoff_multiplier: f64,
    pub(crate) codes: StatusCodes,
}

/// A method's `hedgingPolicy`: how many attempts, the delay between them,
/// and which status codes do not end the call.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_shield::service_config::ServiceConfig;
///
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [{
///     "name": [{ "service": "shop.Search" }],
///     "hedgingPolicy": { "maxAttempts": 2, "hedgingDelay": "0.08s" }
///   }]
/// }"#)?;
/// let policy = config.method_configs()[0].hedging_policy().unwrap();
/// assert_eq!(policy.hedging_delay(), Duration::from_millis(80));
/// assert!(policy.non_fatal_status_codes().is_empty());
/// # Ok::<(), tower_shield::service_config::ServiceConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct HedgingPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) hedging_delay: Duration,
    pub(crate) codes: StatusCodes,
}

/// The config's `retryThrottling`: the size of the client's token bucket
/// and what a success gives back (see
/// [`RetryThrottle`](super::RetryThrottle)).
///
/// # Example
///
/// ```
/// use tower_shield::service_config::ServiceConfig;
///
/// let config = ServiceConfig::from_json(
///     r#"{ "retryThrottling": { "maxTokens": 100, "tokenRatio": 0.1234 } }"#,
/// )?;
/// let throttling = config.retry_throttling().unwrap();
/// assert_eq!(throttling.max_tokens(), 100);
/// assert_eq!(throttling.token_ratio(), 0.123, "three decimal places, as in A6");
/// # Ok::<(), tower_shield::service_config::ServiceConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryThrottling {
    max_tokens: u32,
    /// `tokenRatio` in thousandths (A6 keeps three decimal places).
    ratio_milli: u32,
}

/// A value the config asked for that A6 does not allow, and the value used
/// instead: a `maxAttempts` above 5, capped to 5.
///
/// # Example
///
/// ```
/// use tower_shield::service_config::ServiceConfig;
///
/// let config = ServiceConfig::from_json(r#"{
///   "methodConfig": [{
///     "name": [{}],
///     "hedgingPolicy": { "maxAttempts": 9 }
///   }]
/// }"#)?;
/// let capped = &config.adjustments()[0];
/// assert_eq!(capped.path(), "methodConfig[0].hedgingPolicy.maxAttempts");
/// assert_eq!((capped.requested(), capped.applied()), (9, 5));
/// assert_eq!(
///     capped.to_string(),
///     "methodConfig[0].hedgingPolicy.maxAttempts: 9 capped to 5 (gRFC A6's limit)",
/// );
/// # Ok::<(), tower_shield::service_config::ServiceConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjustment {
    path: Box<str>,
    requested: u64,
    applied: u32,
}

/// A service config that cannot be used: not JSON, or a field A6 calls
/// invalid. The [`path`](Self::path) says where in the document (for
/// example `methodConfig[0].retryPolicy.maxAttempts`), the
/// [`message`](Self::message) what is wrong with it.
///
/// # Example
///
/// ```
/// use tower_shield::service_config::ServiceConfig;
///
/// let error = ServiceConfig::from_json(r#"{
///   "methodConfig": [{
///     "name": [{}],
///     "retryPolicy": {
///       "maxAttempts": 1, "initialBackoff": "0.1s", "maxBackoff": "1s",
///       "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]
///     }
///   }]
/// }"#)
/// .unwrap_err();
/// assert_eq!(error.path(), "methodConfig[0].retryPolicy.maxAttempts");
/// assert_eq!(
///     error.to_string(),
///     "invalid service config at methodConfig[0].retryPolicy.maxAttempts: \
///      must be greater than 1, got 1",
/// );
/// ```
#[derive(Debug)]
pub struct ServiceConfigError {
    path: Box<str>,
    message: Box<str>,
    source: Option<serde_json::Error>,
}

/// The A6 lookup of a method's config: by service, then method.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    services: HashMap<Box<str>, ServiceEntry>,
    /// The config of `{}`.
    default: Option<usize>,
}

#[derive(Debug, Clone, Default)]
struct ServiceEntry {
    methods: HashMap<Box<str>, usize>,
    /// The config named by the service alone.
    all: Option<usize>,
}

// === impl ServiceConfig ===

impl ServiceConfig {
    /// Reads a service config in its JSON form (that of gRPC's
    /// `service_config.proto`), checking every rule of the
    /// [module docs](super#what-is-refused).
    ///
    /// Only `methodConfig` (its `name`, `retryPolicy` and
    /// `hedgingPolicy`) and `retryThrottling` are read; every other field
    /// (`loadBalancingConfig`, `timeout`, `waitForReady`, ...) is ignored,
    /// as gRPC clients ignore the fields they do not know.
    ///
    /// # Errors
    ///
    /// [`ServiceConfigError`], naming the field, when the text is not JSON
    /// or a rule is broken. A `maxAttempts` above 5 is not an error: it is
    /// capped to 5 and reported in [`adjustments`](Self::adjustments).
    pub fn from_json(json: &str) -> Result<Self, ServiceConfigError> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(ServiceConfigError::json)?;
        Self::from_value(&value)
    }

    /// Reads a service config already parsed as a JSON value; see
    /// [`from_json`](Self::from_json).
    ///
    /// # Errors
    ///
    /// As [`from_json`](Self::from_json).
    pub fn from_value(value: &serde_json::Value) -> Result<Self, ServiceConfigError> {
        parse::service_config(value)
    }

    /// The method configs, in the order of the document.
    #[must_use]
    pub fn method_configs(&self) -> &[MethodConfig] {
        &self.methods
    }

    /// The config of `service`'s `method`, by A6's lookup: the config that
    /// names the service and the method, else the one that names the
    /// service alone, else the default `{}`; `None` when none applies
    /// (the method is then neither retried nor hedged).
    #[must_use]
    pub fn lookup(&self, service: &str, method: &str) -> Option<&MethodConfig> {
        self.table.find(service, method).map(|i| &self.methods[i])
    }

    /// The config's `retryThrottling`, if it has one.
    #[must_use]
    pub fn retry_throttling(&self) -> Option<&RetryThrottling> {
        self.throttling.as_ref()
    }

    /// The values A6 does not allow that were changed rather than refused
    /// (a `maxAttempts` above 5), each with its path. Each was also logged
    /// with `tracing` at `WARN` when the config was read.
    #[must_use]
    pub fn adjustments(&self) -> &[Adjustment] {
        &self.adjustments
    }
}

impl FromStr for ServiceConfig {
    type Err = ServiceConfigError;

    /// As [`ServiceConfig::from_json`].
    fn from_str(json: &str) -> Result<Self, ServiceConfigError> {
        Self::from_json(json)
    }
}

impl<'de> serde::Deserialize<'de> for ServiceConfig {
    /// Deserializes the JSON form as [`ServiceConfig::from_value`] reads
    /// it; a broken rule is the deserializer's error, with the
    /// [`ServiceConfigError`]'s message (and its path).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = <serde_json::Value as serde::Deserialize>::deserialize(deserializer)?;
        Self::from_value(&value).map_err(serde::de::Error::custom)
    }
}

// === impl MethodConfig ===

impl MethodConfig {
    /// The methods this config is for.
    #[must_use]
    pub fn names(&self) -> &[MethodName] {
        &self.names
    }

    /// Its `retryPolicy`, if it has one.
    #[must_use]
    pub fn retry_policy(&self) -> Option<&RetryPolicy> {
        self.retry.as_ref()
    }

    /// Its `hedgingPolicy`, if it has one.
    #[must_use]
    pub fn hedging_policy(&self) -> Option<&HedgingPolicy> {
        self.hedging.as_ref()
    }
}

// === impl MethodName ===

impl MethodName {
    /// The service (`package.Service`), or `None` for the default `{}`.
    #[must_use]
    pub fn service(&self) -> Option<&str> {
        Some(&*self.service).filter(|s| !s.is_empty())
    }

    /// The method, or `None` when the name covers every method of its
    /// service (or is the default `{}`).
    #[must_use]
    pub fn method(&self) -> Option<&str> {
        Some(&*self.method).filter(|m| !m.is_empty())
    }
}

impl fmt::Display for MethodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.service(), self.method()) {
            (None, _) => f.write_str("{}"),
            (Some(service), None) => write!(f, "{{service: {service:?}}}"),
            (Some(service), Some(method)) => {
                write!(f, "{{service: {service:?}, method: {method:?}}}")
            }
        }
    }
}

// === impl RetryPolicy ===

impl RetryPolicy {
    /// `maxAttempts`: attempts in all, the first included (2 to 5).
    #[must_use]
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// `initialBackoff`: the bound of the first retry's delay.
    #[must_use]
    pub const fn initial_backoff(&self) -> Duration {
        self.initial_backoff
    }

    /// `maxBackoff`: the largest bound of any retry's delay.
    #[must_use]
    pub const fn max_backoff(&self) -> Duration {
        self.max_backoff
    }

    /// `backoffMultiplier`: how the bound grows from one retry to the
    /// next.
    #[must_use]
    pub const fn backoff_multiplier(&self) -> f64 {
        self.backoff_multiplier
    }

    /// `retryableStatusCodes`: the codes that are retried (never empty).
    #[must_use]
    pub const fn retryable_status_codes(&self) -> StatusCodes {
        self.codes
    }

    /// The retry layer's [`Backoff`] for this policy: full jitter with
    /// `initialBackoff` as its base, `maxBackoff` as its cap and
    /// `backoffMultiplier` as its [multiplier](Backoff::multiplier). A6's
    /// n-th retry (from 1) is the backoff's retry `n - 1` (from 0), so
    /// [`Backoff::bound`]`(n - 1)` is A6's
    /// `min(initialBackoff * backoffMultiplier^(n-1), maxBackoff)`.
    #[must_use]
    pub fn backoff(&self) -> Backoff {
        Backoff::full_jitter(self.initial_backoff, self.max_backoff)
            .multiplier(self.backoff_multiplier)
    }
}

// === impl HedgingPolicy ===

impl HedgingPolicy {
    /// `maxAttempts`: attempts in all, the first included (2 to 5).
    #[must_use]
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// `hedgingDelay`: how long after an attempt the next one is sent
    /// (default 0: all at once).
    #[must_use]
    pub const fn hedging_delay(&self) -> Duration {
        self.hedging_delay
    }

    /// `nonFatalStatusCodes`: the codes that do not end the call while
    /// another attempt may still succeed (default: none).
    #[must_use]
    pub const fn non_fatal_status_codes(&self) -> StatusCodes {
        self.codes
    }
}

// === impl RetryThrottling ===

impl RetryThrottling {
    /// A throttling of `max_tokens` and a ratio of `ratio_milli`
    /// thousandths, both already checked.
    pub(crate) const fn new_unchecked(max_tokens: u32, ratio_milli: u32) -> Self {
        Self {
            max_tokens,
            ratio_milli,
        }
    }

    /// `maxTokens`: the tokens of a full bucket (1 to 1000).
    #[must_use]
    pub const fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// `tokenRatio`, to three decimal places: the tokens a success gives
    /// back.
    #[must_use]
    pub fn token_ratio(&self) -> f64 {
        f64::from(self.ratio_milli) / 1000.0
    }

    /// `tokenRatio` in thousandths.
    pub(crate) const fn token_ratio_milli(&self) -> u32 {
        self.ratio_milli
    }
}

// === impl Adjustment ===

impl Adjustment {
    pub(crate) fn new(path: String, requested: u64, applied: u32) -> Self {
        Self {
            path: path.into(),
            requested,
            applied,
        }
    }

    /// Where in the document the value is.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The value the config asked for.
    #[must_use]
    pub const fn requested(&self) -> u64 {
        self.requested
    }

    /// The value used instead.
    #[must_use]
    pub const fn applied(&self) -> u32 {
        self.applied
    }
}

impl fmt::Display for Adjustment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} capped to {} (gRFC A6's limit)",
            self.path, self.requested, self.applied
        )
    }
}

// === impl ServiceConfigError ===

impl ServiceConfigError {
    pub(crate) fn new(path: impl Into<Box<str>>, message: impl Into<Box<str>>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
            source: None,
        }
    }

    fn json(error: serde_json::Error) -> Self {
        Self {
            path: "".into(),
            message: format!("not JSON: {error}").into(),
            source: Some(error),
        }
    }

    /// Where in the document the problem is, as field names and list
    /// indexes (`methodConfig[1].name[0]`); empty for the document as a
    /// whole.
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong there.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ServiceConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "invalid service config: {}", self.message)
        } else {
            write!(
                f,
                "invalid service config at {}: {}",
                self.path, self.message
            )
        }
    }
}

impl Error for ServiceConfigError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}

// === impl Table ===

impl Table {
    /// Adds `name`, the name of config `index`; `false` when the table
    /// already has that name.
    pub(crate) fn insert(&mut self, name: &MethodName, index: usize) -> bool {
        let slot = match (name.service(), name.method()) {
            (None, _) => &mut self.default,
            (Some(service), method) => {
                let entry = self.services.entry(service.into()).or_default();
                match method {
                    None => &mut entry.all,
                    Some(method) => {
                        if entry.methods.contains_key(method) {
                            return false;
                        }
                        entry.methods.insert(method.into(), index);
                        return true;
                    }
                }
            }
        };
        if slot.is_some() {
            return false;
        }
        *slot = Some(index);
        true
    }

    /// The index of the config of `service`'s `method` (A6's order).
    pub(crate) fn find(&self, service: &str, method: &str) -> Option<usize> {
        self.services
            .get(service)
            .and_then(|entry| entry.methods.get(method).copied().or(entry.all))
            .or(self.default)
    }

    /// The index of the config of the method a request path
    /// (`/package.Service/Method`) names; a path of another form gets the
    /// default's.
    pub(crate) fn find_path(&self, path: &str) -> Option<usize> {
        match path.strip_prefix('/').and_then(|p| p.rsplit_once('/')) {
            Some((service, method)) => self.find(service, method),
            None => self.default,
        }
    }
}
