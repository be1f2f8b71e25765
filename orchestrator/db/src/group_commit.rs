//! The queue behind a group commit (see `execution::step_batch`, its one
//! user): writes queue up while one caller commits, and the next caller to
//! take the committer's lock commits everything queued. It lives below
//! `connect` (which holds one per database handle) and knows nothing of
//! what is queued, so the handle does not depend on the execution records.

use std::any::Any;
use std::sync::{Mutex, PoisonError};

/// One queued write, of whatever type its group commit defines.
pub(crate) type Queued = Box<dyn Any + Send>;

/// Writes waiting for a commit, and the right to commit them.
#[derive(Default)]
pub(crate) struct GroupCommit {
    queue: Mutex<Vec<Queued>>,
    /// Held by the caller committing a batch; the others wait for it and
    /// then find their result, or commit the next batch themselves.
    committer: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let queued = self.queue.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("GroupCommit").field("queued", &queued).finish()
    }
}

impl GroupCommit {
    /// Adds a write to the next batch.
    pub fn push(&self, write: Queued) {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).push(write);
    }

    /// Waits for the right to commit (held until the guard drops).
    pub async fn committer(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.committer.lock().await
    }

    /// Everything queued so far.
    pub fn take(&self) -> Vec<Queued> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner))
    }
}
