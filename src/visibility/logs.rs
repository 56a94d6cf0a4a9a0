//! What is shown of a job's logs ([`pod_logs`]): for a pod job, the logs its job controllers
//! kept of each attempt (`executor::pod::logs`, the state dir's `logs/ID.kept/`), or the
//! command that reads a Pod still there, and why anything is missing. Pure: `managed-jobs logs`
//! and the visibility API's `.../log` path both print what it chooses.

use std::io::{Read as _, Seek as _};

use serde_json::{Value, json};

use crate::lifecycle::JobRow;
use crate::state_dir::StateDir;
use crate::store::Store;

/// The most of one log the visibility API sends, bytes (its last part): a pod attempt's kept log
/// is bounded by `--kept-log-bytes` already; a local job's log holds every attempt's output.
pub const MAX_BYTES: u64 = 16 * 1024 * 1024;

/// What a caller asked for of a job's logs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// A pod job's attempt (from 1); None: the latest of each task.
    pub attempt: Option<i32>,
    /// A pipeline's task, by name or index from 0.
    pub task: Option<String>,
    /// A multi-node job's rank.
    pub rank: Option<u32>,
    /// One container only.
    pub container: Option<String>,
    /// At most the last this many bytes of each log (at most [`MAX_BYTES`], its default).
    pub limit_bytes: Option<u64>,
    /// The job controller process's log instead of the workload's (`managed-jobs logs
    /// --controller`): every job controller of the job, in order, as the state dir keeps it.
    pub controller: bool,
}

/// Why there is no log to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// Nothing to show (the sentence says why, and where the output is when a Pod still runs).
    NotFound(String),
    /// The request does not fit the job (a task it lacks, an attempt of a local job).
    BadRequest(String),
}

/// The index of `row`'s task `which` (a name, or an index from 0).
pub fn task_index(row: &JobRow, which: &str) -> Result<usize, String> {
    if let Some(i) = row.spec.tasks.iter().position(|t| t.name == which) {
        return Ok(i);
    }
    match which.parse::<usize>() {
        Ok(i) if i < row.spec.tasks.len() => Ok(i),
        _ if row.spec.tasks.is_empty() => Err(format!(
            "job {} is not a pipeline (it has no spec.tasks)",
            row.key()
        )),
        _ => {
            let names: Vec<&str> = row.spec.tasks.iter().map(|t| t.name.as_str()).collect();
            Err(format!(
                "job {} has no task {which:?} (its tasks: {})",
                row.key(),
                names.join(", ")
            ))
        }
    }
}

/// The last `limit` bytes of the file at `path` (None when it does not exist), and whether
/// that is less than all of it.
fn tail(path: &std::path::Path, limit: u64) -> std::io::Result<Option<(Vec<u8>, bool)>> {
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let start = len.saturating_sub(limit);
    file.seek(std::io::SeekFrom::Start(start))?;
    let mut out = Vec::with_capacity((len - start) as usize);
    file.take(limit).read_to_end(&mut out)?;
    Ok(Some((out, start > 0)))
}

