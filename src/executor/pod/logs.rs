//! Logs that outlive Pods (`docs/reference/what-survives-what.md`): the end of each container's
//! log of an attempt's Pods (every rank, init containers that ran too), kept in the state dir by
//! the job's controller when [`crate::lifecycle::keep_logs`] says so ([`keep`]), listed in the
//! template's order for the CLI and the visibility API ([`kept_logs`]).
//!
//! The Pod log API's `limitBytes` keeps the *start* of what is asked, so the transfer is bounded
//! with `tailLines`: a first ask of [`first_tail_lines`], then, while an answer has fewer bytes
//! than the bound but as many lines as were asked (there may be more before them), again with
//! more ([`next_tail_lines`]), [`MAX_ASKS`] asks at most. Each answer streams into a temporary
//! file that keeps only its last `bound` bytes ([`TailFile`]): the job controller, one process
//! per job, holds one chunk of it at a time. The file is renamed into place once complete, so
//! a reader sees the previous capture or this one, never half of one.
//!
//! Best effort: a Pod already gone is not kept, a failure or a timeout ([`CONTAINER_TIMEOUT`],
//! [`KEEP_TIMEOUT`]) is logged and keeps nothing of that container; the job's lifecycle never
//! waits longer than [`KEEP_TIMEOUT`] for it.

use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::AsyncBufReadExt as _;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, LogParams};

use crate::lifecycle::JobRow;
use crate::state_dir::{KeptLog, KeptLogFilter, KeptLogKey, StateDir};
use crate::store::Store;

/// Most asks of one container's log ([`next_tail_lines`]): with a first ask of about the bound
/// at 128 bytes a line and each next one at twice the bound at the bytes per line measured,
/// a fourth is needed only by logs whose lines vary in length by more than 4x between asks.
pub const MAX_ASKS: u32 = 4;
/// Longest time one container's log may take to be kept (all its asks).
pub const CONTAINER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time one keep of an attempt may take, all its Pods and containers: past it the
/// rest is not kept and the job goes on.
pub const KEEP_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes a line is guessed to take before any was measured (a first ask of `bound / 128`).
const GUESSED_LINE_BYTES: u64 = 128;
/// Bounds of the first ask, lines.
const FIRST_LINES: (i64, i64) = (100, 10_000);
/// Bytes moved at a time when a [`TailFile`] drops its start.
const CHUNK: usize = 64 * 1024;

/// What one answer of the log API held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// Bytes received.
    pub bytes: u64,
    /// Lines received (a last line without its newline counts).
    pub lines: u64,
}

/// Lines to ask for first, for a bound of `bound` bytes: `bound / 128`, within 100..10,000
/// (a modest ask: most logs are shorter than the bound and come whole at once).
pub fn first_tail_lines(bound: u64) -> i64 {
    ((bound / GUESSED_LINE_BYTES) as i64).clamp(FIRST_LINES.0, FIRST_LINES.1)
}

/// The most lines ever worth asking for: each line holds at least its newline, so `bound`
/// lines hold at least `bound` bytes when the log has them.
pub fn max_tail_lines(bound: u64) -> i64 {
    (bound as i64).max(1)
}

/// After `got` for an ask of `asked` lines under a bound of `bound` bytes: the lines to ask
/// for next, or None when this answer is the one to keep: it reached the bound, or it had
/// fewer lines than asked (the whole log came), or the most worth asking was asked. The next
/// ask is twice the lines the bound holds at the bytes per line measured, and at least twice
/// the last, at most [`max_tail_lines`].
pub fn next_tail_lines(asked: i64, got: Answer, bound: u64) -> Option<i64> {
    let max = max_tail_lines(bound);
    if got.bytes >= bound || (got.lines as i64) < asked || asked >= max {
        return None;
    }
    let per_line = (got.bytes / got.lines.max(1)).max(1);
    let wanted = bound.div_ceil(per_line).saturating_mul(2) as i64;
    Some(wanted.max(asked.saturating_mul(2)).min(max))
}

