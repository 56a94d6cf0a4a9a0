//! The `ManagedJob` custom resource (`managedjobs.dev/v1alpha1`): spec, status, the two state
//! machines' names, and the CRD with its validation rules (DESIGN.md section 3).
//!
//! The CRD is generated from these types by kube's derive; [`crd`] then adds what the derive cannot
//! express (ranges, patterns, CEL rules for "exactly one of run/template" and immutability, the
//! trimmed pod-template schema) so that bad input is refused by the API server, never by the
//! operator.

use std::fmt;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

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
/// Label that assigns a ManagedJob (and its Pods) to an operator shard: the instance started
/// with `--shard NAME` owns the jobs labelled `managedjobs.dev/shard=NAME`; the default
/// instance owns the jobs without the label. Immutable while the job is not finished (a
/// ValidatingAdmissionPolicy, `crds/managedjobs.dev_shard-policy.yaml`).
pub const LABEL_SHARD: &str = "managedjobs.dev/shard";

/// The label selector of the objects shard `shard` owns: `managedjobs.dev/shard=NAME`, or for
/// the default instance (None) `!managedjobs.dev/shard`.
pub fn shard_selector(shard: Option<&str>) -> String {
    match shard {
        Some(name) => format!("{LABEL_SHARD}={name}"),
        None => format!("!{LABEL_SHARD}"),
    }
}

/// Most tasks in one pipeline (`spec.tasks`).
pub const MAX_TASKS: usize = 32;
/// Largest accepted `run`/`setup` script, in bytes (keeps CEL cost estimates bounded).
pub const MAX_SCRIPT_BYTES: usize = 65_536;

/// Most bytes of one `spec.env` value (the kernel takes at most 128 KiB per environment string,
/// MAX_ARG_STRLEN; a value of 32,768 characters may be 4 times as many bytes).
pub const MAX_ENV_VALUE_BYTES: usize = 32_768;

/// Most variables in `spec.env`.
pub const MAX_ENV_VARS: usize = 256;

/// Most variables in one task's `spec.tasks[].env` (merged over `spec.env`). Lower than
/// [`MAX_ENV_VARS`]: the API server bounds the estimated cost of each CEL rule of a CRD (by the
/// largest input the schema allows), and a task's rules count once per possible task (32).
pub const MAX_TASK_ENV_VARS: usize = 32;

/// Most bytes of one `spec.tasks[].env` value (see [`MAX_TASK_ENV_VARS`] for why it is lower
/// than [`MAX_ENV_VALUE_BYTES`]); a large value shared by every task belongs in `spec.env`.
pub const MAX_TASK_ENV_VALUE_BYTES: usize = 8_192;

/// Most bytes of `spec.env` names and values in all. Each value may hold 32 KiB, but 256 of them
/// would make an 8 MiB object: past etcd's 1.5 MiB limit on a stored object (so the job's status
/// could never be written) and Linux's 2 MiB default `ARG_MAX` for a process' argv and
/// environment together (so it could never start). 256 KiB leaves room for the scripts, the
/// status and the finalizer. Enforced by a CEL rule at the API, and by [`validate_spec`].
pub const MAX_ENV_BYTES: usize = 262_144;

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
    printcolumn = r#"{"name":"Recoveries","type":"integer","jsonPath":".status.recoveryCount","description":"Relaunches after preemption or node loss"}"#,
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
    /// Scheduling priority, -1000..1000; higher is admitted first, FIFO within a priority.
    #[serde(default)]
    pub priority: i32,
    /// Restart and recovery budgets.
    #[serde(default)]
    pub recovery: RecoverySpec,
    /// Set to true to cancel the job without deleting the object; it keeps its final status.
    /// Final while the job runs; once the job has finished it may go back to false (e.g. a
    /// cancel reverted in git), which changes nothing.
    #[serde(default)]
    pub cancel: bool,
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
    /// Environment of the task, merged over `spec.env` (a name here wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// The task's restart and recovery budgets; unset: `spec.recovery`. Counted per task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoverySpec>,
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
    /// Environment: the job's, with the task's variables replacing or added.
    pub env: Vec<EnvVar>,
    /// Restart and recovery budgets of the task.
    pub recovery: &'a RecoverySpec,
    /// The task's own deadline, seconds from its first start (a job of one task: the job's).
    pub active_deadline_seconds: Option<i64>,
}

