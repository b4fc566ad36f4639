//! Reading the JSON form of a service config: each field checked by A6's
//! rules, each error with the path of its field.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Map, Value};

use super::codes::{self, StatusCodes};
use super::config::{
    Adjustment, HedgingPolicy, MethodConfig, MethodName, RetryPolicy, RetryThrottling,
    ServiceConfig, ServiceConfigError, Table,
};

/// A6's cap on `maxAttempts`.
const MAX_ATTEMPTS: u32 = 5;
/// A6's cap on `maxTokens`.
const MAX_TOKENS: i128 = 1000;
/// The largest duration protobuf's JSON form allows: 10,000 years.
const MAX_SECONDS: u64 = 315_576_000_000;

type Result<T> = std::result::Result<T, ServiceConfigError>;

/// What the fields being read need: the changes made so far.
struct Reader {
    adjustments: Vec<Adjustment>,
}

pub(crate) fn service_config(root: &Value) -> Result<ServiceConfig> {
    let mut reader = Reader {
        adjustments: Vec::new(),
    };
    let root = object(root, "")?;
    let mut methods = Vec::new();
    if let Some(list) = field(root, "methodConfig") {
        for (i, entry) in array(list, "methodConfig")?.iter().enumerate() {
            methods.push(reader.method_config(entry, &format!("methodConfig[{i}]"))?);
        }
    }
    let throttling = field(root, "retryThrottling")
        .map(|v| retry_throttling(v, "retryThrottling"))
        .transpose()?;
    let table = table(&methods)?;
    Ok(ServiceConfig {
        methods,
        throttling,
        adjustments: reader.adjustments,
        table,
    })
}

/// The lookup table; a name given twice makes the config invalid (A6).
fn table(methods: &[MethodConfig]) -> Result<Table> {
    let mut table = Table::default();
    let mut seen: HashMap<&MethodName, (usize, usize)> = HashMap::new();
    for (i, config) in methods.iter().enumerate() {
        for (j, name) in config.names.iter().enumerate() {
            // Names are normalised when read (an absent field is an empty
            // one), so `{"service": ""}` is `{}` here too.
            if !table.insert(name, i) {
                let also = seen.get(name).map_or(String::new(), |(fi, fj)| {
                    format!(", already at methodConfig[{fi}].name[{fj}]")
                });
                return Err(ServiceConfigError::new(
                    format!("methodConfig[{i}].name[{j}]"),
                    format!("duplicate name {name}{also}; gRFC A6 makes such a config invalid"),
                ));
            }
            seen.insert(name, (i, j));
        }
    }
    Ok(table)
}

// === impl Reader ===

impl Reader {
    fn method_config(&mut self, value: &Value, path: &str) -> Result<MethodConfig> {
        let map = object(value, path)?;
        let mut names = Vec::new();
        if let Some(list) = field(map, "name") {
            let at = join(path, "name");
            for (j, name) in array(list, &at)?.iter().enumerate() {
                names.push(method_name(name, &format!("{at}[{j}]"))?);
            }
        }
        let (retry, hedging) = match (field(map, "retryPolicy"), field(map, "hedgingPolicy")) {
            (Some(_), Some(_)) => {
                return Err(ServiceConfigError::new(
                    path,
                    "has both `retryPolicy` and `hedgingPolicy`; gRFC A6 allows one of them",
                ))
            }
            (Some(retry), None) => (
                Some(self.retry_policy(retry, &join(path, "retryPolicy"))?),
                None,
            ),
            (None, Some(hedging)) => (
                None,
                Some(self.hedging_policy(hedging, &join(path, "hedgingPolicy"))?),
            ),
            (None, None) => (None, None),
        };
        Ok(MethodConfig {
            names,
            retry,
            hedging,
        })
    }

    fn retry_policy(&mut self, value: &Value, path: &str) -> Result<RetryPolicy> {
        let map = object(value, path)?;
        let max_attempts = self.max_attempts(map, path)?;
        let initial_backoff = positive_duration(required(map, path, "initialBackoff")?)?;
        let max_backoff = positive_duration(required(map, path, "maxBackoff")?)?;
        let (multiplier, at) = required(map, path, "backoffMultiplier")?;
        let backoff_multiplier = number(multiplier, &at)?;
        if backoff_multiplier <= 0.0 {
            return Err(ServiceConfigError::new(
                at,
                format!("must be greater than 0, got {backoff_multiplier}"),
            ));
        }
        let (list, at) = required(map, path, "retryableStatusCodes")?;
        let codes = status_codes(list, &at)?;
        if codes.is_empty() {
            return Err(ServiceConfigError::new(
                at,
                "must list at least one status code",
            ));
        }
        Ok(RetryPolicy {
            max_attempts,
            initial_backoff,
            max_backoff,
            backoff_multiplier,
            codes,
        })
    }

