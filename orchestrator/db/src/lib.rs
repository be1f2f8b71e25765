//! The datastore: the only crate that knows sea-orm.
//!
//! Everything else talks to the database through [`Db`] and the plain
//! records in [`model`]. Every mutation writes its audit entry in the same
//! transaction, so the audit log can never miss a change that happened.

pub mod alerts;
mod audit;
pub mod auth;
mod cache;
mod connect;
pub mod drains;
mod entity;
mod error;
pub mod execution;
pub mod fleet_file;
mod group_commit;
pub mod health;
mod inventory_write;
pub mod model;
mod nodes;
pub mod overview;
pub mod parts;
pub mod policies;
mod releases;
pub mod retention;
pub mod rma;
pub mod rma_evidence;
pub mod rma_views;
pub mod rollout_evidence;
pub mod rollouts;
#[cfg(feature = "testing")]
pub mod testing;
pub mod throttle;
mod users;

pub use audit::{AcceleratedClockMark, AuditFilter};
pub use connect::{Backend, ConnectTuning, DEFAULT_PG_IDLE_IN_TRANSACTION, Db};
pub use error::DbError;
