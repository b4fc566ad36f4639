//! Settings from files (feature `serde`): both stacks as data, one file for
//! every dependency of a service with shared defaults and per-name
//! overrides, and a handle that applies new settings to a running stack
//! without losing its state.
//!
//! # One file, every dependency
//!
//! ```toml
//! # What every client stack gets unless its own entry says otherwise.
//! [defaults.client]
//! timeout = "2s"
//! breaker = { failure_rate = "50%", open_period = "5s" }
//! retry = { max_attempts = 3, budget = { ratio = "10%" } }
//!
//! [clients.catalog]
//! timeout = "800ms"
//! bulkhead = { limit = 16 }
//!
//! [clients.payments]
//! retry = { max_attempts = 1 }           # never retried: not idempotent
//! breaker = { window = { time = "60s" }, slow_calls = { duration = "1s", rate = "50%" } }
//!
//! [clients.search]
//! throttle = { k = 2.0, window = "60s" }
//!
//! [servers.shop]
//! timeout = "2s"
//! concurrency = 256
//! ```
//!
//! A dependency's settings are the defaults with its own entry merged
//! over them, key by key (a `window` or an `adaptive` limit is replaced
//! whole: a count window does not mix with a time window). A name the
//! file does not list gets the defaults, as resilience4j's instances do.
//! Every layer's section reads as that layer's settings type does:
//! [`BreakerConfig`], [`RetrySettings`], [`BulkheadSettings`],
//! [`ThrottleConfig`], and with feature `chaos`, [`FaultPlan`]. Durations
//! are written `"250ms"`, `"2s"`, `"1m30s"`; shares `"50%"` or `0.5`.
//!
//! Reading checks everything, and an error names where it is:
//!
//! ```
//! use tower_shield::settings::ServiceSettings;
//!
//! let err = ServiceSettings::from_json_str(
//!     r#"{ "clients": { "catalog": { "breaker": { "failure_rate": "150%" } } } }"#,
//! )
//! .unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "clients.catalog.breaker.failure_rate: invalid share \"150%\": above 100%"
//! );
//! ```
//!
//! Any format serde reads works: read the file into a
//! [`serde_json::Value`] with its crate (`toml::from_str`,
//! `serde_yaml_ng::from_str`, ...) and hand it to
//! [`ServiceSettings::from_value`], or hand the format's deserializer to
//! [`ServiceSettings::from_deserializer`].
//!
//! # Building the stacks
//!
//! ```
//! use std::time::Duration;
//! use tower_shield::settings::ServiceSettings;
//!
//! let settings = ServiceSettings::from_json_str(
//!     r#"{
//!         "defaults": { "client": { "timeout": "2s" } },
//!         "clients": { "catalog": { "timeout": "800ms", "bulkhead": { "limit": 16 } } }
//!     }"#,
//! )?;
//! let (catalog, handle) = settings.client_stack("catalog");
//! assert_eq!(catalog.timeout_handle().get(), Some(Duration::from_millis(800)));
//! assert_eq!(catalog.bulkhead_handle().limit(), 16);
//! // Not in the file: the defaults.
//! let (inventory, _) = settings.client_stack("inventory");
//! assert_eq!(inventory.timeout_handle().get(), Some(Duration::from_secs(2)));
//! # let _ = handle;
//! # Ok::<(), tower_shield::settings::SettingsError>(())
//! ```
//!
//! # Changing settings while the stack runs
//!
//! A [`ClientStackHandle`] applies new settings to the stack it was made
//! with, and to every service built from it, keeping their state: the
//! breaker's window, state and counters
//! ([`Breaker::reconfigure`](tower_breaker::Breaker::reconfigure)), the
//! bulkhead's permits and waiters
//! ([`CompartmentHandle::set_limit`](tower_bulkhead::CompartmentHandle::set_limit)),
//! the retry budget's window and balance
//! ([`RetryBudget::set_ratio`](tower_retry_budget::RetryBudget::set_ratio)).
//! Each layer takes its new settings at once (the breaker's thresholds all
//! together, never half of them); a call in flight during the change may
//! see one layer's new settings and another's old ones. What cannot
//! change on a running stack is kept and said, with the reason, in the
//! [`Applied`] report and a `settings_not_live` warning: a window's
//! shape, a switch between a fixed and an adaptive limit, the backoff,
//! the throttle's window (its Ks and cap change live), adding or removing
//! a throttle, faults without a registered fault layer.
//! Rebuild the stack to change those (its state then starts afresh).
//!
//! Watching a file is your choice: call [`ServiceSettings::apply`] when it
//! changes (the axum example reloads on `SIGHUP`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use tower_breaker::throttle::{ThrottleConfig, ThrottleHandle, ThrottleLayer};
use tower_breaker::{Breaker, BreakerConfig};
use tower_bulkhead::settings::BulkheadSettings;
use tower_bulkhead::{CompartmentHandle, HttpBulkheadLayer};
use tower_deadline::TimeoutHandle;
use tower_resilience_base::settings::HumanDuration;
use tower_retry_budget::settings::RetrySettings;
use tower_retry_budget::{MaxAttempts, RetryBudget, RetryLayer};

