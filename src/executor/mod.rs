//! Executors: how a job's workload runs. `local` (a process group on the controller node) is
//! here; `pod` (a Pod per attempt) is driven by the operator's shared Pod watch.

pub mod local;
pub mod pod;

/// How an attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every part exited 0.
    Succeeded,
    /// The setup script (or an init container) failed.
    SetupFailed {
        /// Exit code.
        code: i32,
        /// CamelCase reason.
        reason: String,
    },
    /// The workload itself failed (counts against maxRestartsOnErrors).
    Failed {
        /// Exit code (128 + signal for a signal).
        code: i32,
        /// CamelCase reason, e.g. `ExitCode`, `OOMKilled`.
        reason: String,
    },
    /// The workload was taken away (preemption, eviction, node loss): a recovery, bounded by
    /// maxRecoveries.
    Lost {
        /// Sentence saying what happened.
        reason: String,
    },
}
