//! [`Name`]: the name of a breaker, as its rejections carry it.

use std::borrow::{Borrow, Cow};
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// The name of a layer instance (a circuit breaker), as every error it
/// returns carries it: either a `&'static str`, which copies for free, or
/// a shared string, which costs a reference count per copy.
///
/// A breaker copies its name into each [`CircuitOpen`](crate::error::CircuitOpen)
/// it returns, so with a name written in the source (`Breaker::new("billing")`)
/// a refusal touches no reference count; a name built at run time (a
/// `String`, a keyed breaker's key) is shared. Either way it reads as a
/// `str`: `Name` derefs to one, and compares, hashes and prints as one.
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use tower_resilience_base::Name;
///
/// let written = Name::from("billing");
/// assert!(written.is_static());
///
/// let built = Name::from(format!("billing-{}", 2));
/// assert!(!built.is_static());
/// assert_eq!(&*built, "billing-2");
///
/// // Compared as text, whatever the kind.
/// assert_eq!(Name::from("billing"), Name::from(Arc::<str>::from("billing")));
/// ```
#[derive(Clone)]
pub struct Name(Repr);

#[derive(Clone)]
enum Repr {
    Static(&'static str),
    Shared(Arc<str>),
}

// === impl Name ===

impl Name {
    /// A name written in the source: copies are free.
    #[must_use]
    pub const fn from_static(name: &'static str) -> Self {
        Self(Repr::Static(name))
    }

    /// The name as text.
    #[must_use]
    #[inline]
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Static(name) => name,
            Repr::Shared(name) => name,
        }
    }

    /// Whether the name is a `&'static str` (copies cost nothing) rather
    /// than a shared string (each copy is a reference count).
    #[must_use]
    pub fn is_static(&self) -> bool {
        matches!(self.0, Repr::Static(_))
    }

    /// A copy that does not share a reference count with this one: the
    /// same name for a static one, a new allocation for a shared one (for
    /// copies kept apart so that threads do not contend on one count).
    #[must_use]
    pub fn unshared(&self) -> Self {
        match &self.0 {
            Repr::Static(name) => Self(Repr::Static(name)),
            Repr::Shared(name) => Self(Repr::Shared(Arc::from(&**name))),
        }
    }
}

impl Deref for Name {
    type Target = str;

    #[inline]
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Name {}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Name {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl From<&'static str> for Name {
    fn from(name: &'static str) -> Self {
        Self::from_static(name)
    }
}

impl From<String> for Name {
    fn from(name: String) -> Self {
        Self(Repr::Shared(name.into()))
    }
}

impl From<Box<str>> for Name {
    fn from(name: Box<str>) -> Self {
        Self(Repr::Shared(name.into()))
    }
}

impl From<Arc<str>> for Name {
    fn from(name: Arc<str>) -> Self {
        Self(Repr::Shared(name))
    }
}

impl From<&Arc<str>> for Name {
    fn from(name: &Arc<str>) -> Self {
        Self(Repr::Shared(Arc::clone(name)))
    }
}

impl From<Cow<'static, str>> for Name {
    fn from(name: Cow<'static, str>) -> Self {
        match name {
            Cow::Borrowed(name) => Self::from_static(name),
            Cow::Owned(name) => name.into(),
        }
    }
}

impl From<&Name> for Name {
    fn from(name: &Name) -> Self {
        name.clone()
    }
}

impl From<Name> for Arc<str> {
    /// The name as a shared string (an allocation for a static one).
    fn from(name: Name) -> Self {
        match name.0 {
            Repr::Static(name) => Arc::from(name),
            Repr::Shared(name) => name,
        }
    }
}

impl From<&Name> for Arc<str> {
    fn from(name: &Name) -> Self {
        name.clone().into()
    }
}

impl From<Name> for String {
    fn from(name: Name) -> Self {
        name.as_str().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_name_written_in_the_source_is_static_and_a_built_one_shared() {
        assert!(Name::from("a").is_static());
        assert!(Name::from(Cow::Borrowed("a")).is_static());
        assert!(!Name::from(String::from("a")).is_static());
        assert!(!Name::from(Cow::<'static, str>::Owned("a".into())).is_static());
        assert!(!Name::from(Arc::<str>::from("a")).is_static());
        assert!(!Name::from(Box::<str>::from("a")).is_static());
    }

    #[test]
    fn names_compare_hash_and_print_as_their_text() {
        let kinds = [
            Name::from("users"),
            Name::from(String::from("users")),
            Name::from(Arc::<str>::from("users")),
        ];
        for a in &kinds {
            for b in &kinds {
                assert_eq!(a, b);
                assert_eq!(a.cmp(b), Ordering::Equal);
            }
            assert_eq!(a, "users");
            assert_eq!(a.to_string(), "users");
            assert_eq!(format!("{a:?}"), "\"users\"");
        }
        let set: HashSet<Name> = kinds.iter().cloned().collect();
        assert_eq!(set.len(), 1);
        assert!(set.contains("users"));
        assert_eq!(
            Name::from("a").cmp(&Name::from(String::from("b"))),
            Ordering::Less
        );
    }

    #[test]
    fn a_shared_name_is_copied_by_count_and_unshared_into_its_own() {
        let arc: Arc<str> = Arc::from("orders");
        let name = Name::from(&arc);
        assert_eq!(Arc::strong_count(&arc), 2);
        let copy = name.clone();
        assert_eq!(Arc::strong_count(&arc), 3);
        let apart = name.unshared();
        assert_eq!(Arc::strong_count(&arc), 3, "unshared copies take no count");
        assert_eq!(apart, copy);
        drop((name, copy));
        assert_eq!(Arc::strong_count(&arc), 1);
        // Back to a shared string: the same allocation for a shared name.
        let back: Arc<str> = Name::from(Arc::clone(&arc)).into();
        assert!(Arc::ptr_eq(&back, &arc));
        let text: String = Name::from("static").into();
        assert_eq!(text, "static");
    }
}
