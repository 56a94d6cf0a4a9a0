//! The names of the two state machines ([`JobPhase`], [`ScheduleState`];
//! `docs/design.md#two-state-machines`), a pipeline task's phase ([`TaskPhase`]) and the
//! executors ([`ExecutorKind`]), as the API shows them and the store keeps them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The phase of one task of a pipeline: the job's phases (without Submitted, a job-level
/// step) plus Skipped, for a task that never runs because an earlier one failed or the job was
/// cancelled.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum TaskPhase {
    /// Not launched yet.
    #[default]
    Pending,
    /// Launching its workload.
    Starting,
    /// Its workload runs.
    Running,
    /// Relaunching after preemption or restarting after an error.
    Recovering,
    /// Being stopped by a cancel.
    Cancelling,
    /// Held by `spec.suspend` while it was the current task: not running, resumed when the job is.
    Suspended,
    /// Its workload exited 0.
    Succeeded,
    /// Cancelled while it was the current task.
    Cancelled,
    /// Failed with its restarts spent.
    Failed,
    /// Its setup failed.
    FailedSetup,
    /// It could not be launched (refused, invalid).
    FailedPrecheck,
    /// Its launch was impossible within its limits.
    FailedNoResource,
    /// An internal error while it was current.
    FailedController,
    /// Never run: an earlier task failed, or the job was cancelled first.
    Skipped,
}

impl TaskPhase {
    /// The task phase that a job in `phase` gives its current task.
    pub fn of_job(phase: JobPhase) -> TaskPhase {
        match phase {
            JobPhase::Pending | JobPhase::Submitted => TaskPhase::Pending,
            JobPhase::Starting => TaskPhase::Starting,
            JobPhase::Running => TaskPhase::Running,
            JobPhase::Recovering => TaskPhase::Recovering,
            JobPhase::Cancelling => TaskPhase::Cancelling,
            JobPhase::Suspended => TaskPhase::Suspended,
            JobPhase::Succeeded => TaskPhase::Succeeded,
            JobPhase::Cancelled => TaskPhase::Cancelled,
            JobPhase::Failed => TaskPhase::Failed,
            JobPhase::FailedSetup => TaskPhase::FailedSetup,
            JobPhase::FailedPrecheck => TaskPhase::FailedPrecheck,
            JobPhase::FailedNoResource => TaskPhase::FailedNoResource,
            JobPhase::FailedController => TaskPhase::FailedController,
        }
    }

    /// True once the task can change no more: Succeeded, Cancelled, Skipped and Failed*.
    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            TaskPhase::Pending
                | TaskPhase::Starting
                | TaskPhase::Running
                | TaskPhase::Recovering
                | TaskPhase::Cancelling
                | TaskPhase::Suspended
        )
    }
}

/// The phase a user sees. Terminal: Succeeded, Cancelled and the five Failed*. Cancelling is
/// not terminal.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    JsonSchema,
    strum::VariantArray,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
pub enum JobPhase {
    /// Waiting for a slot.
    Pending,
    /// Job controller process started.
    Submitted,
    /// Launching the workload.
    Starting,
    /// Workload running.
    Running,
    /// Relaunching after preemption, node loss, or restarting after an error.
    Recovering,
    /// Workload finished with exit code 0.
    Succeeded,
    /// Cancel requested; the workload is being stopped.
    Cancelling,
    /// Held by `spec.suspend`: not admitted, or stopped gracefully and its run slot given back;
    /// it waits again once `spec.suspend` is false. Not terminal.
    Suspended,
    /// Cancelled and cleaned up.
    Cancelled,
    /// The workload failed and its restart budget is spent.
    Failed,
    /// The setup script (or an init container) failed.
    FailedSetup,
    /// The job could not be submitted (e.g. its executor is disabled, a quota refused its Pod).
    FailedPrecheck,
    /// The launch was impossible within its limits.
    FailedNoResource,
    /// An internal error that resumption could not repair.
    FailedController,
}

impl JobPhase {
    /// Every phase, in SkyPilot's order.
    pub const ALL: &'static [JobPhase] = <JobPhase as strum::VariantArray>::VARIANTS;

    /// True for Succeeded, Cancelled and every Failed*. Cancelling is not terminal.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobPhase::Succeeded | JobPhase::Cancelled) || self.is_failure()
    }

    /// True for the five Failed* phases.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            JobPhase::Failed
                | JobPhase::FailedSetup
                | JobPhase::FailedPrecheck
                | JobPhase::FailedNoResource
                | JobPhase::FailedController
        )
    }

    /// The name as stored and shown (`Pending`, `FailedSetup`, ...).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses [`JobPhase::as_str`]'s output; `None` for anything else.
    pub fn parse(s: &str) -> Option<JobPhase> {
        s.parse().ok()
    }
}

/// The scheduler's state of a job (SkyPilot's ManagedJobScheduleState).
///
/// `Inactive -> Waiting -> Launching -> Alive -> (AliveWaiting -> Launching -> Alive)* -> Done`;
/// Inactive/Waiting may go straight to Done when cancelled. Nothing leaves Done.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    JsonSchema,
    strum::VariantArray,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