/// True when the kept answer `got` (of an ask of `asked` lines) is not the whole log: it had
/// more than `bound` bytes (its start was dropped), or as many lines as were asked (there may
/// have been more before them).
pub fn truncated(asked: i64, got: Answer, bound: u64) -> bool {
    got.bytes > bound || got.lines as i64 >= asked
}

/// A file that keeps the last `bound` bytes of what is written to it, whatever its length:
/// written at its end, its start dropped (the last `bound` bytes moved to the front in chunks)
/// whenever it grows past `bound` plus the larger of `bound` and 64 KiB. Memory: one chunk.
pub struct TailFile {
    file: std::fs::File,
    bound: u64,
    /// Bytes in the file now.
    len: u64,
    answer: Answer,
    last: Option<u8>,
}

impl TailFile {
    /// Creates (or empties) the file at `path`.
    pub fn create(path: &Path, bound: u64) -> io::Result<TailFile> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(path)?;
        Ok(TailFile {
            file,
            bound,
            len: 0,
            answer: Answer::default(),
            last: None,
        })
    }

    /// Appends `data`, dropping the start of the file when it grew too long.
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.answer.bytes += data.len() as u64;
        self.answer.lines += data.iter().filter(|&&b| b == b'\n').count() as u64;
        self.last = data.last().copied();
        let n = data.len() as u64;
        if n >= self.bound {
            // Only the end of this chunk is kept.
            let start = (n - self.bound) as usize;
            self.file.set_len(0)?;
            self.file.write_all_at(&data[start..], 0)?;
            self.len = self.bound;
            return Ok(());
        }
        self.file.write_all_at(data, self.len)?;
        self.len += n;
        if self.len >= self.bound + self.bound.max(CHUNK as u64) {
            self.drop_start()?;
        }
        Ok(())
    }

    /// Moves the last `bound` bytes to the front and cuts the rest.
    fn drop_start(&mut self) -> io::Result<()> {
        if self.len <= self.bound {
            return Ok(());
        }
        let from = self.len - self.bound;
        let mut buf = vec![0u8; CHUNK.min(self.bound as usize).max(1)];
        let mut done = 0u64;
        while done < self.bound {
            let n = buf.len().min((self.bound - done) as usize);
            self.file.read_exact_at(&mut buf[..n], from + done)?;
            self.file.write_all_at(&buf[..n], done)?;
            done += n as u64;
        }
        self.file.set_len(self.bound)?;
        self.len = self.bound;
        Ok(())
    }

    /// What was written so far.
    pub fn answer(&self) -> Answer {
        let partial = self.last.is_some_and(|b| b != b'\n');
        Answer {
            bytes: self.answer.bytes,
            lines: self.answer.lines + u64::from(partial),
        }
    }

    /// Cuts the file to its last `bound` bytes, flushes it to disk and says what was written.
    pub fn finish(mut self) -> io::Result<Answer> {
        self.drop_start()?;
        self.file.sync_data()?;
        Ok(self.answer())
    }
}

/// The containers of `pod` that ran (running now, or terminated now or before), init
/// containers first, each list in the Pod's order: those that have a log. A name that is no
/// DNS label (never, from an API server) is left out: it names a file.
pub fn containers_that_ran(pod: &Pod) -> Vec<String> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let ran = |c: &&ContainerStatus| {
        let now = c.state.as_ref();
        now.is_some_and(|s| s.running.is_some() || s.terminated.is_some())
            || c.last_state
                .as_ref()
                .is_some_and(|s| s.terminated.is_some())
    };
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter(ran)
        .map(|c| c.name.clone())
        .filter(|name| crate::api::is_dns_label(name))
        .collect()
}

