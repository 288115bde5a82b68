//! The tables of a `postgres` world, their version, and the migrations between versions.
//!
//! Every table lives in the world's schema. The version is the one row of `world_schema`, which
//! also names the application, so a schema of something else is refused rather than written to.
//! A migration runs in one transaction under a transaction-level advisory lock keyed by the
//! schema's name, so hosts opening one fresh database at once create it exactly once (concurrent
//! `CREATE ... IF NOT EXISTS` statements otherwise collide in the catalog), and re-reads the
//! version inside it. A newer schema than this build's is refused with an upgrade message.
//!
//! The tables:
//! - `runs`: one row per stream, locked by each transaction that appends to it: the last
//!   sequence (so sequences are dense, assigned under that lock, whichever host appends), the
//!   first and last `recordedAt`, and the stream's token counts so far;
//! - `events`: the rows, with the envelope's canonical JSON as `text` and the writing
//!   transaction's id (`xid`), which the feed of what changed reads (see `store::postgres`);
//! - `terminals`, `estimates`: as the SQLite schema's, for the run-event rules;
//! - `artifacts`, `artifact_chunks`: manifests and their bytes in 1 MiB chunks;
//! - `artifact_objects`: the manifests of artifacts whose bytes are in an object store;
//! - `leases`: the locks, leased by the database's clock, with a fence that rises with each owner;
//! - `outer_loops`: the outer-loop manifests;
//! - `index_entries`: the index entries appends write;
//! - `fold_snapshots`: each run's latest fold snapshot per fold key, a cache.

use super::Db;
use crate::catalog;
use crate::error::{Result, WorldError};
use tokio_postgres::Client;

/// What `world_schema.application` says of a schema of this package.
const APPLICATION: &str = "little-workflow";

/// The steps from one version to the next; the schema's version is how many have run.
const MIGRATIONS: &[&str] = &[
    include_str!("migrations/001_tables.sql"),
    include_str!("migrations/002_index_entries.sql"),
    include_str!("migrations/003_fold_snapshots.sql"),
    include_str!("migrations/004_runs_catalog.sql"),
    include_str!("migrations/005_artifact_objects.sql"),
];

/// This build's schema version.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// The advisory-lock key of a schema's migrations: its name's hash, in the package's own space.
fn lock_key(schema: &str) -> i64 {
    let digest = crate::ids::sha256_tagged(format!("little-workflow schema {schema}").as_bytes());
    let hex = digest.trim_start_matches("sha256:");
    i64::from_str_radix(&hex[..15], 16).expect("hex digits")
}

