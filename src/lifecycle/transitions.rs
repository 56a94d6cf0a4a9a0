//! The named transitions of a job: each function returns a [`Transition`], the state the
//! writer expects to find ([`Expect`], checked by the store's compare-and-set) and the
//! [`Change`] to apply. They are pure: the caller reads the row, calls one, and hands the
//! result to the store, which refuses a stale guard (a conflict) and an illegal move
//! ([`super::change::apply`]).

use std::time::Duration;

use crate::api::{AttemptStatus, JobPhase, ScheduleState, WaitReason};

use super::change::{Change, LaunchClock, Transition};
use super::clock::backoff;
use super::deadlines::deadlines;
use super::edges::Expect;
use super::outcome::{Outcome, Workload};
use super::reason::{Failure, FailureReason, Reason};
use super::record::JobRow;
use super::rules::{self, DEFAULT_RULE, Verdict};
use super::tasks::{current_task, has_next_task, stored_message, task_attempt};

// ---- operator side ---------------------------------------------------------------------------

/// A scheduling pass admits the job: a new job (Pending + Waiting) or a relaunch
/// (AliveWaiting) takes a launch slot.
pub fn admit(row: &JobRow) -> Transition {
    admit_onto(row, None)
}

/// [`admit`] onto a pool (its quota is held there, its Pods go there: `placement`), or onto
/// none (a queue without pools).
pub fn admit_onto(row: &JobRow, placement: Option<crate::resources::Placement>) -> Transition {
    let (expect, message) = match row.schedule_state {
        // A pipeline's next task: its first launch, not a relaunch.
        ScheduleState::AliveWaiting if row.phase == JobPhase::Starting => (
            Expect::schedule(&[ScheduleState::AliveWaiting]),
            "admitted: launching",
        ),
        ScheduleState::AliveWaiting => (
            Expect::schedule(&[ScheduleState::AliveWaiting]),
            "admitted: relaunching",
        ),
        _ => (
            Expect::exactly(JobPhase::Pending, ScheduleState::Waiting),
            "admitted: starting its job controller process",
        ),
    };
    let mut change = Change::because(Reason::Scheduled).message(message);
    change.schedule = Some(ScheduleState::Launching);
    change.placement = Some(placement);
    Transition::new(expect, change)
}

/// A job controller process (pid, start time in clock ticks) was started for a live job: record
/// it; the first one also moves Pending -> Submitted. The process may already have moved the job
/// on, so Submitted is only written over Pending.
pub fn controller_started(row: &JobRow, pid: i32, start_time: u64) -> Transition {
    let mut change = Change::because(Reason::ControllerStarted);
    change.controller = Some(Some((pid, start_time)));
    change.controller_started = true;
    let expect = if row.phase == JobPhase::Pending {
        change.phase = Some(JobPhase::Submitted);
        change.message = Some(format!("job controller process started (pid {pid})"));
        Expect {
            phases: vec![JobPhase::Pending],
            schedule: ScheduleState::LIVE.to_vec(),
        }
    } else {
        Expect {
            phases: vec![row.phase],
            schedule: ScheduleState::LIVE.to_vec(),
        }
    };
    Transition::new(expect, change)
}

/// No job controller process could be started for the job: it ends FailedController.
pub fn controller_start_failed(row: &JobRow, error: &str) -> Transition {
    fail(
        row,
        JobPhase::FailedController,
        FailureReason::ControllerStartFailed,
        format!("could not start a job controller process: {error}"),
    )
}

/// The job's recorded controller process exited early and will be resumed: clear it, and count
/// the crash when `counted` (it died while its operator lived; one found dead after the operator
/// itself went away, a rollout or a node loss, is a hand-over, not a crash). The schedule state
/// does not change.
pub fn controller_resumed(row: &JobRow, counted: bool) -> Transition {
    let mut change = Change::because(Reason::ControllerExited);
    change.controller = Some(None);
    change.controller_crashed = counted;
    Transition::new(Expect::schedule(&ScheduleState::LIVE), change).with_row_phase(row)
}

/// The job's controller exited `crashes` times before the job was Done: FailedController.
pub fn controller_gave_up(row: &JobRow, crashes: i64) -> Transition {
    let mut t = fail(
        row,
        JobPhase::FailedController,
        FailureReason::ControllerCrashed,
        format!(
            "the job controller process exited {crashes} times before finishing; see `managed-jobs logs {} --controller`",
            row.key()
        ),
    );
    t.change.controller = Some(None);
    t.change.controller_crashed = true;
    t
}

/// A cancel of a job that holds no slot (Pending + Inactive/Waiting, or Suspended): Cancelled at once,
/// no process runs. A conflict means it was admitted meanwhile; its controller cancels it.
pub fn cancel_queued(_row: &JobRow) -> Transition {
    Transition::new(
        Expect {
            phases: vec![JobPhase::Pending, JobPhase::Suspended],
            schedule: vec![ScheduleState::Inactive, ScheduleState::Waiting],
        },
        Change::because(Reason::Cancelled)
            .to(JobPhase::Cancelled, ScheduleState::Done)
            .message("cancelled before it started; no process was run"),
    )
}

