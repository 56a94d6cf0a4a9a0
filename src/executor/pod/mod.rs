//! The pod executor: one Pod per attempt in the ManagedJob's namespace (docs/design.md#executors-and-security).
//!
//! - The Pod's name is deterministic ([`pod_name`], [`names`]), so a
//!   retried create finds the existing Pod (AlreadyExists) and adopts it instead of
//!   duplicating it.
//! - It carries the job id and attempt as labels, is owned by the ManagedJob (garbage-collected
//!   with it) and has restartPolicy Never: the job controller restarts and recovers, not the kubelet.
//! - The operator's single shared watch on labelled Pods (`operator::pod_watch`) turns each
//!   Pod into a [`PodObservation`] ([`state::observe`]) in the store; job controllers read
//!   those and never watch or poll the API themselves.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::{Executor, Launched, Result, Stop};
use crate::api::{LABEL_ATTEMPT, LABEL_JOB_ID, LABEL_SHARD, LABEL_TASK};
use crate::lifecycle::{FailureReason, JobRow, MemberState, Observed, Refused, Workload};
use crate::store::Store;

pub mod names;
pub mod state;

pub use names::{
    MAX_POD_NAME, TAG_ALPHABET, TAG_LEN, attempt_pod_name, legacy_attempt_pod_name,
    pipeline_pod_name, pod_name, task_pod_name, uid_tag,
};
pub use state::{PodObservation, PodState};

/// The names `attempt`'s Pods of `row` may have: what the world check keeps of a live job.
pub fn member_names(row: &JobRow, attempt: i32) -> Vec<String> {
    vec![
        attempt_pod_name(row, attempt),
        legacy_attempt_pod_name(row, attempt),
    ]
}

