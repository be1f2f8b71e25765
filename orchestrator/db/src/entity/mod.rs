//! sea-orm entities, one per table. Private to this crate: other crates see
//! the records in `crate::model` instead.

pub mod alerts;
pub mod api_tokens;
pub mod audit_log;
pub mod credential_host_bindings;
pub mod engine_leases;
pub mod health_cursors;
pub mod health_daily;
pub mod health_looks;
pub mod health_samples;
pub mod login_throttles;
pub mod node_components;
pub mod nodes;
pub mod part_observations;
pub mod parts;
pub mod policy_in_force;
pub mod policy_sync_state;
pub mod policy_versions;
pub mod qualification_results;
pub mod releases;
pub mod rma_attachments;
pub mod rma_cases;
pub mod rma_cluster_scans;
pub mod rma_criteria;
pub mod rollout_evidence;
pub mod rollouts;
pub mod scheduler_drains;
pub mod sessions;
pub mod update_steps;
pub mod users;
pub mod wave_approvals;
pub mod waves;
