//! What a Pod object shows of its attempt ([`observe`]): the [`PodObservation`] the
//! operator's Pod watch records for each attempt's Pod; and what that is as a member of the
//! attempt, in the lifecycle's kind-neutral terms ([`member`]). What the members mean for the
//! attempt is [`crate::lifecycle::members`]'s.

use k8s_openapi::api::core::v1::Pod;

use crate::lifecycle::nodes::NodeLoss;
use crate::lifecycle::outcome::POD_DEADLINE_EXCEEDED;
use crate::lifecycle::{Evidence, Member, MemberState, Outcome, PartExit, Workload};
pub use crate::store::pods::{PodObservation, PodState, TERMINATING_MARGIN};

/// What the lifecycle decides on of an observation: the Pod as a member of its attempt.
pub fn member(o: &PodObservation) -> Member {
    let state = match o.state {
        PodState::Pending => MemberState::Pending {
            reason: o.reason.clone(),
            message: o.message.clone(),
        },
        PodState::Unschedulable => MemberState::Unschedulable {
            message: o.message.clone(),
        },
        PodState::Running => MemberState::Running,
        PodState::Succeeded => MemberState::Ended(Outcome::Succeeded),
        PodState::Failed => MemberState::Ended(Outcome::Failed {
            code: o.exit_code.unwrap_or(1),
            reason: o.reason.clone(),
            detail: (!o.message.is_empty()).then(|| o.message.clone()),
            evidence: o.evidence.clone(),
        }),
        PodState::SetupFailed => MemberState::Ended(Outcome::SetupFailed {
            code: o.exit_code.unwrap_or(1),
            reason: o.reason.clone(),
            detail: (!o.message.is_empty()).then(|| o.message.clone()),
            evidence: o.evidence.clone(),
        }),
        PodState::Refused => MemberState::Ended(Outcome::Refused {
            reason: o.reason.clone(),
            message: o.message.clone(),
            evidence: o.evidence.clone(),
        }),
        PodState::DeadlineExceeded => MemberState::Ended(Outcome::DeadlineExceeded {
            code: o.exit_code,
            message: o.message.clone(),
            evidence: o.evidence.clone(),
        }),
        PodState::Invalid => MemberState::Ended(Outcome::Invalid {
            reason: o.reason.clone(),
            message: o.message.clone(),
        }),
        PodState::Terminating => MemberState::Terminating {
            message: o.message.clone(),
            force_at_ms: o.terminating_since_ms.map(|since| {
                since + o.grace_seconds.unwrap_or(0) * 1000 + TERMINATING_MARGIN.as_millis() as i64
            }),
            node_ready: None,
        },
        PodState::Lost => MemberState::Ended(Outcome::Lost {
            reason: if o.message.is_empty() {
                format!("Pod {}: {}", o.pod_name, o.reason)
            } else {
                format!("Pod {}: {} ({})", o.pod_name, o.reason, o.message)
            },
            // The cause first: an attempt's record and a spent budget's message name it. Its
            // parts' exits are dropped: a lost Pod's containers were stopped for it (137 on
            // SIGKILL, 143 or a trap's 0 on SIGTERM, `ContainerStatusUnknown`), so no exit code
            // rule reads them as the workload's; its conditions and reasons remain.
            evidence: {
                let mut e = o.evidence.clone();
                e.exits.clear();
                if !o.reason.is_empty() {
                    e.reasons.retain(|r| *r != o.reason);
                    e.reasons.insert(0, o.reason.clone());
                }
                e
            },
        }),
    };
    Member {
        rank: o.rank,
        workload: Some(Workload::Pod(o.pod_name.clone())),
        state,
        ended_at_ms: o.ended_at_ms,
    }
}

/// What a Pod that ended Failed with the kubelet's reason `DeadlineExceeded` (its
/// `status.reason`: it ran past its own `spec.activeDeadlineSeconds`, `deadline_seconds`) means
/// for its attempt (issue 30: before, such a Pod read as "refused by its node", or, with its
/// container killed 137, as a plain `Error`): [`PodState::DeadlineExceeded`], the exit code of
/// the container stopped for it when one is known (`stopped`: its name and code), and a
/// message that names the deadline, the node's words (`kubelet_message`) and the container.
/// Returns (state, exit code, reason, message).
pub fn pod_deadline(
    pod: &str,
    deadline_seconds: Option<i64>,
    kubelet_message: &str,
    stopped: Option<(&str, i32)>,
) -> (PodState, Option<i32>, String, String) {
    let deadline = match deadline_seconds {
        Some(s) => format!("its spec.activeDeadlineSeconds ({s} s)"),
        None => "its spec.activeDeadlineSeconds".into(),
    };
    let mut message = format!("Pod {pod} ran past {deadline} and its node stopped it");
    if !kubelet_message.is_empty() {
        message.push_str(&format!(" ({kubelet_message})"));
    }
    if let Some((name, code)) = stopped {
        message.push_str(&format!("; container {name} exited with code {code}"));
    }
    (
        PodState::DeadlineExceeded,
        stopped.map(|(_, code)| code),
        POD_DEADLINE_EXCEEDED.to_string(),
        message,
    )
}

