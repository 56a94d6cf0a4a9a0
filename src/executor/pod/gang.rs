//! Multi-node jobs (`spec.nodes`, a task's `nodes`; docs/design.md#multi-node-jobs): what a gang
//! of Pods needs beyond one Pod per member.
//!
//! - **Names**: each member is reachable as `<hostname>.<service>` in the job's namespace
//!   ([`member_address`]): the Pod's `hostname` is `<job name>-<rank>` and its `subdomain` the
//!   job's headless Service ([`service`], owned by the job, selecting its Pods by the
//!   `managedjobs.dev/gang` label, publishing addresses before readiness), as Indexed Jobs and
//!   JobSet do. The names are the same in every attempt.
//! - **Variables** in every container and init container ([`environment`]):
//!   `MANAGEDJOB_NODE_RANK`, `MANAGEDJOB_NUM_NODES`, `MANAGEDJOB_NODE_ADDRS` (every member's
//!   address in rank order, comma-separated: SkyPilot's `SKYPILOT_NODE_RANK`,
//!   `SKYPILOT_NUM_NODES`, `SKYPILOT_NODE_IPS`) and what `torchrun` and `jax.distributed` read
//!   (`MASTER_ADDR` = rank 0's address, `MASTER_PORT` (the template's own `MASTER_PORT` if it
//!   sets one, else 29500), `WORLD_SIZE` = N, `RANK`: one process per node; with several
//!   processes per node run `torchrun --nnodes $WORLD_SIZE --node-rank $RANK`).
//! - **All or nothing at placement**: where the API serves `scheduling.k8s.io/v1alpha2`
//!   PodGroups (KEP-4671, feature gate `GenericWorkload`, kube-scheduler's `GangScheduling`
//!   plugin), each attempt gets a PodGroup with the gang policy (`minCount: N`, [`pod_group`])
//!   and every member names it in `spec.schedulingGroup.podGroupName`: kube-scheduler binds none
//!   until all fit. Elsewhere the lifecycle removes a partly placed gang after its launch
//!   timeout ([`crate::lifecycle::members`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, PodSpec, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::ApiResource;
use serde_json::json;

use super::names::{member_hostname, pod_group_name, service_name};
use crate::api::{DEFAULT_MASTER_PORT, LABEL_GANG, LABEL_JOB_ID, TaskView};
use crate::lifecycle::JobRow;

/// The variables every container of a member gets, in this order.
pub const VARIABLES: [&str; 7] = [
    "MANAGEDJOB_NODE_RANK",
    "MANAGEDJOB_NUM_NODES",
    "MANAGEDJOB_NODE_ADDRS",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
];

/// The API group and version of kube-scheduler's PodGroup (Kubernetes 1.36).
pub const POD_GROUP_API: &str = "scheduling.k8s.io/v1alpha2";

/// The PodGroup resource, for a dynamic client (k8s-openapi has no such type for our API level).
pub fn pod_group_resource() -> ApiResource {
    ApiResource {
        group: "scheduling.k8s.io".into(),
        version: "v1alpha2".into(),
        api_version: POD_GROUP_API.into(),
        kind: "PodGroup".into(),
        plural: "podgroups".into(),
    }
}

/// The address of member `rank` of `row`'s job: `<hostname>.<service>`, resolved by cluster
/// DNS through the Pods' search path (`<namespace>.svc.<cluster domain>`), so it holds whatever
/// the cluster's domain is.
pub fn member_address(row: &JobRow, rank: u32) -> String {
    format!(
        "{}.{}",
        member_hostname(&row.name, rank),
        service_name(&row.name, &row.uid)
    )
}

/// The job's `MASTER_PORT`: the value the template gives it (the first container or init
/// container that sets `MASTER_PORT` to a port number: the spec sets the port so), else
/// [`DEFAULT_MASTER_PORT`]. Every member gets the same.
pub fn master_port(task: &TaskView<'_>) -> i32 {
    task.template
        .and_then(|t| t.spec.as_ref())
        .into_iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .flat_map(|c| c.env.iter().flatten())
        .filter(|v| v.name == "MASTER_PORT")
        .find_map(|v| v.value.as_deref()?.parse::<i32>().ok())
        .filter(|p| (1..=65535).contains(p))
        .unwrap_or(DEFAULT_MASTER_PORT)
}

/// The variables of member `rank` ([`VARIABLES`], in that order).
pub fn environment(row: &JobRow, task: &TaskView<'_>, rank: u32) -> Vec<EnvVar> {
    let size = task.size() as u32;
    let addrs: Vec<String> = (0..size).map(|r| member_address(row, r)).collect();
    let values = [
        rank.to_string(),
        size.to_string(),
        addrs.join(","),
        addrs[0].clone(),
        master_port(task).to_string(),
        size.to_string(),
        rank.to_string(),
    ];
    VARIABLES
        .iter()
        .zip(values)
        .map(|(name, value)| EnvVar {
            name: name.to_string(),
            value: Some(value),
            value_from: None,
        })
        .collect()
}

/// Makes `spec` member `rank`'s: its hostname and subdomain, and [`environment`] in every
/// container and init container (replacing any variable of the same name the template sets:
/// the rank and the addresses are the operator's to give).
pub fn shape_member(spec: &mut PodSpec, row: &JobRow, task: &TaskView<'_>, rank: u32) {
    spec.hostname = Some(member_hostname(&row.name, rank));
    spec.subdomain = Some(service_name(&row.name, &row.uid));
    let env = environment(row, task, rank);
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        let vars = c.env.get_or_insert_with(Vec::new);
        vars.retain(|v| !VARIABLES.contains(&v.name.as_str()));
        vars.extend(env.iter().cloned());
    }
}