/// Keeps the end (at most `bound` bytes) of each container's log of `attempt`'s Pods of `job`
/// in the state dir `dir`, under the job's current task: every member the operator's Pod watch
/// saw and did not see deleted nor lost to its node, if it still exists and is the attempt's
/// ([`super::is_attempt_pod`]); every container of it that ran ([`containers_that_ran`]). A
/// container kept again replaces its earlier capture. Never fails: what cannot be kept is
/// logged (a warning) and left; the whole takes at most [`KEEP_TIMEOUT`].
pub async fn keep(
    client: &kube::Client,
    store: &Store,
    dir: &StateDir,
    job: &JobRow,
    attempt: i32,
    bound: u64,
) {
    if bound == 0 {
        return;
    }
    let started = Instant::now();
    let deadline = started + KEEP_TIMEOUT;
    let members = match store.pod_members(job.id, attempt) {
        Ok(members) => members,
        Err(e) => {
            tracing::warn!(attempt, error = %e, "reading the attempt's Pods failed; no log kept");
            return;
        }
    };
    if let Err(e) = std::fs::create_dir_all(dir.kept_logs_dir(job.id)) {
        tracing::warn!(attempt, error = %e, "creating the folder of kept logs failed; no log kept");
        return;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &job.namespace);
    let task = job.task_index.max(0) as usize;
    let (mut containers, mut bytes) = (0, 0);
    // A member lost to its node: its kubelet cannot answer (and the attempt's end must not
    // wait on it).
    let lost_to_node = |m: &&crate::store::pods::PodObservation| {
        m.state == crate::store::pods::PodState::Lost
            && crate::lifecycle::nodes::is_node_loss(&m.reason)
    };
    'members: for member in members
        .iter()
        .filter(|m| !m.deleted)
        .filter(|m| !lost_to_node(m))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        let pod = match tokio::time::timeout(left, api.get_opt(&member.pod_name)).await {
            Ok(Ok(Some(pod))) if super::is_attempt_pod(&pod, job, attempt) => pod,
            // Gone (or another Pod under its name): nothing to keep.
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => {
                tracing::warn!(attempt, pod = %member.pod_name, error = %api_error(&e), "reading the Pod failed; its logs are not kept");
                continue;
            }
            Err(_) => break,
        };
        for container in containers_that_ran(&pod) {
            let left = deadline.saturating_duration_since(Instant::now());
            let key = KeptLogKey {
                task,
                attempt,
                rank: member.rank,
                container,
            };
            let temp = dir.kept_log_temp(job.id, &key);
            let one = keep_container(&api, &member.pod_name, dir, job.id, &key, bound);
            match tokio::time::timeout(left.min(CONTAINER_TIMEOUT), one).await {
                Ok(Ok((kept, cut))) => {
                    containers += 1;
                    bytes += kept;
                    tracing::debug!(attempt, pod = %member.pod_name, container = %key.container, bytes = kept, truncated = cut, "kept a container's log");
                }
                Ok(Err(e)) => {
                    let _ = std::fs::remove_file(&temp);
                    tracing::warn!(attempt, pod = %member.pod_name, container = %key.container, error = %e, "keeping the container's log failed; nothing kept of it");
                }
                Err(_) => {
                    let _ = std::fs::remove_file(&temp);
                    tracing::warn!(attempt, pod = %member.pod_name, container = %key.container, "keeping the container's log took too long; nothing kept of it");
                    if Instant::now() >= deadline {
                        break 'members;
                    }
                }
            }
        }
    }
    if Instant::now() >= deadline {
        tracing::warn!(
            attempt,
            "keeping the attempt's logs took longer than {KEEP_TIMEOUT:?}; the rest is not kept"
        );
    }
    tracing::info!(
        attempt,
        containers,
        bytes,
        took_ms = started.elapsed().as_millis() as u64,
        "kept the end of the attempt's logs"
    );
}

