//! The world check (`docs/design.md`, "The store is checked against the world"): what the store believes, checked against what
//! exists, both ways, as a pure decision over what was observed.
//!
//! The store is never trusted on the strength of the events the operator happened to see: an
//! object deleted while no operator watched (its finalizer removed by hand), a job controller
//! killed past the crash limit while its Pod ran on, a store lost and rebuilt while the old
//! store's job controllers lived on, each leaves the store and the world apart. [`check`] finds
//! every such gap from one observation of the world:
//!
//! 1. every job that is not Done has its object (same uid), or is cancelled as a deletion is
//!    ([`Fix::CancelVanished`]: its controller stops its workload, it ends Cancelled and its
//!    run slot is given back), and a Done job whose object is gone is forgotten
//!    ([`Fix::Forget`]);
//! 2. every Pod that carries our marks (the job-id and attempt labels and a ManagedJob owner)
//!    and still runs belongs to the current attempt of a job that is not Done (same namespace,
//!    same owner uid, its deterministic name), or is deleted ([`Fix::DeletePod`]); a finished
//!    Pod is kept for its logs, a terminating one is already going;
//! 3. every local attempt's process (its wrapper, found by its marker in this state dir)
//!    belongs to the current attempt of a local job that is not Done, or is stopped
//!    ([`Fix::StopProcess`]);
//! 4. every job controller process of this state dir is the recorded controller of a job that
//!    is not Done, or is woken ([`Fix::WakeController`]): one whose store was replaced exits
//!    ([`store_is_current`]), one waiting for its job's lock keeps waiting.
//! 5. every Pod of a live attempt that has not ended runs on a node that still holds it
//!    ([`super::nodes::member_lost`]: not deleted, not Ready or back within the grace), or its
//!    member is lost ([`Fix::MemberLost`]): its job controller ends the attempt as lost, as the
//!    Pod watch would have once the pod GC deleted the Pod. Checked at start and every period,
//!    not only on the Node watch's events (a node deleted while the operator was down).
//!
//! In particular no workload stays alive for a Done job, and a live attempt is never stopped:
//! `tests/world_props.rs` checks both over random stores and worlds.
//!
//! The caller observes in an order that makes a fresh workload safe: the processes and Pods
//! first, then the rows (an attempt's launch intent is written before its workload is created,
//! so a workload seen is known to rows read after it), then the objects (a row is inserted after
//! its object was seen, so an object seen before the rows is not missed).

use std::collections::{HashMap, HashSet};

use crate::api::ExecutorKind;

use super::nodes::{NodeLoss, Nodes};
use super::record::JobRow;

/// A job as the world check sees it, from its row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// Store id.
    pub id: i64,
    /// Its object's `metadata.uid`.
    pub uid: String,
    /// Its object's namespace.
    pub namespace: String,
    /// Its executor.
    pub executor: ExecutorKind,
    /// Done (a terminal phase): nothing of it may run any more.
    pub done: bool,
    /// A cancel for a deletion is already requested (nothing more to ask).
    pub deleting: bool,
    /// Its current attempt (the only one whose workload may run), 0 before any launch.
    pub attempt: i32,
    /// The names its current attempt's Pods may have (pod jobs: each member's deterministic
    /// name, and the name a Pod had before names carried a uid tag), as its executor gives
    /// them (`executor::member_names`); none for a local job.
    pub pod_names: Vec<String>,
    /// Its recorded job controller process (pid, start time).
    pub controller: Option<(i32, u64)>,
    /// Attempts whose files it may have (for [`Fix::Forget`]).
    pub attempts: i32,
}

/// A job that holds no run slot, as the store reads it briefly for the world check (a few
/// small columns per job, however many finished jobs it keeps).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobBrief {
    /// Store id.
    pub id: i64,
    /// Its object's uid.
    pub uid: String,
    /// Its object's namespace.
    pub namespace: String,
    /// Its executor.
    pub executor: ExecutorKind,
    /// A cancel for a deletion is requested.
    pub deleting: bool,
    /// Attempts whose files it may have.
    pub attempts: i32,
}

impl Job {
    /// A job holding a run slot, from its record: its current attempt, the names that
    /// attempt's Pods may have (`pod_names`: its executor's, `executor::member_names`), its
    /// recorded controller.
    pub fn live(row: &JobRow, pod_names: Vec<String>) -> Job {
        let attempt = row.current_attempt();
        Job {
            id: row.id,
            uid: row.uid.clone(),
            namespace: row.namespace.clone(),
            executor: row.executor,
            done: false,
            deleting: row.deleting,
            attempt,
            pod_names,
            controller: row.controller(),
            attempts: row.attempts(),
        }
    }

