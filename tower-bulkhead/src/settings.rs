//! A compartment's settings as data (feature `serde`), read with serde
//! from any format, written back the same, checked by
//! [`BulkheadSettings::validate`].
//!
//! A fixed limit, or an adaptive one:
//!
//! ```toml
//! limit = 64
//! max_wait = "0s"                  # fail fast (the default)
//! # or, instead of `limit`:
//! adaptive = { algorithm = "gradient", initial = 20, min = 1, max = 200 }
//! adaptive = { algorithm = "aimd", initial = 20, min = 1, max = 200, backoff_ratio = 0.9, timeout = "1s" }
//! ```
//!
//! ```
//! use tower_bulkhead::settings::BulkheadSettings;
//!
//! let settings: BulkheadSettings = serde_json::from_str(r#"{ "limit": 16 }"#)?;
//! let layer = settings.layer("catalog").expect("valid");
//! assert_eq!(layer.handle().limit(), 16);
//!
//! let settings: BulkheadSettings = serde_json::from_str(r#"{ "limit": 0 }"#)?;
//! assert_eq!(settings.validate().unwrap_err().to_string(), "limit: must be at least 1, got 0");
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_resilience_base::settings::HumanDuration;

use crate::adaptive::{Aimd, Gradient};
use crate::layer::BulkheadLayer;
use crate::{CompartmentHandle, SetLimitError};
use tower_resilience_base::Name;

/// A compartment's settings; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct BulkheadSettings {
    /// The fixed limit: calls in flight at once (ignored when `adaptive`
    /// is set; default 64, the client stack's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// An adaptive limit instead of the fixed one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveSettings>,
    /// [`BulkheadLayer::max_wait`]: how long a call may wait for a slot
    /// (default 0: refused at once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<HumanDuration>,
}

/// An adaptive limit's algorithm and bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct AdaptiveSettings {
    /// The algorithm.
    pub algorithm: AlgorithmKind,
    /// The limit it starts from (default: the algorithm's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial: Option<usize>,
    /// The least limit (default: the algorithm's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<usize>,
    /// The largest limit (default: the algorithm's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<usize>,
    /// AIMD's [`backoff_ratio`](Aimd::backoff_ratio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_ratio: Option<f64>,
    /// AIMD's [`timeout`](Aimd::timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
}

/// The adaptive algorithms a settings file can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AlgorithmKind {
    /// [`Gradient`].
    Gradient,
    /// [`Aimd`].
    Aimd,
}

pub use tower_resilience_base::settings::InvalidSetting;

/// The default fixed limit of a settings file: the client stack's.
const DEFAULT_LIMIT: usize = 64;

fn invalid<T>(setting: &'static str, message: String) -> Result<T, InvalidSetting> {
    Err(InvalidSetting { setting, message })
}

impl BulkheadSettings {
    /// A fixed limit of `limit`.
    #[must_use]
    pub fn fixed(limit: usize) -> Self {
        Self {
            limit: Some(limit),
            ..Self::default()
        }
    }

