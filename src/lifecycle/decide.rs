//! What a job controller does next ([`next_action`]): a pure decision over the job's record, what
//! its executor observes of the current attempt and what the controller knows ([`Context`]);
//! what a launch refused for good means ([`after_refusal`]); and when the end of an attempt's
//! logs is kept before the decision is carried out ([`keep_logs`]).

use std::time::Duration;

use crate::api::{JobPhase, ScheduleState, validate_spec};

use super::change::Transition;
use super::claim::{GATE_RECHECK, Gate};
use super::clock::earliest;
use super::deadlines::{
    deadline_ms, launch_deadline_ms, launch_timeout, node_wait_deadline_ms, stop_grace,
};
use super::members::{Observed, View, view};
use super::outcome::{Outcome, Refused};
use super::reason::{Failure, FailureReason};
use super::record::JobRow;
use super::tasks::{current_task, stored_message};
use super::transitions as t;

/// What the job controller knows besides the row and the observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    /// Now, ms since epoch.
    pub now_ms: i64,
    /// The job's executor is enabled in this operator.
    pub executor_enabled: bool,
    /// Creating the attempt's workload again adopts the existing one (a Pod's deterministic
    /// name), so an attempt [`Observed::NotFound`] after its launch intent is created again
    /// rather than counted lost. False for the local executor.
    pub create_is_idempotent: bool,
    /// First restart back-off.
    pub backoff_base: Duration,
    /// An attempt that ended may leave processes behind (the local executor): stop the job's
    /// workloads before recording its outcome, so nothing of it outlives it.
    pub stop_after_exit: bool,
    /// How long a launched workload may take to start running (`--launch-timeout-seconds`),
    /// unless its spec says otherwise (`spec.launchTimeoutSeconds`).
    pub launch_timeout: Duration,
    /// Launch timeouts in a row that end a job FailedNoResource (`--max-launch-timeouts`).
    pub max_launch_timeouts: i32,
    /// Some job waits for a run slot (Pending, admissible, not in a back-off): a Pod that no
    /// node took within its launch timeout then gives its run slot back.
    pub run_slot_wanted: bool,
    /// A local workload's stop grace, SIGTERM to SIGKILL (`--cancel-grace-seconds`), unless
    /// its spec says otherwise ([`stop_grace`]).
    pub stop_grace: Duration,
    /// What the operator's claim on the job's namespace allows (`super::claim`, read from the
    /// store each turn): [`Gate::OPEN`] when claims are not in force.
    pub claim: Gate,
    /// The operator process that drives the store still runs (its pid and start time, as the
    /// store records them): a claim that lapsed while it runs lapsed because the API cannot be
    /// reached (nobody can take the claim then), not because it died.
    pub operator_alive: bool,
}

/// How long a launched Pod may wait without a reason (its node has not reported yet) before
/// the job's message says what it waits on.
pub const PENDING_QUIET: Duration = Duration::from_secs(10);

/// The job controller's next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The job is Done: the controller exits.
    Exit,
    /// Write this transition, then decide again.
    Apply(Transition),
    /// Create `attempt`'s workload, after writing `intent` (when the launch intent is not yet
    /// recorded); a conflict on the intent means the job moved on: decide again.
    Launch {
        /// The attempt to create.
        attempt: i32,
        /// [`t::starting`] or [`t::launch_intent`], unless already recorded.
        intent: Option<Transition>,
    },
    /// Stop every workload of the job, then write this transition (a cancel, a deadline).
    StopThen(Transition),
    /// Remove every workload of the job at once (no grace: nothing of it ever ran), then write
    /// this transition.
    RemoveThen(Transition),
    /// Nothing to do until woken (a cancel, the Pod watch, the workload's end) or until
    /// `until_ms` (ms since epoch: a back-off's or a deadline's end).
    Wait {
        /// When to decide again at the latest (None: only when woken, or a backstop).
        until_ms: Option<i64>,
    },
}

/// True when [`next_action`] needs an observation of the current attempt for this row: the job
/// is launching or alive, not cancelling and not in a restart back-off.
pub fn observes(row: &JobRow) -> bool {
    !row.cancel_requested
        && !stop_requested(row)
        && match row.schedule_state {
            ScheduleState::Launching => true,
            ScheduleState::Alive => !in_backoff(row),
            _ => false,
        }
}

/// True when the job's workloads must be stopped to requeue it (`docs/design.md`, "Stopping
/// without failing"): `spec.suspend` holds it, or a scheduling pass chose it as a preemption
/// victim. Such a job launches nothing more; its controller stops what runs
/// ([`t::suspended`], [`t::preempted`]).
pub fn stop_requested(row: &JobRow) -> bool {
    row.schedule_state != ScheduleState::Done && (row.spec.suspend || row.preempt_requested)
}

/// True while `row`'s current attempt may never have begun: its launch is recorded (a launch is
/// only issued from Launching, its intent written first) and the job is still Launching, as it
/// stays until the attempt's workload is first reported (a local attempt is reported running at
/// its first observation, even one that already ended). A local attempt that left no trace at
/// all, not even the `started` its wrapper writes first, is then taken as never started: the
/// controller that recorded the launch stopped before it started the process, and the same
/// attempt is started again. Once the job moved on, no trace means the attempt vanished (lost).
pub fn launch_unobserved(row: &JobRow) -> bool {
    row.schedule_state == ScheduleState::Launching && row.launched_attempt >= row.current_attempt()
}

/// True while `row` waits out a back-off between attempts: Recovering + Alive with its next
/// attempt not launched yet. (A relaunched attempt whose Pod waits for a node is Recovering +
/// Alive too, but launched: it is observed, not relaunched.)
pub fn in_backoff(row: &JobRow) -> bool {
    row.schedule_state == ScheduleState::Alive
        && row.phase == JobPhase::Recovering
        && row.launched_attempt < row.current_attempt()
}

/// The job controller's decision for `row` as read, given `observed` (the current attempt's
/// workload, when [`observes`] asked for it), under its claim (`docs/design.md#one-owner-per-job`):
///
/// - past the claim's renew deadline nothing new touches the world: no launch (a Pod create, a
///   local process), and for a pod job no Pod deleted either (another operator may own it and
///   its Pod by now); it waits for the claim to be renewed (or for the operator to leave the
///   job to its new owner), looking again every [`GATE_RECHECK`];
/// - once the claim lapsed (its full duration without renewal) and the operator is gone (its
///   job controllers outlive it outside a cluster), a local attempt still running is stopped
///   ([`t::claim_lapsed`]): its processes belong to this state dir, so an operator taking the
///   job over could not adopt them and would relaunch it beside them. While the operator runs,
///   a lapse means the API cannot be reached, by it or by anyone who could take the claim: the
///   workload runs on (an API outage never stops local workloads).
pub fn next_action(row: &JobRow, observed: Option<&Observed>, cx: &Context) -> Action {
    let action = decide(row, observed, cx);
    let gate = cx.claim;
    let local_running = !cx.create_is_idempotent
        && observed.is_some_and(|o| {
            o.members
                .iter()
                .any(|m| matches!(m.state, super::members::MemberState::Running))
        })
        && !row.cancel_requested;
    if local_running && gate.lapsed(cx.now_ms) && !cx.operator_alive {
        return Action::StopThen(t::claim_lapsed(row, row.current_attempt()));
    }
    if gate.may_launch(cx.now_ms) {
        return match action {
            // A local workload that runs on is looked at again when its claim would lapse.
            Action::Wait { until_ms } if local_running => Action::Wait {
                until_ms: earliest(until_ms, gate.lapse_at_ms),
            },
            other => other,
        };
    }
    let recheck = Some(cx.now_ms + GATE_RECHECK.as_millis() as i64);
    match action {
        Action::Launch { .. } => Action::Wait { until_ms: recheck },
        Action::StopThen(_) | Action::RemoveThen(_) if cx.create_is_idempotent => {
            Action::Wait { until_ms: recheck }
        }
        Action::Wait { until_ms } if local_running => Action::Wait {
            until_ms: earliest(until_ms, gate.lapse_at_ms),
        },
        other => other,
    }
}