/// Keeps the end of one container's log ([`keep`]): asks, streams into the temporary file,
/// asks again with more lines while worth it, renames into place and removes the other form
/// (whole or cut) of an earlier capture. Returns the bytes kept and whether only the end was.
async fn keep_container(
    api: &Api<Pod>,
    pod: &str,
    dir: &StateDir,
    job_id: i64,
    key: &KeptLogKey,
    bound: u64,
) -> Result<(u64, bool), String> {
    let temp = dir.kept_log_temp(job_id, key);
    let mut asked = first_tail_lines(bound);
    let mut asks = 1;
    loop {
        let params = LogParams {
            container: Some(key.container.clone()),
            tail_lines: Some(asked),
            ..LogParams::default()
        };
        let stream = api
            .log_stream(pod, &params)
            .await
            .map_err(|e| format!("asking for its log: {}", api_error(&e)))?;
        let mut stream = std::pin::pin!(stream);
        let mut tail =
            TailFile::create(&temp, bound).map_err(|e| format!("{}: {e}", temp.display()))?;
        loop {
            let chunk = stream
                .fill_buf()
                .await
                .map_err(|e| format!("reading its log: {e}"))?;
            if chunk.is_empty() {
                break;
            }
            let n = chunk.len();
            tail.write(chunk)
                .map_err(|e| format!("{}: {e}", temp.display()))?;
            stream.consume_unpin(n);
        }
        let got = tail
            .finish()
            .map_err(|e| format!("{}: {e}", temp.display()))?;
        match next_tail_lines(asked, got, bound) {
            Some(more) if asks < MAX_ASKS => {
                asked = more;
                asks += 1;
            }
            _ => {
                let cut = truncated(asked, got, bound);
                let path = dir.kept_log(job_id, key, cut);
                std::fs::rename(&temp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
                let _ = std::fs::remove_file(dir.kept_log(job_id, key, !cut));
                return Ok((got.bytes.min(bound), cut));
            }
        }
    }
}

/// What the API said, in one line: its code and message (kube's own display of a Status is
/// its whole debug form).
fn api_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("the API answered {}: {}", s.code, s.message),
        other => other.to_string(),
    }
}

/// The logs kept of `row`'s attempts that `filter` selects ([`StateDir::kept_logs`]), in order
/// of task, attempt and rank, and each member's containers in the order of its task's template
/// (init containers first; a container the template does not name, last): what
/// `managed-jobs logs` prints and the visibility API serves. One directory read.
pub fn kept_logs(dir: &StateDir, row: &JobRow, filter: &KeptLogFilter) -> Vec<KeptLog> {
    let mut logs = dir.kept_logs(row.id, filter);
    logs.sort_by_cached_key(|l| {
        let k = &l.key;
        (
            k.task,
            k.attempt,
            k.rank,
            template_position(row, k.task, &k.container),
            k.container.clone(),
        )
    });
    logs
}

