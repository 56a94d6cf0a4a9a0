//! Pods, as the decisions see them: the deterministic name of each attempt's Pod (recorded
//! before it is created, so a retried create adopts instead of duplicating), where an
//! attempt's Pod stands ([`PodState`], [`PodObservation`]: what the operator's Pod watch
//! records) and what that means for the attempt ([`observed`]). How a Pod object becomes an
//! observation is the pod executor's (`executor::pod::state::observe`).

use std::fmt;

use super::outcome::{Evidence, Observed, Outcome, Workload};
use super::record::JobRow;

/// Longest Pod name we generate: a DNS label, so the Pod's hostname is its name.
pub const MAX_POD_NAME: usize = 63;

/// `<job name>-<job id>-<attempt>-<uid tag>`, with the job name cut so the whole fits in 63
/// characters (e.g. `train-7-1-x7b2kq`). Unique per job object and attempt: the tag
/// ([`uid_tag`]) comes from the object's uid, so two jobs whose names share their first
/// characters and whose ids are equal (two shards, each with its own ids, in one namespace)
/// never want one Pod name. Valid for any legal ManagedJob name.
pub fn pod_name(job_name: &str, uid: &str, job_id: i64, attempt: i32) -> String {
    with_suffix(job_name, &format!("-{job_id}-{attempt}-{}", uid_tag(uid)))
}

/// Characters of a [`uid_tag`]: Kubernetes' `rand.SafeEncodeString` alphabet (no vowels, no
/// look-alikes such as 0/o, 1/l), as in the names of a ReplicaSet's Pods.
pub const TAG_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Characters in a [`uid_tag`]: 27^6, about 3.9 x 10^8 tags.
pub const TAG_LEN: usize = 6;

