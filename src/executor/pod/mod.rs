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
//! - When an attempt ends, or before its Pods are stopped, the end of each container's log is
//!   kept in the state dir ([`logs`]), so that it outlives the Pods.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{Executor, Launched, Result, Stop};
use crate::api::{LABEL_ATTEMPT, LABEL_GANG, LABEL_JOB_ID, LABEL_RANK, LABEL_SHARD, LABEL_TASK};
use crate::lifecycle::tasks::current_task;
use crate::lifecycle::{FailureReason, JobRow, Member, MemberState, Observed, Refused, Workload};
use crate::store::Store;

pub mod gang;
pub mod logs;
pub mod names;
pub mod state;

pub use names::{
    MAX_POD_NAME, TAG_ALPHABET, TAG_LEN, attempt_pod_name, legacy_attempt_pod_name,
    member_hostname, member_pod_name, pipeline_pod_name, pod_group_name, pod_name, service_name,
    task_member_pod_name, task_pod_name, uid_tag,
};
pub use state::{PodObservation, PodState};

/// The names `attempt`'s Pods of `row` may have, every rank's (and, for a job without `nodes`,
/// the name its Pod had before names carried a uid tag): what the world check keeps of a live
/// job.
pub fn member_names(row: &JobRow, attempt: i32) -> Vec<String> {
    let task = current_task(row);
    if task.nodes.is_none() {
        return vec![
            attempt_pod_name(row, attempt),
            legacy_attempt_pod_name(row, attempt),
        ];
    }
    (0..task.size() as u32)
        .map(|rank| member_pod_name(row, attempt, rank))
        .collect()
}

