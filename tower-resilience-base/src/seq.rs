//! Settings that change while the layers reading them run: a few words
//! behind a sequence lock.
//!
//! A reader that needs several settings to agree reads them all with
//! [`SeqWords::get`]: the sequence, the words, the sequence again, and
//! again if a change was written meanwhile. So it never sees half of an
//! old configuration and half of a new one. A reader that needs one
//! setting reads it alone with [`SeqWords::word`], one relaxed load (a
//! plain load on x86 and ARM). Writers take turns behind a mutex; changes
//! are rare (a settings reload), reads are on the hot path.
//!
//! These are `std` atomics: the loom models of the layers explore their
//! state machines' races, not their settings.
//!
//! ```
//! use tower_resilience_base::seq::SeqWords;
//!
//! let live = SeqWords::new([1, 2]);
//! live.set([3, 4]);
//! assert_eq!(live.get(), [3, 4]);
//! assert_eq!(live.word(1), 4);
//! ```

use std::fmt;
use std::sync::atomic::{fence, AtomicU64, Ordering::*};
use std::sync::{Mutex, PoisonError};

/// `N` words read together, written together; see the [module docs](self).
pub struct SeqWords<const N: usize> {
    /// Even when no change is being written; odd while one is.
    seq: AtomicU64,
    words: [AtomicU64; N],
    writer: Mutex<()>,
}

impl<const N: usize> SeqWords<N> {
    /// The words `values`.
    #[must_use]
    pub fn new(values: [u64; N]) -> Self {
        Self {
            seq: AtomicU64::new(0),
            words: values.map(AtomicU64::new),
            writer: Mutex::new(()),
        }
    }

    /// Word `i` alone (it may be newer than the other words a reader read
    /// before it).
    ///
    /// # Panics
    ///
    /// If `i` is not below `N`.
    #[inline]
    #[must_use]
    pub fn word(&self, i: usize) -> u64 {
        self.words[i].load(Relaxed)
    }

    /// Every word, all from the same [`set`](Self::set).
    #[must_use]
    pub fn get(&self) -> [u64; N] {
        loop {
            let before = self.seq.load(Acquire);
            if before & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let words = self.words.each_ref().map(|w| w.load(Relaxed));
            fence(Acquire);
            if self.seq.load(Relaxed) == before {
                return words;
            }
        }
    }

    /// Replaces every word; readers of [`get`](Self::get) see the old
    /// words or the new ones, never a mix.
    pub fn set(&self, values: [u64; N]) {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = self.seq.load(Relaxed);
        self.seq.store(seq.wrapping_add(1), Relaxed);
        fence(Release);
        for (word, value) in self.words.iter().zip(values) {
            word.store(value, Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Release);
    }
}

impl<const N: usize> fmt::Debug for SeqWords<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SeqWords").field(&self.get()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn readers_never_see_a_mix_of_two_writes() {
        let live = Arc::new(SeqWords::new([1; 8]));
        let writer = {
            let live = Arc::clone(&live);
            std::thread::spawn(move || {
                for i in 0..20_000u64 {
                    live.set([1 + i % 2; 8]);
                }
            })
        };
        let mut seen = [0u64; 2];
        while !writer.is_finished() {
            let words = live.get();
            assert!(words == [1; 8] || words == [2; 8], "a torn read: {words:?}");
            seen[(words[0] - 1) as usize] += 1;
        }
        writer.join().unwrap();
        assert!(seen[0] + seen[1] > 0, "the reader ran");
    }
}
