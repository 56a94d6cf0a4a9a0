//! The SQLite store: the scheduler's working state and the source of every status write.
//!
//! One row per job in `jobs` holds both state machines (`docs/design.md`, "Two state machines"); `transitions` keeps each job's history. Every state change is a compare-and-set on the
//! expected previous state ([`Store::transition`]) of a transition decided by
//! [`crate::lifecycle`]: a failed CAS reports the current row and never overwrites, an illegal
//! edge is an error and is never written. The file is opened in WAL mode and shared by the
//! operator and every job controller process; writers wait up to [`BUSY_TIMEOUT`] for the lock.
//!
//! - [`schema`]: the tables and their migrations;
//! - [`row`]: the job record ([`crate::lifecycle::JobRow`]) in SQL, every statement built from
//!   its one declaration;
//! - [`jobs`]: mirroring, the compare-and-set, the scheduler's and status writer's queries;
//! - [`history`]: each job's transitions;
//! - [`pods`]: what the Pod watch saw of each attempt's Pod;
//! - [`queues`]: the queues' queries (each queue's slots, head and counts);
//! - [`resources`]: admission's reads in resources (quota used, jobs holding quota, demands);
//! - [`memo`]: what a scheduling pass read of each queue, kept until the queue changes;
//! - [`settings`]: the configuration the operator shares with its job controllers;
//! - [`claims`]: the store's identity and its operator's claims on namespaces (one owner per
//!   job), which its job controllers read before launching.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

pub mod claims;
pub mod history;
pub mod jobs;
pub mod memo;
mod parsed;
pub mod pods;
pub mod queues;
pub mod resources;
pub mod row;
pub mod schema;
pub mod settings;
pub mod visibility;

/// The admission order of a queue's jobs as SQL (`ORDER BY`): higher priority, then the earlier
/// entry (its second, then the resourceVersion it was first seen at), then the lower id;
/// [`crate::lifecycle::entry::admission_order`] is the same rule (a test holds them together).
/// The indexes `jobs_queue_order` and `jobs_waiting_in_order` (schema step 14) serve it.
pub const ADMISSION_ORDER: &str = "priority DESC, queued_at_ms, entry_version, id";

pub use claims::ClaimRow;
pub use jobs::{Cas, UnsyncedBrief, Upserted};
pub use queues::{ARRIVAL_HOLD_MS, QueueCounts, Queued};
pub use settings::Settings;

/// How long a writer waits for another process's write lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite refused or failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The schema migration failed.
    #[error("migrating the store's schema: {0}")]
    Migration(#[from] rusqlite_migration::Error),
    /// A row holds a value this version cannot read.
    #[error("corrupt row for job {job_id}: {what}")]
    Corrupt {
        /// The job.
        job_id: i64,
        /// What could not be read.
        what: String,
    },
    /// No job with that id.
    #[error("no job with id {0}")]
    NotFound(i64),
    /// The change would break the state machines; nothing was written.
    #[error(transparent)]
    Illegal(#[from] crate::lifecycle::IllegalTransition),
    /// The store was migrated by a newer release (a downgrade); nothing was changed.
    #[error(
        "the store {path} is at schema step {found}, written by a newer release of managed-jobs; this one ({version}) knows steps up to {known}. A downgrade is refused: run the newer release again, or move the store aside and start this one, which then rebuilds every job from its status as after a lost store (docs/upgrades.md)",
        version = env!("CARGO_PKG_VERSION")
    )]
    NewerRelease {
        /// The store file.
        path: String,
        /// Its schema step.
        found: usize,
        /// The highest step this build knows ([`schema::CURRENT_STEP`]).
        known: usize,
    },
    /// The store is at another schema step than this build's, and this process never migrates
    /// it (a job controller, `managed-jobs queue`): only an operator of this release does.
    #[error(
        "the store {path} is at schema step {found}; this managed-jobs ({version}) reads step {known}: the store belongs to another release's operator (docs/upgrades.md)",
        version = env!("CARGO_PKG_VERSION")
    )]
    OtherRelease {
        /// The store file.
        path: String,
        /// Its schema step (0: no schema at all).
        found: usize,
        /// This build's step ([`schema::CURRENT_STEP`]).
        known: usize,
    },
}

impl StoreError {
    /// True when the state dir itself fails (disk full, I/O error, a file that cannot be
    /// opened or written), not the store's content: worth trying again later.
    pub fn is_storage_failure(&self) -> bool {
        match self {
            StoreError::Sqlite(e)
            | StoreError::Migration(rusqlite_migration::Error::RusqliteError { err: e, .. }) => {
                sqlite_storage_failure(e)
            }
            _ => false,
        }
    }
}

fn sqlite_storage_failure(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::*;
    matches!(
        e.sqlite_error_code(),
        Some(DiskFull | SystemIoFailure | CannotOpen | ReadOnly | DatabaseBusy | DatabaseLocked)
    )
}

/// True when `e` (or what caused it) says the state dir cannot be read or written: disk full,
/// I/O error (SQLite's, or the OS's: ENOSPC, EIO, EDQUOT, EROFS).
pub fn storage_failing(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        if let Some(s) = c.downcast_ref::<StoreError>() {
            return s.is_storage_failure();
        }
        if let Some(s) = c.downcast_ref::<rusqlite::Error>() {
            return sqlite_storage_failure(s);
        }
        c.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.raw_os_error(),
                Some(libc::ENOSPC | libc::EIO | libc::EDQUOT | libc::EROFS)
            )
        })
    })
}

