//! Property test of the world check (`lifecycle::world::check`, issue 21): for random stores
//! and observed worlds (objects, Pods, processes, job controllers), the decision stops exactly
//! the orphans, never a live attempt.
//!
//! The model, stated apart from the implementation:
//! - a job is *live* when it is not Done; its *live attempt* is its current attempt;
//! - a Pod belongs to a live attempt when a live pod job has the Pod's job-id label, its
//!   attempt label is the job's current attempt, and its namespace, owner uid and name are the
//!   job's (the name is one of the job's current Pod names);
//! - a process belongs to a live attempt when a live local job has its job id and attempt.
//!
//! Invariants, for every generated (store, world):
//! 1. a Pod is deleted iff it runs (alive, not terminating), the Pods are known, and it belongs
//!    to no live attempt; so a live attempt's Pod is never deleted, and after the fixes no Pod
//!    of a Done job runs;
//! 2. a process is stopped iff it belongs to no live attempt;
//! 3. with the objects known, a live job of the listed namespace (or any, when all were
//!    listed) whose uid is not among them is cancelled (unless a deletion is already requested)
//!    and a Done one forgotten; with the objects unknown, or for a job of another namespace,
//!    none;
//! 4. a job controller is woken iff it is not the recorded controller of a live job;
//! 5. nothing is decided twice for one job, Pod or process;
//! 6. (issue 30, one owner per job) with the owned namespaces known (the operator's claims),
//!    no Pod, job or object of another namespace is deleted, cancelled or forgotten, whatever
//!    the store holds: those are another operator's; 1 and 3 hold within the owned ones;
//! 7. (issue 43, lost nodes) with the nodes known, a Pod's member is reported lost iff the Pod
//!    belongs to a live attempt in an owned namespace, has not finished (terminating or not),
//!    and its node is deleted or not Ready for at least the grace; with the reason the node's
//!    state gives, the job's current attempt, never for a Pod on a Ready node or one not Ready
//!    within the grace, never for an unbound Pod; with the nodes unknown, none.
//!
//! The runner uses a fixed seed (override with `PROPTEST_RNG_SEED`) and persists nothing; 2,000
//! cases.

use std::collections::{HashMap, HashSet};

use managed_jobs::api::ExecutorKind;
use managed_jobs::lifecycle::nodes::{NODE_LOST, NODE_NOT_READY, NodeSeen, Nodes, NotReady};
use managed_jobs::lifecycle::world::{
    ControllerSeen, Fix, Job, PodSeen, ProcessSeen, World, check,
};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

/// The fixed seed of the runs.
const SEED: u64 = 21;

fn config() -> ProptestConfig {
    let base = ProptestConfig::with_cases(2_000);
    ProptestConfig {
        rng_seed: match base.rng_seed {
            RngSeed::Random => RngSeed::Fixed(SEED),
            fixed => fixed,
        },
        failure_persistence: None,
        ..base
    }
}

const NAMESPACES: [&str; 2] = ["a", "b"];

/// The nodes a Pod may be bound to: `ready`, `flapping` (not Ready within the grace), `dead`
/// (not Ready past it), `gone` (deleted: not in [`nodes`]), or none yet (`""`).
const NODES: [&str; 5] = ["ready", "flapping", "dead", "gone", ""];

/// Now, and the grace, of every generated world.
const NOW_MS: i64 = 10_000_000;
const GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// The nodes as the Node watch sees them ([`NODES`]).
fn nodes() -> Nodes {
    let not_ready = |for_ms: i64| NodeSeen::NotReady {
        status: NotReady::Unknown,
        since_ms: NOW_MS - for_ms,
        reason: "NodeStatusUnknown".into(),
    };
    Nodes {
        seen: HashMap::from([
            ("ready".to_string(), NodeSeen::Ready),
            ("flapping".to_string(), not_ready(59_999)),
            ("dead".to_string(), not_ready(60_000)),
        ]),
        grace: GRACE,
        now_ms: NOW_MS,
    }
}