pub enum ScheduleState {
    /// Known to the store, not yet submitted to the scheduler; or suspended (`spec.suspend`,
    /// phase Suspended): never admitted until resumed.
    Inactive,
    /// Queued for its first launch.
    Waiting,
    /// Holds a launch slot (and a run slot).
    Launching,
    /// Its job controller process runs and is not launching (holds a run slot).
    Alive,
    /// Alive and asking for a launch slot to relaunch (recovery or restart).
    AliveWaiting,
    /// Finished; the phase is terminal.
    Done,
}

impl ScheduleState {
    /// Every schedule state, in lifecycle order.
    pub const ALL: &'static [ScheduleState] = <ScheduleState as strum::VariantArray>::VARIANTS;

    /// The states that hold a run slot and have a job controller process.
    pub const LIVE: [ScheduleState; 3] = [
        ScheduleState::Launching,
        ScheduleState::Alive,
        ScheduleState::AliveWaiting,
    ];

    /// True for the states that hold a run slot and have a job controller process.
    pub fn holds_run_slot(self) -> bool {
        ScheduleState::LIVE.contains(&self)
    }

    /// The name as stored and shown.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses [`ScheduleState::as_str`]'s output.
    pub fn parse(s: &str) -> Option<ScheduleState> {
        s.parse().ok()
    }
}

/// Which executor runs a spec: `local` for `run`, `pod` for `template`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::VariantArray,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
#[strum(serialize_all = "lowercase")]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// A process group on the controller node.
    Local,
    /// A Pod in the job's namespace.
    Pod,
}

/// What the rest of the operator knows of an executor kind, declared once per kind
/// ([`ExecutorKind::facts`]) so that nothing else matches on the kind (the executor itself is
/// chosen in `executor::for_job`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecutorFacts {
    /// Its name: `spec`-derived, stored in the job record, named by `--executors`.
    pub name: &'static str,
    /// Its workloads are processes on the operator's node, marked in the state dir: they need
    /// `/bin/sh`, a job given up has them stopped by the engine, the world check finds them by
    /// their mark.
    pub local_processes: bool,
    /// Its workloads are API objects in the job's namespace that the operator's shared watch
    /// reports (Pods): a job given up has them deleted by the world check, a lost store is
    /// rebuilt from them, `managed-jobs logs` reads them through the API.
    pub api_objects: bool,
}

impl ExecutorKind {
    /// Every kind.
    pub const ALL: &'static [ExecutorKind] = <ExecutorKind as strum::VariantArray>::VARIANTS;

    /// What the operator knows of this kind.
    pub const fn facts(self) -> ExecutorFacts {
        match self {
            ExecutorKind::Local => ExecutorFacts {
                name: "local",
                local_processes: true,
                api_objects: false,
            },
            ExecutorKind::Pod => ExecutorFacts {
                name: "pod",
                local_processes: false,
                api_objects: true,
            },
        }
    }

    /// `local` or `pod`.
    pub fn as_str(self) -> &'static str {
        self.facts().name
    }

    /// Parses `local` or `pod`.
    pub fn parse(s: &str) -> Option<ExecutorKind> {
        s.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_phases_match_the_design() {
        let terminal: Vec<_> = JobPhase::ALL
            .iter()
            .copied()
            .filter(|p| p.is_terminal())
            .collect();
        assert_eq!(terminal.len(), 7);
        assert!(!JobPhase::Cancelling.is_terminal());
        for &p in JobPhase::ALL {
            assert_eq!(JobPhase::parse(p.as_str()), Some(p));
        }
    }
}

/// Why a queued job is not admitted yet (the reason of its `Admitted` condition,
/// `docs/design.md#queues`): its queue, its namespace, its queue's limits, its queue's share or
/// the operator's caps.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::VariantArray,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
pub enum WaitReason {
    /// Its queue (`spec.queue`) has no ManagedJobQueue object: it waits until one is applied.
    QueueMissing,
    /// Its queue's `namespaceSelector` does not match the job's namespace: it never runs there.
    NamespaceNotAdmitted,
    /// Its queue holds `maxRunning` run slots.
    QueueMaxRunning,
    /// Its queue holds `maxLaunching` launch slots.
    QueueMaxLaunching,
    /// The run cap is full and its queue holds at least its weighted share: another queue gets
    /// the next free run slot.
    ShareUsed,
    /// Every run slot of the operator is held, and its queue is next.
    RunCapReached,
    /// Every launch slot of the operator is held.
    LaunchCapReached,
    /// Admitted at the next scheduling pass (or in a back-off after its Pod waited too long for
    /// a node).
    Queued,
    /// Preempted: another queue below its share (or a higher priority of its own queue) took
    /// its run slot; it waits again, first in its queue.
    Preempted,
    /// Its demand fits none of its queue's pools within the queue's quota and what its cohort
    /// can lend now (the message gives the numbers).
    InsufficientQuota,
    /// Its queue's quota allows it, but no pool's Ready nodes can take all its members now (the
    /// message gives the largest fit), or the nodes are not known yet.
    InsufficientCapacity,
    /// None of the pools its queue lists exists (no ManagedJobPool of those names).
    PoolMissing,
}

impl WaitReason {
    /// Every reason.
    pub const ALL: &'static [WaitReason] = <WaitReason as strum::VariantArray>::VARIANTS;

    /// The CamelCase name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Parses [`WaitReason::as_str`]'s output.
    pub fn parse(s: &str) -> Option<WaitReason> {
        s.parse().ok()
    }
}
