//! What one attempt of a job needs ([`Demand`]): its members times what each member asks for,
//! counted as kube-scheduler counts a Pod.
//!
//! A Pod's requests ([`pod_requests`]) follow `k8s.io/component-helpers/resource.PodRequests`,
//! which kube-scheduler's `NodeResourcesFit` uses: the containers' sum, plus the restartable
//! (sidecar) init containers; the larger of that and each ordinary init container with the
//! sidecars started before it; the pod-level `spec.resources` for cpu and memory when set; plus
//! `spec.overhead`. A container with a limit but no request for a resource requests its limit
//! (the API server's defaulting, applied here because a template is not defaulted). Every
//! resource name counts (cpu, memory, `nvidia.com/gpu`, any extended resource), and each member
//! is one Pod (`pods: 1`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, NodeSelectorRequirement, PodSpec, PodTemplateSpec, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::amount::{ONE, PODS, QuantityError, Resources};
use crate::api::ManagedJobSpec;

/// What one attempt needs: `members` Pods (1, or a gang's `nodes`), each asking for
/// `per_member`, and where its template lets them go. A local workload has one member and asks
/// for what its spec states.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Demand {
    /// Members of each attempt (a gang's `nodes`; 1 otherwise).
    #[serde(rename = "m")]
    pub members: u32,
    /// What each member asks for, in milli-units; a Pod's includes `pods: 1`.
    #[serde(rename = "r")]
    pub per_member: Resources,
    /// The template's `nodeSelector`.
    #[serde(rename = "s", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The template's required node affinity: its terms (one must hold), each a list of
    /// expressions (all must hold).
    #[serde(rename = "a", default, skip_serializing_if = "Vec::is_empty")]
    pub affinity: Vec<Vec<NodeSelectorRequirement>>,
    /// The template's tolerations.
    #[serde(rename = "t", default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// A local workload (no Pod: it runs on the operator's node, no fit on the cluster).
    #[serde(rename = "l", default, skip_serializing_if = "std::ops::Not::not")]
    pub local: bool,
}

impl Demand {
    /// The whole attempt's: `per_member` times `members`.
    pub fn total(&self) -> Resources {
        self.per_member.times(i64::from(self.members))
    }

    /// Where its members may go on a pool that adds `placement`: the pool's labels and the
    /// template's `nodeSelector` together, the template's affinity, both's tolerations. None
    /// when they contradict (a label the pool sets to one value and the template to another):
    /// no node of that pool can take it.
    pub fn constraints(&self, placement: &super::Placement) -> Option<super::fit::Constraints> {
        let mut selector = placement.node_labels.clone();
        for (k, v) in &self.node_selector {
            if selector.get(k).is_some_and(|pv| pv != v) {
                return None;
            }
            selector.insert(k.clone(), v.clone());
        }
        let mut tolerations = self.tolerations.clone();
        tolerations.extend(placement.tolerations.iter().cloned());
        Some(super::fit::Constraints {
            node_selector: selector,
            affinity: self.affinity.clone(),
            tolerations,
        })
    }

    /// `4 x {cpu: 8, nvidia.com/gpu: 8, pods: 1}`, or the member's list alone for one.
    pub fn shown(&self) -> String {
        if self.members == 1 {
            self.per_member.shown()
        } else {
            format!("{} x {}", self.members, self.per_member.shown())
        }
    }
}

/// Why a demand cannot be computed: a quantity in the template that is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {error}")]
pub struct DemandError {
    /// Where, e.g. `spec.template.spec.containers[0].resources.requests[cpu]`.
    pub field: String,
    /// What is wrong with it.
    pub error: QuantityError,
}

/// A container's requests, its limits filling the resources it requests nothing of.
fn container_requests(c: &Container, field: &str) -> Result<Resources, DemandError> {
    requirements(c.resources.as_ref(), &format!("{field}.resources"))
}

fn requirements(r: Option<&ResourceRequirements>, field: &str) -> Result<Resources, DemandError> {
    let Some(r) = r else {
        return Ok(Resources::new());
    };
    let list = |m: Option<&BTreeMap<String, Quantity>>, what: &str| {
        Resources::from_quantities(m.into_iter().flatten()).map_err(|(name, error)| DemandError {
            field: format!("{field}.{what}[{name}]"),
            error,
        })
    };
    let mut out = list(r.limits.as_ref(), "limits")?;
    for (name, a) in list(r.requests.as_ref(), "requests")?.iter() {
        out.set(name, a);
    }
    // A limit alone is also the request; a request alone stays (0 limits are unbounded).
    Ok(out)
}

/// What kube-scheduler counts for a Pod of `spec` (see the module's doc), plus `pods: 1`.
///
/// # Errors
/// A quantity that is not one ([`DemandError`] names its field under `field`, e.g.
/// `spec.template.spec`).
pub fn pod_requests(spec: &PodSpec, field: &str) -> Result<Resources, DemandError> {
    let mut reqs = Resources::new();
    for (i, c) in spec.containers.iter().enumerate() {
        reqs.add(&container_requests(c, &format!("{field}.containers[{i}]"))?);
    }
    let mut sidecars = Resources::new();
    let mut init_max = Resources::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let own = container_requests(c, &format!("{field}.initContainers[{i}]"))?;
        let counted = if c.restart_policy.as_deref() == Some("Always") {
            reqs.add(&own);
            sidecars.add(&own);
            sidecars.clone()
        } else {
            let mut with = own;
            with.add(&sidecars);
            with
        };
        init_max.max_with(&counted);
    }
    reqs.max_with(&init_max);
    // Pod-level resources (cpu and memory only) replace the containers' for those resources.
    let pod_level = requirements(spec.resources.as_ref(), &format!("{field}.resources"))?;
    for name in ["cpu", "memory"] {
        if pod_level.get(name) > 0 {
            reqs.set(name, pod_level.get(name));
        }
    }
    if let Some(overhead) = &spec.overhead {
        let o = Resources::from_quantities(overhead).map_err(|(name, error)| DemandError {
            field: format!("{field}.overhead[{name}]"),
            error,
        })?;
        reqs.add(&o);
    }
    reqs.set(PODS, ONE);
    Ok(reqs)
}

