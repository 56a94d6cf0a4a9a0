//! The store's schema and its migrations (rusqlite_migration; `user_version` holds the step).
//!
//! Append only: a released step is never edited, and a step only adds (tables, columns,
//! indexes); it never renames or drops what an earlier step made (`docs/upgrades.md`). Step 6
//! renamed `created_at_ms` before that rule: a job controller of 0.1.0 adopted by a 0.2.0
//! operator died on it, which is why an operator replaces every job controller of another build
//! before it migrates (`engine::take_over`).

use rusqlite_migration::{M, Migrations};

/// The schema step this build reads and writes: the number of steps in [`STEPS`], as the
/// store file's `user_version` holds it once migrated.
pub const CURRENT_STEP: usize = STEPS.len();

/// Every migration, oldest first.
pub(super) fn migrations() -> Migrations<'static> {
    Migrations::from_slice(STEPS)
}

/// Every step, oldest first; the step number of each is its position from 1.
const STEPS: &[M<'static>] = &[
    M::up(
        r#"
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            uid TEXT NOT NULL UNIQUE,
            namespace TEXT NOT NULL,
            name TEXT NOT NULL,
            generation INTEGER NOT NULL DEFAULT 0,
            executor TEXT NOT NULL,
            spec TEXT NOT NULL,
            priority INTEGER NOT NULL DEFAULT 0,
            phase TEXT NOT NULL,
            schedule_state TEXT NOT NULL,
            message TEXT NOT NULL DEFAULT '',
            queue_position INTEGER,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            deleting INTEGER NOT NULL DEFAULT 0,
            controller_pid INTEGER,
            controller_start_time INTEGER,
            controller_starts INTEGER NOT NULL DEFAULT 0,
            controller_crashes INTEGER NOT NULL DEFAULT 0,
            attempt INTEGER NOT NULL DEFAULT 0,
            launched_attempt INTEGER NOT NULL DEFAULT 0,
            recovery_count INTEGER NOT NULL DEFAULT 0,
            restart_count INTEGER NOT NULL DEFAULT 0,
            exit_code INTEGER,
            failure_reason TEXT,
            workload TEXT,
            backoff_until_ms INTEGER,
            submitted_at_ms INTEGER NOT NULL,
            created_at_ms INTEGER NOT NULL,
            started_at_ms INTEGER,
            finished_at_ms INTEGER,
            phase_changed_at_ms INTEGER NOT NULL,
            status_version INTEGER NOT NULL DEFAULT 1,
            synced_version INTEGER NOT NULL DEFAULT 0
        );
        CREATE INDEX jobs_queue ON jobs (schedule_state, priority DESC, created_at_ms, id)
            WHERE schedule_state IN ('Waiting', 'AliveWaiting');
        CREATE INDEX jobs_live ON jobs (schedule_state)
            WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting');
        CREATE INDEX jobs_unsynced ON jobs (id) WHERE status_version > synced_version;
        CREATE INDEX jobs_by_name ON jobs (namespace, name);
        CREATE TABLE transitions (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id INTEGER NOT NULL,
            at_ms INTEGER NOT NULL,
            from_phase TEXT,
            to_phase TEXT NOT NULL,
            from_schedule TEXT,
            to_schedule TEXT NOT NULL,
            reason TEXT NOT NULL,
            message TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX transitions_by_job ON transitions (job_id, id);
        CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE pod_observations (
            job_id INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            pod_name TEXT NOT NULL,
            state TEXT NOT NULL,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            message TEXT NOT NULL DEFAULT '',
            deleted INTEGER NOT NULL DEFAULT 0,
            observed_at_ms INTEGER NOT NULL,
            PRIMARY KEY (job_id, attempt)
        );
        "#,
    ),
    // The status writer's ordering (operator::status_loop): the transition (its id in
    // `transitions`) of a job's last schedule or phase change, and of the first one not yet
    // written to the API.
    M::up(
        r#"
        ALTER TABLE jobs ADD COLUMN changed_seq INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN unsynced_since_seq INTEGER NOT NULL DEFAULT 0;
        "#,
    ),
    // The last history entry whose Events were published, per job: kept across operator
    // restarts, so a restart publishes only what is left (events::transition_event_name makes
    // a second create of one Event fail).
    M::up(
        r#"
        CREATE TABLE events_published (
            job_id INTEGER PRIMARY KEY,
            seq INTEGER NOT NULL
        );
        "#,
    ),
    // The launch deadline (lifecycle::decide): when the current attempt's launch clock
    // started (its launch intent, or its Pod's binding after it waited for a node), and the
    // launch timeouts in a row so far. A Pod's node, and when it started terminating with
    // which grace period (a Pod stuck terminating on a node that is not Ready is forced).
    // The live cancels, indexed: the operator reads them on every pass.
    M::up(
        r#"
        ALTER TABLE jobs ADD COLUMN launched_at_ms INTEGER;
        ALTER TABLE jobs ADD COLUMN launch_timeouts INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE pod_observations ADD COLUMN node TEXT NOT NULL DEFAULT '';
        ALTER TABLE pod_observations ADD COLUMN terminating_since_ms INTEGER;
        ALTER TABLE pod_observations ADD COLUMN grace_seconds INTEGER;
        CREATE INDEX jobs_cancels ON jobs (id)
            WHERE cancel_requested = 1 AND schedule_state != 'Done';
        "#,
    ),
    // Pipelines (lifecycle::tasks): the current task, the attempt at which it began, when
    // it first ran, and every task's record (JSON, as `status.tasks[]`).
    M::up(
        r#"
        ALTER TABLE jobs ADD COLUMN task_index INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN task_first_attempt INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE jobs ADD COLUMN task_started_at_ms INTEGER;
        ALTER TABLE jobs ADD COLUMN tasks TEXT NOT NULL DEFAULT '[]';
        "#,
    ),
    // A job's place in its queue is when it entered it (the object's creation, or when it
    // gave its run slot back because no node took its Pod: the back of its priority, as
    // Kueue requeues by eviction time), and when its current Pod began waiting for a node.
    M::up(
        r#"
        ALTER TABLE jobs RENAME COLUMN created_at_ms TO queued_at_ms;
        ALTER TABLE jobs ADD COLUMN node_wait_since_ms INTEGER;
        "#,
    ),
    // Failure rules (lifecycle::rules): relaunches an Ignore decided, each ended attempt's
    // record (JSON, as `status.attempts[]`), what a Pod showed that a rule reads (JSON,
    // lifecycle::Evidence), and the attempts decided per action and source since the store
    // began (the `managedjobs_attempts_total` counter).
    M::up(
        r#"
        ALTER TABLE jobs ADD COLUMN ignored_count INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN attempts TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE pod_observations ADD COLUMN evidence TEXT NOT NULL DEFAULT '{}';
        CREATE TABLE attempt_actions (
            action TEXT NOT NULL,
            decided_by TEXT NOT NULL,
            count INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (action, decided_by)
        );
        "#,
    ),
    // Queues for teams (crate::queues): each job's queue and why it waits; each queue's
    // waiting jobs in admission order, and its jobs holding slots, indexed (a scheduling
    // pass reads a few queues' heads and every queue's usage).
    M::up(
        r#"
        ALTER TABLE jobs ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';
        ALTER TABLE jobs ADD COLUMN wait_reason TEXT;
        CREATE INDEX jobs_waiting_by_queue ON jobs (queue, priority DESC, queued_at_ms, id)
            WHERE schedule_state = 'Waiting';
        CREATE INDEX jobs_live_by_queue ON jobs (queue, schedule_state)
            WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting');
        "#,
    ),
    // Multi-node jobs (executor::pod, one Pod per rank): when each Pod ended (the first of a
    // gang's members to end badly decides), and the members of rank 1 and above (rank 0 stays in
    // pod_observations, as job controllers of earlier releases read it).
    M::up(
        r#"
        ALTER TABLE pod_observations ADD COLUMN ended_at_ms INTEGER;
        ALTER TABLE jobs ADD COLUMN ready_nodes TEXT;
        CREATE TABLE pod_members (
            job_id INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            rank INTEGER NOT NULL,
            pod_name TEXT NOT NULL,
            state TEXT NOT NULL,
            exit_code INTEGER,
            reason TEXT NOT NULL DEFAULT '',
            message TEXT NOT NULL DEFAULT '',
            deleted INTEGER NOT NULL DEFAULT 0,
            observed_at_ms INTEGER NOT NULL,
            node TEXT NOT NULL DEFAULT '',
            terminating_since_ms INTEGER,
            grace_seconds INTEGER,
            evidence TEXT NOT NULL DEFAULT '{}',
            ended_at_ms INTEGER,
            PRIMARY KEY (job_id, attempt, rank)
        );
        "#,
    ),
    // One owner per job (lifecycle::claim): this store's claim on each namespace it acts in,
    // as its operator last held it (the epoch, the holder identity, when its last renewal was
    // sent: NULL when it no longer holds it), which its job controllers read before launching
    // anything.
    M::up(
        r#"
        CREATE TABLE claims (
            namespace TEXT PRIMARY KEY,
            holder TEXT NOT NULL,
            epoch INTEGER NOT NULL,
            renewed_at_ms INTEGER,
            duration_ms INTEGER NOT NULL
        );
        "#,
    ),
    // Stopping without failing (lifecycle::transitions::suspended, preempted): who set
    // spec.suspend, a preemption asked of a job's controller, the queue that took its slot and
    // when (each queue's rate limit reads the recent ones through jobs_preempted), how often,
    // and when its current attempt began to run (a queue's minRunSeconds).
    M::up(
        r#"
        ALTER TABLE jobs ADD COLUMN suspended_by TEXT;
        ALTER TABLE jobs ADD COLUMN preempt_requested INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN preempted_by TEXT;
        ALTER TABLE jobs ADD COLUMN preempted_at_ms INTEGER;
        ALTER TABLE jobs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN running_since_ms INTEGER;
        CREATE INDEX jobs_preempted ON jobs (preempted_at_ms, preempted_by)
            WHERE preempted_at_ms IS NOT NULL;
        "#,
    ),
    // The visibility API (crate::visibility): each queue's most recently finished jobs, for the
    // estimated start of its waiting ones (their run times), without reading every finished job;
    // and the counts of waiting, launching and running jobs per namespace and queue sampled
    // every few seconds (store::visibility::record_samples), for the dashboard's plot of the
    // last hour. Samples are pruned as they age (an hour and a margin): the table stays small.
    // The suspended (Inactive) jobs by their own partial index, as the other states have.
    M::up(
        r#"
        CREATE INDEX jobs_finished_by_queue ON jobs (queue, finished_at_ms)
            WHERE finished_at_ms IS NOT NULL AND started_at_ms IS NOT NULL;
        CREATE TABLE samples (
            at_ms INTEGER NOT NULL,
            namespace TEXT NOT NULL,
            queue TEXT NOT NULL,
            waiting INTEGER NOT NULL,
            launching INTEGER NOT NULL,
            running INTEGER NOT NULL
        );
        CREATE INDEX samples_by_time ON samples (at_ms);
        CREATE INDEX jobs_inactive ON jobs (id) WHERE schedule_state = 'Inactive';
        "#,
    ),
    // Step 13: the status writer's order over the unwritten statuses only
    // (`Store::unsynced_brief`),
    // so its next writes cost O(writes) however large the backlog a burst leaves.
    M::up(
        r#"
        CREATE INDEX jobs_unsynced_order ON jobs (
            (CASE schedule_state WHEN 'Done' THEN 0 WHEN 'Launching' THEN 3
                WHEN 'Alive' THEN 2 WHEN 'AliveWaiting' THEN 2 ELSE 1 END), id)
            WHERE status_version > synced_version;
        "#,
    ),
    // Step 14 (issue 43): FIFO in the order the API server accepted the jobs, and every waiting
    // job told why it waits.
    // - `entry_version`: the resourceVersion a job was first seen at (lifecycle::entry), which
    //   breaks ties of `queued_at_ms` inside one second; rows of earlier releases have none
    //   (''), so inside their second they keep their order by id. The indexes of the queues'
    //   order are rebuilt with it.
    // - `reason_key`: a digest of the reason a pass last told a waiting job
    //   (scheduler::tell_waiting), indexed by queue and namespace: a pass finds the groups whose
    //   jobs must be told again by an index seek each, at any queue length.
    // - The status writer's order puts a waiting job whose only unwritten change is its reason
    //   (`unsynced_since_seq` = i64::MAX, Store::tell_waiting) after every other status.
    // The indexes these replace are dropped: an index holds nothing of its own, and no build
    // that could read this store names them (job controllers of other builds are stopped
    // before a migration; the CLI reads only a store of its own step).
    M::up(
        r#"
        ALTER TABLE jobs ADD COLUMN entry_version TEXT NOT NULL DEFAULT '';
        ALTER TABLE jobs ADD COLUMN reason_key INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX jobs_queue_order
            ON jobs (schedule_state, priority DESC, queued_at_ms, entry_version, id)
            WHERE schedule_state IN ('Waiting', 'AliveWaiting');
        CREATE INDEX jobs_waiting_in_order
            ON jobs (queue, priority DESC, queued_at_ms, entry_version, id)
            WHERE schedule_state = 'Waiting';
        CREATE INDEX jobs_waiting_told ON jobs (queue, namespace, reason_key)
            WHERE schedule_state = 'Waiting';
        CREATE INDEX jobs_unsynced_in_order ON jobs (
            (CASE WHEN unsynced_since_seq = 9223372036854775807 THEN 4
                WHEN schedule_state = 'Done' THEN 0 WHEN schedule_state = 'Launching' THEN 3
                WHEN schedule_state IN ('Alive', 'AliveWaiting') THEN 2 ELSE 1 END), id)
            WHERE status_version > synced_version;
        DROP INDEX jobs_queue;
        DROP INDEX jobs_waiting_by_queue;
        DROP INDEX jobs_unsynced_order;
        "#,
    ),
    // Step 15: resources (issue 44): what each task's attempt needs, computed at submission
    // (filled for the jobs of earlier releases when the operator opens the store:
    // `Store::fill_demands`), the pool an attempt was admitted onto and what it adds to its
    // Pods; the live jobs by pool, for the quota a queue uses.
    M::up(
        r#"
        ALTER TABLE jobs ADD COLUMN demands TEXT NOT NULL DEFAULT '[]';
        ALTER TABLE jobs ADD COLUMN pool TEXT;
        ALTER TABLE jobs ADD COLUMN placement TEXT;
        CREATE INDEX jobs_live_by_pool ON jobs (queue, pool)
            WHERE schedule_state IN ('Launching', 'Alive', 'AliveWaiting') AND pool IS NOT NULL;
        "#,
    ),
    // Step 16: a count of changes per queue (issue 44: a scheduling pass keeps what it read of
    // a queue until it changes, `super::memo`): every insert and delete of a job, and every
    // update that changes a column a pass reads of it (`super::memo::ADMISSION_READS`; a unit
    // test holds the list, this trigger and the pass's queries together), counts one on its
    // queue, whichever process writes. The Waiting jobs in a back-off, by queue: when the next
    // one of a queue ends (a pass's read of the queue holds until then).
    M::up(
        r#"
        CREATE TABLE queue_changes (queue TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
        INSERT INTO queue_changes (queue, n) SELECT DISTINCT queue, 1 FROM jobs;
        CREATE INDEX jobs_waiting_backoff ON jobs (queue, backoff_until_ms)
            WHERE schedule_state = 'Waiting' AND backoff_until_ms IS NOT NULL;
        CREATE TRIGGER jobs_queue_changes_insert AFTER INSERT ON jobs BEGIN
            INSERT INTO queue_changes (queue, n) VALUES (NEW.queue, 1)
                ON CONFLICT (queue) DO UPDATE SET n = n + 1;
        END;
        CREATE TRIGGER jobs_queue_changes_delete AFTER DELETE ON jobs BEGIN
            INSERT INTO queue_changes (queue, n) VALUES (OLD.queue, 1)
                ON CONFLICT (queue) DO UPDATE SET n = n + 1;
        END;
        CREATE TRIGGER jobs_queue_changes_update AFTER UPDATE ON jobs
        WHEN OLD.id IS NOT NEW.id OR OLD.uid IS NOT NEW.uid OR OLD.queue IS NOT NEW.queue
            OR OLD.namespace IS NOT NEW.namespace OR OLD.priority IS NOT NEW.priority
            OR OLD.queued_at_ms IS NOT NEW.queued_at_ms
            OR OLD.entry_version IS NOT NEW.entry_version
            OR OLD.reason_key IS NOT NEW.reason_key
            OR OLD.schedule_state IS NOT NEW.schedule_state
            OR OLD.cancel_requested IS NOT NEW.cancel_requested
            OR OLD.backoff_until_ms IS NOT NEW.backoff_until_ms
            OR OLD.demands IS NOT NEW.demands OR OLD.task_index IS NOT NEW.task_index
            OR OLD.pool IS NOT NEW.pool OR OLD.placement IS NOT NEW.placement
            OR OLD.attempt IS NOT NEW.attempt OR OLD.phase IS NOT NEW.phase
            OR OLD.spec IS NOT NEW.spec OR OLD.running_since_ms IS NOT NEW.running_since_ms
            OR OLD.preempt_requested IS NOT NEW.preempt_requested
            OR OLD.preempted_by IS NOT NEW.preempted_by
        BEGIN
            INSERT INTO queue_changes (queue, n) VALUES (NEW.queue, 1)
                ON CONFLICT (queue) DO UPDATE SET n = n + 1;
            INSERT INTO queue_changes (queue, n) SELECT OLD.queue, 1 WHERE OLD.queue IS NOT NEW.queue
                ON CONFLICT (queue) DO UPDATE SET n = n + 1;
        END;
        "#,
    ),
];
