//! bmc-sim scenarios for the harness, rendered from a few knobs so tests name what differs instead
//! of repeating the file: an HGX H100 fleet described inline (a BMC and eight GPUs per node on
//! [`GPU_FROM`]), or a fleet of one of bmc-sim's platform profiles.

use bmc_sim::Scenario;
use orchestrator_db::testing::fixtures::{GPU_FROM, SKU};

/// The scenario file of an HGX fleet; see [`ScenarioYaml::hgx`].
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioYaml {
    /// The scenario's `seed`: every simulated draw derives from it.
    pub seed: u64,
    /// `platform` (a bmc-sim profile, which brings its components); `None` describes HGX GPUs inline.
    pub platform: Option<String>,
    /// `fleet.sku`.
    pub sku: String,
    /// `fleet.nodes`.
    pub nodes: usize,
    /// `fleet.racks`.
    pub racks: usize,
    /// `fleet.clusters`.
    pub clusters: usize,
    /// `fleet.nodes_per_nvlink_domain`, omitted when `None`.
    pub nodes_per_nvlink_domain: Option<usize>,
    /// Further keys of the GPU components' entry, e.g. `, lowest_supported_version: "96.00.61.00.00"`.
    pub gpu_keys: String,
    /// The `baseline:` lines as written (indented by two), if any.
    pub baseline: Vec<String>,
    /// The `firmware:` entries as written, each starting with `  - kind:`.
    pub firmware: Vec<String>,
    /// Further top-level sections as written (e.g. `update_service:`).
    pub sections: Vec<String>,
    /// Further `bmc_faults` lines as written (`unavailable_rate: 0.02`).
    pub bmc_fault_lines: Vec<String>,
    /// `bmc_faults.reset_time`.
    pub reset_time: String,
    /// `bmc_faults.reboot_time`.
    pub reboot_time: String,
}

impl ScenarioYaml {
    /// `nodes` HGX nodes (seed 7) in 3 clusters, ten to a rack (at least 3 racks), five to an NVLink
    /// domain; no firmware known yet (add it with [`ScenarioYaml::gpu_firmware`]); BMC resets of 30-60 s
    /// and reboots of 1-2 min.
    pub fn hgx(nodes: usize) -> ScenarioYaml {
        ScenarioYaml {
            seed: 7,
            platform: None,
            sku: SKU.into(),
            nodes,
            racks: nodes.div_ceil(10).max(3),
            clusters: 3,
            nodes_per_nvlink_domain: Some(5),
            gpu_keys: String::new(),
            baseline: Vec::new(),
            firmware: Vec::new(),
            sections: Vec::new(),
            bmc_fault_lines: Vec::new(),
            reset_time: "{min: 30s, max: 60s}".into(),
            reboot_time: "{min: 1m, max: 2m}".into(),
        }
    }

