//! The Ansible comparison of `waveguard bench --only throughput` (issue 23: "report the Ansible
//! comparison in the same run"): community.general's `redfish_command` SimpleUpdate, driven by
//! `ansible-playbook` the way an operator's playbook drives it, updates the GPU firmware of a small
//! fleet of its own, of the throughput run's kind (same scenario, zero flash time, loopback), after
//! Waveguard's runs, so neither side touches the other's BMCs.
//!
//! Both sides end with the new version read back from the BMC: the playbook waits for the update
//! task, performs the reset the task asks for and then polls the firmware inventory until every
//! GPU reports the release, as a Waveguard node-update's post-check does. The modules only speak
//! HTTPS, so this fleet serves TLS (the throughput run's speaks plain HTTP); the handshakes are
//! Ansible's cost and are said so beside the figures.
//!
//! The generated inventory, playbook, `ansible.cfg` and the run's output are kept in a temp dir and
//! the command line is printed, so a reader can read and repeat them. CPU is that of
//! `ansible-playbook` and every process under it (its forks, each module's Python), read as this
//! process's reaped-children time: nothing else is a child of the bench while a playbook runs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bmc_sim::{Fleet, FleetOptions, ImageServer, Scenario, SimClock, image};
use orchestrator_sim::bench::throughput_scenario;
use orchestrator_types::ComponentKind;

/// The throughput run's release, SKU and GPU inventory ids (`throughput_scenario`).
const NEW_VERSION: &str = "96.00.61.00.01";
const SKU: &str = "hgx-h100-8gpu";
const GPUS: usize = 8;
/// The throughput run's clock rate; with zero flash and reset times it only decides how soon a
/// task that was just started reads as done.
const SPEEDUP: f64 = 600.0;
/// Redfish credentials of this fleet (a simulator's, not a secret; kept out of the command line
/// all the same, in the inventory file, as an operator would keep them in a vault).
const USER: &str = "admin";
const PASS: &str = "bench-pw";
/// The fewest nodes `throughput_scenario` accepts (10 clusters, 20 nodes a rack).
const MIN_SCENARIO_NODES: usize = 200;
/// Linux's USER_HZ, the unit of /proc's CPU times.
const TICKS_PER_SECOND: f64 = 100.0;
/// Lines of a failed run's output that are printed.
const TAIL_LINES: usize = 25;

/// The playbook: one SimpleUpdate per host, then what an operator's playbook does after it (the
/// waits poll once a second, as the module docs' examples and `bmc-sim/tests/tools/redfish_update.yml`
/// do).
const PLAYBOOK: &str = r#"# Written by `waveguard bench --only throughput` (the Ansible comparison). Updates the GPU firmware
# of every BMC in the inventory with community.general's Redfish modules and, like a Waveguard
# node-update, ends with the new version read back from the BMC. Variables come from the inventory.
- name: GPU firmware through community.general.redfish_command SimpleUpdate
  hosts: bmcs
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  module_defaults:
    community.general.redfish_command: &bmc
      baseuri: "{{ baseuri }}"
      username: "{{ username }}"
      password: "{{ password }}"
      ca_path: "{{ ca_path }}"
      validate_certs: true
    community.general.redfish_info: *bmc
  tasks:
    - name: SimpleUpdate of the GPU firmware
      community.general.redfish_command:
        category: Update
        command: SimpleUpdate
        update_image_uri: "{{ image_uri }}"
        update_protocol: HTTP
        update_targets: "{{ target_uris }}"
      register: simple

    - name: Wait for the update task to end
      community.general.redfish_info:
        category: Update
        command: GetUpdateStatus
        update_handle: "{{ simple.return_values.update_status.handle }}"
      register: status
      until: status.redfish_facts.update_status.status in ['Completed', 'Exception', 'Killed', 'Cancelled']
      retries: 60
      delay: 1

    - name: The update task completed
      ansible.builtin.assert:
        that: status.redfish_facts.update_status.status == 'Completed'
        quiet: true

    - name: Perform the reset the update task asks for
      community.general.redfish_command:
        category: Update
        command: PerformRequestedOperations
        update_handle: "{{ simple.return_values.update_status.handle }}"

    - name: Wait until every target reads the new version
      community.general.redfish_info:
        category: Update
        command: GetFirmwareInventory
      register: inventory
      until: >-
        inventory.redfish_facts.firmware.entries | selectattr('Id', 'in', target_ids)
        | selectattr('Version', 'equalto', new_version) | list | length == target_ids | length
      retries: 60
      delay: 1
