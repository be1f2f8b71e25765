//! The rollout engine's durable state: stored plans (waves and per-node
//! steps), step and wave transitions, approvals, user commands (pause,
//! resume, abort, rollback) and the executor lease.
//!
//! Invariant: every write of execution state made by the engine passes a
//! [`Fence`]; the write and a check that the fence's token is still the
//! lease's happen in one transaction, and the check locks the lease row
//! (an `UPDATE` of it), so a controller that lost its lease can never write
//! again, even if it does not know yet. Step transitions are conditional on
//! the state the engine read (`WHERE state = from`), so two writers can
//! never both move one step.
//!
//! One submodule per concern: `lease` (the fence), `plan` (storing a plan
//! with its rollout), `rollout`, `wave` and `step` (records, reads and
//! transitions of each; `step_batch`: step transitions committed in groups; `step_counts`: kept step counts for the pages
//! and the API), `approval` (the two-person rule) and `rollback`.

mod approval;
mod lease;
mod plan;
mod rollback;
mod rollout;
mod step;
mod step_batch;
mod step_counts;
mod wave;

use std::str::FromStr;

pub use approval::{Approval, approvals_needed, counted_approvals};
pub use lease::Fence;
pub(crate) use lease::check_fence;
pub use orchestrator_types::{Blocker, RolloutState, StepPurpose, StepState, WaveKind, WaveState};
pub use plan::{NewPlan, NewStep, NewWave};
pub use rollback::NodeVersion;
pub use rollout::ExecRollout;
use sea_orm::{ActiveValue, Set};
use serde::Serialize;
pub use step::{
    ExecStep, MAX_STEP_PAGE_ROWS, NamedStep, PlacedStep, StepChange, StepCounts, StepFilter, StepOutline,
    StepPageQuery, StepRevision, StepTarget, WatchedStep,
};
pub use step_counts::total_counts;
pub use wave::{ExecWave, WaveChange};

use crate::DbError;

/// The actor recorded for engine decisions.
pub const ENGINE_ACTOR: &str = "engine";

fn parse<T: FromStr<Err = String>>(what: &'static str, raw: &str) -> Result<T, DbError> {
    raw.parse().map_err(|e: String| DbError::corrupt(what, e))
}

fn from_json<T: serde::de::DeserializeOwned + Default>(
    what: &'static str,
    value: Option<serde_json::Value>,
) -> Result<T, DbError> {
    match value {
        None | Some(serde_json::Value::Null) => Ok(T::default()),
        Some(v) => serde_json::from_value(v).map_err(|e| DbError::corrupt(what, e)),
    }
}

fn to_json<T: Serialize>(value: &T) -> serde_json::Value {
    // Our own plain records always serialize.
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

fn set_opt<T: Clone + Into<sea_orm::Value>>(field: &mut ActiveValue<Option<T>>, value: &Option<Option<T>>)
where
    Option<T>: Into<sea_orm::Value>,
{
    if let Some(v) = value {
        *field = Set(v.clone());
    }
}
