//! The retry layer's settings as data (feature `serde`): what a settings
//! file says about retries, read with serde from any format, written back
//! the same, checked by [`RetrySettings::validate`], turned into a layer
//! by [`RetrySettings::layer`] and applied to a running one by
//! [`RetrySettings::apply`].
//!
//! ```toml
//! max_attempts = 3
//! backoff = { kind = "full_jitter", base = "50ms", cap = "1s", multiplier = 2.0 }
//! budget = { ratio = "10%", min_per_sec = 5, window = "10s" }
//! min_remaining = "10ms"
//! max_server_delay = "10s"
//! ```
//!
//! Every key is optional (absent means the default) and unknown keys are
//! refused:
//!
//! ```
//! use std::time::Duration;
//! use tower_retry_budget::settings::RetrySettings;
//!
//! let settings: RetrySettings =
//!     serde_json::from_str(r#"{ "max_attempts": 2, "backoff": { "cap": "500ms" } }"#)?;
//! settings.validate().expect("valid");
//! assert_eq!(settings.backoff.cap.0, Duration::from_millis(500));
//! let layer = settings.layer("catalog").expect("valid");
//! assert_eq!(layer.max_attempts_handle().get(), 2);
//!
//! let err = serde_json::from_str::<RetrySettings>(r#"{ "attempts": 2 }"#).unwrap_err();
//! assert!(err.to_string().starts_with("unknown field `attempts`"));
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tower_resilience_base::settings::{HumanDuration, Share};

use crate::backoff::Backoff;
use crate::budget::{RetryBudget, DEFAULT_MIN_PER_SEC, DEFAULT_RATIO, DEFAULT_WINDOW};
use crate::layer::{
    MaxAttempts, RetryLayer, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_SERVER_DELAY, DEFAULT_MIN_REMAINING,
};

/// The retry layer's settings; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct RetrySettings {
    /// [`RetryLayer::max_attempts`] (default 3, the first included; 1
    /// turns retries off).
    pub max_attempts: u32,
    /// [`RetryLayer::backoff`].
    pub backoff: BackoffSettings,
    /// The layer's [`RetryBudget`].
    pub budget: BudgetSettings,
    /// [`RetryLayer::min_remaining`] (default 10 ms).
    pub min_remaining: HumanDuration,
    /// [`RetryLayer::max_server_delay`] (default 10 s).
    pub max_server_delay: HumanDuration,
}

/// The backoff between attempts ([`Backoff`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct BackoffSettings {
    /// Full jitter (the default) or decorrelated jitter.
    pub kind: BackoffKind,
    /// The base delay (default 50 ms).
    pub base: HumanDuration,
    /// The cap on any delay (default 1 s).
    pub cap: HumanDuration,
    /// Full jitter's growth factor (default 2.0; above 0).
    pub multiplier: f64,
}

/// The kinds of [`Backoff`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BackoffKind {
    /// [`Backoff::full_jitter`].
    #[default]
    FullJitter,
    /// [`Backoff::decorrelated`].
    Decorrelated,
}

/// A [`RetryBudget`]'s settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct BudgetSettings {
    /// [`RetryBudget::ratio`] (default 10%; at most 100% in a file).
    pub ratio: Share,
    /// [`RetryBudget::min_per_sec`] (default 5).
    pub min_per_sec: u32,
    /// [`RetryBudget::window`] (default 10 s).
    pub window: HumanDuration,
}

pub use tower_resilience_base::settings::InvalidSetting;

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff: BackoffSettings::default(),
            budget: BudgetSettings::default(),
            min_remaining: HumanDuration(DEFAULT_MIN_REMAINING),
            max_server_delay: HumanDuration(DEFAULT_MAX_SERVER_DELAY),
        }
    }
}