use crate::stack::{
    client_stack, server_stack, ClientStack, OptionalThrottle, ServerStack, ThrottleSlot,
    DEFAULT_SERVER_CONCURRENCY,
};

/// The client stack that settings build: the settings say whether it
/// throttles, so its throttle is an [`OptionalThrottle`] (a pass-through
/// when the settings have none) and its type is the same either way.
pub type SettingsClientStack = ClientStack<
    tower_retry_budget::DefaultPolicy,
    tower_retry_budget::Buffered,
    tower_bulkhead::release::BodyEnd,
    OptionalThrottle,
>;

/// The service a [`SettingsClientStack`] builds around a transport `S`
/// (a [`ClientStackService`](crate::stack::ClientStackService) whose
/// throttle the settings chose).
pub type SettingsClientService<S> = crate::stack::ClientStackService<
    S,
    tower_retry_budget::DefaultPolicy,
    tower_retry_budget::Buffered,
    tower_bulkhead::release::BodyEnd,
    OptionalThrottle,
>;

#[cfg(feature = "chaos")]
use tower_chaos::{FaultHandle, FaultPlan};

/// One dependency's [client stack](crate::stack) as data. Every field
/// has the stack's default; see the [module docs](self) for the format.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ClientStackSettings {
    /// The whole call's timeout ([`ClientStack::timeout`]; none by
    /// default: the caller's deadline, if any, still applies).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    /// The breaker.
    pub breaker: BreakerConfig,
    /// The retry layer and its budget.
    pub retry: RetrySettings,
    /// The bulkhead (64 calls in flight by default).
    pub bulkhead: BulkheadSettings,
    /// Client-side adaptive throttling (off unless present).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttle: Option<ThrottleConfig>,
    /// The faults to inject (feature `chaos`; none unless present), for
    /// the fault layer registered with
    /// [`ClientStackHandle::with_faults`].
    #[cfg(feature = "chaos")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<FaultPlan>,
}

/// A [server stack](crate::stack::server_stack) as data.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ServerStackSettings {
    /// The budget of a request whose caller sent none (none by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    /// The most budget a caller may ask for (default 5 minutes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_timeout: Option<HumanDuration>,
    /// Requests served at once (default 512).
    pub concurrency: usize,
    /// The breaker.
    pub breaker: BreakerConfig,
}

impl Default for ClientStackSettings {
    fn default() -> Self {
        Self {
            timeout: None,
            breaker: BreakerConfig::new(),
            retry: RetrySettings::default(),
            bulkhead: BulkheadSettings::default(),
            throttle: None,
            #[cfg(feature = "chaos")]
            faults: None,
        }
    }
}

