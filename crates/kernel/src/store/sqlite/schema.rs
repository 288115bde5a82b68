//! The SQLite schema, its version in `PRAGMA user_version`, and the migrations between versions.
//!
//! An open brings the schema up to date in one `IMMEDIATE` transaction that re-reads the version
//! inside it, so two processes opening a data directory at once migrate it exactly once, and a
//! failed upgrade leaves the database at the version it had (a step at a time, a failure in a
//! later step had left it at one no earlier build could open and this one could not finish). A
//! database is recognised as a world by `PRAGMA application_id`; a foreign or newer database is
//! refused with a clear error instead of being written to.
//!
//! Rows stored before a step are folded into its tables in Rust ([`backfill_terminals`],
//! [`backfill_estimates`], [`backfill_usage`]), as the reads see them: SQLite's JSON functions stop at 1,000 levels,
//! one short of an envelope around a payload nested as deep as a payload may be.
//!
//! Since schema 4, every insert into `events` must come from a writer of this schema: a process of
//! an earlier version that already had the world open when it was upgraded would otherwise go on
//! appending without keeping the tables it does not know. Writers of schemas 1-3 meet the
//! `events_writer` trigger, which stops them. This build's writer skips triggers (see
//! [`fence_writer`]) and is fenced by the schema version instead: each write transaction that
//! finds another connection's commit since its own last one reads `user_version` again, under
//! the write lock, and appends nothing once it is past [`SCHEMA_VERSION`]. A later version's
//! upgrade must therefore raise `user_version` (every migration does) and, for the writers of
//! schema 4 built before `fence_writer`, which do run the trigger, make it call
//! `little_world_writer` with the new number (schema 5 does).

use crate::canonical;
use crate::catalog;
use crate::error::{Result, WorldError};
use crate::vocabulary::{self, Effects};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, TransactionBehavior};
use serde_json::{Map, Value};

/// `application_id` of a world's `events.db` ("LWWD").
pub const APPLICATION_ID: i32 = 0x4C57_5744;

/// The steps from version N to N+1; the schema version is their count.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/001_events.sql"),
    include_str!("migrations/002_terminals.sql"),
    include_str!("migrations/003_estimates.sql"),
    include_str!("migrations/004_writer_fence.sql"),
    include_str!("migrations/005_usage_totals.sql"),
    include_str!("migrations/006_index_entries.sql"),
    include_str!("migrations/007_runs_catalog.sql"),
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

/// Make `conn` a writer of this schema: it runs no triggers. The schema's one trigger,
/// `events_writer`, fences writers of earlier schemas, and an insert into a table with a trigger
/// gets a statement journal: SQLite copies every page the insert changes that was there before it
/// (and writes it to a temporary file once that passes 64 KiB, as it does when a large group
/// spills its page cache mid-transaction), so that the trigger could undo it. This writer is
/// fenced by the schema version instead (see the module's documentation and
/// [`newer_than_this_build`]). Called on the writer's connection before it migrates or appends.
pub fn fence_writer(conn: &Connection) -> Result<()> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false)
        .map(drop)
        .map_err(|e| WorldError::sqlite("turning the writer's triggers off", e))
}

/// The schema version of `conn`'s world when a later version has upgraded it past this build's,
/// read in the caller's transaction.
pub fn newer_than_this_build(conn: &Connection) -> Result<Option<i32>> {
    let version: i32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| WorldError::sqlite("reading the schema version", e))?;
    Ok((version > SCHEMA_VERSION).then_some(version))
}

