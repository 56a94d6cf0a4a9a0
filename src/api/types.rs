//! The `ManagedJob` resource: what the user asks for ([`ManagedJobSpec`], a pipeline's
//! [`TaskSpec`]s), what the operator shows ([`ManagedJobStatus`], [`TaskStatus`]), and the
//! labels and finalizer the operator puts on objects.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::failure::{AttemptStatus, DEFAULT_MAX_IGNORED, FailurePolicy};
use super::states::{ExecutorKind, JobPhase, ScheduleState, TaskPhase};

/// API group of the resource.
pub const GROUP: &str = "managedjobs.dev";
/// Finalizer that holds a deleted ManagedJob until its workload is stopped and cleaned up.
pub const FINALIZER: &str = "managedjobs.dev/cleanup";
/// Label carrying the store's job id on every workload object (Pods).
pub const LABEL_JOB_ID: &str = "managedjobs.dev/job-id";
/// Label carrying the attempt number on every workload object (Pods).
pub const LABEL_ATTEMPT: &str = "managedjobs.dev/attempt";
/// Label carrying the task's name on every Pod of a pipeline (`spec.tasks`).
pub const LABEL_TASK: &str = "managedjobs.dev/task";
/// Label with a multi-node job's member rank (0..N-1) on each of its Pods.
pub const LABEL_RANK: &str = "managedjobs.dev/rank";
/// Label with a multi-node job's headless Service name on each of its Pods: the Service's
/// selector (unique per job object: the name carries the uid's tag).
pub const LABEL_GANG: &str = "managedjobs.dev/gang";
/// Label that assigns a ManagedJob (and its Pods) to an operator shard: the instance started
/// with `--shard NAME` owns the jobs labelled `managedjobs.dev/shard=NAME`; the default
/// instance owns the jobs without the label. Set at creation and never changed, finished jobs
/// included (a ValidatingAdmissionPolicy, `crds/managedjobs.dev_shard-policy.yaml`: a finished
/// job moved to another shard would be stored there again under a new id).
pub const LABEL_SHARD: &str = "managedjobs.dev/shard";

/// The label selector of the objects shard `shard` owns: `managedjobs.dev/shard=NAME`, or for
/// the default instance (None) `!managedjobs.dev/shard`.
pub fn shard_selector(shard: Option<&str>) -> String {
    match shard {
        Some(name) => format!("{LABEL_SHARD}={name}"),
        None => format!("!{LABEL_SHARD}"),
    }
}

