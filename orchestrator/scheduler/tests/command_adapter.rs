//! The generic command adapter against a small scheduler written in shell:
//! node states live in files, the commands are configured argument vectors.
//! Checks templating (a reason with spaces stays one argument), exit codes
//! (unknown node, failure with stderr quoted), JSON state and list output,
//! and the same ownership rules as Slurm.

use std::path::Path;

use orchestrator_scheduler::command::{CommandConfig, CommandScheduler};
use orchestrator_scheduler::rules::{DrainDecision, LeaveAlone, decide_drain};
use orchestrator_scheduler::{ReasonTag, Scheduler, SchedulerError, SchedulerNodeName, Service, confirm_drain};
use orchestrator_types::RolloutId;

/// `sched DIR state|drain|resume|list NODE [REASON]`. A node exists when
/// DIR/NODE exists; its content is the JSON state. `jobs` files hold a job
/// count that keeps a drained node "draining".
const SCHED: &str = r#"#!/bin/sh
dir=$1; op=$2; node=$3
case "$op" in
  list)
    printf '['; sep=''
    for f in "$dir"/*.node; do
      n=$(basename "$f" .node); printf '%s{"name":"%s",%s' "$sep" "$n" "$(cut -c2- "$f")"; sep=','
    done
    printf ']'; exit 0 ;;
esac
[ -f "$dir/$node.node" ] || { echo "no such node $node" >&2; exit 3; }
jobs=$(cat "$dir/$node.jobs" 2>/dev/null || echo 0)
case "$op" in
  state) cat "$dir/$node.node" ;;
  drain)
    [ -n "$4" ] || { echo "a reason is required" >&2; exit 1; }
    if [ "$jobs" -gt 0 ]; then s=draining; else s=drained; fi
    printf '{"state":"%s","reason":"%s","reason_set_by":"waveguard","jobs":%s}' "$s" "$4" "$jobs" > "$dir/$node.node" ;;
  resume) printf '{"state":"in_service","jobs":%s}' "$jobs" > "$dir/$node.node" ;;
  *) echo "unknown op $op" >&2; exit 2 ;;
esac
"#;

fn setup(dir: &Path) -> CommandScheduler {
    let script = dir.join("sched");
    std::fs::write(&script, SCHED).unwrap();
    let d = dir.display().to_string();
    let argv = |op: &str, extra: &[&str]| -> Vec<String> {
        let mut v = vec![
            "/bin/sh".to_owned(),
            script.display().to_string(),
            d.clone(),
            op.to_owned(),
        ];
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    CommandScheduler::new(CommandConfig {
        state: argv("state", &["{node}"]),
        drain: argv("drain", &["{node}", "{reason}"]),
        resume: argv("resume", &["{node}"]),
        list: Some(argv("list", &[])),
        unknown_node_exit_code: 3,
        timeout_seconds: 10,
    })
    .unwrap()
}

fn node(dir: &Path, name: &str, json: &str, jobs: u32) {
    std::fs::write(dir.join(format!("{name}.node")), json).unwrap();
    std::fs::write(dir.join(format!("{name}.jobs")), jobs.to_string()).unwrap();
}

#[tokio::test]
async fn drain_wait_resume_through_configured_commands() {
    let dir = tempfile::tempdir().unwrap();
    let sched = setup(dir.path());
    node(dir.path(), "a1", r#"{"state":"in_service","jobs":2}"#, 2);
    node(
        dir.path(),
        "a2",
        r#"{"state":"drained","reason":"operator: fan swap","reason_set_by":"alice"}"#,
        0,
    );
    let (a1, a2) = (
        SchedulerNodeName::new("a1").unwrap(),
        SchedulerNodeName::new("a2").unwrap(),
    );
    let rollout = RolloutId(5);
    let tag = ReasonTag::maintenance(rollout);

    let busy = sched.node_state(&a1).await.unwrap();
    assert_eq!(busy.service(), Service::InService { busy: true });
    assert_eq!(decide_drain(&busy, None, rollout), DrainDecision::Drain);
    sched.drain(&a1, &tag).await.unwrap();
    // The reason with spaces arrived as one argument and reads back as ours.
    let draining = confirm_drain(&sched, &a1, &tag).await.unwrap();
    assert_eq!(draining.service(), Service::Draining { alloc_cpus: 2 });

    std::fs::write(dir.path().join("a1.jobs"), "0").unwrap();
    sched.drain(&a1, &tag).await.unwrap();
    assert_eq!(sched.node_state(&a1).await.unwrap().service(), Service::Drained);
    sched.resume(&a1).await.unwrap();
    assert_eq!(
        sched.node_state(&a1).await.unwrap().service(),
        Service::InService { busy: false }
    );

    let operator = sched.node_state(&a2).await.unwrap();
    match decide_drain(&operator, None, rollout) {
        DrainDecision::Skip(LeaveAlone::DrainedByOther { reason: Some(r) }) => {
            assert_eq!(
                (r.text.as_str(), r.set_by.as_deref()),
                ("operator: fan swap", Some("alice"))
            );
        }
        other => panic!("{other:?}"),
    }

    let all = sched.all_states().await.unwrap();
    let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a1", "a2"]);
}

#[tokio::test]
async fn exit_codes_map_to_errors() {
    let dir = tempfile::tempdir().unwrap();
    let sched = setup(dir.path());
    let missing = SchedulerNodeName::new("nope").unwrap();
    let err = sched.node_state(&missing).await.unwrap_err();
    assert!(matches!(err, SchedulerError::UnknownNode { .. }), "{err:?}");

    node(dir.path(), "bad", "not json", 0);
    let err = sched
        .node_state(&SchedulerNodeName::new("bad").unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, SchedulerError::Parse { .. }), "{err:?}");

    // A failing command's stderr is quoted in the error.
    let failing = CommandScheduler::new(CommandConfig {
        state: vec![
            "/bin/sh".into(),
            "-c".into(),
            "echo 'controller down' >&2; exit 1".into(),
        ],
        drain: vec!["/bin/true".into(), "{reason}".into()],
        resume: vec!["/bin/true".into()],
        list: None,
        unknown_node_exit_code: 3,
        timeout_seconds: 10,
    })
    .unwrap();
    let err = failing.node_state(&missing).await.unwrap_err();
    assert!(err.to_string().contains("controller down"), "{err}");
    assert!(matches!(failing.all_states().await, Err(SchedulerError::Config { .. })));
}

#[test]
fn configurations_that_cannot_work_are_refused() {
    let ok = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let base = CommandConfig {
        state: ok(&["sched", "state", "{node}"]),
        drain: ok(&["sched", "drain", "{node}", "{reason}"]),
        resume: ok(&["sched", "resume", "{node}"]),
        list: None,
        unknown_node_exit_code: 3,
        timeout_seconds: 30,
    };
    assert!(CommandScheduler::new(base.clone()).is_ok());
    let mut empty = base.clone();
    empty.resume = vec![];
    assert!(CommandScheduler::new(empty).is_err());
    let mut templated_program = base.clone();
    templated_program.state = ok(&["{node}", "state"]);
    assert!(CommandScheduler::new(templated_program).is_err());
    let mut no_reason = base;
    no_reason.drain = ok(&["sched", "drain", "{node}"]);
    assert!(CommandScheduler::new(no_reason).is_err());
}
