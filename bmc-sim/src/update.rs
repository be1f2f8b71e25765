//! Firmware updates and resets: the rules a real BMC follows, applied to [`crate::state`].

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use orchestrator_types::ComponentKind;

use crate::image;
use crate::rng::{self, Purpose};
use crate::scenario::DEFAULT_FLASH_TIME;
use crate::state::{FlashOutcome, FleetState, Node, NodeMut, TaskPhase, TaskRec, draw};

/// Largest image a simulated BMC accepts (real BMCs advertise MaxImageSizeBytes too).
pub const MAX_IMAGE_BYTES: usize = 64 * 1024 * 1024;

/// How long a simulated BMC waits for an `ImageURI` download.
pub(crate) const FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// An update request refused before a task exists (answered 400).
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpdateRequestError {
    #[error("target `{0}` is not a FirmwareInventory member of this BMC")]
    UnknownTarget(String),
    #[error("target `{0}` is not updateable")]
    NotUpdateable(String),
}

/// Resolves `Targets` URIs (or bare ids) to component indexes. Empty = decided by the image kind later.
pub(crate) fn resolve_targets(m: &NodeMut, targets: &[String]) -> Result<Vec<usize>, UpdateRequestError> {
    targets
        .iter()
        .map(|t| {
            let id = t.trim_end_matches('/').rsplit('/').next().unwrap_or(t);
            let i = m
                .components
                .iter()
                .position(|c| c.id == id)
                .ok_or_else(|| UpdateRequestError::UnknownTarget(t.clone()))?;
            if !m.components[i].updateable {
                return Err(UpdateRequestError::NotUpdateable(t.clone()));
            }
            Ok(i)
        })
        .collect()
}

/// Creates a task; `image` is the pushed image, or `None` while a SimpleUpdate download is in flight.
pub(crate) fn create_task(
    state: &FleetState,
    node: &Node,
    m: &mut NodeMut,
    targets: Vec<usize>,
    immediate: bool,
    image: Option<Result<Vec<u8>, String>>,
) -> u64 {
    let now = state.now();
    let id = m.tasks.last().map_or(1, |t| t.id + 1);
    m.tasks.push(TaskRec {
        id,
        created: now,
        targets,
        immediate,
        phase: TaskPhase::Fetching,
        applied: false,
        activate_delay: Duration::zero(),
    });
    if let Some(img) = image {
        image_arrived(state, node, m, id, img);
    }
    id
}

/// The image for task `id` is here (or could not be fetched): verify it and start flashing.
pub(crate) fn image_arrived(state: &FleetState, node: &Node, m: &mut NodeMut, id: u64, img: Result<Vec<u8>, String>) {
    let now = state.now();
    let sku = &state.scenario.fleet.sku;
    let Some(pos) = m.tasks.iter().position(|t| t.id == id) else {
        return;
    };
    let reject = |m: &mut NodeMut, message_id: &'static str, message: String| {
        m.tasks[pos].phase = TaskPhase::Rejected {
            at: now,
            message_id,
            message,
        };
    };
    let bytes = match img {
        Ok(b) => b,
        Err(why) => {
            return reject(
                m,
                "Update.1.0.TransferFailed",
                format!("Transfer of image failed: {why}"),
            );
        }
    };
    let header = match image::parse(&bytes) {
        Ok(h) => h,
        Err(e) => {
            return reject(
                m,
                "Update.1.0.VerificationFailed",
                format!("Verification of image failed: {e}"),
            );
        }
    };
    if !header.applies_to(sku) {
        return reject(
            m,
            "Update.1.0.VerificationFailed",
            format!(
                "Verification of image '{}' failed: not applicable to platform '{sku}' (image is for: {})",
                header.version,
                header.skus.join(", ")
            ),
        );
    }
    let mut targets = m.tasks[pos].targets.clone();
    if targets.is_empty() {
        targets = (0..m.components.len())
            .filter(|&i| m.components[i].kind == header.kind && m.components[i].updateable)
            .collect();
    }
    if targets.is_empty() {
        return reject(
            m,
            "Update.1.0.NoTargetsDetermined",
            format!("No {} component on this BMC", header.kind),
        );
    }
    if let Some(bad) = targets.iter().find(|&&i| m.components[i].kind != header.kind) {
        let comp = &m.components[*bad];
        return reject(
            m,
            "Update.1.0.VerificationFailed",
            format!(
                "Image is {} firmware but target '{}' is a {} component",
                header.kind, comp.id, comp.kind
            ),
        );
    }

    let seed = state.scenario.seed;
    let n = node.index as u64;
    let seq = m.flashes;
    let spec = state
        .scenario
        .firmware_spec(header.kind, &header.version)
        .map(|(_, s)| s);
    let flash_time = spec.map_or(DEFAULT_FLASH_TIME, |s| s.flash_time);
    let duration = draw(flash_time, rng::unit(seed, n, Purpose::Flash, seq, 0));
    let fail = spec.is_some_and(|s| rng::unit(seed, n, Purpose::Flash, seq, 1) < s.flash_fail_rate);
    let brick = !fail && spec.is_some_and(|s| rng::unit(seed, n, Purpose::Flash, seq, 2) < s.brick_rate);
    let outcome = if fail {
        FlashOutcome::Fail
    } else if brick {
        FlashOutcome::Brick
    } else {
        FlashOutcome::Success
    };
    let end = now + duration;
    m.flashes += 1;
    *m.flash_counts.entry(header.version.clone()).or_insert(0) += 1;
    let immediate = m.tasks[pos].immediate;
    let task = &mut m.tasks[pos];
    task.targets = targets;
    task.phase = TaskPhase::Flashing {
        start: now,
        end,
        outcome,
        version: header.version.clone(),
    };
    if outcome == FlashOutcome::Brick {
        node.set_down(end, None, false);
    } else if outcome == FlashOutcome::Success && immediate && header.kind == ComponentKind::Bmc {
        // An immediately applied BMC image reboots the BMC right after the flash.
        let reset = reset_duration(state, node, m);
        node.set_down(end, Some(end + reset), false);
        m.tasks[pos].activate_delay = reset;
    }
}

