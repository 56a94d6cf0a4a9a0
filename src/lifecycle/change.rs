//! A [`Change`] to a job's record and how it is applied ([`apply`]): the one place a record
//! moves. A change is built only here, in `lifecycle` (by the named transitions of
//! [`super::transitions`]); other modules read it through its accessors and hand it, with its
//! guard ([`Transition`]), to the store, which applies it with [`apply`] inside its
//! compare-and-set.

use crate::api::failure::MAX_ATTEMPT_RECORDS;
use crate::api::{AttemptStatus, JobPhase, ScheduleState, WaitReason};

use super::edges::{self, Expect, IllegalTransition};
use super::outcome::Workload;
use super::reason::{Failure, Reason};
use super::record::JobRow;
use super::tasks;

/// A change to apply in one transition. `None` fields stay as they are; `Some(None)` clears.
/// Built only by `lifecycle` (its fields are private to it); read through its accessors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// Why (recorded in the history when the phase or schedule state changes).
    pub(in crate::lifecycle) reason: Reason,
    /// New phase.
    pub(in crate::lifecycle) phase: Option<JobPhase>,
    /// New schedule state.
    pub(in crate::lifecycle) schedule: Option<ScheduleState>,
    /// New message.
    pub(in crate::lifecycle) message: Option<String>,
    /// Record a job controller process (pid, start time), or clear it.
    pub(in crate::lifecycle) controller: Option<Option<(i32, u64)>>,
    /// New attempt number.
    pub(in crate::lifecycle) attempt: Option<i32>,
    /// Record that the create of this attempt's workload is issued.
    pub(in crate::lifecycle) launched_attempt: Option<i32>,
    /// New recovery count.
    pub(in crate::lifecycle) recovery_count: Option<i32>,
    /// New restart count.
    pub(in crate::lifecycle) restart_count: Option<i32>,
    /// New exit code.
    pub(in crate::lifecycle) exit_code: Option<Option<i32>>,
    /// New failure reason (`status.failureReason`).
    pub(in crate::lifecycle) failure_reason: Option<Option<Failure>>,
    /// New workload.
    pub(in crate::lifecycle) workload: Option<Option<Workload>>,
    /// New back-off deadline (ms since epoch).
    pub(in crate::lifecycle) backoff_until_ms: Option<Option<i64>>,
    /// Set started_at (only if still unset).
    pub(in crate::lifecycle) started_now: bool,
    /// Start (now) or clear the current attempt's launch clock (`launched_at_ms`).
    pub(in crate::lifecycle) launch_clock: Option<LaunchClock>,
    /// New launch-timeouts-in-a-row count.
    pub(in crate::lifecycle) launch_timeouts: Option<i32>,
    /// Count one more job controller start.
    pub(in crate::lifecycle) controller_started: bool,
    /// Count one more job controller crash.
    pub(in crate::lifecycle) controller_crashed: bool,
    /// Forget the crashes counted so far (the job made progress since).
    pub(in crate::lifecycle) reset_crashes: bool,
    /// Move a pipeline to this task (the next one): it begins at the change's attempt, its
    /// start time is cleared ([`super::tasks`]).
    pub(in crate::lifecycle) task_index: Option<i32>,
    /// Start (now, unless it runs already) or clear the clock of the current Pod's wait for a
    /// node (`node_wait_since_ms`).
    pub(in crate::lifecycle) node_wait: Option<LaunchClock>,
    /// The job goes to the back of its queue: its place (`queued_at_ms`) becomes now.
    pub(in crate::lifecycle) requeue: bool,
    /// Why the queued job waits (kept only while it is Waiting).
    pub(in crate::lifecycle) wait_reason: Option<WaitReason>,
    /// New count of relaunches decided by a rule's `Ignore`.
    pub(in crate::lifecycle) ignored_count: Option<i32>,
    /// The record of the attempt that ended (its `finished_at` is stamped when applied), added
    /// to `attempts` (the latest [`MAX_ATTEMPT_RECORDS`] are kept).
    pub(in crate::lifecycle) attempt_record: Option<AttemptStatus>,
    /// New count of a multi-node job's ready members (`3/4`).
    pub(in crate::lifecycle) ready_nodes: Option<Option<String>>,
    /// The pool the job is admitted onto, and what it adds to its Pods (`pool`, `placement`);
    /// None inside: no pool (a queue without pools).
    pub(in crate::lifecycle) placement: Option<Option<crate::resources::Placement>>,
    /// Choose the job as a preemption victim of this queue, decided at this time (ms since
    /// epoch): `preempt_requested`, `preempted_by`, `preempted_at_ms` and one more preemption.
    pub(in crate::lifecycle) preempt: Option<(String, i64)>,
    /// The preemption was carried out (or overtaken by a suspend or a cancel): clear
    /// `preempt_requested`.
    pub(in crate::lifecycle) preempt_done: bool,
    /// The current attempt's workload stopped running (a stop that requeues the job): clear
    /// `running_since_ms`.
    pub(in crate::lifecycle) stopped_running: bool,
    /// The job's and its task's deadline clocks restart at the next run (`started_at_ms`,
    /// `task_started_at_ms` cleared): a stop that requeues it, as a suspended batch/v1 Job's
    /// `startTime` is reset, so time held or waiting never counts against
    /// `activeDeadlineSeconds`.
    pub(in crate::lifecycle) reset_started: bool,
}