fn decide(row: &JobRow, observed: Option<&Observed>, cx: &Context) -> Action {
    if row.schedule_state == ScheduleState::Done {
        return Action::Exit;
    }
    if row.cancel_requested {
        if !row.schedule_state.holds_run_slot() {
            // Never admitted: nothing runs, it ends at once (the operator does the same).
            return Action::Apply(t::cancel_queued(row));
        }
        return if row.phase == JobPhase::Cancelling {
            Action::StopThen(t::cancelled(row))
        } else {
            Action::Apply(t::cancelling(row, stop_grace(row, cx.stop_grace)))
        };
    }
    let attempt = row.current_attempt();
    // The deadline holds wherever the job is: running, launching, in a back-off or queued for a
    // launch slot. No attempt starts after it.
    let deadline = deadline_ms(row);
    if deadline.is_some_and(|d| d <= cx.now_ms) {
        return Action::StopThen(t::deadline_exceeded(row));
    }
    let sooner = |until: Option<i64>| earliest(until, deadline);
    // A suspend, or a preemption: the workloads get the graceful stop of a cancel, then the job
    // waits again without a failure counted. One that holds no run slot is the operator's to
    // move (`super::supervise::suspend_route`).
    if stop_requested(row) && row.schedule_state.holds_run_slot() {
        return Action::StopThen(if row.spec.suspend {
            t::suspended(row)
        } else {
            t::preempted(row)
        });
    }
    match row.schedule_state {
        ScheduleState::Launching => {}
        ScheduleState::Alive if in_backoff(row) => {
            // A back-off: wait it out, then ask for a launch slot.
            return match row.backoff_until_ms {
                Some(until) if until > cx.now_ms => Action::Wait {
                    until_ms: sooner(Some(until)),
                },
                _ => Action::Apply(t::backoff_over(row)),
            };
        }
        ScheduleState::Alive => {}
        // Back in the queue (its run slot given back): no job controller waits there; the next
        // admission starts one.
        ScheduleState::Inactive | ScheduleState::Waiting => return Action::Exit,
        // Waiting for the operator to grant a launch slot.
        _ => {
            return Action::Wait {
                until_ms: sooner(None),
            };
        }
    }
    let launching = row.schedule_state == ScheduleState::Launching;
    let first = matches!(row.phase, JobPhase::Pending | JobPhase::Submitted);
    if launching && first {
        if let Err(why) = validate_spec(&row.spec) {
            return Action::Apply(t::fail(
                row,
                JobPhase::FailedPrecheck,
                FailureReason::InvalidSpec,
                why,
            ));
        }
        if !cx.executor_enabled {
            return Action::Apply(t::fail(
                row,
                JobPhase::FailedPrecheck,
                FailureReason::ExecutorDisabled,
                format!(
                    "the {} executor is not enabled in this operator; start it with --executors including {}",
                    row.executor, row.executor
                ),
            ));
        }
    }
    let wait = Action::Wait { until_ms: deadline };
    let not_found = Observed::not_found();
    let observed = observed.unwrap_or(&not_found);
    let view = view(observed);
    // A multi-node job's ready members (`3/4`) follow its launched attempt; its start and its
    // end write theirs with their own transitions.
    if current_task(row).nodes.is_some()
        && row.launched_attempt >= attempt
        && !matches!(view, View::Ended { .. } | View::Running { .. })
    {
        let (ready, size) = observed.ready();
        let shown = format!("{ready}/{size}");
        if row.ready_nodes.as_deref() != Some(shown.as_str()) {
            return Action::Apply(t::nodes_ready(row, shown));
        }
    }
    match view {
        // It cannot start and would wait forever: remove it (every member), then fail.
        View::Ended {
            outcome: outcome @ Outcome::Invalid { .. },
            ..
        } => Action::RemoveThen(t::after_outcome(
            row,
            attempt,
            &outcome,
            cx.now_ms,
            cx.backoff_base,
        )),
        View::Ended {
            outcome,
            others_alive,
            ..
        } => {
            let t = t::after_outcome(row, attempt, &outcome, cx.now_ms, cx.backoff_base);
            // Fail fast: the members still alive are stopped (with the job's grace) before the
            // end is recorded, so no member of the next attempt runs beside them (a member
            // lost to its node counts: its Pod is still there until removed, a job of one's
            // too; `Member::alive`).
            if cx.stop_after_exit || others_alive {
                Action::StopThen(t)
            } else {
                Action::Apply(t)
            }
        }
        View::NotFound if row.launched_attempt < attempt => {
            if !launching {
                // Alive without a launch of this attempt cannot happen through the transitions;
                // wait for the operator rather than launch outside a launch slot.
                return wait;
            }
            let intent = if first {
                t::starting(row, attempt)
            } else {
                t::launch_intent(row, attempt)
            };
            Action::Launch {
                attempt,
                intent: Some(intent),
            }
        }
        // Created (or adopted) but never reported, e.g. a Pod of that name that is not the
        // attempt's: created again until the launch deadline, then timed out like any launch.
        View::NotFound if cx.create_is_idempotent => {
            if launch_deadline_ms(row, cx.launch_timeout).is_some_and(|d| d <= cx.now_ms) {
                return Action::RemoveThen(t::launch_timed_out(
                    row,
                    attempt,
                    Some(Failure::Operator(FailureReason::PodNotSeen)),
                    "its Pod was created but never seen by the operator's Pod watch",
                    launch_timeout(row, cx.launch_timeout),
                    cx.max_launch_timeouts,
                    cx.now_ms,
                    cx.backoff_base,
                ));
            }
            Action::Launch {
                attempt,
                intent: None,
            }
        }
        View::CreateFailed {
            noun,
            message,
            retry_at_ms,
        } => {
            let launch_deadline = launch_deadline_ms(row, cx.launch_timeout);
            if launch_deadline.is_some_and(|d| d <= cx.now_ms) {
                return Action::RemoveThen(t::launch_timed_out(
                    row,
                    attempt,
                    Some(Failure::Operator(FailureReason::CreateFailed)),
                    &message,
                    launch_timeout(row, cx.launch_timeout),
                    cx.max_launch_timeouts,
                    cx.now_ms,
                    cx.backoff_base,
                ));
            }
            let waiting = format!("creating {noun} failed, trying again: {message}");
            if row.message != stored_message(row, &waiting) {
                return Action::Apply(t::waiting_to_start(row, waiting));
            }
            if retry_at_ms <= cx.now_ms {
                return Action::Launch {
                    attempt,
                    intent: None,
                };
            }
            Action::Wait {
                until_ms: sooner(earliest(Some(retry_at_ms), launch_deadline)),
            }
        }
        // Its wrapper vanished (killed) but what it started may run on: a local attempt's
        // processes are stopped before the attempt is taken as lost, or it would run beside the
        // next attempt (or after the job ended).
        View::NotFound => {
            let t = t::after_outcome(
                row,
                attempt,
                &Outcome::lost(
                    "the workload vanished before it recorded an exit code",
                    "WorkloadVanished",
                ),
                cx.now_ms,
                cx.backoff_base,
            );
            if cx.stop_after_exit {
                Action::StopThen(t)
            } else {
                Action::Apply(t)
            }
        }
        View::Running { workload } => {
            if launching || row.phase != JobPhase::Running {
                Action::Apply(t::running(row, attempt, workload))
            } else {
                wait
            }
        }
        View::Unschedulable {
            noun,
            workload,
            message,
            holds_nodes,
        } => {
            // A run slot held by a Pod no node takes is given back after its launch timeout,
            // when another job wants it; a gang partly placed (it holds nodes) gives everything
            // back after its launch timeout whether or not another job waits.
            let timeout = launch_timeout(row, cx.launch_timeout);
            let give_back_at = node_wait_deadline_ms(row, cx.launch_timeout);
            if !launching
                && (cx.run_slot_wanted || holds_nodes)
                && give_back_at.is_some_and(|at| at <= cx.now_ms)
            {
                return Action::RemoveThen(t::node_wait_timed_out(
                    row,
                    attempt,
                    &message,
                    timeout,
                    cx.max_launch_timeouts,
                    cx.now_ms,
                    cx.backoff_base,
                ));
            }
            let message = format!("waiting for a node for {noun}: {message}");
            if launching || row.message != stored_message(row, &message) {
                Action::Apply(t::unschedulable(row, workload, message))
            } else {
                Action::Wait {
                    until_ms: sooner(give_back_at.filter(|at| *at > cx.now_ms)),
                }
            }
        }
        View::Terminating {
            noun: _,
            workload,
            message,
            force_at_ms,
            node_ready,
        } => {
            if force_at_ms.is_some_and(|f| f <= cx.now_ms) && node_ready == Some(false) {
                // As the pod GC does for a node that is gone: nobody will ever confirm.
                return Action::RemoveThen(t::after_outcome(
                    row,
                    attempt,
                    &Outcome::lost(
                        format!(
                            "{message} past its grace period on a node that is not Ready (or gone); it was force-deleted"
                        ),
                        "NodeNotReady",
                    ),
                    cx.now_ms,
                    cx.backoff_base,
                ));
            }
            let waiting = format!("{message}; relaunching once it is gone");
            if row.message != stored_message(row, &waiting) {
                return Action::Apply(t::terminating(row, workload, waiting));
            }
            Action::Wait {
                until_ms: sooner(force_at_ms.filter(|f| *f > cx.now_ms)),
            }
        }
        View::Pending {
            noun,
            reason,
            message,
        } => {
            let launch_deadline = launch_deadline_ms(row, cx.launch_timeout);
            if launch_deadline.is_some_and(|d| d <= cx.now_ms) {
                // Removed at once: nothing of it ran, and a node that never started it would
                // never confirm a graceful delete either.
                return Action::RemoveThen(t::launch_timed_out(
                    row,
                    attempt,
                    (!reason.is_empty()).then(|| Failure::Workload(reason.clone())),
                    &message,
                    launch_timeout(row, cx.launch_timeout),
                    cx.max_launch_timeouts,
                    cx.now_ms,
                    cx.backoff_base,
                ));
            }
            let waiting = match t::reason_and_message(&reason, &message) {
                w if w.is_empty() => format!("waiting for {noun} to start"),
                w => format!("waiting for {noun} to start: {w}"),
            };
            // The clock stopped while the Pod waited for a node starts again once it is bound.
            // A reason to wait is worth a status message at once; what a Pod that is merely slow
            // waits on (a node that has not reported yet) only after PENDING_QUIET: most Pods run
            // sooner, and the write would be wasted.
            let quiet_over = row
                .launched_at_ms
                .map(|at| at + PENDING_QUIET.as_millis() as i64);
            let worth = !reason.is_empty()
                || (!message.is_empty() && quiet_over.is_some_and(|q| q <= cx.now_ms));
            if row.launched_at_ms.is_none()
                || (worth && row.message != stored_message(row, &waiting))
            {
                return Action::Apply(t::waiting_to_start(row, waiting));
            }
            let show_at = quiet_over.filter(|q| *q > cx.now_ms && !message.is_empty());
            Action::Wait {
                until_ms: sooner(earliest(launch_deadline, show_at)),
            }
        }
    }
}