/// Check that `conn` is a world (or empty) and bring its schema up to [`SCHEMA_VERSION`], in one
/// transaction.
pub fn migrate(conn: &mut Connection, db_path: &str) -> Result<()> {
    if check(conn, db_path)? == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| WorldError::sqlite("starting a migration", e))?;
    // Again inside the transaction: another process may have migrated meanwhile (then the
    // transaction rolls back on drop), or a newer one upgraded it further.
    let current = check(&tx, db_path)?;
    if current == SCHEMA_VERSION {
        return Ok(());
    }
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(current.max(0) as usize) {
        let target = step as i32 + 1;
        tx.execute_batch(sql)
            .and_then(|()| match target {
                2 => backfill_terminals(&tx),
                3 => backfill_estimates(&tx),
                5 => backfill_usage(&tx),
                7 => backfill_catalog(&tx),
                _ => Ok(()),
            })
            .map_err(|e| WorldError::sqlite(format!("migrating to schema {target}"), e))?;
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .and_then(|_| tx.pragma_update(None, "user_version", SCHEMA_VERSION))
        .map_err(|e| WorldError::sqlite("recording the schema version", e))?;
    tx.commit()
        .map_err(|e| WorldError::sqlite(format!("committing schema {SCHEMA_VERSION}"), e))
}

/// The stored rows of the given types, in stream and sequence order, each with its payload
/// (parsed in Rust, as deep as an append accepted it). A row whose envelope does not parse is
/// left out: the reads report it.
fn stored_rows(
    conn: &Connection,
    types: &[&str],
    mut each: impl FnMut(String, u64, String, Map<String, Value>) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    let marks = vec!["?"; types.len()].join(", ");
    let mut rows = conn.prepare(&format!(
        "SELECT run_id, sequence, type, envelope FROM events WHERE type IN ({marks}) ORDER BY run_id, sequence"
    ))?;
    let mut cursor = rows.query(rusqlite::params_from_iter(types))?;
    while let Some(row) = cursor.next()? {
        let envelope: String = row.get(3)?;
        let Ok(Value::Object(mut envelope)) = canonical::parse_around(&envelope, 1) else {
            continue;
        };
        let Some(Value::Object(payload)) = envelope.remove("payload") else {
            continue;
        };
        each(row.get(0)?, row.get::<_, i64>(1)? as u64, row.get(2)?, payload)?;
    }
    Ok(())
}

/// Fill the runs catalog from the rows already stored (see [`catalog_from_events`]).
fn backfill_catalog(conn: &Connection) -> rusqlite::Result<()> {
    let mut insert = conn.prepare(
        "INSERT INTO runs (run_id, last_sequence, first_recorded_at, last_recorded_at, status) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    catalog_from_events(conn, None, |r| {
        insert
            .execute(rusqlite::params![
                r.run_id,
                r.last_sequence as i64,
                r.first_recorded_at,
                r.last_recorded_at,
                r.status
            ])
            .map(|_| ())
    })
}

/// The catalog rows the stored events give (of `run` alone, if given), in id order: each
/// stream's last sequence, the times of its first and last rows, and the status its events give
/// ([`catalog::status_change`]). Reads every row once in stream and sequence order, and a payload
/// only where its type's change of status depends on it. What the upgrade fills the catalog
/// with, and what a world opened read-only reads where an earlier version left no catalog.
pub fn catalog_from_events(
    conn: &Connection,
    run: Option<&str>,
    mut each: impl FnMut(catalog::CatalogRow) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    let mut rows = conn.prepare(
        "SELECT run_id, sequence, type, recorded_at, envelope FROM events WHERE ?1 IS NULL OR run_id = ?1 ORDER BY run_id, sequence",
    )?;
    let mut cursor = rows.query([run])?;
    let mut current: Option<catalog::CatalogRow> = None;
    while let Some(row) = cursor.next()? {
        let run: String = row.get(0)?;
        if current.as_ref().is_none_or(|c| c.run_id != run) {
            if let Some(done) = current.take() {
                each(done)?;
            }
            let at: String = row.get(3)?;
            let status = catalog::initial_status(&run).to_string();
            current = Some(catalog::CatalogRow {
                run_id: run,
                last_sequence: 0,
                first_recorded_at: at.clone(),
                last_recorded_at: at,
                status,
            });
        }
        let c = current.as_mut().expect("set above");
        let t = row.get_ref(2)?.as_str()?;
        let envelope = row.get_ref(4)?.as_str()?;
        let change = catalog::stored_status_change(&c.run_id, t, envelope);
        c.last_sequence = row.get::<_, i64>(1)? as u64;
        c.last_recorded_at = row.get(3)?;
        c.status = change.apply(&c.status).to_string();
    }
    match current {
        Some(done) => each(done),
        None => Ok(()),
    }
}

