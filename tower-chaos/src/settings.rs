//! [`FaultPlan`] as settings (feature `serde`): a game day's faults in the
//! same file as the rest of a service's settings.
//!
//! ```toml
//! latency = { share = "10%", delay = "200ms" }
//! error = "2%"
//! status = { share = "5%", code = 503 }
//! hang = "1%"
//! max_hang = "30s"
//! abort_body = { share = "1%", after_frames = 1 }
//! only_criticalities = ["sheddable", "sheddable-plus"]
//! only_keys = ["catalog.internal"]
//! ```
//!
//! Every setting is optional (an empty plan injects nothing), unknown keys
//! are refused, and the plan is [validated](FaultPlan::validate) as it is
//! read:
//!
//! ```
//! use tower_chaos::FaultPlan;
//!
//! let plan: FaultPlan = serde_json::from_str(r#"{ "error": "10%", "hang": "1%" }"#)?;
//! assert_eq!(plan, FaultPlan::new().error(0.1).hang(0.01));
//! let err = serde_json::from_str::<FaultPlan>(r#"{ "error": "60%", "hang": "60%" }"#).unwrap_err();
//! assert!(err.to_string().contains("add up to"), "{err}");
//! # Ok::<(), serde_json::Error>(())
//! ```

use http::StatusCode;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tower_resilience_base::criticality::Criticality;
use tower_resilience_base::settings::{HumanDuration, Share};

use crate::plan::{FaultPlan, DEFAULT_MAX_HANG};

#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    latency: Option<RawLatency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<Share>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<RawStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hang: Option<Share>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_hang: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    abort_body: Option<RawAbort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    only_criticalities: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    only_keys: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLatency {
    share: Share,
    delay: HumanDuration,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStatus {
    share: Share,
    code: u16,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAbort {
    share: Share,
    #[serde(default)]
    after_frames: u32,
}

impl TryFrom<RawPlan> for FaultPlan {
    type Error = String;

    fn try_from(raw: RawPlan) -> Result<Self, String> {
        let mut plan = FaultPlan::new();
        if let Some(l) = raw.latency {
            plan = plan.latency(l.share.0, l.delay.0);
        }
        if let Some(Share(share)) = raw.error {
            plan = plan.error(share);
        }
        if let Some(s) = raw.status {
            let code = StatusCode::from_u16(s.code)
                .map_err(|_| format!("status.code {} is not an HTTP status (100..=999)", s.code))?;
            plan = plan.status(s.share.0, code);
        }
        if let Some(Share(share)) = raw.hang {
            plan = plan.hang(share);
        }
        if let Some(HumanDuration(max)) = raw.max_hang {
            if max.is_zero() {
                return Err("max_hang must be above 0s".into());
            }
            plan = plan.max_hang(max);
        }
        if let Some(a) = raw.abort_body {
            plan = plan.abort_body(a.share.0, a.after_frames);
        }
        if let Some(names) = raw.only_criticalities {
            let criticalities = names
                .iter()
                .map(|name| {
                    name.parse::<Criticality>()
                        .map_err(|e| format!("only_criticalities: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            plan = plan.only_criticalities(criticalities);
        }
        if let Some(keys) = raw.only_keys {
            plan = plan.only_keys(keys);
        }
        plan.validate().map_err(|e| e.to_string())?;
        Ok(plan)
    }
}

impl From<&FaultPlan> for RawPlan {
    fn from(p: &FaultPlan) -> Self {
        let share = |s: f64| (s > 0.0).then_some(Share(s));
        RawPlan {
            latency: (p.latency.0 > 0.0).then_some(RawLatency {
                share: Share(p.latency.0),
                delay: HumanDuration(p.latency.1),
            }),
            error: share(p.error),
            status: (p.status.0 > 0.0).then(|| RawStatus {
                share: Share(p.status.0),
                code: p.status.1.as_u16(),
            }),
            hang: share(p.hang),
            max_hang: (p.max_hang != DEFAULT_MAX_HANG).then_some(HumanDuration(p.max_hang)),
            abort_body: (p.abort.0 > 0.0).then_some(RawAbort {
                share: Share(p.abort.0),
                after_frames: p.abort.1,
            }),
            only_criticalities: (p.criticalities != 0b1111).then(|| {
                Criticality::ALL
                    .into_iter()
                    .filter(|c| p.criticalities & (1 << c.index()) != 0)
                    .map(|c| c.as_str().to_owned())
                    .collect()
            }),
            only_keys: p.keys.as_ref().map(|keys| keys.to_vec()),
        }
    }
}

impl Serialize for FaultPlan {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        RawPlan::from(self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for FaultPlan {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawPlan::deserialize(deserializer)?;
        FaultPlan::try_from(raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_fault_round_trips() {
        let plan = FaultPlan::new()
            .latency(0.1, Duration::from_millis(200))
            .error(0.02)
            .status(0.05, StatusCode::TOO_MANY_REQUESTS)
            .hang(0.01)
            .max_hang(Duration::from_secs(5))
            .abort_body(0.01, 2)
            .only_criticalities([Criticality::Sheddable, Criticality::SheddablePlus])
            .only_keys(["catalog.internal"]);
        let written = serde_json::to_string(&plan).unwrap();
        assert_eq!(
            serde_json::from_str::<FaultPlan>(&written).unwrap(),
            plan,
            "{written}"
        );
        assert_eq!(serde_json::to_string(&FaultPlan::new()).unwrap(), "{}");
    }

    #[test]
    fn bad_plans_are_refused() {
        for (document, message) in [
            (r#"{"error": "110%"}"#, "above 100%"),
            (
                r#"{"status": {"share": "5%", "code": 42}}"#,
                "status.code 42",
            ),
            (
                r#"{"latency": {"share": "5%", "delay": "-1ms"}}"#,
                "negative",
            ),
            (r#"{"max_hang": "0s"}"#, "max_hang must be above 0s"),
            (
                r#"{"only_criticalities": ["urgent"]}"#,
                "unknown criticality `urgent`",
            ),
            (r#"{"errors": "5%"}"#, "unknown field `errors`"),
        ] {
            let err = serde_json::from_str::<FaultPlan>(document)
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{document}: {err}");
        }
    }
}