fn reset_duration(state: &FleetState, node: &Node, m: &mut NodeMut) -> Duration {
    let u = rng::unit(state.scenario.seed, node.index as u64, Purpose::Reset, m.resets, 0);
    m.resets += 1;
    draw(state.scenario.bmc_faults.reset_time, u)
}

fn reboot_duration(state: &FleetState, node: &Node, m: &mut NodeMut) -> Duration {
    let u = rng::unit(state.scenario.seed, node.index as u64, Purpose::Reset, m.resets, 1);
    m.resets += 1;
    draw(state.scenario.bmc_faults.reboot_time, u)
}

/// `Manager.Reset`: the BMC goes silent for `reset_time`; staged BMC firmware is active when it returns.
/// Returns when the BMC will answer again.
pub(crate) fn manager_reset(state: &FleetState, node: &Node, m: &mut NodeMut, now: DateTime<Utc>) -> DateTime<Utc> {
    node.settle(m, now);
    let back = now + reset_duration(state, node, m);
    for c in m.components.iter_mut().filter(|c| c.kind == ComponentKind::Bmc) {
        if let Some(p) = c.pending.as_mut().filter(|p| p.activate_at.is_none()) {
            p.activate_at = Some(back);
        }
    }
    node.set_down(now, Some(back), true);
    back
}

/// `ComputerSystem.Reset`: the host reboots; staged non-BMC firmware is active once it is back up.
pub(crate) fn system_reset(state: &FleetState, node: &Node, m: &mut NodeMut, now: DateTime<Utc>) -> DateTime<Utc> {
    node.settle(m, now);
    let back = now + reboot_duration(state, node, m);
    for c in m.components.iter_mut().filter(|c| c.kind != ComponentKind::Bmc) {
        if let Some(p) = c.pending.as_mut().filter(|p| p.activate_at.is_none()) {
            p.activate_at = Some(back);
        }
    }
    m.reboot_until = Some(back);
    back
}

/// Downloads `uri` for task `task` of node `index` and hands the result to [`image_arrived`].
pub(crate) fn spawn_fetch(state: Arc<FleetState>, index: usize, task: u64, uri: String) {
    tokio::spawn(async move {
        let result = fetch(&state.http, &uri).await;
        if let Some(node) = state.node(index) {
            let mut m = node.lock();
            image_arrived(&state, node, &mut m, task, result);
        }
    });
}

async fn fetch(http: &reqwest::Client, uri: &str) -> Result<Vec<u8>, String> {
    let resp = http
        .get(uri)
        .timeout(FETCH_TIMEOUT)
        .send()
        .await
        .map_err(|e| format!("GET {uri}: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("GET {uri}: HTTP {status}"));
    }
    if resp.content_length().is_some_and(|l| l > MAX_IMAGE_BYTES as u64) {
        return Err(format!("image larger than {MAX_IMAGE_BYTES} bytes"));
    }
    let bytes = resp
        .bytes()
        .await
        .map_err(|e| format!("GET {uri}: reading body: {e}"))?;
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(format!("image larger than {MAX_IMAGE_BYTES} bytes"));
    }
    Ok(bytes.to_vec())
}