/// What a launch the API refused for good means for the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterRefusal {
    /// Its namespace is being deleted, which cancels the job (docs/design.md#cancellation): persist a
    /// cancel request, then decide again (the workload is stopped, the job ends Cancelled).
    Cancel,
    /// Write this: the job fails its precheck, with the refusal's reason and message.
    Apply(Box<Transition>),
}

/// Decides on a launch of `row` refused for good ([`Refused`]): a namespace being deleted is a
/// cancel, anything else fails the job's precheck.
pub fn after_refusal(row: &JobRow, refused: &Refused) -> AfterRefusal {
    if refused.reason == FailureReason::NamespaceTerminating {
        return AfterRefusal::Cancel;
    }
    AfterRefusal::Apply(Box::new(t::fail(
        row,
        JobPhase::FailedPrecheck,
        refused.reason,
        refused.message.clone(),
    )))
}

/// The grace a workload's stop for `action` gets, SIGTERM to SIGKILL: none for a removal
/// ([`Action::RemoveThen`]: nothing of a workload that never started needs one), else the
/// job's ([`stop_grace`]: its `terminationGracePeriodSeconds`, a Pod's own, or `default`, the
/// operator's `--cancel-grace-seconds`).
pub fn action_grace(action: &Action, row: &JobRow, default: Duration) -> Duration {
    if matches!(action, Action::RemoveThen(_)) {
        Duration::ZERO
    } else {
        stop_grace(row, default)
    }
}

/// When the job controller keeps the end of an attempt's logs ([`keep_logs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeepMoment {
    /// The attempt's members ended (exited, refused, lost, never able to start): kept before
    /// its outcome is written (and before members still alive are stopped, for a gang that
    /// fails fast).
    Ended,
    /// Its members are about to be stopped while they may run (a cancel, a suspend, a
    /// preemption, a deadline, a launch timeout): kept before the stop, best effort.
    Stopping,
}

/// The logs of which attempt to keep, and why ([`keep_logs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeepLogs {
    /// The attempt (the job's count, as `row.attempt`).
    pub attempt: i32,
    /// Why now.
    pub moment: KeepMoment,
}