/// The spec fails validation at submission: FailedPrecheck, nothing runs.
pub fn invalid_spec(row: &JobRow, why: String) -> Transition {
    fail(
        row,
        JobPhase::FailedPrecheck,
        FailureReason::InvalidSpec,
        why,
    )
}

// ---- job controller side ---------------------------------------------------------------------

/// The attempt a job controller works on: the row's attempt, at least 1.
pub fn current_attempt(row: &JobRow) -> i32 {
    row.current_attempt()
}

/// The first launch begins: Starting, with the launch intent of attempt 1 in the same write.
pub fn starting(row: &JobRow, attempt: i32) -> Transition {
    let shown = task_attempt(row, attempt);
    let mut change =
        Change::because(Reason::Starting).message(format!("launching attempt {shown}"));
    change.phase = Some(JobPhase::Starting);
    change.attempt = Some(attempt);
    change.launched_attempt = Some(attempt);
    change.launch_clock = Some(LaunchClock::Start);
    Transition::new(Expect::exactly(row.phase, ScheduleState::Launching), change)
}

/// The create of `attempt`'s workload is about to be issued. Recorded before the create, so a
/// crash in between is never a second launch of the same attempt. Not shown in the status.
pub fn launch_intent(row: &JobRow, attempt: i32) -> Transition {
    let mut change = Change::because(Reason::Launch);
    change.launched_attempt = Some(attempt);
    change.launch_clock = Some(LaunchClock::Start);
    Transition::new(Expect::unchanged(row), change)
}

/// The attempt's workload runs: Running + Alive.
pub fn running(row: &JobRow, attempt: i32, workload: Workload) -> Transition {
    let shown = task_attempt(row, attempt);
    let nodes = current_task(row).nodes.map(|n| n.max(1));
    let message = match (row.phase, &workload) {
        (_, Workload::Pod(pod)) if nodes.is_some_and(|n| n > 1) => format!(
            "running attempt {shown} on {} nodes (rank 0: {pod})",
            nodes.unwrap_or(1)
        ),
        (_, Workload::Pod(pod)) => format!("running attempt {shown} in {pod}"),
        (JobPhase::Recovering, _) => format!("running attempt {shown} (relaunched)"),
        _ => format!("running attempt {shown}"),
    };
    let mut change = Change::because(Reason::Running)
        .to(JobPhase::Running, ScheduleState::Alive)
        .message(message);
    let task = current_task(row);
    if task.nodes.is_some() {
        let size = task.size();
        change.ready_nodes = Some(Some(format!("{size}/{size}")));
    }
    change.attempt = Some(attempt);
    change.workload = Some(Some(workload));
    change.started_now = true;
    if row.node_wait_since_ms.is_some() {
        change.node_wait = Some(LaunchClock::Clear);
    }
    // Progress: crashes counted before it belong to an earlier incarnation of trouble, so a job
    // that runs for weeks is never failed by crashes spread over them.
    change.reset_crashes = row.controller_crashes > 0;
    if row.launch_timeouts > 0 {
        change.launch_timeouts = Some(0);
    }
    Transition::new(Expect::unchanged(row), change)
}

/// The attempt's Pod waits for a node: waiting on the cluster must not hold a launch slot, so
/// the job keeps its run slot only (Launching -> Alive, phase unchanged, or Starting when the
/// first launch was not recorded yet).
pub fn unschedulable(row: &JobRow, workload: Option<Workload>, message: String) -> Transition {
    let mut change = Change::because(Reason::Unschedulable).message(message);
    change.schedule = Some(ScheduleState::Alive);
    // Its Pod exists, so its launch began, even if the store does not know it yet (a store
    // rebuilt from a status that lagged behind the Pod): a Pending job is never Alive.
    if matches!(row.phase, JobPhase::Pending | JobPhase::Submitted) {
        change.phase = Some(JobPhase::Starting);
    }
    if workload.is_some() {
        change.workload = Some(workload);
    }
    change.launch_clock = Some(LaunchClock::Clear);
    if row.node_wait_since_ms.is_none() {
        change.node_wait = Some(LaunchClock::Start);
    }
    Transition::new(Expect::unchanged(row), change)
}

/// A multi-node job's members that run changed while its attempt starts (`ready`: `2/4`):
/// `status.readyNodes` says so; nothing else changes.
pub fn nodes_ready(row: &JobRow, ready: String) -> Transition {
    let mut change = Change::because(Reason::WaitingToStart);
    change.ready_nodes = Some(Some(ready));
    Transition::new(Expect::unchanged(row), change)
}

/// The attempt's workload was deleted by someone else and is terminating: it no longer counts
/// as running (a running job shows Recovering); it is relaunched once it is gone.
pub fn terminating(row: &JobRow, workload: Option<Workload>, message: String) -> Transition {
    let mut change = Change::because(Reason::PodTerminating).message(message);
    if row.schedule_state == ScheduleState::Alive {
        change.phase = Some(JobPhase::Recovering);
    }
    if workload.is_some() {
        change.workload = Some(workload);
    }
    Transition::new(Expect::unchanged(row), change)
}