impl TaskView<'_> {
    /// `task 2/3 train` (1-based), or None for a job of one task.
    pub fn label(&self) -> Option<String> {
        self.name
            .map(|n| format!("task {}/{} {n}", self.index + 1, self.count))
    }
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
    /// Relaunches after preemption, eviction or node loss. Unset = unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_recoveries: Option<i32>,
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
    /// Position in the admission queue when the job was submitted (1 = next); not updated as
    /// the queue moves (that would cost an API write per queued job per admission): see
    /// `managed-jobs queue` for live order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i64>,
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
    /// Exit code of the last attempt's workload, once it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// CamelCase reason of a failure (e.g. `ExitCode`, `DeadlineExceeded`, `RecoveryBudgetSpent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// The current attempt's workload: `pod/<name>` or `pid/<pid>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
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
        )
    }
}

/// The phase a user sees (DESIGN.md section 4). Terminal: Succeeded, Cancelled and the five
/// Failed*. Cancelling is not terminal.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
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
    pub const ALL: [JobPhase; 13] = [
        JobPhase::Pending,
        JobPhase::Submitted,
        JobPhase::Starting,
        JobPhase::Running,
        JobPhase::Recovering,
        JobPhase::Succeeded,
        JobPhase::Cancelling,
        JobPhase::Cancelled,
        JobPhase::Failed,
        JobPhase::FailedSetup,
        JobPhase::FailedPrecheck,
        JobPhase::FailedNoResource,
        JobPhase::FailedController,
    ];

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
        match self {
            JobPhase::Pending => "Pending",
            JobPhase::Submitted => "Submitted",
            JobPhase::Starting => "Starting",
            JobPhase::Running => "Running",
            JobPhase::Recovering => "Recovering",
            JobPhase::Succeeded => "Succeeded",
            JobPhase::Cancelling => "Cancelling",
            JobPhase::Cancelled => "Cancelled",
            JobPhase::Failed => "Failed",
            JobPhase::FailedSetup => "FailedSetup",
            JobPhase::FailedPrecheck => "FailedPrecheck",
            JobPhase::FailedNoResource => "FailedNoResource",
            JobPhase::FailedController => "FailedController",
        }
    }

    /// Parses [`JobPhase::as_str`]'s output; `None` for anything else.
    pub fn parse(s: &str) -> Option<JobPhase> {
        JobPhase::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl fmt::Display for JobPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The scheduler's state of a job (SkyPilot's ManagedJobScheduleState).
///
/// `Inactive -> Waiting -> Launching -> Alive -> (AliveWaiting -> Launching -> Alive)* -> Done`;
/// Inactive/Waiting may go straight to Done when cancelled. Nothing leaves Done.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ScheduleState {
    /// Known to the store, not yet submitted to the scheduler.
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
    pub const ALL: [ScheduleState; 6] = [
        ScheduleState::Inactive,
        ScheduleState::Waiting,
        ScheduleState::Launching,
        ScheduleState::Alive,
        ScheduleState::AliveWaiting,
        ScheduleState::Done,
    ];

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
        match self {
            ScheduleState::Inactive => "Inactive",
            ScheduleState::Waiting => "Waiting",
            ScheduleState::Launching => "Launching",
            ScheduleState::Alive => "Alive",
            ScheduleState::AliveWaiting => "AliveWaiting",
            ScheduleState::Done => "Done",
        }
    }

    /// Parses [`ScheduleState::as_str`]'s output.
    pub fn parse(s: &str) -> Option<ScheduleState> {
        ScheduleState::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl fmt::Display for ScheduleState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which executor runs a spec: `local` for `run`, `pod` for `template`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// A process group on the controller node.
    Local,
    /// A Pod in the job's namespace.
    Pod,
}

impl ExecutorKind {
    /// `local` or `pod`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorKind::Local => "local",
            ExecutorKind::Pod => "pod",
        }
    }

    /// Parses `local` or `pod`.
    pub fn parse(s: &str) -> Option<ExecutorKind> {
        match s {
            "local" => Some(ExecutorKind::Local),
            "pod" => Some(ExecutorKind::Pod),
            _ => None,
        }
    }
}

