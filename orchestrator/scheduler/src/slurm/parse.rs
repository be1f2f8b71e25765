//! Parsers of Slurm 22.05's node state output: `sinfo --json` and
//! `scontrol show node`. Both are outside input: anything that does not fit
//! is an error, never a panic, and an unknown base state is an error rather
//! than a guess (a guess could let a busy node be flashed).

use serde::Deserialize;

use crate::error::ParseError;
use crate::state::{BaseState, NodeState, Reason};

const SINFO: &str = "sinfo --json";
const SCONTROL: &str = "scontrol show node";

#[derive(Debug, Deserialize)]
struct SinfoDoc {
    #[serde(default)]
    errors: Vec<serde_json::Value>,
    nodes: Option<Vec<SinfoNode>>,
}

/// The fields of a node that matter here (v0.0.38 of Slurm's OpenAPI
/// schema, as 22.05's `sinfo --json` prints it); others are ignored.
#[derive(Debug, Deserialize)]
struct SinfoNode {
    name: String,
    state: String,
    #[serde(default)]
    state_flags: Vec<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    reason_set_by_user: Option<String>,
    #[serde(default)]
    reason_changed_at: Option<i64>,
    #[serde(default)]
    alloc_cpus: Option<i64>,
    #[serde(default)]
    boot_time: Option<i64>,
}

/// Every node in a `sinfo --json` document. 22.05 ignores `--nodes` with
/// `--json` and always lists the whole cluster, so callers filter.
pub fn parse_sinfo_json(text: &str) -> Result<Vec<NodeState>, ParseError> {
    let doc: SinfoDoc = serde_json::from_str(text).map_err(|source| ParseError::Json { what: SINFO, source })?;
    if !doc.errors.is_empty() {
        let errors: Vec<String> = doc.errors.iter().take(5).map(|e| e.to_string()).collect();
        return Err(ParseError::Reported {
            what: SINFO,
            errors: errors.join("; "),
        });
    }
    let nodes = doc.nodes.ok_or(ParseError::Field {
        what: SINFO,
        detail: "no `nodes` array".to_owned(),
    })?;
    nodes
        .into_iter()
        .map(|n| {
            let base = base_state(SINFO, &n.state)?;
            let has = |flag: &str| n.state_flags.iter().any(|f| f.eq_ignore_ascii_case(flag));
            let reason = n.reason.filter(|r| !r.is_empty()).map(|text| Reason {
                text,
                set_by: n.reason_set_by_user.filter(|u| !u.is_empty()),
                set_at: n.reason_changed_at.filter(|t| *t > 0),
            });
            Ok(NodeState {
                name: n.name,
                base,
                drain: has("DRAIN"),
                responding: !has("NOT_RESPONDING"),
                completing: has("COMPLETING"),
                reboot_pending: has("REBOOT_REQUESTED") || has("REBOOT_ISSUED"),
                alloc_cpus: cpus(n.alloc_cpus),
                reason,
                boot_time: n.boot_time.filter(|t| *t > 0),
            })
        })
        .collect()
}

fn cpus(n: Option<i64>) -> u32 {
    n.map_or(0, |n| u32::try_from(n.max(0)).unwrap_or(u32::MAX))
}

fn base_state(what: &'static str, word: &str) -> Result<BaseState, ParseError> {
    Ok(match word.to_ascii_uppercase().as_str() {
        "IDLE" => BaseState::Idle,
        "ALLOCATED" | "ALLOC" => BaseState::Allocated,
        "MIXED" => BaseState::Mixed,
        // ERROR is a deprecated base state with the same effect: no jobs.
        "DOWN" | "ERROR" => BaseState::Down,
        "FUTURE" => BaseState::Future,
        "UNKNOWN" => BaseState::Unknown,
        _ => {
            return Err(ParseError::Field {
                what,
                detail: format!("unknown node state {:?}", word.chars().take(40).collect::<String>()),
            });
        }
    })
}

/// Keys whose value runs to the end of the line (they may contain spaces).
const LINE_VALUED: [&str; 4] = ["Reason", "OS", "Comment", "Extra"];

