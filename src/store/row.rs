//! The job record in SQL: every statement on the `jobs` table's record columns is built from
//! the record's one declaration ([`JobRow::COLUMNS`]), so a field added to the record is read,
//! inserted and updated with no other change here. A row is read by position (which costs
//! nothing; rusqlite's lookup by name compares it with every column name, once per column per
//! row: a tenth of the operator's CPU when measured under load).

use std::sync::OnceLock;

use rusqlite::Row;
use rusqlite::types::{ToSqlOutput, ValueRef};

use super::StoreError;
use crate::lifecycle::record::{ColumnKind, DecodeError, JobRow, Value};

/// Every column of the record, comma-separated, in [`JobRow::COLUMNS`]' order: what a SELECT
/// lists for [`from_row`].
pub(super) fn select_list() -> &'static str {
    static LIST: OnceLock<String> = OnceLock::new();
    LIST.get_or_init(|| {
        JobRow::COLUMNS
            .iter()
            .map(|c| c.name)
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// `INSERT INTO jobs (every column) VALUES (?1, ..., ?N)`, bound with [`insert_values`].
pub(super) fn insert_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let marks: Vec<String> = (1..=JobRow::COLUMNS.len())
            .map(|i| format!("?{i}"))
            .collect();
        format!(
            "INSERT INTO jobs ({}) VALUES ({})",
            select_list(),
            marks.join(", ")
        )
    })
}

/// `UPDATE jobs SET (every column a transition changes) = ... WHERE id = ?1`, bound with
/// [`update_values`].
pub(super) fn update_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let sets: Vec<String> = JobRow::COLUMNS
            .iter()
            .filter(|c| c.kind == ColumnKind::State)
            .enumerate()
            .map(|(i, c)| format!("{} = ?{}", c.name, i + 2))
            .collect();
        format!("UPDATE jobs SET {} WHERE id = ?1", sets.join(", "))
    })
}

/// A column's value as SQLite takes it.
pub(super) struct Bound(Value);

impl rusqlite::ToSql for Bound {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match &self.0 {
            Value::Null => ToSqlOutput::Borrowed(ValueRef::Null),
            Value::Integer(n) => ToSqlOutput::Borrowed(ValueRef::Integer(*n)),
            Value::Text(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        })
    }
}

/// The values of [`insert_sql`]: every column, the id NULL (the store assigns one) unless
/// `keep_id`.
pub(super) fn insert_values(record: &JobRow, keep_id: bool) -> Vec<Bound> {
    record
        .to_values()
        .into_iter()
        .zip(JobRow::COLUMNS)
        .map(|(v, c)| match c.kind {
            ColumnKind::Key if !keep_id => Bound(Value::Null),
            _ => Bound(v),
        })
        .collect()
}

/// The values of [`update_sql`]: the id, then every column a transition changes.
pub(super) fn update_values(record: &JobRow) -> Vec<Bound> {
    let mut out = vec![Bound(Value::Integer(record.id))];
    out.extend(
        record
            .to_values()
            .into_iter()
            .zip(JobRow::COLUMNS)
            .filter(|(_, c)| c.kind == ColumnKind::State)
            .map(|(v, _)| Bound(v)),
    );
    out
}

fn corrupt(job_id: i64, e: DecodeError) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(StoreError::Corrupt {
        job_id,
        what: e.to_string(),
    }))
}

/// Reads a row selected with [`select_list`].
pub(super) fn from_row(row: &Row<'_>) -> rusqlite::Result<JobRow> {
    let id: i64 = row.get(0)?;
    JobRow::from_values(
        |i| {
            Ok(match row.get_ref(i)? {
                ValueRef::Null => Value::Null,
                ValueRef::Integer(n) => Value::Integer(n),
                ValueRef::Text(t) => Value::Text(
                    std::str::from_utf8(t)
                        .map_err(|e| {
                            rusqlite::Error::FromSqlConversionFailure(
                                i,
                                rusqlite::types::Type::Text,
                                Box::new(e),
                            )
                        })?
                        .to_string(),
                ),
                other => {
                    return Err(rusqlite::Error::InvalidColumnType(
                        i,
                        JobRow::COLUMNS[i].name.into(),
                        other.data_type(),
                    ));
                }
            })
        },
        |e| corrupt(id, e),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statements list every column of the record, the id first, and the UPDATE leaves the
    /// object's identity and spec alone.
    #[test]
    fn the_statements_follow_the_record() {
        let listed: Vec<&str> = select_list().split(", ").collect();
        assert_eq!(listed.len(), JobRow::COLUMNS.len());
        assert_eq!(listed[0], "id");
        assert!(insert_sql().ends_with(&format!("?{})", JobRow::COLUMNS.len())));
        let update = update_sql().split(" WHERE").next().unwrap();
        for fixed in ["uid =", "namespace =", "spec =", "executor =", "id ="] {
            assert!(!update.contains(&format!(" {fixed}")), "{update}");
        }
        assert!(update.contains("phase = ?"), "{update}");
    }
}
