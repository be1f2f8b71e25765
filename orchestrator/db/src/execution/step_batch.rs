//! Group commit of step transitions: the engine moves hundreds of steps a
//! pass, each from its own task, and each move used to be a transaction of
//! its own (begin, fence check, update, re-read, audit insert, commit). Here
//! the transitions that arrive while one transaction commits queue up and
//! the next caller commits all of them in one transaction: one fence check,
//! one `UPDATE ... RETURNING` per step (the re-read folded in), one
//! multi-row audit insert and one commit for the lot.
//!
//! Invariant: a caller of [`Db::transition_step`] still returns only after
//! its own write is committed (or known not to be), so the engine's
//! "intent before effect" holds per step exactly as with one transaction
//! per step; batching changes how many steps share a commit, never the
//! order of a step's write and its side effect. Every write still passes
//! its fence in the transaction that makes it, and each step's `WHERE
//! state = from` is checked per step, so a stale step fails alone while the
//! rest of the batch commits.

use orchestrator_types::{NodeId, StepId};
use sea_orm::{
    ColumnTrait, ConnectionTrait, EntityTrait, FromQueryResult, QueryFilter, QueryTrait, Set, TransactionTrait,
};
use tokio::sync::oneshot;

use super::lease::{Fence, check_fence};
use super::step::{StepChange, step_update, to_exec_step};
use super::{ENGINE_ACTOR, ExecStep, StepState};
use crate::entity::{audit_log, update_steps};
use crate::model::DiscoveredComponent;
use crate::{Db, DbError};

/// The row counts audit inserts come in, largest first. The driver keeps
/// each distinct statement prepared per connection (a small LRU cache);
/// inserts of every count from 1 to 512 would each be a new statement and
/// push the steady ones out, so a batch's entries go in chunks of these
/// few sizes (at most 2 + 3 + 3 + 3 inserts for any count below 1,024).
/// The largest binds 1,536 parameters, far below SQLite's limit.
const AUDIT_CHUNKS: [usize; 5] = [256, 64, 16, 4, 1];

/// One transition of [`Db::transition_step`] (or the chain of [`Db::transition_step_chain`]), queued.
struct Queued {
    fence: Fence,
    step: StepId,
    from: StepState,
    /// Applied in order, each from the state the one before it left.
    changes: Vec<(StepChange, serde_json::Value)>,
    /// The inventory read that decided the changes: recorded as the step's node's inventory in the
    /// same transaction when they apply.
    inventory: Option<Vec<DiscoveredComponent>>,
    done: oneshot::Sender<Result<ExecStep, DbError>>,
}

impl DbError {
    /// The same failure for another caller of a batch that failed as a
    /// whole (the fence was lost, the database went away): fencing and
    /// controller faults keep their kind, so every caller reacts as it
    /// would to its own transaction failing.
    fn for_batch_member(&self) -> DbError {
        match self {
            DbError::Fenced { lease, token } => DbError::Fenced {
                lease: lease.clone(),
                token: *token,
            },
            DbError::Query(err) => DbError::Query(err.clone()),
            DbError::Connect { url, source } => DbError::Connect {
                url: url.clone(),
                source: source.clone(),
            },
            other => DbError::Query(sea_orm::DbErr::Custom(other.to_string())),
        }
    }
}

impl Db {
    /// Moves a step that is still in `from`, with its audit entry when the
    /// state changes (or a retry is scheduled), under the fence. `Stale`
    /// when the step moved already. Returns once the write is committed,
    /// possibly in one transaction with other steps' (see the module docs).
    pub async fn transition_step(
        &self,
        fence: &Fence,
        step: StepId,
        from: StepState,
        change: &StepChange,
        details: serde_json::Value,
    ) -> Result<ExecStep, DbError> {
        self.transition_step_chain(fence, step, from, vec![(change.clone(), details)])
            .await
    }

    /// Moves a step that is still in `from` through `changes` in one transaction, each with its
    /// own audit entry as [`Db::transition_step`] writes it: for moves that follow one another with
    /// no side effect between them (a verification decided by the read that ended the
    /// activation), so they cost one commit, and a crash leaves the step before the first or
    /// after the last. Returns the row as the last change left it; `Stale` when the step had
    /// moved from `from` already (nothing is written then).
    pub async fn transition_step_chain(
        &self,
        fence: &Fence,
        step: StepId,
        from: StepState,
        changes: Vec<(StepChange, serde_json::Value)>,
    ) -> Result<ExecStep, DbError> {
        self.queue_transition(fence, step, from, changes, None).await
    }

    /// [`Db::transition_step_chain`] for moves decided by a read of the node's FirmwareInventory (a
    /// flash verified): the reading is recorded as the node's inventory, as discovery records it, in
    /// the same transaction when the moves apply. The read-back costs no transaction of its own, and
    /// the pages and the next rollout's plan see the new version as soon as the step succeeded.
    pub async fn transition_step_chain_with_inventory(
        &self,
        fence: &Fence,
        step: StepId,
        from: StepState,
        changes: Vec<(StepChange, serde_json::Value)>,
        inventory: Vec<DiscoveredComponent>,
    ) -> Result<ExecStep, DbError> {
        self.queue_transition(fence, step, from, changes, Some(inventory)).await
    }