/// The stored rows of the types whose effects the registered vocabularies keep, each with the
/// effects the reads see in it ([`crate::vocabulary::Vocabulary::stored_effects`]).
fn stored_effects(
    conn: &Connection,
    mut each: impl FnMut(&str, u64, &str, Effects) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    let vocabularies = vocabulary::registered();
    let types: Vec<&str> = vocabularies.iter().flat_map(|v| v.effect_types()).copied().collect();
    stored_rows(conn, &types, |run, sequence, t, payload| {
        for v in vocabularies.iter().filter(|v| v.effect_types().contains(&t.as_str())) {
            each(&run, sequence, &t, v.stored_effects(&run, &t, &payload))?;
        }
        Ok(())
    })
}

/// Fill `terminals` from the rows already stored: a stream's first end and each node's first
/// terminal, where the reads see one. One the reads take for the end must end it: an append
/// after it was accepted, and the run could not be read again.
fn backfill_terminals(conn: &Connection) -> rusqlite::Result<()> {
    let mut insert =
        conn.prepare("INSERT OR IGNORE INTO terminals (run_id, node_id, sequence, type) VALUES (?1, ?2, ?3, ?4)")?;
    stored_effects(conn, |run, sequence, t, effects| {
        if let Some(node) = effects.terminal {
            insert.execute(rusqlite::params![run, node, sequence as i64, t])?;
        }
        Ok(())
    })
}

/// Fill `estimates` from the budget-estimate rows already stored: each stream's and model's
/// commitments less its releases, summed exactly (gross sums can pass what an i64, or a double
/// exactly, holds), and clamped to 0 ..= 2^53 - 1 (a legacy over-release leaves nothing open).
fn backfill_estimates(conn: &Connection) -> rusqlite::Result<()> {
    let mut open: std::collections::BTreeMap<(String, String), i128> = Default::default();
    stored_effects(conn, |run, _, _, effects| {
        if let Some(e) = effects.estimate {
            let delta = if e.released {
                -i128::from(e.amount)
            } else {
                i128::from(e.amount)
            };
            *open.entry((run.to_string(), e.model)).or_default() += delta;
        }
        Ok(())
    })?;
    let max = crate::numbers::MAX_SAFE_INTEGER as i128;
    let mut insert = conn.prepare("INSERT INTO estimates (run_id, model, open) VALUES (?1, ?2, ?3)")?;
    for ((run, model), sum) in open {
        insert.execute(rusqlite::params![run, model, sum.clamp(0, max) as i64])?;
    }
    Ok(())
}