"#;

/// Options of the comparison.
#[derive(Debug, Clone)]
pub struct Options {
    /// Simulated BMCs per playbook run; 0 disables the comparison.
    pub hosts: usize,
    /// `forks` values tried, each on a fresh fleet.
    pub forks: Vec<usize>,
}

/// One Waveguard throughput run of the same bench, to compare against.
#[derive(Debug, Clone)]
pub struct WaveguardRun {
    /// "SQLite", "PostgreSQL".
    pub backend: &'static str,
    pub updates_per_second: f64,
    /// Controller CPU seconds per node-update.
    pub cpu_per_update: f64,
}

/// What one playbook run measured.
#[derive(Debug, Clone, Copy)]
struct Measured {
    forks: usize,
    ok_hosts: usize,
    wall: Duration,
    cpu_seconds: f64,
}

impl Measured {
    fn hosts_per_second(&self) -> f64 {
        self.ok_hosts as f64 / self.wall.as_secs_f64().max(f64::EPSILON)
    }

    fn cpu_per_host(&self) -> f64 {
        self.cpu_seconds / self.ok_hosts.max(1) as f64
    }
}

/// Runs the comparison and prints it. Never fails the bench: a missing Ansible is one "skipped"
/// line, a failed playbook its output's tail and a "FAILED" line.
pub async fn run(options: &Options, waveguard: &[WaveguardRun]) {
    if options.hosts == 0 {
        println!("\nansible comparison: skipped (--ansible-hosts 0)");
        return;
    }
    let tools = match find_ansible().await {
        Ok(tools) => tools,
        Err(why) => {
            println!(
                "\nansible comparison: skipped ({why}; install the `ansible` PyPI package, which bundles \
                 community.general: `python3 -m pip install ansible` or bmc-sim/ci-setup.sh)"
            );
            return;
        }
    };
    println!(
        "\n== ansible comparison: {} {} `redfish_command` SimpleUpdate, {} simulated BMCs of the throughput run's \
         kind (a fleet of their own, after Waveguard's runs), HTTPS (the modules speak nothing else) ==",
        tools.core, tools.collection, options.hosts
    );
    println!(
        "playbook per host: SimpleUpdate of HGX_FW_GPU_0..{} -> poll the task until it ends (GetUpdateStatus, \
         1 s between polls) -> PerformRequestedOperations (the reset the task asks for) -> poll the firmware \
         inventory until every GPU reads {NEW_VERSION}; strategy linear (Ansible's default)",
        GPUS - 1
    );
    let dir = match tempfile::Builder::new().prefix("waveguard-bench-ansible-").tempdir() {
        Ok(dir) => dir.keep(),
        Err(err) => {
            println!("ansible comparison: FAILED (temp dir: {err})");
            return;
        }
    };
    println!(
        "files (kept for reading; the BMCs' ports die with the bench): {}",
        dir.display()
    );
    let mut measured = Vec::new();
    for &forks in &options.forks {
        match one_run(&tools, &dir.join(format!("forks-{forks}")), options.hosts, forks).await {
            Ok(m) => {
                println!(
                    "forks {forks}: {} of {} hosts updated and verified in {:.1} s: {:.1} hosts/s ({:.3} s a host); \
                     CPU of ansible-playbook and its children {:.1} s = {:.0} ms a host",
                    m.ok_hosts,
                    options.hosts,
                    m.wall.as_secs_f64(),
                    m.hosts_per_second(),
                    1.0 / m.hosts_per_second().max(f64::EPSILON),
                    m.cpu_seconds,
                    m.cpu_per_host() * 1000.0
                );
                if m.ok_hosts > 0 {
                    measured.push(m);
                }
            }
            Err(err) => println!("forks {forks}: ansible comparison FAILED: {err:#}"),
        }
    }
    let Some(best) = measured
        .iter()
        .max_by(|a, b| a.hosts_per_second().total_cmp(&b.hosts_per_second()))
    else {
        println!("ansible comparison: FAILED (no playbook run updated a host)");
        return;
    };
    for run in waveguard {
        println!(
            "Waveguard ({}) / Ansible (best, forks {}): node-updates/s {:.0} / {:.1} = {:.0}x; CPU per update \
             {:.2} ms / {:.0} ms = 1/{:.0}",
            run.backend,
            best.forks,
            run.updates_per_second,
            best.hosts_per_second(),
            run.updates_per_second / best.hosts_per_second().max(f64::EPSILON),
            run.cpu_per_update * 1000.0,
            best.cpu_per_host() * 1000.0,
            best.cpu_per_host() / run.cpu_per_update.max(f64::EPSILON)
        );
    }
}