/// Label with the ManagedJob's name on each Pod (for `kubectl get pods -l`).
pub const LABEL_JOB_NAME: &str = "managedjobs.dev/job-name";
/// The Pod of member `rank` of `attempt`: the template plus our labels, owner reference and
/// restartPolicy Never (and the job's `terminationGracePeriodSeconds`, when it sets one); for a
/// multi-node job also its rank and gang labels, hostname, subdomain and variables
/// ([`gang::shape_member`]).
pub fn build_pod(row: &JobRow, attempt: i32, rank: u32) -> Pod {
    let task = current_task(row);
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
    // The pool the attempt was admitted onto: its nodes' labels and the taints its Pods
    // tolerate (docs/concepts/quotas-pools-and-fit.md).
    if let Some(placement) = &row.placement {
        place(&mut spec, placement);
    }
    if task.nodes.is_some() {
        labels.insert(LABEL_RANK.into(), rank.to_string());
        labels.insert(LABEL_GANG.into(), service_name(&row.name, &row.uid));
        gang::shape_member(&mut spec, row, &task, rank);
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(member_pod_name(row, attempt, rank)),
            namespace: Some(row.namespace.clone()),
            labels: Some(labels),
            annotations: meta.annotations.take(),
            owner_references: Some(vec![gang::owner(row)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Adds a pool's placement to a Pod's spec: its labels to the node selector (a label the
/// template sets already is the template's), its tolerations after the template's.
pub fn place(spec: &mut PodSpec, placement: &crate::resources::Placement) {
    if !placement.node_labels.is_empty() {
        let selector = spec.node_selector.get_or_insert_with(Default::default);
        for (k, v) in &placement.node_labels {
            selector.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    if !placement.tolerations.is_empty() {
        let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
        for t in &placement.tolerations {
            if !tolerations.contains(t) {
                tolerations.push(t.clone());
            }
        }
    }
}

/// True when `pod` is `attempt` of `row`'s job by every mark it carries: its namespace, its
/// deterministic name ([`attempt_pod_name`], or the [`legacy_attempt_pod_name`] of a Pod created
/// before an upgrade), its owner (the job's object, by uid) and its labels. A Pod that fails any
/// of them (made elsewhere, copied, relabelled) never feeds the job's status.
pub fn is_attempt_pod(pod: &Pod, row: &JobRow, attempt: i32) -> bool {
    let name = pod.metadata.name.as_deref();
    let rank = state::rank_of(pod);
    let gang = current_task(row).nodes.is_some();
    pod.metadata.namespace.as_deref() == Some(row.namespace.as_str())
        && (rank as usize) < current_task(row).size()
        && (name == Some(member_pod_name(row, attempt, rank).as_str())
            || (!gang && name == Some(legacy_attempt_pod_name(row, attempt).as_str())))
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
    /// Multi-node jobs may use kube-scheduler's gang scheduling (`--gang-scheduling auto`).
    gang_scheduling: bool,
    /// Whether the API serves PodGroups, once asked (a multi-node job's first launch or
    /// observation): its attempts then get one with the gang policy.
    pod_groups: Option<bool>,
    /// The last failed create of an attempt's Pod, while it has not succeeded since.
    create_failure: Option<CreateFailure>,
    /// The attempt whose Pods this process created last, and when: until the watch reports
    /// them (at most [`REPORT_WAIT`]), a launch asked again creates nothing (a gang's members are
    /// reported one by one; creating the unreported ones again would cost N conflicts each time).
    created: Option<(i32, std::time::Instant)>,
    /// Where the end of each container's log is kept, and how much of it ([`logs::keep`]);
    /// None keeps nothing.
    keep: Option<(crate::state_dir::StateDir, u64)>,
}

/// How long Pods just created are left to the operator's watch before a launch of the same
/// attempt creates them again (adopting those that exist).
pub const REPORT_WAIT: Duration = Duration::from_secs(10);

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
    pub fn new(shard: Option<String>, gang_scheduling: bool) -> PodExecutor {
        PodExecutor {
            client: None,
            shard,
            gang_scheduling,
            pod_groups: None,
            create_failure: None,
            created: None,
            keep: None,
        }
    }

    /// The same executor, keeping the last `bytes` of each container's log of an attempt in
    /// the state dir `dir` ([`Executor::keep_logs`]; 0 keeps nothing).
    pub fn keeping_logs(self, dir: &crate::state_dir::StateDir, bytes: u64) -> PodExecutor {
        PodExecutor {
            keep: (bytes > 0).then(|| (dir.clone(), bytes)),
            ..self
        }
    }

    /// True when a multi-node job's attempts get a PodGroup: `--gang-scheduling auto` and the
    /// API serves `scheduling.k8s.io/v1alpha2` PodGroups (asked once per process, by
    /// discovery; an error reads as not served, said in the log).
    async fn pod_groups(&mut self) -> bool {
        if !self.gang_scheduling {
            return false;
        }
        if let Some(served) = self.pod_groups {
            return served;
        }
        let served = match self.client().await {
            Ok(client) => match client.list_api_group_resources(gang::POD_GROUP_API).await {
                Ok(list) => list.resources.iter().any(|r| r.name == "podgroups"),
                Err(kube::Error::Api(e)) if e.code == 404 => false,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot tell whether the API serves PodGroups; placing the gang's Pods one by one");
                    false
                }
            },
            Err(_) => false,
        };
        tracing::info!(
            served,
            "kube-scheduler's gang scheduling (PodGroup, {})",
            gang::POD_GROUP_API
        );
        self.pod_groups = Some(served);
        served
    }

    /// Creates `object` (a Service or PodGroup of the job) unless it exists: Ok(None) once it
    /// exists, Ok(Some(refusal)) when the API refused it for good, Err(message) when it may
    /// succeed later.
    async fn ensure(
        &mut self,
        api: kube::Api<kube::api::DynamicObject>,
        object: &kube::api::DynamicObject,
        what: &str,
    ) -> std::result::Result<Option<Refused>, String> {
        match api.create(&kube::api::PostParams::default(), object).await {
            Ok(_) => Ok(None),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
            Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 404 | 422) => {
                let reason = if e.code == 403 && e.message.contains(NAMESPACE_TERMINATING) {
                    FailureReason::NamespaceTerminating
                } else {
                    FailureReason::PodRejected
                };
                Ok(Some(Refused {
                    reason,
                    message: format!("the API refused the {what}: {}", e.message),
                }))
            }
            Err(kube::Error::Api(e)) => Err(format!(
                "creating the {what}: the API answered {}: {}",
                e.code, e.message
            )),
            Err(e) => Err(format!(
                "creating the {what}: the API could not be reached: {e}"
            )),
        }
    }

    /// Records a create that failed and may succeed later: tried again after a back-off.
    fn create_failed(&mut self, attempt: i32, message: String) -> Launched {
        let failures = match &self.create_failure {
            Some(f) if f.attempt == attempt => f.failures + 1,
            _ => 1,
        };
        let delay = crate::lifecycle::backoff(CREATE_RETRY_BASE, failures).min(CREATE_RETRY_MAX);
        tracing::warn!(attempt, failures, error = %message, "creating the workload failed; trying again in {delay:?}");
        self.create_failure = Some(CreateFailure {
            attempt,
            failures,
            message: message.clone(),
            retry_at_ms: crate::lifecycle::now_ms() + delay.as_millis() as i64,
        });
        Launched::Failed { message }
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

    /// Every member's Pod as the operator's Pod watch last saw it (in the store); a member not
    /// seen is not found, or its create failed.
    async fn observe(&mut self, store: &Store, job: &JobRow, attempt: i32) -> Result<Observed> {
        let task = current_task(job);
        let size = task.size();
        let seen = if task.nodes.is_none() {
            store
                .pod_observation(job.id, attempt)?
                .into_iter()
                .collect()
        } else {
            store.pod_members(job.id, attempt)?
        };
        let mut members = Vec::with_capacity(size);
        for rank in 0..size as u32 {
            let Some(o) = seen.iter().find(|o| o.rank == rank) else {
                // Not seen: either never created, or not reported yet; a failed create says why.
                let state = match &self.create_failure {
                    Some(f) if f.attempt == attempt => MemberState::CreateFailed {
                        message: f.message.clone(),
                        retry_at_ms: f.retry_at_ms,
                    },
                    _ => MemberState::NotFound,
                };
                members.push(Member {
                    rank,
                    workload: Some(Workload::Pod(member_pod_name(job, attempt, rank))),
                    state,
                    ended_at_ms: None,
                });
                continue;
            };
            let mut member = state::member(o);
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
            members.push(member);
        }
        Ok(Observed {
            members,
            placed_together: size == 1 || self.pod_groups().await,
        })
    }

    /// Creates the attempt's Pods (one per member), once each; AlreadyExists adopts one. A
    /// multi-node job first gets its headless Service (once per job) and, where gang scheduling
    /// is served, the attempt's PodGroup, which every member names. Refused for good on 400,
    /// 403, 404 and 422 (quota, admission, invalid template; a namespace being deleted is told
    /// apart, [`NAMESPACE_TERMINATING`]); any other error is [`Launched::Failed`], to be tried
    /// again after [`CREATE_RETRY_BASE`] doubling up to [`CREATE_RETRY_MAX`] (the job
    /// controller decides when, against the launch deadline and any cancel).
    async fn launch(&mut self, job: &JobRow, attempt: i32) -> Result<Launched> {
        if let Some((a, at)) = self.created
            && a == attempt
            && at.elapsed() < REPORT_WAIT
        {
            return Ok(Launched::Created);
        }
        let client = self.client().await?;
        let task = current_task(job);
        let size = task.size();
        let mut group = None;
        if task.nodes.is_some() {
            let services = kube::Api::namespaced_with(
                client.clone(),
                &job.namespace,
                &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
            );
            let service = dynamic(&gang::service(job, &task));
            match self.ensure(services, &service, "headless Service").await {
                Ok(None) => {}
                Ok(Some(refused)) => return Ok(Launched::Refused(refused)),
                Err(message) => return Ok(self.create_failed(attempt, message)),
            }
            if size > 1 && self.pod_groups().await {
                let groups = kube::Api::namespaced_with(
                    client.clone(),
                    &job.namespace,
                    &gang::pod_group_resource(),
                );
                let pg: kube::api::DynamicObject =
                    serde_json::from_value(gang::pod_group(job, attempt, size))
                        .expect("a PodGroup is an object");
                match self.ensure(groups, &pg, "PodGroup").await {
                    Ok(None) => group = Some(pod_group_name(job, attempt)),
                    // Not allowed to (an RBAC rule missing): the Pods are placed one by one.
                    Ok(Some(refused)) => {
                        tracing::warn!(message = %refused.message, "no PodGroup for the gang; its Pods are placed one by one");
                        self.pod_groups = Some(false);
                    }
                    Err(message) => return Ok(self.create_failed(attempt, message)),
                }
            }
        }
        let pods = kube::Api::namespaced_with(
            client,
            &job.namespace,
            &kube::api::ApiResource::erase::<Pod>(&()),
        );
        for rank in 0..size as u32 {
            let mut pod = build_pod(job, attempt, rank);
            // The shard's label, whatever the template says: this shard's Pod watch must see
            // it, and no other's.
            let labels = kube::ResourceExt::labels_mut(&mut pod);
            match &self.shard {
                Some(shard) => labels.insert(LABEL_SHARD.into(), shard.clone()),
                None => labels.remove(LABEL_SHARD),
            };
            let mut object = dynamic(&pod);
            if let Some(group) = &group {
                // k8s-openapi at our API level has no `schedulingGroup` (Kubernetes 1.35+).
                object.data["spec"]["schedulingGroup"] =
                    serde_json::json!({ "podGroupName": group });
            }
            match self.ensure(pods.clone(), &object, "Pod").await {
                Ok(None) => {}
                Ok(Some(refused)) => {
                    self.create_failure = None;
                    return Ok(Launched::Refused(refused));
                }
                Err(message) => return Ok(self.create_failed(attempt, message)),
            }
        }
        self.create_failure = None;
        self.created = Some((attempt, std::time::Instant::now()));
        Ok(Launched::Created)
    }

    async fn changed(&mut self) {
        std::future::pending().await
    }

    /// Deletes every attempt's Pod, each with its own grace period, or at once when `grace` is
    /// zero (a Pod that never started: nothing to stop, and no kubelet may ever confirm). A Pod
    /// that has been terminating for longer than its grace period plus
    /// [`state::TERMINATING_MARGIN`] on a node that is not Ready is force-deleted, as the pod GC
    /// does for a node that is gone; a member the watch recorded lost to its node
    /// ([`state::lost_to_node`]) at once. Gone once none is left.
    async fn stop(&mut self, store: &Store, job: &JobRow, grace: Duration) -> Result<Stop> {
        let client = self.client().await?;
        let api: kube::Api<Pod> = kube::Api::namespaced(client.clone(), &job.namespace);
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
        let task = current_task(job);
        let current = job.attempt.max(job.launched_attempt);
        let mut names: Vec<String> = (job.task_first_attempt.max(1)..=current)
            .flat_map(|attempt| {
                if task.nodes.is_none() {
                    vec![attempt_pod_name(job, attempt)]
                } else {
                    member_names(job, attempt)
                }
            })
            .collect();
        let seen = store.pod_members(job.id, current)?;
        // A member lost to its node is removed at once (`lifecycle::nodes::removes_at_once`):
        // no kubelet will confirm a graceful deletion there.
        let lost_to_node: Vec<(String, String)> = seen
            .iter()
            .filter(|o| {
                o.state == PodState::Lost
                    && !o.deleted
                    && crate::lifecycle::nodes::removes_at_once(&o.reason)
            })
            .map(|o| (o.pod_name.clone(), o.node.clone()))
            .collect();
        // A member of the current attempt that exited on its own is kept for its logs (a gang
        // stopped because one member failed keeps that member's, and every finished one's).
        if task.nodes.is_some() {
            let exited: Vec<String> = seen
                .into_iter()
                .filter(|o| {
                    matches!(
                        o.state,
                        PodState::Succeeded
                            | PodState::Failed
                            | PodState::SetupFailed
                            | PodState::Refused
                    )
                })
                .map(|o| o.pod_name)
                .collect();
            names.retain(|n| !exited.contains(n));
        }
        // The current attempt's Pod as the watch saw it: named otherwise when it was created
        // before an upgrade (legacy_attempt_pod_name).
        if let Some(seen) = job.workload.as_ref().and_then(Workload::pod_name)
            && !names.iter().any(|n| n == seen)
        {
            names.push(seen.to_string());
        }
        for name in names {
            if let Some((_, node)) = lost_to_node.iter().find(|(n, _)| *n == name) {
                match api.delete(&name, &force).await {
                    Ok(_) => {
                        tracing::warn!(pod = %name, node, "removed a Pod whose node is lost, without its grace period");
                        forced.push(format!(
                            "Pod {name} on node {node}, which is lost, was removed without its grace period"
                        ));
                    }
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => {
                        tracing::warn!(pod = %name, error = %e, "removing the Pod failed");
                        all_gone = false;
                    }
                }
                continue;
            }
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
        if all_gone && task.size() > 1 && self.pod_groups().await {
            // The attempt's PodGroup goes with its Pods (a new attempt gets its own).
            let groups: kube::Api<kube::api::DynamicObject> =
                kube::Api::namespaced_with(client, &job.namespace, &gang::pod_group_resource());
            match groups
                .delete(&pod_group_name(job, current), &Default::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(error = %e, "deleting the attempt's PodGroup failed; it goes with the job")
                }
            }
        }
        Ok(if all_gone {
            Stop::Gone { forced }
        } else {
            Stop::Stopping { waiting_on }
        })
    }

    /// Keeps the end of each container's log of `attempt`'s Pods ([`logs::keep`]), within
    /// [`logs::KEEP_TIMEOUT`]; nothing without a client or a bound.
    async fn keep_logs(&mut self, store: &Store, job: &JobRow, attempt: i32) {
        let Some((dir, bytes)) = self.keep.clone() else {
            return;
        };
        let client = match self.client().await {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(attempt, error = %e, "no client to keep the attempt's logs with; nothing kept");
                return;
            }
        };
        logs::keep(&client, store, &dir, job, attempt, bytes).await;
    }
}

/// `object` (a typed object of the job) as a dynamic object, to create through the API.
fn dynamic<K: serde::Serialize>(object: &K) -> kube::api::DynamicObject {
    serde_json::from_value(serde_json::to_value(object).expect("an object serializes"))
        .expect("a typed object is a dynamic object")
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
        let pod = build_pod(&row, 1, 0);
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

    #[test]
    fn a_pools_placement_is_added_to_the_templates_selector_and_tolerations() {
        use k8s_openapi::api::core::v1::Toleration;
        let toleration = |key: &str| Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        };
        let mut spec = PodSpec {
            node_selector: Some([("zone".to_string(), "a".to_string())].into()),
            tolerations: Some(vec![toleration("team")]),
            ..Default::default()
        };
        let placement = crate::resources::Placement {
            pool: "a100-spot".into(),
            node_labels: [
                ("gpu".to_string(), "a100".to_string()),
                ("zone".to_string(), "b".to_string()),
            ]
            .into(),
            tolerations: vec![toleration("spot"), toleration("team")],
        };
        place(&mut spec, &placement);
        assert_eq!(
            spec.node_selector.unwrap(),
            [
                ("gpu".to_string(), "a100".to_string()),
                ("zone".to_string(), "a".to_string()),
            ]
            .into()
        );
        assert_eq!(
            spec.tolerations.unwrap(),
            vec![toleration("team"), toleration("spot")]
        );
        let row = crate::lifecycle::JobRow {
            pool: Some("a100-spot".into()),
            placement: Some(crate::resources::Placement {
                pool: "a100-spot".into(),
                node_labels: [("gpu".to_string(), "a100".to_string())].into(),
                tolerations: Vec::new(),
            }),
            ..test_row()
        };
        let pod = build_pod(&row, 1, 0);
        assert_eq!(
            pod.spec.unwrap().node_selector.unwrap()["gpu"],
            "a100",
            "the pool's labels reach the attempt's Pod"
        );
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
        let pod = build_pod(&row, 4, 0);
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
        let mut pod = build_pod(&row, 1, 0);
        pod.metadata.name = Some("job-3-1".into());
        assert_eq!(legacy_attempt_pod_name(&row, 1), "job-3-1");
        assert!(is_attempt_pod(&pod, &row, 1));
    }
}