/// The model's reason a member bound to `node` is lost, if it is.
fn model_node_loss(node: &str) -> Option<&'static str> {
    match node {
        "gone" => Some(NODE_LOST),
        "dead" => Some(NODE_NOT_READY),
        _ => None,
    }
}

fn pod_name(id: i64, attempt: i32) -> String {
    format!("j-{id}-{attempt}-t")
}

fn job(id: i64) -> impl Strategy<Value = Job> {
    (
        prop::sample::select(NAMESPACES.to_vec()),
        any::<bool>(),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.2),
        0i32..3,
        prop::option::of((100i32..104, 1u64..3)),
    )
        .prop_map(move |(ns, pod, done, deleting, attempt, controller)| Job {
            id,
            uid: format!("u{id}"),
            namespace: ns.into(),
            executor: if pod {
                ExecutorKind::Pod
            } else {
                ExecutorKind::Local
            },
            done,
            deleting,
            attempt,
            pod_names: if pod {
                vec![pod_name(id, attempt)]
            } else {
                Vec::new()
            },
            controller,
            attempts: attempt,
        })
}

fn jobs() -> impl Strategy<Value = Vec<Job>> {
    (0usize..10).prop_flat_map(|n| (1..=n as i64).map(job).collect::<Vec<_>>())
}

/// A Pod of a job among the first 12 ids (some unknown to the store), sometimes with the
/// right marks, sometimes with one of them wrong.
fn pod(serial: usize) -> impl Strategy<Value = PodSeen> {
    (
        1i64..12,
        0i32..3,
        prop::sample::select(NAMESPACES.to_vec()),
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.8),
        prop::bool::weighted(0.15),
        prop::sample::select(NODES.to_vec()),
    )
        .prop_map(
            move |(job_id, attempt, ns, right_owner, right_name, alive, terminating, node)| {
                PodSeen {
                    namespace: ns.into(),
                    name: if right_name {
                        pod_name(job_id, attempt)
                    } else {
                        format!("copy-{serial}")
                    },
                    uid: format!("pod-{serial}"),
                    job_id,
                    attempt,
                    owner_uid: if right_owner {
                        format!("u{job_id}")
                    } else {
                        "someone-else".into()
                    },
                    alive,
                    terminating,
                    node: node.into(),
                }
            },
        )
}

fn world(jobs: &[Job]) -> impl Strategy<Value = World> + use<> {
    let uids: Vec<String> = jobs.iter().map(|j| j.uid.clone()).collect();
    let recorded: Vec<(i64, i32, u64)> = jobs
        .iter()
        .filter_map(|j| j.controller.map(|(p, t)| (j.id, p, t)))
        .collect();
    (
        prop::option::of(prop::sample::subsequence(uids.clone(), 0..=uids.len())),
        prop::option::of((0usize..8).prop_flat_map(|n| (0..n).map(pod).collect::<Vec<_>>())),
        prop::collection::vec((1i32..50, 1u64..3, 1i64..12, 0i32..3), 0..6),
        prop::collection::vec((100i32..104, 1u64..3, 1i64..12), 0..4),
        prop::sample::subsequence(recorded.clone(), 0..=recorded.len()),
        prop::option::of(prop::sample::select(NAMESPACES.to_vec())),
        prop::option::of(prop::sample::subsequence(
            NAMESPACES.to_vec(),
            0..=NAMESPACES.len(),
        )),
        any::<bool>(),
    )
        .prop_map(
            |(objects, pods, processes, controllers, recorded, scope, cells, with_nodes)| World {
                nodes: with_nodes.then(nodes),
                objects: objects.map(|o| o.into_iter().chain(["stranger".to_string()]).collect()),
                objects_namespace: scope.map(str::to_string),
                cells: cells.map(|c| c.into_iter().map(str::to_string).collect()),
                // One Pod per (namespace, name), as the API holds them.
                pods: pods.map(|pods| {
                    pods.into_iter()
                        .fold(Vec::new(), |mut seen: Vec<PodSeen>, p| {
                            if !seen
                                .iter()
                                .any(|s| s.namespace == p.namespace && s.name == p.name)
                            {
                                seen.push(p);
                            }
                            seen
                        })
                }),
                processes: processes
                    .into_iter()
                    .enumerate()
                    .map(|(i, (pid, start_time, job_id, attempt))| ProcessSeen {
                        pid: pid * 100 + i as i32,
                        start_time,
                        job_id,
                        attempt,
                    })
                    .collect(),
                controllers: controllers
                    .into_iter()
                    .map(|(pid, start_time, job_id)| ControllerSeen {
                        pid,
                        start_time,
                        job_id,
                    })
                    .chain(
                        recorded
                            .into_iter()
                            .map(|(job_id, pid, start_time)| ControllerSeen {
                                pid,
                                start_time,
                                job_id,
                            }),
                    )
                    // One process per pid: a process is seen once.
                    .fold(Vec::new(), |mut seen: Vec<ControllerSeen>, c| {
                        if !seen.iter().any(|s| s.pid == c.pid) {
                            seen.push(c);
                        }
                        seen
                    }),
            },
        )
}