    fn hedging_policy(&mut self, value: &Value, path: &str) -> Result<HedgingPolicy> {
        let map = object(value, path)?;
        let max_attempts = self.max_attempts(map, path)?;
        let hedging_delay = match field(map, "hedgingDelay") {
            Some(delay) => duration(delay, &join(path, "hedgingDelay"), false)?,
            None => Duration::ZERO,
        };
        let codes = match field(map, "nonFatalStatusCodes") {
            Some(list) => status_codes(list, &join(path, "nonFatalStatusCodes"))?,
            None => StatusCodes::new(),
        };
        Ok(HedgingPolicy {
            max_attempts,
            hedging_delay,
            codes,
        })
    }

    /// `maxAttempts`: required, above 1, capped to 5 (with a note).
    fn max_attempts(&mut self, map: &Map<String, Value>, path: &str) -> Result<u32> {
        let (value, at) = required(map, path, "maxAttempts")?;
        let n = integer(value, &at)?;
        if n < 2 {
            return Err(ServiceConfigError::new(
                at,
                format!("must be greater than 1, got {n}"),
            ));
        }
        if n > i128::from(MAX_ATTEMPTS) {
            let requested = u64::try_from(n).unwrap_or(u64::MAX);
            tracing::warn!(
                path = %at,
                requested,
                applied = MAX_ATTEMPTS,
                "service config: maxAttempts capped to gRFC A6's limit"
            );
            self.adjustments
                .push(Adjustment::new(at, requested, MAX_ATTEMPTS));
            return Ok(MAX_ATTEMPTS);
        }
        Ok(n as u32)
    }
}

fn method_name(value: &Value, path: &str) -> Result<MethodName> {
    let map = object(value, path)?;
    let text = |key: &str| -> Result<Box<str>> {
        match field(map, key) {
            None => Ok("".into()),
            Some(Value::String(s)) => Ok(s.as_str().into()),
            Some(other) => Err(ServiceConfigError::new(
                join(path, key),
                format!("expected a string, got {}", kind(other)),
            )),
        }
    };
    let service = text("service")?;
    let method = text("method")?;
    if service.is_empty() && !method.is_empty() {
        return Err(ServiceConfigError::new(
            join(path, "method"),
            format!("method {method:?} has no `service`; only `{{}}` may leave the service out"),
        ));
    }
    Ok(MethodName { service, method })
}

fn retry_throttling(value: &Value, path: &str) -> Result<RetryThrottling> {
    let map = object(value, path)?;
    let (tokens, at) = required(map, path, "maxTokens")?;
    let max_tokens = integer(tokens, &at)?;
    if !(1..=MAX_TOKENS).contains(&max_tokens) {
        return Err(ServiceConfigError::new(
            at,
            format!("must be greater than 0 and at most {MAX_TOKENS}, got {max_tokens}"),
        ));
    }
    let (ratio, at) = required(map, path, "tokenRatio")?;
    let ratio = number(ratio, &at)?;
    // A6 keeps three decimal places.
    let milli = (ratio * 1000.0).round();
    if milli < 1.0 {
        return Err(ServiceConfigError::new(
            at,
            format!("must be greater than 0 at gRFC A6's three decimal places, got {ratio}"),
        ));
    }
    let milli = if milli >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        milli as u32
    };
    Ok(RetryThrottling::new_unchecked(max_tokens as u32, milli))
}

/// A list of status codes, by name (`"UNAVAILABLE"`) or number (`14`).
fn status_codes(value: &Value, path: &str) -> Result<StatusCodes> {
    let mut codes = StatusCodes::new();
    for (k, code) in array(value, path)?.iter().enumerate() {
        let at = format!("{path}[{k}]");
        let n = match code {
            Value::String(name) => codes::number_of(name).ok_or_else(|| {
                ServiceConfigError::new(
                    &*at,
                    format!(
                        "unknown status code {name:?}; expected a gRPC code name such as \
                         \"UNAVAILABLE\", or its number"
                    ),
                )
            })?,
            Value::Number(_) => {
                let n = integer(code, &at)?;
                u32::try_from(n).ok().filter(|n| *n < 17).ok_or_else(|| {
                    ServiceConfigError::new(
                        &*at,
                        format!("unknown status code {n}; gRPC's codes are 0 to 16"),
                    )
                })?
            }
            other => {
                return Err(ServiceConfigError::new(
                    at,
                    format!("expected a status code name or number, got {}", kind(other)),
                ))
            }
        };
        if n == 0 {
            return Err(ServiceConfigError::new(
                at,
                "OK is not a failure; it cannot be retried or hedged on",
            ));
        }
        codes = codes.with_number(n);
    }
    Ok(codes)
}

/// A duration above 0.
fn positive_duration((value, path): (&Value, String)) -> Result<Duration> {
    duration(value, &path, true)
}