/// What a [`Change`] does to the current attempt's launch clock (`launched_at_ms`, from which
/// the launch deadline counts), or to the clock of its Pod's wait for a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchClock {
    /// Start it now: the attempt is launched, or its Pod was bound after waiting for a node.
    Start,
    /// Stop it: the Pod waits for a node (no deadline while it does: a cluster autoscaler may
    /// take long, and it holds no launch slot).
    Clear,
}

impl Change {
    /// A change that only records `reason` (every field stays).
    pub(in crate::lifecycle) fn because(reason: Reason) -> Change {
        Change {
            reason,
            phase: None,
            schedule: None,
            message: None,
            controller: None,
            attempt: None,
            launched_attempt: None,
            recovery_count: None,
            restart_count: None,
            exit_code: None,
            failure_reason: None,
            workload: None,
            backoff_until_ms: None,
            started_now: false,
            launch_clock: None,
            launch_timeouts: None,
            controller_started: false,
            controller_crashed: false,
            reset_crashes: false,
            task_index: None,
            node_wait: None,
            requeue: false,
            wait_reason: None,
            ignored_count: None,
            attempt_record: None,
            ready_nodes: None,
            placement: None,
            preempt: None,
            preempt_done: false,
            stopped_running: false,
            reset_started: false,
        }
    }

    /// Sets the phase and schedule state.
    pub(in crate::lifecycle) fn to(mut self, phase: JobPhase, schedule: ScheduleState) -> Change {
        self.phase = Some(phase);
        self.schedule = Some(schedule);
        self
    }

    /// Sets the message.
    pub(in crate::lifecycle) fn message(mut self, message: impl Into<String>) -> Change {
        self.message = Some(message.into());
        self
    }

    /// Why the change is made.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// The phase it moves to, if it moves the phase.
    pub fn phase(&self) -> Option<JobPhase> {
        self.phase
    }

    /// The schedule state it moves to, if it moves it.
    pub fn schedule(&self) -> Option<ScheduleState> {
        self.schedule
    }

    /// The message it writes, if any (before a pipeline's task label is added).
    pub fn new_message(&self) -> Option<&str> {
        self.message.as_deref()
    }

    /// The attempt it moves to, if any.
    pub fn attempt(&self) -> Option<i32> {
        self.attempt
    }

    /// The exit code it writes: `Some(None)` clears it.
    pub fn exit_code(&self) -> Option<Option<i32>> {
        self.exit_code
    }

    /// The failure reason it writes: `Some(None)` clears it.
    pub fn failure_reason(&self) -> Option<Option<&Failure>> {
        self.failure_reason.as_ref().map(Option::as_ref)
    }

    /// True when it counts one more crash of the job's controller.
    pub fn counts_a_crash(&self) -> bool {
        self.controller_crashed
    }

    /// The job controller process it records (`Some(None)`: it clears the recorded one).
    pub fn controller(&self) -> Option<Option<(i32, u64)>> {
        self.controller
    }