/// A stop waits for `waiting_on` (e.g. "Pod x-1-1 on node n1 is terminating"): say so in the
/// job's message; nothing else changes. None when the message says so already.
pub fn stopping(row: &JobRow, waiting_on: &str) -> Option<Transition> {
    let verb = if row.phase == JobPhase::Cancelling {
        "cancelling"
    } else {
        "stopping"
    };
    let message = format!("{verb}: waiting for {waiting_on}");
    (stored_message(row, &message) != row.message).then(|| {
        Transition::new(
            Expect::unchanged(row),
            Change::because(Reason::Stopping).message(message),
        )
    })
}

/// The attempt's workload exists but does not run yet; `message` says what it waits for (e.g.
/// "Pod x-1-1: container main: ImagePullBackOff: ..."). Starts the launch clock when it was
/// stopped (the Pod was bound after waiting for a node).
pub fn waiting_to_start(row: &JobRow, message: String) -> Transition {
    let mut change = Change::because(Reason::WaitingToStart).message(message);
    if row.launched_at_ms.is_none() {
        change.launch_clock = Some(LaunchClock::Start);
    }
    if row.node_wait_since_ms.is_some() {
        change.node_wait = Some(LaunchClock::Clear);
    }
    Transition::new(Expect::unchanged(row), change)
}

/// `reason: message`, or whichever of the two is not empty (empty when both are): what a
/// workload waits on, as said in messages.
pub fn reason_and_message(reason: &str, message: &str) -> String {
    match (reason.is_empty(), message.is_empty()) {
        (_, true) => reason.to_string(),
        (true, false) => message.to_string(),
        (false, false) => format!("{reason}: {message}"),
    }
}

/// The attempt's workload did not start within its launch deadline (`timeout`); it has been
/// removed. The job goes back to the launch queue after a back-off (a new attempt; neither a
/// restart nor a recovery is counted), or, at the `max_timeouts`-th timeout in a row, ends
/// FailedNoResource. `reason`/`message` are what the workload last waited on (e.g.
/// `ImagePullBackOff` and the kubelet's message, or the operator's own `CreateFailed`; None and
/// empty when unknown): the failure reason names it, else `LaunchTimeout`.
#[allow(clippy::too_many_arguments)]
pub fn launch_timed_out(
    row: &JobRow,
    attempt: i32,
    reason: Option<Failure>,
    message: &str,
    timeout: Duration,
    max_timeouts: i32,
    now_ms: i64,
    backoff_base: Duration,
) -> Transition {
    let timeouts = row.launch_timeouts + 1;
    let shown = task_attempt(row, attempt);
    let reason_text = reason.as_ref().map(Failure::as_str).unwrap_or("");
    let waited_on = match reason_and_message(reason_text, message) {
        w if w.is_empty() => w,
        w => format!(" (last: {w})"),
    };
    let what = format!(
        "attempt {shown} did not start within {} s{waited_on}",
        timeout.as_secs()
    );
    let mut change = if timeouts >= max_timeouts {
        let mut c = Change::because(Reason::Failed)
            .to(JobPhase::FailedNoResource, ScheduleState::Done)
            .message(format!(
                "{what}; {timeouts} launch timeouts in a row, giving up"
            ));
        c.failure_reason = Some(Some(
            reason.unwrap_or(Failure::Operator(FailureReason::LaunchTimeout)),
        ));
        c
    } else {
        let wait = backoff(backoff_base, timeouts);
        let mut c = Change::because(Reason::LaunchTimedOut)
            .to(JobPhase::Recovering, ScheduleState::Alive)
            .message(format!(
                "{what}; its workload was removed, relaunching in {:.1} s (launch timeout {timeouts} of {max_timeouts})",
                wait.as_secs_f64()
            ));
        c.attempt = Some(attempt + 1);
        c.backoff_until_ms = Some(Some(now_ms + wait.as_millis() as i64));
        c
    };
    change.launch_timeouts = Some(timeouts);
    change.launch_clock = Some(LaunchClock::Clear);
    change.node_wait = Some(LaunchClock::Clear);
    Transition::new(Expect::unchanged(row), change)
}

