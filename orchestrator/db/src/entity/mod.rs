//! sea-orm entities, one per table. Private to this crate: other crates see
//! the records in `crate::model` instead.

pub mod audit_log;
pub mod node_components;
pub mod nodes;
pub mod policy_in_force;
pub mod policy_sync_state;
pub mod policy_versions;
pub mod qualification_results;
pub mod releases;
pub mod rollouts;
#[allow(dead_code)] // the rollout engine's tables; read and written from issue 5 on
pub mod update_steps;
pub mod users;
#[allow(dead_code)] // the rollout engine's tables; read and written from issue 5 on
pub mod wave_approvals;
#[allow(dead_code)] // the rollout engine's tables; read and written from issue 5 on
pub mod waves;