impl Default for ServerStackSettings {
    fn default() -> Self {
        Self {
            timeout: None,
            max_timeout: None,
            concurrency: DEFAULT_SERVER_CONCURRENCY,
            breaker: BreakerConfig::new(),
        }
    }
}

/// Settings that could not be read or are out of range: where (a path in
/// the document, `clients.catalog.breaker.failure_rate`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError {
    path: String,
    message: String,
}

impl SettingsError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
        }
    }

    /// Where in the document (empty for the document itself).
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What is wrong.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for SettingsError {}

fn join(prefix: &str, rest: &str) -> String {
    match (prefix.is_empty(), rest.is_empty()) {
        (true, _) => rest.to_owned(),
        (_, true) => prefix.to_owned(),
        _ => format!("{prefix}.{rest}"),
    }
}

/// Deserializes `value` as `T`, the error's path prefixed with `prefix`.
fn parse<T: DeserializeOwned>(value: Value, prefix: &str) -> Result<T, SettingsError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let inner = e.path().to_string();
        let inner = if inner == "." { String::new() } else { inner };
        SettingsError::new(join(prefix, &inner), e.into_inner().to_string())
    })
}

impl ClientStackSettings {
    /// Checks what serde alone does not (the retry and bulkhead settings'
    /// ranges); paths are relative to these settings (`retry.max_attempts`).
    ///
    /// # Errors
    ///
    /// The first [`SettingsError`] found.
    pub fn validate(&self) -> Result<(), SettingsError> {
        self.retry
            .validate()
            .map_err(|e| SettingsError::new(join("retry", e.setting), e.message))?;
        self.bulkhead
            .validate()
            .map_err(|e| SettingsError::new(join("bulkhead", e.setting), e.message))?;
        if let Some(throttle) = &self.throttle {
            throttle
                .validate()
                .map_err(|e| SettingsError::new("throttle", e.to_string()))?;
        }
        #[cfg(feature = "chaos")]
        if let Some(plan) = &self.faults {
            plan.validate()
                .map_err(|e| SettingsError::new("faults", e.to_string()))?;
        }
        Ok(())
    }

    /// The client stack for the dependency `name` with these settings, and
    /// the handle that changes them while it runs.
    ///
    /// # Errors
    ///
    /// A [`SettingsError`] from [`validate`](Self::validate).
    pub fn build(
        &self,
        name: &str,
    ) -> Result<(SettingsClientStack, ClientStackHandle), SettingsError> {
        self.validate()?;
        let name: Arc<str> = Arc::from(name);
        let retry = self
            .retry
            .configure(RetryLayer::new().name(Arc::clone(&name)));
        let bulkhead = self
            .bulkhead
            .layer(Arc::clone(&name))
            .map_err(|e| SettingsError::new(join("bulkhead", e.setting), e.message))?
            .hold_until_body_end();
        let mut stack = client_stack(Arc::clone(&name))
            .breaker_config(self.breaker.clone())
            .retry(retry)
            .bulkhead(bulkhead);
        if let Some(timeout) = self.timeout {
            stack = stack.timeout(timeout.0);
        }
        let throttle = match &self.throttle {
            Some(config) => Some(
                ThrottleLayer::try_with_config(Arc::clone(&name), config.clone())
                    .map_err(|e| SettingsError::new("throttle", e.to_string()))?,
            ),
            None => None,
        };
        let stack = stack.optional_throttle(throttle);
        let handle = ClientStackHandle::new(&stack, self.clone());
        Ok((stack, handle))
    }
}

