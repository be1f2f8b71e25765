//! Against a real Slurm 22.05 on loopback (Debian's packages; started by
//! `integration-tests/slurm/start.sh` with one `slurmd -N` per node): a job
//! on a node keeps the flash waiting until the node is DRAINED, the node is
//! resumed afterwards, an operator's drain is never replaced or resumed, an
//! operator taking a node over mid-maintenance wins, and a node rebooted
//! while drained (`slurmd -b`) comes back ours and is resumed.
//!
//! Skips loudly when the programs are missing, unless
//! `WAVEGUARD_REQUIRE_ALL=1` (CI), as the other external-program tests do.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use orchestrator_scheduler::rules::{
    DrainDecision, DrainPhase, DrainRecord, LeaveAlone, Readiness, ResumeDecision, Waiting, after_update, decide_drain,
    decide_resume, flash_readiness, orphaned_drains,
};
use orchestrator_scheduler::slurm::StateSource;
use orchestrator_scheduler::testing::{LoopbackSlurm, slurm_present};
use orchestrator_scheduler::{BaseState, NodeState, ReasonTag, Scheduler, SchedulerNodeName, Service, confirm_drain};
use orchestrator_types::RolloutId;

const ROLLOUT: RolloutId = RolloutId(41);

fn name(n: &str) -> SchedulerNodeName {
    SchedulerNodeName::new(n).expect("valid name")
}

async fn poll<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await? {
            return Ok(value);
        }
        ensure!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_wait_for_jobs_resume_only_our_nodes_and_leave_operators_alone() {
    if !slurm_present("Slurm loopback test") {
        return;
    }
    let cluster = LoopbackSlurm::start(&["wg1", "wg2", "wg3"], 2).expect("start the loopback Slurm cluster");
    if let Err(err) = run(&cluster).await {
        panic!("{err:?}\n\nSlurm logs:\n{}", cluster.logs());
    }
}

/// Without `ReturnToService=2` a rebooted node comes back DOWN: with our
/// drain still on it (`DOWN+DRAIN`, reason kept), or, when it was not
/// drained, `DOWN` "Node unexpectedly rebooted". The first is ours to
/// resume after the flash; the second is not (we never drained it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_that_reboots_without_return_to_service_is_resumed_from_down() {
    if !slurm_present("Slurm loopback reboot test") {
        return;
    }
    let cluster = LoopbackSlurm::start(&["rb1", "rb2"], 1).expect("start the loopback Slurm cluster");
    if let Err(err) = run_reboot(&cluster).await {
        panic!("{err:?}\n\nSlurm logs:\n{}", cluster.logs());
    }
}

async fn run_reboot(cluster: &LoopbackSlurm) -> anyhow::Result<()> {
    let slurm = cluster.scheduler(StateSource::ScontrolShowNode);
    let (rb1, rb2) = (name("rb1"), name("rb2"));
    let tag = ReasonTag::maintenance(ROLLOUT);
    let record = DrainRecord {
        rollout: ROLLOUT,
        node: "rb1".into(),
        phase: DrainPhase::Held,
    };
    slurm.drain(&rb1, &tag).await?;
    confirm_drain(&slurm, &rb1, &tag).await?;
    // The flash reboots the host.
    restart_slurmd_as_rebooted(cluster, "rb1")?;
    restart_slurmd_as_rebooted(cluster, "rb2")?;
    let down = poll("rb1 DOWN after its reboot", Duration::from_secs(30), async || {
        let state = slurm.node_state(&rb1).await?;
        Ok((state.base == BaseState::Down && state.responding).then_some(state))
    })
    .await?;
    ensure!(
        down.drain && down.tag() == Some(tag.clone()),
        "drain and reason kept: {down:?}"
    );
    ensure!(
        flash_readiness(&down, Some(&record)) == Readiness::Wait(Waiting::Down),
        "{down:?}"
    );
    ensure!(
        decide_resume(&down, Some(&record)) == ResumeDecision::Resume,
        "{down:?}"
    );
    slurm.resume(&rb1).await?;
    poll("rb1 back in service", Duration::from_secs(60), async || {
        let state = slurm.node_state(&rb1).await?;
        Ok(matches!(state.service(), Service::InService { .. }).then_some(()))
    })
    .await?;

    // rb2 was not drained by us: DOWN "unexpectedly rebooted" is Slurm's,
    // and with no record of ours it is left for the operator.
    let rb2_down = poll("rb2 DOWN after its reboot", Duration::from_secs(30), async || {
        let state = slurm.node_state(&rb2).await?;
        Ok((state.base == BaseState::Down && state.responding).then_some(state))
    })
    .await?;
    ensure!(rb2_down.rebooted_unexpectedly() && !rb2_down.drain, "{rb2_down:?}");
    ensure!(decide_resume(&rb2_down, None) == ResumeDecision::LeaveAlone(LeaveAlone::NoDrainRecord));
    ensure!(
        matches!(
            decide_drain(&rb2_down, None, ROLLOUT),
            DrainDecision::Skip(LeaveAlone::Down { .. })
        ),
        "a DOWN node is not drained"
    );
    Ok(())
}