/// The text of `row`'s logs that `filter` selects, as `managed-jobs logs` prints them (each
/// under a `==> ... <==` header when more than one): for a pod job the logs kept of the chosen
/// attempt ([`pod_logs`]), for a local job its output file(s). Errors: the store or a file
/// could not be read.
pub fn read(
    store: &Store,
    dir: &StateDir,
    row: &JobRow,
    filter: &Filter,
) -> anyhow::Result<Result<String, Missing>> {
    let limit = filter.limit_bytes.unwrap_or(MAX_BYTES).clamp(1, MAX_BYTES);
    if filter.controller {
        if filter.attempt.is_some()
            || filter.task.is_some()
            || filter.rank.is_some()
            || filter.container.is_some()
        {
            return Ok(Err(Missing::BadRequest(format!(
                "job {}: the job controller's log is one for the whole job (attempt, task, rank and container are the workload's)",
                row.key()
            ))));
        }
        return Ok(match tail(&dir.controller_log(row.id), limit)? {
            Some((bytes, _)) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            None => Err(Missing::NotFound(format!(
                "job {} has no job controller log yet (none was started)",
                row.key()
            ))),
        });
    }
    let task = match &filter.task {
        None => None,
        Some(t) => match task_index(row, t) {
            Ok(i) => Some(i),
            Err(why) => return Ok(Err(Missing::BadRequest(why))),
        },
    };
    let mut parts: Vec<(String, Vec<u8>)> = Vec::new();
    if row.executor.facts().api_objects {
        let last = row.attempt.max(row.launched_attempt);
        let mut seen = Vec::new();
        for attempt in 1..=last {
            seen.extend(store.pod_members(row.id, attempt)?);
        }
        let kept = crate::executor::pod::logs::kept_logs(dir, row, &Default::default());
        let kept_bytes = store.settings()?.kept_log_bytes;
        let chosen = pod_logs(
            row,
            &kept,
            &seen,
            task,
            filter.rank,
            filter.attempt,
            kept_bytes,
        );
        let pieces = match chosen {
            Ok(p) => p,
            Err(why) => return Ok(Err(Missing::NotFound(why))),
        };
        let mut elsewhere = Vec::new();
        for piece in pieces {
            match piece {
                PodLogPiece::Kept { header, log } => {
                    if filter
                        .container
                        .as_ref()
                        .is_some_and(|c| *c != log.key.container)
                    {
                        continue;
                    }
                    if let Some((bytes, _)) = tail(&log.path, limit)? {
                        parts.push((header, bytes));
                    }
                }
                PodLogPiece::Command(c) => elsewhere.push(format!("its Pod is there: {c}")),
                PodLogPiece::Note(n) => elsewhere.push(n),
            }
        }
        if parts.is_empty() {
            let what = match &filter.container {
                Some(c) => format!("container {c} of job {}", row.key()),
                None => format!("job {}", row.key()),
            };
            let mut why = format!("nothing is kept of {what} for what was asked");
            if !elsewhere.is_empty() {
                why.push_str(&format!("; {}", elsewhere.join("; ")));
            }
            return Ok(Err(Missing::NotFound(why)));
        }
    } else {
        if filter.attempt.is_some() || filter.rank.is_some() || filter.container.is_some() {
            return Ok(Err(Missing::BadRequest(format!(
                "job {} is a local job: its log holds every attempt's output, in order (attempt, rank and container are for pod jobs)",
                row.key()
            ))));
        }
        let files: Vec<(String, std::path::PathBuf)> = if row.spec.is_pipeline() {
            let count = row.spec.tasks.len();
            row.spec
                .tasks
                .iter()
                .enumerate()
                .filter(|(i, _)| task.is_none_or(|t| t == *i))
                .map(|(i, t)| {
                    (
                        format!("task {}/{count} {}", i + 1, t.name),
                        dir.task_log(row.id, i),
                    )
                })
                .collect()
        } else {
            vec![(format!("job {}", row.key()), dir.workload_log(row.id))]
        };
        for (header, path) in files {
            if let Some((bytes, cut)) = tail(&path, limit)? {
                let header = if cut {
                    format!("{header} (its last {} bytes)", bytes.len())
                } else {
                    header
                };
                parts.push((header, bytes));
            }
        }
        if parts.is_empty() {
            return Ok(Err(Missing::NotFound(format!(
                "job {} has no output yet (it has not run)",
                row.key()
            ))));
        }
    }
    let many = parts.len() > 1;
    let mut text = Vec::new();
    for (header, bytes) in parts {
        if many {
            text.extend_from_slice(format!("==> {header} <==\n").as_bytes());
        }
        let ends_line = bytes.is_empty() || bytes.ends_with(b"\n");
        text.extend_from_slice(&bytes);
        if many && !ends_line {
            text.push(b'\n');
        }
    }
    Ok(Ok(String::from_utf8_lossy(&text).into_owned()))
}

