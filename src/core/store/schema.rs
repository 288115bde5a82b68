//! The SQLite schema, its version in `PRAGMA user_version`, and the migrations between versions.
//!
//! Each migration step runs in its own `IMMEDIATE` transaction and re-reads the version inside it,
//! so two processes opening a fresh data directory at once migrate it exactly once. A database is
//! recognised as a world by `PRAGMA application_id`; a foreign or newer database is refused with
//! a clear error instead of being written to.

use crate::core::error::{Result, WorldError};
use rusqlite::{Connection, TransactionBehavior};

/// `application_id` of a world's `events.db` ("LWWD").
pub const APPLICATION_ID: i32 = 0x4C57_5744;

/// The steps from version N to N+1; the schema version is their count.
const MIGRATIONS: &[&str] = &[
    // 1: the event log.
    "CREATE TABLE events (
        run_id          TEXT    NOT NULL,
        sequence        INTEGER NOT NULL CHECK (sequence >= 1),
        event_id        TEXT    NOT NULL,
        type            TEXT    NOT NULL,
        idempotency_key TEXT,
        request_digest  TEXT,
        recorded_at     TEXT    NOT NULL,
        envelope        TEXT    NOT NULL,
        UNIQUE (run_id, sequence)
    );
    CREATE UNIQUE INDEX events_idempotency
        ON events (run_id, idempotency_key) WHERE idempotency_key IS NOT NULL;",
    // 2: the terminal events of run-event streams, one row per ended run (node_id '') or node, so
    // an append can refuse what follows a run's end, or a node's second terminal, without a
    // scan. The primary key is the backstop. Rows stored before this version are backfilled.
    "CREATE TABLE terminals (
        run_id   TEXT    NOT NULL,
        node_id  TEXT    NOT NULL,
        sequence INTEGER NOT NULL,
        type     TEXT    NOT NULL,
        PRIMARY KEY (run_id, node_id)
    ) WITHOUT ROWID;
    INSERT OR IGNORE INTO terminals (run_id, node_id, sequence, type)
        SELECT run_id,
               CASE WHEN type IN ('run:completed', 'run:failed', 'run:cancelled', 'session:cancelled') THEN ''
                    ELSE json_extract(envelope, '$.payload.nodeId') END,
               sequence, type
        FROM events
        WHERE type IN ('run:completed', 'run:failed', 'run:cancelled', 'session:cancelled')
           OR (type IN ('node:completed', 'node:failed', 'node:skipped')
               AND json_type(envelope, '$.payload.nodeId') = 'text')
        ORDER BY run_id, sequence;",
    // 3: what each stream has committed and not released of each model's budget estimates (seed
    // 004, ADR-0074), so an append can refuse a release of more than that, which the cost restore
    // would read as a damaged log, without a scan. Only the open amount is kept: the checks keep it
    // within 0 ..= 2^53 - 1, where gross sums could overflow. Rows stored before are summed in by
    // [`backfill_estimates`].
    "CREATE TABLE estimates (
        run_id TEXT    NOT NULL,
        model  TEXT    NOT NULL,
        open   INTEGER NOT NULL,
        PRIMARY KEY (run_id, model)
    ) WITHOUT ROWID;",
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Check that `conn` is a world, or an empty database, that this build can open; returns its
/// schema version. Reads only, so a foreign database is never touched.
pub fn check(conn: &Connection, db_path: &str) -> Result<i32> {
    // One statement, so one snapshot: another process may be migrating this very file, and
    // reading its application id before and its tables after that commit would look foreign.
    let (app_id, version, tables): (i32, i32, i64) = conn
        .query_row(
            "SELECT (SELECT application_id FROM pragma_application_id),
                    (SELECT user_version FROM pragma_user_version),
                    (SELECT count(*) FROM sqlite_schema WHERE type = 'table')",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(|e| WorldError::sqlite("reading the schema", e))?;
    if app_id != 0 && app_id != APPLICATION_ID {
        return Err(WorldError::Path {
            message: format!("{db_path} is not a little-workflow world (application_id {app_id:#x})"),
        });
    }
    // Every world has its application id, set in the transaction that creates its tables. Another
    // application's database may have set a user_version of its own, so that is no sign of one.
    if app_id == 0 && (tables > 0 || version != 0) {
        return Err(WorldError::Path {
            message: format!("{db_path} is a SQLite database of another application, not a little-workflow world"),
        });
    }
    if version > SCHEMA_VERSION {
        return Err(WorldError::Path {
            message: format!(
                "{db_path} has schema version {version}, newer than this build's {SCHEMA_VERSION}: upgrade @little-workflow/world"
            ),
        });
    }
    Ok(version)
}

/// Check that `conn` is a world (or empty) and bring its schema up to [`SCHEMA_VERSION`].
pub fn migrate(conn: &mut Connection, db_path: &str) -> Result<()> {
    let version = check(conn, db_path)?;
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
        let target = step as i32 + 1;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| WorldError::sqlite("starting a migration", e))?;
        let current: i32 = tx
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| WorldError::sqlite("reading PRAGMA user_version", e))?;
        if current >= target {
            continue; // another process migrated meanwhile; the transaction rolls back on drop
        }
        tx.execute_batch(sql)
            .and_then(|()| if target == 3 { backfill_estimates(&tx) } else { Ok(()) })
            .map_err(|e| WorldError::sqlite(format!("migrating to schema {target}"), e))?;
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .and_then(|_| tx.pragma_update(None, "user_version", target))
            .map_err(|e| WorldError::sqlite("recording the schema version", e))?;
        tx.commit()
            .map_err(|e| WorldError::sqlite(format!("committing schema {target}"), e))?;
    }
    Ok(())
}

