//! Every rule about a job's life, in one place and free of I/O (`docs/design.md`, "Two state
//! machines" to "Processes, crashes and resumption").
//!
//! A job carries two state machines: the user-facing phase ([`JobPhase`]) and the scheduler's
//! state ([`ScheduleState`]). This module is their single source of truth. Its files, each
//! using only those listed before it:
//!
//! - [`clock`]: time in ms since the epoch, the back-off between attempts;
//! - [`entry`]: a job's place in its queue (FIFO in the order the API server accepted the
//!   jobs: the creation second, then the resourceVersion first seen);
//! - [`claim`]: one owner per job: the claim an operator holds on a namespace's jobs (when to
//!   take, renew or leave it, what it allows its job controllers, when a row is stale);
//! - [`reason`]: why a transition happened ([`Reason`]) and why a job failed ([`Failure`]:
//!   the operator's [`FailureReason`] or the workload's text);
//! - [`nodes`]: when the node a member is bound to loses it (deleted, or not Ready past the
//!   grace: [`nodes::member_lost`]);
//! - [`outcome`]: what executors report ([`Workload`], [`Outcome`] and the [`Evidence`]
//!   failure rules read, [`Refused`]);
//! - [`members`]: what is observed of an attempt's members ([`Observed`], [`Member`],
//!   [`MemberState`], kind-neutral) and what they mean for the attempt ([`view`]: all or
//!   nothing, fail fast, recover as one);
//! - [`rules`]: failure rules: which rule of a task's policy decides an ended attempt
//!   ([`rules::decide`], [`Verdict`]);
//! - [`record`]: the job record ([`JobRow`], its columns declared once) and its history entries;
//! - [`tasks`]: a pipeline's current task and how each task's record follows the job;
//! - [`deadlines`]: the job's and its task's deadlines, the launch deadline;
//! - [`edges`]: the legal moves ([`SCHEDULE_EDGES`], [`PHASE_EDGES`], [`legal_state`]) and the
//!   guard of a compare-and-set ([`Expect`]);
//! - [`change`]: a [`Change`] (built only here) and how it is applied to a record ([`apply`]);
//! - [`transitions`]: the named transitions ([`admit`], [`controller_started`],
//!   [`launch_intent`], [`running`], [`after_outcome`], ...), each a guard and a change;
//! - [`decide`]: a job controller's next step ([`next_action`]), a refused launch, when an
//!   attempt's logs are kept ([`keep_logs`]);
//! - [`supervise`]: the operator's choices around job controllers: a cancel's route, a
//!   controller's exit, a failed spawn, the start-up sweep;
//! - [`submit`]: a ManagedJob's first sight; [`restore`](mod@restore): a record rebuilt from a status;
//! - [`world`]: the store checked against the world (objects, Pods, processes), store fencing;
//! - [`faults`]: wrong changes, for tests only.
//!
//! The processes only read, call these functions, and carry out the result (a compare-and-set,
//! a launch, a stop); the property tests (`tests/scheduler_props.rs`, `tests/world_props.rs`)
//! drive the same functions.
//!
//! [`JobPhase`]: crate::api::JobPhase
//! [`ScheduleState`]: crate::api::ScheduleState

pub mod change;
pub mod claim;
pub mod clock;
pub mod deadlines;
pub mod decide;
pub mod edges;
pub mod entry;
#[doc(hidden)]
pub mod faults;
pub mod members;
pub mod nodes;
pub mod outcome;
pub mod reason;
pub mod record;
pub mod restore;
pub mod rules;
pub mod submit;
pub mod supervise;
pub mod tasks;
#[cfg(test)]
mod tests;
pub mod transitions;
pub mod world;

pub use change::{Change, LaunchClock, Transition, apply, check_edge};
pub use clock::{MAX_BACKOFF, backoff, earliest, now_ms};
pub use deadlines::stop_grace;
pub use decide::{
    Action, AfterRefusal, Context, KeepLogs, KeepMoment, action_grace, after_refusal, in_backoff,
    keep_logs, launch_unobserved, next_action, observes, stop_requested,
};
pub use edges::{
    Expect, IllegalTransition, PHASE_EDGES, SCHEDULE_EDGES, legal_phase_edge, legal_schedule_edge,
    legal_state,
};
pub use members::{Member, MemberState, Observed, View, view};
pub use outcome::{Evidence, Outcome, PartExit, Refused, Workload};
pub use reason::{Failure, FailureReason, Reason};
pub use record::{HistoryEntry, JobRow, Object, Step, said_key};
pub use restore::restore;
pub use rules::{Decision, Verdict};
pub use submit::{Submission, submission};
pub use supervise::{
    AfterSpawnFailure, AtStart, CancelRoute, ControllerBuild, ControllerExit, ExitSeen, Liveness,
    SpawnFailure, StopAfterGiveUp, SuspendRoute, after_spawn_failure, at_start, cancel_route,
    controller_exited, needs_controller, stop_after_give_up, stops_before_migration, suspend_route,
};
pub use transitions::{
    admit, admit_onto, after_outcome, backoff_over, cancel_queued, cancelled, cancelling,
    claim_lapsed, controller_gave_up, controller_resumed, controller_start_failed,
    controller_started, current_attempt, deadline_exceeded, fail, invalid_spec, launch_intent,
    launch_timed_out, node_wait_timed_out, nodes_ready, preempt, preempted, queued, queued_message,
    reason_and_message, reclaim, resumed, running, starting, stopping, suspend_queued, suspended,
    terminating, unschedulable, waiting_to_start,
};