/// What logs a job's detail lists (JSON): a pod job's kept logs (task, its name, attempt, rank,
/// container, bytes, whether only the end was kept), or a local job's output files (task and
/// bytes).
pub fn listed(dir: &StateDir, row: &JobRow) -> Vec<Value> {
    let task_name = |i: usize| row.spec.tasks.get(i).map(|t| t.name.clone());
    if row.executor.facts().api_objects {
        return crate::executor::pod::logs::kept_logs(dir, row, &Default::default())
            .into_iter()
            .map(|l| {
                json!({
                    "task": row.spec.is_pipeline().then_some(l.key.task),
                    "taskName": task_name(l.key.task),
                    "attempt": l.key.attempt,
                    "rank": row.spec.task(l.key.task).nodes.map(|_| l.key.rank),
                    "container": l.key.container,
                    "bytes": l.bytes,
                    "truncated": l.truncated,
                })
            })
            .collect();
    }
    let files: Vec<(Option<usize>, std::path::PathBuf)> = if row.spec.is_pipeline() {
        (0..row.spec.tasks.len())
            .map(|i| (Some(i), dir.task_log(row.id, i)))
            .collect()
    } else {
        vec![(None, dir.workload_log(row.id))]
    };
    files
        .into_iter()
        .filter_map(|(task, path)| {
            let bytes = std::fs::metadata(&path).ok()?.len();
            Some(json!({
                "task": task,
                "taskName": task.and_then(task_name),
                "bytes": bytes,
                "truncated": bytes > MAX_BYTES,
            }))
        })
        .collect()
}

/// The Pods of `row`'s current attempt that the operator's watch saw and not deleted (rank,
/// name, state), as JSON: where a caller reads a running attempt's output itself.
pub fn live_pods(store: &Store, row: &JobRow) -> anyhow::Result<Vec<Value>> {
    if !row.executor.facts().api_objects {
        return Ok(Vec::new());
    }
    let attempt = row.current_attempt();
    Ok(store
        .pod_members(row.id, attempt)?
        .into_iter()
        .filter(|o| !o.deleted)
        .map(|o| {
            json!({
                "rank": o.rank,
                "name": o.pod_name,
                "attempt": o.attempt,
                "state": format!("{:?}", o.state),
            })
        })
        .collect())
}

/// One thing `managed-jobs logs` shows of a pod job ([`pod_logs`]), in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodLogPiece {
    /// A kept log, under `header` when more than one log or command is shown.
    Kept {
        /// E.g. `task train, attempt 2, rank 1, container main (its last 4096 bytes)`.
        header: String,
        /// The file.
        log: crate::state_dir::KeptLog,
    },
    /// A `kubectl logs` command for a Pod that is still there and of which nothing is kept
    /// (stdout).
    Command(String),
    /// What is not shown and why, or where more is (stderr).
    Note(String),
}

/// The task of pod job `row` the Pod `o` ran: 0 without tasks; for a pipeline, the task whose
/// deterministic Pod names include its name, else the current task when the attempt is one of
/// it; None when unknown.
fn task_of(row: &JobRow, o: &crate::store::pods::PodObservation) -> Option<usize> {
    use crate::executor::pod;
    if !row.spec.is_pipeline() {
        return Some(0);
    }
    for (i, t) in row.tasks.iter().enumerate() {
        let size = row.spec.task(i).size() as u32;
        for k in 1..=t.attempt.max(0) + 1 {
            if (0..size).any(|r| pod::task_member_pod_name(row, i, k, r) == o.pod_name) {
                return Some(i);
            }
        }
    }
    (o.attempt >= row.task_first_attempt).then_some(row.task_index.max(0) as usize)
}

