//! What the executors report, as the decisions read it: an attempt's [`Workload`], how it ended
//! ([`Outcome`], with the [`Evidence`] a failure rule reads) and a launch refused for good
//! ([`Refused`]). What is observed of an attempt's members is [`super::members`]'s.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::reason::FailureReason;

/// An attempt's workload, as `status.workload` names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    /// A local attempt: the pid of its wrapper shell (also its process group). `pid/<pid>`.
    Process(i32),
    /// A pod attempt: its Pod's name. `pod/<name>`.
    Pod(String),
}

impl Workload {
    /// Parses `pid/<pid>` or `pod/<name>`.
    pub fn parse(s: &str) -> Option<Workload> {
        if let Some(pid) = s.strip_prefix("pid/") {
            return pid.parse().ok().map(Workload::Process);
        }
        s.strip_prefix("pod/")
            .filter(|name| !name.is_empty())
            .map(|name| Workload::Pod(name.to_string()))
    }

    /// The Pod's name, for a pod attempt.
    pub fn pod_name(&self) -> Option<&str> {
        match self {
            Workload::Pod(name) => Some(name),
            Workload::Process(_) => None,
        }
    }

    /// The process (group) id, for a local attempt.
    pub fn pid(&self) -> Option<i32> {
        match self {
            Workload::Process(pid) => Some(*pid),
            Workload::Pod(_) => None,
        }
    }

    /// How messages name it: "Pod x-1-1", "process 42".
    pub fn noun(&self) -> String {
        match self {
            Workload::Process(pid) => format!("process {pid}"),
            Workload::Pod(name) => format!("Pod {name}"),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Workload::Process(pid) => write!(f, "pid/{pid}"),
            Workload::Pod(name) => write!(f, "pod/{name}"),
        }
    }
}

/// One part of an attempt that terminated: a container or init container of its Pod, or the
/// local executor's `setup` or `run` script.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartExit {
    /// The container's name; `setup` or `run` for a local attempt.
    pub name: String,
    /// An init container (or the local `setup` script).
    #[serde(default)]
    pub init: bool,
    /// Its exit code (128 + N for a process killed by signal N).
    pub code: i32,
    /// Its CamelCase termination reason (`Completed`, `Error`, `OOMKilled`; locally `ExitCode`,
    /// `SetupFailed` or `KilledBySignal<N>`).
    #[serde(default)]
    pub reason: String,
}

/// What an ended attempt showed, as failure rules read it (`lifecycle::rules`): every part
/// that terminated, the Pod's conditions that held, and the reasons given for its end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// Every part that terminated, init containers (or `setup`) first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exits: Vec<PartExit>,
    /// The Pod's conditions as (type, status), e.g. (`DisruptionTarget`, `True`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<(String, String)>,
    /// CamelCase reasons given for the end besides the parts' own: the Pod's `status.reason`
    /// (`OutOfcpu`, `Evicted`), a True condition's reason (`EvictionByEvictionAPI`), the
    /// operator's (`PodDeleted`, `ProcessLost`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// The rank of the member of a multi-node attempt that decided its end (None for a job of
    /// one member).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

impl Evidence {
    /// The evidence of one part that exited `code` with `reason`.
    pub fn exit(name: &str, init: bool, code: i32, reason: &str) -> Evidence {
        Evidence {
            exits: vec![PartExit {
                name: name.into(),
                init,
                code,
                reason: reason.into(),
            }],
            ..Default::default()
        }
    }

    /// The evidence of an end that only `reason` explains (no part exited).
    pub fn reason(reason: &str) -> Evidence {
        Evidence {
            reasons: vec![reason.into()],
            ..Default::default()
        }
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.exits.is_empty() && self.conditions.is_empty() && self.reasons.is_empty()
    }
}

/// The kubelet's reason for a Pod it ended because it ran past its `spec.activeDeadlineSeconds`
/// (its `status.reason`), and the reason of [`Outcome::DeadlineExceeded`].
pub const POD_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every part exited 0.
    Succeeded,
    /// The setup script (or an init container) failed.
    SetupFailed {
        /// Exit code.
        code: i32,
        /// The workload's CamelCase reason.
        reason: String,
        /// Which part failed, when the executor knows (e.g. "init container fetch exited with
        /// code 2").
        detail: Option<String>,
        /// What failure rules read.
        evidence: Evidence,
    },
    /// The workload itself failed (counts against maxRestartsOnErrors).
    Failed {
        /// Exit code (128 + signal for a signal).
        code: i32,
        /// The workload's CamelCase reason, e.g. `ExitCode`, `OOMKilled`.
        reason: String,
        /// Which part failed, when the executor knows (e.g. "container sidecar was OOM-killed
        /// (exit code 0)").
        detail: Option<String>,
        /// What failure rules read.
        evidence: Evidence,
    },
    /// The workload ran past its own time limit and was stopped for it: a Pod's
    /// `spec.activeDeadlineSeconds` (the kubelet ends it Failed, reason `DeadlineExceeded`,
    /// with or without its containers' exits). A workload error, like [`Outcome::Failed`]: it
    /// uses maxRestartsOnErrors and backs off (batch/v1 counts such a Pod failed); its reason is
    /// `DeadlineExceeded` and its message names the deadline.
    DeadlineExceeded {
        /// Exit code of a container stopped for it (137 after SIGKILL), when one is known.
        code: Option<i32>,
        /// What happened: the deadline, the kubelet's message, the container stopped.
        message: String,
        /// What failure rules read.
        evidence: Evidence,
    },
    /// The node refused to run the workload (a Pod ended Failed before any container ran:
    /// `OutOfcpu`, `UnexpectedAdmissionError`, `SysctlForbidden`...). A workload error, like
    /// [`Outcome::Failed`]: it uses maxRestartsOnErrors and backs off; never a tight relaunch loop.
    Refused {
        /// The node's CamelCase reason.
        reason: String,
        /// The node's message.
        message: String,
        /// What failure rules read.
        evidence: Evidence,
    },
    /// The workload can never start as specified (an invalid image name, a container config
    /// that references what does not exist): retrying cannot help, the job fails its precheck
    /// and the workload is removed. Failure rules do not apply.
    Invalid {
        /// The kubelet's CamelCase reason, e.g. `InvalidImageName`.
        reason: String,
        /// What is wrong, naming the container.
        message: String,
    },
    /// The workload was taken away (preemption, eviction, node loss): a recovery, bounded by
    /// maxRecoveries.
    Lost {
        /// Sentence saying what happened.
        reason: String,
        /// What failure rules read (its `reasons` start with the CamelCase cause, e.g.
        /// `EvictionByEvictionAPI`, `PodDeleted`).
        evidence: Evidence,
    },
}