/// The connection settings every process uses: a page cache of `cache_kib`, WAL, normal
/// syncs, foreign keys.
fn configure(conn: &Connection, cache_kib: u32) -> Result<()> {
    conn.pragma_update(None, "cache_size", -(cache_kib as i64))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    temp_tables(conn)
}

/// The connection's own tables, in memory: the jobs a pass told their own reason
/// ([`Store::tell_waiting_except`]).
fn temp_tables(conn: &Connection) -> Result<()> {
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS told_apart (id INTEGER PRIMARY KEY);
         CREATE TEMP TABLE IF NOT EXISTS arriving (
            uid TEXT PRIMARY KEY,
            queue TEXT NOT NULL,
            priority INTEGER NOT NULL,
            queued_at_ms INTEGER NOT NULL,
            entry_version TEXT NOT NULL,
            seen_at_ms INTEGER NOT NULL
         );
         CREATE INDEX IF NOT EXISTS temp.arriving_in_order
            ON arriving (queue, priority DESC, queued_at_ms, entry_version);",
    )?;
    Ok(())
}

/// Result type of the store.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A handle on the SQLite file. Not `Sync`: each process (and each thread) opens its own.
pub struct Store {
    conn: Connection,
    /// The demands and placements read so far, by their stored text ([`parsed::Parsed`]).
    parsed: std::cell::RefCell<parsed::Parsed>,
    /// What the scheduling pass read of each queue, until it changes ([`memo`]).
    memo: std::cell::RefCell<memo::Memo>,
}

/// Prepared statements the operator keeps ([`Store::keep_statements`]): all of them, about 40.
/// A job controller keeps rusqlite's default 16 (each costs it memory: about 30 KiB in all).
pub const STATEMENT_CACHE: usize = 64;

/// The schema step of the store file at `path` (its `user_version`), read without changing the
/// file (a read-only connection); `None` when there is no file. Errors: the file is not a
/// store SQLite can read.
pub fn schema_step_at(path: &Path) -> Result<Option<usize>> {
    use rusqlite::OpenFlags;
    if !path.exists() {
        return Ok(None);
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(Some(read_step(&conn)?))
}

fn read_step(conn: &Connection) -> Result<usize> {
    let step: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    Ok(step.max(0) as usize)
}

impl Store {
    /// Opens (creating if needed) the store at `path`, in WAL mode, and migrates its schema to
    /// [`schema::CURRENT_STEP`]: the operator's open (only an operator migrates, after it
    /// replaced every job controller of another build: `engine::take_over`).
    ///
    /// `cache_kib` sizes SQLite's page cache: the operator uses a few MiB, a job controller
    /// process a few pages (SQLite's 2 MiB default would dominate its private memory).
    ///
    /// Errors: [`StoreError::NewerRelease`] for a store a newer release migrated (checked
    /// before anything is written: the file is left as it was); SQLite's.
    pub fn open(path: &Path, cache_kib: u32) -> Result<Store> {
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let found = read_step(&conn)?;
        if found > schema::CURRENT_STEP {
            return Err(StoreError::NewerRelease {
                path: path.display().to_string(),
                found,
                known: schema::CURRENT_STEP,
            });
        }
        configure(&conn, cache_kib)?;
        schema::migrations().to_latest(&mut conn)?;
        Ok(Store {
            conn,
            parsed: Default::default(),
            memo: Default::default(),
        })
    }

    /// Opens the existing store at `path` without migrating it: a job controller's and the
    /// command line's open. Errors: [`StoreError::OtherRelease`] when the file is at another
    /// schema step than this build's (an operator of another release migrated it, or has not
    /// yet: this process must not read it with its own idea of the columns); SQLite's (no
    /// file).
    pub fn open_current(path: &Path, cache_kib: u32) -> Result<Store> {
        use rusqlite::OpenFlags;
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let store = Store {
            conn,
            parsed: Default::default(),
            memo: Default::default(),
        };
        store.check_step(path)?;
        configure(&store.conn, cache_kib)?;
        Ok(store)
    }

    /// The schema step of the open store (its `user_version`): a cheap read of the file's
    /// header, which a job controller makes every turn.
    pub fn schema_step(&self) -> Result<usize> {
        read_step(&self.conn)
    }

    /// Errors with [`StoreError::OtherRelease`] unless the store is at this build's step
    /// ([`schema::CURRENT_STEP`]); `path` names it in the error.
    pub fn check_step(&self, path: &Path) -> Result<()> {
        let found = self.schema_step()?;
        if found != schema::CURRENT_STEP {
            return Err(StoreError::OtherRelease {
                path: path.display().to_string(),
                found,
                known: schema::CURRENT_STEP,
            });
        }
        Ok(())
    }

    /// Keeps up to `n` prepared statements instead of rusqlite's 16, so that a busy process
    /// never parses the same SQL twice (re-parsing showed in the operator's profile under load).
    pub fn keep_statements(&self, n: usize) {
        self.conn.set_prepared_statement_cache_capacity(n);
    }

    /// Opens a throw-away store in memory (tests and property tests).
    pub fn in_memory() -> Result<Store> {
        let mut conn = Connection::open_in_memory()?;
        schema::migrations().to_latest(&mut conn)?;
        temp_tables(&conn)?;
        Ok(Store {
            conn,
            parsed: Default::default(),
            memo: Default::default(),
        })
    }
}