/// Give each stream stored before the catalog the status its events give
/// ([`catalog::stored_status_change`]), reading its rows once in stream and sequence order.
async fn backfill_catalog(client: &Client, s: &str) -> std::result::Result<(), tokio_postgres::Error> {
    use futures_util::TryStreamExt;
    // The statuses are written once the read has ended: the read's rows arrive on this same
    // connection, ahead of any other statement's answer.
    let mut statuses: Vec<(String, &'static str)> = Vec::new();
    let rows = client
        .query_raw(
            &format!("SELECT run_id, type, envelope FROM {s}.events ORDER BY run_id COLLATE \"C\", sequence"),
            std::iter::empty::<i32>(),
        )
        .await?;
    futures_util::pin_mut!(rows);
    let mut current: Option<(String, &'static str)> = None;
    while let Some(row) = rows.try_next().await? {
        let run: &str = row.get(0);
        let t: &str = row.get(1);
        if current.as_ref().is_none_or(|c| c.0 != run) {
            statuses.extend(current.take());
            current = Some((run.to_string(), catalog::initial_status(run)));
        }
        let c = current.as_mut().expect("set above");
        c.1 = catalog::stored_status_change(&c.0, t, row.get(2)).apply(c.1);
    }
    statuses.extend(current.take());
    for chunk in statuses.chunks(10_000) {
        let (runs, status): (Vec<&str>, Vec<&str>) = chunk.iter().map(|(r, s)| (r.as_str(), *s)).unzip();
        client
            .execute(
                &format!(
                    "UPDATE {s}.runs AS r SET status = u.status FROM unnest($1::text[], $2::text[]) AS u(run_id, status) \
                     WHERE r.run_id = u.run_id"
                ),
                &[&runs, &status],
            )
            .await?;
    }
    Ok(())
}

/// Bring the schema up to [`SCHEMA_VERSION`], or refuse it; for a world opened to read only,
/// check that it is there and of a version this build reads.
pub async fn migrate(db: &Db, client: &Client) -> Result<()> {
    if db.options.read_only {
        return check_only(db, client).await;
    }
    let s = &db.schema;
    let fail = |doing: &str, e: tokio_postgres::Error| db.error(doing, &e);
    // The transaction's statements run one after another on this connection; `COMMIT` is checked
    // by the guard before it (a failed statement makes the guard fail, and the commit a rollback).
    client
        .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        .await
        .map_err(|e| fail("starting the schema check", e))?;
    let outcome = async {
        client
            .query("SELECT pg_advisory_xact_lock($1)", &[&lock_key(&db.schema_name)])
            .await
            .map_err(|e| fail("waiting for other hosts' schema checks", e))?;
        client
            .batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {s};
                 CREATE TABLE IF NOT EXISTS {s}.world_schema (
                     id int PRIMARY KEY CHECK (id = 1), version int NOT NULL, application text NOT NULL)"
            ))
            .await
            .map_err(|e| fail("creating the schema", e))?;
        let row = client
            .query_opt(&format!("SELECT version, application FROM {s}.world_schema WHERE id = 1"), &[])
            .await
            .map_err(|e| fail("reading the schema version", e))?;
        let version = match row {
            Some(row) => {
                let application: String = super::col(&row, 1)?;
                if application != APPLICATION {
                    return Err(WorldError::Path {
                        message: format!(
                            "schema {} of {} belongs to {application:?}, not to a little-workflow world",
                            db.schema_name, db.server
                        ),
                    });
                }
                super::col::<i32>(&row, 0)?
            }
            None => {
                let foreign: i64 = super::col(
                    &client
                        .query_one(
                            "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename <> 'world_schema'",
                            &[&db.schema_name],
                        )
                        .await
                        .map_err(|e| fail("reading the schema's tables", e))?,
                    0,
                )?;
                if foreign > 0 {
                    return Err(WorldError::Path {
                        message: format!(
                            "schema {} of {} holds tables of something else: give the world a schema of its own",
                            db.schema_name, db.server
                        ),
                    });
                }
                client
                    .execute(
                        &format!("INSERT INTO {s}.world_schema (id, version, application) VALUES (1, 0, $1)"),
                        &[&APPLICATION],
                    )
                    .await
                    .map_err(|e| fail("recording the schema version", e))?;
                0
            }
        };
        if version > SCHEMA_VERSION {
            return Err(WorldError::Path {
                message: format!(
                    "schema {} of {} has version {version}, newer than this build's {SCHEMA_VERSION}: upgrade @little-workflow/world",
                    db.schema_name, db.server
                ),
            });
        }
        if version < SCHEMA_VERSION {
            // A migration is made durable whatever the world's durability: one lost to a crash of
            // the server would leave writers of two versions. (A check that migrates nothing
            // commits as the world's other commits do.)
            client
                .batch_execute("SET LOCAL synchronous_commit TO on")
                .await
                .map_err(|e| fail("starting the schema check", e))?;
        }
        for (step, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
            client
                .batch_execute(&sql.replace("{s}", s))
                .await
                .map_err(|e| fail(&format!("migrating to schema {}", step + 1), e))?;
            if step + 1 == 4 {
                backfill_catalog(client, s)
                    .await
                    .map_err(|e| fail("filling the runs catalog", e))?;
            }
        }
        client
            .execute(
                &format!("UPDATE {s}.world_schema SET version = $1 WHERE id = 1"),
                &[&SCHEMA_VERSION],
            )
            .await
            .map_err(|e| fail("recording the schema version", e))?;
        client
            .query_one("SELECT pg_current_xact_id()::text", &[])
            .await
            .map_err(|e| fail("checking the schema transaction", e))?;
        Ok(())
    }
    .await;
    match outcome {
        Ok(()) => client
            .batch_execute("COMMIT")
            .await
            .map_err(|e| fail("committing the schema", e)),
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

/// The schema of a world opened to read only: there, a world's, and not newer than this build.
async fn check_only(db: &Db, client: &Client) -> Result<()> {
    let s = &db.schema;
    let exists = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&format!("{s}.world_schema")])
        .await
        .map_err(|e| db.error("reading the schema version", &e))?;
    if !super::col::<bool>(&exists, 0)? {
        return Err(WorldError::Path {
            message: format!("no world in schema {} of {}", db.schema_name, db.server),
        });
    }
    let row = client
        .query_opt(
            &format!("SELECT version, application FROM {s}.world_schema WHERE id = 1"),
            &[],
        )
        .await
        .map_err(|e| db.error("reading the schema version", &e))?;
    let Some(row) = row else {
        return Err(WorldError::Path {
            message: format!("no world in schema {} of {}", db.schema_name, db.server),
        });
    };
    let version: i32 = super::col(&row, 0)?;
    let application: String = super::col(&row, 1)?;
    if application != APPLICATION || version < 1 {
        return Err(WorldError::Path {
            message: format!("no world in schema {} of {}", db.schema_name, db.server),
        });
    }
    if version > SCHEMA_VERSION {
        return Err(WorldError::Path {
            message: format!(
                "schema {} of {} has version {version}, newer than this build's {SCHEMA_VERSION}: upgrade @little-workflow/world",
                db.schema_name, db.server
            ),
        });
    }
    Ok(())
}