impl fmt::Display for ExecutorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ManagedJobSpec {
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
                env: self.env.clone(),
                recovery: &self.recovery,
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
            env,
            recovery: task.recovery.as_ref().unwrap_or(&self.recovery),
            active_deadline_seconds: task.active_deadline_seconds,
        }
    }
}

/// The status every ManagedJob reads with until the operator writes its own: the CRD schema's
/// default for `status`, which the API server applies whenever it reads an object without one
/// (the create response, every get, list and watch; the status subresource cannot be set at
/// create). `observedGeneration` 0 never equals `metadata.generation` (1 and up), so kstatus
/// (Flux, kpt, cli-utils) reads the object as InProgress (`LatestGenerationNotObserved`) from
/// the moment it exists, and the Argo CD check (`examples/gitops/argocd-health.lua`) as
/// Progressing: a job is never healthy to a GitOps tool before an operator has seen it. With no
/// `status` at all kstatus would read it as Current ("Resource is current").
pub fn status_default() -> Value {
    json!({ "observedGeneration": 0 })
}

/// The CRD as installed: kube's derived schema plus the validation rules of DESIGN.md section 3.
pub fn crd() -> CustomResourceDefinition {
    let mut crd = ManagedJob::crd();
    let mut value = serde_json::to_value(&crd).expect("a CRD serializes");
    let version = &mut value["spec"]["versions"][0];
    let root = &mut version["schema"]["openAPIV3Schema"];
    root["description"] = json!(
        "A managed job: a batch workload launched within the operator's launch and run caps, \
         recovered after preemption, restarted after errors and cancelled on request."
    );
    root["properties"]["spec"]["description"] = json!(
        "What to run and how to treat failures. Immutable after creation except priority and cancel."
    );
    root["properties"]["status"]["description"] = json!(
        "What the operator observed; written only by the operator. Until the operator has seen \
         the job it reads {observedGeneration: 0} (the schema's default), which GitOps tools \
         (kstatus, Argo CD) read as in progress."
    );
    root["properties"]["status"]["default"] = status_default();
    refine_spec_schema(&mut root["properties"]["spec"]);
    root["x-kubernetes-validations"] = json!([cancel_rule()]);
    crd = serde_json::from_value(value).expect("the refined CRD deserializes");
    crd
}

/// The CRD as YAML, exactly as committed in `crds/managedjobs.dev_managedjobs.yaml`.
pub fn crd_yaml() -> String {
    let mut out = String::from("# Generated by `managed-jobs crd`; do not edit.\n");
    out.push_str(&serde_norway::to_string(&crd()).expect("a CRD serializes to YAML"));
    out
}

/// A NUL byte cannot reach a process (argv and the environment are C strings): refused at the
/// API, naming the field, instead of failing the job later.
const NO_NUL: &str = "^[^\\x00]*$";

fn rule(rule: &str, message: &str) -> Value {
    json!({ "rule": rule, "message": message })
}

/// The root rule on `spec.cancel`: a cancel of a live job is final (the workload is being
/// stopped), but a job that has finished (a terminal `status.phase`) accepts `cancel: false`
/// back, with no effect on it. A GitOps tool re-applies what git holds: a cancel reverted in
/// git must not make the API refuse the object, which would block every other change of the
/// sync (Flux dry-runs the whole set). The rule sits at the root because it reads the status.
fn cancel_rule() -> Value {
    let terminal: Vec<String> = JobPhase::ALL
        .into_iter()
        .filter(|p| p.is_terminal())
        .map(|p| format!("'{p}'"))
        .collect();
    let finished = format!(
        "has(oldSelf.status) && has(oldSelf.status.phase) && oldSelf.status.phase in [{}]",
        terminal.join(", ")
    );
    json!({
        "rule": format!(
            "!has(oldSelf.spec.cancel) || !oldSelf.spec.cancel || (has(self.spec.cancel) && self.spec.cancel) || ({finished})"
        ),
        "message": "spec.cancel cannot be set back to false until the job has finished",
        "messageExpression": "'spec.cancel cannot be set back to false while the job is ' + \
            (has(oldSelf.status) && has(oldSelf.status.phase) ? oldSelf.status.phase : 'not yet seen by its operator') + \
            ': a cancel is final until the job has finished (then it may return to false, with no effect)'",
        "fieldPath": ".spec.cancel",
        "reason": "FieldValueForbidden",
    })
}

