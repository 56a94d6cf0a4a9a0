//! [`StateDir`]: the operator's state directory and every path in it.
//!
//! ```text
//! STATE_DIR/
//!   managed-jobs.db        the SQLite store (+ -wal, -shm)
//!   operator.lock          held (flock) by the one operator driving this dir
//!   operator.sock          datagram socket: job controllers wake the operator
//!   logs/ID.log            job controller process log
//!   logs/ID.workload.log   local workload output (every attempt, appended by its output sink:
//!                          executor::output)
//!   logs/ID.task-T.workload.log  a local pipeline's task T output (every attempt, appended)
//!   logs/ID.kept/          the end of each container's log of a pod job's attempts, kept by
//!                          its job controller once the attempt ended or before it stopped it:
//!     T<task>-A<attempt>-R<rank>-<container>.log       the whole log
//!     T<task>-A<attempt>-R<rank>-<container>.tail.log  its last `--kept-log-bytes` only
//!     .T<task>-A<attempt>-R<rank>-<container>.log.tmp  a capture being written (renamed
//!                                                      into place once complete)
//!   run/ID.lock            held (flock) by the job's one job controller
//!   run/ID-ATTEMPT.exit    `<stage> <code>` written by a local attempt's wrapper
//!   work/ID/               a local job's working directory and $HOME
//! ```
//!
//! A kept log is named by its task (index from 0; 0 for a job without tasks), the job's attempt
//! (counted over the whole job, as `status.attempt`), the member's rank (0 for a job without
//! `nodes`) and the container's name (a DNS label: no `.`, so the name parses back,
//! [`KeptLogKey::parse`]). [`StateDir::kept_logs`] lists them.

use std::path::{Path, PathBuf};