/// Every node in `scontrol show node [NAME]` output (records start with
/// `NodeName=`). The reason's `[user@time]` suffix is split off; its time is
/// local time without a zone, so `set_at` stays `None` here (`sinfo --json`
/// has it as a Unix time).
pub fn parse_scontrol_show_node(text: &str) -> Result<Vec<NodeState>, ParseError> {
    let mut nodes = Vec::new();
    let mut current: Option<Fields> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some((key, value)) = line.split_once('=')
            && LINE_VALUED.contains(&key)
        {
            let fields = current.as_mut().ok_or_else(|| no_node_name(key))?;
            fields.push(key, value.trim());
            continue;
        }
        for token in line.split_whitespace() {
            let (key, value) = token.split_once('=').unwrap_or((token, ""));
            if key == "NodeName" {
                if let Some(done) = current.take() {
                    nodes.push(done.into_state()?);
                }
                current = Some(Fields::default());
            }
            let fields = current.as_mut().ok_or_else(|| no_node_name(key))?;
            fields.push(key, value);
        }
    }
    if let Some(done) = current.take() {
        nodes.push(done.into_state()?);
    }
    Ok(nodes)
}

fn no_node_name(key: &str) -> ParseError {
    ParseError::Field {
        what: SCONTROL,
        detail: format!("{:?} before any NodeName=", key.chars().take(40).collect::<String>()),
    }
}

#[derive(Debug, Default)]
struct Fields(Vec<(String, String)>);

