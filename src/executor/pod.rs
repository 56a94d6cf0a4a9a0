//! The pod executor: one Pod per attempt in the ManagedJob's namespace (DESIGN.md section 9).
//!
//! - The Pod's name is deterministic ([`pod_name`]), so a retried create finds the existing Pod
//!   (AlreadyExists) and adopts it instead of duplicating it.
//! - It carries the job id and attempt as labels, is owned by the ManagedJob (garbage-collected
//!   with it) and has restartPolicy Never: the job controller restarts and recovers, not the kubelet.
//! - The operator's single shared watch on labelled Pods turns each Pod into a
//!   [`PodObservation`] ([`observe`]) in the store; job controllers read those and never watch or
//!   poll the API themselves.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::Outcome;
use crate::api::{LABEL_ATTEMPT, LABEL_JOB_ID};
use crate::store::{JobRow, PodObservation};

/// Label with the ManagedJob's name on each Pod (for `kubectl get pods -l`).
pub const LABEL_JOB_NAME: &str = "managedjobs.dev/job-name";
/// Longest Pod name we generate: a DNS label, so the Pod's hostname is its name.
pub const MAX_POD_NAME: usize = 63;

/// `<job name>-<job id>-<attempt>`, with the job name cut so the whole fits in 63 characters.
/// Unique per job and attempt (the job id is), valid for any legal ManagedJob name.
pub fn pod_name(job_name: &str, job_id: i64, attempt: i32) -> String {
    let suffix = format!("-{job_id}-{attempt}");
    let keep = MAX_POD_NAME.saturating_sub(suffix.len());
    let mut base: String = job_name.chars().take(keep).collect();
    // A name cut inside a dotted subdomain must still end alphanumerically; dots become dashes
    // so the result is a DNS label.
    base = base.replace('.', "-");
    let base = base.trim_end_matches('-');
    let base = if base.is_empty() { "job" } else { base };
    format!("{base}{suffix}")
}

/// The Pod of `attempt`: the template plus our labels, owner reference and restartPolicy Never.
pub fn build_pod(row: &JobRow, attempt: i32) -> Pod {
    let template = row.spec.template.clone().unwrap_or_default();
    let mut meta = template.metadata.unwrap_or_default();
    let mut labels: BTreeMap<String, String> = meta.labels.take().unwrap_or_default();
    labels.insert(LABEL_JOB_ID.into(), row.id.to_string());
    labels.insert(LABEL_ATTEMPT.into(), attempt.to_string());
    let job_name_label: String = row.name.chars().take(63).collect();
    let job_name_label = job_name_label.trim_end_matches(['-', '.', '_']).to_string();
    labels.insert(LABEL_JOB_NAME.into(), job_name_label);
    let mut spec: PodSpec = template.spec.unwrap_or_default();
    spec.restart_policy = Some("Never".into());
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&row.name, row.id, attempt)),
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

/// The (job id, attempt) a labelled Pod belongs to.
pub fn pod_key(pod: &Pod) -> Option<(i64, i32)> {
    let labels = pod.metadata.labels.as_ref()?;
    Some((
        labels.get(LABEL_JOB_ID)?.parse().ok()?,
        labels.get(LABEL_ATTEMPT)?.parse().ok()?,
    ))
}

/// What a Pod's state means for its attempt. `deleted` is true for a watch Delete event.
pub fn observe(pod: &Pod, job_id: i64, attempt: i32, deleted: bool) -> PodObservation {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let conditions = status.conditions.clone().unwrap_or_default();
    let disruption = conditions
        .iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True");
    let mut o = PodObservation {
        job_id,
        attempt,
        pod_name: name,
        state: "pending".into(),
        exit_code: None,
        reason: String::new(),
        message: String::new(),
        deleted,
    };
    let phase = status.phase.as_deref().unwrap_or("Pending");
    match phase {
        "Succeeded" => o.state = "succeeded".into(),
        "Failed" if disruption.is_some() || status.reason.as_deref() == Some("Evicted") => {
            let (reason, message) = match disruption {
                Some(c) => (c.reason.clone(), c.message.clone()),
                None => (status.reason.clone(), status.message.clone()),
            };
            o.state = "lost".into();
            o.reason = reason.unwrap_or_else(|| "Evicted".into());
            o.message = message.unwrap_or_default();
        }
        "Failed" => {
            let terminated =
                |statuses: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
                    statuses.iter().flatten().find_map(|cs| {
                        let t = cs.state.as_ref()?.terminated.as_ref()?;
                        (t.exit_code != 0).then(|| (cs.name.clone(), t.exit_code, t.reason.clone()))
                    })
                };
            if let Some((name, code, reason)) = terminated(&status.init_container_statuses) {
                o.state = "setup-failed".into();
                o.exit_code = Some(code);
                o.reason = reason.unwrap_or_else(|| "InitContainerFailed".into());
                o.message = format!("init container {name} exited with code {code}");
            } else if let Some((name, code, reason)) = terminated(&status.container_statuses) {
                o.state = "failed".into();
                o.exit_code = Some(code);
                o.reason = reason.unwrap_or_else(|| "Error".into());
                o.message = format!("container {name} exited with code {code}");
            } else {
                o.state = "lost".into();
                o.reason = status.reason.clone().unwrap_or_else(|| "PodFailed".into());
                o.message = status.message.clone().unwrap_or_default();
            }
        }
        "Running" => o.state = "running".into(),
        _ => {
            if let Some(c) = conditions
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            {
                o.state = "unschedulable".into();
                o.reason = c.reason.clone().unwrap_or_else(|| "Unschedulable".into());
                o.message = c.message.clone().unwrap_or_default();
            }
        }
    }
    if deleted && !matches!(o.state.as_str(), "succeeded" | "failed" | "setup-failed") {
        o.state = "lost".into();
        if o.reason.is_empty() {
            o.reason = "PodDeleted".into();
            o.message = "the Pod was deleted".into();
        }
    }
    o
}

/// The attempt's outcome, once the observation is final.
pub fn outcome(o: &PodObservation) -> Option<Outcome> {
    match o.state.as_str() {
        "succeeded" => Some(Outcome::Succeeded),
        "failed" => Some(Outcome::Failed {
            code: o.exit_code.unwrap_or(1),
            reason: o.reason.clone(),
        }),
        "setup-failed" => Some(Outcome::SetupFailed {
            code: o.exit_code.unwrap_or(1),
            reason: o.reason.clone(),
        }),
        "lost" => Some(Outcome::Lost {
            reason: if o.message.is_empty() {
                format!("Pod {}: {}", o.pod_name, o.reason)
            } else {
                format!("Pod {}: {} ({})", o.pod_name, o.reason, o.message)
            },
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_names_fit_and_are_unique() {
        let long = "a".repeat(253);
        let n = pod_name(&long, 123456, 7);
        assert!(n.len() <= MAX_POD_NAME, "{n}");
        assert!(n.ends_with("-123456-7"));
        assert_ne!(pod_name(&long, 1, 1), pod_name(&long, 1, 2));
        let dotted = format!("{}.b", "x".repeat(60));
        let n = pod_name(&dotted, 5, 1);
        assert!(!n.contains('.') && n.len() <= MAX_POD_NAME, "{n}");
        assert_eq!(pod_name("hello", 1, 2), "hello-1-2");
        assert_eq!(
            pod_name(&format!("{}-", "y".repeat(58)), 1, 1),
            format!("{}-1-1", "y".repeat(58))
        );
    }
}