/// What the user asks for. Immutable after creation except `priority` and `cancel`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "managedjobs.dev",
    version = "v1alpha1",
    kind = "ManagedJob",
    namespaced,
    status = "ManagedJobStatus",
    shortname = "mj",
    shortname = "mjob",
    printcolumn = r#"{"name":"Job-ID","type":"integer","jsonPath":".status.jobId","description":"Id the operator's store assigned"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.phase","description":"Phase of the job"}"#,
    printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".status.scheduleState","description":"Scheduler state"}"#,
    printcolumn = r#"{"name":"Task","type":"string","jsonPath":".status.taskProgress","description":"A pipeline's current task: <number>/<count> <name>"}"#,
    printcolumn = r#"{"name":"Nodes","type":"string","jsonPath":".status.readyNodes","description":"Running members of a multi-node job"}"#,
    printcolumn = r#"{"name":"Recoveries","type":"integer","jsonPath":".status.recoveryCount","description":"Relaunches after preemption or node loss"}"#,
    printcolumn = r#"{"name":"Queue","type":"string","jsonPath":".status.queue","priority":1,"description":"The ManagedJobQueue the job waits in"}"#,
    printcolumn = r#"{"name":"Owner","type":"string","jsonPath":".status.owner","priority":1,"description":"The operator instance that owns the job"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.message","priority":1,"description":"Latest status message"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ManagedJobSpec {
    /// Shell script run by `sh -c` on the controller node (the local executor). Exactly one of
    /// `run`, `template` and `tasks` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Shell script run before `run` in each attempt (local executor). A non-zero exit ends the
    /// attempt as FailedSetup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
    /// Environment of `setup` and `run`: the process sees these variables (plus PATH and the
    /// MANAGEDJOB_* variables), never the operator's own environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Pod template run by the pod executor, one Pod per attempt, restartPolicy Never. Exactly
    /// one of `run`, `template` and `tasks` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplateSpec>,
    /// Nodes of a multi-node job, 1..64: each attempt runs this many Pods from `template`
    /// (rank 0..N-1), placed, stopped and recovered all together, each with a DNS name and the
    /// variables distributed frameworks read (docs/concepts/multi-node.md). Unset: one Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i32>,
    /// Scheduling priority, -1000..1000; higher is admitted first, FIFO within a priority
    /// (within the job's queue: priorities never arbitrate between queues).
    #[serde(default)]
    pub priority: i32,
    /// The ManagedJobQueue the job waits in: its team's weighted share of the operator's caps.
    /// Unset: the queue `default`. Immutable. A queue that does not exist yet is waited for (the
    /// job starts once it is applied); a queue that does not admit the job's namespace never
    /// runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Restart and recovery budgets.
    #[serde(default)]
    pub recovery: RecoverySpec,
    /// Failure rules: what an attempt's end means, decided by the first rule that matches
    /// (docs/design.md#failure-rules). Unset: the operator's defaults (a workload error is a
    /// restart, a lost workload a recovery). A task with its own `failurePolicy` uses only that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
    /// Seconds a stopped workload (a cancel, a deadline, a job given up) has between SIGTERM and
    /// SIGKILL, to save its work: the local executor's whole process tree, or the Pods (each
    /// Pod's `terminationGracePeriodSeconds` is set to it). Unset: the operator's
    /// `--cancel-grace-seconds` for a local job, the template's own (Kubernetes' default 30)
    /// for a pod job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    /// Set to true to cancel the job without deleting the object; it keeps its final status.
    /// Final while the job runs; once the job has finished it may go back to false (e.g. a
    /// cancel reverted in git), which changes nothing.
    #[serde(default)]
    pub cancel: bool,
    /// Set to true to hold the job without failing it (docs/concepts/queues-and-preemption.md,
    /// "Stopping without failing"): a waiting job is not admitted and keeps its place; a running one is stopped
    /// gracefully (SIGTERM, the stop grace of `terminationGracePeriodSeconds`, then SIGKILL)
    /// and gives its run slot back. Either way it shows phase `Suspended`. Back to false, it
    /// waits again ahead of the jobs created after it, its restart and recovery budgets and its
    /// attempt history untouched (the stopped attempt is recorded as `Suspended`). Mutable at
    /// any time; a finished job ignores it.
    #[serde(default)]
    pub suspend: bool,
    /// Seconds the job may run, counted from its first start; past it the job is stopped and
    /// Failed with reason DeadlineExceeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    /// Seconds an attempt's workload may take to start running once launched (a Pod bound to a
    /// node but still pulling its image, waiting for a volume or running init containers;
    /// counted from when the scheduler bound it if it first waited for a node). Past it the
    /// workload is deleted, its launch slot released and the job requeued with back-off; after
    /// the operator's `--max-launch-timeouts` in a row it ends FailedNoResource. Unset: the
    /// operator's `--launch-timeout-seconds` (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_timeout_seconds: Option<i64>,
    /// Seconds after the job finished (Succeeded, Failed*, Cancelled) when the operator deletes
    /// the object. Unset keeps it forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
    /// A pipeline: 1 to 32 tasks run one after another (SkyPilot's pipelines). A task starts
    /// only after the previous one Succeeded; a failed task fails the job and the later ones
    /// are Skipped. The job keeps one run slot for its whole life and takes a launch slot for
    /// each task's launch. Exactly one of `run`, `template` and `tasks` is set; every task uses
    /// the same executor. Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskSpec>,
    /// What a local job (or a local pipeline's every task) needs, counted against its queue's
    /// quota on the pool `local` (the operator's own node) when the queue lists it
    /// (docs/concepts/quotas-pools-and-fit.md). A pod job's needs are its template's
    /// requests, counted as kube-scheduler counts them: refused here. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<LocalResources>,
}