impl ServerStackSettings {
    /// Checks what serde alone does not.
    ///
    /// # Errors
    ///
    /// A [`SettingsError`] for a `concurrency` of 0, or a `timeout` above
    /// `max_timeout`.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.concurrency == 0 {
            return Err(SettingsError::new(
                "concurrency",
                "must be at least 1, got 0",
            ));
        }
        if let (Some(t), Some(max)) = (self.timeout, self.max_timeout) {
            if t > max {
                return Err(SettingsError::new(
                    "timeout",
                    format!("({t}) is above max_timeout ({max})"),
                ));
            }
        }
        Ok(())
    }

    /// The server stack `name` with these settings, and the handle that
    /// changes its breaker and limit while it runs.
    ///
    /// # Errors
    ///
    /// A [`SettingsError`] from [`validate`](Self::validate).
    pub fn build(&self, name: &str) -> Result<(ServerStack, ServerStackHandle), SettingsError> {
        self.validate()?;
        let mut stack = server_stack(name.to_owned())
            .breaker(Breaker::with_config(name.to_owned(), self.breaker.clone()))
            .bulkhead(
                HttpBulkheadLayer::new(name.to_owned(), self.concurrency).hold_until_body_end(),
            );
        if let Some(t) = self.timeout {
            stack = stack.timeout(t.0);
        }
        if let Some(max) = self.max_timeout {
            stack = stack.max_timeout(max.0);
        }
        let handle = ServerStackHandle {
            breaker: stack.breaker_handle().clone(),
            bulkhead: stack.bulkhead_handle(),
            current: Arc::new(Mutex::new(self.clone())),
        };
        Ok((stack, handle))
    }
}

// === ServiceSettings ===

/// Every dependency's settings from one document: shared defaults, then
/// per-name overrides; see the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct ServiceSettings {
    client_defaults: ClientStackSettings,
    server_defaults: ServerStackSettings,
    clients: BTreeMap<String, ClientStackSettings>,
    servers: BTreeMap<String, ServerStackSettings>,
    /// The stacks built from these settings, for [`apply`](Self::apply).
    built: Arc<Mutex<Built>>,
}

#[derive(Debug, Default)]
struct Built {
    clients: BTreeMap<String, Vec<ClientStackHandle>>,
    servers: BTreeMap<String, Vec<ServerStackHandle>>,
}

/// Keys whose value is one choice among several shapes: an override
/// replaces it whole instead of merging into it.
const REPLACED_WHOLE: [&str; 2] = ["window", "adaptive"];

fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (key, value) in over {
                match base.get_mut(key) {
                    Some(slot) if !REPLACED_WHOLE.contains(&key.as_str()) => merge(slot, value),
                    _ => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, over) => *base = over.clone(),
    }
}

/// Whether `path` (dotted) leads somewhere in `value`.
fn has_path(value: &Value, path: &str) -> bool {
    let mut at = value;
    for key in path.split('.').filter(|k| !k.is_empty()) {
        match at.get(key) {
            Some(next) => at = next,
            None => return false,
        }
    }
    true
}

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, SettingsError> {
    value.as_object().ok_or_else(|| {
        SettingsError::new(path, format!("expected a table of settings, got {value}"))
    })
}