    /// A job not admitted yet (Inactive, Waiting): an object, no workload.
    pub fn queued(brief: JobBrief) -> Job {
        Job {
            id: brief.id,
            uid: brief.uid,
            namespace: brief.namespace,
            executor: brief.executor,
            done: false,
            deleting: brief.deleting,
            attempt: 0,
            pod_names: Vec::new(),
            controller: None,
            attempts: brief.attempts,
        }
    }

    /// A Done job: an object, and files of some attempts.
    pub fn done(brief: JobBrief) -> Job {
        Job {
            done: true,
            deleting: true,
            ..Job::queued(brief)
        }
    }
}

/// A Pod carrying our marks (the job-id and attempt labels and a ManagedJob controller owner),
/// as the operator's Pod watch last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSeen {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its own uid (a delete is preconditioned on it).
    pub uid: String,
    /// Its `managedjobs.dev/job-id` label.
    pub job_id: i64,
    /// Its `managedjobs.dev/attempt` label.
    pub attempt: i32,
    /// The uid of its ManagedJob controller owner.
    pub owner_uid: String,
    /// Not finished (phase neither Succeeded nor Failed).
    pub alive: bool,
    /// Being deleted already (`deletionTimestamp` set).
    pub terminating: bool,
    /// The node it is bound to (`spec.nodeName`; empty before it is scheduled).
    pub node: String,
}

/// A local attempt's process of this state dir: its wrapper, found by its marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessSeen {
    /// Pid (also its process group).
    pub pid: i32,
    /// Start time, clock ticks since boot.
    pub start_time: u64,
    /// The job it was started for.
    pub job_id: i64,
    /// The attempt it was started for.
    pub attempt: i32,
}

/// A job controller process of this state dir (`managed-jobs job-controller --state-dir DIR
/// [--start-gate-fd 3] --job-id N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerSeen {
    /// Pid.
    pub pid: i32,
    /// Start time, clock ticks since boot.
    pub start_time: u64,
    /// Its `--job-id`.
    pub job_id: i64,
}

/// One observation of the world.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct World {
    /// The uids of every ManagedJob this operator owns, when known completely (None: not
    /// listed, nothing is decided about objects).
    pub objects: Option<HashSet<String>>,
    /// The namespace the objects were listed in (`--namespace`; None: every namespace). A job
    /// of another namespace (an operator restarted on its state dir with a narrower
    /// `--namespace`) is no concern of the object check: its object is merely not watched.
    pub objects_namespace: Option<String>,
    /// The namespaces whose jobs this operator owns now (its claims, [`super::claim`]); None:
    /// every namespace (no claims in force). The objects, rows and Pods of another namespace
    /// are another operator's (or nobody's yet): no concern of this check, which never
    /// cancels, forgets or deletes anything there.
    pub cells: Option<HashSet<String>>,
    /// Every Pod with our marks, when known completely (None: the pod executor is off or the
    /// Pods are not listed yet).
    pub pods: Option<Vec<PodSeen>>,
    /// Every local attempt's wrapper process of this state dir.
    pub processes: Vec<ProcessSeen>,
    /// Every job controller process of this state dir.
    pub controllers: Vec<ControllerSeen>,
    /// Every Node, the grace of a node not Ready and now, when known completely (None: the
    /// Node watch has not listed them, or may not: nothing is decided about nodes).
    pub nodes: Option<Nodes>,
}

/// What the world check decided; the operator carries each out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fix {
    /// The job's object is gone (deleted while no operator watched, or without its
    /// finalizer): cancel the job as a deletion does. Its controller stops its workload, it
    /// ends Cancelled (its slots given back), then it is forgotten.
    CancelVanished {
        /// The job.
        job_id: i64,
    },
    /// The job is Done and its object is gone: forget its row and its files.
    Forget {
        /// The job.
        job_id: i64,
        /// Attempts whose files it may have.
        attempts: i32,
    },
    /// A running Pod with our marks that is no live attempt's: delete it.
    DeletePod {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Its uid (the delete's precondition).
        uid: String,
        /// Why, for the log.
        why: String,
    },
    /// A local attempt's process that is no live attempt's: stop it (SIGTERM once, SIGKILL
    /// after the grace), with everything carrying its mark.
    StopProcess {
        /// What was seen.
        process: ProcessSeen,
        /// Why, for the log.
        why: String,
    },
    /// A job controller process that is not the recorded one of a job that is not Done: wake
    /// it (SIGUSR1), so it looks at its store and its job again and exits when they are gone.
    WakeController {
        /// What was seen.
        controller: ControllerSeen,
    },
    /// A live attempt's Pod whose node lost it (deleted, or not Ready past the grace): record
    /// its member lost (unless the watch already saw it end) and wake its job controller.
    MemberLost {
        /// The job.
        job_id: i64,
        /// Its current attempt.
        attempt: i32,
        /// The Pod's name.
        pod: String,
        /// The node it is bound to.
        node: String,
        /// Why, since when.
        loss: NodeLoss,
    },
}

