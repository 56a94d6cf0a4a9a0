//! A job's deadlines: when it runs past `activeDeadlineSeconds` (the job's and its current
//! task's, [`deadlines`]) and when its current attempt's launch times out
//! ([`launch_deadline_ms`]), and how long a stopped workload has to save its work
//! ([`stop_grace`]). One place computes them, for the decisions and their messages.

use std::time::Duration;

use super::clock::earliest;
use super::record::JobRow;
use super::tasks::current_task;

/// Kubernetes' default `terminationGracePeriodSeconds` (a Pod that does not set its own).
pub const POD_DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// How long a stop gives the job's workload between SIGTERM and SIGKILL
/// (docs/design.md#cancellation): the job's `spec.terminationGracePeriodSeconds`; else, for a
/// Pod, its template's own `terminationGracePeriodSeconds` (Kubernetes' 30 s when unset), and
/// for a local workload `default` (the operator's `--cancel-grace-seconds`).
pub fn stop_grace(row: &JobRow, default: Duration) -> Duration {
    if let Some(secs) = row.spec.termination_grace_period_seconds {
        return Duration::from_secs(secs.max(0) as u64);
    }
    match current_task(row).template {
        Some(template) => template
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .map_or(POD_DEFAULT_GRACE, |secs| {
                Duration::from_secs(secs.max(0) as u64)
            }),
        None => default,
    }
}

/// A deadline: when (ms since epoch), and the `activeDeadlineSeconds` it comes from.
pub type Deadline = (i64, i64);

/// The job's deadline and its current task's (a pipeline's); each None before it started or
/// without one. The job's counts from when its workload first ran (`startedAt`; time in the
/// queue does not count, as a suspended batch/v1 Job's does not), the task's from when that
/// task first ran.
pub fn deadlines(row: &JobRow) -> (Option<Deadline>, Option<Deadline>) {
    let job = row
        .spec
        .active_deadline_seconds
        .and_then(|secs| Some((row.started_at_ms? + secs * 1000, secs)));
    let task = row
        .spec
        .is_pipeline()
        .then(|| current_task(row).active_deadline_seconds)
        .flatten()
        .and_then(|secs| Some((row.task_started_at_ms? + secs * 1000, secs)));
    (job, task)
}

/// When `row` runs past `spec.activeDeadlineSeconds` or past its current task's (ms since
/// epoch): whichever comes first ([`deadlines`]). None before it first ran or without a
/// deadline.
pub fn deadline_ms(row: &JobRow) -> Option<i64> {
    let (job, task) = deadlines(row);
    earliest(job.map(|d| d.0), task.map(|d| d.0))
}

/// How long `row`'s launched workload may take to start running: `spec.launchTimeoutSeconds`,
/// else `default` (`--launch-timeout-seconds`).
pub fn launch_timeout(row: &JobRow, default: Duration) -> Duration {
    match row.spec.launch_timeout_seconds {
        Some(s) if s > 0 => Duration::from_secs(s as u64),
        _ => default,
    }
}

/// The launch deadline of `row`'s current attempt (ms since epoch): its launch clock plus
/// [`launch_timeout`]. None while the clock is stopped (a Pod waiting for a node).
pub fn launch_deadline_ms(row: &JobRow, default: Duration) -> Option<i64> {
    Some(row.launched_at_ms? + launch_timeout(row, default).as_millis() as i64)
}

/// When a run slot held by `row`'s Pod waiting for a node is given back, if another job wants
/// it (ms since epoch): its wait's start plus [`launch_timeout`]. None while it does not wait.
pub fn node_wait_deadline_ms(row: &JobRow, default: Duration) -> Option<i64> {
    let timeout = launch_timeout(row, default);
    row.node_wait_since_ms
        .map(|since| since + timeout.as_millis() as i64)
}

#[cfg(test)]
mod grace_tests {
    use super::*;
    use crate::api::ManagedJobSpec;
    use crate::lifecycle::record::Object;

    fn row(spec: ManagedJobSpec) -> JobRow {
        JobRow::new(
            &Object {
                uid: "u",
                namespace: "ns",
                name: "j",
                generation: 1,
                spec: &spec,
                created_at_ms: 0,
                resource_version: "",
            },
            0,
        )
    }

    /// The job's own grace first; else a Pod's own (Kubernetes' 30 s when unset), a local
    /// workload the operator's.
    #[test]
    fn a_stop_gives_the_jobs_grace_else_the_pods_else_the_operators() {
        let five = Duration::from_secs(5);
        let local = ManagedJobSpec {
            run: Some("true".into()),
            ..Default::default()
        };
        assert_eq!(stop_grace(&row(local.clone()), five), five);
        let own = ManagedJobSpec {
            termination_grace_period_seconds: Some(45),
            ..local
        };
        assert_eq!(stop_grace(&row(own), five), Duration::from_secs(45));
        let pod: ManagedJobSpec = serde_json::from_value(serde_json::json!({
            "template": {"spec": {"containers": [{"name": "main"}]}}
        }))
        .unwrap();
        assert_eq!(stop_grace(&row(pod.clone()), five), POD_DEFAULT_GRACE);
        let mut pod_own = pod;
        pod_own
            .template
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .termination_grace_period_seconds = Some(12);
        assert_eq!(stop_grace(&row(pod_own), five), Duration::from_secs(12));
    }
}