fn refine_spec_schema(spec: &mut Value) {
    const IMMUTABLE: [&str; 8] = [
        "run",
        "setup",
        "env",
        "template",
        "activeDeadlineSeconds",
        "launchTimeoutSeconds",
        "ttlSecondsAfterFinished",
        "tasks",
    ];
    let mut rules = vec![
        rule(
            "(has(self.run) ? 1 : 0) + (has(self.template) ? 1 : 0) + (has(self.tasks) ? 1 : 0) == 1",
            "exactly one of spec.run (local executor), spec.template (pod executor) and spec.tasks (a pipeline) must be set",
        ),
        rule(
            "!has(self.tasks) || !has(self.setup)",
            "spec.setup cannot be set with spec.tasks: give each task its own setup",
        ),
    ];
    for field in IMMUTABLE {
        rules.push(rule(
            &format!("has(self.{field}) == has(oldSelf.{field})"),
            &format!("spec.{field} is immutable after creation (only spec.priority and spec.cancel may change)"),
        ));
    }
    rules.push(json!({
        "rule": "self.recovery == oldSelf.recovery",
        "message": "spec.recovery is immutable after creation (only spec.priority and spec.cancel may change)",
    }));
    rules.push(rule(
        &format!(
            "!has(self.env) || self.env.map(e, size(e.name) + (has(e.value) ? size(bytes(e.value)) : 0)).sum() <= {MAX_ENV_BYTES}"
        ),
        &format!(
            "spec.env holds more than {MAX_ENV_BYTES} bytes of names and values in all (the object must leave room for its status, and a process for its environment)"
        ),
    ));
    spec["x-kubernetes-validations"] = Value::Array(rules);
    spec["required"] = json!([]);
    spec.as_object_mut().unwrap().remove("required");

    let props = &mut spec["properties"];
    for field in IMMUTABLE {
        let message = format!(
            "spec.{field} is immutable after creation (only spec.priority and spec.cancel may change)"
        );
        props[field]["x-kubernetes-validations"] = json!([rule("self == oldSelf", &message)]);
    }
    // Lengths are in characters for the schema, in bytes for the kernel (one argument or
    // environment string is at most 128 KiB, MAX_ARG_STRLEN): the byte bounds are CEL rules.
    for field in ["run", "setup"] {
        props[field]["minLength"] = json!(1);
        props[field]["maxLength"] = json!(MAX_SCRIPT_BYTES);
        props[field]["pattern"] = json!(NO_NUL);
        props[field]["x-kubernetes-validations"]
            .as_array_mut()
            .expect("set above")
            .push(rule(
                &format!("size(bytes(self)) <= {MAX_SCRIPT_BYTES}"),
                &format!("spec.{field} holds more than {MAX_SCRIPT_BYTES} bytes"),
            ));
    }
    props["priority"]["minimum"] = json!(-1000);
    props["priority"]["maximum"] = json!(1000);
    props["priority"]["default"] = json!(0);
    props["cancel"]["default"] = json!(false);
    props["activeDeadlineSeconds"]["minimum"] = json!(1);
    props["launchTimeoutSeconds"]["minimum"] = json!(1);
    props["ttlSecondsAfterFinished"]["minimum"] = json!(0);

    refine_env(
        &mut props["env"],
        "spec.env",
        MAX_ENV_VARS,
        MAX_ENV_VALUE_BYTES,
    );
    refine_recovery(&mut props["recovery"]);
    props["recovery"]["default"] = json!({});
    props["template"] = pod_template_schema("spec.template");
    refine_tasks(&mut props["tasks"]);
}

fn refine_env(env: &mut Value, field: &str, max_items: usize, max_value_bytes: usize) {
    env["maxItems"] = json!(max_items);
    env["x-kubernetes-list-type"] = json!("map");
    env["x-kubernetes-list-map-keys"] = json!(["name"]);
    let item = &mut env["items"];
    item["required"] = json!(["name"]);
    item["properties"]["name"]["pattern"] = json!("^[A-Za-z_][A-Za-z0-9_]*$");
    item["properties"]["name"]["maxLength"] = json!(256);
    item["properties"]["value"]["maxLength"] = json!(max_value_bytes);
    item["properties"]["value"]["pattern"] = json!(NO_NUL);
    item["properties"]["value"]["x-kubernetes-validations"] = json!([rule(
        &format!("size(bytes(self)) <= {max_value_bytes}"),
        &format!("{field}[].value holds more than {max_value_bytes} bytes"),
    )]);
}