    /// Why the queued job waits, if it says.
    pub fn wait_reason(&self) -> Option<WaitReason> {
        self.wait_reason
    }

    /// True when it sends the job to the back of its queue.
    pub fn requeues(&self) -> bool {
        self.requeue
    }

    /// The record of the attempt that ended, when it records one: what was decided, and by
    /// which rule.
    pub fn attempt_record(&self) -> Option<&AttemptStatus> {
        self.attempt_record.as_ref()
    }

    /// Adds `notes` (what a stop had to force) to the message, in parentheses.
    pub(in crate::lifecycle) fn with_notes(mut self, notes: &[String]) -> Change {
        if !notes.is_empty()
            && let Some(m) = &mut self.message
        {
            m.push_str(&format!(" ({})", notes.join("; ")));
        }
        self
    }
}

/// A named transition: the state its writer read the job in ([`Expect`], checked by the store's
/// compare-and-set) and the [`Change`] to apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The state the writer read the job in.
    pub expect: Expect,
    /// What to write.
    pub change: Change,
}

impl Transition {
    pub(in crate::lifecycle) fn new(expect: Expect, change: Change) -> Transition {
        Transition { expect, change }
    }

    /// Narrows the guard to the phase the row was read in.
    pub(in crate::lifecycle) fn with_row_phase(mut self, row: &JobRow) -> Transition {
        self.expect.phases = vec![row.phase];
        self
    }

    /// This transition with `notes` (what the stop before it had to force) appended to its
    /// message.
    pub fn with_notes(mut self, notes: &[String]) -> Transition {
        self.change = self.change.with_notes(notes);
        self
    }

    /// This transition, decided at `decided_ms` but written only at `now_ms` (both ms since
    /// epoch), after the stop or removal of the workload it waited for: a back-off it starts
    /// counts from now, when the workload is gone, not from the decision. Without it a removal
    /// or a graceful stop that took longer than the back-off ate it, and a job whose launch
    /// timed out took the launch slot back before the jobs queued behind it (issue 30's CI: a
    /// 0.2 s back-off spent waiting for a Pod's deletion under load).
    pub fn written_at(mut self, decided_ms: i64, now_ms: i64) -> Transition {
        let late = (now_ms - decided_ms).max(0);
        if let Some(Some(until)) = self.change.backoff_until_ms.as_mut() {
            *until += late;
        }
        self
    }
}

/// Checks that `change` applied to `row` keeps both state machines legal ([`edges::check`]):
/// the schedule edge and the phase edge are legal and the state it leads to is one a job may be
/// in (Done exactly with a terminal phase, Inactive and Waiting only while Pending, Pending
/// only queued or being admitted, Cancelling only after a persisted cancel request).
pub fn check_edge(row: &JobRow, change: &Change) -> Result<(), IllegalTransition> {
    let to = (
        change.phase.unwrap_or(row.phase),
        change.schedule.unwrap_or(row.schedule_state),
    );
    edges::check(row, change.reason, to)
}