async fn run(cluster: &LoopbackSlurm) -> anyhow::Result<()> {
    let slurm = cluster.scheduler(StateSource::SinfoJson);
    let scontrol_view = cluster.scheduler(StateSource::ScontrolShowNode);
    let (wg1, wg2, wg3) = (name("wg1"), name("wg2"), name("wg3"));
    let tag = ReasonTag::maintenance(ROLLOUT);

    // Given a job running on wg1.
    let job = cluster.client(
        "sbatch",
        &[
            "--parsable",
            "-o",
            "/dev/null",
            "-w",
            "wg1",
            "-J",
            "training",
            "--wrap",
            "sleep 600",
        ],
    )?;
    poll("the job to run", Duration::from_secs(30), async || {
        let state = cluster.client("squeue", &["-h", "-j", &job, "-o", "%T"])?;
        Ok((state == "RUNNING").then_some(()))
    })
    .await?;
    let busy = slurm.node_state(&wg1).await?;
    ensure!(
        busy.service() == Service::InService { busy: true },
        "busy node: {busy:?}"
    );

    // When Waveguard drains it (decision, intent, effect, read-back).
    ensure!(decide_drain(&busy, None, ROLLOUT) == DrainDecision::Drain);
    let mut record = DrainRecord {
        rollout: ROLLOUT,
        node: "wg1".into(),
        phase: DrainPhase::DrainIntended,
    };
    slurm.drain(&wg1, &tag).await?;
    let draining = confirm_drain(&slurm, &wg1, &tag).await?;
    record.phase = DrainPhase::Held;
    ensure!(
        matches!(draining.service(), Service::Draining { alloc_cpus: 1.. }),
        "DRAINING while the job runs: {draining:?}"
    );
    // Replaying the drain decision after a crash finds it ours, not a new drain.
    ensure!(decide_drain(&draining, Some(&record), ROLLOUT) == DrainDecision::AlreadyOurs);
    // The two state sources agree on what matters.
    let via_scontrol = scontrol_view.node_state(&wg1).await?;
    ensure!(
        same_view(&draining, &via_scontrol),
        "sinfo {draining:?} vs scontrol {via_scontrol:?}"
    );

    // Then the flash waits while the job runs...
    for _ in 0..4 {
        let state = slurm.node_state(&wg1).await?;
        let readiness = flash_readiness(&state, Some(&record));
        ensure!(
            readiness == Readiness::Wait(Waiting::Jobs { alloc_cpus: 1 }),
            "flash allowed with a job running: {readiness:?} ({state:?})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // ...and no new job lands on the draining node.
    let blocked = cluster.client(
        "sbatch",
        &[
            "--parsable",
            "-o",
            "/dev/null",
            "-w",
            "wg1",
            "-J",
            "late",
            "--wrap",
            "true",
        ],
    )?;
    // When the job ends, the node is DRAINED (IDLE+DRAIN) and the flash may go.
    cluster.client("scancel", &[&job])?;
    let drained = poll("wg1 to be DRAINED", Duration::from_secs(60), async || {
        let state = slurm.node_state(&wg1).await?;
        Ok((flash_readiness(&state, Some(&record)) == Readiness::Ready).then_some(state))
    })
    .await?;
    ensure!(
        drained.base == BaseState::Idle && drained.drain && drained.responding,
        "{drained:?}"
    );
    let pending = cluster.client("squeue", &["-h", "-j", &blocked, "-o", "%T"])?;
    ensure!(pending == "PENDING", "a job started on the drained node: {pending}");
    cluster.client("scancel", &[&blocked])?;

    // (The flash happens here.) The node is healthy: resume it.
    ensure!(after_update(ROLLOUT, None) == orchestrator_scheduler::rules::AfterUpdate::Resume);
    ensure!(decide_resume(&drained, Some(&record)) == ResumeDecision::Resume);
    record.phase = DrainPhase::ResumeIntended;
    slurm.resume(&wg1).await.context("first resume")?;
    // A replayed resume (crash after the effect) is harmless and reads Done.
    let after = slurm.node_state(&wg1).await?;
    slurm
        .resume(&wg1)
        .await
        .with_context(|| format!("replayed resume of {after:?}"))?;
    // Slurm shows it `idle*` until its next ping; it then takes jobs again.
    let back = poll("wg1 back in service", Duration::from_secs(60), async || {
        let state = slurm.node_state(&wg1).await?;
        Ok(matches!(state.service(), Service::InService { .. }).then_some(state))
    })
    .await?;
    ensure!(back.reason.is_none(), "{back:?}");
    ensure!(decide_resume(&back, Some(&record)) == ResumeDecision::Done);

    // Given an operator's drain on wg2.
    cluster.client(
        "scontrol",
        &["update", "NodeName=wg2", "State=DRAIN", "Reason=bad DIMM, ticket 4711"],
    )?;
    let operator = slurm.node_state(&wg2).await?;
    // Waveguard skips it, shows their reason, and never resumes it.
    match decide_drain(&operator, None, ROLLOUT) {
        DrainDecision::Skip(LeaveAlone::DrainedByOther { reason: Some(r) }) => {
            ensure!(
                r.text == "bad DIMM, ticket 4711" && r.set_by.as_deref() == Some("root"),
                "{r:?}"
            );
        }
        other => bail!("operator drain not skipped: {other:?}"),
    }
    ensure!(decide_resume(&operator, None) == ResumeDecision::LeaveAlone(LeaveAlone::NoDrainRecord));

    // Given wg3 drained by Waveguard, then re-drained by an operator.
    let wg3_record = DrainRecord {
        rollout: ROLLOUT,
        node: "wg3".into(),
        phase: DrainPhase::Held,
    };
    slurm.drain(&wg3, &tag).await?;
    confirm_drain(&slurm, &wg3, &tag).await?;
    // It rebooted while drained (slurmd reports a reboot): it comes back
    // drained and still ours (ReturnToService=2 keeps a drain).
    restart_slurmd_as_rebooted(cluster, "wg3")?;
    let rebooted = poll(
        "wg3 to register after its reboot",
        Duration::from_secs(30),
        async || {
            let state = slurm.node_state(&wg3).await?;
            Ok(state.responding.then_some(state))
        },
    )
    .await?;
    ensure!(
        flash_readiness(&rebooted, Some(&wg3_record)) == Readiness::Ready,
        "{rebooted:?}"
    );
    cluster.client(
        "scontrol",
        &[
            "update",
            "NodeName=wg3",
            "State=DRAIN",
            "Reason=operator: keep out, RMA",
        ],
    )?;
    let taken = slurm.node_state(&wg3).await?;
    ensure!(
        matches!(
            flash_readiness(&taken, Some(&wg3_record)),
            Readiness::Abandon(LeaveAlone::DrainedByOther { .. })
        ),
        "flash allowed on an operator's drain: {taken:?}"
    );
    ensure!(matches!(
        decide_resume(&taken, Some(&wg3_record)),
        ResumeDecision::LeaveAlone(_)
    ));

    // The periodic check over the whole cluster: wg1's record is closed,
    // wg3's drain is the operator's now; nothing is resumed.
    let states = slurm
        .all_states()
        .await?
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
    let orphans = orphaned_drains(&[wg3_record], &Default::default(), &states);
    ensure!(
        orphans.len() == 1 && matches!(orphans[0].decision, ResumeDecision::LeaveAlone(_)),
        "{orphans:?}"
    );

    // Then the operators' drains are exactly as they left them.
    for (node, reason) in [(&wg2, "bad DIMM, ticket 4711"), (&wg3, "operator: keep out, RMA")] {
        let state = slurm.node_state(node).await?;
        ensure!(
            state.drain && state.reason.as_ref().is_some_and(|r| r.text == reason),
            "{node} changed: {state:?}"
        );
    }
    Ok(())
}

/// Kills the node's slurmd and starts it again with `-b` (report a reboot),
/// the closest a shared host gets to rebooting one node.
fn restart_slurmd_as_rebooted(cluster: &LoopbackSlurm, node: &str) -> anyhow::Result<()> {
    let dir = cluster.dir.path();
    let pid_file = dir.join(format!("slurmd-{node}.launcher.pid"));
    let pid = std::fs::read_to_string(&pid_file)?.trim().to_owned();
    Command::new("kill").arg(&pid).status()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Command::new("kill").args(["-0", &pid]).status()?.success() {
        ensure!(Instant::now() < deadline, "slurmd {pid} did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("slurmd-{node}.stdout")))?;
    let child = Command::new("setsid")
        .args(["slurmd", "-D", "-b", "-N", node, "-f"])
        .arg(&cluster.conf)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    std::fs::write(&pid_file, child.id().to_string())?;
    Ok(())
}

/// The fields both state sources report.
fn same_view(a: &NodeState, b: &NodeState) -> bool {
    a.name == b.name
        && a.base == b.base
        && a.drain == b.drain
        && a.responding == b.responding
        && a.alloc_cpus == b.alloc_cpus
        && a.reason.as_ref().map(|r| (&r.text, &r.set_by)) == b.reason.as_ref().map(|r| (&r.text, &r.set_by))
}