/// The attempt's Pod waited for a node past its launch timeout (`timeout`) while other jobs
/// wait for a run slot; it has been removed. The job gives its run slot back: it goes to the
/// back of the queue of its priority (Pending + Waiting, the next attempt, after a back-off,
/// its job controller released), so admissible jobs behind it run; or, at the
/// `max_timeouts`-th launch timeout in a row, it ends FailedNoResource (failureReason
/// `Unschedulable`). `waiting_jobs` is how many jobs wait for a run slot; `message` what the
/// scheduler said.
#[allow(clippy::too_many_arguments)]
pub fn node_wait_timed_out(
    row: &JobRow,
    attempt: i32,
    message: &str,
    timeout: Duration,
    max_timeouts: i32,
    now_ms: i64,
    backoff_base: Duration,
) -> Transition {
    let timeouts = row.launch_timeouts + 1;
    let shown = task_attempt(row, attempt);
    let what = format!(
        "attempt {shown}: no node took its Pod within {} s ({message}) while other jobs wait for a run slot",
        timeout.as_secs()
    );
    let mut change = if timeouts >= max_timeouts {
        let mut c = Change::because(Reason::Failed)
            .to(JobPhase::FailedNoResource, ScheduleState::Done)
            .message(format!(
                "{what}; {timeouts} launch timeouts in a row, giving up"
            ));
        c.failure_reason = Some(Some(FailureReason::Unschedulable.into()));
        c
    } else {
        let wait = backoff(backoff_base, timeouts);
        let mut c = Change::because(Reason::Requeued)
            .to(JobPhase::Pending, ScheduleState::Waiting)
            .message(format!(
                "{what}; its Pod was removed and its run slot given back: queued again, at the back, in {:.1} s (launch timeout {timeouts} of {max_timeouts})",
                wait.as_secs_f64()
            ));
        c.attempt = Some(attempt + 1);
        c.backoff_until_ms = Some(Some(now_ms + wait.as_millis() as i64));
        c.requeue = true;
        // Its job controller leaves; the next admission starts a new one.
        c.controller = Some(None);
        c.workload = Some(None);
        c
    };
    change.launch_timeouts = Some(timeouts);
    change.launch_clock = Some(LaunchClock::Clear);
    change.node_wait = Some(LaunchClock::Clear);
    Transition::new(Expect::unchanged(row), change)
}

/// What a queued job waits for, as its message says: the slot that is really missing, from the
/// slots in use (`launching` of `launch_cap`, `alive` of `run_cap`) and whether some of the run
/// slots are held by Pods waiting for a node (`node_waits` of them). The sentence holds no
/// count that moves with each admission or each Pod (every waiting job of a queue is told it,
/// and each change of it is an API write per job): only the caps and whether Pods wait.
pub fn queued_message(
    launching: usize,
    launch_cap: usize,
    alive: usize,
    run_cap: usize,
    node_waits: usize,
) -> String {
    if alive >= run_cap {
        let held = if node_waits > 0 {
            ", some by Pods waiting for a node (each given back after its launch timeout)"
        } else {
            ""
        };
        format!("waiting for a run slot: all {run_cap} in use{held}")
    } else if launching >= launch_cap {
        format!("waiting for a launch slot: all {launch_cap} in use")
    } else {
        "queued: admitted at the next scheduling pass".into()
    }
}

/// A Waiting job's message says what it really waits for (`message`, from [`queued_message`]
/// or `crate::queues::blocked`) and why (`reason`, its `Admitted` condition's); nothing else
/// changes.
pub fn queued(reason: WaitReason, message: String) -> Transition {
    let mut change = Change::because(Reason::Queued).message(message);
    change.wait_reason = Some(reason);
    Transition::new(
        Expect::exactly(JobPhase::Pending, ScheduleState::Waiting),
        change,
    )
}

/// A restart back-off is over: ask for a launch slot (Recovering + Alive -> AliveWaiting).
pub fn backoff_over(row: &JobRow) -> Transition {
    let shown = task_attempt(row, row.current_attempt());
    let mut change = Change::because(Reason::WaitingForLaunchSlot).message(format!(
        "waiting for a launch slot to start attempt {shown}"
    ));
    change.schedule = Some(ScheduleState::AliveWaiting);
    change.backoff_until_ms = Some(None);
    Transition::new(
        Expect::exactly(JobPhase::Recovering, ScheduleState::Alive),
        change,
    )
}