/// What `managed-jobs logs` shows of pod job `row` ([`PodLogPiece`]s), given every log kept of
/// it (`kept`, in [`crate::executor::pod::logs::kept_logs`]'s order) and every Pod of its
/// attempts the operator's Pod watch saw (`seen`); for `task` (None: each task of a pipeline),
/// `rank` (None: every rank) and `attempt` (None: the latest of each task):
///
/// - the attempt's kept logs, every rank and container (init containers first);
/// - for a member of which nothing is kept, a `kubectl logs` command while its Pod is there
///   (the attempt still runs, or its log could not be kept), else a note that it is gone;
/// - with the latest attempt shown as a command (it runs), a note naming the latest attempt
///   whose log is kept.
///
/// An error, one sentence naming why, when nothing can be shown: never a command that would
/// fail. `kept_bytes` is the operator's `--kept-log-bytes` (0: it keeps none).
pub fn pod_logs(
    row: &JobRow,
    kept: &[crate::state_dir::KeptLog],
    seen: &[crate::store::pods::PodObservation],
    task: Option<usize>,
    rank: Option<u32>,
    attempt: Option<i32>,
    kept_bytes: u64,
) -> Result<Vec<PodLogPiece>, String> {
    let job = row.key();
    let last = row.attempt.max(row.launched_attempt);
    if row.launched_attempt == 0 && kept.is_empty() && seen.is_empty() {
        return Err(format!("job {job} has not launched a Pod yet"));
    }
    if let Some(a) = attempt
        && !(1..=last).contains(&a)
    {
        return Err(format!(
            "job {job} has no attempt {a} (its attempts so far: 1 to {last})"
        ));
    }
    let pipeline = row.spec.is_pipeline();
    let tasks: Vec<usize> = match task {
        Some(i) => vec![i],
        None => (0..row.spec.tasks.len().max(1)).collect(),
    };
    let why_gone = if kept_bytes == 0 {
        "the operator keeps no logs (it runs with --kept-log-bytes 0)"
    } else {
        "it was deleted before its job controller kept its log, or none of its containers ran"
    };
    let in_rank = |r: u32| rank.is_none_or(|x| x == r);
    let mut pieces = Vec::new();
    let mut missing = Vec::new();
    for i in tasks {
        let view = row.spec.task(i);
        let gang = view.nodes.is_some();
        let label = view.name.map(|n| format!("task {n}"));
        let kept_i: Vec<_> = kept
            .iter()
            .filter(|l| l.key.task == i && in_rank(l.key.rank))
            .collect();
        let seen_i: Vec<_> = seen
            .iter()
            .filter(|o| task_of(row, o) == Some(i) && in_rank(o.rank))
            .collect();
        let known = |a: i32| {
            kept_i.iter().any(|l| l.key.attempt == a) || seen_i.iter().any(|o| o.attempt == a)
        };
        let latest = kept_i
            .iter()
            .map(|l| l.key.attempt)
            .chain(seen_i.iter().map(|o| o.attempt))
            .max();
        let what = |a: i32, r: Option<u32>| {
            let mut parts: Vec<String> = label.iter().cloned().collect();
            parts.push(format!("attempt {a}"));
            if let Some(r) = r.filter(|_| gang) {
                parts.push(format!("rank {r}"));
            }
            parts.join(", ")
        };
        let chosen = match (attempt, latest) {
            // Another task's attempt (a pipeline asked for one attempt, without --task).
            (Some(a), _) if pipeline && task.is_none() && !known(a) => continue,
            (Some(a), _) => a,
            (None, Some(a)) => a,
            (None, None) => {
                let launched = if pipeline {
                    row.tasks.get(i).is_some_and(|t| t.attempt > 0)
                } else {
                    row.launched_attempt > 0
                };
                missing.push(match (&label, launched) {
                    (Some(l), false) => format!("{l} has not launched a Pod yet"),
                    (None, false) => format!("job {job} has not launched a Pod yet"),
                    (_, true) => format!(
                        "{}: nothing kept and no Pod seen",
                        label.clone().unwrap_or_else(|| format!("job {job}"))
                    ),
                });
                continue;
            }
        };
        let logs: Vec<_> = kept_i.iter().filter(|l| l.key.attempt == chosen).collect();
        for log in &logs {
            let mut header = what(chosen, Some(log.key.rank));
            header.push_str(&format!(", container {}", log.key.container));
            if log.truncated {
                header.push_str(&format!(" (its last {} bytes)", log.bytes));
            }
            pieces.push(PodLogPiece::Kept {
                header,
                log: (**log).clone(),
            });
        }
        let pods: Vec<_> = seen_i.iter().filter(|o| o.attempt == chosen).collect();
        let mut commands = 0;
        for o in &pods {
            if logs.iter().any(|l| l.key.rank == o.rank) {
                continue;
            }
            if o.deleted {
                missing.push(format!(
                    "{}: nothing kept, and its Pod {} is gone: {why_gone}",
                    what(chosen, Some(o.rank)),
                    o.pod_name
                ));
                continue;
            }
            let mut notes: Vec<String> = label.iter().cloned().collect();
            if gang {
                notes.push(format!("rank {}", o.rank));
            }
            let comment = if notes.is_empty() {
                String::new()
            } else {
                format!("  # {}", notes.join(", "))
            };
            pieces.push(PodLogPiece::Command(format!(
                "kubectl logs -n {} {}{comment}",
                row.namespace, o.pod_name
            )));
            commands += 1;
        }
        if logs.is_empty() && pods.is_empty() {
            missing.push(format!(
                "{}: nothing kept and no Pod seen",
                what(chosen, rank)
            ));
        }
        if attempt.is_none()
            && commands > 0
            && let Some(ended) = kept_i
                .iter()
                .map(|l| l.key.attempt)
                .filter(|&a| a < chosen)
                .max()
        {
            pieces.push(PodLogPiece::Note(format!(
                "{} still runs; the log kept of {}: managed-jobs logs {job} --attempt {ended}",
                what(chosen, None),
                what(ended, None)
            )));
        }
    }
    if pieces.iter().all(|p| matches!(p, PodLogPiece::Note(_))) {
        if missing.is_empty() {
            // A pipeline asked for an attempt that no task knows.
            missing.push(format!(
                "attempt {}: nothing kept and no Pod seen",
                attempt.unwrap_or(last)
            ));
        }
        return Err(format!("job {job}: no log to show: {}", missing.join("; ")));
    }
    pieces.extend(missing.into_iter().map(PodLogPiece::Note));
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ExecutorKind;
    use crate::state_dir::{KeptLog, KeptLogKey};
    use crate::store::Store;
    use crate::store::pods::{PodObservation, PodState};
    use std::path::PathBuf;

    fn pod_job(nodes: Option<i32>) -> JobRow {
        let mut store = Store::in_memory().unwrap();
        let mut spec: crate::api::ManagedJobSpec = serde_json::from_value(serde_json::json!({
            "template": {"spec": {
                "initContainers": [{"name": "prepare", "image": "b"}],
                "containers": [{"name": "main", "image": "b"}]
            }}
        }))
        .unwrap();
        spec.nodes = nodes;
        let mut row = store.upsert("u", "ns", "job", 1, &spec).unwrap().row;
        row.executor = ExecutorKind::Pod;
        row
    }

    fn kept(attempt: i32, rank: u32, container: &str, truncated: bool) -> KeptLog {
        KeptLog {
            key: KeptLogKey {
                task: 0,
                attempt,
                rank,
                container: container.into(),
            },
            path: PathBuf::from(format!("/s/T0-A{attempt}-R{rank}-{container}.log")),
            bytes: 4096,
            truncated,
        }
    }

    fn seen(attempt: i32, rank: u32, state: PodState, deleted: bool) -> PodObservation {
        PodObservation {
            job_id: 1,
            attempt,
            rank,
            pod_name: format!("job-1-{attempt}-{rank}"),
            state,
            exit_code: None,
            reason: String::new(),
            message: String::new(),
            deleted,
            node: "n".into(),
            terminating_since_ms: None,
            grace_seconds: None,
            evidence: Default::default(),
            ended_at_ms: None,
        }
    }

    fn kept_of(pieces: &[PodLogPiece]) -> Vec<(i32, u32, String)> {
        pieces
            .iter()
            .filter_map(|p| match p {
                PodLogPiece::Kept { log, .. } => {
                    Some((log.key.attempt, log.key.rank, log.key.container.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// Issue 33: after a pod job's Pods are gone, `managed-jobs logs` shows the latest
    /// attempt's kept log (or the one asked for), never a command that would fail; with nothing
    /// kept and no Pod left it fails naming why.
    #[test]
    fn a_pod_jobs_logs_come_from_what_was_kept_once_its_pods_are_gone() {
        let mut row = pod_job(None);
        row.attempt = 2;
        row.launched_attempt = 2;
        let kept = [
            kept(1, 0, "prepare", false),
            kept(1, 0, "main", true),
            kept(2, 0, "main", true),
        ];
        let gone = [
            seen(1, 0, PodState::Failed, true),
            seen(2, 0, PodState::Failed, true),
        ];
        let latest = pod_logs(&row, &kept, &gone, None, None, None, 4096).unwrap();
        assert_eq!(kept_of(&latest), [(2, 0, "main".to_string())]);
        assert_eq!(latest.len(), 1, "{latest:?}");
        let first = pod_logs(&row, &kept, &gone, None, None, Some(1), 4096).unwrap();
        assert_eq!(
            kept_of(&first),
            [(1, 0, "prepare".to_string()), (1, 0, "main".to_string())]
        );
        let PodLogPiece::Kept { header, .. } = &first[1] else {
            panic!("{first:?}")
        };
        assert_eq!(header, "attempt 1, container main (its last 4096 bytes)");
        // Nothing kept of attempt 2 and its Pod gone: an error naming why, no command.
        let err = pod_logs(&row, &kept[..2], &gone, None, None, None, 4096).unwrap_err();
        assert!(
            err.contains("attempt 2: nothing kept, and its Pod job-1-2-0 is gone")
                && err.contains("deleted before its job controller kept its log"),
            "{err}"
        );
        let err = pod_logs(&row, &[], &gone, None, None, None, 0).unwrap_err();
        assert!(err.contains("--kept-log-bytes 0"), "{err}");
        // Its Pod still there (nothing could be kept): the command works, so it is given.
        let there = [seen(2, 0, PodState::Failed, false)];
        let pieces = pod_logs(&row, &[], &there, None, None, None, 4096).unwrap();
        assert_eq!(
            pieces,
            [PodLogPiece::Command("kubectl logs -n ns job-1-2-0".into())]
        );
        let err = pod_logs(&row, &kept, &gone, None, None, Some(3), 4096).unwrap_err();
        assert!(
            err.contains("has no attempt 3 (its attempts so far: 1 to 2)"),
            "{err}"
        );
        let mut new = pod_job(None);
        new.attempt = 1;
        let err = pod_logs(&new, &[], &[], None, None, None, 4096).unwrap_err();
        assert_eq!(err, "job ns/job has not launched a Pod yet");
    }

    /// A running attempt is shown as its command, with a note naming the latest kept one.
    #[test]
    fn a_running_attempt_is_a_command_and_the_last_ended_one_is_named() {
        let mut row = pod_job(None);
        row.attempt = 3;
        row.launched_attempt = 3;
        let kept = [kept(2, 0, "main", false)];
        let pods = [
            seen(2, 0, PodState::Failed, true),
            seen(3, 0, PodState::Running, false),
        ];
        let pieces = pod_logs(&row, &kept, &pods, None, None, None, 4096).unwrap();
        assert_eq!(
            pieces,
            [
                PodLogPiece::Command("kubectl logs -n ns job-1-3-0".into()),
                PodLogPiece::Note(
                    "attempt 3 still runs; the log kept of attempt 2: managed-jobs logs ns/job --attempt 2"
                        .into()
                ),
            ]
        );
    }

    /// A multi-node job: every rank's kept log, or the one asked for.
    #[test]
    fn a_multi_node_jobs_ranks_each_have_their_log() {
        let mut row = pod_job(Some(2));
        row.attempt = 1;
        row.launched_attempt = 1;
        let kept = [kept(1, 0, "main", false), kept(1, 1, "main", false)];
        let pods = [
            seen(1, 0, PodState::Succeeded, true),
            seen(1, 1, PodState::Succeeded, true),
        ];
        let all = pod_logs(&row, &kept, &pods, None, None, None, 4096).unwrap();
        assert_eq!(
            kept_of(&all),
            [(1, 0, "main".to_string()), (1, 1, "main".to_string())]
        );
        let PodLogPiece::Kept { header, .. } = &all[1] else {
            panic!("{all:?}")
        };
        assert_eq!(header, "attempt 1, rank 1, container main");
        let one = pod_logs(&row, &kept, &pods, None, Some(1), None, 4096).unwrap();
        assert_eq!(kept_of(&one), [(1, 1, "main".to_string())]);
        // Rank 1 kept nothing and is gone: rank 0's log, and a note for rank 1.
        let some = pod_logs(&row, &kept[..1], &pods, None, None, None, 4096).unwrap();
        assert_eq!(kept_of(&some), [(1, 0, "main".to_string())]);
        assert!(
            matches!(&some[1], PodLogPiece::Note(n) if n.starts_with("attempt 1, rank 1: nothing kept")),
            "{some:?}"
        );
    }
}