/// Where `container` comes in task `task`'s template of `row`: init containers first, then
/// containers; one it does not name after all.
fn template_position(row: &JobRow, task: usize, container: &str) -> usize {
    let spec = row.spec.task(task).template.and_then(|t| t.spec.as_ref());
    let Some(spec) = spec else {
        return usize::MAX;
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .position(|c| c.name == container)
        .unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn answer(bytes: u64, lines: u64) -> Answer {
        Answer { bytes, lines }
    }

    #[test]
    fn asks_grow_until_the_bound_is_reached_or_the_log_came_whole() {
        let bound = 1024 * 1024;
        assert_eq!(first_tail_lines(bound), 8192);
        assert_eq!(first_tail_lines(4096), 100, "at least 100 lines");
        assert_eq!(first_tail_lines(1 << 40), 10_000, "at most 10,000");
        // The whole log came (fewer lines than asked): keep it.
        assert_eq!(next_tail_lines(8192, answer(5_000, 50), bound), None);
        // The bound was reached: keep its end.
        assert_eq!(next_tail_lines(8192, answer(bound + 10, 8192), bound), None);
        // Short lines: as many lines as asked, fewer bytes than the bound: twice what the
        // bound holds at 16 bytes a line.
        assert_eq!(
            next_tail_lines(8192, answer(8192 * 16, 8192), bound),
            Some(2 * 65_536)
        );
        // At least twice the last ask, at most the bound's bytes in lines.
        assert_eq!(next_tail_lines(100, answer(4000, 100), 4096), Some(206));
        assert_eq!(next_tail_lines(4096, answer(4095, 4096), 4096), None);
        assert_eq!(
            next_tail_lines(100, answer(100 * 40, 100), 1 << 20),
            Some(52_430)
        );
    }

    #[test]
    fn truncation_is_said_when_the_start_was_dropped_or_may_be_missing() {
        assert!(!truncated(100, answer(50, 10), 4096), "the whole log");
        assert!(
            !truncated(100, answer(4096, 99), 4096),
            "the whole log, exactly the bound"
        );
        assert!(truncated(100, answer(4097, 99), 4096), "its start dropped");
        assert!(
            truncated(100, answer(1000, 100), 4096),
            "as many lines as asked"
        );
    }

    /// Written in chunks of any size, a tail file holds the last `bound` bytes of what was
    /// written (all of it when shorter), and counts the bytes and lines written.
    #[test]
    fn a_tail_file_keeps_the_last_bytes_whatever_the_chunks() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t");
        let text: Vec<u8> = (1..=20_000)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        for (bound, chunk) in [
            (4096, 7),
            (4096, 5000),
            (4096, 64 * 1024),
            (1 << 20, 300),
            (1, 3),
        ] {
            let mut t = TailFile::create(&path, bound).unwrap();
            for c in text.chunks(chunk) {
                t.write(c).unwrap();
            }
            let got = t.finish().unwrap();
            assert_eq!(got, answer(text.len() as u64, 20_000));
            let kept = std::fs::read(&path).unwrap();
            let want = &text[text.len().saturating_sub(bound as usize)..];
            assert_eq!(kept, want, "bound {bound}, chunks of {chunk}");
        }
        let mut t = TailFile::create(&path, 10).unwrap();
        t.write(b"a\nb").unwrap();
        assert_eq!(
            t.finish().unwrap(),
            answer(3, 2),
            "a last line without its newline"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"a\nb");
    }

    proptest! {
        /// The same for random text and chunks: the file is the text's last `bound` bytes and
        /// never grows past `bound` + max(`bound`, 64 KiB) + a chunk.
        #[test]
        fn a_tail_file_is_the_texts_end(
            text in prop::collection::vec(prop::sample::select(vec![b'a', b'\n', b'z']), 0..20_000),
            bound in 1u64..5_000,
            chunks in prop::collection::vec(1usize..3_000, 1..20),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let path = tmp.path().join("t");
            let mut t = TailFile::create(&path, bound).unwrap();
            let mut at = 0;
            let mut sizes = chunks.iter().cycle();
            while at < text.len() {
                let n = (*sizes.next().unwrap()).min(text.len() - at);
                t.write(&text[at..at + n]).unwrap();
                let len = std::fs::metadata(&path).unwrap().len();
                prop_assert!(len <= bound + bound.max(CHUNK as u64) + n as u64);
                at += n;
            }
            let got = t.finish().unwrap();
            prop_assert_eq!(got.bytes, text.len() as u64);
            let kept = std::fs::read(&path).unwrap();
            prop_assert_eq!(&kept[..], &text[text.len().saturating_sub(bound as usize)..]);
        }

        /// Asks only grow, stay within the lines worth asking, and end: an answer that reached
        /// the bound or came whole is the last.
        #[test]
        fn asks_grow_and_end(asked in 1i64..2_000_000, bytes in 0u64..4_000_000, lines in 0u64..2_000_000, bound in 1u64..4_000_000) {
            let got = answer(bytes, lines);
            match next_tail_lines(asked, got, bound) {
                None => prop_assert!(bytes >= bound || (lines as i64) < asked || asked >= max_tail_lines(bound)),
                Some(next) => {
                    prop_assert!(next > asked);
                    prop_assert!(next <= max_tail_lines(bound));
                }
            }
        }
    }

    #[test]
    fn only_containers_that_ran_have_logs_init_containers_first() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {
                "initContainerStatuses": [
                    {"name": "prepare", "image": "b", "imageID": "", "ready": false, "restartCount": 0,
                     "state": {"terminated": {"exitCode": 0}}},
                ],
                "containerStatuses": [
                    {"name": "main", "image": "b", "imageID": "", "ready": true, "restartCount": 0,
                     "state": {"running": {}}},
                    {"name": "sidecar", "image": "b", "imageID": "", "ready": false, "restartCount": 0,
                     "state": {"waiting": {"reason": "ImagePullBackOff"}}},
                    {"name": "retried", "image": "b", "imageID": "", "ready": false, "restartCount": 1,
                     "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                     "lastState": {"terminated": {"exitCode": 1}}},
                ]
            }
        }))
        .unwrap();
        assert_eq!(containers_that_ran(&pod), ["prepare", "main", "retried"]);
        assert!(containers_that_ran(&Pod::default()).is_empty());
    }
}