    async fn queue_transition(
        &self,
        fence: &Fence,
        step: StepId,
        from: StepState,
        changes: Vec<(StepChange, serde_json::Value)>,
        inventory: Option<Vec<DiscoveredComponent>>,
    ) -> Result<ExecStep, DbError> {
        let (done, mut outcome) = oneshot::channel();
        self.step_writes.push(Box::new(Queued {
            fence: fence.clone(),
            step,
            from,
            changes,
            inventory,
            done,
        }));
        let _committer = self.step_writes.committer().await;
        // Queued before the lock was taken: either a caller that held it
        // since has committed this transition (the answer is here), or it
        // is still in the queue and this caller commits it now.
        if let Ok(result) = outcome.try_recv() {
            return result;
        }
        // Only this module queues on `step_writes`, so every write is one
        // of ours (anything else would be dropped, failing its caller).
        let batch = self
            .step_writes
            .take()
            .into_iter()
            .filter_map(|write| write.downcast::<Queued>().ok().map(|queued| *queued))
            .collect();
        self.commit_transitions(batch).await;
        outcome.try_recv().unwrap_or_else(|_| {
            // Only a committer cancelled mid-batch drops an answer; its
            // transaction rolled back with it, so nothing was written.
            Err(DbError::Query(sea_orm::DbErr::Custom(format!(
                "the transition of step {step} was abandoned before it committed"
            ))))
        })
    }

    /// Commits `batch`, one transaction per fence (in practice there is one
    /// fence, the executor's), and answers every caller.
    async fn commit_transitions(&self, batch: Vec<Queued>) {
        let mut groups: Vec<(Fence, Vec<Queued>)> = Vec::new();
        for queued in batch {
            match groups.iter_mut().find(|(fence, _)| *fence == queued.fence) {
                Some((_, members)) => members.push(queued),
                None => groups.push((queued.fence.clone(), vec![queued])),
            }
        }
        for (fence, members) in groups {
            match self.commit_group(&fence, &members).await {
                Ok(results) => {
                    self.steps_changed();
                    for (member, result) in members.into_iter().zip(results) {
                        // A caller that stopped waiting needs no answer.
                        let _ = member.done.send(result);
                    }
                }
                Err(err) => {
                    for member in members {
                        let _ = member.done.send(Err(err.for_batch_member()));
                    }
                }
            }
        }
    }

    /// One transaction: the fence, each step's conditional update with its
    /// row returned, the audit entries, the commit. `Err` only when the
    /// transaction as a whole failed; a step no longer in its `from` state
    /// is a `Stale` result of its own.
    async fn commit_group(&self, fence: &Fence, members: &[Queued]) -> Result<Vec<Result<ExecStep, DbError>>, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        check_fence(&txn, fence).await?;
        let backend = txn.get_database_backend();
        let mut results = Vec::with_capacity(members.len());
        let mut audit = Vec::new();
        for member in members {
            let mut from = member.from;
            let mut last = None;
            for (change, details) in &member.changes {
                let mut update = update_steps::Entity::update_many()
                    .set(step_update(from, change, now))
                    .filter(update_steps::Column::Id.eq(member.step.0))
                    .filter(update_steps::Column::State.eq(from.as_str()))
                    .into_query();
                // The updated row comes back with the update: no second read.
                update.returning_all();
                let row = update_steps::Model::find_by_statement(backend.build(&update))
                    .one(&txn)
                    .await?;
                // Only the first change of a chain can miss: the later ones start from the state
                // this transaction has just written, on a row it now holds.
                let Some(row) = row else {
                    break;
                };
                let moved = change.state.filter(|to| *to != from);
                // A retry is a decision too (and the evidence of a flaky BMC).
                let retried = matches!(change.next_attempt_at, Some(Some(_)));
                let to = moved.unwrap_or(from);
                if moved.is_some() || retried {
                    let mut details = details.clone();
                    if let Some(obj) = details.as_object_mut() {
                        obj.insert("from".into(), from.as_str().into());
                        obj.insert("to".into(), to.as_str().into());
                        obj.insert("node_id".into(), row.node_id.into());
                        obj.insert("rollout_id".into(), row.rollout_id.into());
                        obj.insert("purpose".into(), row.purpose.clone().into());
                    }
                    audit.push(audit_log::ActiveModel {
                        at: Set(now),
                        actor: Set(ENGINE_ACTOR.to_owned()),
                        action: Set(if moved.is_some() {
                            "step.transition"
                        } else {
                            "step.retry"
                        }
                        .to_owned()),
                        subject_type: Set("step".to_owned()),
                        subject_id: Set(member.step.to_string()),
                        details: Set(details),
                        ..Default::default()
                    });
                }
                from = to;
                last = Some(row);
            }
            match last {
                Some(row) => results.push(to_exec_step(row)),
                None => results.push(Err(DbError::Stale {
                    what: "step",
                    key: member.step.to_string(),
                    expected: member.from.to_string(),
                })),
            }
        }
        let read_backs: Vec<(NodeId, &[DiscoveredComponent])> = members
            .iter()
            .zip(&results)
            .filter_map(|(member, result)| match (result, &member.inventory) {
                (Ok(step), Some(inventory)) => Some((step.node_id, inventory.as_slice())),
                _ => None,
            })
            .collect();
        crate::inventory_write::write_inventories(&txn, now, &read_backs).await?;
        // Entries in the order of the changes they describe, as when each
        // change had its own transaction.
        let mut left = audit.len();
        let mut entries = audit.into_iter();
        for size in AUDIT_CHUNKS {
            while left >= size {
                let chunk: Vec<_> = entries.by_ref().take(size).collect();
                audit_log::Entity::insert_many(chunk)
                    .exec_without_returning(&txn)
                    .await?;
                left -= size;
            }
        }
        txn.commit().await?;
        if !read_backs.is_empty() {
            self.nodes_changed();
        }
        Ok(results)
    }
}
