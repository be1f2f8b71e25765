use orchestrator_db::DbError;

/// What the engine's entry points can fail with.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("datastore call failed")]
    Db(#[from] DbError),
    #[error("the policy is not valid: {0}")]
    Policy(String),
    #[error("the rollout cannot be planned")]
    Plan(#[source] orchestrator_planner::PlanError),
    #[error("the plan flashes no node: of {nodes} nodes none qualifies ({excluded})")]
    EmptyPlan { nodes: usize, excluded: String },
    #[error("this controller no longer holds the executor lease")]
    LostLease,
}

impl EngineError {
    /// True when the caller's input was at fault rather than the system.
    pub fn is_caller_error(&self) -> bool {
        match self {
            EngineError::Db(err) => err.is_caller_error(),
            EngineError::Policy(_) | EngineError::Plan(_) | EngineError::EmptyPlan { .. } => true,
            EngineError::LostLease => false,
        }
    }
}