/// `o`, the observation of a member whose node lost it (`loss`: deleted, or not Ready past the
/// grace; [`crate::lifecycle::nodes::member_lost`]), as the attempt must now read it: lost,
/// with the node's reason (`NodeLost`, `NodeNotReady`, what failure rules' `onReasons` match)
/// and since when, and the condition `DisruptionTarget` Kubernetes puts on a Pod it deletes
/// for its node (the pod GC's `DeletionByPodGC`, the taint manager's
/// `DeletionByTaintManager`), so that an `onPodConditions` rule written for disruptions
/// matches it as it matched before the operator saw the loss first. None when nothing
/// changes: the Pod had ended already (exited, refused, lost), so its own fate stands.
pub fn lost_to_node(o: &PodObservation, loss: &NodeLoss) -> Option<PodObservation> {
    if o.state.is_final_exit() || o.state == PodState::Lost {
        return None;
    }
    Some(PodObservation {
        state: PodState::Lost,
        exit_code: None,
        reason: loss.reason.to_string(),
        message: loss.message.clone(),
        terminating_since_ms: None,
        grace_seconds: None,
        evidence: Evidence {
            conditions: vec![("DisruptionTarget".into(), "True".into())],
            ..Evidence::reason(loss.reason)
        },
        ended_at_ms: Some(
            o.ended_at_ms
                .map_or(loss.since_ms, |e| e.min(loss.since_ms)),
        ),
        ..o.clone()
    })
}

/// What the store keeps of a Pod seen again (`new`) after `previous`: a Pod once lost stays
/// lost with its first cause (its node's loss is not undone by the node coming back, nor
/// renamed by the pod GC's deletion that follows it); later news only says that it is gone
/// (`deleted`). Anything else is replaced by what is seen now.
pub fn keep_fate(previous: Option<PodObservation>, new: PodObservation) -> PodObservation {
    match previous {
        Some(p) if p.state == PodState::Lost && p.pod_name == new.pod_name => PodObservation {
            deleted: p.deleted || new.deleted,
            ..p
        },
        _ => new,
    }
}