/// The operator's state directory. Cheap to clone; creates nothing until asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// The state dir rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir { root: root.into() }
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the directory and its `logs/`, `run/` and `work/` folders.
    pub fn create(&self) -> std::io::Result<()> {
        for dir in [self.logs_dir(), self.run_dir(), self.root.join("work")] {
            std::fs::create_dir_all(dir)?;
        }
        Ok(())
    }

    /// The SQLite store.
    pub fn store(&self) -> PathBuf {
        self.root.join("managed-jobs.db")
    }

    /// The operator's exclusive lock.
    pub fn operator_lock(&self) -> PathBuf {
        self.root.join("operator.lock")
    }

    /// The operator's wake-up socket.
    pub fn wake_socket(&self) -> PathBuf {
        self.root.join("operator.sock")
    }

    /// Folder of every log.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// Log of job `job_id`'s controller processes.
    pub fn controller_log(&self, job_id: i64) -> PathBuf {
        self.logs_dir().join(format!("{job_id}.log"))
    }

    /// Output of a local job's workload (every attempt, appended).
    pub fn workload_log(&self, job_id: i64) -> PathBuf {
        self.logs_dir().join(format!("{job_id}.workload.log"))
    }

    /// Output of task `task` (index from 0) of a local pipeline (every attempt, appended).
    pub fn task_log(&self, job_id: i64, task: usize) -> PathBuf {
        self.logs_dir()
            .join(format!("{job_id}.task-{task}.workload.log"))
    }

    /// Folder of locks and exit files.
    pub fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    /// Lock held by job `job_id`'s one job controller.
    pub fn job_lock(&self, job_id: i64) -> PathBuf {
        self.run_dir().join(format!("{job_id}.lock"))
    }

    /// Exit file of a local attempt.
    pub fn exit_file(&self, job_id: i64, attempt: i32) -> PathBuf {
        self.run_dir().join(format!("{job_id}-{attempt}.exit"))
    }

    /// Working directory and `$HOME` of a local job.
    pub fn work_dir(&self, job_id: i64) -> PathBuf {
        self.root.join("work").join(job_id.to_string())
    }

    /// Folder of the logs kept of a pod job's attempts.
    pub fn kept_logs_dir(&self, job_id: i64) -> PathBuf {
        self.logs_dir().join(format!("{job_id}.kept"))
    }

    /// Where the kept log `key` of job `job_id` lives: `truncated` when only its end was kept.
    pub fn kept_log(&self, job_id: i64, key: &KeptLogKey, truncated: bool) -> PathBuf {
        self.kept_logs_dir(job_id).join(key.file_name(truncated))
    }

    /// Where a capture of the kept log `key` is written before it is renamed into place
    /// ([`StateDir::kept_log`]): the same folder, so the rename is atomic; `.` first, so it is
    /// never listed.
    pub fn kept_log_temp(&self, job_id: i64, key: &KeptLogKey) -> PathBuf {
        self.kept_logs_dir(job_id)
            .join(format!(".{}.tmp", key.file_name(false)))
    }

    /// The logs kept of job `job_id`'s attempts that `filter` selects, in order of task,
    /// attempt, rank and container name (a job without any: empty). One directory read; a
    /// file whose name does not parse (a capture being written, `.` first) is not listed.
    pub fn kept_logs(&self, job_id: i64, filter: &KeptLogFilter) -> Vec<KeptLog> {
        let dir = self.kept_logs_dir(job_id);
        let mut out: Vec<KeptLog> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let entry = entry.ok()?;
                let (key, truncated) = KeptLogKey::parse(entry.file_name().to_str()?)?;
                let meta = entry.metadata().ok().filter(|m| m.is_file())?;
                filter.selects(&key).then(|| KeptLog {
                    path: entry.path(),
                    bytes: meta.len(),
                    truncated,
                    key,
                })
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key).then(a.truncated.cmp(&b.truncated)));
        // A capture replaces its other form (whole or cut) just after its rename: a listing in
        // between sees both, of which the newer (the later capture) is the one kept.
        out.dedup_by(|later, earlier| {
            if later.key != earlier.key {
                return false;
            }
            let modified = |l: &KeptLog| std::fs::metadata(&l.path).and_then(|m| m.modified()).ok();
            if modified(later) > modified(earlier) {
                std::mem::swap(later, earlier);
            }
            true
        });
        out
    }

    /// Removes what the state dir keeps for a job whose object is gone (its retention ended):
    /// its working directory, logs (kept logs too), lock and exit files. Job ids never repeat,
    /// even after a lost store, so no later job could have shared them.
    pub fn forget_job(&self, job_id: i64, attempts: i32) {
        let _ = std::fs::remove_dir_all(self.work_dir(job_id));
        let _ = std::fs::remove_dir_all(self.kept_logs_dir(job_id));
        let _ = std::fs::remove_file(self.controller_log(job_id));
        let _ = std::fs::remove_file(self.workload_log(job_id));
        for task in 0..crate::api::MAX_TASKS {
            let _ = std::fs::remove_file(self.task_log(job_id, task));
        }
        let _ = std::fs::remove_file(self.job_lock(job_id));
        for attempt in 1..=attempts.max(0) {
            let _ = std::fs::remove_file(self.exit_file(job_id, attempt));
        }
    }
}

/// Which kept log: a container of one member of one attempt of a pod job.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeptLogKey {
    /// The pipeline's task, index from 0 (0 for a job without tasks).
    pub task: usize,
    /// The job's attempt, from 1, counted over the whole job (as `status.attempt`).
    pub attempt: i32,
    /// The member's rank (0 for a job without `nodes`).
    pub rank: u32,
    /// The container (or init container) name: a DNS label.
    pub container: String,
}

/// Suffix of a kept log's file name when it holds the whole log.
const WHOLE: &str = ".log";
/// Suffix of a kept log's file name when only its end was kept.
const CUT: &str = ".tail.log";