fn check_keys(map: &Map<String, Value>, path: &str, allowed: &[&str]) -> Result<(), SettingsError> {
    match map.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(SettingsError::new(
            join(path, key),
            format!(
                "unknown key `{key}`, expected one of {}",
                allowed.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// Reads one entry: the defaults merged with `own`, errors placed where
/// the offending key is written (the entry, else the defaults).
fn entry<T: DeserializeOwned>(
    defaults: &Value,
    defaults_path: &str,
    own: &Value,
    own_path: &str,
) -> Result<T, SettingsError> {
    object(own, own_path)?;
    let mut merged = defaults.clone();
    merge(&mut merged, own);
    parse::<T>(merged, "").map_err(|e| {
        let at = if has_path(own, &e.path) {
            own_path
        } else {
            defaults_path
        };
        SettingsError::new(join(at, &e.path), e.message)
    })
}

impl ServiceSettings {
    /// Reads a document from a JSON string.
    ///
    /// # Errors
    ///
    /// A [`SettingsError`] for malformed JSON, an unknown key or an
    /// invalid value, with its path.
    pub fn from_json_str(text: &str) -> Result<Self, SettingsError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| SettingsError::new("", format!("not valid JSON: {e}")))?;
        Self::from_value(value)
    }

    /// Reads a document from any serde deserializer (`toml`'s,
    /// `serde_yaml_ng`'s...).
    ///
    /// # Errors
    ///
    /// As [`from_value`](Self::from_value), and the format's own errors.
    pub fn from_deserializer<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Self, SettingsError> {
        let value =
            Value::deserialize(deserializer).map_err(|e| SettingsError::new("", e.to_string()))?;
        Self::from_value(value)
    }

    /// Reads a document already parsed into a [`Value`] (any format
    /// deserializes into one).
    ///
    /// # Errors
    ///
    /// A [`SettingsError`] for an unknown key (top-level, in `defaults`,
    /// or in any layer's section) or an invalid value, with its path.
    pub fn from_value(document: Value) -> Result<Self, SettingsError> {
        let empty = Value::Object(Map::new());
        let top = object(&document, "")?;
        check_keys(top, "", &["defaults", "clients", "servers"])?;
        let defaults = top.get("defaults").unwrap_or(&empty);
        check_keys(
            object(defaults, "defaults")?,
            "defaults",
            &["client", "server"],
        )?;
        let client_defaults = defaults.get("client").unwrap_or(&empty);
        let server_defaults = defaults.get("server").unwrap_or(&empty);

        let mut settings = ServiceSettings {
            client_defaults: entry(&empty, "", client_defaults, "defaults.client")?,
            server_defaults: entry(&empty, "", server_defaults, "defaults.server")?,
            ..ServiceSettings::default()
        };
        settings
            .client_defaults
            .validate()
            .map_err(|e| SettingsError::new(join("defaults.client", &e.path), e.message))?;
        settings
            .server_defaults
            .validate()
            .map_err(|e| SettingsError::new(join("defaults.server", &e.path), e.message))?;
        if let Some(clients) = top.get("clients") {
            for (name, own) in object(clients, "clients")? {
                let path = join("clients", name);
                let client: ClientStackSettings =
                    entry(client_defaults, "defaults.client", own, &path)?;
                client
                    .validate()
                    .map_err(|e| SettingsError::new(join(&path, &e.path), e.message))?;
                settings.clients.insert(name.clone(), client);
            }
        }
        if let Some(servers) = top.get("servers") {
            for (name, own) in object(servers, "servers")? {
                let path = join("servers", name);
                let server: ServerStackSettings =
                    entry(server_defaults, "defaults.server", own, &path)?;
                server
                    .validate()
                    .map_err(|e| SettingsError::new(join(&path, &e.path), e.message))?;
                settings.servers.insert(name.clone(), server);
            }
        }
        Ok(settings)
    }

    /// The settings of the client stack `name`: its entry, or the
    /// defaults when the document has none.
    #[must_use]
    pub fn client(&self, name: &str) -> &ClientStackSettings {
        self.clients.get(name).unwrap_or(&self.client_defaults)
    }

    /// The settings of the server stack `name`: its entry, or the
    /// defaults.
    #[must_use]
    pub fn server(&self, name: &str) -> &ServerStackSettings {
        self.servers.get(name).unwrap_or(&self.server_defaults)
    }

    /// The names of the client stacks the document lists.
    pub fn client_names(&self) -> impl Iterator<Item = &str> {
        self.clients.keys().map(String::as_str)
    }

    /// The names of the server stacks the document lists.
    pub fn server_names(&self) -> impl Iterator<Item = &str> {
        self.servers.keys().map(String::as_str)
    }

    /// The client stack `name` with its settings, and its handle; the
    /// stack is remembered, so that [`apply`](Self::apply) changes it
    /// when the settings change. Build each stack once, at start-up, and
    /// clone it (clones share everything): each call here builds a new
    /// stack, with a breaker and a compartment of its own, and remembers
    /// it.
    pub fn client_stack(&self, name: &str) -> (SettingsClientStack, ClientStackHandle) {
        let (stack, handle) = self
            .client(name)
            .build(name)
            .expect("settings are validated when read");
        self.built
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clients
            .entry(name.to_owned())
            .or_default()
            .push(handle.clone());
        (stack, handle)
    }

    /// The server stack `name` with its settings, and its handle
    /// (remembered, as [`client_stack`](Self::client_stack)'s).
    pub fn server_stack(&self, name: &str) -> (ServerStack, ServerStackHandle) {
        let (stack, handle) = self
            .server(name)
            .build(name)
            .expect("settings are validated when read");
        self.built
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .servers
            .entry(name.to_owned())
            .or_default()
            .push(handle.clone());
        (stack, handle)
    }

    /// Applies `new` (a document read again, say on `SIGHUP`) to every
    /// stack built from these settings, and takes its values: each stack
    /// gets its name's new settings, keeping its state. Returns each
    /// stack's report, by name. Stacks not built yet get the new
    /// settings when they are.
    #[must_use]
    pub fn apply(&mut self, new: ServiceSettings) -> BTreeMap<String, Applied> {
        let built = Arc::clone(&self.built);
        *self = ServiceSettings { built, ..new };
        let built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        let mut reports = BTreeMap::new();
        for (name, handles) in &built.clients {
            let settings = self.client(name);
            for handle in handles {
                let applied = handle
                    .apply(settings)
                    .expect("settings are validated when read");
                reports.insert(name.clone(), applied);
            }
        }
        for (name, handles) in &built.servers {
            let settings = self.server(name);
            for handle in handles {
                let applied = handle
                    .apply(settings)
                    .expect("settings are validated when read");
                reports.insert(format!("server {name}"), applied);
            }
        }
        reports
    }
}

// === Applied ===

/// What a settings change did to a running stack.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Applied {
    /// The settings that changed and apply from now on
    /// (`breaker.failure_rate`, `retry.max_attempts`, `timeout`...).
    pub applied: Vec<String>,
    /// The settings that differ but could not change on the running stack:
    /// they keep their old values until it is built again.
    pub not_live: Vec<NotLive>,
}

/// A setting that could not change on a running stack, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotLive {
    /// The setting, as a path in the settings (`breaker.window`).
    pub setting: String,
    /// Why.
    pub reason: String,
}