    /// `nodes` nodes of bmc-sim's platform profile `platform` labelled `sku`, in 3 racks of one
    /// cluster, NVLink domains as the profile has them; otherwise as [`ScenarioYaml::hgx`].
    pub fn profile(platform: &str, sku: &str, nodes: usize) -> ScenarioYaml {
        ScenarioYaml {
            platform: Some(platform.to_owned()),
            sku: sku.to_owned(),
            racks: 3,
            clusters: 1,
            nodes_per_nvlink_domain: None,
            ..ScenarioYaml::hgx(nodes)
        }
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> ScenarioYaml {
        self.seed = seed;
        self
    }

    /// Sets the racks and clusters.
    pub fn layout(mut self, racks: usize, clusters: usize) -> ScenarioYaml {
        self.racks = racks;
        self.clusters = clusters;
        self
    }

    /// Sets the nodes per NVLink domain (the scale-up domain).
    pub fn nodes_per_nvlink_domain(mut self, nodes: usize) -> ScenarioYaml {
        self.nodes_per_nvlink_domain = Some(nodes);
        self
    }

    /// Adds a top-level section as written; empty text adds nothing.
    pub fn section(mut self, text: &str) -> ScenarioYaml {
        if !text.trim().is_empty() {
            self.sections.push(text.trim_end().to_owned());
        }
        self
    }

    /// GPU firmware `version` that flashes in `flash_time` (e.g. `{min: 2m, max: 4m}`).
    pub fn gpu_firmware(self, version: &str, flash_time: &str) -> ScenarioYaml {
        self.firmware(&format!(
            "  - kind: gpu\n    version: \"{version}\"\n    flash_time: {flash_time}"
        ))
    }

    /// A `firmware:` entry (or several) as written; empty text adds nothing.
    pub fn firmware(mut self, entry: &str) -> ScenarioYaml {
        if !entry.trim().is_empty() {
            self.firmware.push(entry.trim_end().to_owned());
        }
        self
    }

    /// Sets the GPU components' further keys.
    pub fn gpu_keys(mut self, keys: &str) -> ScenarioYaml {
        keys.clone_into(&mut self.gpu_keys);
        self
    }

    /// Adds a `baseline:` line, e.g. `xid_errors_per_gpu_hour: 0.6`.
    pub fn baseline(mut self, line: &str) -> ScenarioYaml {
        self.baseline.push(line.to_owned());
        self
    }

    /// Adds a `bmc_faults` line, e.g. `unavailable_rate: 0.02`.
    pub fn bmc_fault(mut self, line: &str) -> ScenarioYaml {
        self.bmc_fault_lines.push(line.to_owned());
        self
    }

    /// Sets the BMC reset and reboot times.
    pub fn bmc_faults(mut self, reset_time: &str, reboot_time: &str) -> ScenarioYaml {
        reset_time.clone_into(&mut self.reset_time);
        reboot_time.clone_into(&mut self.reboot_time);
        self
    }

    /// The scenario file's text.
    pub fn render(&self) -> String {
        let mut out = format!("seed: {}\n", self.seed);
        if let Some(platform) = &self.platform {
            out.push_str(&format!("platform: {platform}\n"));
        }
        out.push_str(&format!(
            "fleet:\n  nodes: {}\n  racks: {}\n  clusters: {}\n  region: sim-1\n  sku: {}\n",
            self.nodes, self.racks, self.clusters, self.sku
        ));
        if let Some(per_domain) = self.nodes_per_nvlink_domain {
            out.push_str(&format!("  nodes_per_nvlink_domain: {per_domain}\n"));
        }
        if self.platform.is_none() {
            out.push_str(&format!(
                "  components:\n    - {{id: BMC_Firmware, kind: bmc, version: \"24.04.1\"}}\n    \
                 - {{id: \"HGX_FW_GPU_{{0..7}}\", kind: gpu, version: \"{GPU_FROM}\"{}}}\n",
                self.gpu_keys
            ));
        }
        if !self.baseline.is_empty() {
            out.push_str("baseline:\n");
            for line in &self.baseline {
                out.push_str(&format!("  {line}\n"));
            }
        }
        if !self.firmware.is_empty() {
            out.push_str("firmware:\n");
            for entry in &self.firmware {
                out.push_str(entry);
                out.push('\n');
            }
        }
        for section in &self.sections {
            out.push_str(section);
            out.push('\n');
        }
        out.push_str("bmc_faults:\n");
        for line in &self.bmc_fault_lines {
            out.push_str(&format!("  {line}\n"));
        }
        out.push_str(&format!(
            "  reset_time: {}\n  reboot_time: {}\n",
            self.reset_time, self.reboot_time
        ));
        out
    }

    /// The parsed scenario; panics with the parser's message on a malformed one (a test's own text).
    pub fn build(&self) -> Scenario {
        Scenario::from_yaml_str(&self.render()).unwrap_or_else(|e| panic!("scenario: {e}\n{}", self.render()))
    }
}