/// What an ended attempt means, decided from the row as read (`docs/design.md`, "Failures" and
/// "Failure rules"): the first failure rule of the current task that matches the outcome
/// decides ([`rules::decide`]), else the default. Success ends the job (or starts a pipeline's
/// next task); `FailJob` fails it at once; `Restart` restarts it with a back-off ([`backoff`]
/// from `backoff_base`, against `maxRestartsOnErrors`) or fails it; `Recover` relaunches it
/// (the first at once, later ones after a back-off; a new attempt waits for a launch slot,
/// keeping its run slot) unless `maxRecoveries` is spent; `Ignore` relaunches it as a recovery
/// does, counting neither, within `maxIgnored`. Every message names the rule that decided
/// (`rule default` when none), and the change records the attempt (`status.attempts[]`).
/// `now_ms` is the current time (ms since epoch).
pub fn after_outcome(
    row: &JobRow,
    attempt: i32,
    outcome: &Outcome,
    now_ms: i64,
    backoff_base: Duration,
) -> Transition {
    let expect = Expect::unchanged(row);
    let shown = task_attempt(row, attempt);
    let task = current_task(row);
    let budget = task.recovery;
    let decision = rules::decide(
        task.failure_policy,
        outcome,
        row.ignored_count,
        budget.max_ignored(),
    );
    let record = AttemptStatus {
        attempt,
        rank: outcome.evidence().and_then(|e| e.rank).map(|r| r as i32),
        task: task.name.map(str::to_string),
        exit_code: outcome.exit_code(),
        reason: outcome.reason().to_string(),
        rule: decision.rule_label().to_string(),
        action: decision.verdict.as_str().to_string(),
        finished_at: None,
    };
    // How the message names what decided: `rule NAME`, or `rule default` (with why a rule that
    // matched did not decide).
    let by = match (&decision.rule, &decision.note) {
        (Some((_, name)), _) => format!("rule {name}"),
        (None, Some(note)) => format!("rule default: {note}"),
        (None, None) => format!("rule {DEFAULT_RULE}"),
    };
    // What happened to the attempt, as messages say it; its exit code and failure reason.
    let (code, reason, what) = match outcome {
        Outcome::Failed {
            code,
            reason,
            detail,
            ..
        } => (
            Some(*code),
            reason.clone(),
            match detail {
                Some(d) => format!("failed: {d}"),
                None => format!("run exited with code {code}"),
            },
        ),
        Outcome::SetupFailed {
            code,
            reason,
            detail,
            ..
        } => (
            Some(*code),
            reason.clone(),
            match detail {
                Some(d) => format!("setup failed: {d}"),
                None => format!("setup exited with code {code}"),
            },
        ),
        Outcome::Refused {
            reason, message, ..
        } => (
            None,
            reason.clone(),
            format!("was refused by its node: {reason} ({message})"),
        ),
        Outcome::DeadlineExceeded { code, message, .. } => {
            (*code, outcome.reason().to_string(), message.clone())
        }
        Outcome::Lost { reason, .. } => (
            None,
            outcome.reason().to_string(),
            format!("was lost ({reason})"),
        ),
        Outcome::Succeeded | Outcome::Invalid { .. } => (None, String::new(), String::new()),
    };
    let setup = matches!(outcome, Outcome::SetupFailed { .. });
    let mut change = match (outcome, decision.verdict) {
        (Outcome::Succeeded, _) if has_next_task(row) => {
            let next = row.spec.task(row.task_index as usize + 1);
            let mut c = Change::because(Reason::TaskSucceeded)
                .to(JobPhase::Starting, ScheduleState::AliveWaiting)
                .message(format!(
                    "succeeded on attempt {shown}; waiting for a launch slot to start {}",
                    next.label().unwrap_or_default()
                ));
            c.task_index = Some(row.task_index + 1);
            c.attempt = Some(attempt + 1);
            c.restart_count = Some(0);
            c.recovery_count = Some(0);
            c.ignored_count = Some(0);
            // The job's exit code and failure are its current task's: none yet.
            c.exit_code = Some(None);
            c.failure_reason = Some(None);
            c.workload = Some(None);
            c.backoff_until_ms = Some(None);
            c.launch_timeouts = Some(0);
            c.launch_clock = Some(LaunchClock::Clear);
            c
        }
        (Outcome::Succeeded, _) => {
            let mut c = Change::because(Reason::Succeeded)
                .to(JobPhase::Succeeded, ScheduleState::Done)
                .message(format!("succeeded on attempt {shown}"));
            c.exit_code = Some(Some(0));
            c.failure_reason = Some(None);
            c
        }
        (Outcome::Invalid { reason, message }, _) => {
            let mut c = Change::because(Reason::Failed)
                .to(JobPhase::FailedPrecheck, ScheduleState::Done)
                .message(format!("attempt {shown} cannot start: {message}"));
            c.failure_reason = Some(Some(Failure::Workload(reason.clone())));
            c
        }
        (_, Verdict::FailJob) => {
            let phase = if setup {
                JobPhase::FailedSetup
            } else {
                JobPhase::Failed
            };
            let mut c = Change::because(Reason::Failed)
                .to(phase, ScheduleState::Done)
                .message(format!(
                    "attempt {shown} {what} ({reason}); {by} says FailJob: the job fails without a relaunch"
                ));
            c.exit_code = Some(code);
            c.failure_reason = Some(Some(FailureReason::FailureRule.into()));
            c
        }
        (_, Verdict::Restart | Verdict::Succeeded) => {
            let max = budget.max_restarts_on_errors;
            let mut c = if row.restart_count < max {
                let restart = row.restart_count + 1;
                let wait = backoff(backoff_base, restart);
                let mut c = Change::because(Reason::Restarting)
                    .to(JobPhase::Recovering, ScheduleState::Alive)
                    .message(format!(
                        "attempt {shown} {what}; restarting in {:.1} s (restart {restart} of {max}, {by})",
                        wait.as_secs_f64()
                    ));
                c.attempt = Some(attempt + 1);
                c.restart_count = Some(restart);
                c.backoff_until_ms = Some(Some(now_ms + wait.as_millis() as i64));
                c
            } else {
                let phase = if setup {
                    JobPhase::FailedSetup
                } else {
                    JobPhase::Failed
                };
                Change::because(Reason::Failed)
                    .to(phase, ScheduleState::Done)
                    .message(format!(
                        "attempt {shown} {what}{}; restarts exhausted ({max} allowed, {by})",
                        if code.is_some() {
                            format!(" ({reason})")
                        } else {
                            String::new()
                        }
                    ))
            };
            c.exit_code = Some(code);
            c.failure_reason = Some(Some(Failure::Workload(reason.clone())));
            c
        }
        (_, Verdict::Recover) => match budget.max_recoveries {
            Some(max) if row.recovery_count >= max => {
                let mut c = Change::because(Reason::Failed)
                    .to(JobPhase::Failed, ScheduleState::Done)
                    .message(format!(
                        "attempt {shown} {what} and the recovery budget is spent (maxRecoveries {max}, {by}); last cause: {reason}"
                    ));
                c.exit_code = Some(code);
                c.failure_reason = Some(Some(FailureReason::RecoveryBudgetSpent.into()));
                c
            }
            _ => {
                // The first recovery relaunches at once (a preemption is not the job's fault);
                // each further one backs off, so no job relaunches in a tight loop.
                let recovery = row.recovery_count + 1;
                let of = budget
                    .max_recoveries
                    .map_or(String::new(), |max| format!(" of {max}"));
                let mut c = relaunch(
                    Reason::Recovering,
                    recovery,
                    &format!("recovering: attempt {shown} {what}"),
                    &format!("recovery {recovery}{of}, {by}"),
                    now_ms,
                    backoff_base,
                );
                c.attempt = Some(attempt + 1);
                c.recovery_count = Some(recovery);
                if code.is_some() {
                    c.exit_code = Some(code);
                }
                c
            }
        },
        (_, Verdict::Ignore) => {
            let ignored = row.ignored_count + 1;
            let mut c = relaunch(
                Reason::Ignored,
                ignored,
                &format!("attempt {shown} {what}; ignored"),
                &format!("ignored {ignored} of {}, {by}", budget.max_ignored()),
                now_ms,
                backoff_base,
            );
            c.attempt = Some(attempt + 1);
            c.ignored_count = Some(ignored);
            if code.is_some() {
                c.exit_code = Some(code);
            }
            c
        }
    };
    change.attempt_record = Some(record);
    Transition::new(expect, change)
}