impl Applied {
    fn live(&mut self, setting: impl Into<String>, changed: bool) {
        if changed {
            self.applied.push(setting.into());
        }
    }

    fn not_live(&mut self, setting: impl Into<String>, reason: impl Into<String>) {
        self.not_live.push(NotLive {
            setting: setting.into(),
            reason: reason.into(),
        });
    }

    /// Whether every setting that changed was applied.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        self.not_live.is_empty()
    }

    fn log(&self, stack: &str) {
        if !self.applied.is_empty() {
            tracing::info!(
                target: "tower_shield",
                dependency = %stack,
                applied = ?self.applied,
                "settings_applied"
            );
        }
        for n in &self.not_live {
            tracing::warn!(
                target: "tower_shield",
                dependency = %stack,
                setting = %n.setting,
                reason = %n.reason,
                "settings_not_live"
            );
        }
    }
}

// === ClientStackHandle ===

/// Applies new [`ClientStackSettings`] to a running client stack; see the
/// [module docs](self#changing-settings-while-the-stack-runs). Clones
/// share the stack and its current settings.
#[derive(Debug, Clone)]
pub struct ClientStackHandle {
    inner: Arc<ClientHandleInner>,
}

#[derive(Debug)]
struct ClientHandleInner {
    timeout: TimeoutHandle,
    breaker: Breaker,
    attempts: MaxAttempts,
    budget: Arc<RetryBudget>,
    bulkhead: CompartmentHandle,
    throttle: Option<ThrottleHandle>,
    #[cfg(feature = "chaos")]
    faults: Mutex<Option<FaultHandle>>,
    /// The settings in effect; the lock makes changes one at a time.
    current: Mutex<ClientStackSettings>,
}

