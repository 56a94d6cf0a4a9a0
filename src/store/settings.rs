//! The configuration the operator shares with its job controllers and the CLI: one typed value,
//! stored as JSON under one key of the `settings` table.

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::{Result, Store};
use crate::api::ExecutorKind;
use crate::capacity::Caps;
use crate::defaults;

const KEY: &str = "settings";

/// What the operator in charge of a state dir runs with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// Executors enabled (`--executors`).
    pub executors: Vec<ExecutorKind>,
    /// Grace between SIGTERM and SIGKILL when stopping a workload, ms (`--cancel-grace`).
    pub cancel_grace_ms: u64,
    /// First restart back-off, ms; doubles per restart up to
    /// [`crate::lifecycle::MAX_BACKOFF`] (`--restart-backoff-seconds`).
    pub restart_backoff_ms: u64,
    /// Caps in force (None before an operator wrote them).
    pub caps: Option<Caps>,
    /// How long a launched workload may take to start running, ms (`--launch-timeout-seconds`).
    #[serde(default = "default_launch_timeout_ms")]
    pub launch_timeout_ms: u64,
    /// Launch timeouts in a row that end a job FailedNoResource (`--max-launch-timeouts`).
    #[serde(default = "default_max_launch_timeouts")]
    pub max_launch_timeouts: i32,
    /// How the caps were derived and which limit binds ([`crate::capacity::Capacity`]'s
    /// sentence), shown by `managed-jobs queue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<String>,
    /// The shard the operator owns (`--shard`; None: the default instance): its job
    /// controllers label their Pods with it, and another shard's operator refuses this store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Claims are in force (`lifecycle::claim`): the operator holds a claim on each namespace it
    /// acts in, and its job controllers launch only under a claim it renewed lately (their
    /// [`crate::lifecycle::claim::Gate`]). False for an engine run without an API.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub claims: bool,
    /// Multi-node jobs get a PodGroup with the gang policy where the API serves one
    /// (`--gang-scheduling`; an older operator's settings read as on).
    #[serde(default = "default_true")]
    pub gang_scheduling: bool,
    /// Bytes of the end of each container's log a pod job's controller keeps per attempt in
    /// the state dir (`--kept-log-bytes`; 0: none; an older operator's settings read as the
    /// default).
    #[serde(default = "default_kept_log_bytes")]
    pub kept_log_bytes: u64,
}

fn default_true() -> bool {
    true
}

fn default_launch_timeout_ms() -> u64 {
    defaults::LAUNCH_TIMEOUT.as_millis() as u64
}

fn default_max_launch_timeouts() -> i32 {
    defaults::MAX_LAUNCH_TIMEOUTS
}

fn default_kept_log_bytes() -> u64 {
    defaults::KEPT_LOG_BYTES
}

impl Default for Settings {
    /// The values a job controller uses when no operator wrote any (the `run` flags' defaults).
    fn default() -> Settings {
        Settings {
            executors: vec![ExecutorKind::Local],
            cancel_grace_ms: defaults::seconds(defaults::CANCEL_GRACE_SECONDS).as_millis() as u64,
            restart_backoff_ms: defaults::seconds(defaults::RESTART_BACKOFF_SECONDS).as_millis()
                as u64,
            caps: None,
            launch_timeout_ms: default_launch_timeout_ms(),
            max_launch_timeouts: default_max_launch_timeouts(),
            capacity: None,
            shard: None,
            claims: false,
            gang_scheduling: true,
            kept_log_bytes: default_kept_log_bytes(),
        }
    }
}

impl Store {
    /// The settings the operator wrote, or the defaults when none (or unreadable ones: a newer
    /// operator's) were written.
    pub fn settings(&self) -> Result<Settings> {
        let text: Option<String> = self
            .conn
            .prepare_cached("SELECT value FROM settings WHERE key = ?1")?
            .query_row([KEY], |r| r.get(0))
            .optional()?;
        Ok(text
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default())
    }

    /// Writes `now_ms` under the key `heartbeat`: the engine's probe that the store can be
    /// written.
    pub fn heartbeat(&mut self, now_ms: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO settings (key, value) VALUES ('heartbeat', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )?
            .execute(params![now_ms.to_string()])?;
        Ok(())
    }

    /// Writes the settings (the operator, at start).
    pub fn set_settings(&mut self, settings: &Settings) -> Result<()> {
        let text = serde_json::to_string(settings).expect("settings serialize");
        self.conn
            .prepare_cached(
                "INSERT INTO settings (key, value) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )?
            .execute(params![KEY, text])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_default() {
        let mut store = Store::in_memory().unwrap();
        assert_eq!(store.settings().unwrap(), Settings::default());
        let s = Settings {
            executors: vec![ExecutorKind::Local, ExecutorKind::Pod],
            cancel_grace_ms: 100,
            restart_backoff_ms: 7,
            caps: Some(Caps {
                launch: 8,
                run: 100,
            }),
            launch_timeout_ms: 2_000,
            max_launch_timeouts: 2,
            capacity: Some("launch cap 8".into()),
            shard: Some("a".into()),
            claims: true,
            gang_scheduling: true,
            kept_log_bytes: 4096,
        };
        store.set_settings(&s).unwrap();
        assert_eq!(store.settings().unwrap(), s);
    }
}