/// Fill `estimates` from the budget-estimate rows already stored: each stream's and model's
/// commitments less its releases, summed exactly (gross sums can pass what an i64, or a double
/// exactly, holds), and clamped to 0 ..= 2^53 - 1 (a legacy over-release leaves nothing open).
fn backfill_estimates(conn: &Connection) -> rusqlite::Result<()> {
    use crate::core::run_events;
    let mut open: std::collections::BTreeMap<(String, String), i128> = Default::default();
    let mut rows = conn.prepare(
        "SELECT run_id, type, json_extract(envelope, '$.payload') FROM events
         WHERE type IN ('budget:estimate_committed', 'budget:estimate_released')",
    )?;
    let mut cursor = rows.query([])?;
    while let Some(row) = cursor.next()? {
        let (t, payload): (String, String) = (row.get(1)?, row.get(2)?);
        let Ok(serde_json::Value::Object(fields)) = crate::core::canonical::parse(&payload) else {
            continue;
        };
        if let Some((model, _, amount, released)) = run_events::estimate_of(&t, &fields) {
            let delta = if released {
                -i128::from(amount)
            } else {
                i128::from(amount)
            };
            *open.entry((row.get(0)?, model.to_string())).or_default() += delta;
        }
    }
    let max = crate::core::events::known::MAX_SAFE_INTEGER as i128;
    let mut insert = conn.prepare("INSERT INTO estimates (run_id, model, open) VALUES (?1, ?2, ?3)")?;
    for ((run, model), sum) in open {
        insert.execute(rusqlite::params![run, model, sum.clamp(0, max) as i64])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pragma_i32(conn: &Connection, name: &str) -> Result<i32> {
        conn.pragma_query_value(None, name, |r| r.get(0))
            .map_err(|e| WorldError::sqlite(format!("reading PRAGMA {name}"), e))
    }

    #[test]
    fn migrates_a_fresh_database_once() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, ":memory:").unwrap();
        assert_eq!(pragma_i32(&conn, "user_version").unwrap(), SCHEMA_VERSION);
        assert_eq!(pragma_i32(&conn, "application_id").unwrap(), APPLICATION_ID);
        migrate(&mut conn, ":memory:").unwrap();
        assert_eq!(pragma_i32(&conn, "user_version").unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn refuses_foreign_and_newer_databases() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE accounts (id INTEGER)").unwrap();
        assert_eq!(migrate(&mut conn, "x").unwrap_err().code(), "WORLD_PATH");

        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "application_id", 42).unwrap();
        assert_eq!(migrate(&mut conn, "x").unwrap_err().code(), "WORLD_PATH");

        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, "x").unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
        let err = migrate(&mut conn, "x").unwrap_err();
        assert_eq!(err.code(), "WORLD_PATH");
        assert!(err.to_string().contains("newer"));
    }
}