/// The demand of a Pod template with `members` members.
///
/// # Errors
/// As [`pod_requests`].
pub fn of_template(
    template: &PodTemplateSpec,
    members: u32,
    field: &str,
) -> Result<Demand, DemandError> {
    let spec = template.spec.clone().unwrap_or_default();
    let affinity = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| {
            r.node_selector_terms
                .iter()
                .map(|t| t.match_expressions.clone().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    Ok(Demand {
        members: members.max(1),
        per_member: pod_requests(&spec, &format!("{field}.spec"))?,
        node_selector: spec.node_selector.clone().unwrap_or_default(),
        affinity,
        tolerations: spec.tolerations.clone().unwrap_or_default(),
        local: false,
    })
}

/// The demand of each task of `spec` (one for a job of one task), in task order: a pod task's
/// from its template times its `nodes`; a local one's from `local` (what a local job states it
/// needs; None: nothing but its slots).
///
/// # Errors
/// As [`pod_requests`], naming the task's field.
pub fn of_job(
    spec: &ManagedJobSpec,
    local: Option<&BTreeMap<String, Quantity>>,
) -> Result<Vec<Demand>, DemandError> {
    (0..spec.task_count())
        .map(|i| {
            let task = spec.task(i);
            let field = if spec.tasks.is_empty() {
                "spec.template".to_string()
            } else {
                format!("spec.tasks[{i}].template")
            };
            match task.template {
                Some(t) => of_template(t, task.size() as u32, &field),
                None => Ok(Demand {
                    members: 1,
                    per_member: Resources::from_quantities(local.into_iter().flatten()).map_err(
                        |(name, error)| DemandError {
                            field: format!("spec.resources.requests[{name}]"),
                            error,
                        },
                    )?,
                    local: true,
                    ..Default::default()
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> PodSpec {
        serde_json::from_value(v).unwrap()
    }

    fn r(pairs: &[(&str, i64)]) -> Resources {
        let mut out = Resources::new();
        for (k, v) in pairs {
            out.set(k, *v);
        }
        out
    }

    /// The cases of component-helpers' own tests for PodRequests, in milli-units.
    #[test]
    fn a_pod_is_counted_as_kube_scheduler_counts_it() {
        // Containers add up; limits alone are requests; every resource counts.
        let s = spec(serde_json::json!({"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"cpu": "500m", "nvidia.com/gpu": "8"}}},
        ]}));
        assert_eq!(
            pod_requests(&s, "spec").unwrap(),
            r(&[
                ("cpu", 1500),
                ("memory", 1_073_741_824_000),
                ("nvidia.com/gpu", 8000),
                ("pods", 1000)
            ])
        );
        // An ordinary init container larger than the containers sets the amount.
        let s = spec(serde_json::json!({
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}],
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}],
        }));
        assert_eq!(
            pod_requests(&s, "spec").unwrap(),
            r(&[("cpu", 4000), ("pods", 1000)])
        );
        // A sidecar (restartPolicy Always) runs beside the containers: added to them, and to
        // every ordinary init container after it.
        let s = spec(serde_json::json!({
            "initContainers": [
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
                {"name": "init", "resources": {"requests": {"cpu": "3"}}},
            ],
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}}],
        }));
        assert_eq!(
            pod_requests(&s, "spec").unwrap(),
            r(&[("cpu", 4000), ("pods", 1000)])
        );
        // Overhead is added; pod-level resources replace cpu and memory.
        let s = spec(serde_json::json!({
            "overhead": {"cpu": "250m"},
            "resources": {"requests": {"memory": "2Gi"}},
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
        }));
        assert_eq!(
            pod_requests(&s, "spec").unwrap(),
            r(&[("cpu", 1250), ("memory", 2_147_483_648_000), ("pods", 1000)])
        );
        // A bad quantity names its field.
        let s = spec(serde_json::json!({"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "lots"}}},
        ]}));
        assert_eq!(
            pod_requests(&s, "spec.template.spec").unwrap_err().field,
            "spec.template.spec.containers[0].resources.requests[cpu]"
        );
    }

    #[test]
    fn a_jobs_demand_is_its_tasks_times_their_members() {
        let job: ManagedJobSpec = serde_json::from_value(serde_json::json!({
            "tasks": [
                {"name": "prep", "run": "true"},
                {"name": "train", "nodes": 4, "template": {"spec": {"containers": [
                    {"name": "t", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}},
            ]
        }))
        .unwrap();
        let local: BTreeMap<String, Quantity> = [("cpu".to_string(), Quantity("2".into()))].into();
        let d = of_job(&job, Some(&local)).unwrap();
        assert_eq!(
            d[0],
            Demand {
                members: 1,
                per_member: r(&[("cpu", 2000)]),
                local: true,
                ..Default::default()
            }
        );
        assert_eq!(d[1].members, 4);
        assert_eq!(
            d[1].total(),
            r(&[("nvidia.com/gpu", 32_000), ("pods", 4000)])
        );
        assert_eq!(d[1].shown(), "4 x {nvidia.com/gpu: 8, pods: 1}");
    }
}