/// Label with the ManagedJob's name on each Pod (for `kubectl get pods -l`).
pub const LABEL_JOB_NAME: &str = "managedjobs.dev/job-name";
/// The Pod of `attempt`: the template plus our labels, owner reference and restartPolicy Never
/// (and the job's `terminationGracePeriodSeconds`, when it sets one).
pub fn build_pod(row: &JobRow, attempt: i32) -> Pod {
    let task = crate::lifecycle::tasks::current_task(row);
    let template = task.template.cloned().unwrap_or_default();
    let mut meta = template.metadata.unwrap_or_default();
    let mut labels: BTreeMap<String, String> = meta.labels.take().unwrap_or_default();
    labels.insert(LABEL_JOB_ID.into(), row.id.to_string());
    labels.insert(LABEL_ATTEMPT.into(), attempt.to_string());
    if let Some(name) = task.name {
        labels.insert(LABEL_TASK.into(), name.into());
    }
    let job_name_label: String = row.name.chars().take(63).collect();
    let job_name_label = job_name_label.trim_end_matches(['-', '.', '_']).to_string();
    labels.insert(LABEL_JOB_NAME.into(), job_name_label);
    let mut spec: PodSpec = template.spec.unwrap_or_default();
    spec.restart_policy = Some("Never".into());
    // The job's grace period, for every stop of the Pod (a delete, an eviction, a preemption).
    if let Some(secs) = row.spec.termination_grace_period_seconds {
        spec.termination_grace_period_seconds = Some(secs);
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(attempt_pod_name(row, attempt)),
            namespace: Some(row.namespace.clone()),
            labels: Some(labels),
            annotations: meta.annotations.take(),
            owner_references: Some(vec![OwnerReference {
                api_version: "managedjobs.dev/v1alpha1".into(),
                kind: "ManagedJob".into(),
                name: row.name.clone(),
                uid: row.uid.clone(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// True when `pod` is `attempt` of `row`'s job by every mark it carries: its namespace, its
/// deterministic name ([`attempt_pod_name`], or the [`legacy_attempt_pod_name`] of a Pod created
/// before an upgrade), its owner (the job's object, by uid) and its labels. A Pod that fails any
/// of them (made elsewhere, copied, relabelled) never feeds the job's status.
pub fn is_attempt_pod(pod: &Pod, row: &JobRow, attempt: i32) -> bool {
    let name = pod.metadata.name.as_deref();
    pod.metadata.namespace.as_deref() == Some(row.namespace.as_str())
        && (name == Some(attempt_pod_name(row, attempt).as_str())
            || name == Some(legacy_attempt_pod_name(row, attempt).as_str()))
        && pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == row.uid && o.controller == Some(true))
        && pod_key(pod) == Some((row.id, attempt))
}

/// The (job id, attempt) a labelled Pod belongs to.
pub fn pod_key(pod: &Pod) -> Option<(i64, i32)> {
    let labels = pod.metadata.labels.as_ref()?;
    Some((
        labels.get(LABEL_JOB_ID)?.parse().ok()?,
        labels.get(LABEL_ATTEMPT)?.parse().ok()?,
    ))
}

/// The pod executor of one job controller: creates and deletes its job's Pods; what they do
/// comes from the store (the operator's watch), never from the API.
#[derive(Default)]
pub struct PodExecutor {
    client: Option<kube::Client>,
    /// The operator's shard (`--shard`): its Pods carry it as their `managedjobs.dev/shard`
    /// label, so that only that shard's Pod watch sees them.
    shard: Option<String>,
    /// The last failed create of an attempt's Pod, while it has not succeeded since.
    create_failure: Option<CreateFailure>,
}

/// A create of an attempt's Pod that failed and may succeed later ([`Launched::Failed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
struct CreateFailure {
    attempt: i32,
    /// Failures in a row.
    failures: i32,
    message: String,
    /// When to try again (ms since epoch).
    retry_at_ms: i64,
}

/// First delay before creating a Pod again after a failed create; doubles per failure in a row
/// up to [`CREATE_RETRY_MAX`]. Every retry counts against the launch deadline.
pub const CREATE_RETRY_BASE: Duration = Duration::from_millis(200);
/// Longest delay between two creates of one attempt's Pod.
pub const CREATE_RETRY_MAX: Duration = Duration::from_secs(10);

/// The words of the API's refusal of a create in a namespace being deleted (the
/// NamespaceLifecycle admission plugin: "unable to create new content in namespace X because
/// it is being terminated"); the Status it answers with (403 Forbidden) carries no other mark
/// that kube's error type keeps.
pub const NAMESPACE_TERMINATING: &str = "because it is being terminated";

impl PodExecutor {
    /// The executor of a job controller of shard `shard` (None: the default instance).
    pub fn new(shard: Option<String>) -> PodExecutor {
        PodExecutor {
            client: None,
            shard,
            create_failure: None,
        }
    }

    async fn client(&mut self) -> Result<kube::Client> {
        if self.client.is_none() {
            self.client = Some(kube::Client::try_default().await?);
        }
        Ok(self.client.clone().expect("set above"))
    }

    /// Whether `node` is Ready: Some(false) when it is gone or its Ready condition is not True;
    /// None when it cannot be read (e.g. a namespaced install may not read Nodes): then a Pod
    /// stuck terminating there is never forced.
    async fn node_ready(&mut self, node: &str) -> Option<bool> {
        if node.is_empty() {
            return Some(false);
        }
        let api: kube::Api<Node> = kube::Api::all(self.client().await.ok()?);
        match api.get_opt(node).await {
            Ok(None) => Some(false),
            Ok(Some(n)) => Some(node_is_ready(&n)),
            Err(e) => {
                tracing::warn!(node, error = %e, "cannot read the node of a terminating Pod; it is not forced");
                None
            }
        }
    }
}

/// True when the Node's Ready condition is True.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// True when `pod` is terminating and has outlived its grace period plus
/// [`state::TERMINATING_MARGIN`] at `now_ms`.
pub fn terminating_too_long(pod: &Pod, now_ms: i64) -> bool {
    pod.metadata.deletion_timestamp.as_ref().is_some_and(|at| {
        // The deletionTimestamp is when the grace period ends.
        at.0.as_millisecond() + state::TERMINATING_MARGIN.as_millis() as i64 <= now_ms
    })
}

impl Executor for PodExecutor {
    fn create_is_idempotent(&self) -> bool {
        true
    }

    fn stops_after_exit(&self) -> bool {
        false
    }

    async fn observe(&mut self, store: &Store, job: &JobRow, attempt: i32) -> Result<Observed> {
        let Some(o) = store.pod_observation(job.id, attempt)? else {
            // Not seen: either never created, or not reported yet; a failed create says why.
            let state = match &self.create_failure {
                Some(f) if f.attempt == attempt => MemberState::CreateFailed {
                    message: f.message.clone(),
                    retry_at_ms: f.retry_at_ms,
                },
                _ => MemberState::NotFound,
            };
            return Ok(Observed::one(
                Some(Workload::Pod(attempt_pod_name(job, attempt))),
                state,
            ));
        };
        let mut member = state::member(&o);
        // Past its grace and margin, a terminating Pod's node decides whether it is forced.
        if let MemberState::Terminating {
            force_at_ms: Some(at),
            node_ready,
            ..
        } = &mut member.state
            && *at <= crate::lifecycle::now_ms()
        {
            *node_ready = self.node_ready(&o.node).await;
        }
        Ok(Observed {
            members: vec![member],
            placed_together: true,
        })
    }

    /// Creates the attempt's Pod, once; AlreadyExists adopts it. Refused for good on 400, 403,
    /// 404 and 422 (quota, admission, invalid template; a namespace being deleted is told
    /// apart, [`NAMESPACE_TERMINATING`]); any other error is [`Launched::Failed`], to be tried
    /// again after [`CREATE_RETRY_BASE`] doubling up to [`CREATE_RETRY_MAX`] (the job
    /// controller decides when, against the launch deadline and any cancel).
    async fn launch(&mut self, job: &JobRow, attempt: i32) -> Result<Launched> {
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client().await?, &job.namespace);
        let mut pod = build_pod(job, attempt);
        // The shard's label, whatever the template says: this shard's Pod watch must see it,
        // and no other's.
        let labels = kube::ResourceExt::labels_mut(&mut pod);
        match &self.shard {
            Some(shard) => labels.insert(LABEL_SHARD.into(), shard.clone()),
            None => labels.remove(LABEL_SHARD),
        };
        let failed = match api.create(&kube::api::PostParams::default(), &pod).await {
            Ok(_) => None,
            Err(kube::Error::Api(e)) if e.code == 409 => None,
            Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 404 | 422) => {
                self.create_failure = None;
                let reason = if e.code == 403 && e.message.contains(NAMESPACE_TERMINATING) {
                    FailureReason::NamespaceTerminating
                } else {
                    FailureReason::PodRejected
                };
                return Ok(Launched::Refused(Refused {
                    reason,
                    message: format!("the API refused the Pod: {}", e.message),
                }));
            }
            Err(kube::Error::Api(e)) => Some(format!("the API answered {}: {}", e.code, e.message)),
            Err(e) => Some(format!("the API could not be reached: {e}")),
        };
        let Some(message) = failed else {
            self.create_failure = None;
            return Ok(Launched::Created);
        };
        let failures = match &self.create_failure {
            Some(f) if f.attempt == attempt => f.failures + 1,
            _ => 1,
        };
        let delay = crate::lifecycle::backoff(CREATE_RETRY_BASE, failures).min(CREATE_RETRY_MAX);
        tracing::warn!(attempt, failures, error = %message, "creating the Pod failed; trying again in {delay:?}");
        self.create_failure = Some(CreateFailure {
            attempt,
            failures,
            message: message.clone(),
            retry_at_ms: crate::lifecycle::now_ms() + delay.as_millis() as i64,
        });
        Ok(Launched::Failed { message })
    }

    async fn changed(&mut self) {
        std::future::pending().await
    }

    /// Deletes every attempt's Pod, each with its own grace period, or at once when `grace` is
    /// zero (a Pod that never started: nothing to stop, and no kubelet may ever confirm). A Pod
    /// that has been terminating for longer than its grace period plus
    /// [`state::TERMINATING_MARGIN`] on a node that is not Ready is force-deleted, as the pod GC
    /// does for a node that is gone. Gone once none is left.
    async fn stop(&mut self, job: &JobRow, grace: Duration) -> Result<Stop> {
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client().await?, &job.namespace);
        let force = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        // A job's own grace overrides its Pods' (they were created with it, unless made
        // before an upgrade); otherwise each Pod's own applies.
        let params = if grace.is_zero() {
            force.clone()
        } else if job.spec.termination_grace_period_seconds.is_some() {
            kube::api::DeleteParams {
                grace_period_seconds: Some(grace.as_secs() as u32),
                ..Default::default()
            }
        } else {
            kube::api::DeleteParams::default()
        };
        let mut all_gone = true;
        let mut waiting_on = None;
        let mut forced = Vec::new();
        // The current task's attempts: an earlier task of a pipeline ended before it.
        let mut names: Vec<String> = (job.task_first_attempt.max(1)
            ..=job.attempt.max(job.launched_attempt))
            .map(|attempt| attempt_pod_name(job, attempt))
            .collect();
        // The current attempt's Pod as the watch saw it: named otherwise when it was created
        // before an upgrade (legacy_attempt_pod_name).
        if let Some(seen) = job.workload.as_ref().and_then(Workload::pod_name)
            && !names.iter().any(|n| n == seen)
        {
            names.push(seen.to_string());
        }
        for name in names {
            // The API answers with the Pod while it terminates, with a Status once deleted.
            match api.delete(&name, &params).await.map(|r| r.left()) {
                Ok(None) => {}
                Ok(Some(pod)) => {
                    let node = state::node_name(&pod);
                    let on = if node.is_empty() {
                        format!("Pod {name}")
                    } else {
                        format!("Pod {name} on node {node}")
                    };
                    if !grace.is_zero()
                        && terminating_too_long(&pod, crate::lifecycle::now_ms())
                        && self.node_ready(&node).await == Some(false)
                    {
                        match api.delete(&name, &force).await {
                            Ok(_) => {
                                tracing::warn!(pod = %name, node, "force-deleted a Pod stuck terminating on a node that is not Ready");
                                forced.push(format!(
                                    "{on} was stuck terminating on a node that is not Ready (or gone) and was force-deleted"
                                ));
                                continue;
                            }
                            Err(kube::Error::Api(e)) if e.code == 404 => continue,
                            Err(e) => {
                                tracing::warn!(pod = %name, error = %e, "force-deleting the Pod failed")
                            }
                        }
                    }
                    all_gone = false;
                    let grace = pod
                        .metadata
                        .deletion_grace_period_seconds
                        .map_or(String::new(), |g| format!(" (grace period {g} s)"));
                    waiting_on.get_or_insert(format!("{on} to terminate{grace}"));
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(pod = %name, error = %e, "deleting the Pod failed");
                    all_gone = false;
                }
            }
        }
        Ok(if all_gone {
            Stop::Gone { forced }
        } else {
            Stop::Stopping { waiting_on }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_attempts_own_pod_is_its_pod() {
        let row = crate::lifecycle::JobRow {
            id: 3,
            uid: "uid-3".into(),
            namespace: "ns".into(),
            name: "job".into(),
            ..test_row()
        };
        let pod = build_pod(&row, 1);
        assert!(is_attempt_pod(&pod, &row, 1));
        assert!(!is_attempt_pod(&pod, &row, 2), "another attempt");
        let mut elsewhere = pod.clone();
        elsewhere.metadata.namespace = Some("other".into());
        assert!(!is_attempt_pod(&elsewhere, &row, 1), "another namespace");
        let mut renamed = pod.clone();
        renamed.metadata.name = Some(format!("{}-copy", attempt_pod_name(&row, 1)));
        assert!(!is_attempt_pod(&renamed, &row, 1), "another name");
        let mut relabelled = pod.clone();
        relabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(LABEL_JOB_ID);
        assert!(!is_attempt_pod(&relabelled, &row, 1), "labels removed");
        let mut adopted = pod;
        adopted.metadata.owner_references.as_mut().unwrap()[0].uid = "someone-else".into();
        assert!(!is_attempt_pod(&adopted, &row, 1), "another owner");
    }

    fn test_row() -> crate::lifecycle::JobRow {
        let mut store = crate::store::Store::in_memory().unwrap();
        let spec = crate::api::ManagedJobSpec {
            template: Some(Default::default()),
            ..Default::default()
        };
        store.upsert("u", "ns", "job", 1, &spec).unwrap().row
    }

    #[test]
    fn a_pipelines_pods_are_named_by_task_and_attempt_within_it() {
        let task = |name: &str| crate::api::TaskSpec {
            name: name.into(),
            template: Some(Default::default()),
            ..Default::default()
        };
        let mut row = crate::lifecycle::JobRow {
            id: 77,
            name: "x".repeat(253),
            ..test_row()
        };
        row.spec = crate::api::ManagedJobSpec {
            tasks: vec![task("prepare"), task("train")],
            ..Default::default()
        };
        row.task_index = 1;
        row.task_first_attempt = 3;
        let name = attempt_pod_name(&row, 4);
        assert!(name.len() <= MAX_POD_NAME, "{name}");
        assert!(
            name.ends_with(&format!("-77-1-2-{}", uid_tag(&row.uid))),
            "second attempt of task 1: {name}"
        );
        let pod = build_pod(&row, 4);
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_TASK], "train");
        assert_eq!(
            labels[LABEL_ATTEMPT], "4",
            "the job's attempt: the store's key"
        );
        assert!(is_attempt_pod(&pod, &row, 4));
        row.task_index = 0;
        assert!(!is_attempt_pod(&pod, &row, 4), "another task's Pod");
    }

    /// A Pod created before names carried a uid tag is still its attempt's.
    #[test]
    fn a_legacy_named_pod_is_still_the_attempts() {
        let row = crate::lifecycle::JobRow {
            id: 3,
            uid: "uid-3".into(),
            namespace: "ns".into(),
            name: "job".into(),
            ..test_row()
        };
        let mut pod = build_pod(&row, 1);
        pod.metadata.name = Some("job-3-1".into());
        assert_eq!(legacy_attempt_pod_name(&row, 1), "job-3-1");
        assert!(is_attempt_pod(&pod, &row, 1));
    }
}
