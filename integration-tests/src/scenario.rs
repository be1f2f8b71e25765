//! bmc-sim scenarios for the harness: an HGX H100 fleet (a BMC and eight GPUs per node on
//! [`GPU_FROM`]) rendered from a few knobs, so tests name what differs instead of repeating the file.

use bmc_sim::Scenario;
use orchestrator_db::testing::fixtures::{GPU_FROM, SKU};

/// The scenario file of an HGX fleet; see [`ScenarioYaml::hgx`].
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioYaml {
    /// The scenario's `seed`: every simulated draw derives from it.
    pub seed: u64,
    /// `fleet.nodes`.
    pub nodes: usize,
    /// `fleet.racks`.
    pub racks: usize,
    /// `fleet.clusters`.
    pub clusters: usize,
    /// `fleet.nodes_per_nvlink_domain`.
    pub nodes_per_nvlink_domain: usize,
    /// Further keys of the GPU components' entry, e.g. `, lowest_supported_version: "96.00.61.00.00"`.
    pub gpu_keys: String,
    /// The `baseline:` lines as written (indented by two), if any.
    pub baseline: Vec<String>,
    /// The `firmware:` entries as written, each starting with `  - kind:`.
    pub firmware: Vec<String>,
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
            nodes,
            racks: nodes.div_ceil(10).max(3),
            clusters: 3,
            nodes_per_nvlink_domain: 5,
            gpu_keys: String::new(),
            baseline: Vec::new(),
            firmware: Vec::new(),
            reset_time: "{min: 30s, max: 60s}".into(),
            reboot_time: "{min: 1m, max: 2m}".into(),
        }
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> ScenarioYaml {
        self.seed = seed;
        self
    }

    /// Sets the racks, clusters and nodes per NVLink domain.
    pub fn layout(mut self, racks: usize, clusters: usize, nodes_per_nvlink_domain: usize) -> ScenarioYaml {
        self.racks = racks;
        self.clusters = clusters;
        self.nodes_per_nvlink_domain = nodes_per_nvlink_domain;
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

    /// Sets the BMC reset and reboot times.
    pub fn bmc_faults(mut self, reset_time: &str, reboot_time: &str) -> ScenarioYaml {
        reset_time.clone_into(&mut self.reset_time);
        reboot_time.clone_into(&mut self.reboot_time);
        self
    }

    /// The scenario file's text.
    pub fn render(&self) -> String {
        let mut out = format!(
            "seed: {seed}\nfleet:\n  nodes: {nodes}\n  racks: {racks}\n  clusters: {clusters}\n  region: sim-1\n  \
             sku: {SKU}\n  nodes_per_nvlink_domain: {per_domain}\n  components:\n    \
             - {{id: BMC_Firmware, kind: bmc, version: \"24.04.1\"}}\n    \
             - {{id: \"HGX_FW_GPU_{{0..7}}\", kind: gpu, version: \"{GPU_FROM}\"{gpu_keys}}}\n",
            seed = self.seed,
            nodes = self.nodes,
            racks = self.racks,
            clusters = self.clusters,
            per_domain = self.nodes_per_nvlink_domain,
            gpu_keys = self.gpu_keys,
        );
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
        out.push_str(&format!(
            "bmc_faults:\n  reset_time: {}\n  reboot_time: {}\n",
            self.reset_time, self.reboot_time
        ));
        out
    }

    /// The parsed scenario; panics with the parser's message on a malformed one (a test's own text).
    pub fn build(&self) -> Scenario {
        Scenario::from_yaml_str(&self.render()).unwrap_or_else(|e| panic!("scenario: {e}\n{}", self.render()))
    }
}