/// The node `pod` is bound to (`spec.nodeName`), empty before it is scheduled.
pub fn node_name(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
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
        rank: rank_of(pod),
        pod_name: name,
        state: PodState::Pending,
        exit_code: None,
        reason: String::new(),
        message: String::new(),
        deleted,
        node: node_name(pod),
        terminating_since_ms: None,
        grace_seconds: None,
        evidence: Evidence::default(),
        ended_at_ms: None,
    };
    let phase = status.phase.as_deref().unwrap_or("Pending");
    // A container the kernel OOM-killed fails its attempt whatever its exit code (as Tekton and
    // Flyte decide): a Pod can end Succeeded with an OOM-killed sidecar that exited 0.
    let oom = |statuses: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
        statuses.iter().flatten().find_map(|cs| {
            let t = cs.state.as_ref()?.terminated.as_ref()?;
            (t.reason.as_deref() == Some("OOMKilled")).then(|| (cs.name.clone(), t.exit_code))
        })
    };
    let oom_killed = if matches!(phase, "Succeeded" | "Failed") {
        oom(&status.init_container_statuses)
            .map(|(n, c)| (true, n, c))
            .or_else(|| oom(&status.container_statuses).map(|(n, c)| (false, n, c)))
    } else {
        None
    };
    match phase {
        _ if oom_killed.is_some() => {
            let (init, name, code) = oom_killed.expect("checked");
            o.state = if init {
                PodState::SetupFailed
            } else {
                PodState::Failed
            };
            o.exit_code = Some(code);
            o.reason = "OOMKilled".into();
            let kind = if init { "init container" } else { "container" };
            o.message = format!("{kind} {name} was OOM-killed (exit code {code})");
        }
        "Succeeded" | "Failed" if ended_by_disruption(pod, &status, disruption).is_some() => {
            // Deleted by someone else, evicted or preempted while it ran: its containers were
            // stopped for it, so whatever they exited with (137 on SIGKILL, 143 or a trap's 0 on
            // SIGTERM) is not the workload's own result. Lost, as if the Pod had vanished.
            let (reason, message) = ended_by_disruption(pod, &status, disruption).expect("checked");
            o.state = PodState::Lost;
            o.reason = reason;
            o.message = message;
        }
        "Succeeded" => o.state = PodState::Succeeded,
        "Failed" if disruption.is_some() || status.reason.as_deref() == Some("Evicted") => {
            let (reason, message) = match disruption {
                Some(c) => (c.reason.clone(), c.message.clone()),
                None => (status.reason.clone(), status.message.clone()),
            };
            o.state = PodState::Lost;
            o.reason = reason.unwrap_or_else(|| "Evicted".into());
            o.message = message.unwrap_or_default();
        }
        "Failed" if status.reason.as_deref() == Some(POD_DEADLINE_EXCEEDED) => {
            // Past its own activeDeadlineSeconds, the kubelet ended it (issue 30: named as such,
            // never "refused by its node" or a plain exit).
            let stopped = [&status.init_container_statuses, &status.container_statuses]
                .into_iter()
                .flat_map(|s| s.iter().flatten())
                .filter_map(|cs| {
                    let t = cs.state.as_ref()?.terminated.as_ref()?;
                    Some((cs.name.as_str(), t.exit_code))
                })
                .max_by_key(|(_, code)| *code != 0);
            let deadline = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds);
            let (state, code, reason, message) = pod_deadline(
                &o.pod_name,
                deadline,
                status.message.as_deref().unwrap_or_default(),
                stopped,
            );
            o.state = state;
            o.exit_code = code;
            o.reason = reason;
            o.message = message;
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
                o.state = PodState::SetupFailed;
                o.exit_code = Some(code);
                o.reason = reason.unwrap_or_else(|| "InitContainerFailed".into());
                o.message = format!("init container {name} exited with code {code}");
            } else if let Some((name, code, reason)) = terminated(&status.container_statuses) {
                o.state = PodState::Failed;
                o.exit_code = Some(code);
                o.reason = reason.unwrap_or_else(|| "Error".into());
                o.message = format!("container {name} exited with code {code}");
            } else {
                // Failed before any container ran, and not a disruption: the node refused the
                // Pod (OutOfcpu, UnexpectedAdmissionError, SysctlForbidden, NodeAffinity...).
                // Taken as lost it would be relaunched at once, forever.
                o.state = PodState::Refused;
                o.reason = status.reason.clone().unwrap_or_else(|| "PodFailed".into());
                o.message = status.message.clone().unwrap_or_default();
            }
        }
        "Running" => o.state = PodState::Running,
        _ if never_starts(&status).is_some() => {
            let (name, reason, message) = never_starts(&status).expect("checked");
            o.state = PodState::Invalid;
            o.reason = reason;
            o.message = format!("container {name}: {message}");
        }
        _ => {
            if let Some(c) = conditions
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            {
                o.state = PodState::Unschedulable;
                o.reason = c.reason.clone().unwrap_or_else(|| "Unschedulable".into());
                o.message = c.message.clone().unwrap_or_default();
            } else if let Some((reason, message)) = waiting_on(pod, &status) {
                o.reason = reason;
                o.message = message;
            }
        }
    }
    if deleted && !o.state.is_final_exit() {
        o.state = PodState::Lost;
        if let Some(c) = disruption.filter(|_| o.reason.is_empty() || o.reason == "Terminating") {
            // Deleted by a disruption (an eviction, a preemption, the pod GC): that is the cause.
            o.reason = c
                .reason
                .clone()
                .unwrap_or_else(|| "DisruptionTarget".into());
            o.message = c.message.clone().unwrap_or_default();
        } else if o.reason.is_empty() || o.reason == "Terminating" {
            o.reason = "PodDeleted".into();
            o.message = "the Pod was deleted".into();
        }
    } else if let Some(at) = &pod.metadata.deletion_timestamp
        && !o.state.is_final_exit()
        && o.state != PodState::Lost
    {
        // Being deleted: whatever it was doing, it no longer counts as running. (A Pod that
        // exited, or was disrupted, keeps that fate.)
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        o.state = PodState::Terminating;
        o.reason = "Terminating".into();
        o.message = if o.node.is_empty() {
            format!("Pod {} is terminating", o.pod_name)
        } else {
            format!("Pod {} on node {} is terminating", o.pod_name, o.node)
        };
        // The deletionTimestamp is when the grace period ends.
        o.terminating_since_ms = Some(at.0.as_millisecond() - grace * 1000);
        o.grace_seconds = Some(grace);
    }
    // What failure rules read, once the attempt's fate is known (not before: a live Pod's
    // conditions change often, and each change would wake its job controller).
    if o.state.is_final_exit() || o.state == PodState::Lost {
        o.evidence = evidence(&status);
    }
    o.ended_at_ms = ended_at_ms(&o);
    o
}