    /// The fixed limit these settings give (`None` when adaptive).
    #[must_use]
    pub fn fixed_limit(&self) -> Option<usize> {
        self.adaptive
            .is_none()
            .then(|| self.limit.unwrap_or(DEFAULT_LIMIT))
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// The first [`InvalidSetting`]: a limit of 0, both a `limit` and an
    /// `adaptive` limit, adaptive bounds out of order, an AIMD
    /// `backoff_ratio` outside `(0, 1)`, a zero AIMD timeout, or settings
    /// of AIMD given to the gradient.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if self.limit == Some(0) {
            return invalid("limit", "must be at least 1, got 0".into());
        }
        let Some(a) = &self.adaptive else {
            return Ok(());
        };
        if self.limit.is_some() {
            return invalid(
                "limit",
                "give a fixed `limit` or an `adaptive` one, not both".into(),
            );
        }
        for (setting, value) in [
            ("adaptive.initial", a.initial),
            ("adaptive.min", a.min),
            ("adaptive.max", a.max),
        ] {
            if value == Some(0) {
                return invalid(setting, "must be at least 1, got 0".into());
            }
        }
        if let (Some(min), Some(max)) = (a.min, a.max) {
            if min > max {
                return invalid(
                    "adaptive.min",
                    format!("({min}) is above adaptive.max ({max})"),
                );
            }
        }
        match a.algorithm {
            AlgorithmKind::Gradient => {
                if a.backoff_ratio.is_some() || a.timeout.is_some() {
                    return invalid(
                        "adaptive",
                        "`backoff_ratio` and `timeout` are AIMD's settings, not the gradient's"
                            .into(),
                    );
                }
            }
            AlgorithmKind::Aimd => {
                if let Some(r) = a.backoff_ratio {
                    if !(r > 0.0 && r < 1.0) {
                        return invalid(
                            "adaptive.backoff_ratio",
                            format!("must be between 0 and 1 (exclusive), got {r}"),
                        );
                    }
                }
                if a.timeout.is_some_and(|t| t.0.is_zero()) {
                    return invalid("adaptive.timeout", "must be above 0s".into());
                }
            }
        }
        Ok(())
    }

    /// A [`BulkheadLayer`] for the compartment `name` with these settings.
    ///
    /// # Errors
    ///
    /// An [`InvalidSetting`] from [`validate`](Self::validate).
    pub fn layer(&self, name: impl Into<Name>) -> Result<BulkheadLayer, InvalidSetting> {
        self.validate()?;
        let name = name.into();
        let layer = match &self.adaptive {
            None => BulkheadLayer::new(name, self.limit.unwrap_or(DEFAULT_LIMIT)),
            Some(a) => match a.algorithm {
                AlgorithmKind::Gradient => {
                    let mut g = Gradient::new();
                    if let Some(initial) = a.initial {
                        g = g.initial(initial);
                    }
                    if a.min.is_some() || a.max.is_some() {
                        g = g.bounds(
                            a.min.unwrap_or(Gradient::DEFAULT_MIN),
                            a.max.unwrap_or(Gradient::DEFAULT_MAX),
                        );
                    }
                    BulkheadLayer::adaptive(name, g)
                }
                AlgorithmKind::Aimd => {
                    let mut m = Aimd::new();
                    if let Some(initial) = a.initial {
                        m = m.initial(initial);
                    }
                    if a.min.is_some() || a.max.is_some() {
                        m = m.bounds(
                            a.min.unwrap_or(Aimd::DEFAULT_MIN),
                            a.max.unwrap_or(Aimd::DEFAULT_MAX),
                        );
                    }
                    if let Some(r) = a.backoff_ratio {
                        m = m.backoff_ratio(r);
                    }
                    if let Some(t) = a.timeout {
                        m = m.timeout(t.0);
                    }
                    BulkheadLayer::adaptive(name, m)
                }
            },
        };
        Ok(match self.max_wait {
            Some(HumanDuration(wait)) if wait > Duration::ZERO => layer.max_wait(wait),
            _ => layer,
        })
    }

    /// Applies these settings to a running compartment: a new fixed limit
    /// through [`CompartmentHandle::set_limit`] (permits, counters and
    /// waiters kept). Returns the settings that differ from `previous` but
    /// cannot change live (switching between fixed and adaptive, the
    /// adaptive algorithm's settings, `max_wait`).
    ///
    /// # Errors
    ///
    /// An [`InvalidSetting`] from [`validate`](Self::validate), before
    /// anything changes.
    pub fn apply(
        &self,
        previous: &BulkheadSettings,
        handle: &CompartmentHandle,
    ) -> Result<Vec<&'static str>, InvalidSetting> {
        self.validate()?;
        let mut not_live = Vec::new();
        match (self.fixed_limit(), previous.fixed_limit()) {
            (Some(limit), Some(_)) => match handle.set_limit(limit) {
                Ok(_) => {}
                Err(SetLimitError::Adaptive) => not_live.push("limit"),
                Err(e) => return invalid("limit", e.to_string()),
            },
            (None, None) if self.adaptive == previous.adaptive => {}
            _ => not_live.push("adaptive"),
        }
        if self.max_wait != previous.max_wait {
            not_live.push("max_wait");
        }
        Ok(not_live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for document in [
            r#"{"limit":16}"#,
            r#"{"adaptive":{"algorithm":"gradient","initial":20,"min":2,"max":200}}"#,
            r#"{"adaptive":{"algorithm":"aimd","backoff_ratio":0.9,"timeout":"1s"},"max_wait":"50ms"}"#,
            "{}",
        ] {
            let settings: BulkheadSettings = serde_json::from_str(document).unwrap();
            settings.validate().unwrap();
            assert_eq!(serde_json::to_string(&settings).unwrap(), document);
        }
    }

    #[test]
    fn invalid_settings_name_themselves() {
        for (document, message) in [
            (r#"{"limit":0}"#, "limit: must be at least 1, got 0"),
            (
                r#"{"limit":4,"adaptive":{"algorithm":"aimd"}}"#,
                "limit: give a fixed `limit` or an `adaptive` one, not both",
            ),
            (
                r#"{"adaptive":{"algorithm":"aimd","min":10,"max":5}}"#,
                "adaptive.min: (10) is above adaptive.max (5)",
            ),
            (
                r#"{"adaptive":{"algorithm":"aimd","max":0}}"#,
                "adaptive.max: must be at least 1, got 0",
            ),
            (
                r#"{"adaptive":{"algorithm":"aimd","backoff_ratio":1.5}}"#,
                "adaptive.backoff_ratio: must be between 0 and 1",
            ),
            (
                r#"{"adaptive":{"algorithm":"gradient","timeout":"1s"}}"#,
                "are AIMD's settings",
            ),
        ] {
            let settings: BulkheadSettings = serde_json::from_str(document).unwrap();
            let err = settings.validate().unwrap_err().to_string();
            assert!(err.contains(message), "{document}: {err}");
            assert!(settings.layer("x").is_err());
        }
        for (document, message) in [
            (r#"{"limit":-1}"#, "invalid value"),
            (
                r#"{"adaptive":{"algorithm":"vegas"}}"#,
                "unknown variant `vegas`",
            ),
            (r#"{"size":4}"#, "unknown field `size`"),
        ] {
            let err = serde_json::from_str::<BulkheadSettings>(document)
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{document}: {err}");
        }
    }

    #[test]
    fn a_new_fixed_limit_applies_live_and_a_switch_to_adaptive_does_not() {
        let before = BulkheadSettings::fixed(4);
        let handle = before.layer("x").unwrap().handle();
        assert!(BulkheadSettings::fixed(8)
            .apply(&before, &handle)
            .unwrap()
            .is_empty());
        assert_eq!(handle.limit(), 8);
        let adaptive: BulkheadSettings =
            serde_json::from_str(r#"{"adaptive":{"algorithm":"aimd"}}"#).unwrap();
        assert_eq!(adaptive.apply(&before, &handle).unwrap(), ["adaptive"]);
        assert_eq!(handle.limit(), 8, "unchanged");
    }
}