/// The Ansible found on PATH.
struct Tools {
    playbook: PathBuf,
    /// "ansible-core 2.19.14".
    core: String,
    /// "community.general 11.4.2".
    collection: String,
}

async fn find_ansible() -> Result<Tools, String> {
    let playbook = find_on_path("ansible-playbook").ok_or("ansible-playbook is not on PATH")?;
    let version = output_of(&playbook, &["--version"]).await?;
    let core = core_version(&version).map_or_else(
        || "ansible-core (version unknown)".to_owned(),
        |v| format!("ansible-core {v}"),
    );
    // ansible-galaxy sits beside ansible-playbook in every install (pip, distro packages).
    let galaxy = playbook.with_file_name("ansible-galaxy");
    let listed = output_of(&galaxy, &["collection", "list", "community.general"]).await?;
    let collection = collection_version(&listed, "community.general")
        .map(|v| format!("community.general {v}"))
        .ok_or("ansible-playbook is installed but the community.general collection is not")?;
    Ok(Tools {
        playbook,
        core,
        collection,
    })
}

async fn output_of(program: &Path, args: &[&str]) -> Result<String, String> {
    let out = tokio::process::Command::new(program)
        .args(args)
        .env("ANSIBLE_NOCOLOR", "1")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|err| format!("cannot run {}: {err}", program.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Starts a fresh fleet of `hosts`, runs the playbook over it with `forks` and checks the outcome
/// in bmc-sim's own state too.
async fn one_run(tools: &Tools, dir: &Path, hosts: usize, forks: usize) -> anyhow::Result<Measured> {
    std::fs::create_dir_all(dir.join("tmp")).with_context(|| format!("create {}", dir.display()))?;
    // The scenario spreads its 10 clusters over racks of 20 nodes, so it needs at least 200 nodes;
    // a smaller comparison serves only the first `hosts` of them.
    let scenario = Scenario::from_yaml_str(&throughput_scenario(hosts.max(MIN_SCENARIO_NODES)))
        .context("the throughput scenario")?;
    let mut fleet_options = FleetOptions::new(Arc::new(SimClock::starting_now(SPEEDUP)));
    fleet_options.slice = Some(0..hosts);
    fleet_options.tls = true;
    fleet_options.username = USER.into();
    fleet_options.password = PASS.into();
    let fleet = Fleet::start(scenario, fleet_options).await.context("start the fleet")?;
    let outcome = drive(tools, dir, &fleet, forks).await;
    let verified = fleet
        .endpoints()
        .iter()
        .filter(|e| {
            fleet.versions(&e.name).is_some_and(|components| {
                components
                    .iter()
                    .filter(|c| c.kind == ComponentKind::Gpu)
                    .all(|c| c.active == NEW_VERSION)
            })
        })
        .count();
    fleet.shutdown().await;
    let (recap, wall, cpu_seconds) = outcome?;
    if recap.ok_hosts != verified {
        println!(
            "forks {forks}: NOTE: the recap counts {} hosts ok, bmc-sim {verified} updated; the lower is reported",
            recap.ok_hosts
        );
    }
    Ok(Measured {
        forks,
        ok_hosts: recap.ok_hosts.min(verified),
        wall,
        cpu_seconds,
    })
}

async fn drive(
    tools: &Tools,
    dir: &Path,
    fleet: &bmc_sim::RunningFleet,
    forks: usize,
) -> anyhow::Result<(Recap, Duration, f64)> {
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, fleet.ca_pem().context("the TLS fleet has no CA")?).context("write the CA")?;
    let payload = format!("gpu firmware {NEW_VERSION} for the ansible comparison");
    let gpu_image = image::build(ComponentKind::Gpu, NEW_VERSION, &[SKU], payload.as_bytes());
    let images = ImageServer::start([("gpu.bin".to_owned(), gpu_image)])
        .await
        .context("image server")?;
    let hosts: Vec<(String, String)> = fleet
        .endpoints()
        .iter()
        .map(|e| (e.name.clone(), e.bmc_url.clone()))
        .collect();
    let inventory_path = dir.join("inventory.yml");
    let playbook_path = dir.join("playbook.yml");
    let config_path = dir.join("ansible.cfg");
    let vars = InventoryVars {
        ca_path: &ca,
        image_uri: &images.url("gpu.bin"),
    };
    std::fs::write(&inventory_path, inventory(&hosts, &vars)).context("write the inventory")?;
    std::fs::write(&playbook_path, PLAYBOOK).context("write the playbook")?;
    std::fs::write(&config_path, ansible_cfg(&dir.join("tmp"))).context("write ansible.cfg")?;
    println!(
        "forks {forks}: command: ANSIBLE_CONFIG={} {} -i {} -f {forks} {}",
        config_path.display(),
        tools.playbook.display(),
        inventory_path.display(),
        playbook_path.display()
    );

    let cpu_before = children_cpu_seconds().context("read /proc/self/stat")?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&tools.playbook)
        .arg("-i")
        .arg(&inventory_path)
        .arg("-f")
        .arg(forks.to_string())
        .arg(&playbook_path)
        .env("ANSIBLE_CONFIG", &config_path)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a run past its time is ended with every fork under it.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .context("start ansible-playbook")?;
    let pid = child.id();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    // Generous: the issue's baseline is ~0.3 s a host; a run ten times slower is still reported.
    let limit = Duration::from_secs(120 + 3 * hosts.len() as u64);
    let waited = tokio::time::timeout(limit, async {
        let (status, out, err) = tokio::join!(child.wait(), read(stdout), read(stderr));
        (status, out, err)
    })
    .await;
    let wall = started.elapsed();
    drop(images);
    let Ok((status, out, err)) = waited else {
        if let Some(pid) = pid {
            // The group's id is the leader's pid; `kill` takes a negative pid as a group.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
        let _ = child.wait().await;
        anyhow::bail!("ansible-playbook did not end within {} s; killed", limit.as_secs());
    };
    let status = status.context("wait for ansible-playbook")?;
    let cpu_seconds = children_cpu_seconds().context("read /proc/self/stat")? - cpu_before;
    let _ = std::fs::write(dir.join("ansible.log"), format!("{out}\n{err}"));
    let recap = parse_recap(&out);
    if !status.success() || recap.hosts == 0 {
        anyhow::bail!(
            "ansible-playbook ended with {status}; {} of {} hosts ok in its recap; its output ends:\n{}\n{}",
            recap.ok_hosts,
            recap.hosts,
            tail(&out, TAIL_LINES),
            tail(&err, TAIL_LINES)
        );
    }
    Ok((recap, wall, cpu_seconds))
}

/// The inventory's shared variables.
struct InventoryVars<'a> {
    ca_path: &'a Path,
    image_uri: &'a str,
}