impl Default for BackoffSettings {
    fn default() -> Self {
        Self {
            kind: BackoffKind::FullJitter,
            base: HumanDuration(Backoff::DEFAULT.base()),
            cap: HumanDuration(Backoff::DEFAULT.cap()),
            multiplier: Backoff::DEFAULT.multiplier_value(),
        }
    }
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self {
            ratio: Share(DEFAULT_RATIO),
            min_per_sec: DEFAULT_MIN_PER_SEC,
            window: HumanDuration(DEFAULT_WINDOW),
        }
    }
}

fn invalid(setting: &'static str, message: String) -> Result<(), InvalidSetting> {
    Err(InvalidSetting { setting, message })
}

impl RetrySettings {
    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// The first [`InvalidSetting`]: `max_attempts` of 0, a zero backoff
    /// base, a cap below the base, a multiplier that is not a finite number
    /// above 0, a budget ratio outside 0%..=100%, a budget window under
    /// 1 ms.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if self.max_attempts == 0 {
            return invalid(
                "max_attempts",
                "must be at least 1 (1 turns retries off), got 0".into(),
            );
        }
        let b = &self.backoff;
        if b.base.0.is_zero() {
            return invalid("backoff.base", "must be above 0s".into());
        }
        if b.cap < b.base {
            return invalid(
                "backoff.cap",
                format!("({}) is below backoff.base ({})", b.cap, b.base),
            );
        }
        if !(b.multiplier.is_finite() && b.multiplier > 0.0) {
            return invalid(
                "backoff.multiplier",
                format!("must be a finite number above 0, got {}", b.multiplier),
            );
        }
        let ratio = self.budget.ratio.0;
        if !(0.0..=1.0).contains(&ratio) {
            return invalid(
                "budget.ratio",
                format!("must be within 0%..=100%, got {ratio}"),
            );
        }
        if self.budget.window.0 < Duration::from_millis(1) {
            return invalid(
                "budget.window",
                format!("must be at least 1ms, got {}", self.budget.window),
            );
        }
        Ok(())
    }

    /// The [`Backoff`] these settings describe.
    #[must_use]
    pub fn backoff(&self) -> Backoff {
        let b = &self.backoff;
        match b.kind {
            // An invalid multiplier (see `validate`) is left at 2.
            BackoffKind::FullJitter if b.multiplier.is_finite() && b.multiplier > 0.0 => {
                Backoff::full_jitter(b.base.0, b.cap.0).multiplier(b.multiplier)
            }
            BackoffKind::FullJitter => Backoff::full_jitter(b.base.0, b.cap.0),
            BackoffKind::Decorrelated => Backoff::decorrelated(b.base.0, b.cap.0),
        }
    }

    /// The [`RetryBudget`] these settings describe.
    #[must_use]
    pub fn budget(&self) -> RetryBudget {
        let ratio = self.budget.ratio.0;
        // An invalid ratio (see `validate`) is left at the default.
        let ratio = if ratio.is_finite() && ratio >= 0.0 {
            ratio
        } else {
            DEFAULT_RATIO
        };
        RetryBudget::new()
            .ratio(ratio)
            .min_per_sec(self.budget.min_per_sec)
            .window(self.budget.window.0)
    }

    /// A [`RetryLayer`] named `name` (the `dependency` of its metrics and
    /// events) with these settings and the default policy.
    ///
    /// # Errors
    ///
    /// An [`InvalidSetting`] from [`validate`](Self::validate).
    pub fn layer(&self, name: impl Into<Arc<str>>) -> Result<RetryLayer, InvalidSetting> {
        self.validate()?;
        Ok(self.configure(RetryLayer::new().name(name)))
    }

    /// `layer` with these settings (its policy, random source and body
    /// mode kept), and a new budget.
    pub fn configure<P, M>(&self, layer: RetryLayer<P, M>) -> RetryLayer<P, M> {
        layer
            .max_attempts(self.max_attempts)
            .backoff(self.backoff())
            .budget(Arc::new(self.budget()))
            .min_remaining(self.min_remaining.0)
            .max_server_delay(self.max_server_delay.0)
    }

    /// Applies these settings to a running layer and the services it
    /// built, through the layer's [`MaxAttempts`]
    /// ([`RetryLayer::max_attempts_handle`]) and its budget
    /// ([`RetryLayer::shared_budget`]): `max_attempts` and the budget's
    /// ratio and floor change at once (the budget keeps its window and
    /// balance). Returns the settings that differ from `previous` but
    /// cannot change live (`backoff`, `budget.window`, `min_remaining`,
    /// `max_server_delay`): they keep their old values until the layer is
    /// built again.
    ///
    /// # Errors
    ///
    /// An [`InvalidSetting`] from [`validate`](Self::validate), before
    /// anything changes.
    ///
    /// # Example
    ///
    /// ```
    /// use tower_retry_budget::settings::RetrySettings;
    ///
    /// let before = RetrySettings::default();
    /// let layer = before.layer("catalog").unwrap();
    /// let mut after = before.clone();
    /// after.max_attempts = 2;
    /// let not_live = after
    ///     .apply(&before, &layer.max_attempts_handle(), layer.shared_budget())
    ///     .unwrap();
    /// assert!(not_live.is_empty());
    /// assert_eq!(layer.max_attempts_handle().get(), 2);
    /// ```
    pub fn apply(
        &self,
        previous: &RetrySettings,
        attempts: &MaxAttempts,
        budget: &RetryBudget,
    ) -> Result<Vec<&'static str>, InvalidSetting> {
        self.validate()?;
        attempts.set(self.max_attempts);
        // A limited budget (the only kind a file describes) takes any
        // valid ratio.
        let _ = budget.set_ratio(self.budget.ratio.0);
        budget.set_min_per_sec(self.budget.min_per_sec);
        let mut not_live = Vec::new();
        if self.backoff != previous.backoff {
            not_live.push("backoff");
        }
        if self.budget.window != previous.budget.window {
            not_live.push("budget.window");
        }
        if self.min_remaining != previous.min_remaining {
            not_live.push("min_remaining");
        }
        if self.max_server_delay != previous.max_server_delay {
            not_live.push("max_server_delay");
        }
        Ok(not_live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_defaults() {
        let defaults = RetrySettings::default();
        let written = serde_json::to_value(&defaults).unwrap();
        assert_eq!(
            written,
            serde_json::json!({
                "max_attempts": 3,
                "backoff": { "kind": "full_jitter", "base": "50ms", "cap": "1s", "multiplier": 2.0 },
                "budget": { "ratio": "10%", "min_per_sec": 5, "window": "10s" },
                "min_remaining": "10ms",
                "max_server_delay": "10s",
            })
        );
        assert_eq!(
            serde_json::from_value::<RetrySettings>(written).unwrap(),
            defaults
        );
        assert_eq!(
            serde_json::from_str::<RetrySettings>("{}").unwrap(),
            defaults
        );
    }

    #[test]
    fn invalid_settings_name_themselves() {
        for (document, message) in [
            (r#"{"max_attempts": 0}"#, "max_attempts: must be at least 1"),
            (
                r#"{"backoff": {"base": "0s"}}"#,
                "backoff.base: must be above 0s",
            ),
            (
                r#"{"backoff": {"base": "2s"}}"#,
                "backoff.cap: (1s) is below backoff.base (2s)",
            ),
            (
                r#"{"backoff": {"multiplier": 0.0}}"#,
                "backoff.multiplier: must be a finite number above 0",
            ),
            (
                r#"{"budget": {"window": "0s"}}"#,
                "budget.window: must be at least 1ms",
            ),
        ] {
            let settings: RetrySettings = serde_json::from_str(document).unwrap();
            let err = settings.validate().unwrap_err().to_string();
            assert!(err.contains(message), "{document}: {err}");
        }
        for (document, message) in [
            (r#"{"budget": {"ratio": "120%"}}"#, "above 100%"),
            (
                r#"{"backoff": {"kind": "exponential"}}"#,
                "unknown variant `exponential`",
            ),
            (r#"{"max_attempts": -1}"#, "invalid value"),
        ] {
            let err = serde_json::from_str::<RetrySettings>(document)
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{document}: {err}");
        }
    }
}
