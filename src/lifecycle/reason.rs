//! Why a transition happened ([`Reason`]) and why a job failed ([`Failure`]: the operator's own
//! [`FailureReason`], or what the workload said).

use std::fmt;

/// Why a job moved: recorded with each history entry (`transitions.reason`) and read by the
/// Events (`events::events_for`). CamelCase, as Kubernetes reasons are.
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
pub enum Reason {
    /// The object was first seen (-> Pending + Inactive).
    Created,
    /// Queued for a launch slot (Inactive -> Waiting).
    Submitted,
    /// The store had lost the job and its object already carried a final status: stored Done
    /// with that phase, never run again (docs/design.md#a-lost-store).
    KeptFinalStatus,
    /// The store was lost and the job was rebuilt from its object's status.
    Restored,
    /// A scheduling pass gave the job a launch slot (Waiting/AliveWaiting -> Launching).
    Scheduled,
    /// A job controller process was started and recorded (Pending -> Submitted on the first).
    ControllerStarted,
    /// The recorded job controller process exited before the job was Done (it is resumed).
    ControllerExited,
    /// The first launch begins (-> Starting), with its launch intent.
    Starting,
    /// The create of an attempt's workload is about to be issued (`launched_attempt`).
    Launch,
    /// The attempt's workload runs (-> Running + Alive).
    Running,
    /// The attempt's Pod waits for a node: the launch slot is released, the run slot kept.
    Unschedulable,
    /// The workload exists but does not run yet (what it waits for changed).
    WaitingToStart,
    /// The workload was deleted by someone else and is terminating: no longer running.
    PodTerminating,
    /// A stop waits for the workload to go (the message says what it waits for).
    Stopping,
    /// The workload did not start within its launch deadline and was removed; requeued.
    LaunchTimedOut,
    /// A restart back-off ended: ask for a launch slot (Alive -> AliveWaiting).
    WaitingForLaunchSlot,
    /// The workload failed with restarts left (-> Recovering + Alive during the back-off).
    Restarting,
    /// The workload was lost (preemption, eviction, node loss), or a failure rule said
    /// `Recover`: -> Recovering (a recovery counted).
    Recovering,
    /// A failure rule said `Ignore`: -> Recovering, a relaunch counted as neither a restart nor
    /// a recovery (against `maxIgnored`).
    Ignored,
    /// A pipeline's task succeeded and the next one waits for a launch slot (-> Starting +
    /// AliveWaiting, the next task current).
    TaskSucceeded,
    /// Every part of the workload exited 0.
    Succeeded,
    /// The job ended in a failure phase.
    Failed,
    /// A cancel is being carried out (-> Cancelling).
    Cancelling,
    /// The cancel is done (-> Cancelled + Done).
    Cancelled,
    /// The job gave its run slot back (no node took its Pod) and queued again.
    Requeued,
    /// A queued job's message now says what it waits for.
    Queued,
    /// A local attempt was stopped because its operator's claim on the job's namespace lapsed
    /// (another operator may own the job now, `lifecycle::claim`): -> Recovering, a relaunch
    /// counted in no budget, once the claim is renewed.
    ClaimLapsed,
    /// `spec.suspend` held the job: a waiting one left the queue, a running one was stopped
    /// gracefully and gave its run slot back (-> Suspended + Inactive).
    Suspended,
    /// `spec.suspend` went back to false: the job waits again in its place (Suspended +
    /// Inactive -> Pending + Waiting).
    Resumed,
    /// A scheduling pass chose the job as a preemption victim: another queue below its share
    /// (or a higher priority of its own queue) takes its run slot; its controller stops it.
    PreemptionRequested,
    /// The victim's workload was stopped gracefully and the job waits again, first in its
    /// queue, its budgets untouched (-> Pending + Waiting).
    Preempted,
}

impl Reason {
    /// Every reason, for parsing and tests.
    pub const ALL: &'static [Reason] = <Reason as strum::VariantArray>::VARIANTS;

    /// The CamelCase name stored in the history.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The reason named `s`, if any.
    pub fn parse(s: &str) -> Option<Reason> {
        s.parse().ok()
    }
}