fn store_and_world() -> impl Strategy<Value = (Vec<Job>, World)> {
    jobs().prop_flat_map(|jobs| {
        let w = world(&jobs);
        (Just(jobs), w)
    })
}

/// The model's "belongs to a live attempt" for a Pod.
fn model_pod_owned(jobs: &[Job], pod: &PodSeen) -> bool {
    jobs.iter().any(|j| {
        !j.done
            && j.executor == ExecutorKind::Pod
            && j.id == pod.job_id
            && j.attempt == pod.attempt
            && j.namespace == pod.namespace
            && j.uid == pod.owner_uid
            && j.pod_names.contains(&pod.name)
    })
}

fn model_process_owned(jobs: &[Job], p: &ProcessSeen) -> bool {
    jobs.iter().any(|j| {
        !j.done && j.executor == ExecutorKind::Local && j.id == p.job_id && j.attempt == p.attempt
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_world_check_stops_exactly_the_orphans((jobs, world) in store_and_world()) {
        let fixes = check(&jobs, &world);
        let mut deleted: HashMap<String, usize> = HashMap::new();
        let mut stopped: HashMap<(i32, u64), usize> = HashMap::new();
        let mut cancelled: HashMap<i64, usize> = HashMap::new();
        let mut forgotten: HashMap<i64, usize> = HashMap::new();
        let mut woken: HashMap<(i32, u64, i64), usize> = HashMap::new();
        let mut lost: HashMap<(i64, String), (&'static str, i32, String)> = HashMap::new();
        for fix in &fixes {
            match fix {
                Fix::MemberLost { job_id, attempt, pod, node, loss } => {
                    let first = lost.insert((*job_id, pod.clone()), (loss.reason, *attempt, node.clone()));
                    prop_assert!(first.is_none(), "reported twice: {:?}", fix);
                }
                Fix::DeletePod { uid, .. } => *deleted.entry(uid.clone()).or_default() += 1,
                Fix::StopProcess { process, .. } => {
                    *stopped.entry((process.pid, process.start_time)).or_default() += 1
                }
                Fix::CancelVanished { job_id } => *cancelled.entry(*job_id).or_default() += 1,
                Fix::Forget { job_id, .. } => *forgotten.entry(*job_id).or_default() += 1,
                Fix::WakeController { controller: c } => {
                    *woken.entry((c.pid, c.start_time, c.job_id)).or_default() += 1
                }
            }
        }
        // 5. Nothing twice.
        for n in deleted.values().chain(stopped.values()).chain(cancelled.values())
            .chain(forgotten.values()).chain(woken.values())
        {
            prop_assert_eq!(*n, 1);
        }
        let owned = |ns: &str| world.cells.as_ref().is_none_or(|c| c.contains(ns));
        // 1. Pods (6: only in the owned namespaces).
        let pods = world.pods.clone().unwrap_or_default();
        for pod in &pods {
            let orphan = owned(&pod.namespace)
                && pod.alive && !pod.terminating && !model_pod_owned(&jobs, pod);
            prop_assert_eq!(deleted.contains_key(&pod.uid), orphan, "{:?}", pod);
            if model_pod_owned(&jobs, pod) {
                prop_assert!(!deleted.contains_key(&pod.uid), "a live attempt's Pod was deleted");
            }
        }
        prop_assert_eq!(deleted.len(), pods.iter().filter(|p| deleted.contains_key(&p.uid)).count());
        // After the fixes, no Pod of a Done job runs.
        let done: HashSet<i64> = jobs.iter().filter(|j| j.done).map(|j| j.id).collect();
        for pod in pods.iter().filter(|p| {
            owned(&p.namespace) && p.alive && !p.terminating && !deleted.contains_key(&p.uid)
        }) {
            prop_assert!(!done.contains(&pod.job_id), "{:?} runs for a Done job", pod);
        }
        // 7. Members lost to their node.
        for pod in &pods {
            let expected = (world.nodes.is_some()
                && owned(&pod.namespace)
                && pod.alive
                && model_pod_owned(&jobs, pod))
                .then(|| model_node_loss(&pod.node))
                .flatten();
            let got = lost.get(&(pod.job_id, pod.name.clone()));
            prop_assert_eq!(got.map(|g| g.0), expected, "{:?}", pod);
            if let Some((_, attempt, node)) = got {
                prop_assert_eq!(*attempt, pod.attempt);
                prop_assert_eq!(node, &pod.node);
            }
        }
        prop_assert!(lost.keys().all(|(id, name)| pods.iter().any(|p| p.job_id == *id && p.name == *name)));
        // 2. Processes.
        for p in &world.processes {
            let orphan = !model_process_owned(&jobs, p);
            prop_assert_eq!(stopped.contains_key(&(p.pid, p.start_time)), orphan, "{:?}", p);
        }
        // 3. Objects.
        for j in &jobs {
            let in_scope = world.objects_namespace.as_ref().is_none_or(|ns| *ns == j.namespace)
                && owned(&j.namespace);
            let gone = in_scope && world.objects.as_ref().is_some_and(|o| !o.contains(&j.uid));
            prop_assert_eq!(cancelled.contains_key(&j.id), gone && !j.done && !j.deleting, "{:?}", j);
            prop_assert_eq!(forgotten.contains_key(&j.id), gone && j.done, "{:?}", j);
        }
        // 4. Job controllers.
        for c in &world.controllers {
            let recorded = jobs.iter().any(|j| {
                !j.done && j.id == c.job_id && j.controller == Some((c.pid, c.start_time))
            });
            prop_assert_eq!(woken.contains_key(&(c.pid, c.start_time, c.job_id)), !recorded, "{:?}", c);
        }
    }
}

/// A deliberate mutation of the check (one that ignored the owner uid) would keep this Pod: it
/// has a live attempt's labels, namespace and name but another object's uid (a copy, another
/// shard's job). The property catches such a mutation; this case pins one instance of it.
#[test]
fn a_copy_with_another_owner_is_an_orphan() {
    let live = Job {
        id: 1,
        uid: "u1".into(),
        namespace: "a".into(),
        executor: ExecutorKind::Pod,
        done: false,
        deleting: false,
        attempt: 1,
        pod_names: vec![pod_name(1, 1)],
        controller: None,
        attempts: 1,
    };
    let copy = PodSeen {
        namespace: "a".into(),
        name: pod_name(1, 1),
        uid: "p".into(),
        job_id: 1,
        attempt: 1,
        owner_uid: "u-other-shard".into(),
        alive: true,
        terminating: false,
        node: "gone".into(),
    };
    let fixes = check(
        &[live],
        &World {
            pods: Some(vec![copy]),
            ..Default::default()
        },
    );
    assert!(matches!(fixes.as_slice(), [Fix::DeletePod { uid, .. }] if uid == "p"));
}