/// Whether the job controller keeps the end of the current attempt's logs before it carries out
/// `action` (decided by [`next_action`] on `row` and `observed`), so that they outlive the
/// workload (`docs/reference/what-survives-what.md`): the executor does the I/O (a pod job's
/// Pods' container logs; nothing for a local job, whose output is in the state dir already).
///
/// - only an action that writes an outcome or stops the workload keeps anything, and only of
///   an attempt that was launched (an attempt in its back-off, not launched yet, has nothing:
///   the one before was kept when it ended);
/// - [`KeepMoment::Ended`] when the observation shows the attempt ended (every outcome,
///   written at once or after the members still alive are stopped);
/// - [`KeepMoment::Stopping`] when the action stops a workload that has not ended (it is
///   kept first: once stopped, a Pod's log goes with it);
/// - never from a member stuck terminating on a node that is not Ready: its kubelet cannot
///   answer, and the force-delete must not wait on it.
///
/// A later keep of the same attempt replaces an earlier one; the job controller skips a keep
/// it has just done (the same attempt and moment, as a stop is decided again each turn until
/// the workload is gone).
pub fn keep_logs(row: &JobRow, observed: Option<&Observed>, action: &Action) -> Option<KeepLogs> {
    let attempt = row.current_attempt();
    let stops = match action {
        Action::Apply(_) => false,
        Action::StopThen(_) | Action::RemoveThen(_) => true,
        Action::Exit | Action::Launch { .. } | Action::Wait { .. } => return None,
    };
    if row.launched_attempt < attempt {
        return None;
    }
    let view = observed.map(view);
    let moment = match view {
        Some(View::Ended { .. }) => KeepMoment::Ended,
        Some(View::Terminating {
            node_ready: Some(false),
            ..
        }) => return None,
        _ if stops => KeepMoment::Stopping,
        _ => return None,
    };
    Some(KeepLogs { attempt, moment })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{ExecutorKind, ManagedJobSpec};
    use crate::defaults::{
        LAUNCH_TIMEOUT as DEFAULT_LAUNCH_TIMEOUT,
        MAX_LAUNCH_TIMEOUTS as DEFAULT_MAX_LAUNCH_TIMEOUTS,
    };
    use crate::lifecycle::change::check_edge;
    use crate::lifecycle::edges::legal_state;
    use crate::lifecycle::members::MemberState;
    use crate::lifecycle::outcome::{Evidence, Workload};
    use crate::lifecycle::reason::Reason;
    use crate::lifecycle::record::Object;
    use proptest::prelude::*;

    /// A job's record as its controller reads it: `phase` and `schedule`, controller pid 10.
    pub(crate) fn row(phase: JobPhase, schedule: ScheduleState) -> JobRow {
        let spec = ManagedJobSpec {
            run: Some("true".into()),
            ..Default::default()
        };
        let object = Object {
            uid: "u",
            namespace: "ns",
            name: "j",
            generation: 1,
            spec: &spec,
            created_at_ms: 1_000,
            resource_version: "",
        };
        JobRow {
            id: 1,
            phase,
            schedule_state: schedule,
            controller_pid: Some(10),
            controller_start_time: Some(1),
            controller_starts: 1,
            ..JobRow::new(&object, 1_000)
        }
    }

    pub(crate) fn cx(create_is_idempotent: bool) -> Context {
        Context {
            now_ms: 10_000,
            executor_enabled: true,
            create_is_idempotent,
            backoff_base: Duration::from_secs(1),
            stop_after_exit: !create_is_idempotent,
            launch_timeout: DEFAULT_LAUNCH_TIMEOUT,
            max_launch_timeouts: DEFAULT_MAX_LAUNCH_TIMEOUTS,
            run_slot_wanted: false,
            stop_grace: Duration::from_secs(5),
            claim: Gate::OPEN,
            operator_alive: true,
        }
    }

    fn reason(a: &Action) -> Option<Reason> {
        match a {
            Action::Apply(t) | Action::StopThen(t) | Action::RemoveThen(t) => Some(t.change.reason),
            Action::Launch { intent, .. } => intent.as_ref().map(|t| t.change.reason),
            _ => None,
        }
    }

    /// One owner per job (issue 30): past its claim's renew deadline a job controller creates
    /// nothing and deletes no Pod; once the claim lapsed with its operator gone, a local
    /// attempt still running is stopped (its new owner could not adopt it); while the operator
    /// runs (an API outage: nobody can take the claim), it runs on.
    #[test]
    fn nothing_new_touches_the_world_without_a_claim_renewed_lately() {
        use crate::lifecycle::claim::{Gate, Timing};
        let t = Timing::new(Duration::from_secs(15));
        let overdue = Gate::of(Some(-1_000), &t); // renewed 11 s before now (10_000)
        let lapsed = Gate::of(Some(-6_000), &t); // 16 s before
        let first = row(JobPhase::Submitted, ScheduleState::Launching);
        let mut c = cx(false);
        c.claim = overdue;
        assert!(matches!(
            next_action(&first, Some(&Observed::not_found()), &c),
            Action::Wait {
                until_ms: Some(11_000)
            }
        ));
        c.claim = Gate::of(Some(1_000), &t);
        assert!(matches!(
            next_action(&first, Some(&Observed::not_found()), &c),
            Action::Launch { .. }
        ));
        // A pod job's cancel deletes no Pod while the claim is overdue.
        let mut cancelling = row(JobPhase::Cancelling, ScheduleState::Alive);
        cancelling.cancel_requested = true;
        let mut pods = cx(true);
        pods.claim = overdue;
        assert!(matches!(
            next_action(&cancelling, None, &pods),
            Action::Wait { .. }
        ));
        // A running local attempt: runs on while its operator runs, stopped once it is gone.
        let mut running = row(JobPhase::Running, ScheduleState::Alive);
        running.attempt = 1;
        running.launched_attempt = 1;
        let seen = Observed::one(Some(Workload::Process(5)), MemberState::Running);
        let mut local = cx(false);
        local.claim = lapsed;
        assert!(matches!(
            next_action(&running, Some(&seen), &local),
            Action::Wait { .. }
        ));
        local.operator_alive = false;
        let a = next_action(&running, Some(&seen), &local);
        assert_eq!(reason(&a), Some(Reason::ClaimLapsed));
        assert!(matches!(a, Action::StopThen(_)), "{a:?}");
        let Action::StopThen(t) = a else {
            unreachable!()
        };
        check_edge(&running, &t.change).expect("a legal move");
        // Before it lapses, it is looked at again when it would.
        local.claim = overdue;
        assert_eq!(
            next_action(&running, Some(&seen), &local),
            Action::Wait {
                until_ms: Some(14_000)
            }
        );
    }

    /// Issue 43, item 4: a member lost to its node ends the attempt as lost, one recovery; its
    /// Pod is removed before the end is recorded (a job of one's too: it still exists on the
    /// lost node), while an evicted Pod's end is recorded at once as before.
    #[test]
    fn a_member_lost_to_its_node_is_removed_then_recovered() {
        use crate::lifecycle::nodes::{NODE_LOST, NODE_NOT_READY};
        let mut r = row(JobPhase::Running, ScheduleState::Alive);
        r.executor = ExecutorKind::Pod;
        r.attempt = 1;
        r.launched_attempt = 1;
        let pod = |state| Observed::one(Some(Workload::Pod("p".into())), state);
        for cause in [NODE_LOST, NODE_NOT_READY] {
            let lost = pod(MemberState::Ended(Outcome::lost(
                "its node n1 was deleted",
                cause,
            )));
            let a = next_action(&r, Some(&lost), &cx(true));
            assert!(matches!(a, Action::StopThen(_)), "{cause}: {a:?}");
            assert_eq!(reason(&a), Some(Reason::Recovering), "{cause}");
        }
        let evicted = pod(MemberState::Ended(Outcome::lost("evicted", "Evicted")));
        assert!(matches!(
            next_action(&r, Some(&evicted), &cx(true)),
            Action::Apply(_)
        ));
        // A gang: rank 1 lost to its node, rank 0 running: every member stopped, one recovery.
        let mut g = r.clone();
        g.spec = serde_json::from_value(serde_json::json!({
            "template": {"spec": {"containers": [{"name": "main", "image": "x"}]}},
            "nodes": 2,
        }))
        .unwrap();
        let gang = Observed {
            members: vec![
                crate::lifecycle::Member {
                    rank: 0,
                    workload: Some(Workload::Pod("p0".into())),
                    state: MemberState::Running,
                    ended_at_ms: None,
                },
                crate::lifecycle::Member {
                    rank: 1,
                    workload: Some(Workload::Pod("p1".into())),
                    state: MemberState::Ended(Outcome::lost("its node n1 was deleted", NODE_LOST)),
                    ended_at_ms: Some(9_000),
                },
            ],
            placed_together: true,
        };
        let a = next_action(&g, Some(&gang), &cx(true));
        let Action::StopThen(t) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(t.change.reason, Reason::Recovering);
        check_edge(&g, &t.change).expect("a legal move");
        // Rank 0 evicted first (it decides), rank 1 then lost with its node: nothing else
        // runs, yet rank 1's Pod is still on its lost node: removed before the end is written
        // (found by `tests/gang_props.rs`, invariant 6).
        let mut both = gang.clone();
        both.members[0].state = MemberState::Ended(Outcome::lost("evicted", "Evicted"));
        both.members[0].ended_at_ms = Some(8_000);
        let a = next_action(&g, Some(&both), &cx(true));
        assert!(matches!(a, Action::StopThen(_)), "{a:?}");
    }

    #[test]
    fn a_first_launch_records_starting_with_its_intent() {
        let r = row(JobPhase::Submitted, ScheduleState::Launching);
        let a = next_action(&r, Some(&Observed::not_found()), &cx(false));
        assert!(matches!(a, Action::Launch { attempt: 1, .. }), "{a:?}");
        assert_eq!(reason(&a), Some(Reason::Starting));
    }

    #[test]
    fn a_launched_attempt_not_found_is_stopped_and_lost_locally_and_created_again_for_pods() {
        let mut r = row(JobPhase::Starting, ScheduleState::Launching);
        r.attempt = 1;
        r.launched_attempt = 1;
        let local = next_action(&r, Some(&Observed::not_found()), &cx(false));
        assert_eq!(reason(&local), Some(Reason::Recovering));
        // What the vanished wrapper started is stopped before the job goes on.
        assert!(matches!(local, Action::StopThen(_)), "{local:?}");
        let pod = next_action(&r, Some(&Observed::not_found()), &cx(true));
        assert_eq!(
            pod,
            Action::Launch {
                attempt: 1,
                intent: None
            }
        );
    }

    #[test]
    fn a_cancel_goes_through_cancelling_then_stops() {
        let mut r = row(JobPhase::Running, ScheduleState::Alive);
        r.cancel_requested = true;
        assert_eq!(
            reason(&next_action(&r, None, &cx(false))),
            Some(Reason::Cancelling)
        );
        r.phase = JobPhase::Cancelling;
        let a = next_action(&r, None, &cx(false));
        assert!(matches!(a, Action::StopThen(_)), "{a:?}");
        assert_eq!(reason(&a), Some(Reason::Cancelled));
    }

    #[test]
    fn a_back_off_is_waited_out_then_asks_for_a_launch_slot() {
        let mut r = row(JobPhase::Recovering, ScheduleState::Alive);
        r.backoff_until_ms = Some(20_000);
        assert_eq!(
            next_action(&r, None, &cx(false)),
            Action::Wait {
                until_ms: Some(20_000)
            }
        );
        r.backoff_until_ms = Some(5_000);
        assert_eq!(
            reason(&next_action(&r, None, &cx(false))),
            Some(Reason::WaitingForLaunchSlot)
        );
    }

    #[test]
    fn a_deadline_counts_from_the_first_run_and_stops_the_workload() {
        let mut r = row(JobPhase::Running, ScheduleState::Alive);
        r.attempt = 1;
        r.launched_attempt = 1;
        r.spec.active_deadline_seconds = Some(5);
        let running = Observed::one(Some(Workload::Process(5)), MemberState::Running);
        // Never ran: no deadline yet.
        assert_eq!(deadline_ms(&r), None);
        r.started_at_ms = Some(6_000);
        assert_eq!(
            next_action(&r, Some(&running), &cx(false)),
            Action::Wait {
                until_ms: Some(11_000)
            }
        );
        r.started_at_ms = Some(4_000);
        let a = next_action(&r, Some(&running), &cx(false));
        assert!(
            matches!(&a, Action::StopThen(t) if t.change.failure_reason == Some(Some(Failure::parse("DeadlineExceeded")))),
            "{a:?}"
        );
        // The deadline's stop lets the workload save its work: the operator's grace, or the
        // job's own; a removal of a workload that never started gets none.
        let five = Duration::from_secs(5);
        assert_eq!(action_grace(&a, &r, five), five);
        r.spec.termination_grace_period_seconds = Some(40);
        let a = next_action(&r, Some(&running), &cx(false));
        assert_eq!(action_grace(&a, &r, five), Duration::from_secs(40));
        let removal = Action::RemoveThen(t::deadline_exceeded(&r));
        assert_eq!(action_grace(&removal, &r, five), Duration::ZERO);
    }

    #[test]
    fn the_deadline_holds_in_a_back_off_and_in_the_queue() {
        for (phase, schedule) in [
            (JobPhase::Recovering, ScheduleState::Alive),
            (JobPhase::Recovering, ScheduleState::AliveWaiting),
        ] {
            let mut r = row(phase, schedule);
            r.attempt = 2;
            r.launched_attempt = 1;
            r.started_at_ms = Some(1_000);
            r.backoff_until_ms = Some(60_000);
            r.spec.active_deadline_seconds = Some(5);
            // Before the deadline: wait for it at the latest.
            let mut early = cx(false);
            early.now_ms = 2_000;
            assert_eq!(
                next_action(&r, None, &early),
                Action::Wait {
                    until_ms: Some(6_000)
                }
            );
            // After it: stop and fail, never launch attempt 2.
            let a = next_action(&r, None, &cx(false));
            assert!(
                matches!(&a, Action::StopThen(t) if t.change.failure_reason == Some(Some(Failure::parse("DeadlineExceeded")))),
                "{a:?}"
            );
        }
    }

    fn pending(reason: &str) -> Observed {
        Observed::one(
            Some(Workload::Pod("j-1-1".into())),
            MemberState::Pending {
                reason: reason.into(),
                message: if reason.is_empty() {
                    String::new()
                } else {
                    "container main: Back-off pulling image \"nope\"".into()
                },
            },
        )
    }

    /// A launched Pod that does not start within its launch deadline (2 s here) is removed at
    /// once and the job requeued with a back-off, as a new attempt that is neither a restart nor
    /// a recovery; the last timeout allowed in a row ends it FailedNoResource naming the reason.
    #[test]
    fn a_pod_that_never_starts_times_out_its_launch_then_fails_no_resource() {
        let mut r = row(JobPhase::Starting, ScheduleState::Launching);
        r.executor = ExecutorKind::Pod;
        r.attempt = 1;
        r.launched_attempt = 1;
        r.launched_at_ms = Some(9_000);
        r.spec.launch_timeout_seconds = Some(2);
        // Within the deadline: a new reason to wait is shown, then the deadline is awaited.
        let a = next_action(&r, Some(&pending("ImagePullBackOff")), &cx(true));
        assert_eq!(reason(&a), Some(Reason::WaitingToStart), "{a:?}");
        let Action::Apply(t) = &a else { unreachable!() };
        r.message = t.change.message.clone().unwrap();
        assert!(r.message.contains("ImagePullBackOff"), "{}", r.message);
        assert_eq!(
            next_action(&r, Some(&pending("ImagePullBackOff")), &cx(true)),
            Action::Wait {
                until_ms: Some(11_000)
            }
        );
        // Past it: removed (no grace), requeued as attempt 2 after a back-off.
        r.launched_at_ms = Some(7_000);
        let a = next_action(&r, Some(&pending("ImagePullBackOff")), &cx(true));
        let Action::RemoveThen(t) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(t.change.reason, Reason::LaunchTimedOut);
        assert_eq!(t.change.phase, Some(JobPhase::Recovering));
        assert_eq!(t.change.schedule, Some(ScheduleState::Alive));
        assert_eq!(t.change.attempt, Some(2));
        assert_eq!(t.change.launch_timeouts, Some(1));
        assert_eq!(t.change.restart_count, None);
        assert_eq!(t.change.recovery_count, None);
        assert_eq!(t.change.backoff_until_ms, Some(Some(11_000)));
        assert!(check_edge(&r, &t.change).is_ok());
        // The last timeout allowed in a row: FailedNoResource, naming what it waited on.
        r.launch_timeouts = DEFAULT_MAX_LAUNCH_TIMEOUTS - 1;
        let a = next_action(&r, Some(&pending("ImagePullBackOff")), &cx(true));
        let Action::RemoveThen(t) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(t.change.phase, Some(JobPhase::FailedNoResource));
        assert_eq!(
            t.change.failure_reason,
            Some(Some(Failure::parse("ImagePullBackOff")))
        );
        let message = t.change.message.clone().unwrap();
        assert!(
            message.contains("did not start within 2 s") && message.contains("Back-off pulling"),
            "{message}"
        );
        // Nothing known of why: LaunchTimeout.
        let a = next_action(&r, Some(&pending("")), &cx(true));
        let Action::RemoveThen(t) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(
            t.change.failure_reason,
            Some(Some(Failure::parse("LaunchTimeout")))
        );
        // The operator's default applies without spec.launchTimeoutSeconds.
        r.spec.launch_timeout_seconds = None;
        assert_eq!(
            next_action(&r, Some(&pending("")), &cx(true)),
            Action::Wait {
                until_ms: Some(7_000 + DEFAULT_LAUNCH_TIMEOUT.as_millis() as i64)
            }
        );
    }

    /// What a slow Pod waits on (its node has not reported) reaches the message only after
    /// PENDING_QUIET, so a Pod that runs soon costs no extra status write.
    #[test]
    fn a_quiet_pending_pod_is_described_after_a_while() {
        let mut r = row(JobPhase::Starting, ScheduleState::Launching);
        r.executor = ExecutorKind::Pod;
        r.attempt = 1;
        r.launched_attempt = 1;
        r.launched_at_ms = Some(9_000);
        let bound = Observed::one(
            Some(Workload::Pod("j-1-1".into())),
            MemberState::Pending {
                reason: String::new(),
                message: "bound to node n9, which has not started it".into(),
            },
        );
        assert_eq!(
            next_action(&r, Some(&bound), &cx(true)),
            Action::Wait {
                until_ms: Some(9_000 + PENDING_QUIET.as_millis() as i64)
            }
        );
        r.launched_at_ms = Some(-5_000);
        let a = next_action(&r, Some(&bound), &cx(true));
        let Action::Apply(t) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(
            t.change.message.as_deref(),
            Some("waiting for Pod j-1-1 to start: bound to node n9, which has not started it")
        );
    }

    /// A Pod waiting for a node stops the launch clock (it holds no launch slot; an autoscaler
    /// may take long); once bound it starts again. A relaunched attempt that waits for a node is
    /// observed, never relaunched again in a loop through the launch queue.
    #[test]
    fn the_launch_clock_stops_while_a_pod_waits_for_a_node() {
        let mut r = row(JobPhase::Recovering, ScheduleState::Alive);
        r.executor = ExecutorKind::Pod;
        r.attempt = 2;
        r.launched_attempt = 2;
        r.launched_at_ms = None;
        r.message = "waiting for a node for Pod j-1-2: 0/4 nodes are available".into();
        assert!(observes(&r) && !in_backoff(&r));
        let unschedulable = Observed::one(
            Some(Workload::Pod("j-1-2".into())),
            MemberState::Unschedulable {
                message: "0/4 nodes are available".into(),
            },
        );
        assert_eq!(
            next_action(&r, Some(&unschedulable), &cx(true)),
            Action::Wait { until_ms: None }
        );
        let a = next_action(&r, Some(&pending("")), &cx(true));
        let Action::Apply(t) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(t.change.reason, Reason::WaitingToStart);
        assert_eq!(
            t.change.launch_clock,
            Some(crate::lifecycle::change::LaunchClock::Start)
        );
        // Waiting for a node, the clock is cleared.
        let mut launching = row(JobPhase::Starting, ScheduleState::Launching);
        launching.attempt = 1;
        launching.launched_attempt = 1;
        launching.launched_at_ms = Some(1);
        let a = next_action(&launching, Some(&unschedulable), &cx(true));
        let Action::Apply(t) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(
            t.change.launch_clock,
            Some(crate::lifecycle::change::LaunchClock::Clear)
        );
    }

    /// A running Pod deleted by someone else no longer counts as running: the job shows
    /// Recovering naming the Pod and its node, waits for it to go, and past its grace period
    /// plus the margin on a node that is not Ready removes it at once and recovers.
    #[test]
    fn a_terminating_pod_is_not_running_and_is_forced_only_on_a_node_that_is_not_ready() {
        let mut r = row(JobPhase::Running, ScheduleState::Alive);
        r.executor = ExecutorKind::Pod;
        r.attempt = 1;
        r.launched_attempt = 1;
        let terminating = |force_at_ms, node_ready| {
            Observed::one(
                Some(Workload::Pod("j-1-1".into())),
                MemberState::Terminating {
                    message: "Pod j-1-1 on node n1 is terminating".into(),
                    force_at_ms: Some(force_at_ms),
                    node_ready,
                },
            )
        };
        let a = next_action(&r, Some(&terminating(40_000, None)), &cx(true));
        let Action::Apply(t) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(t.change.reason, Reason::PodTerminating);
        assert_eq!(t.change.phase, Some(JobPhase::Recovering));
        let message = t.change.message.clone().unwrap();
        assert!(
            message.contains("j-1-1") && message.contains("n1"),
            "{message}"
        );
        r.phase = JobPhase::Recovering;
        r.message = message;
        assert!(
            observes(&r),
            "a terminating attempt is watched, not a back-off"
        );
        assert_eq!(
            next_action(&r, Some(&terminating(40_000, None)), &cx(true)),
            Action::Wait {
                until_ms: Some(40_000)
            }
        );
        // Past the margin on a Ready node (or one that cannot be read): keep waiting.
        for ready in [Some(true), None] {
            assert_eq!(
                next_action(&r, Some(&terminating(5_000, ready)), &cx(true)),
                Action::Wait { until_ms: None }
            );
        }
        // On a node that is not Ready: removed at once, then recovered.
        let a = next_action(&r, Some(&terminating(5_000, Some(false))), &cx(true));
        let Action::RemoveThen(t) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(t.change.reason, Reason::Recovering);
        assert_eq!(t.change.recovery_count, Some(1));
        assert!(
            t.change.message.as_ref().unwrap().contains("force-deleted"),
            "{:?}",
            t.change.message
        );
        assert!(check_edge(&r, &t.change).is_ok());
    }

    /// Issue 21, class 5: a create the API keeps failing (HTTP 500) is tried again on its own
    /// back-off, says why in the message, and counts against the launch deadline: past it the
    /// attempt times out like any launch (requeued, then FailedNoResource naming CreateFailed).
    /// A cancel comes first whatever the create does.
    #[test]
    fn a_failing_create_is_retried_within_the_launch_deadline_and_a_cancel_comes_first() {
        let mut r = row(JobPhase::Starting, ScheduleState::Launching);
        r.executor = ExecutorKind::Pod;
        r.attempt = 1;
        r.launched_attempt = 1;
        r.launched_at_ms = Some(9_000);
        r.spec.launch_timeout_seconds = Some(5);
        let failing = |retry_at_ms| {
            Observed::one(
                Some(Workload::Pod("j-1-1-x".into())),
                MemberState::CreateFailed {
                    message: "the API answered 500: failed calling webhook".into(),
                    retry_at_ms,
                },
            )
        };
        let a = next_action(&r, Some(&failing(10_500)), &cx(true));
        let Action::Apply(t) = &a else {
            panic!("{a:?}")
        };
        let message = t.change.message.clone().unwrap();
        assert!(message.contains("creating Pod j-1-1-x failed") && message.contains("500"));
        r.message = message;
        assert_eq!(
            next_action(&r, Some(&failing(10_500)), &cx(true)),
            Action::Wait {
                until_ms: Some(10_500)
            }
        );
        assert_eq!(
            next_action(&r, Some(&failing(9_500)), &cx(true)),
            Action::Launch {
                attempt: 1,
                intent: None
            }
        );
        // Past the launch deadline (9 s + 5 s).
        r.launched_at_ms = Some(4_000);
        let a = next_action(&r, Some(&failing(10_500)), &cx(true));
        let Action::RemoveThen(t) = &a else {
            panic!("{a:?}")
        };
        assert_eq!(t.change.reason, Reason::LaunchTimedOut);
        r.launch_timeouts = DEFAULT_MAX_LAUNCH_TIMEOUTS - 1;
        let Action::RemoveThen(t) = next_action(&r, Some(&failing(10_500)), &cx(true)) else {
            panic!()
        };
        assert_eq!(t.change.phase, Some(JobPhase::FailedNoResource));
        assert_eq!(
            t.change.failure_reason,
            Some(Some(Failure::parse("CreateFailed")))
        );
        // A created Pod the watch never reports is timed out the same way, not created forever.
        let Action::RemoveThen(t) = next_action(&r, Some(&Observed::not_found()), &cx(true)) else {
            panic!()
        };
        assert_eq!(
            t.change.failure_reason,
            Some(Some(Failure::parse("PodNotSeen")))
        );
        // A cancel: stopped, whatever the create does.
        r.cancel_requested = true;
        r.phase = JobPhase::Cancelling;
        assert!(matches!(
            next_action(&r, Some(&failing(9_500)), &cx(true)),
            Action::StopThen(_)
        ));
    }

    /// Issue 21, class 9: a launch refused because the namespace is being deleted is a cancel;
    /// any other refusal fails the precheck.
    #[test]
    fn a_namespace_being_deleted_cancels_instead_of_failing() {
        let r = row(JobPhase::Starting, ScheduleState::Launching);
        let refused = |reason| Refused {
            reason,
            message: "the API refused the Pod".into(),
        };
        assert_eq!(
            after_refusal(&r, &refused(FailureReason::NamespaceTerminating)),
            AfterRefusal::Cancel
        );
        let AfterRefusal::Apply(t) = after_refusal(&r, &refused(FailureReason::PodRejected)) else {
            panic!()
        };
        assert_eq!(t.change.phase, Some(JobPhase::FailedPrecheck));
        assert!(check_edge(&r, &t.change).is_ok());
    }

    /// A gang partly placed without gang scheduling holds nodes: past its launch timeout it is
    /// removed whole and gives its run slot back, whether or not another job wants the slot;
    /// placed together (a PodGroup), it waits as one Pod does.
    #[test]
    fn a_partly_placed_gang_gives_everything_back_at_its_launch_timeout() {
        let mut r = row(JobPhase::Starting, ScheduleState::Alive);
        r.executor = ExecutorKind::Pod;
        r.spec = serde_json::from_value(serde_json::json!({
            "template": {"spec": {"containers": [{"name": "main", "image": "x"}]}},
            "nodes": 2, "launchTimeoutSeconds": 5,
        }))
        .unwrap();
        r.attempt = 1;
        r.launched_attempt = 1;
        r.ready_nodes = Some("1/2".into());
        r.node_wait_since_ms = Some(4_000);
        let members = |together| Observed {
            members: vec![
                crate::lifecycle::Member {
                    rank: 0,
                    workload: Some(Workload::Pod("j-1-1-0".into())),
                    state: MemberState::Running,
                    ended_at_ms: None,
                },
                crate::lifecycle::Member {
                    rank: 1,
                    workload: Some(Workload::Pod("j-1-1-1".into())),
                    state: MemberState::Unschedulable {
                        message: "0/4 nodes are available".into(),
                    },
                    ended_at_ms: None,
                },
            ],
            placed_together: together,
        };
        let Action::RemoveThen(t) = next_action(&r, Some(&members(false)), &cx(true)) else {
            panic!("{:?}", next_action(&r, Some(&members(false)), &cx(true)))
        };
        assert_eq!(t.change.reason, Reason::Requeued);
        assert_eq!(t.change.schedule, Some(ScheduleState::Waiting));
        let a = next_action(&r, Some(&members(true)), &cx(true));
        assert!(!matches!(a, Action::RemoveThen(_)), "{a:?}");
    }

    /// Issue 21, class 7: a Pod no node takes holds its job's run slot only for its launch
    /// timeout, and only while another job waits for one; then it is removed and the job goes
    /// back to the queue (the back of its priority, after a back-off, its controller released),
    /// and the `--max-launch-timeouts`-th time it ends FailedNoResource. Its controller then
    /// exits; the queue's head says which slot it waits for.
    #[test]
    fn a_pod_no_node_takes_gives_its_run_slot_back_when_others_wait() {
        let mut r = row(JobPhase::Starting, ScheduleState::Alive);
        r.executor = ExecutorKind::Pod;
        r.attempt = 1;
        r.launched_attempt = 1;
        r.spec.launch_timeout_seconds = Some(5);
        r.message = "waiting for a node for Pod j-1-1: 0/4 nodes are available".into();
        r.node_wait_since_ms = Some(4_000);
        let waiting = Observed::one(
            Some(Workload::Pod("j-1-1".into())),
            MemberState::Unschedulable {
                message: "0/4 nodes are available".into(),
            },
        );
        // Past its timeout, but nobody wants the slot: it keeps it.
        assert_eq!(
            next_action(&r, Some(&waiting), &cx(true)),
            Action::Wait { until_ms: None }
        );
        let mut wanted = cx(true);
        wanted.run_slot_wanted = true;
        let Action::RemoveThen(t) = next_action(&r, Some(&waiting), &wanted) else {
            panic!()
        };
        assert_eq!(t.change.reason, Reason::Requeued);
        assert_eq!(t.change.phase, Some(JobPhase::Pending));
        assert_eq!(t.change.schedule, Some(ScheduleState::Waiting));
        assert_eq!(t.change.attempt, Some(2));
        assert!(t.change.requeue, "to the back of its priority");
        assert_eq!(t.change.controller, Some(None));
        assert_eq!(t.change.backoff_until_ms, Some(Some(11_000)));
        assert!(check_edge(&r, &t.change).is_ok());
        // Within its timeout: waits until it ends.
        r.node_wait_since_ms = Some(8_000);
        assert_eq!(
            next_action(&r, Some(&waiting), &wanted),
            Action::Wait {
                until_ms: Some(13_000)
            }
        );
        // The last launch timeout allowed: FailedNoResource.
        r.node_wait_since_ms = Some(4_000);
        r.launch_timeouts = DEFAULT_MAX_LAUNCH_TIMEOUTS - 1;
        let Action::RemoveThen(t) = next_action(&r, Some(&waiting), &wanted) else {
            panic!()
        };
        assert_eq!(t.change.phase, Some(JobPhase::FailedNoResource));
        assert_eq!(
            t.change.failure_reason,
            Some(Some(Failure::parse("Unschedulable")))
        );
        // Back in the queue, its controller leaves.
        let queued = row(JobPhase::Pending, ScheduleState::Waiting);
        assert_eq!(next_action(&queued, None, &cx(true)), Action::Exit);
        // The message names the slot that is missing.
        let m = crate::lifecycle::transitions::queued_message(0, 2, 5, 5, 5);
        assert!(
            m.starts_with("waiting for a run slot: all 5 in use, some by Pods waiting for a node"),
            "{m}"
        );
        assert_eq!(
            crate::lifecycle::transitions::queued_message(2, 2, 3, 5, 0),
            "waiting for a launch slot: all 2 in use"
        );
    }

    /// Logs that outlive Pods (issue 33): the end of an attempt's logs is kept when its end
    /// is written (one member, or a gang that fails fast: before the others are stopped), and
    /// before a stop of a workload that may run (a cancel, a launch timeout); never while it
    /// runs or waits, never for an attempt not launched (in a back-off), never from a node
    /// that is not Ready.
    #[test]
    fn logs_are_kept_when_an_attempt_ends_and_before_it_is_stopped() {
        let pod = |state| Observed::one(Some(Workload::Pod("p".into())), state);
        let mut r = row(JobPhase::Running, ScheduleState::Alive);
        r.executor = ExecutorKind::Pod;
        r.attempt = 2;
        r.launched_attempt = 2;
        let decide = |r: &JobRow, o: Option<&Observed>| {
            let a = next_action(r, o, &cx(true));
            (keep_logs(r, o, &a), a)
        };
        let ended = |attempt| {
            Some(KeepLogs {
                attempt,
                moment: KeepMoment::Ended,
            })
        };
        let stopping = |attempt| {
            Some(KeepLogs {
                attempt,
                moment: KeepMoment::Stopping,
            })
        };
        // Running: nothing yet.
        let (keep, a) = decide(&r, Some(&pod(MemberState::Running)));
        assert_eq!((keep, a), (None, Action::Wait { until_ms: None }));
        // It exited: kept as its outcome is written.
        let failed = pod(MemberState::Ended(Outcome::Failed {
            code: 3,
            reason: "Error".into(),
            detail: None,
            evidence: Evidence::exit("main", false, 3, "Error"),
        }));
        let (keep, a) = decide(&r, Some(&failed));
        assert!(matches!(a, Action::Apply(_)), "{a:?}");
        assert_eq!(keep, ended(2));
        let (keep, _) = decide(&r, Some(&pod(MemberState::Ended(Outcome::Succeeded))));
        assert_eq!(keep, ended(2));
        // Evicted (its Pod stays, Failed): kept too.
        let lost = pod(MemberState::Ended(Outcome::lost("evicted", "Evicted")));
        assert_eq!(decide(&r, Some(&lost)).0, ended(2));
        // Not seen (created again): nothing to keep.
        let (keep, a) = decide(&r, Some(&Observed::not_found()));
        assert!(matches!(a, Action::Launch { .. }), "{a:?}");
        assert_eq!(keep, None);
        // A gang that fails fast: kept before the members still alive are stopped.
        let mut gang = failed.clone();
        gang.members.push(crate::lifecycle::Member {
            rank: 1,
            workload: Some(Workload::Pod("q".into())),
            state: MemberState::Running,
            ended_at_ms: None,
        });
        let mut g = r.clone();
        g.spec = serde_json::from_value(serde_json::json!({
            "template": {"spec": {"containers": [{"name": "main", "image": "x"}]}},
            "nodes": 2,
        }))
        .unwrap();
        let (keep, a) = decide(&g, Some(&gang));
        assert!(matches!(a, Action::StopThen(_)), "{a:?}");
        assert_eq!(keep, ended(2));
        // A cancel: kept before the stop.
        let mut c = r.clone();
        c.cancel_requested = true;
        c.phase = JobPhase::Cancelling;
        let (keep, a) = decide(&c, None);
        assert!(matches!(a, Action::StopThen(_)), "{a:?}");
        assert_eq!(keep, stopping(2));
        // A cancel during a back-off: attempt 3 never launched, attempt 2 was kept as it ended.
        c.attempt = 3;
        assert!(matches!(decide(&c, None).1, Action::StopThen(_)));
        assert_eq!(decide(&c, None).0, None);
        // A launch timeout (init containers may have run): kept before the removal.
        let mut l = row(JobPhase::Starting, ScheduleState::Launching);
        l.executor = ExecutorKind::Pod;
        l.attempt = 1;
        l.launched_attempt = 1;
        l.launched_at_ms = Some(1_000);
        l.spec.launch_timeout_seconds = Some(5);
        let pending = pod(MemberState::Pending {
            reason: String::new(),
            message: "init container prepare running".into(),
        });
        let (keep, a) = decide(&l, Some(&pending));
        assert!(matches!(a, Action::RemoveThen(_)), "{a:?}");
        assert_eq!(keep, stopping(1));
        // Stuck terminating on a node that is not Ready: force-deleted, nothing asked of it.
        let stuck = pod(MemberState::Terminating {
            message: "Pod p on node n is terminating".into(),
            force_at_ms: Some(5_000),
            node_ready: Some(false),
        });
        let (keep, a) = decide(&r, Some(&stuck));
        assert!(matches!(a, Action::RemoveThen(_)), "{a:?}");
        assert_eq!(keep, None);
    }

    fn phase() -> impl Strategy<Value = JobPhase> {
        prop::sample::select(JobPhase::ALL.to_vec())
    }

    fn schedule() -> impl Strategy<Value = ScheduleState> {
        prop::sample::select(ScheduleState::ALL.to_vec())
    }

    fn observed() -> impl Strategy<Value = Option<Observed>> {
        prop_oneof![
            Just(None),
            Just(Some(Observed::not_found())),
            Just(Some(Observed::one(
                Some(Workload::Pod("p".into())),
                MemberState::Terminating {
                    message: "Pod p on node n is terminating".into(),
                    force_at_ms: Some(5_000),
                    node_ready: Some(false),
                }
            ))),
            Just(Some(Observed::one(
                Some(Workload::Pod("p".into())),
                MemberState::Terminating {
                    message: "Pod p on node n is terminating".into(),
                    force_at_ms: Some(50_000),
                    node_ready: None,
                }
            ))),
            Just(Some(Observed::one(
                Some(Workload::Pod("p".into())),
                MemberState::Pending {
                    reason: "ImagePullBackOff".into(),
                    message: "container main: back-off".into(),
                }
            ))),
            Just(Some(Observed::one(
                Some(Workload::Pod("p".into())),
                MemberState::Running
            ))),
            Just(Some(Observed::one(
                Some(Workload::Pod("p".into())),
                MemberState::CreateFailed {
                    message: "the API answered 500".into(),
                    retry_at_ms: 9_000,
                }
            ))),
            Just(Some(Observed::one(
                Some(Workload::Pod("p".into())),
                MemberState::CreateFailed {
                    message: "the API answered 500".into(),
                    retry_at_ms: 20_000,
                }
            ))),
            Just(Some(Observed::one(
                Some(Workload::Pod("p".into())),
                MemberState::Unschedulable {
                    message: "0/1 nodes".into()
                }
            ))),
            Just(Some(Observed::one(
                None,
                MemberState::Ended(Outcome::Succeeded)
            ))),
            Just(Some(Observed::one(
                None,
                MemberState::Ended(Outcome::Failed {
                    code: 2,
                    reason: "ExitCode".into(),
                    detail: None,
                    evidence: Evidence::exit("run", false, 2, "ExitCode"),
                })
            ))),
            Just(Some(Observed::one(
                None,
                MemberState::Ended(Outcome::lost("evicted", "Evicted"))
            ))),
            Just(Some(Observed::one(
                None,
                MemberState::Ended(Outcome::Invalid {
                    reason: "InvalidImageName".into(),
                    message: "container main: bad".into()
                })
            ))),
        ]
    }

    proptest! {
        /// Whatever the row and the observation: logs are kept only of the current attempt,
        /// launched, before a transition is written; before every outcome written for it that
        /// comes from what its members showed, as [`KeepMoment::Ended`]; before every stop of
        /// it (but from a node that is not Ready); never as it runs, waits or launches.
        #[test]
        fn logs_are_kept_before_every_outcome_and_every_stop(
            phase in phase(),
            schedule in schedule(),
            cancel in any::<bool>(),
            attempt in 0i32..3,
            launched in 0i32..3,
            observed in observed(),
            idempotent in any::<bool>(),
            launched_at in prop::option::of(0i64..20_000),
            launch_timeout_s in prop::option::of(1i64..20),
            suspend in any::<bool>(),
        ) {
            prop_assume!((schedule == ScheduleState::Done) == phase.is_terminal());
            prop_assume!(!matches!(schedule, ScheduleState::Inactive | ScheduleState::Waiting) || phase == JobPhase::Pending);
            prop_assume!(phase != JobPhase::Cancelling || cancel);
            prop_assume!(legal_state(phase, schedule, cancel));
            let mut r = row(phase, schedule);
            r.cancel_requested = cancel;
            r.attempt = attempt;
            r.launched_attempt = launched;
            r.launched_at_ms = launched_at;
            r.spec.launch_timeout_seconds = launch_timeout_s;
            r.spec.suspend = suspend;
            let a = next_action(&r, observed.as_ref(), &cx(idempotent));
            let keep = keep_logs(&r, observed.as_ref(), &a);
            let launched = r.launched_attempt >= r.current_attempt();
            let shown = observed.as_ref().map(view);
            let node_gone = matches!(shown, Some(View::Terminating { node_ready: Some(false), .. }));
            let writes = match &a {
                Action::Apply(t) | Action::StopThen(t) | Action::RemoveThen(t) => Some(t),
                _ => None,
            };
            if let Some(k) = keep {
                prop_assert_eq!(k.attempt, r.current_attempt());
                prop_assert!(launched, "kept an attempt not launched: {:?}", a);
                prop_assert!(writes.is_some(), "kept without a transition: {:?}", a);
                if matches!(a, Action::Apply(_)) {
                    prop_assert_eq!(k.moment, KeepMoment::Ended, "an Apply stops nothing");
                }
            }
            let outcome = writes.is_some_and(|t| matches!(
                t.change.reason,
                Reason::Restarting | Reason::Recovering | Reason::Ignored | Reason::TaskSucceeded
                    | Reason::Succeeded | Reason::Failed
            ));
            if outcome && launched && matches!(shown, Some(View::Ended { .. })) {
                prop_assert_eq!(keep.map(|k| k.moment), Some(KeepMoment::Ended), "{:?}", a);
            }
            if matches!(a, Action::StopThen(_) | Action::RemoveThen(_)) && launched && !node_gone {
                prop_assert!(keep.is_some(), "a stop of a launched attempt kept nothing: {:?}", a);
            }
        }

        /// Whatever the row and the observation, a write the controller decides is legal from
        /// the state it was decided on (the store would refuse it otherwise), and a Done job's
        /// controller exits.
        #[test]
        fn decisions_only_take_legal_edges(
            phase in phase(),
            schedule in schedule(),
            cancel in any::<bool>(),
            attempt in 0i32..3,
            launched in 0i32..3,
            restarts in 0i32..2,
            recoveries in prop::option::of(0i32..2),
            observed in observed(),
            idempotent in any::<bool>(),
            launched_at in prop::option::of(0i64..20_000),
            launch_timeouts in 0i32..3,
            launch_timeout_s in prop::option::of(1i64..20),
            node_wait in prop::option::of(0i64..20_000),
            run_slot_wanted in any::<bool>(),
        ) {
            // Rows the state machines allow.
            prop_assume!((schedule == ScheduleState::Done) == phase.is_terminal());
            prop_assume!(!matches!(schedule, ScheduleState::Inactive | ScheduleState::Waiting) || phase == JobPhase::Pending);
            prop_assume!(phase != JobPhase::Cancelling || cancel);
            prop_assume!(legal_state(phase, schedule, cancel));
            let mut r = row(phase, schedule);
            r.cancel_requested = cancel;
            r.attempt = attempt;
            r.launched_attempt = launched;
            r.spec.recovery.max_restarts_on_errors = restarts;
            r.spec.recovery.max_recoveries = recoveries;
            r.launched_at_ms = launched_at;
            r.launch_timeouts = launch_timeouts;
            r.spec.launch_timeout_seconds = launch_timeout_s;
            r.node_wait_since_ms = node_wait;
            let mut cx = cx(idempotent);
            cx.run_slot_wanted = run_slot_wanted;
            let a = next_action(&r, observed.as_ref(), &cx);
            if schedule == ScheduleState::Done {
                prop_assert_eq!(a, Action::Exit);
                return Ok(());
            }
            let transitions: Vec<&Transition> = match &a {
                Action::Apply(t) | Action::StopThen(t) | Action::RemoveThen(t) => vec![t],
                Action::Launch { intent, .. } => intent.iter().collect(),
                _ => vec![],
            };
            for t in transitions {
                prop_assert!(t.expect.matches(&r), "{:?} decided on a row its guard refuses", t.change.reason);
                prop_assert!(check_edge(&r, &t.change).is_ok(), "{:?}: {:?}", t.change.reason, check_edge(&r, &t.change));
            }
        }
    }
}