/// A duration in protobuf's JSON form: seconds with up to nine decimals
/// and an `s` (`"0.1s"`, `"5s"`); above 0 when `positive`, else at least
/// 0.
fn duration(value: &Value, path: &str, positive: bool) -> Result<Duration> {
    let Value::String(text) = value else {
        return Err(ServiceConfigError::new(
            path,
            format!(
                "expected a duration string such as \"0.1s\", got {}",
                kind(value)
            ),
        ));
    };
    let Some((negative, duration)) = parse_duration(text) else {
        return Err(ServiceConfigError::new(
            path,
            format!(
                "invalid duration {text:?}; expected seconds with an `s` suffix, such as \
                 \"0.1s\" or \"5s\""
            ),
        ));
    };
    if negative && !duration.is_zero() || positive && duration.is_zero() {
        let bound = if positive { "greater than" } else { "at least" };
        return Err(ServiceConfigError::new(
            path,
            format!("must be {bound} 0, got {text:?}"),
        ));
    }
    Ok(duration)
}

/// `[-]seconds[.fraction]s`, the fraction of one to nine digits; whether
/// it was negative, and its size.
fn parse_duration(text: &str) -> Option<(bool, Duration)> {
    let body = text.strip_suffix('s')?;
    let (negative, body) = match body.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, body),
    };
    let (whole, fraction) = match body.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (body, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) {
        return None;
    }
    let seconds: u64 = whole.parse().ok().filter(|s| *s <= MAX_SECONDS)?;
    let nanos = match fraction {
        None => 0,
        Some(f) if digits(f) && f.len() <= 9 => {
            let n: u32 = f.parse().ok()?;
            n * 10u32.pow(9 - f.len() as u32)
        }
        Some(_) => return None,
    };
    Some((negative, Duration::new(seconds, nanos)))
}

/// A whole number: a JSON number without a fraction, or a string of one
/// (protobuf's JSON form allows both for integers).
fn integer(value: &Value, path: &str) -> Result<i128> {
    let n = match value {
        Value::Number(n) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 1e30)
                    .map(|f| f as i128)
            }),
        Value::String(s) => s.trim().parse::<i128>().ok(),
        _ => None,
    };
    n.ok_or_else(|| {
        ServiceConfigError::new(
            path,
            format!("expected a whole number, got {}", describe(value)),
        )
    })
}

/// A finite number: a JSON number, or a string of one.
fn number(value: &Value, path: &str) -> Result<f64> {
    let n = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    n.filter(|n| n.is_finite()).ok_or_else(|| {
        ServiceConfigError::new(
            path,
            format!("expected a finite number, got {}", describe(value)),
        )
    })
}

/// The field `key` of `map`; `null` counts as absent, as in protobuf's
/// JSON form.
fn field<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| !v.is_null())
}

/// The field `key` of `map` at `path`, with its own path; an error that
/// names it when it is absent.
fn required<'a>(map: &'a Map<String, Value>, path: &str, key: &str) -> Result<(&'a Value, String)> {
    let at = join(path, key);
    match field(map, key) {
        Some(value) => Ok((value, at)),
        None => Err(ServiceConfigError::new(at, "missing; gRFC A6 requires it")),
    }
}

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>> {
    value.as_object().ok_or_else(|| {
        ServiceConfigError::new(path, format!("expected an object, got {}", kind(value)))
    })
}

fn array<'a>(value: &'a Value, path: &str) -> Result<&'a Vec<Value>> {
    value.as_array().ok_or_else(|| {
        ServiceConfigError::new(path, format!("expected a list, got {}", kind(value)))
    })
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A value for a message: a short one as written, else its kind.
fn describe(value: &Value) -> String {
    match value {
        Value::Number(n) => n.to_string(),
        Value::String(s) if s.len() <= 40 => format!("{s:?}"),
        other => kind(other).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_protobufs_json_form() {
        let ok = |s: &str| parse_duration(s).map(|(neg, d)| (neg, d.as_nanos()));
        assert_eq!(ok("0.1s"), Some((false, 100_000_000)));
        assert_eq!(ok("5s"), Some((false, 5_000_000_000)));
        assert_eq!(ok("1.000000001s"), Some((false, 1_000_000_001)));
        assert_eq!(ok("-0.5s"), Some((true, 500_000_000)));
        assert_eq!(ok("0s"), Some((false, 0)));
        for bad in [
            "5",
            "s",
            ".5s",
            "1.s",
            "1.0000000001s",
            "1e3s",
            "+1s",
            "1 s",
            "",
            "0.1ms",
            "315576000001s",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
        assert!(parse_duration("315576000000s").is_some());
    }

    #[test]
    fn the_names_of_the_codes_are_read_by_name_and_number() {
        let list = serde_json::json!(["UNAVAILABLE", 8, "ABORTED"]);
        let codes = status_codes(&list, "x").unwrap();
        assert_eq!(
            format!("{codes:?}"),
            "{RESOURCE_EXHAUSTED, ABORTED, UNAVAILABLE}"
        );
    }
}