/// One task of a pipeline (`spec.tasks[]`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskSpec {
    /// Unique name within the job: a DNS label (e.g. `train`). Shown in the status, Events and
    /// the Pods' `managedjobs.dev/task` label.
    pub name: String,
    /// Shell script of the task (local executor). Exactly one of `run` and `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// Shell script run before `run` in each attempt of the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
    /// Pod template of the task (pod executor). Exactly one of `run` and `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplateSpec>,
    /// Nodes of the task, as `spec.nodes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i32>,
    /// Environment of the task, merged over `spec.env` (a name here wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// The task's restart and recovery budgets; unset: `spec.recovery`. Counted per task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoverySpec>,
    /// The task's failure rules, used instead of `spec.failurePolicy` (not merged with it);
    /// unset: the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
    /// Seconds the task may run, counted from its first start (besides the job's own
    /// `activeDeadlineSeconds`, counted from the job's first start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
}

/// What one attempt of a job runs: the job's own `run`/`template`, or the current task of a
/// pipeline with its environment merged over the job's.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskView<'a> {
    /// Index in `spec.tasks` (0 for a job of one task).
    pub index: usize,
    /// Number of tasks (1 for a job of one task).
    pub count: usize,
    /// The task's name; None for a job of one task.
    pub name: Option<&'a str>,
    /// Script (local executor).
    pub run: Option<&'a str>,
    /// Setup script (local executor).
    pub setup: Option<&'a str>,
    /// Pod template (pod executor).
    pub template: Option<&'a PodTemplateSpec>,
    /// Nodes of a multi-node task or job (`nodes`); None: one Pod, no gang.
    pub nodes: Option<i32>,
    /// Environment: the job's, with the task's variables replacing or added.
    pub env: Vec<EnvVar>,
    /// Restart and recovery budgets of the task.
    pub recovery: &'a RecoverySpec,
    /// Failure rules of the task (its own, else the job's); None: the defaults.
    pub failure_policy: Option<&'a FailurePolicy>,
    /// The task's own deadline, seconds from its first start (a job of one task: the job's).
    pub active_deadline_seconds: Option<i64>,
}

impl TaskView<'_> {
    /// Members of each attempt: `nodes`, or 1.
    pub fn size(&self) -> usize {
        self.nodes.unwrap_or(1).max(1) as usize
    }

    /// `task 2/3 train` (1-based), or None for a job of one task.
    pub fn label(&self) -> Option<String> {
        self.name
            .map(|n| format!("task {}/{} {n}", self.index + 1, self.count))
    }
}

/// What a local workload needs (`spec.resources`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct LocalResources {
    /// Each resource and its amount (a quantity), e.g. `{cpu: 2, memory: 4Gi,
    /// example.com/license: 1}`; at most 16.
    #[serde(default)]
    pub requests:
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
}

/// One environment variable of the local executor.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct EnvVar {
    /// Variable name: a shell identifier (`[A-Za-z_][A-Za-z0-9_]*`).
    pub name: String,
    /// Value, passed verbatim (never interpreted by a shell).
    #[serde(default)]
    pub value: String,
}

