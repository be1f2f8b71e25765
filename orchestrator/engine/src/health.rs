use async_trait::async_trait;
use orchestrator_db::execution::{ExecRollout, ExecWave};
use orchestrator_policy::Policy;
use orchestrator_types::{Outcome, WaveVerdict};

/// What the engine asks at the end of a wave's bake. The detector
/// (issue 6) implements it; the engine only acts on the outcome.
#[async_trait]
pub trait HealthJudge: Send + Sync + std::fmt::Debug {
    /// Judges a baked wave against its control cohort.
    async fn judge(&self, rollout: &ExecRollout, wave: &ExecWave, policy: &Policy) -> WaveVerdict;

    /// Asked on every pass while a wave bakes: a verdict reached before the
    /// bake's end (only a Fail is acted on: a regression must not wait for
    /// the bake to finish). `None` while nothing is decided.
    async fn check(&self, _rollout: &ExecRollout, _wave: &ExecWave, _policy: &Policy) -> Option<WaveVerdict> {
        None
    }

    /// Asked on every pass while the first wave waits for its pre-flash watch
    /// (`detection.pre_period`): watch its nodes and the controls before anything is flashed,
    /// so level gates can compare each node with itself.
    async fn watch_before_flash(&self, _rollout: &ExecRollout, _wave: &ExecWave, _policy: &Policy) {}
}

/// The judge until detection lands: a wave with health gates is
/// Inconclusive (a human must look), a wave without gates passes.
#[derive(Debug, Default, Clone, Copy)]
pub struct GatelessJudge;

#[async_trait]
impl HealthJudge for GatelessJudge {
    async fn judge(&self, _rollout: &ExecRollout, wave: &ExecWave, _policy: &Policy) -> WaveVerdict {
        if wave.gates.is_empty() {
            WaveVerdict {
                outcome: Outcome::Pass,
                summary: "the wave has no health gates".into(),
                evidence: serde_json::json!({ "gates": [] }),
            }
        } else {
            WaveVerdict {
                outcome: Outcome::Inconclusive,
                summary: format!(
                    "no detector is configured for gates {}: a human must approve",
                    wave.gates.join(", ")
                ),
                evidence: serde_json::json!({ "gates": wave.gates }),
            }
        }
    }
}