/// Fill `usage_totals` from the rows already stored, as the materializer reads them: each run's
/// four token counts, summed exactly and clamped to `i64::MAX` (a run an earlier version let past
/// 2^53 - 1 then takes no more calls).
fn backfill_usage(conn: &Connection) -> rusqlite::Result<()> {
    let mut totals: std::collections::BTreeMap<String, [u128; 4]> = Default::default();
    stored_effects(conn, |run, _, _, effects| {
        if let Some(usage) = effects.usage {
            let sums = totals.entry(run.to_string()).or_default();
            for (sum, n) in sums.iter_mut().zip(usage.tokens) {
                *sum += u128::from(n);
            }
        }
        Ok(())
    })?;
    let mut insert = conn.prepare(
        "INSERT INTO usage_totals (run_id, input_tokens, output_tokens, cached_input_tokens, reasoning_tokens)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for (run, sums) in totals {
        let [a, b, c, d] = sums.map(|s| s.min(i64::MAX as u128) as i64);
        insert.execute(rusqlite::params![run, a, b, c, d])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::functions::FunctionFlags;

    fn pragma_i32(conn: &Connection, name: &str) -> Result<i32> {
        conn.pragma_query_value(None, name, |r| r.get(0))
            .map_err(|e| WorldError::sqlite(format!("reading PRAGMA {name}"), e))
    }

    /// A database at schema 1, as that version left it, holding `rows` (stream, type, payload).
    fn schema_1_world(rows: &[(&str, &str, String)]) -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "application_id", APPLICATION_ID).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        for (i, (run, t, payload)) in rows.iter().enumerate() {
            let sequence = i as i64 + 1;
            let envelope = format!(
                r#"{{"eventId":"evt_{sequence:016x}","payload":{payload},"recordedAt":"2026-01-01T00:00:00.000Z","runId":"{run}","sequence":{sequence},"type":"{t}"}}"#
            );
            conn.execute(
                "INSERT INTO events (run_id, sequence, event_id, type, recorded_at, envelope) VALUES (?1, ?2, ?3, ?4, '2026-01-01T00:00:00.000Z', ?5)",
                rusqlite::params![run, sequence, format!("evt_{sequence:016x}"), t, envelope],
            )
            .unwrap();
        }
        conn
    }

    fn rows(conn: &Connection, sql: &str) -> Vec<String> {
        let mut stmt = conn.prepare(sql).unwrap();
        let mut cursor = stmt.query([]).unwrap();
        let mut out = Vec::new();
        while let Some(row) = cursor.next().unwrap() {
            let cols = (0..row.as_ref().column_count()).map(|i| match row.get_ref(i).unwrap() {
                rusqlite::types::ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                rusqlite::types::ValueRef::Integer(n) => n.to_string(),
                other => format!("{other:?}"),
            });
            out.push(cols.collect::<Vec<_>>().join(" "));
        }
        out
    }

    #[test]
    fn stored_rows_are_backfilled_as_the_reads_see_them_however_deep() {
        // Payloads nested to the 1,000 levels an append accepts (the envelope around them is one
        // deeper, past what SQLite's JSON functions read); rows an earlier version stored as plain
        // facts that the vocabulary refuses, which end nothing; and ends it takes for ends, of
        // which the first counts.
        let deep = format!("{}{}", "[".repeat(999), "]".repeat(999));
        let mut conn = schema_1_world(&[
            (
                "run_deep",
                "sample.node_ended",
                format!(r#"{{"nodeId":"n1","output":{deep}}}"#),
            ),
            (
                "run_deep",
                "sample.estimate",
                format!(r#"{{"amount":500,"extra":{deep},"model":"m"}}"#),
            ),
            (
                "run_deep",
                "sample.estimate",
                r#"{"amount":200,"model":"m","released":true}"#.into(),
            ),
            ("run_misfiled", "sample.node_ended", r#"{"nodeId":""}"#.into()),
            ("run_misfiled", "sample.node_ended", r#"{"nodeId":7}"#.into()),
            ("run_ended", "sample.completed", "{}".into()),
            ("run_ended", "sample.completed", r#"{"again":1}"#.into()),
            ("ses_s", "sample.completed", "{}".into()),
            ("ses_s", "sample.node_ended", r#"{"nodeId":"n2"}"#.into()),
        ]);
        migrate(&mut conn, "x").unwrap();
        assert_eq!(pragma_i32(&conn, "user_version").unwrap(), SCHEMA_VERSION);
        assert_eq!(
            rows(
                &conn,
                "SELECT run_id, node_id, sequence, type FROM terminals ORDER BY run_id, node_id"
            ),
            [
                "run_deep n1 1 sample.node_ended",
                "run_ended  6 sample.completed",
                "ses_s  8 sample.completed",
                "ses_s n2 9 sample.node_ended"
            ]
        );
        assert_eq!(
            rows(&conn, "SELECT run_id, model, open FROM estimates"),
            ["run_deep m 300"]
        );
    }

    #[test]
    fn each_runs_token_counts_are_summed_in_exactly_and_clamped() {
        let call =
            |i: u64, o: u64, extra: &str| format!(r#"{{"usage":{{"inputTokens":{i},"outputTokens":{o}{extra}}}}}"#);
        let max = crate::numbers::MAX_SAFE_INTEGER as u64;
        let mut conn = schema_1_world(&[
            ("run_a", "keyed.usage", call(10, 2, r#","cachedInputTokens":4"#)),
            ("run_a", "keyed.usage", call(5, 3, r#","reasoningTokens":1"#)),
            ("run_a", "keyed.other", call(1000, 1000, "")),
            // An earlier version let a run's counts pass 2^53 - 1 (and an i64, summed).
            ("run_b", "keyed.usage", call(max, 1, "")),
            ("run_b", "keyed.usage", call(max, 1, "")),
            ("run_b", "keyed.usage", call(max, 1, "")),
            // A row whose counts do not read adds nothing.
            ("run_c", "keyed.usage", r#"{"usage":{"inputTokens":"x"}}"#.into()),
        ]);
        migrate(&mut conn, "x").unwrap();
        assert_eq!(
            rows(
                &conn,
                "SELECT run_id, input_tokens, output_tokens, cached_input_tokens, reasoning_tokens FROM usage_totals ORDER BY run_id"
            ),
            ["run_a 15 5 4 1".to_string(), format!("run_b {} 3 0 0", 3 * max)]
        );
    }

    #[test]
    fn an_upgrade_that_fails_leaves_the_version_it_found() {
        // A step after the first fails (a table of that name is there already): the whole
        // upgrade is undone, not left at a version between.
        let mut conn = schema_1_world(&[("run_a", "run:completed", "{}".into())]);
        conn.execute_batch("CREATE TABLE estimates (x INTEGER)").unwrap();
        let err = migrate(&mut conn, "x").unwrap_err();
        assert!(err.to_string().contains("migrating to schema 3"), "{err}");
        assert_eq!(pragma_i32(&conn, "user_version").unwrap(), 1);
        assert!(rows(&conn, "SELECT name FROM sqlite_schema WHERE name = 'terminals'").is_empty());
    }

    #[test]
    fn only_a_writer_of_this_schema_appends() {
        let insert = |conn: &Connection| {
            conn.execute(
                "INSERT INTO events (run_id, sequence, event_id, type, recorded_at, envelope) VALUES ('run_a', 1, 'evt_0', 'T', '', '{}')",
                [],
            )
        };
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn, "x").unwrap();
        // A process of an earlier version, which had the world open when it was upgraded.
        let err = insert(&conn).unwrap_err();
        assert!(
            err.to_string().contains("no such function: little_world_writer"),
            "{err}"
        );
        // A writer of schema 4 built before writers skipped triggers, once the world has moved
        // past schema 4 (a later version makes the trigger ask for its own number).
        conn.create_scalar_function("little_world_writer", 1, FunctionFlags::SQLITE_UTF8, |_| Ok(false))
            .unwrap();
        let err = insert(&conn).unwrap_err();
        assert!(
            err.to_string()
                .contains("upgraded by a newer version of @little-workflow/world"),
            "{err}"
        );
        assert!(rows(&conn, "SELECT * FROM events").is_empty());
        // This build's writer runs no trigger; the schema version fences it.
        fence_writer(&conn).unwrap();
        insert(&conn).unwrap();
        assert_eq!(rows(&conn, "SELECT count(*) FROM events"), ["1"]);
        assert_eq!(newer_than_this_build(&conn).unwrap(), None);
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
        assert_eq!(newer_than_this_build(&conn).unwrap(), Some(SCHEMA_VERSION + 1));
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