impl Outcome {
    /// A lost workload that only `sentence` explains, its CamelCase cause `cause`.
    pub fn lost(sentence: impl Into<String>, cause: &str) -> Outcome {
        Outcome::Lost {
            reason: sentence.into(),
            evidence: Evidence::reason(cause),
        }
    }

    /// What failure rules read of it (nothing for a success or a workload that cannot start).
    pub fn evidence(&self) -> Option<&Evidence> {
        match self {
            Outcome::Succeeded | Outcome::Invalid { .. } => None,
            Outcome::SetupFailed { evidence, .. }
            | Outcome::Failed { evidence, .. }
            | Outcome::DeadlineExceeded { evidence, .. }
            | Outcome::Refused { evidence, .. }
            | Outcome::Lost { evidence, .. } => Some(evidence),
        }
    }

    /// The CamelCase reason of the outcome, as an attempt's record shows it: `Succeeded`, the
    /// workload's reason, or a lost workload's cause (`WorkloadLost` when nothing says).
    pub fn reason(&self) -> &str {
        match self {
            Outcome::Succeeded => "Succeeded",
            Outcome::DeadlineExceeded { .. } => POD_DEADLINE_EXCEEDED,
            Outcome::SetupFailed { reason, .. }
            | Outcome::Failed { reason, .. }
            | Outcome::Refused { reason, .. }
            | Outcome::Invalid { reason, .. } => reason,
            Outcome::Lost { evidence, .. } => evidence
                .reasons
                .first()
                .map(String::as_str)
                .unwrap_or("WorkloadLost"),
        }
    }

    /// The same outcome as decided by member `rank` of a multi-node attempt (`noun`: how
    /// messages name that member): its detail and a lost member's sentence name the member, its
    /// evidence records the rank.
    pub fn of_rank(mut self, rank: u32, noun: &str) -> Outcome {
        match &mut self {
            Outcome::Succeeded => {}
            Outcome::SetupFailed {
                code,
                detail,
                evidence,
                ..
            }
            | Outcome::Failed {
                code,
                detail,
                evidence,
                ..
            } => {
                *detail = Some(match detail.take() {
                    Some(d) => format!("{noun}: {d}"),
                    None => format!("{noun} exited with code {code}"),
                });
                evidence.rank = Some(rank);
            }
            Outcome::Refused {
                message, evidence, ..
            } => {
                *message = format!("{noun}: {message}");
                evidence.rank = Some(rank);
            }
            Outcome::DeadlineExceeded {
                message, evidence, ..
            } => {
                *message = format!("{noun}: {message}");
                evidence.rank = Some(rank);
            }
            Outcome::Invalid { message, .. } => *message = format!("{noun}: {message}"),
            // A lost member's sentence names its workload already.
            Outcome::Lost { reason, evidence } => {
                *reason = format!("rank {rank}: {reason}");
                evidence.rank = Some(rank);
            }
        }
        self
    }

    /// The exit code of the part that decided it, when one exited.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            Outcome::Succeeded => Some(0),
            Outcome::SetupFailed { code, .. } | Outcome::Failed { code, .. } => Some(*code),
            Outcome::DeadlineExceeded { code, .. } => *code,
            _ => None,
        }
    }
}

/// The executor refused to start an attempt, for good (retrying cannot help).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    /// `status.failureReason`.
    pub reason: FailureReason,
    /// What was refused and why, for `status.message`.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_read_as_the_status_shows_them() {
        for w in [
            Workload::Process(42),
            Workload::Pod("train-7-1-x7b2kq".into()),
        ] {
            assert_eq!(Workload::parse(&w.to_string()), Some(w));
        }
        assert_eq!(Workload::Process(42).to_string(), "pid/42");
        assert_eq!(Workload::parse("pod/"), None);
        assert_eq!(Workload::parse("vm/1"), None);
    }
}
