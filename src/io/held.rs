//! A bounded set of opened files kept for reuse: past its limit, the one kept longest is let
//! go.
//!
//! A process maps at most `vm.max_map_count` regions (65,530 by default). A reader that kept
//! every shard or pack it opened mapped could not read past that many: the map failed, and
//! the next allocation could abort the process. What is let go stays mapped while something
//! still holds it (a sample, a tensor over its bytes) and is unmapped when that goes.
//!
//! The lock is held for a lookup or an insert, and tried for an instant, never waited on
//! without end ([`lock_for_an_instant`]): a process forked while another thread held it opens
//! files without keeping them rather than hang.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Mutex;

use crate::per_process::lock_for_an_instant;

/// At most `limit` values by key, the oldest let go first.
#[derive(Debug)]
pub(crate) struct Held<K, V> {
    kept: Mutex<Kept<K, V>>,
    limit: usize,
}

#[derive(Debug)]
pub(crate) struct Kept<K, V> {
    by_key: HashMap<K, V>,
    /// The keys of `by_key`, oldest first.
    order: VecDeque<K>,
}

impl<K: Hash + Eq + Copy, V: Clone> Held<K, V> {
    /// Empty, keeping at most `limit` values (at least one).
    pub(crate) fn new(limit: usize) -> Self {
        Held {
            kept: Mutex::new(Kept {
                by_key: HashMap::new(),
                order: VecDeque::new(),
            }),
            limit: limit.max(1),
        }
    }

    /// The value kept for `key`.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        lock_for_an_instant(&self.kept)?.by_key.get(key).cloned()
    }

    /// The value kept for `key` if another thread kept one meanwhile, else `value`, now kept
    /// (letting the oldest go past the limit).
    pub(crate) fn keep(&self, key: K, value: V) -> V {
        let Some(mut kept) = lock_for_an_instant(&self.kept) else {
            return value;
        };
        if let Some(first) = kept.by_key.get(&key) {
            return first.clone();
        }
        kept.by_key.insert(key, value.clone());
        kept.order.push_back(key);
        while kept.order.len() > self.limit {
            let oldest = kept.order.pop_front().expect("longer than the limit");
            kept.by_key.remove(&oldest);
        }
        value
    }

    /// Lets every value go.
    pub(crate) fn clear(&self) {
        if let Some(mut kept) = lock_for_an_instant(&self.kept) {
            kept.by_key.clear();
            kept.order.clear();
        }
    }

    /// The lock, held as a thread of a parent holds it when the process is forked.
    #[cfg(test)]
    pub(crate) fn hold(&self) -> std::sync::MutexGuard<'_, Kept<K, V>> {
        self.kept.lock().unwrap()
    }

    /// How many values are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock_for_an_instant(&self.kept).map_or(0, |k| k.by_key.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn past_the_limit_the_oldest_is_let_go_and_what_is_still_held_lives() {
        let held = Held::new(3);
        let first = held.keep(0, Arc::new(0));
        for k in 1..10 {
            held.keep(k, Arc::new(k));
        }
        assert_eq!(held.len(), 3);
        assert_eq!(held.get(&0), None);
        assert_eq!(held.get(&9).as_deref(), Some(&9));
        assert_eq!(held.get(&6), None);
        // Let go by the set, still held by its caller.
        assert_eq!(*first, 0);
        assert_eq!(Arc::strong_count(&first), 1);
    }

    #[test]
    fn the_first_kept_for_a_key_stays() {
        let held = Held::new(2);
        let a = held.keep(1, Arc::new("a"));
        let b = held.keep(1, Arc::new("b"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(held.len(), 1);
        held.clear();
        assert_eq!(held.len(), 0);
    }
}