/// The member rank a Pod carries (`managedjobs.dev/rank`; 0 without it: a job of one Pod).
pub fn rank_of(pod: &Pod) -> u32 {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(crate::api::LABEL_RANK))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// When `o`'s Pod ended or its end was caused, as far as this observation knows (ms since
/// epoch): now, once it shows an end (exited, refused, lost, terminating); None before. The
/// store keeps the first such time of each member ([`crate::store::Store::record_pod`]): the
/// order in which the operator's watch saw a gang's members end, to the millisecond (the API's
/// own timestamps have whole seconds, too coarse to tell the member that failed from the ones
/// then stopped for it).
fn ended_at_ms(o: &PodObservation) -> Option<i64> {
    (o.state.is_final_exit() || matches!(o.state, PodState::Lost | PodState::Terminating))
        .then(crate::lifecycle::now_ms)
}

/// What failure rules read of a Pod's status (`lifecycle::rules`): every terminated container,
/// init containers first; every condition as (type, status); the Pod's reason and the reasons
/// of its True conditions (e.g. a `DisruptionTarget`'s `EvictionByEvictionAPI`).
pub fn evidence(status: &k8s_openapi::api::core::v1::PodStatus) -> Evidence {
    let exits = [
        (&status.init_container_statuses, true),
        (&status.container_statuses, false),
    ]
    .into_iter()
    .flat_map(|(s, init)| s.iter().flatten().map(move |cs| (cs, init)))
    .filter_map(|(cs, init)| {
        let t = cs.state.as_ref()?.terminated.as_ref()?;
        Some(PartExit {
            name: cs.name.clone(),
            init,
            code: t.exit_code,
            reason: t.reason.clone().unwrap_or_else(|| {
                if t.exit_code == 0 {
                    "Completed"
                } else {
                    "Error"
                }
                .into()
            }),
        })
    })
    .collect();
    let conditions = status.conditions.iter().flatten();
    Evidence {
        exits,
        conditions: conditions
            .clone()
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect(),
        reasons: status
            .reason
            .iter()
            .cloned()
            .chain(
                conditions
                    .filter(|c| c.status == "True")
                    .filter_map(|c| c.reason.clone()),
            )
            .collect(),
        ..Default::default()
    }
}

/// The kubelet's reason for a container whose end it could not observe (its node restarted, its
/// runtime lost it): exit code 137 with this reason says nothing of the workload.
const CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";

/// When a finished Pod's end was caused from outside, as (CamelCase reason, sentence): its
/// deletion was requested (`deletionTimestamp` minus its grace period), or a `DisruptionTarget`
/// condition was set (eviction, preemption, node drain), before its last container finished;
/// or the kubelet lost track of a container (`ContainerStatusUnknown`). `finishedAt` has
/// one-second resolution, so a container that finished in the same second as the request
/// counts as stopped by it (a SIGTERM trap exits within milliseconds). None: the Pod ended on
/// its own, and its phase and exit codes are the workload's result.
fn ended_by_disruption(
    pod: &Pod,
    status: &k8s_openapi::api::core::v1::PodStatus,
    disruption: Option<&k8s_openapi::api::core::v1::PodCondition>,
) -> Option<(String, String)> {
    let containers = || {
        [&status.init_container_statuses, &status.container_statuses]
            .into_iter()
            .flat_map(|s| s.iter().flatten())
    };
    if let Some(cs) = containers().find(|cs| {
        cs.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.reason.as_deref() == Some(CONTAINER_STATUS_UNKNOWN))
    }) {
        return Some((
            CONTAINER_STATUS_UNKNOWN.into(),
            format!(
                "the kubelet lost track of container {} (its node or runtime restarted)",
                cs.name
            ),
        ));
    }
    let deletion_requested_ms = pod.metadata.deletion_timestamp.as_ref().map(|at| {
        at.0.as_millisecond() - pod.metadata.deletion_grace_period_seconds.unwrap_or(0) * 1000
    });
    let disrupted_ms =
        disruption.and_then(|c| Some(c.last_transition_time.as_ref()?.0.as_millisecond()));
    let requested_ms = match (deletion_requested_ms, disrupted_ms) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    let last_finish_ms = containers()
        .filter_map(|cs| {
            Some(
                cs.state
                    .as_ref()?
                    .terminated
                    .as_ref()?
                    .finished_at
                    .as_ref()?
                    .0
                    .as_millisecond(),
            )
        })
        .max();
    if last_finish_ms.is_some_and(|f| f + 1000 <= requested_ms) {
        return None; // it had finished before anyone asked it to stop
    }
    Some(match disruption {
        Some(c) if disrupted_ms.is_some_and(|d| d <= requested_ms) => (
            c.reason
                .clone()
                .unwrap_or_else(|| "DisruptionTarget".into()),
            format!(
                "the Pod was disrupted while it ran ({}), so its exit is not the workload's",
                c.message.clone().unwrap_or_default()
            ),
        ),
        _ => (
            "PodDeleted".into(),
            "the Pod was deleted while it ran, so its exit is not the workload's".into(),
        ),
    })
}

