//! Striping: a small number per thread, to spread counters that many
//! threads update over several cache lines.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// This thread's index: a number handed out once per thread, in the order
/// threads first ask, and the same for the thread's whole life. Take it
/// modulo your number of stripes; consecutive threads get consecutive
/// stripes.
///
/// # Example
///
/// ```
/// use tower_resilience_base::stripe::thread_index;
///
/// const STRIPES: usize = 8;
/// let stripe = thread_index() % STRIPES;
/// assert_eq!(thread_index() % STRIPES, stripe, "stable for the thread");
/// ```
#[must_use]
pub fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|index| {
        let i = index.get();
        if i != usize::MAX {
            return i;
        }
        let i = NEXT.fetch_add(1, Relaxed);
        index.set(i);
        i
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_get_distinct_indices_that_stay() {
        let here = thread_index();
        let others: Vec<usize> = (0..4)
            .map(|_| std::thread::spawn(thread_index).join().unwrap())
            .collect();
        assert_eq!(thread_index(), here);
        let mut all = others.clone();
        all.push(here);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 5, "{others:?} and {here}");
    }
}
