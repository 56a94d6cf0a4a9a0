//! The `ManagedJob` custom resource (`managedjobs.dev/v1alpha1`, `docs/design.md#the-api`), by
//! concern:
//!
//! - [`types`]: the resource itself (spec, status, a pipeline's tasks), its labels and the
//!   finalizer;
//! - [`failure`]: failure rules (`spec.failurePolicy`) and each attempt's record
//!   (`status.attempts[]`);
//! - [`states`]: the names of the two state machines ([`JobPhase`], [`ScheduleState`]), a task's
//!   phase and the executor kinds;
//! - [`schema`]: the CRD as installed: kube's derived schema plus what the derive cannot express
//!   (ranges, patterns, CEL rules for "exactly one of run/template/tasks" and immutability, the
//!   trimmed pod-template schema), so that bad input is refused by the API server;
//! - [`validation`]: the limits, and the checks the operator makes itself when a CRD without our
//!   rules was installed ([`validate_spec`]);
//! - [`queue`]: the `ManagedJobQueue` resource (cluster-scoped: a team's share of the caps and
//!   its quotas) and its CRD;
//! - [`pool`]: the `ManagedJobPool` resource (cluster-scoped: a set of nodes by labels and the
//!   taints its Pods tolerate) and its CRD;
//! - [`reference`]: the API reference (`docs/reference/api.md`), generated from both CRDs.

pub mod failure;
pub mod pool;
pub mod quantities;
pub mod queue;
pub mod reference;
pub mod schema;
pub mod states;
pub mod types;
pub mod validation;

pub use failure::{
    AttemptStatus, ExitCodeOperator, FailureAction, FailurePolicy, FailureRule, OnExitCodes,
    OnPodCondition,
};
pub use pool::{
    LOCAL_POOL, ManagedJobPool, ManagedJobPoolSpec, ManagedJobPoolStatus, pool_crd, pool_crd_yaml,
};
pub use queue::{
    DEFAULT_MAX_PREEMPTIONS_PER_MINUTE, DEFAULT_MIN_RUN_SECONDS, DEFAULT_QUEUE, ManagedJobQueue,
    ManagedJobQueueSpec, ManagedJobQueueStatus, PoolUsage, QueuePool, QueuePreemption,
    QueueShardStatus, QueueingStrategy, ReclaimShare, ReclaimWithinCohort, ResourceQuota,
    ResourceUsage, WithinQueue, is_queue_name, queue_crd, queue_crd_yaml,
};
pub use reference::api_reference;
pub use schema::{IMMUTABLE_SPEC_FIELDS, crd, crd_yaml, status_default};
pub use states::{ExecutorFacts, ExecutorKind, JobPhase, ScheduleState, TaskPhase, WaitReason};
pub use types::{
    EnvVar, FINALIZER, GROUP, LABEL_ATTEMPT, LABEL_GANG, LABEL_JOB_ID, LABEL_RANK, LABEL_SHARD,
    LABEL_TASK, ManagedJob, ManagedJobSpec, ManagedJobStatus, QueueEntry, RecoverySpec, TaskSpec,
    TaskStatus, TaskView, shard_selector,
};
pub use validation::{
    DEFAULT_MASTER_PORT, ETCD_OBJECT_BYTES, MAX_ENV_BYTES, MAX_ENV_VALUE_BYTES, MAX_ENV_VARS,
    MAX_NODES, MAX_SCRIPT_BYTES, MAX_SPEC_PAYLOAD, MAX_STATUS_BYTES, MAX_STATUS_MESSAGE_BYTES,
    MAX_TASK_ENV_VALUE_BYTES, MAX_TASK_ENV_VARS, MAX_TASKS, is_dns_label, spec_payload,
    validate_spec,
};