/// Waiting reasons every Pod passes through on its way to Running: not worth reporting.
const ROUTINE_WAITING: [&str; 2] = ["ContainerCreating", "PodInitializing"];

/// What a Pending (bound, not unschedulable) Pod waits on, as (CamelCase reason, sentence naming
/// the container or node): a container's waiting reason (`ErrImagePull`, `ImagePullBackOff`,
/// `CreateContainerError`...), an init container still running, or a node that has not started
/// it. The reason is empty when nothing abnormal is known.
fn waiting_on(
    pod: &Pod,
    status: &k8s_openapi::api::core::v1::PodStatus,
) -> Option<(String, String)> {
    let statuses = || {
        [
            (&status.init_container_statuses, "init container"),
            (&status.container_statuses, "container"),
        ]
        .into_iter()
        .flat_map(|(s, kind)| s.iter().flatten().map(move |cs| (cs, kind)))
    };
    let abnormal = statuses().find_map(|(cs, kind)| {
        let w = cs.state.as_ref()?.waiting.as_ref()?;
        let reason = w.reason.clone()?;
        (!ROUTINE_WAITING.contains(&reason.as_str())).then(|| {
            let detail = w.message.clone().unwrap_or_default();
            let message = if detail.is_empty() {
                format!("{kind} {}", cs.name)
            } else {
                format!("{kind} {}: {detail}", cs.name)
            };
            (reason, message)
        })
    });
    if abnormal.is_some() {
        return abnormal;
    }
    let init_running = status
        .init_container_statuses
        .iter()
        .flatten()
        .find(|cs| cs.state.as_ref().is_some_and(|s| s.running.is_some()));
    if let Some(cs) = init_running {
        return Some((
            String::new(),
            format!("init container {} is still running", cs.name),
        ));
    }
    let node = node_name(pod);
    let reported = statuses().next().is_some();
    (!node.is_empty() && !reported).then(|| {
        (
            String::new(),
            format!("bound to node {node}, which has not started it"),
        )
    })
}

/// Waiting reasons of a container that the kubelet can never start as specified (retrying the
/// Pod cannot help). `ErrImagePull`/`ImagePullBackOff` are not among them: a registry may heal.
pub const UNSTARTABLE: [&str; 3] = [
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
];

