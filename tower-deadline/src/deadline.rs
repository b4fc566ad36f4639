//! Shorthands for the deadline of the request being served.

use std::time::Duration;

use crate::Deadline;

/// The deadline of the request being served by the current task, if any.
///
/// Shorthand for [`Deadline::current`].
///
/// # Example
///
/// ```
/// assert!(tower_deadline::current().is_none());
/// ```
#[must_use]
pub fn current() -> Option<Deadline> {
    Deadline::current()
}

/// The budget left for the request being served by the current task, or
/// `None` when it has no deadline.
///
/// A handler can use it to skip optional work, pick a cheaper algorithm or
/// pass a budget to a client that does not go through
/// [`ClientDeadline`](crate::ClientDeadline).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_deadline::Deadline;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// Deadline::after(Duration::from_millis(50))
///     .scope(async {
///         assert_eq!(tower_deadline::remaining(), Some(Duration::from_millis(50)));
///     })
///     .await;
/// # }
/// ```
#[must_use]
pub fn remaining() -> Option<Duration> {
    Deadline::current().map(Deadline::remaining)
}