/// The inventory (JSON, which Ansible's YAML inventory plugin reads): group `bmcs` with one host per
/// BMC, its `baseuri` being `host:port` (the modules put `https://` in front), and the update's
/// variables on the group.
fn inventory(hosts: &[(String, String)], vars: &InventoryVars<'_>) -> String {
    let target_ids: Vec<String> = (0..GPUS).map(|i| format!("HGX_FW_GPU_{i}")).collect();
    let target_uris: Vec<String> = target_ids
        .iter()
        .map(|id| format!("/redfish/v1/UpdateService/FirmwareInventory/{id}"))
        .collect();
    let members: serde_json::Map<String, serde_json::Value> = hosts
        .iter()
        .map(|(name, url)| {
            let baseuri = url
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches('/');
            (name.clone(), serde_json::json!({ "baseuri": baseuri }))
        })
        .collect();
    let doc = serde_json::json!({
        "bmcs": {
            "hosts": members,
            "vars": {
                "username": USER,
                "password": PASS,
                "ca_path": vars.ca_path,
                "image_uri": vars.image_uri,
                "target_ids": target_ids,
                "target_uris": target_uris,
                "new_version": NEW_VERSION,
            },
        },
    });
    format!("{doc:#}\n")
}

fn ansible_cfg(local_tmp: &Path) -> String {
    format!(
        "# Written by `waveguard bench`: Ansible's scratch files stay in the bench's dir.\n\
         [defaults]\n\
         local_tmp = {}\n\
         retry_files_enabled = False\n\
         nocolor = True\n\
         deprecation_warnings = False\n\
         host_key_checking = False\n",
        local_tmp.display()
    )
}