impl KeptLogKey {
    /// Its file name: `T<task>-A<attempt>-R<rank>-<container>.log`, or `.tail.log` when
    /// `truncated`.
    pub fn file_name(&self, truncated: bool) -> String {
        format!(
            "T{}-A{}-R{}-{}{}",
            self.task,
            self.attempt,
            self.rank,
            self.container,
            if truncated { CUT } else { WHOLE }
        )
    }

    /// The key and truncation a file name says ([`KeptLogKey::file_name`]'s inverse); None for
    /// any other name (a temporary file, a container name that is no DNS label).
    pub fn parse(name: &str) -> Option<(KeptLogKey, bool)> {
        let (stem, truncated) = match name.strip_suffix(CUT) {
            Some(stem) => (stem, true),
            None => (name.strip_suffix(WHOLE)?, false),
        };
        fn number(part: &str, tag: char) -> Option<&str> {
            let digits = part.strip_prefix(tag)?;
            (!digits.is_empty()
                && digits.bytes().all(|b| b.is_ascii_digit())
                && (digits == "0" || !digits.starts_with('0')))
            .then_some(digits)
        }
        let mut parts = stem.splitn(4, '-');
        let task = number(parts.next()?, 'T')?.parse().ok()?;
        let attempt: i32 = number(parts.next()?, 'A')?.parse().ok()?;
        let rank = number(parts.next()?, 'R')?.parse().ok()?;
        let container = parts.next()?;
        if attempt < 1 || !crate::api::is_dns_label(container) {
            return None;
        }
        Some((
            KeptLogKey {
                task,
                attempt,
                rank,
                container: container.to_string(),
            },
            truncated,
        ))
    }
}

/// Which kept logs to list ([`StateDir::kept_logs`]): each field set keeps only the logs that
/// match it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeptLogFilter {
    /// Only this task (index from 0).
    pub task: Option<usize>,
    /// Only this attempt (the job's count, from 1).
    pub attempt: Option<i32>,
    /// Only this rank.
    pub rank: Option<u32>,
}

impl KeptLogFilter {
    /// True when `key` passes every field set.
    pub fn selects(&self, key: &KeptLogKey) -> bool {
        self.task.is_none_or(|t| t == key.task)
            && self.attempt.is_none_or(|a| a == key.attempt)
            && self.rank.is_none_or(|r| r == key.rank)
    }
}

