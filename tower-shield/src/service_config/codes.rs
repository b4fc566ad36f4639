//! Sets of gRPC status codes, named as gRPC's JSON (and gRFC A6) names
//! them.

use std::fmt;

use tonic::Code;

/// The names of the codes, by number, as the JSON form of
/// `google.rpc.Code` (and A6's examples) spells them.
pub(crate) const NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The number of the code called `name`, if gRPC defines one by that
/// name (exactly, in upper case).
pub(crate) fn number_of(name: &str) -> Option<u32> {
    NAMES.iter().position(|n| *n == name).map(|n| n as u32)
}

/// A set of gRPC status codes: a method's `retryableStatusCodes` or
/// `nonFatalStatusCodes`.
///
/// # Example
///
/// ```
/// use tonic::Code;
/// use tower_shield::service_config::StatusCodes;
///
/// let codes = StatusCodes::new()
///     .with(Code::Unavailable)
///     .with(Code::ResourceExhausted);
/// assert!(codes.contains(Code::Unavailable));
/// assert!(!codes.contains(Code::Internal));
/// assert_eq!(codes.iter().collect::<Vec<_>>(), [Code::ResourceExhausted, Code::Unavailable]);
/// assert_eq!(format!("{codes:?}"), "{RESOURCE_EXHAUSTED, UNAVAILABLE}");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StatusCodes {
    /// Bit `n` for the code numbered `n`.
    bits: u32,
}

// === impl StatusCodes ===

impl StatusCodes {
    /// The empty set.
    #[must_use]
    pub const fn new() -> Self {
        Self { bits: 0 }
    }

    /// This set with `code` added.
    #[must_use]
    pub const fn with(self, code: Code) -> Self {
        self.with_number(code as u32)
    }

    /// This set with the code numbered `n` (below 17) added.
    pub(crate) const fn with_number(self, n: u32) -> Self {
        Self {
            bits: self.bits | (1 << n),
        }
    }

    /// Whether `code` is in the set.
    #[must_use]
    pub const fn contains(&self, code: Code) -> bool {
        self.contains_number(code as u32)
    }

    /// Whether the code numbered `n` is in the set (`false` for numbers
    /// gRPC does not define).
    pub(crate) const fn contains_number(&self, n: u32) -> bool {
        n < 17 && self.bits & (1 << n) != 0
    }

    /// Whether the set is empty.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.bits == 0
    }

    /// How many codes the set holds.
    #[must_use]
    pub const fn len(&self) -> usize {
        self.bits.count_ones() as usize
    }

    /// The codes of the set, by number.
    pub fn iter(&self) -> impl Iterator<Item = Code> {
        let bits = self.bits;
        (0..17u32)
            .filter(move |n| bits & (1 << n) != 0)
            .map(|n| Code::from(n as i32))
    }
}

impl fmt::Debug for StatusCodes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        /// A name, written without quotes.
        struct Name(&'static str);

        impl fmt::Debug for Name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.0)
            }
        }

        let bits = self.bits;
        f.debug_set()
            .entries(
                (0..17usize)
                    .filter(|n| bits & (1 << n) != 0)
                    .map(|n| Name(NAMES[n])),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are tonic's codes, in tonic's order.
    #[test]
    fn names_match_tonics_numbers() {
        for (n, name) in NAMES.iter().enumerate() {
            let code = Code::from(n as i32);
            assert_eq!(code as usize, n);
            assert_eq!(number_of(name), Some(n as u32));
            assert_eq!(
                format!("{:?}", StatusCodes::new().with(code)),
                format!("{{{name}}}")
            );
        }
        assert_eq!(number_of("unavailable"), None, "names are upper case");
        assert!(!StatusCodes::new().with_number(16).contains_number(17));
    }
}