/// A relaunch that counts its `n`-th (a recovery, or an ignored attempt): the first at once
/// (Recovering + AliveWaiting), each further one after the back-off of `n - 1`
/// (Recovering + Alive until `backoff_until_ms`). `head` says what happened, `count` which
/// relaunch it is and what decided it.
fn relaunch(
    reason: Reason,
    n: i32,
    head: &str,
    count: &str,
    now_ms: i64,
    backoff_base: Duration,
) -> Change {
    if n <= 1 {
        return Change::because(reason)
            .to(JobPhase::Recovering, ScheduleState::AliveWaiting)
            .message(format!("{head}; waiting for a launch slot ({count})"));
    }
    let wait = backoff(backoff_base, n - 1);
    let mut c = Change::because(reason)
        .to(JobPhase::Recovering, ScheduleState::Alive)
        .message(format!(
            "{head}; relaunching in {:.1} s ({count})",
            wait.as_secs_f64()
        ));
    c.backoff_until_ms = Some(Some(now_ms + wait.as_millis() as i64));
    c
}

/// The operator's claim on the job's namespace lapsed (`super::claim`: no renewal for the
/// claim's duration; another operator may own the job now and relaunch it) while `attempt`'s
/// local workload ran: its processes were stopped (a workload of this state dir, which another
/// operator could not adopt, must not run beside its relaunch). Recovering + AliveWaiting: a
/// relaunch counted in no budget (the workload did not fail, its owner's claim did), launched
/// once the claim is renewed; if another operator took the job, this row is left to it.
pub fn claim_lapsed(row: &JobRow, attempt: i32) -> Transition {
    let shown = task_attempt(row, attempt);
    let mut change = Change::because(Reason::ClaimLapsed)
        .to(JobPhase::Recovering, ScheduleState::AliveWaiting)
        .message(format!(
            "attempt {shown} was stopped: this operator's claim on namespace {} lapsed (not renewed within its duration: the API unreachable, or the operator gone), so another operator may own the job; relaunched, counted in no budget, once the claim is renewed",
            row.namespace
        ));
    change.attempt = Some(attempt + 1);
    change.workload = Some(None);
    Transition::new(Expect::unchanged(row), change)
}

/// Ends the job in failure `phase` (a terminal failure phase) for `reason`.
pub fn fail(row: &JobRow, phase: JobPhase, reason: FailureReason, message: String) -> Transition {
    debug_assert!(phase.is_failure(), "{phase} is not a failure phase");
    let mut change = Change::because(Reason::Failed)
        .to(phase, ScheduleState::Done)
        .message(message);
    change.failure_reason = Some(Some(reason.into()));
    Transition::new(Expect::schedule(&[row.schedule_state]), change)
}