/// True when `pod` is the current attempt's Pod of `job` by every mark: the job is not Done
/// and runs Pods, and the Pod's labels, namespace, owner uid and name are its current
/// attempt's.
pub fn pod_is_live_attempt(job: &Job, pod: &PodSeen) -> bool {
    !job.done
        && pod.job_id == job.id
        && pod.attempt == job.attempt
        && pod.namespace == job.namespace
        && pod.owner_uid == job.uid
        && job.pod_names.contains(&pod.name)
}

/// True when `process` is the current attempt's wrapper of `job` (a local job not Done).
pub fn process_is_live_attempt(job: &Job, process: &ProcessSeen) -> bool {
    !job.done
        && job.executor.facts().local_processes
        && process.job_id == job.id
        && process.attempt == job.attempt
}

/// The world check: what must be done so that the store and the world agree (see the module
/// documentation for the rules). Pure; cost linear in the jobs, Pods and processes given.
pub fn check(jobs: &[Job], world: &World) -> Vec<Fix> {
    let by_id: HashMap<i64, &Job> = jobs.iter().map(|j| (j.id, j)).collect();
    let owned = |namespace: &str| world.cells.as_ref().is_none_or(|c| c.contains(namespace));
    let mut fixes = Vec::new();
    if let Some(objects) = &world.objects {
        let in_scope = |j: &&Job| {
            world
                .objects_namespace
                .as_ref()
                .is_none_or(|ns| *ns == j.namespace)
                && owned(&j.namespace)
        };
        for job in jobs
            .iter()
            .filter(in_scope)
            .filter(|j| !objects.contains(&j.uid))
        {
            if job.done {
                fixes.push(Fix::Forget {
                    job_id: job.id,
                    attempts: job.attempts,
                });
            } else if !job.deleting {
                fixes.push(Fix::CancelVanished { job_id: job.id });
            }
        }
    }
    for pod in world.pods.iter().flatten() {
        if !pod.alive || !owned(&pod.namespace) {
            continue;
        }
        if let Some(job) = by_id.get(&pod.job_id)
            && pod_is_live_attempt(job, pod)
        {
            // A terminating one too: on a node that is gone, nobody will confirm its end.
            if let Some(loss) = world.nodes.as_ref().and_then(|n| n.member_lost(&pod.node)) {
                fixes.push(Fix::MemberLost {
                    job_id: job.id,
                    attempt: job.attempt,
                    pod: pod.name.clone(),
                    node: pod.node.clone(),
                    loss,
                });
            }
            continue;
        }
        if pod.terminating {
            continue;
        }
        let why = match by_id.get(&pod.job_id) {
            Some(job) if job.done => format!("job {} is done", job.id),
            Some(job) if pod.owner_uid != job.uid || pod.namespace != job.namespace => format!(
                "it is owned by {} in {}, job {} is {} in {}",
                pod.owner_uid, pod.namespace, job.id, job.uid, job.namespace
            ),
            Some(job) if pod.attempt != job.attempt => format!(
                "it is attempt {} of job {}, whose current attempt is {}",
                pod.attempt, job.id, job.attempt
            ),
            Some(job) => format!("it is not a Pod of job {}'s current attempt", job.id),
            None => format!("no job {} is in the store", pod.job_id),
        };
        fixes.push(Fix::DeletePod {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            why,
        });
    }
    for process in &world.processes {
        let why = match by_id.get(&process.job_id) {
            Some(job) if process_is_live_attempt(job, process) => continue,
            Some(job) if job.done => format!("job {} is done", job.id),
            Some(job) => format!(
                "it is attempt {} of job {}, whose current attempt is {}",
                process.attempt, job.id, job.attempt
            ),
            None => format!("no job {} is in the store", process.job_id),
        };
        fixes.push(Fix::StopProcess {
            process: *process,
            why,
        });
    }
    for controller in &world.controllers {
        let recorded = by_id.get(&controller.job_id).is_some_and(|job| {
            !job.done && job.controller == Some((controller.pid, controller.start_time))
        });
        if !recorded {
            fixes.push(Fix::WakeController {
                controller: *controller,
            });
        }
    }
    fixes
}