/// Restart and recovery budgets (SkyPilot's `max_restarts_on_errors` and recovery count).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverySpec {
    /// Restarts after the workload itself fails (non-zero exit). 0 = fail at the first error.
    #[serde(default)]
    pub max_restarts_on_errors: i32,
    /// Relaunches after preemption, eviction or node loss (or a failure rule's `Recover`).
    /// Unset = unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_recoveries: Option<i32>,
    /// Relaunches a failure rule's `Ignore` may cost (counted in neither restarts nor
    /// recoveries); past it an ignored outcome is decided as if no rule matched. 0..1000,
    /// unset: 10. Never unlimited, so no rule can make a job loop for ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ignored: Option<i32>,
}

impl RecoverySpec {
    /// `maxIgnored`, or its default ([`DEFAULT_MAX_IGNORED`]).
    pub fn max_ignored(&self) -> i32 {
        self.max_ignored.unwrap_or(DEFAULT_MAX_IGNORED)
    }
}

/// A job's place in its queue within its priority: jobs are admitted in the order they entered,
/// by `enteredAt`, then, inside one second, by `resourceVersion`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueEntry {
    /// When the job entered its queue: its `metadata.creationTimestamp`, or when it gave its run
    /// slot back because no node took its Pod (the back of its priority).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entered_at: Option<Time>,
    /// The object's `metadata.resourceVersion` when the operator first saw it: its creation's
    /// when the operator saw it created. Resource versions of one resource compare as integers
    /// (KEP-5504), so this orders the jobs created within one second as the API server
    /// accepted them. Absent when unknown (the job then goes first inside its second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

/// What the operator observed and did. Written only by the operator, through the status
/// subresource.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedJobStatus {
    /// Id the operator's store assigned at first sight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<i64>,
    /// User-facing phase (SkyPilot's ManagedJobStatus in Kubernetes casing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// The scheduler's view of the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_state: Option<ScheduleState>,
    /// Human-readable sentence about the latest step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The ManagedJobQueue the job waits in (`spec.queue`, or `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// No longer written (null since 0.3.0). A job's position moves with every admission, and
    /// writing it would cost an API write per waiting job per admission; the value once written
    /// at submission went stale at once. See the visibility API (`managed-jobs queue`, the
    /// dashboard) for each waiting job's live position, reason and estimated start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i64>,
    /// The job's place in its queue within its priority (first come, first served), kept here
    /// so that a store rebuilt from statuses keeps the order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_entry: Option<QueueEntry>,
    /// When the operator first saw the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_at: Option<Time>,
    /// When the first attempt's workload started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the job reached a terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Number of the current (or last) attempt, from 1.
    #[serde(default)]
    pub attempt: i32,
    /// Relaunches after preemption or node loss so far.
    #[serde(default)]
    pub recovery_count: i32,
    /// Restarts after workload errors so far.
    #[serde(default)]
    pub restart_count: i32,
    /// Relaunches a failure rule's `Ignore` decided so far (counted in neither restarts nor
    /// recoveries).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ignored_count: i32,
    /// The latest attempts that ended (at most 10, oldest first): how each ended, the failure
    /// rule that matched (`default` when none) and what it decided.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptStatus>,
    /// Exit code of the last attempt's workload, once it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// CamelCase reason of a failure (e.g. `ExitCode`, `DeadlineExceeded`, `RecoveryBudgetSpent`,
    /// `FailureRule` when a failure rule's `FailJob` ended the job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// The current attempt's workload: `pod/<name>` (rank 0's) or `pid/<pid>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// A multi-node job's running members, e.g. `3/4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_nodes: Option<String>,
    /// The pool (a ManagedJobPool of its queue's `spec.pools`) the current or last attempt was
    /// admitted onto; unset for a job of a queue without pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// `metadata.generation` this status reflects. 0 until the operator has seen the object
    /// (the schema's default status), so GitOps tools read a brand-new job as in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Reconciling, Ready, Stalled, Complete and Failed (metav1.Condition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// A pipeline's current (or last) task: its index in `spec.tasks`, from 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_task: Option<i32>,
    /// A pipeline's current task as `<number>/<count> <name>`, number from 1 (e.g.
    /// `2/3 train`): the TASK column of `kubectl get mj`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_progress: Option<String>,
    /// A pipeline's tasks, in `spec.tasks` order: how each runs or ended. For a pipeline the
    /// job's `restartCount` and `recoveryCount` are the sums over its tasks, and `attempt`
    /// counts the attempts of every task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskStatus>,
    /// The operator that owns the job (the only one acting on it): the holder of the Lease
    /// `managed-jobs-owner[-<shard>]` in the job's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The epoch of the owner's claim (that Lease's `leaseTransitions`): a status of a lower
    /// epoch, or of the same epoch by another owner, is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_epoch: Option<i64>,
}