/// The job ran past `spec.activeDeadlineSeconds`; its workload is stopped, then this is written.
pub fn deadline_exceeded(row: &JobRow) -> Transition {
    let message = match deadlines(row) {
        (Some((j, _)), Some((t, secs))) if t < j => {
            format!("stopped: the task ran past its activeDeadlineSeconds ({secs} s)")
        }
        (None, Some((_, secs))) => {
            format!("stopped: the task ran past its activeDeadlineSeconds ({secs} s)")
        }
        (Some((_, secs)), _) => {
            format!("stopped: the job ran past activeDeadlineSeconds ({secs} s)")
        }
        (None, None) => "stopped: the job ran past its deadline".into(),
    };
    fail(
        row,
        JobPhase::Failed,
        FailureReason::DeadlineExceeded,
        message,
    )
}

/// A persisted cancel request reached the job's controller: Cancelling (schedule unchanged),
/// its message saying what the stop waits on: the workload's processes, or its Pod, given
/// `grace` ([`super::deadlines::stop_grace`]) between SIGTERM and SIGKILL to save their work.
pub fn cancelling(row: &JobRow, grace: Duration) -> Transition {
    let secs = grace.as_secs_f64();
    let message = if row.workload.is_none() && row.launched_attempt == 0 {
        "cancelling: stopping the workload".to_string()
    } else if current_task(row).template.is_some() {
        format!(
            "cancelling: deleting the workload's Pod: SIGTERM, then SIGKILL after its grace period of {secs} s unless it exits"
        )
    } else {
        format!(
            "cancelling: stopping the workload's processes: SIGTERM, then SIGKILL after {secs} s unless they exit"
        )
    };
    let mut change = Change::because(Reason::Cancelling).message(message);
    change.phase = Some(JobPhase::Cancelling);
    Transition::new(Expect::unchanged(row), change)
}

/// The cancelled job's workload is gone: Cancelled + Done.
pub fn cancelled(row: &JobRow) -> Transition {
    let mut change = Change::because(Reason::Cancelled)
        .to(JobPhase::Cancelled, ScheduleState::Done)
        .message("cancelled; the workload is stopped");
    // Cancelled is why it ended, not an earlier attempt's failure it was restarting from.
    change.failure_reason = Some(None);
    Transition::new(
        Expect::exactly(JobPhase::Cancelling, row.schedule_state),
        change,
    )
}

// ---- stopping without failing: suspend, resume, preemption -----------------------------------

/// Who suspended the job, as its messages and its `Suspended` condition say it.
fn suspended_by(row: &JobRow) -> String {
    match &row.suspended_by {
        Some(who) => format!("spec.suspend set by {who}"),
        None => "spec.suspend".to_string(),
    }
}

/// `spec.suspend` holds a job that holds no run slot (Pending + Inactive/Waiting): Suspended +
/// Inactive at once, out of the queue, its place (`queued_at_ms`) kept. A conflict means it was
/// admitted meanwhile: its controller stops it ([`suspended`]).
pub fn suspend_queued(row: &JobRow) -> Transition {
    Transition::new(
        Expect {
            phases: vec![JobPhase::Pending],
            schedule: vec![ScheduleState::Inactive, ScheduleState::Waiting],
        },
        Change::because(Reason::Suspended)
            .to(JobPhase::Suspended, ScheduleState::Inactive)
            .message(format!(
                "suspended ({}) before it was admitted: it keeps its place in queue {} and waits again once spec.suspend is false",
                suspended_by(row),
                row.queue
            )),
    )
}

/// `spec.suspend` went back to false: the suspended job waits again (Pending + Waiting) in the
/// place it had (`queued_at_ms`: its creation), ahead of the jobs created after it; its attempt,
/// budgets and history are as the suspend left them.
pub fn resumed(row: &JobRow) -> Transition {
    let mut change = Change::because(Reason::Resumed)
        .to(JobPhase::Pending, ScheduleState::Waiting)
        .message(format!(
            "resumed (spec.suspend is false): waiting to be admitted in queue {}, ahead of the jobs created after it",
            row.queue
        ));
    change.wait_reason = Some(WaitReason::Queued);
    Transition::new(
        Expect::exactly(JobPhase::Suspended, ScheduleState::Inactive),
        change,
    )
}

/// What a stop that requeues the job (a suspend, a preemption) writes besides its phase and
/// schedule state: the stopped attempt's record (`action` Suspended or Preempted, only if it was
/// launched), the next attempt (not launched: the next admission launches it), no workload, no
/// controller (it exits; the next admission starts one), the launch clocks cleared, the
/// deadline clocks restarted at the next run (as batch/v1 resets a suspended Job's
/// `startTime`). Restart, recovery and ignore counts and the back-off are untouched: the job
/// did not fail.
fn requeued_by_stop(row: &JobRow, reason: Reason, action: &str, message: String) -> Change {
    let attempt = row.current_attempt();
    let launched = row.launched_attempt >= attempt;
    let (phase, schedule) = if reason == Reason::Suspended {
        (JobPhase::Suspended, ScheduleState::Inactive)
    } else {
        (JobPhase::Pending, ScheduleState::Waiting)
    };
    let mut change = Change::because(reason).to(phase, schedule).message(message);
    if launched {
        change.attempt = Some(attempt + 1);
        change.attempt_record = Some(AttemptStatus {
            attempt,
            rank: None,
            task: current_task(row).name.map(str::to_string),
            exit_code: None,
            reason: action.to_string(),
            rule: String::new(),
            action: action.to_string(),
            finished_at: None,
        });
    }
    change.controller = Some(None);
    change.workload = Some(None);
    change.launch_clock = Some(LaunchClock::Clear);
    change.node_wait = Some(LaunchClock::Clear);
    change.stopped_running = true;
    change.reset_started = true;
    change.preempt_done = true;
    if current_task(row).nodes.is_some() {
        change.ready_nodes = Some(None);
    }
    change
}