fn refine_recovery(recovery: &mut Value) {
    recovery["properties"]["maxRestartsOnErrors"]["minimum"] = json!(0);
    recovery["properties"]["maxRestartsOnErrors"]["maximum"] = json!(1000);
    recovery["properties"]["maxRestartsOnErrors"]["default"] = json!(0);
    recovery["properties"]["maxRecoveries"]["minimum"] = json!(0);
    recovery["required"] = json!([]);
    recovery.as_object_mut().unwrap().remove("required");
}

/// `spec.tasks`: 1..32 uniquely named tasks (a list map keyed by name: the API server refuses a
/// duplicate name), each with exactly one of run/template, all on one executor; immutable.
fn refine_tasks(tasks: &mut Value) {
    tasks["minItems"] = json!(1);
    tasks["maxItems"] = json!(MAX_TASKS);
    tasks["x-kubernetes-list-type"] = json!("map");
    tasks["x-kubernetes-list-map-keys"] = json!(["name"]);
    tasks["x-kubernetes-validations"]
        .as_array_mut()
        .expect("set with the immutable fields")
        .push(rule(
            "self.all(t, !has(t.template)) || self.all(t, !has(t.run))",
            "spec.tasks must all use one executor: every task sets run (local) or every task sets template (pod)",
        ));
    let item = &mut tasks["items"];
    item["required"] = json!(["name"]);
    item["x-kubernetes-validations"] = json!([
        rule(
            "has(self.run) != has(self.template)",
            "each of spec.tasks must set exactly one of run (local executor) and template (pod executor)",
        ),
        rule(
            "!has(self.setup) || has(self.run)",
            "spec.tasks[].setup runs before run (the local executor); a task with a template has no setup (use the Pod's init containers)",
        ),
        rule(
            &format!(
                "!has(self.env) || self.env.map(e, size(e.name) + (has(e.value) ? size(bytes(e.value)) : 0)).sum() <= {MAX_ENV_BYTES}"
            ),
            &format!(
                "spec.tasks[].env holds more than {MAX_ENV_BYTES} bytes of names and values in all"
            ),
        ),
    ]);
    let props = &mut item["properties"];
    props["name"]["pattern"] = json!("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
    props["name"]["maxLength"] = json!(63);
    props["name"]["description"] = json!(
        "Unique name within the job: a DNS label (lowercase letters, digits and '-', at most 63 characters)."
    );
    for field in ["run", "setup"] {
        props[field]["minLength"] = json!(1);
        props[field]["maxLength"] = json!(MAX_SCRIPT_BYTES);
        props[field]["pattern"] = json!(NO_NUL);
        props[field]["x-kubernetes-validations"] = json!([rule(
            &format!("size(bytes(self)) <= {MAX_SCRIPT_BYTES}"),
            &format!("spec.tasks[].{field} holds more than {MAX_SCRIPT_BYTES} bytes"),
        )]);
    }
    props["activeDeadlineSeconds"]["minimum"] = json!(1);
    refine_env(
        &mut props["env"],
        "spec.tasks[].env",
        MAX_TASK_ENV_VARS,
        MAX_TASK_ENV_VALUE_BYTES,
    );
    refine_recovery(&mut props["recovery"]);
    props["template"] = pod_template_schema("spec.tasks[].template");
    props["template"]
        .as_object_mut()
        .expect("an object")
        .remove("x-kubernetes-validations");
}

/// A trimmed PodTemplateSpec schema: the full upstream schema would push the CRD past the 256 KiB
/// client-side-apply annotation limit, so the Pod spec is kept open (`x-kubernetes-preserve-unknown-fields`)
/// and only what the operator relies on is checked here; the rest is checked when the Pod is created.
fn pod_template_schema(field: &str) -> Value {
    json!({
        "description": "Pod template run by the pod executor, one Pod per attempt (restartPolicy Never). Exactly one of run, template and tasks is set.",
        "type": "object",
        "x-kubernetes-validations": [rule(
            "self == oldSelf",
            "spec.template is immutable after creation (only spec.priority and spec.cancel may change)",
        )],
        "properties": {
            "metadata": {
                "description": "Labels and annotations copied onto each Pod.",
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
            },
            "spec": {
                "description": "A core/v1 PodSpec; validated in full when the Pod is created.",
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "required": ["containers"],
                "properties": {
                    "containers": {
                        "description": "The Pod's containers; at least one.",
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": true,
                            "required": ["name"],
                        },
                    },
                    "restartPolicy": {
                        "description": "Must be Never (or unset): the operator restarts and recovers the job itself.",
                        "type": "string",
                    },
                },
                "x-kubernetes-validations": [rule(
                    "!has(self.restartPolicy) || self.restartPolicy == 'Never'",
                    &format!("{field}.spec.restartPolicy must be Never (or unset): the operator itself restarts (maxRestartsOnErrors) and recovers (maxRecoveries) the job"),
                )],
            },
        },
        "required": ["spec"],
    })
}

