//! Fleet, release and policy builders shared by the planner's tests.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeZone, Utc};
use orchestrator_planner::{ComponentSnapshot, FleetSnapshot, NodeHealth, NodeSnapshot, ReleaseSpec};
use orchestrator_policy::{Policy, parse_policy};
use orchestrator_types::{ComponentKind, FirmwareVersion, NodeId, NodeState, QualificationState, ReleaseId};

pub const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
pub const GPU_OLD: &str = "96.00.5E.00.01";
pub const GPU_OLDER: &str = "96.00.58.00.00";
pub const GPU_TARGET: &str = "96.00.61.00.01";
pub const BMC_TARGET: &str = "24.04.3";

pub fn instant() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 3, 4, 9, 30, 0)
        .single()
        .expect("valid instant")
}

pub fn policy_file(name: &str) -> Policy {
    let path = format!("{}/../../policies/{name}", env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    parse_policy(&source).unwrap_or_else(|e| panic!("parse {path}: {e:?}"))
}

/// The planner tests' HGX GPU policy: an 8-node canary and four waves (`fixtures/`).
pub fn hgx_policy() -> Policy {
    parse(include_str!("../fixtures/hgx-gpu-8-node-canary.yaml"))
}

pub fn parse(yaml: &str) -> Policy {
    parse_policy(yaml).unwrap_or_else(|e| panic!("policy does not parse: {e:?}\n{yaml}"))
}

pub fn gpu_components(version: &str) -> Vec<ComponentSnapshot> {
    let mut components: Vec<ComponentSnapshot> = (0..8)
        .map(|g| ComponentSnapshot {
            inventory_id: format!("HGX_FW_GPU_{g}"),
            kind: ComponentKind::Gpu,
            version: version.to_owned(),
            updateable: true,
            downgrade_forbidden: false,
        })
        .collect();
    components.push(ComponentSnapshot {
        inventory_id: "HGX_FW_NVSwitch_0".into(),
        kind: ComponentKind::Other,
        version: "5.2.1".into(),
        updateable: true,
        downgrade_forbidden: false,
    });
    components
}

pub fn bmc_component(version: &str) -> ComponentSnapshot {
    ComponentSnapshot {
        inventory_id: "BMC_Firmware".into(),
        kind: ComponentKind::Bmc,
        version: version.to_owned(),
        updateable: true,
        downgrade_forbidden: false,
    }
}

/// A healthy active production H100 node.
pub fn node(id: i64, name: &str, cluster: &str, rack: &str, domain: &str) -> NodeSnapshot {
    let mut components = gpu_components(GPU_OLD);
    components.push(bmc_component("24.04.1"));
    NodeSnapshot {
        id: NodeId(id),
        name: name.to_owned(),
        platform: "hgx-h100-8gpu".into(),
        region: "us-west".into(),
        cluster: cluster.to_owned(),
        rack: rack.to_owned(),
        nvlink_domain: domain.to_owned(),
        labels: [("environment".to_owned(), "production".to_owned())].into(),
        state: NodeState::Active,
        health: NodeHealth::ok(),
        components,
    }
}

/// The realistic test fleet: 60 nodes, 3 clusters × 4 racks × 5 nodes, two
/// NVLink domains per rack, with the oddities a real fleet has: a B200 rack,
/// an older firmware line in one cluster, nodes already updated, nodes in
/// maintenance, quarantined, unhealthy, reserved, staging, excluded by name,
/// out of the policy's version range, and with a non-updateable GPU.
pub fn fleet60() -> FleetSnapshot {
    let mut nodes = Vec::new();
    let mut id = 0;
    for (c, cluster) in ["sjc1", "sjc2", "ams1"].iter().enumerate() {
        for r in 1..=4 {
            for n in 1..=5 {
                id += 1;
                let rack = format!("r{}", c * 4 + r);
                let domain = format!("{rack}-{}", if n <= 3 { "a" } else { "b" });
                let name = format!("gpu-{rack}-n{n:02}");
                let mut node = node(id, &name, cluster, &rack, &domain);
                if *cluster == "ams1" {
                    node.region = "eu-west".into();
                }
                nodes.push(node);
            }
        }
    }
    let by_name = |nodes: &mut Vec<NodeSnapshot>, name: &str, f: &dyn Fn(&mut NodeSnapshot)| {
        let node = nodes.iter_mut().find(|n| n.name == name).expect("node exists");
        f(node);
    };
    // Rack r12 is B200: the GPU policy does not target it, the BMC one does.
    for node in nodes.iter_mut().filter(|n| n.rack == "r12") {
        node.platform = "hgx-b200-8gpu".into();
    }
    // Cluster sjc2 racks r5-r6 still run an older (in-range) GPU build.
    for node in nodes.iter_mut().filter(|n| n.rack == "r5" || n.rack == "r6") {
        node.components = gpu_components(GPU_OLDER);
        node.components.push(bmc_component("24.04.2-rc2"));
    }
    by_name(&mut nodes, "gpu-r1-n01", &|n| {
        n.components = gpu_components(GPU_TARGET);
        n.components.push(bmc_component(BMC_TARGET));
    });
    by_name(&mut nodes, "gpu-r7-n02", &|n| {
        n.components = gpu_components(GPU_TARGET);
        n.components.push(bmc_component("24.04.1"));
    });
    by_name(&mut nodes, "gpu-r2-n03", &|n| n.state = NodeState::Maintenance);
    by_name(&mut nodes, "gpu-r9-n05", &|n| n.state = NodeState::Quarantined);
    by_name(&mut nodes, "gpu-r3-n04", &|n| {
        n.health = NodeHealth {
            healthy: false,
            summary: Some("GPU 3 XID 79 (fallen off the bus)".into()),
            rma_hold: None,
        }
    });
    by_name(&mut nodes, "gpu-r10-n01", &|n| {
        n.labels.insert("reservation".into(), "frontier-run-7".into());
    });
    by_name(&mut nodes, "gpu-r11-n02", &|n| {
        n.labels.insert("environment".into(), "staging".into());
    });
    by_name(&mut nodes, "gpu-r8-n03", &|n| {
        for c in n.components.iter_mut().filter(|c| c.kind == ComponentKind::Gpu) {
            c.version = "96.00.48.00.00".into();
        }
        if let Some(bmc) = n.components.iter_mut().find(|c| c.kind == ComponentKind::Bmc) {
            bmc.version = "24.03.9".into();
        }
    });
    by_name(&mut nodes, "gpu-r4-n05", &|n| {
        if let Some(c) = n.components.iter_mut().find(|c| c.inventory_id == "HGX_FW_GPU_5") {
            c.updateable = false;
        }
    });
    // The node the HGX policy excludes by name.
    by_name(&mut nodes, "gpu-r12-n05", &|n| n.name = "gpu-r12-n07".into());
    FleetSnapshot { nodes }
}

pub fn gpu_release(state: QualificationState) -> ReleaseSpec {
    ReleaseSpec {
        id: ReleaseId(7),
        kind: ComponentKind::Gpu,
        version: FirmwareVersion::parse(GPU_TARGET).expect("valid version"),
        platforms: vec!["hgx-h100-8gpu".into(), "hgx-b200-8gpu".into()],
        image_uri: "https://fw.example.net/hgx/96.00.61.00.01.fwpkg".into(),
        sha256: SHA.into(),
        qualification: state,
        passed_gates: ["burn_in", "dcgm_diag_l3", "nccl_allreduce", "thermal_soak"]
            .into_iter()
            .map(String::from)
            .collect::<BTreeSet<_>>(),
        downgrade_forbidden: None,
        rollback_floor: None,
    }
}

pub fn bmc_release() -> ReleaseSpec {
    ReleaseSpec {
        id: ReleaseId(8),
        kind: ComponentKind::Bmc,
        version: FirmwareVersion::parse(BMC_TARGET).expect("valid version"),
        platforms: vec!["hgx-h100-8gpu".into(), "hgx-b200-8gpu".into()],
        image_uri: "https://fw.example.net/bmc/24.04.3.bin".into(),
        sha256: SHA.into(),
        qualification: QualificationState::Qualified,
        passed_gates: ["redfish_conformance", "bmc_soak"]
            .into_iter()
            .map(String::from)
            .collect(),
        downgrade_forbidden: None,
        rollback_floor: None,
    }
}

/// Node name → wave name for planned nodes (handy in assertions).
pub fn waves_by_node(plan: &orchestrator_planner::Plan) -> BTreeMap<String, String> {
    plan.waves
        .iter()
        .flat_map(|w| w.nodes.iter().map(move |n| (n.name.clone(), w.name.clone())))
        .collect()
}
