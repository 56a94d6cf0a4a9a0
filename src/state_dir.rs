//! [`StateDir`]: the operator's state directory and every path in it.
//!
//! ```text
//! STATE_DIR/
//!   managed-jobs.db        the SQLite store (+ -wal, -shm)
//!   operator.lock          held (flock) by the one operator driving this dir
//!   operator.sock          datagram socket: job controllers wake the operator
//!   logs/ID.log            job controller process log
//!   logs/ID.workload.log   local workload output (every attempt, appended)
//!   run/ID.lock            held (flock) by the job's one job controller
//!   run/ID-ATTEMPT.exit    `<stage> <code>` written by a local attempt's wrapper
//!   work/ID/               a local job's working directory and $HOME
//! ```

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

    /// Removes what the state dir keeps for a job whose object is gone (its retention ended):
    /// its working directory, logs, lock and exit files. Job ids never repeat, even after a lost
    /// store, so no later job could have shared them.
    pub fn forget_job(&self, job_id: i64, attempts: i32) {
        let _ = std::fs::remove_dir_all(self.work_dir(job_id));
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
    }
}