/// A short, stable tag of an object's uid ([`TAG_LEN`] characters of [`TAG_ALPHABET`] from the
/// uid's 64-bit FNV-1a hash): the part of a Pod name that tells two jobs apart when their
/// names and ids agree.
pub fn uid_tag(uid: &str) -> String {
    // FNV-1a, 64 bits (offset basis and prime from the FNV reference): stable across releases
    // and platforms, as a name recorded before a create must be.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (0..TAG_LEN)
        .map(|_| {
            let c = TAG_ALPHABET[(h % TAG_ALPHABET.len() as u64) as usize] as char;
            h /= TAG_ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// The Pod name of `row`'s `attempt` (the job's count): [`pod_name`] for a job of one task;
/// `<job name>-<job id>-<task index>-<attempt within the task>-<uid tag>` for a pipeline's
/// current task (e.g. `etl-7-1-2-x7b2kq`: the second attempt of task 1, counted from 0), cut to
/// 63 characters the same way.
pub fn attempt_pod_name(row: &JobRow, attempt: i32) -> String {
    if !row.spec.is_pipeline() {
        return pod_name(&row.name, &row.uid, row.id, attempt);
    }
    let task = super::tasks::task_attempt(row, attempt);
    task_pod_name(row, row.task_index.max(0) as usize, task)
}

/// The Pod name of attempt `task_attempt` (from 1) of task `index` of `row`'s pipeline.
pub fn task_pod_name(row: &JobRow, index: usize, task_attempt: i32) -> String {
    pipeline_pod_name(&row.name, &row.uid, row.id, index, task_attempt)
}

/// `<job name>-<job id>-<task index>-<task attempt>-<uid tag>`, cut to 63 characters as
/// [`pod_name`] is.
pub fn pipeline_pod_name(
    job_name: &str,
    uid: &str,
    job_id: i64,
    index: usize,
    task_attempt: i32,
) -> String {
    with_suffix(
        job_name,
        &format!("-{job_id}-{index}-{task_attempt}-{}", uid_tag(uid)),
    )
}

/// The name an attempt's Pod had before names carried a [`uid_tag`] (operators before issue
/// 21): `<job name>-<job id>-<attempt>`, or `<job name>-<job id>-<task>-<task attempt>`. A Pod
/// so named, created before an upgrade, is still its attempt's (matched by
/// `executor::pod::is_attempt_pod`, deleted by a stop); no new Pod gets such a name.
pub fn legacy_attempt_pod_name(row: &JobRow, attempt: i32) -> String {
    if !row.spec.is_pipeline() {
        return with_suffix(&row.name, &format!("-{}-{attempt}", row.id));
    }
    let task = super::tasks::task_attempt(row, attempt);
    with_suffix(
        &row.name,
        &format!("-{}-{}-{task}", row.id, row.task_index.max(0)),
    )
}

fn with_suffix(job_name: &str, suffix: &str) -> String {
    let keep = MAX_POD_NAME.saturating_sub(suffix.len());
    let mut base: String = job_name.chars().take(keep).collect();
    // A name cut inside a dotted subdomain must still end alphanumerically; dots become dashes
    // so the result is a DNS label.
    base = base.replace('.', "-");
    let base = base.trim_end_matches('-');
    let base = if base.is_empty() { "job" } else { base };
    format!("{base}{suffix}")
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
        super::outcome::POD_DEADLINE_EXCEEDED.to_string(),
        message,
    )
}

/// Where an attempt's Pod stands, as the job controller needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodState {
    /// Created; not running yet (scheduling, pulling images, init containers running).
    Pending,
    /// The scheduler found no node (`PodScheduled=False`).
    Unschedulable,
    /// Phase Running.
    Running,
    /// Phase Succeeded.
    Succeeded,
    /// Phase Failed: a container exited non-zero.
    Failed,
    /// Phase Failed: an init container exited non-zero.
    SetupFailed,
    /// Phase Failed before any container ran: the node refused it (`OutOfcpu`...).
    Refused,
    /// Phase Failed, reason `DeadlineExceeded`: it ran past its own
    /// `spec.activeDeadlineSeconds` and its node stopped it ([`pod_deadline`]).
    DeadlineExceeded,
    /// Pending with a container the kubelet can never start (`InvalidImageName`,
    /// `ErrImageNeverPull`, `CreateContainerConfigError`).
    Invalid,
    /// Deleted (it has a `deletionTimestamp`) but not gone, and it had not exited: no longer
    /// counted as running. Relaunched once gone, or force-deleted when it outlives its grace
    /// period plus [`TERMINATING_MARGIN`] on a node that is not Ready.
    Terminating,
    /// Taken away: evicted, preempted (`DisruptionTarget`), its node lost, or deleted.
    Lost,
}

/// How long past its grace period a terminating Pod may stay on a node that is not Ready before
/// it is force-deleted (the kubelet cannot confirm; the node lifecycle controller's default
/// grace for an unresponsive node is 40 s, and its eviction waits longer still).
pub const TERMINATING_MARGIN: std::time::Duration = std::time::Duration::from_secs(30);

impl PodState {
    /// Every state.
    pub const ALL: [PodState; 11] = [
        PodState::Pending,
        PodState::Unschedulable,
        PodState::Running,
        PodState::Succeeded,
        PodState::Failed,
        PodState::SetupFailed,
        PodState::Refused,
        PodState::DeadlineExceeded,
        PodState::Invalid,
        PodState::Terminating,
        PodState::Lost,
    ];

    /// The name stored in `pod_observations.state`.
    pub fn as_str(self) -> &'static str {
        match self {
            PodState::Pending => "pending",
            PodState::Unschedulable => "unschedulable",
            PodState::Running => "running",
            PodState::Succeeded => "succeeded",
            PodState::Failed => "failed",
            PodState::SetupFailed => "setup-failed",
            PodState::Refused => "refused",
            PodState::DeadlineExceeded => "deadline-exceeded",
            PodState::Invalid => "invalid",
            PodState::Terminating => "terminating",
            PodState::Lost => "lost",
        }
    }

    /// The state named `s`, if any.
    pub fn parse(s: &str) -> Option<PodState> {
        PodState::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The attempt's fate is decided by what the Pod showed (it exited, was refused, or can
    /// never start): a deletion afterwards loses nothing.
    pub fn is_final_exit(self) -> bool {
        matches!(
            self,
            PodState::Succeeded
                | PodState::Failed
                | PodState::SetupFailed
                | PodState::Refused
                | PodState::DeadlineExceeded
                | PodState::Invalid
        )
    }
}

impl fmt::Display for PodState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the operator's shared Pod watch last saw of one attempt's Pod (the pod executor's
/// input; job controllers read it instead of watching or polling the API).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodObservation {
    /// The job.
    pub job_id: i64,
    /// The attempt the Pod belongs to.
    pub attempt: i32,
    /// The Pod's name.
    pub pod_name: String,
    /// Where it stands.
    pub state: PodState,
    /// Exit code of the failing container, when there is one.
    pub exit_code: Option<i32>,
    /// CamelCase reason (e.g. `OOMKilled`, `EvictionByEvictionAPI`).
    pub reason: String,
    /// Human-readable detail (e.g. the scheduler's "0/4 nodes are available: ...").
    pub message: String,
    /// The Pod is gone from the API.
    pub deleted: bool,
    /// The node it is bound to (empty before it is scheduled).
    pub node: String,
    /// When it started terminating (ms since epoch: its `deletionTimestamp` minus its grace
    /// period), while [`PodState::Terminating`].
    pub terminating_since_ms: Option<i64>,
    /// Its deletion grace period, seconds (`deletionGracePeriodSeconds`).
    pub grace_seconds: Option<i64>,
    /// What failure rules read of an ended Pod: every terminated container, its conditions,
    /// the reasons given (empty while it has not ended).
    pub evidence: Evidence,
}

/// What the job controller's decision needs of an observation.
pub fn observed(o: &PodObservation) -> Observed {
    let pod = o.pod_name.clone();
    match o.state {
        PodState::Pending => Observed::Pending {
            pod,
            reason: o.reason.clone(),
            message: o.message.clone(),
        },
        PodState::Unschedulable => Observed::Unschedulable {
            pod,
            message: o.message.clone(),
        },
        PodState::Running => Observed::Running {
            workload: Workload::Pod(pod),
        },
        PodState::Succeeded => Observed::Ended(Outcome::Succeeded),
        PodState::Failed => Observed::Ended(Outcome::Failed {
            code: o.exit_code.unwrap_or(1),
            reason: o.reason.clone(),
            detail: (!o.message.is_empty()).then(|| o.message.clone()),
            evidence: o.evidence.clone(),
        }),
        PodState::SetupFailed => Observed::Ended(Outcome::SetupFailed {
            code: o.exit_code.unwrap_or(1),
            reason: o.reason.clone(),
            detail: (!o.message.is_empty()).then(|| o.message.clone()),
            evidence: o.evidence.clone(),
        }),
        PodState::Refused => Observed::Ended(Outcome::Refused {
            reason: o.reason.clone(),
            message: o.message.clone(),
            evidence: o.evidence.clone(),
        }),
        PodState::DeadlineExceeded => Observed::Ended(Outcome::DeadlineExceeded {
            code: o.exit_code,
            message: o.message.clone(),
            evidence: o.evidence.clone(),
        }),
        PodState::Invalid => Observed::Ended(Outcome::Invalid {
            reason: o.reason.clone(),
            message: o.message.clone(),
        }),
        PodState::Terminating => Observed::Terminating {
            pod,
            message: o.message.clone(),
            force_at_ms: o.terminating_since_ms.map(|since| {
                since + o.grace_seconds.unwrap_or(0) * 1000 + TERMINATING_MARGIN.as_millis() as i64
            }),
            node_ready: None,
        },
        PodState::Lost => Observed::Ended(Outcome::Lost {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, uid: &str, name: &str) -> JobRow {
        let spec = crate::api::ManagedJobSpec {
            template: Some(Default::default()),
            ..Default::default()
        };
        let object = super::super::record::Object {
            uid,
            namespace: "ns",
            name,
            generation: 1,
            spec: &spec,
            created_at_ms: 0,
        };
        JobRow {
            id,
            ..JobRow::new(&object, 0)
        }
    }

    #[test]
    fn a_pipelines_pods_are_named_by_task_and_attempt_within_it() {
        let task = |name: &str| crate::api::TaskSpec {
            name: name.into(),
            template: Some(Default::default()),
            ..Default::default()
        };
        let mut row = row(77, "u", &"x".repeat(253));
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
    }

    #[test]
    fn pod_names_fit_and_are_unique() {
        let long = "a".repeat(253);
        let n = pod_name(&long, "u", 123456, 7);
        assert!(n.len() <= MAX_POD_NAME, "{n}");
        assert!(n.ends_with(&format!("-123456-7-{}", uid_tag("u"))), "{n}");
        assert_ne!(pod_name(&long, "u", 1, 1), pod_name(&long, "u", 1, 2));
        let dotted = format!("{}.b", "x".repeat(60));
        let n = pod_name(&dotted, "u", 5, 1);
        assert!(!n.contains('.') && n.len() <= MAX_POD_NAME, "{n}");
        assert_eq!(
            pod_name("hello", "2b3f9c1e-0000-4000-8000-000000000001", 1, 2),
            format!(
                "hello-1-2-{}",
                uid_tag("2b3f9c1e-0000-4000-8000-000000000001")
            )
        );
        let tag = uid_tag("u");
        assert_eq!(
            pod_name(&format!("{}-", "y".repeat(48)), "u", 1, 1),
            format!("{}-1-1-{tag}", "y".repeat(48))
        );
    }

    /// Issue 21, class 6: two jobs whose names share their first 59 characters and whose ids
    /// and attempts are equal (two shards in one namespace) get two Pod names, each still at
    /// most 63 characters and readable (name, id, attempt, tag); the tag is stable.
    #[test]
    fn two_jobs_never_want_one_pod_name() {
        let prefix = "p".repeat(59);
        let (a, b) = (format!("{prefix}-alpha"), format!("{prefix}-beta"));
        let (ua, ub) = (
            "6f1d2c3b-1111-4a5b-9c8d-0123456789ab",
            "6f1d2c3b-2222-4a5b-9c8d-0123456789ab",
        );
        let (na, nb) = (pod_name(&a, ua, 1, 1), pod_name(&b, ub, 1, 1));
        assert_ne!(na, nb);
        assert!(na.len() <= MAX_POD_NAME && nb.len() <= MAX_POD_NAME);
        assert!(na.starts_with("ppp") && na.contains("-1-1-"), "{na}");
        assert_eq!(uid_tag(ua), uid_tag(ua), "stable");
        assert_eq!(uid_tag(ua).len(), TAG_LEN);
        // Distinct uids give distinct tags (a sample of 10,000: no collision).
        let tags: std::collections::HashSet<String> = (0..10_000)
            .map(|i| uid_tag(&format!("00000000-0000-4000-8000-{i:012}")))
            .collect();
        assert_eq!(tags.len(), 10_000);
    }

    /// A Pod created before names carried a uid tag keeps its old name.
    #[test]
    fn a_legacy_name_has_no_tag() {
        assert_eq!(
            legacy_attempt_pod_name(&row(3, "uid-3", "job"), 1),
            "job-3-1"
        );
    }

    #[test]
    fn pod_states_round_trip() {
        for s in PodState::ALL {
            assert_eq!(PodState::parse(s.as_str()), Some(s));
        }
    }
}