/// One kept log, as [`StateDir::kept_logs`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptLog {
    /// Which task, attempt, rank and container.
    pub key: KeptLogKey,
    /// The file (its bytes are the log's, as the container wrote them).
    pub path: PathBuf,
    /// Its size, bytes.
    pub bytes: u64,
    /// Only its end was kept: the log was longer than the bound (`--kept-log-bytes`), or may
    /// have been (as many lines came as were asked for).
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_documented_layout() {
        let d = StateDir::new("/s");
        assert_eq!(d.store(), Path::new("/s/managed-jobs.db"));
        assert_eq!(d.controller_log(7), Path::new("/s/logs/7.log"));
        assert_eq!(d.workload_log(7), Path::new("/s/logs/7.workload.log"));
        assert_eq!(d.exit_file(7, 2), Path::new("/s/run/7-2.exit"));
        assert_eq!(d.job_lock(7), Path::new("/s/run/7.lock"));
        assert_eq!(d.work_dir(7), Path::new("/s/work/7"));
        assert_eq!(d.wake_socket(), Path::new("/s/operator.sock"));
        let key = KeptLogKey {
            task: 1,
            attempt: 2,
            rank: 3,
            container: "main".into(),
        };
        assert_eq!(
            d.kept_log(7, &key, false),
            Path::new("/s/logs/7.kept/T1-A2-R3-main.log")
        );
        assert_eq!(
            d.kept_log(7, &key, true),
            Path::new("/s/logs/7.kept/T1-A2-R3-main.tail.log")
        );
    }

    #[test]
    fn kept_log_names_parse_back_and_nothing_else_parses() {
        for (task, attempt, rank, container, truncated) in [
            (0, 1, 0, "main", false),
            (31, 1000, 15, "a-b-c", true),
            (0, 7, 2, "tail", false),
            (0, 7, 2, "log", true),
            (2, 3, 0, "x", false),
        ] {
            let key = KeptLogKey {
                task,
                attempt,
                rank,
                container: container.into(),
            };
            let name = key.file_name(truncated);
            assert_eq!(KeptLogKey::parse(&name), Some((key, truncated)), "{name}");
        }
        for name in [
            "T0-A1-R0-main",
            "T0-A1-R0-.log",
            "T0-A0-R0-main.log",
            "T0-A-1-R0-main.log",
            "T01-A1-R0-main.log",
            "TX-A1-R0-main.log",
            "T0-A1-main.log",
            "T0-A1-R0-Main.log",
            "T0-A1-R0-a.b.log",
            "T0-A1-R0-../x.log",
            ".T0-A1-R0-main.log.tmp",
            "7.log",
        ] {
            assert_eq!(KeptLogKey::parse(name), None, "{name}");
        }
    }

    #[test]
    fn kept_logs_are_listed_filtered_and_forgotten_with_the_job() {
        let tmp = tempfile::tempdir().unwrap();
        let d = StateDir::new(tmp.path());
        assert!(
            d.kept_logs(7, &KeptLogFilter::default()).is_empty(),
            "none yet"
        );
        std::fs::create_dir_all(d.kept_logs_dir(7)).unwrap();
        let key = |task, attempt, rank, container: &str| KeptLogKey {
            task,
            attempt,
            rank,
            container: container.into(),
        };
        let files = [
            (key(0, 2, 1, "main"), true, "b2"),
            (key(0, 1, 0, "main"), false, "a"),
            (key(0, 2, 0, "main"), false, "b0"),
            (key(0, 2, 0, "init"), false, "i"),
            (key(1, 3, 0, "main"), true, "c"),
        ];
        for (k, truncated, text) in &files {
            std::fs::write(d.kept_log(7, k, *truncated), text).unwrap();
        }
        std::fs::write(d.kept_log_temp(7, &key(0, 9, 0, "main")), "x").unwrap();
        std::fs::write(d.kept_logs_dir(7).join("notes.txt"), "x").unwrap();
        let all = d.kept_logs(7, &KeptLogFilter::default());
        let keys: Vec<_> = all.iter().map(|l| l.key.clone()).collect();
        assert_eq!(
            keys,
            vec![
                key(0, 1, 0, "main"),
                key(0, 2, 0, "init"),
                key(0, 2, 0, "main"),
                key(0, 2, 1, "main"),
                key(1, 3, 0, "main"),
            ]
        );
        assert_eq!(all[3].bytes, 2);
        assert!(all[3].truncated && !all[0].truncated);
        let attempt2 = KeptLogFilter {
            attempt: Some(2),
            ..Default::default()
        };
        assert_eq!(d.kept_logs(7, &attempt2).len(), 3);
        let rank1 = KeptLogFilter {
            attempt: Some(2),
            rank: Some(1),
            ..Default::default()
        };
        assert_eq!(d.kept_logs(7, &rank1)[0].key, key(0, 2, 1, "main"));
        let task1 = KeptLogFilter {
            task: Some(1),
            ..Default::default()
        };
        assert_eq!(d.kept_logs(7, &task1).len(), 1);
        // A capture of the same container that replaced its other form: the newer is listed.
        let k = key(0, 1, 0, "main");
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(d.kept_log(7, &k, true), "newer").unwrap();
        let only = d.kept_logs(
            7,
            &KeptLogFilter {
                attempt: Some(1),
                ..Default::default()
            },
        );
        assert_eq!(only.len(), 1);
        assert!(only[0].truncated && only[0].bytes == 5, "{only:?}");
        d.forget_job(7, 3);
        assert!(!d.kept_logs_dir(7).exists());
        assert!(d.kept_logs(7, &KeptLogFilter::default()).is_empty());
    }
}
