//! One stored copy of what many BMCs report alike. A fleet is a few platforms: its 100,000 BMCs
//! describe the same service links, systems, GPU processors and sensor collections, and a driver
//! that keeps its own copy of each (about 2 KB a BMC) makes the controller's memory grow with every
//! node it has ever touched.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// Distinct values kept at most. A fleet has a handful; a service that reports something new on
/// every read (hostile, or with a counter in a link) must not grow the set without end, so past
/// this its values are simply not shared.
const MAX_DISTINCT: usize = 4_096;

/// Values no longer held by any driver are dropped when the set has grown to this many, and
/// then whenever it has doubled since: the sweep's cost is spread over the insertions.
const FIRST_SWEEP: usize = 64;

/// Values handed out as shared `Arc`s: equal values get the same allocation.
#[derive(Debug)]
pub(crate) struct Interner<T> {
    state: Mutex<State<T>>,
}

#[derive(Debug)]
struct State<T> {
    values: HashSet<Arc<T>>,
    sweep_at: usize,
}

impl<T: Hash + Eq> Default for Interner<T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                values: HashSet::new(),
                sweep_at: FIRST_SWEEP,
            }),
        }
    }
}

impl<T: Hash + Eq> Interner<T> {
    /// `value`, shared with every earlier equal value still held.
    pub(crate) fn intern(&self, value: T) -> Arc<T> {
        // A poisoned lock only means another thread panicked mid-insert; the set is still valid.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(known) = state.values.get(&value) {
            return known.clone();
        }
        if state.values.len() >= state.sweep_at {
            state.values.retain(|v| Arc::strong_count(v) > 1);
            state.sweep_at = (state.values.len() * 2).max(FIRST_SWEEP);
        }
        let value = Arc::new(value);
        if state.values.len() < MAX_DISTINCT {
            state.values.insert(value.clone());
        }
        value
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).values.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_allocation() {
        let interner = Interner::default();
        let a = interner.intern("/redfish/v1/Systems/HGX_Baseboard_0".to_owned());
        let b = interner.intern("/redfish/v1/Systems/HGX_Baseboard_0".to_owned());
        let c = interner.intern("/redfish/v1/Systems/System_0".to_owned());
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(interner.len(), 2);
    }

    #[test]
    fn values_nobody_holds_are_swept_and_the_set_stays_bounded() {
        let interner = Interner::default();
        let held: Vec<Arc<u64>> = (0..10).map(|i| interner.intern(i)).collect();
        // A service reporting something new on every read: nothing of it is held for long.
        for i in 10..100_000u64 {
            drop(interner.intern(i));
        }
        assert!(
            interner.len() <= 2 * FIRST_SWEEP.max(held.len()),
            "{} kept",
            interner.len()
        );
        for (i, h) in held.iter().enumerate() {
            assert!(
                Arc::ptr_eq(h, &interner.intern(i as u64)),
                "held value {i} was forgotten"
            );
        }
    }

    #[test]
    fn past_the_bound_values_are_still_returned_but_not_kept() {
        let interner = Interner::default();
        let held: Vec<Arc<usize>> = (0..MAX_DISTINCT + 10).map(|i| interner.intern(i)).collect();
        assert_eq!(interner.len(), MAX_DISTINCT);
        assert_eq!(*held[MAX_DISTINCT + 5], MAX_DISTINCT + 5);
    }
}