/// The PLAY RECAP's count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Recap {
    hosts: usize,
    /// Hosts with no failed and no unreachable task (and at least one ok).
    ok_hosts: usize,
}

/// Reads the `host : ok=7 changed=2 unreachable=0 failed=0 ...` lines after `PLAY RECAP`.
fn parse_recap(output: &str) -> Recap {
    let mut recap = Recap::default();
    let Some(at) = output.rfind("PLAY RECAP") else {
        return recap;
    };
    for line in output[at..].lines().skip(1) {
        let Some((_, counts)) = line.split_once(" : ") else {
            continue;
        };
        let count = |key: &str| {
            counts
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse::<u64>().ok())
        };
        let (Some(ok), Some(failed), Some(unreachable)) = (count("ok"), count("failed"), count("unreachable")) else {
            continue;
        };
        recap.hosts += 1;
        if ok > 0 && failed == 0 && unreachable == 0 {
            recap.ok_hosts += 1;
        }
    }
    recap
}

/// `ansible-playbook [core 2.19.14]` -> `2.19.14`.
fn core_version(version_output: &str) -> Option<&str> {
    let first = version_output.lines().next()?;
    let (_, rest) = first.split_once("[core ")?;
    rest.split_once(']').map(|(v, _)| v.trim())
}

/// The version of `name` in `ansible-galaxy collection list` output (`community.general 11.4.2`).
fn collection_version<'a>(listing: &'a str, name: &str) -> Option<&'a str> {
    listing.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == name).then_some(())?;
        words.next()
    })
}

/// CPU seconds of this process's children that have ended and been waited for (the `cutime` and
/// `cstime` fields of /proc/self/stat, what `getrusage(RUSAGE_CHILDREN)` reports): each includes
/// the processes it waited for in turn.
fn children_cpu_seconds() -> Option<f64> {
    children_cpu_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?).map(|t| t as f64 / TICKS_PER_SECOND)
}

fn children_cpu_ticks(stat: &str) -> Option<u64> {
    // `pid (comm) state ...`: comm may hold spaces and parentheses, so split at the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // cutime and cstime are fields 16 and 17 of the line; `rest` starts at field 3.
    let cutime: u64 = fields.get(13)?.parse().ok()?;
    let cstime: u64 = fields.get(14)?.parse().ok()?;
    Some(cutime + cstime)
}