/// The record `before` becomes with `change` at `now_ms` (the guard already matched):
///
/// - the move is checked ([`check_edge`]); an illegal one is an error and changes nothing;
/// - each field the change sets is set; the phase's change time, the finish time (at a
///   terminal phase), the start times (first run of the job and of its task), the launch and
///   node-wait clocks and the queue entry (a requeue) are stamped `now_ms`;
/// - the controller counters move, a job that left Waiting has no queue position;
/// - a pipeline's task records follow the job ([`tasks::follow`]);
/// - `status_version` is bumped: the API must see it.
pub fn apply(before: &JobRow, change: &Change, now_ms: i64) -> Result<JobRow, IllegalTransition> {
    check_edge(before, change)?;
    let now = now_ms;
    let mut after = before.clone();
    if let Some(p) = change.phase {
        if p != after.phase {
            after.phase_changed_at_ms = now;
        }
        after.phase = p;
        if p.is_terminal() && after.finished_at_ms.is_none() {
            after.finished_at_ms = Some(now);
        }
    }
    if let Some(s) = change.schedule {
        after.schedule_state = s;
    }
    if let Some(m) = &change.message {
        after.message = super::tasks::capped(m);
    }
    if let Some(c) = change.controller {
        after.controller_pid = c.map(|(pid, _)| pid);
        after.controller_start_time = c.map(|(_, t)| t);
    }
    if let Some(a) = change.attempt {
        after.attempt = a;
    }
    if let Some(a) = change.launched_attempt {
        after.launched_attempt = a;
    }
    if let Some(n) = change.recovery_count {
        after.recovery_count = n;
    }
    if let Some(n) = change.restart_count {
        after.restart_count = n;
    }
    if let Some(n) = change.ignored_count {
        after.ignored_count = n;
    }
    if let Some(record) = &change.attempt_record {
        let mut record = record.clone();
        record.finished_at = Some(super::clock::time_in_seconds(now));
        after.attempts.push(record);
        let extra = after.attempts.len().saturating_sub(MAX_ATTEMPT_RECORDS);
        after.attempts.drain(..extra);
    }
    if let Some(c) = change.exit_code {
        after.exit_code = c;
    }
    if let Some(r) = &change.failure_reason {
        after.failure_reason = r.clone();
    }
    if let Some(w) = &change.workload {
        after.workload = w.clone();
    }
    if let Some(r) = &change.ready_nodes {
        after.ready_nodes = r.clone();
    }
    if let Some(p) = &change.placement {
        after.pool = p.as_ref().map(|p| p.pool.clone());
        after.placement = p.clone();
    }
    if let Some(b) = change.backoff_until_ms {
        after.backoff_until_ms = b;
    }
    match change.launch_clock {
        Some(LaunchClock::Start) => after.launched_at_ms = Some(now),
        Some(LaunchClock::Clear) => after.launched_at_ms = None,
        None => {}
    }
    if let Some(n) = change.launch_timeouts {
        after.launch_timeouts = n;
    }
    match change.node_wait {
        Some(LaunchClock::Start) if after.node_wait_since_ms.is_none() => {
            after.node_wait_since_ms = Some(now)
        }
        Some(LaunchClock::Clear) => after.node_wait_since_ms = None,
        _ => {}
    }
    if change.requeue {
        after.queued_at_ms = now;
    }
    if change.reset_started {
        after.started_at_ms = None;
        after.task_started_at_ms = None;
    }
    if change.started_now && after.started_at_ms.is_none() {
        after.started_at_ms = Some(now);
    }
    if change.started_now {
        after.running_since_ms = Some(now);
    }
    if change.stopped_running {
        after.running_since_ms = None;
    }
    if let Some((queue, at)) = &change.preempt {
        after.preempt_requested = true;
        after.preempted_by = Some(queue.clone());
        after.preempted_at_ms = Some(*at);
        after.preemptions += 1;
    }
    if change.preempt_done {
        after.preempt_requested = false;
    }
    if let Some(task) = change.task_index {
        after.task_index = task;
        after.task_first_attempt = after.attempt;
        after.task_started_at_ms = None;
    }
    if change.started_now && after.task_started_at_ms.is_none() {
        after.task_started_at_ms = Some(now);
    }
    if change.controller_started {
        after.controller_starts += 1;
    }
    if change.reset_crashes {
        after.controller_crashes = 0;
    }
    if change.controller_crashed {
        after.controller_crashes += 1;
    }
    if let Some(r) = change.wait_reason {
        after.wait_reason = Some(r);
    }
    // Only a pass that tells a waiting job its group's reason marks it so
    // (`scheduler::tell_waiting`, in the store); any other change may have set its message.
    after.reason_key = match change.wait_reason {
        Some(r) if change.message.is_some() => super::record::said_key(r, &after.message),
        _ => 0,
    };
    if after.schedule_state != ScheduleState::Waiting {
        after.queue_position = None;
        after.wait_reason = None;
        after.reason_key = 0;
    }
    tasks::follow(
        before,
        &mut after,
        tasks::Written {
            message: change.message.as_deref(),
            exit_code: change.exit_code,
            failure_reason: change.failure_reason.as_ref(),
        },
        now,
    );
    after.status_version += 1;
    Ok(after)
}

/// True when `after` moved the phase or the schedule state of `before`: the move is recorded in
/// the job's history.
pub fn moved(before: &JobRow, after: &JobRow) -> bool {
    before.state() != after.state()
}