/// The first (container, reason, message) of a Pending Pod's containers, init containers first,
/// waiting for a reason in [`UNSTARTABLE`].
fn never_starts(
    status: &k8s_openapi::api::core::v1::PodStatus,
) -> Option<(String, String, String)> {
    [&status.init_container_statuses, &status.container_statuses]
        .into_iter()
        .flat_map(|s| s.iter().flatten())
        .find_map(|cs| {
            let w = cs.state.as_ref()?.waiting.as_ref()?;
            let reason = w.reason.clone()?;
            UNSTARTABLE.contains(&reason.as_str()).then(|| {
                (
                    cs.name.clone(),
                    reason,
                    w.message.clone().unwrap_or_default(),
                )
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j-1-1"},
            "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    /// A Pod with a deletionTimestamp that had not exited is Terminating (no longer running),
    /// with when it started and its grace; one that exited keeps its exit; once gone, it is lost.
    #[test]
    fn a_deleted_pod_that_has_not_exited_is_terminating() {
        let mut pod = running_pod();
        pod.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::from_millisecond(100_000).unwrap(),
            ));
        pod.metadata.deletion_grace_period_seconds = Some(30);
        let o = observe(&pod, 1, 1, false);
        assert_eq!(o.state, PodState::Terminating);
        assert_eq!(o.terminating_since_ms, Some(70_000));
        assert_eq!(o.message, "Pod j-1-1 on node n1 is terminating");
        match member(&o).state {
            MemberState::Terminating { force_at_ms, .. } => assert_eq!(
                force_at_ms,
                Some(100_000 + TERMINATING_MARGIN.as_millis() as i64)
            ),
            other => panic!("{other:?}"),
        }
        let gone = observe(&pod, 1, 1, true);
        assert_eq!(
            (gone.state, gone.reason.as_str()),
            (PodState::Lost, "PodDeleted")
        );
        pod.status.as_mut().unwrap().phase = Some("Succeeded".into());
        // Ended without a record of when: the deletion stopped it.
        assert_eq!(observe(&pod, 1, 1, false).state, PodState::Lost);
    }

    fn time(ms: i64) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_millisecond(ms).unwrap(),
        )
    }

    /// A finished Pod whose `main` container ended at `finished_ms` with `code`.
    fn finished_pod(phase: &str, code: i32, finished_ms: i64) -> Pod {
        let mut pod = running_pod();
        let status = pod.status.as_mut().unwrap();
        status.phase = Some(phase.into());
        status.container_statuses = Some(vec![serde_json::from_value(serde_json::json!({
            "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                "finishedAt": time(finished_ms)}}
        }))
        .unwrap()]);
        pod
    }

    /// Issue 30, class 3: a Pod ended by its own `activeDeadlineSeconds` (phase Failed, reason
    /// `DeadlineExceeded`) is named as such, with or without its container's 137: before, the
    /// first read as "refused by its node" and the second as a plain `Error`.
    #[test]
    fn a_pod_past_its_own_deadline_is_named_as_such() {
        let deadline = |mut pod: Pod| {
            pod.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
            let status = pod.status.as_mut().unwrap();
            status.phase = Some("Failed".into());
            status.reason = Some("DeadlineExceeded".into());
            status.message =
                Some("Pod was active on the node longer than the specified deadline".into());
            pod
        };
        // As the dev control plane's fake kubelet leaves it: no container status.
        let bare = observe(&deadline(running_pod()), 1, 1, false);
        assert_eq!(
            (bare.state, bare.exit_code, bare.reason.as_str()),
            (PodState::DeadlineExceeded, None, "DeadlineExceeded")
        );
        assert_eq!(
            bare.message,
            "Pod j-1-1 ran past its spec.activeDeadlineSeconds (30 s) and its node stopped it \
             (Pod was active on the node longer than the specified deadline)"
        );
        // As a real kubelet leaves it: the container killed, 137.
        let killed = observe(&deadline(finished_pod("Failed", 137, 100_000)), 1, 1, false);
        assert_eq!(
            (killed.state, killed.exit_code),
            (PodState::DeadlineExceeded, Some(137))
        );
        assert!(
            killed
                .message
                .ends_with("; container main exited with code 137"),
            "{}",
            killed.message
        );
        // What that means: the workload's own failure, a restart, naming the deadline.
        match member(&killed).state {
            MemberState::Ended(outcome @ crate::lifecycle::Outcome::DeadlineExceeded { .. }) => {
                assert_eq!(outcome.reason(), "DeadlineExceeded");
                assert_eq!(outcome.exit_code(), Some(137));
                assert_eq!(
                    crate::lifecycle::Verdict::default_for(&outcome),
                    crate::lifecycle::Verdict::Restart
                );
            }
            other => panic!("{other:?}"),
        }
    }

    /// Deleted by someone else while it ran (a real kubelet then reports the exit the deletion
    /// caused): 137 from SIGKILL, 143 from SIGTERM, or 0 from a trap that saved and exited, the
    /// attempt is lost, not failed and never succeeded. One that had finished a second before
    /// the deletion was requested keeps its own result.
    #[test]
    fn a_pod_stopped_by_its_deletion_is_lost_whatever_its_exit_code() {
        for (phase, code) in [("Failed", 137), ("Failed", 143), ("Succeeded", 0)] {
            let mut pod = finished_pod(phase, code, 100_400);
            pod.metadata.deletion_timestamp = Some(time(130_000));
            pod.metadata.deletion_grace_period_seconds = Some(30);
            let o = observe(&pod, 1, 1, false);
            assert_eq!(
                (o.state, o.reason.as_str()),
                (PodState::Lost, "PodDeleted"),
                "{phase} {code}"
            );
            // Its own end, before the deletion: kept.
            let mut done = finished_pod(phase, code, 98_000);
            done.metadata.deletion_timestamp = pod.metadata.deletion_timestamp.clone();
            done.metadata.deletion_grace_period_seconds = Some(30);
            let o = observe(&done, 1, 1, false);
            assert_ne!(o.state, PodState::Lost, "{phase} {code}");
        }
    }

    /// Evicted or preempted (`DisruptionTarget`), a Pod that exited 0 on SIGTERM is lost too;
    /// a container the kubelet lost track of (`ContainerStatusUnknown`, exit 137) says nothing
    /// of the workload: lost.
    #[test]
    fn a_disrupted_or_unknown_end_is_lost() {
        let mut pod = finished_pod("Succeeded", 0, 200_500);
        pod.status.as_mut().unwrap().conditions = Some(vec![
            serde_json::from_value(serde_json::json!({
                "type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                "message": "Eviction API: evicting", "lastTransitionTime": time(200_000)
            }))
            .unwrap(),
        ]);
        let o = observe(&pod, 1, 1, false);
        assert_eq!(
            (o.state, o.reason.as_str()),
            (PodState::Lost, "EvictionByEvictionAPI")
        );
        let mut unknown = finished_pod("Failed", 137, 300_000);
        unknown
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .state
            .as_mut()
            .unwrap()
            .terminated
            .as_mut()
            .unwrap()
            .reason = Some("ContainerStatusUnknown".into());
        let o = observe(&unknown, 1, 1, false);
        assert_eq!(
            (o.state, o.reason.as_str()),
            (PodState::Lost, "ContainerStatusUnknown")
        );
        // A Pod that failed on its own, with no deletion or disruption, is still a failure.
        assert_eq!(
            observe(&finished_pod("Failed", 3, 1_000), 1, 1, false).state,
            PodState::Failed
        );
    }

    /// A Pod deleted while it ran exited 137 or 143 because of the deletion: failure rules read
    /// no exit code of it (a `NotIn` rule meant for the workload's own errors must not fail a
    /// job whose Pod someone deleted), only its cause; a Pod that failed on its own keeps its
    /// exit codes for the rules.
    #[test]
    fn a_lost_pods_exits_are_not_the_workloads_for_failure_rules() {
        use crate::api::{ExitCodeOperator, FailureAction, FailureRule, OnExitCodes};
        use crate::lifecycle::rules::matches;
        let not_75 = FailureRule {
            action: FailureAction::FailJob,
            on_exit_codes: Some(OnExitCodes {
                container_name: Some("main".into()),
                operator: ExitCodeOperator::NotIn,
                values: vec![75],
            }),
            ..Default::default()
        };
        let on_reason = |r: &str| FailureRule {
            action: FailureAction::Recover,
            on_reasons: Some(vec![r.into()]),
            ..Default::default()
        };
        for code in [137, 143] {
            let mut pod = finished_pod("Failed", code, 100_400);
            pod.metadata.deletion_timestamp = Some(time(130_000));
            pod.metadata.deletion_grace_period_seconds = Some(30);
            let MemberState::Ended(lost) = member(&observe(&pod, 1, 1, false)).state else {
                panic!("{code}")
            };
            assert!(matches!(lost, crate::lifecycle::Outcome::Lost { .. }));
            assert!(lost.evidence().unwrap().exits.is_empty(), "{code}");
            assert!(!matches(&not_75, &lost), "{code}");
            assert!(!matches(&on_reason("Error"), &lost), "{code}");
            assert!(matches(&on_reason("PodDeleted"), &lost), "{code}");
            let own = finished_pod("Failed", code, 100_400);
            let MemberState::Ended(failed) = member(&observe(&own, 1, 1, false)).state else {
                panic!("{code}")
            };
            assert!(matches(&not_75, &failed), "{code}");
        }
    }
}

