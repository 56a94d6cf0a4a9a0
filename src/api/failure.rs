//! Failure rules users can state (`spec.failurePolicy`, `spec.tasks[].failurePolicy`;
//! docs/design.md#failure-rules): an ordered list shaped like batch/v1 `podFailurePolicy`,
//! whose first rule that matches an ended attempt decides what happens to the job, and each
//! attempt's record in the status ([`AttemptStatus`]: which rule matched and what it did).
//!
//! What a rule matches and what its action does are decided in `lifecycle::rules`; these are
//! the shapes only.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most rules in one `failurePolicy` (batch/v1 `podFailurePolicy` allows 20). Lower, so the
/// API server's cost estimate of the rule that no exit code is listed by two rules (a product
/// of rules and codes, counted once per possible task) stays within its limit.
pub const MAX_FAILURE_RULES: usize = 16;
/// Most rules in a task's own `failurePolicy`: the API server counts a task's rules once per
/// possible task (32), so they must be cheaper still.
pub const MAX_TASK_FAILURE_RULES: usize = 8;
/// Most exit codes in one rule's `onExitCodes.values` (batch/v1 allows 255; see
/// [`MAX_FAILURE_RULES`] for why it is lower).
pub const MAX_RULE_EXIT_CODES: usize = 32;
/// Most Pod conditions, or reasons, one rule lists (batch/v1 allows 20 conditions).
pub const MAX_RULE_ITEMS: usize = 16;
/// How many ended attempts `status.attempts` keeps: the latest ones (the status must stay
/// small; the history of every attempt is in the job's Events).
pub const MAX_ATTEMPT_RECORDS: usize = 10;
/// `spec.recovery.maxIgnored` when unset: relaunches a rule's `Ignore` may cost a task before
/// its outcomes are decided as if no rule matched. Ten relaunches at the doubling back-off
/// (first at once, then 1 s, 2 s ... 256 s with the default `--restart-backoff-seconds`) ride
/// out a burst of disruptions for about 8.5 minutes, and end a failure wrongly marked `Ignore`
/// as soon.
pub const DEFAULT_MAX_IGNORED: i32 = 10;

/// Ordered failure rules (`spec.failurePolicy`, or a task's own). The first rule that matches
/// an ended attempt decides; when none matches, the operator's defaults apply
/// (docs/design.md#failures). A task with its own policy uses only its own rules; a task
/// without one uses the job's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicy {
    /// The rules, evaluated in order; the first that matches wins. 1 to 16 (a task's own: 1
    /// to 8).
    pub rules: Vec<FailureRule>,
}

/// One failure rule: what it matches (exactly one of `onExitCodes`, `onPodConditions` and
/// `onReasons`) and what it does then (`action`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureRule {
    /// A name for the rule (a DNS label, unique in its list; not `default`), shown in the
    /// status, messages and Events of the attempts it decides. Unset: `rules[<index>]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What happens when the rule matches.
    pub action: FailureAction,
    /// Matches a non-zero exit code of a container (or init container) of the attempt's Pod,
    /// or of the local executor's `setup` or `run` script (a script killed by signal N exits
    /// 128+N, as a container does). Never a lost Pod's (evicted, preempted, deleted while it
    /// ran): its containers exited because they were stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit_codes: Option<OnExitCodes>,
    /// Matches when the attempt's Pod had one of these conditions (e.g. `DisruptionTarget`:
    /// evicted, preempted, deleted by the pod GC or the taint manager, lost with its node).
    /// Pod jobs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_pod_conditions: Option<Vec<OnPodCondition>>,
    /// Matches a termination reason (CamelCase): a container's (`OOMKilled`, `Error`,
    /// `ContainerCannotRun`), the node's refusal of the Pod (`OutOfcpu`, `OutOfmemory`,
    /// `UnexpectedAdmissionError`, `NodeAffinity`...), a disruption's (`PreemptionByScheduler`,
    /// `EvictionByEvictionAPI`, `DeletionByPodGC`, `TerminationByKubelet`), `Evicted`,
    /// `PodDeleted` (deleted by someone else), `NodeLost` (its Node was deleted),
    /// `NodeNotReady` (its node not Ready past the operator's grace, or forced off a node that
    /// is not Ready), `WorkloadVanished`; for local jobs `ExitCode`, `SetupFailed`,
    /// `KilledBySignal<N>` and `ProcessLost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_reasons: Option<Vec<String>>,
}

/// What a matching rule does with the job.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    JsonSchema,
    strum::VariantArray,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
pub enum FailureAction {
    /// Fail the job at once (batch/v1 `FailJob`), whatever budget is left.
    #[default]
    FailJob,
    /// Restart the job, counted against `recovery.maxRestartsOnErrors`, after the restart
    /// back-off (batch/v1 `Count`).
    Restart,
    /// Relaunch the job without counting a restart, counted against `recovery.maxRecoveries`
    /// (the first at once, later ones after a back-off), as a lost workload is (SkyPilot's
    /// `recover_on_exit_codes`).
    Recover,
    /// Relaunch the job counting neither a restart nor a recovery (batch/v1 `Ignore`), with the
    /// recovery back-off, at most `recovery.maxIgnored` times per task (default 10); past that
    /// the attempt is decided as if no rule matched.
    Ignore,
}

impl FailureAction {
    /// Every action.
    pub const ALL: &'static [FailureAction] = <FailureAction as strum::VariantArray>::VARIANTS;

    /// The CamelCase name, as written in the spec.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// `onExitCodes` of a rule (batch/v1 `PodFailurePolicyOnExitCodesRequirement`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OnExitCodes {
    /// Only this container's (or init container's) exit code; for a local job `setup` or
    /// `run`. Unset: any of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
    /// `In`: the exit code is one of `values`; `NotIn`: it is none of them. An exit code 0 is a
    /// success and never matches.
    pub operator: ExitCodeOperator,
    /// Exit codes, 1 to 32 distinct ones; 0 cannot be listed with `In` (it never matches).
    pub values: Vec<i32>,
}

/// How `onExitCodes.values` is read.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ExitCodeOperator {
    /// The exit code is one of the values.
    #[default]
    In,
    /// The exit code is none of the values (and not 0).
    NotIn,
}

/// One Pod condition a rule matches (batch/v1 `PodFailurePolicyOnPodConditionsPattern`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OnPodCondition {
    /// The condition's type, e.g. `DisruptionTarget`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Its status: `True` (the default), `False` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// How one attempt ended and what was decided (`status.attempts[]`, the latest
/// [`MAX_ATTEMPT_RECORDS`]): the rule that matched (`default` when none did) and its action.
/// Attempts the operator itself ended (a cancel, a deadline, a launch timeout) have no record.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptStatus {
    /// The attempt's number, counted over the whole job (as `status.attempt`).
    pub attempt: i32,
    /// The rank that decided a multi-node attempt's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<i32>,
    /// A pipeline's task the attempt ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// Exit code of the part that decided the outcome, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// CamelCase reason of the outcome: `Succeeded`, or what ended it (`ExitCode`, `Error`,
    /// `OOMKilled`, `OutOfcpu`, `EvictionByEvictionAPI`, `PodDeleted`...).
    pub reason: String,
    /// The rule that matched: its name, `rules[<index>]`, or `default` when none matched (or
    /// the one that matched had no budget left: the message says so).
    pub rule: String,
    /// What was decided: `Succeeded`, `FailJob`, `Restart`, `Recover` or `Ignore` (a
    /// `Restart` or `Recover` without budget left fails the job; the message says so).
    pub action: String,
    /// When the attempt's end was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
}
