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
    use serde_json::json;

    use super::*;

    /// The message of the error `result` holds, with its path.
    fn error<T: std::fmt::Debug>(result: Result<T>) -> (String, String) {
        let error = result.expect_err("an invalid value");
        (error.path().to_owned(), error.message().to_owned())
    }

    fn retry(max_attempts: Value, multiplier: Value) -> Value {
        json!({
            "maxAttempts": max_attempts,
            "initialBackoff": "0.1s",
            "maxBackoff": "1s",
            "backoffMultiplier": multiplier,
            "retryableStatusCodes": ["UNAVAILABLE"],
        })
    }

    fn read_retry(value: &Value) -> (Result<RetryPolicy>, Vec<Adjustment>) {
        let mut reader = Reader {
            adjustments: Vec::new(),
        };
        let policy = reader.retry_policy(value, "p");
        (policy, reader.adjustments)
    }

    #[test]
    fn whole_numbers_are_json_integers_integral_floats_or_strings_of_them() {
        assert_eq!(integer(&json!(3), "p").unwrap(), 3);
        assert_eq!(integer(&json!(-2), "p").unwrap(), -2);
        assert_eq!(
            integer(&json!(u64::MAX), "p").unwrap(),
            i128::from(u64::MAX)
        );
        assert_eq!(integer(&json!(4.0), "p").unwrap(), 4);
        assert_eq!(
            integer(&json!(-1e20), "p").unwrap(),
            -100_000_000_000_000_000_000
        );
        assert_eq!(integer(&json!(" 8 "), "p").unwrap(), 8);
        assert_eq!(
            error(integer(&json!(4.5), "p")),
            ("p".into(), "expected a whole number, got 4.5".into())
        );
        assert!(integer(&json!(1e30), "p").is_err(), "beyond 1e30: refused");
        assert!(integer(&json!(9.9e29), "p").is_ok());
        assert_eq!(
            error(integer(&json!(true), "p")).1,
            "expected a whole number, got a boolean"
        );
        let long = "1".repeat(41);
        assert_eq!(
            error(integer(&json!(long), "p")).1,
            "expected a whole number, got a string",
            "a long value is named by its kind"
        );
        let forty = "x".repeat(40);
        assert_eq!(
            error(integer(&json!(forty), "p")).1,
            format!("expected a whole number, got {forty:?}")
        );
    }

    #[test]
    fn numbers_are_finite_json_numbers_or_strings_of_them() {
        assert_eq!(number(&json!(1.5), "p").unwrap(), 1.5);
        assert_eq!(number(&json!(" 2.5 "), "p").unwrap(), 2.5);
        assert_eq!(
            error(number(&json!("inf"), "p")),
            ("p".into(), r#"expected a finite number, got "inf""#.into())
        );
        assert!(number(&json!("NaN"), "p").is_err());
        assert_eq!(
            error(number(&json!([1]), "p")).1,
            "expected a finite number, got a list"
        );
    }

    #[test]
    fn each_kind_of_value_is_named_in_errors() {
        let named = |value: Value| error(object(&value, "p")).1;
        assert_eq!(named(json!(null)), "expected an object, got null");
        assert_eq!(named(json!(false)), "expected an object, got a boolean");
        assert_eq!(named(json!(1)), "expected an object, got a number");
        assert_eq!(named(json!("x")), "expected an object, got a string");
        assert_eq!(named(json!([])), "expected an object, got a list");
        assert_eq!(
            error(array(&json!({}), "p")).1,
            "expected a list, got an object"
        );
        assert!(object(&json!({}), "p").is_ok() && array(&json!([]), "p").is_ok());
    }

    #[test]
    fn paths_join_with_a_dot_below_the_root() {
        assert_eq!(join("", "methodConfig"), "methodConfig");
        assert_eq!(join("a[0]", "name"), "a[0].name");
        let map = json!({ "here": 1, "gone": null });
        let map = map.as_object().unwrap();
        assert_eq!(required(map, "p", "here").unwrap().1, "p.here");
        assert_eq!(
            error(required(map, "p", "gone")),
            ("p.gone".into(), "missing; gRFC A6 requires it".into()),
            "null is absent"
        );
        assert!(field(map, "gone").is_none());
    }

    #[test]
    fn max_attempts_is_above_one_and_capped_to_five_with_a_note() {
        let attempts = |n: Value| {
            let (policy, adjustments) = read_retry(&retry(n, json!(2)));
            (policy.map(|p| p.max_attempts), adjustments)
        };
        assert_eq!(
            error(attempts(json!(1)).0),
            (
                "p.maxAttempts".into(),
                "must be greater than 1, got 1".into()
            )
        );
        let (two, notes) = attempts(json!(2));
        assert_eq!((two.unwrap(), notes.len()), (2, 0));
        let (five, notes) = attempts(json!(5));
        assert_eq!((five.unwrap(), notes.len()), (5, 0), "5 is within the cap");
        let (six, notes) = attempts(json!("6"));
        assert_eq!(six.unwrap(), 5);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].path(), "p.maxAttempts");
        assert_eq!((notes[0].requested(), notes[0].applied()), (6, 5));
        let (huge, notes) = attempts(json!(1e20));
        assert_eq!(huge.unwrap(), 5);
        assert_eq!(notes[0].requested(), u64::MAX, "beyond u64: saturated");
    }

    #[test]
    fn the_backoff_multiplier_is_above_zero() {
        for bad in [json!(0), json!(-1), json!(0.0)] {
            let (policy, _) = read_retry(&retry(json!(3), bad.clone()));
            assert_eq!(error(policy).0, "p.backoffMultiplier", "{bad}");
        }
        let (policy, _) = read_retry(&retry(json!(3), json!(0.001)));
        assert_eq!(policy.unwrap().backoff_multiplier, 0.001);
    }

    #[test]
    fn a_hedging_policy_has_no_delay_and_no_codes_unless_given() {
        let mut reader = Reader {
            adjustments: Vec::new(),
        };
        let hedge = reader
            .hedging_policy(&json!({ "maxAttempts": 3 }), "h")
            .unwrap();
        assert_eq!(hedge.max_attempts, 3);
        assert_eq!(hedge.hedging_delay, Duration::ZERO);
        assert!(hedge.codes.is_empty());
        let hedge = reader
            .hedging_policy(
                &json!({ "maxAttempts": 2, "hedgingDelay": "-0s", "nonFatalStatusCodes": [14] }),
                "h",
            )
            .unwrap();
        assert_eq!(hedge.hedging_delay, Duration::ZERO, "-0s is 0");
        assert!(!hedge.codes.is_empty());
    }

    #[test]
    fn durations_are_checked_against_their_lower_bound() {
        let at_least_zero = |v: Value| duration(&v, "d", false);
        let above_zero = |v: Value| duration(&v, "d", true);
        assert_eq!(at_least_zero(json!("0s")).unwrap(), Duration::ZERO);
        assert_eq!(at_least_zero(json!("-0.000s")).unwrap(), Duration::ZERO);
        assert_eq!(
            error(at_least_zero(json!("-1s"))),
            ("d".into(), r#"must be at least 0, got "-1s""#.into())
        );
        assert_eq!(
            error(above_zero(json!("0s"))).1,
            r#"must be greater than 0, got "0s""#
        );
        assert_eq!(
            error(above_zero(json!("-1s"))).1,
            r#"must be greater than 0, got "-1s""#
        );
        assert_eq!(
            above_zero(json!("0.25s")).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            above_zero(json!("0.123456789s")).unwrap(),
            Duration::from_nanos(123_456_789)
        );
        assert_eq!(
            error(above_zero(json!(5))).1,
            r#"expected a duration string such as "0.1s", got a number"#
        );
        assert!(error(above_zero(json!("5")))
            .1
            .starts_with(r#"invalid duration "5""#));
    }

    #[test]
    fn status_codes_are_one_to_sixteen_by_name_or_number() {
        let codes = status_codes(&json!([16, "1", 1]), "c");
        assert!(codes.is_err(), "a number in a string is not a name");
        let codes = status_codes(&json!([16, 1, "CANCELLED"]), "c").unwrap();
        assert_eq!(format!("{codes:?}"), "{CANCELLED, UNAUTHENTICATED}");
        assert_eq!(
            error(status_codes(&json!([1, 17]), "c")),
            (
                "c[1]".into(),
                "unknown status code 17; gRPC's codes are 0 to 16".into()
            )
        );
        assert_eq!(
            error(status_codes(&json!([-1]), "c")).1,
            "unknown status code -1; gRPC's codes are 0 to 16"
        );
        assert_eq!(
            error(status_codes(&json!([0]), "c")).1,
            "OK is not a failure; it cannot be retried or hedged on"
        );
        assert_eq!(
            error(status_codes(&json!([true]), "c")).1,
            "expected a status code name or number, got a boolean"
        );
        assert_eq!(error(status_codes(&json!({}), "c")).0, "c");
    }

    #[test]
    fn a_token_ratio_keeps_three_decimals_and_must_keep_one_thousandth() {
        let throttling =
            |ratio: Value| retry_throttling(&json!({ "maxTokens": 10, "tokenRatio": ratio }), "t");
        assert_eq!(throttling(json!(0.0006)).unwrap().token_ratio_milli(), 1);
        assert_eq!(throttling(json!(0.1234)).unwrap().token_ratio_milli(), 123);
        assert_eq!(
            error(throttling(json!(0.0004))),
            (
                "t.tokenRatio".into(),
                "must be greater than 0 at gRFC A6's three decimal places, got 0.0004".into()
            )
        );
        assert_eq!(
            throttling(json!(1e12)).unwrap().token_ratio_milli(),
            u32::MAX,
            "saturated"
        );
        assert_eq!(
            throttling(json!(4_294_967.295))
                .unwrap()
                .token_ratio_milli(),
            u32::MAX
        );
        assert_eq!(
            throttling(json!(4_294_967.294))
                .unwrap()
                .token_ratio_milli(),
            u32::MAX - 1
        );
        let tokens = |n: Value| retry_throttling(&json!({ "maxTokens": n, "tokenRatio": 1 }), "t");
        assert_eq!(tokens(json!(1)).unwrap().max_tokens(), 1);
        assert_eq!(tokens(json!(1000)).unwrap().max_tokens(), 1000);
        assert!(tokens(json!(0)).is_err() && tokens(json!(1001)).is_err());
    }

    #[test]
    fn a_method_name_needs_a_service_for_its_method() {
        assert_eq!(
            error(method_name(&json!({ "service": 5 }), "n")),
            ("n.service".into(), "expected a string, got a number".into())
        );
        let name = method_name(&json!({ "service": "a.B", "method": "C" }), "n").unwrap();
        assert_eq!((&*name.service, &*name.method), ("a.B", "C"));
        let name = method_name(&json!({ "method": "" }), "n").unwrap();
        assert_eq!((&*name.service, &*name.method), ("", ""), "`{{}}`");
        assert_eq!(
            error(method_name(&json!({ "method": "C" }), "n")).0,
            "n.method"
        );
    }

    #[test]
    fn a_name_twice_in_one_method_config_is_a_duplicate() {
        let config = json!({ "methodConfig": [
            { "name": [{ "service": "a.B" }, { "service": "a.B" }] },
        ] });
        assert_eq!(
            error(service_config(&config)),
            (
                "methodConfig[0].name[1]".into(),
                r#"duplicate name {service: "a.B"}, already at methodConfig[0].name[0]; gRFC A6 makes such a config invalid"#
                    .into()
            )
        );
        let fine = json!({ "methodConfig": [
            { "name": [{ "service": "a.B" }, { "service": "a.B", "method": "C" }] },
        ] });
        let config = service_config(&fine).unwrap();
        assert_eq!(config.methods[0].names.len(), 2);
        assert!(config.throttling.is_none() && config.adjustments.is_empty());
    }

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