impl ClientStackHandle {
    /// A handle on `stack`, whose settings are `current` (those it was
    /// built with: the next [`apply`](Self::apply) compares with them).
    pub fn new<P, M, R: tower_bulkhead::release::Release, T: ThrottleSlot>(
        stack: &ClientStack<P, M, R, T>,
        current: ClientStackSettings,
    ) -> Self {
        Self {
            inner: Arc::new(ClientHandleInner {
                timeout: stack.timeout_handle().clone(),
                breaker: stack.breaker_handle().clone(),
                attempts: stack.max_attempts_handle(),
                budget: Arc::clone(stack.retry_budget()),
                bulkhead: stack.bulkhead_handle(),
                throttle: stack.throttle_handle().cloned(),
                #[cfg(feature = "chaos")]
                faults: Mutex::new(None),
                current: Mutex::new(current),
            }),
        }
    }

    /// Registers the fault layer (placed where you chose, usually at the
    /// transport) whose plan `faults` settings set: from now on, a change
    /// of `faults` applies to it (their absence turns it off). The current
    /// settings' plan, if any, applies at once.
    ///
    /// # Errors
    ///
    /// A [`SettingsError`] if the current plan is invalid (it was checked
    /// when read, so only for settings built by hand).
    #[cfg(feature = "chaos")]
    #[cfg_attr(docsrs, doc(cfg(feature = "chaos")))]
    pub fn with_faults(self, faults: FaultHandle) -> Result<Self, SettingsError> {
        {
            let current = self
                .inner
                .current
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match &current.faults {
                Some(plan) => faults
                    .set(plan.clone())
                    .map_err(|e| SettingsError::new("faults", e.to_string()))?,
                None => faults.off(),
            }
        }
        *self
            .inner
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(faults);
        Ok(self)
    }

