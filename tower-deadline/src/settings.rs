//! The deadline layers' settings as data (feature `serde`), read with
//! serde from any format and written back the same.
//!
//! ```toml
//! # ClientDeadlineSettings
//! timeout = "2s"          # the call's own bound (none by default)
//! margin = "5ms"
//! min_remaining = "10ms"
//!
//! # ServerDeadlineSettings
//! timeout = "2s"          # for callers that send no budget
//! max_timeout = "30s"     # the most any caller may ask for
//! min_remaining = "1ms"
//! ```
//!
//! ```
//! use std::time::Duration;
//! use tower_deadline::settings::ClientDeadlineSettings;
//!
//! let settings: ClientDeadlineSettings = serde_json::from_str(r#"{ "timeout": "800ms" }"#)?;
//! assert_eq!(settings.timeout.map(|t| t.0), Some(Duration::from_millis(800)));
//! let _layer = settings.layer();
//! # Ok::<(), serde_json::Error>(())
//! ```

use serde::{Deserialize, Serialize};
use tower_resilience_base::settings::HumanDuration;

use crate::server::DEFAULT_MAX_TIMEOUT;
use crate::{ClientDeadlineLayer, ServerDeadlineLayer};

/// A [`ClientDeadlineLayer`]'s settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ClientDeadlineSettings {
    /// [`ClientDeadlineLayer::default_timeout`] (none by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    /// [`ClientDeadlineLayer::margin`] (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub margin: Option<HumanDuration>,
    /// [`ClientDeadlineLayer::min_remaining`] (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_remaining: Option<HumanDuration>,
}

impl ClientDeadlineSettings {
    /// `layer` with these settings.
    pub fn configure<E>(&self, mut layer: ClientDeadlineLayer<E>) -> ClientDeadlineLayer<E> {
        if let Some(t) = self.timeout {
            layer = layer.default_timeout(t.0);
        }
        if let Some(m) = self.margin {
            layer = layer.margin(m.0);
        }
        if let Some(m) = self.min_remaining {
            layer = layer.min_remaining(m.0);
        }
        layer
    }

    /// A [`ClientDeadlineLayer`] with these settings.
    pub fn layer(&self) -> ClientDeadlineLayer {
        self.configure(ClientDeadlineLayer::new())
    }
}

/// A [`ServerDeadlineLayer`]'s settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ServerDeadlineSettings {
    /// [`ServerDeadlineLayer::default_timeout`]: the budget of a request
    /// that brings none (none by default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    /// [`ServerDeadlineLayer::max_timeout`] (default 5 minutes).
    pub max_timeout: HumanDuration,
    /// [`ServerDeadlineLayer::min_remaining`] (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_remaining: Option<HumanDuration>,
}

impl Default for ServerDeadlineSettings {
    fn default() -> Self {
        Self {
            timeout: None,
            max_timeout: HumanDuration(DEFAULT_MAX_TIMEOUT),
            min_remaining: None,
        }
    }
}

impl ServerDeadlineSettings {
    /// `layer` with these settings.
    pub fn configure(&self, mut layer: ServerDeadlineLayer) -> ServerDeadlineLayer {
        if let Some(t) = self.timeout {
            layer = layer.default_timeout(t.0);
        }
        layer = layer.max_timeout(self.max_timeout.0);
        if let Some(m) = self.min_remaining {
            layer = layer.min_remaining(m.0);
        }
        layer
    }

    /// A [`ServerDeadlineLayer`] with these settings.
    pub fn layer(&self) -> ServerDeadlineLayer {
        self.configure(ServerDeadlineLayer::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refusals() {
        for document in [
            r#"{"timeout":"2s","margin":"5ms","min_remaining":"10ms"}"#,
            "{}",
        ] {
            let s: ClientDeadlineSettings = serde_json::from_str(document).unwrap();
            assert_eq!(serde_json::to_string(&s).unwrap(), document);
        }
        let s: ServerDeadlineSettings = serde_json::from_str("{}").unwrap();
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"max_timeout":"5m"}"#
        );
        for (document, message) in [
            (r#"{"timeout":"-1s"}"#, "cannot be negative"),
            (r#"{"timeout":2}"#, "needs a unit"),
            (r#"{"time_out":"2s"}"#, "unknown field `time_out`"),
        ] {
            let err = serde_json::from_str::<ClientDeadlineSettings>(document)
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{document}: {err}");
        }
    }
}