#[cfg(test)]
mod node_tests {
    use super::*;
    use crate::lifecycle::nodes::{NODE_LOST, NodeSeen, member_lost};
    use crate::lifecycle::{Outcome, rules::matches};

    fn running() -> PodObservation {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j-1-1", "labels": {"managedjobs.dev/rank": "1"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        observe(&pod, 1, 1, false)
    }

    /// Issue 43, item 4: a running member whose node was deleted reads as lost, with the
    /// node's reason (which `onReasons` matches) and since when; one that had ended keeps its
    /// own fate; the loss is kept when the Pod is seen again (running, then deleted by the pod
    /// GC), only its deletion added.
    #[test]
    fn a_member_lost_to_its_node_stays_lost_with_that_cause() {
        let loss = member_lost("n1", &NodeSeen::Absent, std::time::Duration::ZERO, 5_000).unwrap();
        let o = running();
        let lost = lost_to_node(&o, &loss).unwrap();
        assert_eq!(
            (
                lost.state,
                lost.reason.as_str(),
                lost.ended_at_ms,
                lost.rank
            ),
            (PodState::Lost, NODE_LOST, Some(5_000), 1)
        );
        let MemberState::Ended(outcome @ Outcome::Lost { .. }) = member(&lost).state else {
            panic!("{lost:?}")
        };
        assert_eq!(outcome.reason(), NODE_LOST);
        assert_eq!(
            crate::lifecycle::Verdict::default_for(&outcome),
            crate::lifecycle::Verdict::Recover
        );
        let rule = crate::api::FailureRule {
            action: crate::api::FailureAction::FailJob,
            on_reasons: Some(vec![NODE_LOST.into()]),
            ..Default::default()
        };
        assert!(matches(&rule, &outcome));
        let disruption = crate::api::FailureRule {
            action: crate::api::FailureAction::Ignore,
            on_pod_conditions: Some(vec![crate::api::OnPodCondition {
                type_: "DisruptionTarget".into(),
                status: None,
            }]),
            ..Default::default()
        };
        assert!(
            matches(&disruption, &outcome),
            "a disruption, as the pod GC marks it"
        );
        // Ended on its own first: its fate stands.
        let exited = PodObservation {
            state: PodState::Failed,
            exit_code: Some(3),
            ..o.clone()
        };
        assert_eq!(lost_to_node(&exited, &loss), None);
        assert_eq!(lost_to_node(&lost, &loss), None, "lost already");
        // Seen again running (its node came back), then deleted by the pod GC: still lost to
        // its node, now gone.
        assert_eq!(keep_fate(Some(lost.clone()), o.clone()), lost);
        let collected = PodObservation {
            state: PodState::Lost,
            reason: "DeletionByPodGC".into(),
            deleted: true,
            ..o.clone()
        };
        let kept = keep_fate(Some(lost.clone()), collected);
        assert_eq!((kept.reason.as_str(), kept.deleted), (NODE_LOST, true));
        // Anything not lost is replaced by what is seen.
        assert_eq!(keep_fate(Some(o.clone()), lost.clone()), lost);
        assert_eq!(keep_fate(None, o.clone()), o);
    }
}