impl Fields {
    fn push(&mut self, key: &str, value: &str) {
        self.0.push((key.to_owned(), value.to_owned()));
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn into_state(self) -> Result<NodeState, ParseError> {
        let missing = |key: &str| ParseError::Field {
            what: SCONTROL,
            detail: format!("no {key}="),
        };
        let name = self
            .get("NodeName")
            .filter(|n| !n.is_empty())
            .ok_or_else(|| missing("NodeName"))?;
        let state = self.get("State").ok_or_else(|| missing("State"))?;
        // `IDLE+DRAIN`, `DOWN+DRAIN+NOT_RESPONDING`, or sinfo-style `IDLE*`.
        let (state, star) = match state.strip_suffix('*') {
            Some(s) => (s, true),
            None => (state, false),
        };
        let mut words = state.split('+');
        let base = base_state(SCONTROL, words.next().unwrap_or(""))?;
        let flags: Vec<&str> = words.collect();
        let has = |flag: &str| flags.iter().any(|f| f.eq_ignore_ascii_case(flag));
        let alloc_cpus = match self.get("CPUAlloc") {
            None => 0,
            Some(v) => cpus(Some(v.parse::<i64>().map_err(|_| ParseError::Field {
                what: SCONTROL,
                detail: format!("CPUAlloc={:?} is not a number", v.chars().take(20).collect::<String>()),
            })?)),
        };
        let reason = self
            .get("Reason")
            .filter(|r| !r.is_empty() && *r != "(null)")
            .map(split_reason);
        Ok(NodeState {
            name: name.to_owned(),
            base,
            drain: has("DRAIN"),
            responding: !(star || has("NOT_RESPONDING")),
            completing: has("COMPLETING"),
            reboot_pending: has("REBOOT_REQUESTED") || has("REBOOT_ISSUED"),
            alloc_cpus,
            reason,
            boot_time: None,
        })
    }
}

/// `text [user@2026-12-04T14:25:50]` -> text and user.
fn split_reason(raw: &str) -> Reason {
    if let Some(open) = raw.rfind(" [")
        && raw.ends_with(']')
        && let Some((user, _time)) = raw[open + 2..raw.len() - 1].split_once('@')
    {
        return Reason {
            text: raw[..open].to_owned(),
            set_by: Some(user.to_owned()).filter(|u| !u.is_empty()),
            set_at: None,
        };
    }
    Reason {
        text: raw.to_owned(),
        set_by: None,
        set_at: None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Real output of Debian's 22.05.8, captured from the loopback cluster
    /// (`integration-tests/slurm/start.sh`): a draining node with a job.
    const SCONTROL_DRAINING: &str = "NodeName=n1 Arch=x86_64 CoresPerSocket=1 
   CPUAlloc=1 CPUEfctv=1 CPUTot=1 CPULoad=1.45
   AvailableFeatures=(null)
   ActiveFeatures=(null)
   Gres=(null)
   NodeAddr=127.0.0.1 NodeHostName=vm Port=27001 Version=22.05.8
   OS=Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0 
   RealMemory=100 AllocMem=0 FreeMem=18303 Sockets=1 Boards=1
   State=ALLOCATED+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug 
   BootTime=2026-12-04T13:56:32 SlurmdStartTime=2026-12-04T14:25:43
   LastBusyTime=2026-12-04T14:25:43
   CfgTRES=cpu=1,mem=100M,billing=1
   AllocTRES=cpu=1
   CapWatts=n/a
   CurrentWatts=0 AveWatts=0
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
   Reason=waveguard rollout=7 firmware maintenance [root@2026-12-04T14:25:50]

";

    #[test]
    fn scontrol_draining_node() {
        let nodes = parse_scontrol_show_node(SCONTROL_DRAINING).unwrap();
        assert_eq!(nodes.len(), 1);
        let n = &nodes[0];
        assert_eq!(n.name, "n1");
        assert_eq!(n.base, BaseState::Allocated);
        assert!(n.drain && n.responding && !n.completing);
        assert_eq!(n.alloc_cpus, 1);
        let reason = n.reason.as_ref().unwrap();
        assert_eq!(reason.text, "waveguard rollout=7 firmware maintenance");
        assert_eq!(reason.set_by.as_deref(), Some("root"));
    }

    #[test]
    fn scontrol_states_and_several_nodes() {
        let text = "NodeName=a State=DOWN+DRAIN+NOT_RESPONDING CPUAlloc=0\n   Reason=Not responding [slurm@2026-01-01T00:00:00]\n\n\
                    NodeName=b State=IDLE* CPUAlloc=0\n\nNodeName=c State=MIXED+DRAIN+COMPLETING CPUAlloc=3\n   Reason=(null)\n";
        let nodes = parse_scontrol_show_node(text).unwrap();
        let summary: Vec<_> = nodes
            .iter()
            .map(|n| {
                (
                    n.name.as_str(),
                    n.base,
                    n.drain,
                    n.responding,
                    n.completing,
                    n.alloc_cpus,
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("a", BaseState::Down, true, false, false, 0),
                ("b", BaseState::Idle, false, false, false, 0),
                ("c", BaseState::Mixed, true, true, true, 3),
            ]
        );
        assert_eq!(nodes[0].reason.as_ref().unwrap().set_by.as_deref(), Some("slurm"));
        assert_eq!(nodes[2].reason, None);
    }

    #[test]
    fn scontrol_garbage_is_an_error() {
        for bad in [
            "State=IDLE",
            "NodeName=a",
            "NodeName=a State=SLEEPY",
            "NodeName=a State=IDLE CPUAlloc=lots",
            "Reason=x\nNodeName=a State=IDLE",
        ] {
            assert!(parse_scontrol_show_node(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_scontrol_show_node("").unwrap(), vec![]);
    }

    #[test]
    fn sinfo_json_nodes() {
        let doc = r#"{"meta":{},"errors":[],"nodes":[
            {"name":"n1","state":"allocated","state_flags":["DRAIN"],"reason":"waveguard rollout=7 firmware maintenance",
             "reason_set_by_user":"root","reason_changed_at":1796394350,"alloc_cpus":1,"boot_time":1796392592,"partitions":["debug"]},
            {"name":"n3","state":"down","state_flags":["DRAIN","NOT_RESPONDING"],"reason":"","reason_set_by_user":"",
             "reason_changed_at":0,"alloc_cpus":0},
            {"name":"n4","state":"idle","state_flags":["REBOOT_REQUESTED"]}
        ]}"#;
        let nodes = parse_sinfo_json(doc).unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[0].base, BaseState::Allocated);
        assert!(nodes[0].drain && nodes[0].responding);
        assert_eq!(nodes[0].reason.as_ref().unwrap().set_at, Some(1_796_394_350));
        assert_eq!(nodes[0].boot_time, Some(1_796_392_592));
        assert!(nodes[1].drain && !nodes[1].responding && nodes[1].reason.is_none());
        assert!(nodes[2].reboot_pending && !nodes[2].drain);
    }

    #[test]
    fn sinfo_json_errors_are_errors() {
        for bad in [
            "",
            "[]",
            r#"{"errors":[]}"#,
            r#"{"errors":[{"error":"Unable to contact slurm controller","errno":1}],"nodes":[]}"#,
            r#"{"errors":[],"nodes":[{"name":"n1","state":"sleepy"}]}"#,
            r#"{"errors":[],"nodes":[{"state":"idle"}]}"#,
        ] {
            assert!(parse_sinfo_json(bad).is_err(), "{bad:?}");
        }
    }

    fn render_scontrol(n: &NodeState) -> String {
        let base = match n.base {
            BaseState::Idle => "IDLE",
            BaseState::Allocated => "ALLOCATED",
            BaseState::Mixed => "MIXED",
            BaseState::Down => "DOWN",
            BaseState::Future => "FUTURE",
            BaseState::Unknown => "UNKNOWN",
        };
        let mut state = base.to_owned();
        for (on, flag) in [
            (n.drain, "DRAIN"),
            (n.completing, "COMPLETING"),
            (!n.responding, "NOT_RESPONDING"),
        ] {
            if on {
                state.push('+');
                state.push_str(flag);
            }
        }
        let mut out = format!(
            "NodeName={} Arch=x86_64\n   CPUAlloc={} CPUTot=8\n   State={state} Weight=1\n",
            n.name, n.alloc_cpus
        );
        if let Some(r) = &n.reason {
            out.push_str(&format!(
                "   Reason={} [{}@2026-12-04T14:25:50]\n",
                r.text,
                r.set_by.as_deref().unwrap_or("")
            ));
        }
        out
    }

    fn arb_state() -> impl Strategy<Value = NodeState> {
        let base = prop_oneof![
            Just(BaseState::Idle),
            Just(BaseState::Allocated),
            Just(BaseState::Mixed),
            Just(BaseState::Down),
            Just(BaseState::Future),
            Just(BaseState::Unknown),
        ];
        (
            "[a-z][a-z0-9-]{0,12}",
            base,
            any::<(bool, bool, bool)>(),
            0u32..512,
            proptest::option::of(("[A-Za-z0-9][A-Za-z0-9 =:,.-]{0,40}[A-Za-z0-9]", "[a-z]{1,8}")),
        )
            .prop_map(
                |(name, base, (drain, responding, completing), alloc_cpus, reason)| NodeState {
                    name,
                    base,
                    drain,
                    responding,
                    completing,
                    reboot_pending: false,
                    alloc_cpus,
                    reason: reason.map(|(text, user)| Reason {
                        text,
                        set_by: Some(user),
                        set_at: None,
                    }),
                    boot_time: None,
                },
            )
    }

    proptest! {
        #[test]
        fn scontrol_round_trips(nodes in proptest::collection::vec(arb_state(), 0..5)) {
            let text: String = nodes.iter().map(|n| render_scontrol(n) + "\n").collect();
            prop_assert_eq!(parse_scontrol_show_node(&text).unwrap(), nodes);
        }

        #[test]
        fn scontrol_never_panics(text in "\\PC{0,400}") {
            let _ = parse_scontrol_show_node(&text);
        }

        #[test]
        fn scontrol_never_panics_on_near_misses(lines in proptest::collection::vec(
            "(NodeName|State|CPUAlloc|Reason|OS)=[A-Z+*a-z0-9 \\[\\]@-]{0,30}", 0..12)) {
            let _ = parse_scontrol_show_node(&lines.join("\n"));
        }

        #[test]
        fn sinfo_never_panics(text in "\\PC{0,400}") {
            let _ = parse_sinfo_json(&text);
        }

        #[test]
        fn sinfo_never_panics_on_odd_values(
            state in "[a-zA-Z_]{0,12}",
            flags in proptest::collection::vec("[A-Z_]{0,16}", 0..4),
            alloc in any::<i64>(),
            changed in any::<i64>(),
        ) {
            let doc = serde_json::json!({"errors": [], "nodes": [{
                "name": "n", "state": state, "state_flags": flags, "alloc_cpus": alloc,
                "reason": "r", "reason_changed_at": changed,
            }]});
            let _ = parse_sinfo_json(&doc.to_string());
        }
    }
}