/// The owner reference every object of the job carries (garbage-collected with it).
pub fn owner(row: &JobRow) -> OwnerReference {
    OwnerReference {
        api_version: "managedjobs.dev/v1alpha1".into(),
        kind: "ManagedJob".into(),
        name: row.name.clone(),
        uid: row.uid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The job's headless Service: the subdomain of its members, selecting them by
/// [`LABEL_GANG`], publishing their addresses before they are ready (ranks must reach each other
/// while they start), one port named `master` ([`master_port`]). One per job, for every
/// attempt and task.
pub fn service(row: &JobRow, task: &TaskView<'_>) -> Service {
    let name = service_name(&row.name, &row.uid);
    Service {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(row.namespace.clone()),
            labels: Some(BTreeMap::from([(
                LABEL_JOB_ID.to_string(),
                row.id.to_string(),
            )])),
            owner_references: Some(vec![owner(row)]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(BTreeMap::from([(LABEL_GANG.to_string(), name)])),
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("master".into()),
                port: master_port(task),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The PodGroup of `attempt` with the gang policy: kube-scheduler binds none of its `size`
/// Pods until all of them fit (`minCount` = the attempt's size). Owned by the job.
pub fn pod_group(row: &JobRow, attempt: i32, size: usize) -> serde_json::Value {
    json!({
        "apiVersion": POD_GROUP_API,
        "kind": "PodGroup",
        "metadata": {
            "name": pod_group_name(row, attempt),
            "namespace": row.namespace,
            "labels": { LABEL_JOB_ID: row.id.to_string() },
            "ownerReferences": [owner(row)],
        },
        "spec": {
            "schedulingPolicy": { "gang": { "minCount": size } },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ManagedJobSpec;

    fn row(nodes: i32) -> JobRow {
        let spec = ManagedJobSpec {
            template: Some(serde_json::from_value(json!({
                "spec": {"containers": [{"name": "main", "image": "x",
                    "env": [{"name": "RANK", "value": "user"}, {"name": "KEEP", "value": "1"}]}]}
            })).unwrap()),
            nodes: Some(nodes),
            ..Default::default()
        };
        let object = crate::lifecycle::Object {
            uid: "u",
            namespace: "ns",
            name: "train",
            generation: 1,
            spec: &spec,
            created_at_ms: 0,
            resource_version: "",
        };
        JobRow {
            id: 7,
            ..JobRow::new(&object, 0)
        }
    }

    #[test]
    fn every_member_gets_its_rank_and_the_same_addresses() {
        let r = row(4);
        let task = crate::lifecycle::tasks::current_task(&r);
        let svc = service_name("train", "u");
        let lists: Vec<Vec<EnvVar>> = (0..4).map(|k| environment(&r, &task, k)).collect();
        for (k, env) in lists.iter().enumerate() {
            let get = |n: &str| {
                env.iter()
                    .find(|v| v.name == n)
                    .unwrap()
                    .value
                    .clone()
                    .unwrap()
            };
            assert_eq!(get("MANAGEDJOB_NODE_RANK"), k.to_string());
            assert_eq!(get("RANK"), k.to_string());
            assert_eq!(get("WORLD_SIZE"), "4");
            assert_eq!(get("MANAGEDJOB_NUM_NODES"), "4");
            assert_eq!(get("MASTER_ADDR"), format!("train-0.{svc}"));
            assert_eq!(get("MASTER_PORT"), "29500");
            assert_eq!(
                get("MANAGEDJOB_NODE_ADDRS"),
                (0..4)
                    .map(|i| format!("train-{i}.{svc}"))
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
        let mut spec: PodSpec = r.spec.template.clone().unwrap().spec.unwrap();
        shape_member(&mut spec, &r, &task, 2);
        assert_eq!(spec.hostname.as_deref(), Some("train-2"));
        assert_eq!(spec.subdomain.as_deref(), Some(svc.as_str()));
        let env = spec.containers[0].env.as_ref().unwrap();
        assert_eq!(env.iter().filter(|v| v.name == "RANK").count(), 1);
        // The template sets the port: every member gets it.
        let mut r = r;
        r.spec
            .template
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .env
            .as_mut()
            .unwrap()
            .push(EnvVar {
                name: "MASTER_PORT".into(),
                value: Some("23456".into()),
                value_from: None,
            });
        let task = crate::lifecycle::tasks::current_task(&r);
        assert_eq!(master_port(&task), 23456);
        assert!(env.iter().any(|v| v.name == "KEEP"));
        assert!(
            env.iter()
                .any(|v| v.name == "RANK" && v.value.as_deref() == Some("2"))
        );
    }

    #[test]
    fn the_pod_group_asks_for_every_member() {
        let r = row(3);
        let pg = pod_group(&r, 2, 3);
        assert_eq!(pg["spec"]["schedulingPolicy"]["gang"]["minCount"], 3);
        assert_eq!(pg["metadata"]["ownerReferences"][0]["uid"], "u");
        let s = service(&r, &crate::lifecycle::tasks::current_task(&r));
        assert_eq!(s.spec.as_ref().unwrap().cluster_ip.as_deref(), Some("None"));
        assert_eq!(
            s.spec.as_ref().unwrap().publish_not_ready_addresses,
            Some(true)
        );
    }
}