/// A file's identity: (device, inode). A store file replaced (deleted and created again, as a
/// lost state dir is rebuilt) has another one, even at the same path.
pub type FileId = (u64, u64);

/// Fencing of stores: a job controller acts only while the store file it opened (`opened`) is
/// still the one at the store's path (`now`: None when the path is gone). One whose store was
/// replaced or removed exits without touching its workload: the current store's operator
/// adopts or stops it.
pub fn store_is_current(opened: FileId, now: Option<FileId>) -> bool {
    now == Some(opened)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, executor: ExecutorKind) -> Job {
        Job {
            id,
            uid: format!("u{id}"),
            namespace: "ns".into(),
            executor,
            done: false,
            deleting: false,
            attempt: 1,
            pod_names: vec![format!("j-{id}-1-t")],
            controller: Some((100 + id as i32, 7)),
            attempts: 1,
        }
    }

    fn pod(id: i64, attempt: i32) -> PodSeen {
        PodSeen {
            namespace: "ns".into(),
            name: format!("j-{id}-{attempt}-t"),
            uid: format!("p{id}-{attempt}"),
            job_id: id,
            attempt,
            owner_uid: format!("u{id}"),
            alive: true,
            terminating: false,
            node: "n1".into(),
        }
    }

    /// The inputs of issue 21's classes 1 to 3, each as one observation.
    #[test]
    fn each_gap_of_the_issue_is_found() {
        // Class 1: a running local job whose object was deleted while no operator watched.
        let local = job(1, ExecutorKind::Local);
        let world = World {
            objects: Some(HashSet::new()),
            processes: vec![ProcessSeen {
                pid: 50,
                start_time: 1,
                job_id: 1,
                attempt: 1,
            }],
            ..Default::default()
        };
        assert_eq!(
            check(std::slice::from_ref(&local), &world),
            vec![Fix::CancelVanished { job_id: 1 }],
            "cancelled as a deletion; its live attempt is stopped by its controller"
        );
        // ... then, once Done, forgotten.
        let done = Job {
            done: true,
            ..local.clone()
        };
        let world = World {
            objects: Some(HashSet::new()),
            ..Default::default()
        };
        assert_eq!(
            check(&[done], &world),
            vec![Fix::Forget {
                job_id: 1,
                attempts: 1
            }]
        );
        // Class 2: a pod job ended FailedController while its Pod runs.
        let failed = Job {
            done: true,
            ..job(2, ExecutorKind::Pod)
        };
        let world = World {
            objects: Some(HashSet::from(["u2".to_string()])),
            pods: Some(vec![pod(2, 1)]),
            ..Default::default()
        };
        assert!(matches!(
            check(&[failed], &world).as_slice(),
            [Fix::DeletePod { name, .. }] if name == "j-2-1-t"
        ));
        // Class 3: a controller of a replaced store beside the recorded one.
        let live = job(3, ExecutorKind::Local);
        let world = World {
            controllers: vec![
                ControllerSeen {
                    pid: 103,
                    start_time: 7,
                    job_id: 3,
                },
                ControllerSeen {
                    pid: 99,
                    start_time: 5,
                    job_id: 3,
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            check(&[live], &world),
            vec![Fix::WakeController {
                controller: ControllerSeen {
                    pid: 99,
                    start_time: 5,
                    job_id: 3
                }
            }]
        );
        assert!(store_is_current((1, 2), Some((1, 2))));
        assert!(!store_is_current((1, 2), Some((1, 3))), "replaced");
        assert!(!store_is_current((1, 2), None), "removed");
    }

    /// A live attempt's workload is never touched; finished and terminating Pods are left.
    #[test]
    fn live_attempts_and_finished_pods_are_left_alone() {
        let jobs = [job(1, ExecutorKind::Pod), job(2, ExecutorKind::Local)];
        let world = World {
            objects: Some(HashSet::from(["u1".to_string(), "u2".to_string()])),
            objects_namespace: None,
            cells: None,
            pods: Some(vec![
                pod(1, 1),
                PodSeen {
                    alive: false,
                    ..pod(1, 0)
                },
                PodSeen {
                    terminating: true,
                    ..pod(9, 1)
                },
            ]),
            processes: vec![ProcessSeen {
                pid: 5,
                start_time: 1,
                job_id: 2,
                attempt: 1,
            }],
            controllers: vec![ControllerSeen {
                pid: 101,
                start_time: 7,
                job_id: 1,
            }],
            nodes: None,
        };
        assert_eq!(check(&jobs, &world), vec![]);
        // A job of a namespace the objects were not listed in keeps its row.
        let scoped = World {
            objects: Some(HashSet::new()),
            objects_namespace: Some("elsewhere".into()),
            ..Default::default()
        };
        assert_eq!(check(&jobs, &scoped), vec![]);
    }

    /// Issue 43, item 4: a live attempt's Pod whose node was deleted, or is not Ready past
    /// the grace, is lost (terminating or not); one on a Ready node, or on a node not Ready
    /// within the grace, is left; without a full list of the nodes nothing is decided; a Pod
    /// that is no live attempt's is deleted as before, never reported lost; a finished Pod
    /// ended already.
    #[test]
    fn a_live_attempts_pod_on_a_lost_node_is_lost() {
        use crate::lifecycle::nodes::{NODE_LOST, NODE_NOT_READY, NodeSeen, NotReady};
        let now = 10_000_000;
        let nodes = Nodes {
            seen: HashMap::from([
                ("ready".to_string(), NodeSeen::Ready),
                (
                    "flapping".to_string(),
                    NodeSeen::NotReady {
                        status: NotReady::False,
                        since_ms: now - 5_000,
                        reason: String::new(),
                    },
                ),
                (
                    "dead".to_string(),
                    NodeSeen::NotReady {
                        status: NotReady::Unknown,
                        since_ms: now - 61_000,
                        reason: "NodeStatusUnknown".into(),
                    },
                ),
            ]),
            grace: std::time::Duration::from_secs(60),
            now_ms: now,
        };
        let on = |id: i64, node: &str| PodSeen {
            node: node.into(),
            ..pod(id, 1)
        };
        let jobs: Vec<Job> = (1..=7).map(|id| job(id, ExecutorKind::Pod)).collect();
        let world = World {
            pods: Some(vec![
                on(1, "gone"),
                PodSeen {
                    terminating: true,
                    ..on(2, "gone")
                },
                on(3, "ready"),
                on(4, "flapping"),
                on(5, "dead"),
                PodSeen {
                    alive: false,
                    ..on(6, "gone")
                },
                PodSeen {
                    attempt: 0,
                    ..on(7, "gone")
                },
            ]),
            nodes: Some(nodes),
            ..Default::default()
        };
        let fixes = check(&jobs, &world);
        let lost: Vec<(i64, &str, &str)> = fixes
            .iter()
            .filter_map(|f| match f {
                Fix::MemberLost {
                    job_id, node, loss, ..
                } => Some((*job_id, node.as_str(), loss.reason)),
                _ => None,
            })
            .collect();
        assert_eq!(
            lost,
            [
                (1, "gone", NODE_LOST),
                (2, "gone", NODE_LOST),
                (5, "dead", NODE_NOT_READY)
            ]
        );
        assert!(
            fixes
                .iter()
                .any(|f| matches!(f, Fix::DeletePod { name, .. } if name == "j-7-1-t")),
            "{fixes:?}"
        );
        assert_eq!(fixes.len(), 4, "{fixes:?}");
        let blind = World {
            nodes: None,
            ..world
        };
        assert_eq!(check(&jobs, &blind).len(), 1, "only the stray Pod");
    }

    /// Issue 30: a standby operator (another instance holds the claim on the namespace) never
    /// deletes the owner's Pods nor cancels its jobs, whatever its own store holds.
    #[test]
    fn nothing_in_a_namespace_another_operator_owns_is_touched() {
        let mine = job(1, ExecutorKind::Pod);
        let world = World {
            objects: Some(HashSet::new()),
            cells: Some(HashSet::from(["mine".to_string()])),
            pods: Some(vec![pod(7, 1), pod(1, 2)]),
            ..Default::default()
        };
        assert_eq!(check(std::slice::from_ref(&mine), &world), vec![]);
        let owned = World {
            cells: Some(HashSet::from(["ns".to_string()])),
            ..world
        };
        assert_eq!(
            check(&[mine], &owned).len(),
            3,
            "cancel, and two stray Pods"
        );
    }
}