#[cfg(test)]
mod evidence_tests {
    use super::*;
    use crate::lifecycle::Outcome;

    /// What failure rules read of an ended Pod: every container's exit (a sidecar's too, not
    /// only the first that failed), its conditions, its reasons; nothing while it runs.
    #[test]
    fn an_ended_pod_gives_every_containers_exit_and_its_conditions() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j-1-1"},
            "spec": {"nodeName": "n1", "containers": [{"name": "sidecar"}, {"name": "main"}]},
            "status": {
                "phase": "Failed",
                "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted"}],
                "containerStatuses": [
                    {"name": "sidecar", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}},
                    {"name": "main", "state": {"terminated": {"exitCode": 75}}}
                ]
            }
        }))
        .unwrap();
        let o = observe(&pod, 1, 1, false);
        let MemberState::Ended(Outcome::Failed { evidence, .. }) = member(&o).state else {
            panic!("{o:?}")
        };
        let exits: Vec<(&str, i32, &str)> = evidence
            .exits
            .iter()
            .map(|p| (p.name.as_str(), p.code, p.reason.as_str()))
            .collect();
        assert_eq!(exits, [("sidecar", 2, "Error"), ("main", 75, "Error")]);
        assert_eq!(evidence.conditions, [("Ready".into(), "False".into())]);
        assert!(
            evidence.reasons.is_empty(),
            "a False condition gives no reason"
        );
        // Evicted: the disruption's condition and reason, the cause first.
        let evicted: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j-1-1"},
            "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
            "status": {
                "phase": "Running",
                "conditions": [{"type": "DisruptionTarget", "status": "True",
                    "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}]
            }
        }))
        .unwrap();
        assert!(
            observe(&evicted, 1, 1, false).evidence.is_empty(),
            "still running"
        );
        let gone = observe(&evicted, 1, 1, true);
        let MemberState::Ended(lost @ Outcome::Lost { .. }) = member(&gone).state else {
            panic!("{gone:?}")
        };
        let evidence = lost.evidence().unwrap();
        assert_eq!(
            lost.reason(),
            "EvictionByEvictionAPI",
            "the disruption is the cause"
        );
        assert!(
            evidence
                .conditions
                .contains(&("DisruptionTarget".into(), "True".into()))
        );
        assert!(evidence.reasons.contains(&"EvictionByEvictionAPI".into()));
    }
}