/// Validates what the API schema cannot: returns a sentence naming the field, or `Ok(())`.
///
/// Used when the CRD was installed without our rules (e.g. an older copy): the operator then fails
/// the one job with FailedPrecheck instead of acting on bad input.
pub fn validate_spec(spec: &ManagedJobSpec) -> Result<(), String> {
    let set = [
        spec.run.is_some(),
        spec.template.is_some(),
        spec.is_pipeline(),
    ];
    if set.iter().filter(|s| **s).count() != 1 {
        return Err("exactly one of spec.run, spec.template and spec.tasks must be set".into());
    }
    if !(-1000..=1000).contains(&spec.priority) {
        return Err(format!(
            "spec.priority {} is outside -1000..1000",
            spec.priority
        ));
    }
    if spec.active_deadline_seconds.is_some_and(|s| s < 1) {
        return Err("spec.activeDeadlineSeconds must be >= 1".into());
    }
    if spec.launch_timeout_seconds.is_some_and(|s| s < 1) {
        return Err("spec.launchTimeoutSeconds must be >= 1".into());
    }
    if spec.is_pipeline() {
        if spec.setup.is_some() {
            return Err(
                "spec.setup cannot be set with spec.tasks: give each task its own setup".into(),
            );
        }
        if spec.tasks.len() > MAX_TASKS {
            return Err(format!(
                "spec.tasks holds {} tasks, more than {MAX_TASKS}",
                spec.tasks.len()
            ));
        }
        let pods = spec.tasks.iter().filter(|t| t.template.is_some()).count();
        if pods != 0 && pods != spec.tasks.len() {
            return Err("spec.tasks must all use one executor: every task sets run (local) or every task sets template (pod)".into());
        }
        for (i, task) in spec.tasks.iter().enumerate() {
            if !is_dns_label(&task.name) {
                return Err(format!(
                    "spec.tasks[{i}].name {:?} is not a DNS label (lowercase letters, digits and '-', at most 63 characters)",
                    task.name
                ));
            }
            if spec.tasks[..i].iter().any(|t| t.name == task.name) {
                return Err(format!(
                    "spec.tasks[{i}].name {:?} is used by an earlier task",
                    task.name
                ));
            }
            if task.run.is_some() == task.template.is_some() {
                return Err(format!(
                    "spec.tasks[{i}] must set exactly one of run and template"
                ));
            }
            if task.setup.is_some() && task.run.is_none() {
                return Err(format!(
                    "spec.tasks[{i}].setup runs before run (the local executor); a task with a template has no setup"
                ));
            }
            if task.env.len() > MAX_TASK_ENV_VARS {
                return Err(format!(
                    "spec.tasks[{i}].env holds {} variables, more than {MAX_TASK_ENV_VARS}",
                    task.env.len()
                ));
            }
            if let Some(var) = task
                .env
                .iter()
                .find(|v| v.value.len() > MAX_TASK_ENV_VALUE_BYTES)
            {
                return Err(format!(
                    "spec.tasks[{i}].env value of {} holds {} bytes, more than {MAX_TASK_ENV_VALUE_BYTES}",
                    var.name,
                    var.value.len()
                ));
            }
            if task.active_deadline_seconds.is_some_and(|s| s < 1) {
                return Err(format!(
                    "spec.tasks[{i}].activeDeadlineSeconds must be >= 1"
                ));
            }
            validate_task(&spec.task(i), &format!("spec.tasks[{i}]"))?;
        }
        return Ok(());
    }
    validate_task(&spec.task(0), "spec")
}