/// All a pipe says until it closes (lossy: Ansible's output is for reading).
async fn read<R: tokio::io::AsyncRead + Unpin>(pipe: Option<R>) -> String {
    let mut text = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut pipe, &mut text).await;
    }
    String::from_utf8_lossy(&text).into_owned()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inventory_has_one_host_per_bmc_and_the_updates_variables() {
        let hosts = vec![
            ("node-00000".to_owned(), "https://127.0.0.1:40001".to_owned()),
            ("node-00001".to_owned(), "https://127.0.0.1:40002/".to_owned()),
        ];
        let text = inventory(
            &hosts,
            &InventoryVars {
                ca_path: Path::new("/tmp/x/ca.pem"),
                image_uri: "http://127.0.0.1:9/gpu.bin",
            },
        );
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let members = doc["bmcs"]["hosts"].as_object().unwrap();
        assert_eq!(members.len(), 2);
        assert_eq!(members["node-00000"]["baseuri"], "127.0.0.1:40001");
        assert_eq!(members["node-00001"]["baseuri"], "127.0.0.1:40002");
        let vars = &doc["bmcs"]["vars"];
        assert_eq!(vars["ca_path"], "/tmp/x/ca.pem");
        assert_eq!(vars["image_uri"], "http://127.0.0.1:9/gpu.bin");
        assert_eq!(vars["new_version"], NEW_VERSION);
        assert_eq!(vars["target_ids"].as_array().unwrap().len(), GPUS);
        assert_eq!(vars["target_ids"][7], "HGX_FW_GPU_7");
        assert_eq!(
            vars["target_uris"][0],
            "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0"
        );
    }

    #[test]
    fn the_playbook_reads_the_variables_the_inventory_sets() {
        let text = inventory(
            &[],
            &InventoryVars {
                ca_path: Path::new("/ca.pem"),
                image_uri: "http://x/gpu.bin",
            },
        );
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        for var in doc["bmcs"]["vars"].as_object().unwrap().keys() {
            assert!(PLAYBOOK.contains(var.as_str()), "{var} is set but never used");
        }
        assert!(PLAYBOOK.contains("{{ baseuri }}"));
    }

    #[test]
    fn the_recap_counts_hosts_with_nothing_failed_or_unreachable() {
        let check = |output: &str, hosts: usize, ok_hosts: usize| {
            assert_eq!(parse_recap(output), Recap { hosts, ok_hosts }, "{output}");
        };
        let recap = "TASK [x] ***\nok: [node-00000]\n\nPLAY RECAP *********\n\
            node-00000                 : ok=5    changed=2    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0\n\
            node-00001                 : ok=2    changed=1    unreachable=0    failed=1    skipped=0    rescued=0    ignored=0\n\
            node-00002                 : ok=0    changed=0    unreachable=1    failed=0    skipped=0    rescued=0    ignored=0\n\
            node-00003                 : ok=5    changed=2    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0\n\n";
        check(recap, 4, 2);
        check("fatal: [node-00000]: FAILED! => {}\n", 0, 0);
        check("", 0, 0);
        // A task's output that looks like counts, before the recap, is not counted.
        check(
            "msg: a : ok=1 failed=0 unreachable=0\nPLAY RECAP ***\nn : ok=1 changed=0 unreachable=0 failed=0\n",
            1,
            1,
        );
        check("PLAY RECAP ***\nn : ok=x failed=0 unreachable=0\n", 0, 0);
    }

    #[test]
    fn versions_are_read_from_ansibles_own_output() {
        let version = "ansible-playbook [core 2.19.14]\n  config file = None\n";
        assert_eq!(core_version(version), Some("2.19.14"));
        assert_eq!(core_version("ansible-playbook 2.9.6\n"), None);
        let listing = "\n# /usr/lib/python3/site-packages/ansible_collections\nCollection        Version\n\
            ----------------- -------\ncommunity.general 11.4.2\n";
        assert_eq!(collection_version(listing, "community.general"), Some("11.4.2"));
        assert_eq!(collection_version("Collection Version\n", "community.general"), None);
        assert_eq!(
            collection_version("community.generalx 1.0\n", "community.general"),
            None
        );
    }

    #[test]
    fn childrens_cpu_is_read_past_a_command_name_with_spaces() {
        let stat = "4242 (wave guard) S 1 4242 4242 0 -1 4194304 100 200 0 0 35 12 700 45 20 0 8 0 100 0";
        assert_eq!(children_cpu_ticks(stat), Some(745));
        assert_eq!(children_cpu_ticks("4242 (x) S 1"), None);
        assert!(children_cpu_seconds().is_some_and(|s| s >= 0.0));
    }
}