/// Why the operator or a job controller ended a job in a failure phase (`status.failureReason`,
/// as [`Failure::Operator`]). A workload's own failure carries the workload's reason instead
/// ([`Failure::Workload`]: `ExitCode`, `OOMKilled`, `KilledBySignal9`, an init container's
/// reason...).
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
pub enum FailureReason {
    /// The spec fails validation the API schema could not express.
    InvalidSpec,
    /// The spec asks for an executor this operator does not enable.
    ExecutorDisabled,
    /// The workload could not be started at all (e.g. the local spawn failed).
    LaunchFailed,
    /// The API refused the attempt's Pod for good (quota, admission, invalid template).
    PodRejected,
    /// The job ran past `spec.activeDeadlineSeconds`.
    DeadlineExceeded,
    /// The workload did not start within its launch deadline, `--max-launch-timeouts` times in
    /// a row, and nothing said why (otherwise the failure reason is what it waited on, e.g.
    /// `ImagePullBackOff`).
    LaunchTimeout,
    /// The workload was lost once more than `spec.recovery.maxRecoveries` allows.
    RecoveryBudgetSpent,
    /// The job controller process kept exiting before the job was Done.
    ControllerCrashed,
    /// No job controller process could be started.
    ControllerStartFailed,
    /// The API refused the workload because its namespace is being deleted. Never a job's
    /// failure: deleting a namespace cancels its jobs ([`super::decide::after_refusal`]).
    NamespaceTerminating,
    /// No node took the job's Pod within its launch timeout, `--max-launch-timeouts` times in
    /// a row while other jobs waited for a run slot.
    Unschedulable,
    /// The API kept failing the create of the attempt's Pod (HTTP 5xx, unreachable) until its
    /// launch deadline, `--max-launch-timeouts` times in a row.
    CreateFailed,
    /// The attempt's Pod was created but the operator's Pod watch never reported it before its
    /// launch deadline, `--max-launch-timeouts` times in a row.
    PodNotSeen,
    /// A failure rule whose action is `FailJob` matched the attempt's end (batch/v1 Jobs say
    /// `PodFailurePolicy`); the message names the rule, `status.attempts[]` the outcome.
    FailureRule,
}

impl FailureReason {
    /// The CamelCase name written to `status.failureReason`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Every reason, for parsing and tests.
    pub const ALL: &'static [FailureReason] = <FailureReason as strum::VariantArray>::VARIANTS;

    /// The reason named `s`, if it is one of the operator's.
    pub fn parse(s: &str) -> Option<FailureReason> {
        s.parse().ok()
    }
}

/// Why a job (or its attempt) failed, as `status.failureReason` says it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The operator's own reason ([`FailureReason`]).
    Operator(FailureReason),
    /// What the workload said, verbatim: its exit (`ExitCode`, `KilledBySignal9`,
    /// `SetupFailed`), its Pod's or container's reason (`OOMKilled`, `Error`, `OutOfcpu`,
    /// `InvalidImageName`), or what it waited on (`ImagePullBackOff`).
    Workload(String),
}

impl Failure {
    /// The CamelCase text of `status.failureReason`.
    pub fn as_str(&self) -> &str {
        match self {
            Failure::Operator(r) => r.as_str(),
            Failure::Workload(s) => s,
        }
    }

    /// The failure `s` names: one of the operator's reasons when it is one (a workload's text
    /// that happens to equal one reads the same either way), else the workload's.
    pub fn parse(s: &str) -> Failure {
        match FailureReason::parse(s) {
            Some(r) => Failure::Operator(r),
            None => Failure::Workload(s.to_string()),
        }
    }
}

impl From<FailureReason> for Failure {
    fn from(r: FailureReason) -> Failure {
        Failure::Operator(r)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip() {
        for &r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(r));
        }
        assert_eq!(Reason::parse("Bench"), None);
        for &r in FailureReason::ALL {
            assert_eq!(Failure::parse(r.as_str()), Failure::Operator(r));
        }
        let oom = Failure::parse("OOMKilled");
        assert_eq!(oom, Failure::Workload("OOMKilled".into()));
        assert_eq!(oom.to_string(), "OOMKilled");
    }
}