/// How one task of a pipeline runs or ended (`status.tasks[]`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    /// The task's name (`spec.tasks[].name`).
    pub name: String,
    /// The task's phase.
    pub phase: TaskPhase,
    /// The task's current (or last) attempt, from 1; 0 before it launched.
    #[serde(default)]
    pub attempt: i32,
    /// Restarts of this task after its workload failed.
    #[serde(default)]
    pub restart_count: i32,
    /// Relaunches of this task after preemption or node loss.
    #[serde(default)]
    pub recovery_count: i32,
    /// Relaunches of this task a failure rule's `Ignore` decided.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ignored_count: i32,
    /// Exit code of the task's last attempt, once it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// CamelCase reason of the task's failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// When the task's workload first ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the task ended (or was skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// The latest sentence about the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl ManagedJobSpec {
    /// The queue the job waits in: `spec.queue`, or [`super::queue::DEFAULT_QUEUE`].
    pub fn queue_name(&self) -> &str {
        self.queue.as_deref().unwrap_or(super::queue::DEFAULT_QUEUE)
    }

    /// The executor this spec asks for. The API server guarantees exactly one of
    /// run/template/tasks, and one executor for every task.
    pub fn executor(&self) -> ExecutorKind {
        let pod = match self.tasks.first() {
            Some(task) => task.template.is_some(),
            None => self.template.is_some(),
        };
        if pod {
            ExecutorKind::Pod
        } else {
            ExecutorKind::Local
        }
    }

    /// True for a pipeline (`spec.tasks` set).
    pub fn is_pipeline(&self) -> bool {
        !self.tasks.is_empty()
    }

    /// Number of tasks: `spec.tasks`' length, or 1.
    pub fn task_count(&self) -> usize {
        self.tasks.len().max(1)
    }

    /// The task at `index` (clamped to the last), or the job itself for a job of one task.
    pub fn task(&self, index: usize) -> TaskView<'_> {
        let Some(task) = self
            .tasks
            .get(index.min(self.tasks.len().saturating_sub(1)))
        else {
            return TaskView {
                index: 0,
                count: 1,
                name: None,
                run: self.run.as_deref(),
                setup: self.setup.as_deref(),
                template: self.template.as_ref(),
                nodes: self.nodes,
                env: self.env.clone(),
                recovery: &self.recovery,
                failure_policy: self.failure_policy.as_ref(),
                active_deadline_seconds: self.active_deadline_seconds,
            };
        };
        let mut env = self.env.clone();
        for var in &task.env {
            match env.iter_mut().find(|v| v.name == var.name) {
                Some(v) => v.value = var.value.clone(),
                None => env.push(var.clone()),
            }
        }
        TaskView {
            index: index.min(self.tasks.len() - 1),
            count: self.tasks.len(),
            name: Some(&task.name),
            run: task.run.as_deref(),
            setup: task.setup.as_deref(),
            template: task.template.as_ref(),
            nodes: task.nodes,
            env,
            recovery: task.recovery.as_ref().unwrap_or(&self.recovery),
            failure_policy: task
                .failure_policy
                .as_ref()
                .or(self.failure_policy.as_ref()),
            active_deadline_seconds: task.active_deadline_seconds,
        }
    }
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}
