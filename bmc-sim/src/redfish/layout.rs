//! Where resources live: ids and URIs from the platform's `RedfishLayout`, shared by every resource.

use std::collections::HashMap;

use super::response::RfError;
use crate::platform::RedfishLayout;
use crate::rng::{self, Purpose};
use crate::state::FleetState;

pub(super) fn layout(s: &FleetState) -> &RedfishLayout {
    &s.scenario.redfish_layout
}

/// 404 unless `sys` is one of the layout's systems.
pub(super) fn known_system(s: &FleetState, sys: &str) -> Result<(), RfError> {
    if layout(s).systems().contains(&sys) {
        Ok(())
    } else {
        Err(RfError::not_found("ComputerSystem"))
    }
}

pub(super) fn system_uri(sys: &str) -> String {
    format!("/redfish/v1/Systems/{sys}")
}

pub(super) fn gpu_uri(s: &FleetState, g: usize) -> String {
    let l = layout(s);
    format!(
        "/redfish/v1/Systems/{}/Processors/{}",
        l.gpu_system,
        l.name(&l.gpu_id, g)
    )
}

/// The chassis holding GPU `g`'s sensors.
pub(super) fn sensor_chassis(s: &FleetState, g: usize) -> String {
    let l = layout(s);
    match &l.gpu_chassis {
        Some(t) => l.name(t, g),
        None => l.main_system().to_owned(),
    }
}

/// The URI of the host system's Reset action (what `Base.ResetRequired` names).
pub(crate) fn system_reset_uri(s: &FleetState) -> String {
    format!("{}/Actions/ComputerSystem.Reset", system_uri(layout(s).main_system()))
}

/// The GPU `id` names on the GPU system.
pub(super) fn gpu_index(s: &FleetState, sys: &str, id: &str) -> Result<usize, RfError> {
    let l = layout(s);
    if sys != l.gpu_system {
        return Err(RfError::not_found("Processor"));
    }
    l.gpu_of(&l.gpu_id, id, s.gpus)
        .ok_or_else(|| RfError::not_found("Processor"))
}

/// Whether the request asks for members inline (`$expand=.` or `$expand=*`, one level) and the
/// layout advertises `ExpandQuery`.
pub(super) fn wants_expand(s: &FleetState, query: &HashMap<String, String>) -> bool {
    layout(s).expand_query
        && query
            .get("$expand")
            .is_some_and(|e| e.starts_with('.') || e.starts_with('*'))
}

/// A stable RFC 4122-shaped UUID for (node, purpose).
pub(super) fn uuid_for(seed: u64, node: usize, which: u64) -> String {
    let a = rng::key(seed, node as u64, Purpose::Reset, which, u64::MAX);
    let b = rng::key(seed, node as u64, Purpose::Reset, which, u64::MAX - 1);
    let hex = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}