/// The checks of one task (or of a job of one task), naming fields under `at` (`spec` or
/// `spec.tasks[i]`).
fn validate_task(task: &TaskView<'_>, at: &str) -> Result<(), String> {
    if task.run.is_some_and(str::is_empty) {
        return Err(format!("{at}.run must not be empty"));
    }
    if task.recovery.max_restarts_on_errors < 0 {
        return Err(format!("{at}.recovery.maxRestartsOnErrors must be >= 0"));
    }
    if task.recovery.max_recoveries.is_some_and(|n| n < 0) {
        return Err(format!("{at}.recovery.maxRecoveries must be >= 0"));
    }
    for (field, script) in [("run", task.run), ("setup", task.setup)] {
        if let Some(s) = script
            && s.len() > MAX_SCRIPT_BYTES
        {
            return Err(format!(
                "{at}.{field} holds {} bytes, more than {MAX_SCRIPT_BYTES}",
                s.len()
            ));
        }
        if script.is_some_and(|s| s.contains('\0')) {
            return Err(format!(
                "{at}.{field} contains a NUL byte, which no process can receive"
            ));
        }
    }
    // For a task, its environment merged over the job's: what its process receives.
    let env_field = if at == "spec" {
        "spec.env"
    } else {
        "spec.env with spec.tasks[].env"
    };
    let env_bytes: usize = task.env.iter().map(|v| v.name.len() + v.value.len()).sum();
    if env_bytes > MAX_ENV_BYTES {
        return Err(format!(
            "{env_field} holds {env_bytes} bytes of names and values, more than {MAX_ENV_BYTES} in all"
        ));
    }
    for (i, var) in task.env.iter().enumerate() {
        // The merged environment has no index of its own in the spec: name the variable.
        let field = if at == "spec" {
            format!("spec.env[{i}]")
        } else {
            format!("{env_field} (variable {})", var.name)
        };
        if !is_shell_identifier(&var.name) {
            return Err(format!(
                "{field}.name {:?} is not a valid variable name",
                var.name
            ));
        }
        if var.value.len() > MAX_ENV_VALUE_BYTES {
            return Err(format!(
                "{field}.value (variable {}) holds {} bytes, more than {MAX_ENV_VALUE_BYTES}",
                var.name,
                var.value.len()
            ));
        }
        if var.value.contains('\0') {
            return Err(format!(
                "{field}.value (variable {}) contains a NUL byte, which no process can receive",
                var.name
            ));
        }
    }
    if let Some(template) = task.template {
        let containers = template
            .spec
            .as_ref()
            .map(|s| s.containers.len())
            .unwrap_or(0);
        if containers == 0 {
            return Err(format!(
                "{at}.template.spec.containers must hold at least one container"
            ));
        }
        let policy = template
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref());
        if policy.is_some_and(|p| p != "Never") {
            return Err(format!("{at}.template.spec.restartPolicy must be Never"));
        }
    }
    Ok(())
}

/// True for an RFC 1123 DNS label: 1..63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn is_shell_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_phases_match_the_design() {
        let terminal: Vec<_> = JobPhase::ALL
            .into_iter()
            .filter(|p| p.is_terminal())
            .collect();
        assert_eq!(terminal.len(), 7);
        assert!(!JobPhase::Cancelling.is_terminal());
        for p in JobPhase::ALL {
            assert_eq!(JobPhase::parse(p.as_str()), Some(p));
        }
    }

    #[test]
    fn crd_is_small_enough_for_client_side_apply() {
        let yaml = crd_yaml();
        assert!(yaml.len() < 64 * 1024, "CRD is {} bytes", yaml.len());
    }

    #[test]
    fn validate_spec_names_the_field() {
        let mut spec = ManagedJobSpec {
            run: Some("true".into()),
            ..Default::default()
        };
        assert!(validate_spec(&spec).is_ok());
        spec.env.push(EnvVar {
            name: "A=B".into(),
            value: "x".into(),
        });
        assert!(
            validate_spec(&spec)
                .unwrap_err()
                .contains("spec.env[0].name")
        );
    }
}