    /// The settings in effect (with the values that could not apply live
    /// as the last change asked for them).
    #[must_use]
    pub fn current(&self) -> ClientStackSettings {
        self.inner
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Applies `new` to the running stack, keeping its state, and says
    /// what changed and what could not.
    ///
    /// # Errors
    ///
    /// A [`SettingsError`] if `new` is invalid; nothing changes then.
    pub fn apply(&self, new: &ClientStackSettings) -> Result<Applied, SettingsError> {
        new.validate()?;
        let inner = &*self.inner;
        let mut current = inner.current.lock().unwrap_or_else(PoisonError::into_inner);
        let mut done = Applied::default();

        inner.timeout.set(new.timeout.map(|t| t.0));
        done.live("timeout", new.timeout != current.timeout);

        let breaker = inner.breaker.reconfigure(new.breaker.clone());
        for setting in breaker.applied {
            done.live(format!("breaker.{setting}"), true);
        }
        for n in breaker.not_live {
            done.not_live(format!("breaker.{}", n.setting), n.reason);
        }

        let retry_not_live = new
            .retry
            .apply(&current.retry, &inner.attempts, &inner.budget)
            .map_err(|e| SettingsError::new(join("retry", e.setting), e.message))?;
        done.live(
            "retry.max_attempts",
            new.retry.max_attempts != current.retry.max_attempts,
        );
        done.live(
            "retry.budget.ratio",
            new.retry.budget.ratio != current.retry.budget.ratio,
        );
        done.live(
            "retry.budget.min_per_sec",
            new.retry.budget.min_per_sec != current.retry.budget.min_per_sec,
        );
        for setting in retry_not_live {
            done.not_live(
                format!("retry.{setting}"),
                "read when the retry layer is built",
            );
        }

        let bulkhead_not_live = new
            .bulkhead
            .apply(&current.bulkhead, &inner.bulkhead)
            .map_err(|e| SettingsError::new(join("bulkhead", e.setting), e.message))?;
        done.live(
            "bulkhead.limit",
            new.bulkhead.fixed_limit() != current.bulkhead.fixed_limit()
                && !bulkhead_not_live.contains(&"limit")
                && !bulkhead_not_live.contains(&"adaptive"),
        );
        for setting in bulkhead_not_live {
            done.not_live(
                format!("bulkhead.{setting}"),
                "an adaptive limit, or the switch to or from one, is set when the bulkhead is built",
            );
        }

        let throttle_changed = serde_json::to_value(&new.throttle).ok()
            != serde_json::to_value(&current.throttle).ok();
        if throttle_changed {
            match (&inner.throttle, &new.throttle) {
                (Some(handle), Some(config)) => {
                    let not_live = handle
                        .reconfigure(config.clone())
                        .map_err(|e| SettingsError::new("throttle", e.to_string()))?;
                    done.live("throttle", true);
                    for setting in not_live {
                        done.not_live(
                            format!("throttle.{setting}"),
                            "the throttle's window is shaped when it is built",
                        );
                    }
                }
                (None, Some(_)) => {
                    done.not_live("throttle", "the stack was built without a throttle")
                }
                (Some(_), None) => done.not_live(
                    "throttle",
                    "the stack was built with a throttle; rebuild it without",
                ),
                (None, None) => {}
            }
        }

        #[cfg(feature = "chaos")]
        {
            let faults = inner.faults.lock().unwrap_or_else(PoisonError::into_inner);
            if new.faults != current.faults {
                match (&*faults, &new.faults) {
                    (Some(handle), Some(plan)) => {
                        handle
                            .set(plan.clone())
                            .map_err(|e| SettingsError::new("faults", e.to_string()))?;
                        done.live("faults", true);
                    }
                    (Some(handle), None) => {
                        handle.off();
                        done.live("faults", true);
                    }
                    (None, _) => done.not_live(
                        "faults",
                        "no fault layer is registered (ClientStackHandle::with_faults)",
                    ),
                }
            }
        }

        *current = new.clone();
        drop(current);
        done.log(inner.breaker.name());
        Ok(done)
    }
}

// === ServerStackHandle ===

/// Applies new [`ServerStackSettings`] to a running server stack: the
/// breaker's thresholds and the bulkhead's limit change live; the
/// deadline's `timeout` and `max_timeout` are read when the stack is
/// built and are reported as not live.
#[derive(Debug, Clone)]
pub struct ServerStackHandle {
    breaker: Breaker,
    bulkhead: CompartmentHandle,
    current: Arc<Mutex<ServerStackSettings>>,
}

impl ServerStackHandle {
    /// The settings in effect.
    #[must_use]
    pub fn current(&self) -> ServerStackSettings {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Applies `new` to the running stack, keeping its state.
    ///
    /// # Errors
    ///
    /// A [`SettingsError`] if `new` is invalid; nothing changes then.
    pub fn apply(&self, new: &ServerStackSettings) -> Result<Applied, SettingsError> {
        new.validate()?;
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let mut done = Applied::default();
        let breaker = self.breaker.reconfigure(new.breaker.clone());
        for setting in breaker.applied {
            done.live(format!("breaker.{setting}"), true);
        }
        for n in breaker.not_live {
            done.not_live(format!("breaker.{}", n.setting), n.reason);
        }
        if new.concurrency != current.concurrency {
            match self.bulkhead.set_limit(new.concurrency) {
                Ok(_) => done.live("concurrency", true),
                Err(e) => done.not_live("concurrency", e.to_string()),
            }
        }
        if new.timeout != current.timeout {
            done.not_live(
                "timeout",
                "the server deadline's settings are read when the stack is built",
            );
        }
        if new.max_timeout != current.max_timeout {
            done.not_live(
                "max_timeout",
                "the server deadline's settings are read when the stack is built",
            );
        }
        *current = new.clone();
        drop(current);
        done.log(self.breaker.name());
        Ok(done)
    }
}
