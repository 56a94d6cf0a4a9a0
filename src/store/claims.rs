//! This store's claims (`lifecycle::claim`): which namespaces' jobs its operator owns, as its
//! operator last held them, and the store's own identity (the holder identity of its claims).

use rusqlite::{OptionalExtension, params};

use super::{Result, Store};
use crate::lifecycle::claim::{Gate, Timing};

/// One namespace's claim as this store records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRow {
    /// The namespace whose jobs (of this store's shard) the claim covers.
    pub namespace: String,
    /// The holder identity this store's operator used.
    pub holder: String,
    /// The epoch (the Lease's `leaseTransitions`) it last held.
    pub epoch: i64,
    /// When its last successful renewal was sent (ms since the epoch); None: it no longer holds
    /// the claim (lost, released, or never taken since the store was claimed for another).
    pub renewed_at_ms: Option<i64>,
    /// The claim's duration, ms.
    pub duration_ms: i64,
}

impl ClaimRow {
    /// What the claim allows a job controller of this namespace ([`Gate::of`]).
    pub fn gate(&self) -> Gate {
        let timing = Timing::new(std::time::Duration::from_millis(
            self.duration_ms.max(0) as u64
        ));
        Gate::of(self.renewed_at_ms, &timing)
    }
}

fn from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ClaimRow> {
    Ok(ClaimRow {
        namespace: r.get(0)?,
        holder: r.get(1)?,
        epoch: r.get(2)?,
        renewed_at_ms: r.get(3)?,
        duration_ms: r.get(4)?,
    })
}

impl Store {
    /// This store's identity, 12 hex digits, made at its first call and kept with the store:
    /// an operator restarted on the same state dir is the same claim holder and renews its
    /// claims at once, while another store waits for them to lapse.
    pub fn instance_id(&mut self) -> Result<String> {
        self.conn
            .prepare_cached(
                "INSERT INTO settings (key, value) VALUES ('instance', lower(hex(randomblob(6))))
                 ON CONFLICT (key) DO NOTHING",
            )?
            .execute([])?;
        Ok(self
            .conn
            .prepare_cached("SELECT value FROM settings WHERE key = 'instance'")?
            .query_row([], |r| r.get(0))?)
    }

    /// Sets this store's identity (a store rebuilt where its predecessor ran succeeds its
    /// identity: `lifecycle::claim::successor_store`).
    pub fn set_instance_id(&mut self, id: &str) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO settings (key, value) VALUES ('instance', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )?
            .execute([id])?;
        Ok(())
    }

    /// Records the operator process driving this store (pid, start time in clock ticks since
    /// boot): its job controllers tell whether it still runs.
    pub fn set_operator(&mut self, pid: i32, start_time: u64) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO settings (key, value) VALUES ('operator', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )?
            .execute([format!("{pid} {start_time}")])?;
        Ok(())
    }

    /// The operator process last recorded ([`Store::set_operator`]), if any.
    pub fn operator(&self) -> Result<Option<(i32, u64)>> {
        let text: Option<String> = self
            .conn
            .prepare_cached("SELECT value FROM settings WHERE key = 'operator'")?
            .query_row([], |r| r.get(0))
            .optional()?;
        Ok(text.and_then(|t| {
            let (pid, start) = t.split_once(' ')?;
            Some((pid.parse().ok()?, start.parse().ok()?))
        }))
    }

    /// The claim on `namespace`, if this store ever held it.
    pub fn claim(&self, namespace: &str) -> Result<Option<ClaimRow>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT namespace, holder, epoch, renewed_at_ms, duration_ms
                 FROM claims WHERE namespace = ?1",
            )?
            .query_row([namespace], from_row)
            .optional()?)
    }

    /// Every claim this store ever held, by namespace.
    pub fn claims(&self) -> Result<Vec<ClaimRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT namespace, holder, epoch, renewed_at_ms, duration_ms
             FROM claims ORDER BY namespace",
        )?;
        let rows = stmt.query_map([], from_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Records the claim on `claim.namespace` as its operator now holds it (or no longer does:
    /// `renewed_at_ms` None).
    pub fn set_claim(&mut self, claim: &ClaimRow) -> Result<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO claims (namespace, holder, epoch, renewed_at_ms, duration_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (namespace) DO UPDATE SET holder = excluded.holder,
                    epoch = excluded.epoch, renewed_at_ms = excluded.renewed_at_ms,
                    duration_ms = excluded.duration_ms",
            )?
            .execute(params![
                claim.namespace,
                claim.holder,
                claim.epoch,
                claim.renewed_at_ms,
                claim.duration_ms
            ])?;
        Ok(())
    }

    /// What a job controller of a job in `namespace` may do: [`Gate::OPEN`] when claims are not
    /// in force (no operator with an API wrote [`super::Settings::claims`]), else the gate of
    /// this store's claim on the namespace (none held: nothing may be launched).
    pub fn gate(&self, namespace: &str, claims_in_force: bool) -> Result<Gate> {
        if !claims_in_force {
            return Ok(Gate::OPEN);
        }
        Ok(match self.claim(namespace)? {
            Some(c) => c.gate(),
            None => Gate::of(None, &Timing::new(std::time::Duration::ZERO)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_made_once_and_claims_round_trip() {
        let mut store = Store::in_memory().unwrap();
        let id = store.instance_id().unwrap();
        assert_eq!(id.len(), 12);
        assert_eq!(store.instance_id().unwrap(), id);
        assert_eq!(store.claim("ns").unwrap(), None);
        assert_eq!(store.gate("ns", false).unwrap(), Gate::OPEN);
        assert!(!store.gate("ns", true).unwrap().may_launch(0));
        let c = ClaimRow {
            namespace: "ns".into(),
            holder: id.clone(),
            epoch: 3,
            renewed_at_ms: Some(10_000),
            duration_ms: 15_000,
        };
        store.set_claim(&c).unwrap();
        assert_eq!(store.claim("ns").unwrap(), Some(c.clone()));
        let gate = store.gate("ns", true).unwrap();
        assert!(gate.may_launch(19_999) && !gate.may_launch(20_000));
        assert!(gate.lapsed(25_000));
        store
            .set_claim(&ClaimRow {
                renewed_at_ms: None,
                ..c
            })
            .unwrap();
        assert!(!store.gate("ns", true).unwrap().may_launch(0));
        assert_eq!(store.claims().unwrap().len(), 1);
        assert_eq!(store.operator().unwrap(), None);
        store.set_operator(42, 7).unwrap();
        assert_eq!(store.operator().unwrap(), Some((42, 7)));
    }
}
