//! Aggregates a [`Db`](crate::Db) keeps between requests, shared by its
//! clones: each entry is kept with the [`Mark`] of the data it was read
//! from and served only while a fresh mark is equal. A mark is cheap to
//! read (indexed maxima that every write of the data stamps, in this
//! process or another controller's) and carries this process's own count of
//! writes, since a manual clock need not move between two of them. The
//! owners are `overview` (the fleet's version distribution, node counts,
//! failed inventory reads and failure trends) and `execution` (step counts
//! per wave of a rollout); this module sits below both and below
//! `connect`, which holds the caches.
//!
//! Reads run on the reader pool beside the one writer, so the order of a
//! miss matters: the generation first, then the stamps, then the value. A
//! write committed in between makes the value newer than its mark, which
//! only costs the next read a miss; writers count their write after
//! committing it, never before, or a reader could keep a value read
//! before the commit under a mark taken after the count moved.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use chrono::NaiveDate;
use chrono::{DateTime, Utc};
use orchestrator_types::{RolloutId, StepState, WaveId};

use crate::model::{Node, NodeCounts};

/// What a cached value was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    /// This process's count of writes when the mark was read.
    pub generation: u64,
    /// Newest write stamps of the data (`updated_at`, `last_read_at`, ...).
    pub stamps: [Option<DateTime<Utc>>; 2],
    /// Highest id of the data, where rows are added without a stamp moving.
    pub max_id: Option<i64>,
}

/// Values by key with their marks; at most `capacity` keys, then it starts
/// over.
#[derive(Debug)]
pub(crate) struct Marked<K, V> {
    generation: AtomicU64,
    entries: Mutex<HashMap<K, (Mark, V)>>,
    capacity: usize,
}

impl<K: Eq + Hash, V: Clone> Marked<K, V> {
    fn new(capacity: usize) -> Self {
        Marked {
            generation: AtomicU64::new(0),
            entries: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    /// This process's count of writes; read it before the stamps, so a
    /// write in between only makes the next read miss.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A write of the data committed: every entry is read again.
    pub fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The value kept for `key`, if it was read under `mark`.
    pub fn get(&self, key: &K, mark: &Mark) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .get(key)
            .filter(|(known, _)| known == mark)
            .map(|(_, value)| value.clone())
    }

    /// The value kept for `key` under `mark`, else `read` it and keep it.
    /// `mark` must have been read after [`Marked::generation`] and before
    /// `read` runs (see the module's note on order).
    pub async fn get_or_read<E, Fut>(&self, key: K, mark: Mark, read: impl FnOnce() -> Fut) -> Result<V, E>
    where
        Fut: std::future::Future<Output = Result<V, E>>,
    {
        if let Some(value) = self.get(&key, &mark) {
            return Ok(value);
        }
        let value = read().await?;
        self.put(key, mark, value.clone());
        Ok(value)
    }

    /// Keeps `value`, read under `mark`.
    pub fn put(&self, key: K, mark: Mark, value: V) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.clear();
        }
        entries.insert(key, (mark, value));
    }
}

/// Finished steps counted per (target version, UTC day, failed).
pub(crate) type FinishedByDay = Vec<(String, NaiveDate, bool, u64)>;

/// Rollouts whose step counts are kept (a handful are watched at a time).
const COUNTED_ROLLOUTS: usize = 32;

/// Every cache of a [`Db`](crate::Db).
#[derive(Debug)]
pub(crate) struct Caches {
    /// Nodes per (platform SKU, component kind, version).
    pub versions: Marked<(), Vec<(String, String, String, u64)>>,
    /// Node counts per state and of failed inventory reads.
    pub node_counts: Marked<(), NodeCounts>,
    /// The first nodes (by name) whose inventory read failed, per limit.
    pub discovery_errors: Marked<u64, Vec<Node>>,
    /// Step counts by state of each wave, per rollout.
    pub step_counts: Marked<RolloutId, BTreeMap<WaveId, BTreeMap<StepState, u64>>>,
    /// Finished steps per (target version, day, failed), per (since,
    /// updates only).
    pub finished_by_day: Marked<(DateTime<Utc>, bool), FinishedByDay>,
}

impl Default for Caches {
    fn default() -> Self {
        Caches {
            versions: Marked::new(1),
            node_counts: Marked::new(1),
            // The overview asks one limit; a few more for other callers.
            discovery_errors: Marked::new(4),
            step_counts: Marked::new(COUNTED_ROLLOUTS),
            // The overview's window moves once a day; two shapes per window.
            finished_by_day: Marked::new(4),
        }
    }
}
