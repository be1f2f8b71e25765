use orchestrator_db::DbError;

/// What the engine's entry points can fail with.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("datastore call failed")]
    Db(#[from] DbError),
    /// The policy did not validate. The findings are part of the message
    /// rather than a `#[source]` because callers that show only this
    /// error's text (`simulate`, the API's `invalid` body) must show them.
    #[error("the policy is not valid: {0}")]
    Policy(orchestrator_policy::PolicyError),
    #[error("the rollout cannot be planned")]
    Plan(#[source] orchestrator_planner::PlanError),
    #[error("the plan flashes no node: of {nodes} nodes none qualifies ({excluded})")]
    EmptyPlan { nodes: usize, excluded: String },
    #[error("this controller no longer holds the executor lease")]
    LostLease,
    /// A Prometheus gate has no series for some of the first wave's nodes.
    #[error("{}", missing_series_message(missing))]
    MissingSeries { missing: Vec<MissingSeries> },
    /// Some first-wave BMC offers no update path for what the policy requires: (node, why).
    #[error("{}", no_update_path_message(refused))]
    NoUpdatePath { refused: Vec<(String, String)> },
    /// Prometheus could not be asked whether the gates' series exist.
    #[error("cannot check the Prometheus gates' series before the first flash")]
    SeriesCheck(#[source] crate::metric_source::SourceError),
}

/// One gate's missing series at a rollout's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingSeries {
    /// The gate.
    pub gate: String,
    /// Nodes in the first wave.
    pub of: usize,
    /// First-wave nodes without series.
    pub nodes: Vec<String>,
}

/// Names at most this many nodes per gate; the count says the rest.
const NAMED_NODES: usize = 5;

fn no_update_path_message(refused: &[(String, String)]) -> String {
    let named: Vec<String> = refused
        .iter()
        .take(NAMED_NODES)
        .map(|(node, why)| format!("{node}: {why}"))
        .collect();
    let more = refused.len().saturating_sub(NAMED_NODES);
    let more = if more > 0 {
        format!("; and {more} more")
    } else {
        String::new()
    };
    format!(
        "{} first-wave BMC(s) cannot carry out this update (check the policy's `update:` section): {}{more}",
        refused.len(),
        named.join("; ")
    )
}

fn missing_series_message(missing: &[MissingSeries]) -> String {
    let gates: Vec<String> = missing
        .iter()
        .map(|m| {
            let named = m.nodes.iter().take(NAMED_NODES).cloned().collect::<Vec<_>>().join(", ");
            let more = m.nodes.len().saturating_sub(NAMED_NODES);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!(
                "gate {:?} has no series for {} of the first wave's {} nodes ({named}{more})",
                m.gate,
                m.nodes.len(),
                m.of
            )
        })
        .collect();
    format!(
        "{}; check that the exporter field is enabled and the node label matches (`policy lint` lists the \
         fields a policy needs), or start with allow_missing_series",
        gates.join("; ")
    )
}

impl EngineError {
    /// True when the caller's input was at fault rather than the system.
    pub fn is_caller_error(&self) -> bool {
        match self {
            EngineError::Db(err) => err.is_caller_error(),
            EngineError::Policy(_)
            | EngineError::Plan(_)
            | EngineError::EmptyPlan { .. }
            | EngineError::MissingSeries { .. }
            | EngineError::NoUpdatePath { .. } => true,
            EngineError::LostLease | EngineError::SeriesCheck(_) => false,
        }
    }
}