/// The suspended job's workloads are stopped (SIGTERM, its stop grace, SIGKILL; nothing if none
/// was launched): Suspended + Inactive, its run slot given back; the stopped attempt recorded as
/// `Suspended` ([`requeued_by_stop`]). A preemption under way is overtaken by it.
pub fn suspended(row: &JobRow) -> Transition {
    let shown = task_attempt(row, row.current_attempt());
    let what = if row.launched_attempt >= row.current_attempt() {
        format!("attempt {shown} was stopped gracefully and its run slot given back")
    } else {
        "its run slot was given back before it launched".to_string()
    };
    let change = requeued_by_stop(
        row,
        Reason::Suspended,
        "Suspended",
        format!(
            "suspended ({}): {what}; it waits again, ahead of the jobs created after it, once spec.suspend is false (restarts {} and recoveries {} unchanged)",
            suspended_by(row),
            row.restart_count,
            row.recovery_count
        ),
    );
    Transition::new(Expect::unchanged(row), change)
}

/// A scheduling pass chose the running job as a victim of queue `by` at `now_ms` (`within`: a
/// higher priority of its own queue): persisted, so its controller (woken) stops it even after
/// a crash. The status says which queue takes its slot; nothing else changes until the stop.
pub fn preempt(_row: &JobRow, by: &str, within: bool, now_ms: i64) -> Transition {
    let why = if within {
        format!("a higher-priority job of its queue {by} takes its run slot")
    } else {
        format!("queue {by}, below its share of the run cap, takes its run slot")
    };
    preemption_requested(&why, by, now_ms)
}

/// The request to stop a running job for queue `by` (`why`: what takes its place), written by
/// [`preempt`] and [`reclaim`].
fn preemption_requested(why: &str, by: &str, now_ms: i64) -> Transition {
    let mut change = Change::because(Reason::PreemptionRequested).message(format!(
        "preempting: {why}; stopping its workload gracefully (SIGTERM, its grace, SIGKILL), then it waits again, first in its queue"
    ));
    change.preempt = Some((by.to_string(), now_ms));
    Transition::new(
        Expect {
            phases: vec![JobPhase::Running],
            schedule: vec![ScheduleState::Alive],
        },
        change,
    )
}

/// A running job of a queue that borrows is asked to stop so that queue `by`, below its
/// nominal quota on the job's pool, takes back what its cohort lent
/// ([`crate::preemption::reclaim`]); stopped like any preemption ([`preempted`]).
pub fn reclaim(row: &JobRow, by: &str, now_ms: i64) -> Transition {
    let pool = row.pool.as_deref().unwrap_or("its pool");
    let why = format!(
        "queue {by}, below its nominal quota on pool {pool}, takes back the quota its cohort lent to queue {}",
        row.queue
    );
    preemption_requested(&why, by, now_ms)
}

/// The victim's workloads are stopped: Pending + Waiting, in its place (first in its queue among
/// the jobs created after it), its restart and recovery budgets untouched, the stopped attempt
/// recorded as `Preempted` ([`requeued_by_stop`]).
pub fn preempted(row: &JobRow) -> Transition {
    let shown = task_attempt(row, row.current_attempt());
    let by = row.preempted_by.as_deref().unwrap_or("another queue");
    let ran = match (row.running_since_ms, row.preempted_at_ms) {
        (Some(from), Some(at)) if at >= from => {
            format!(" after running {:.0} s", (at - from) as f64 / 1000.0)
        }
        _ => String::new(),
    };
    let taker = if Some(by) == Some(row.queue.as_str()) {
        format!("a higher-priority job of its queue {by} took its run slot")
    } else if let Some(pool) = &row.pool {
        format!("queue {by} took its place on pool {pool}")
    } else {
        format!("queue {by} took its run slot")
    };
    let mut change = requeued_by_stop(
        row,
        Reason::Preempted,
        "Preempted",
        format!(
            "preempted: {taker}; attempt {shown} was stopped gracefully{ran}; waiting again, first in its queue (restarts {} and recoveries {} unchanged)",
            row.restart_count, row.recovery_count
        ),
    );
    change.wait_reason = Some(WaitReason::Preempted);
    Transition::new(Expect::unchanged(row), change)
}
