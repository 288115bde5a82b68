//! The `postgres` world's event store: the same rows as SQLite's, in a PostgreSQL schema shared
//! by any number of processes on any number of hosts.
//!
//! A group of appends is one transaction of the writer's own connection, in two round trips:
//!
//! 1. `BEGIN`; make sure each stream of the group has its `runs` row and lock those rows
//!    (`FOR UPDATE`, in id order, so two hosts never deadlock); then, in statements that start
//!    after the locks are held and so see every commit of an earlier holder, read what the
//!    append rules will ask: each stream's last sequence, end, token counts and estimates, and
//!    the rows holding the group's idempotency keys.
//! 2. The rules run against that ([`tx::PgTx`]), staging rows; then the streams' new last
//!    sequences, the rows, terminals and estimates are written with one statement each (arrays,
//!    `unnest`), a guard statement reads the transaction's id, and `COMMIT`. A `NOTIFY` on the
//!    schema's channel follows the commit in the same round trip, outside the transaction.
//!
//! A group whose streams the writer has committed to before, and which writes no index entry,
//! is one round trip: the writer remembers each stream's state after its own commits
//! ([`tx::Tail`]), runs the rules on that, and sends `BEGIN` with round 2. The `runs` rows are
//! then locked by the first write, in id order as in round 1, and the rows go in after: if
//! another writer appended to a stream meanwhile, the row at the sequence remembered as next is
//! there, its primary key refuses the insert, the transaction rolls back, and the group runs
//! again as above. A refused idempotency key or node end is found the same way.
//!
//! A stream's sequences are handed out under its row's lock, held until commit, so they are
//! dense and a stream's commits become visible in sequence order, whichever host appends.
//! Statements are pipelined only as prepared statements, which run in the order sent. A
//! transaction is taken as committed only when every statement and the guard succeeded and
//! `COMMIT` returned: a statement that failed makes the guard fail (the server has aborted the
//! transaction) where the client library would report the `COMMIT` that became a rollback as a
//! success. When the connection goes while `COMMIT` may have been received, the transaction's
//! fate is asked of the server by its id (`pg_xact_status`) on a new connection; only if that
//! cannot be known is the group failed as unknown, to be resolved by retrying with the same
//! idempotency keys.
//!
//! - `tx`: the transaction the append rules see;
//! - `reader`: listings and the other reads, on pooled connections;
//! - `listen`: word of other processes' commits, through `LISTEN`.

pub mod listen;
pub mod reader;
#[cfg(test)]
mod tests;
mod tx;

use crate::error::{Result, WorldError};
use crate::pg::{col, Db};
use crate::store::{LogTx, LogWriter, Scope};
pub use reader::PgReader;
use std::collections::HashMap;
use std::sync::Arc;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};
use tx::{Known, PgTx, RunState, Tail};

/// The writer: one connection of its own, made when first needed and again after it is lost.
pub struct PgWriter {
    db: Arc<Db>,
    /// The writer's own single-threaded runtime: its connection's I/O runs on the writer's
    /// thread, inside each call, so a round trip costs no hand-off between threads.
    rt: tokio::runtime::Runtime,
    conn: Option<Conn>,
    /// Each stream's state after the writer's last commit to it (which also says that its
    /// `runs` row exists: rows are never removed); forgotten after any failure, and past
    /// `KNOWN_STREAMS`.
    tails: HashMap<String, Tail>,
    /// Groups committed from memory, for the tests.
    #[cfg(test)]
    pub(crate) remembered_commits: u64,
}

/// How many streams the writer remembers.
const KNOWN_STREAMS: usize = 65_536;

/// The SQLSTATE of a unique key's refusal.
const UNIQUE_VIOLATION: &str = "23505";

/// The SQLSTATE of a check's refusal: the `runs` upsert's, of a stream whose last sequence is not
/// the one the group started after (deleted, or written by another host, since the writer
/// remembered it).
const CHECK_VIOLATION: &str = "23514";

/// Why a group's writes did not commit.
enum NotCommitted {
    /// The connection was found gone at `BEGIN`: nothing reached the server.
    Unsent(WorldError),
    /// A unique key refused a write: the transaction rolled back.
    Taken(WorldError),
    Failed(WorldError),
}

impl NotCommitted {
    fn error(self) -> WorldError {
        match self {
            NotCommitted::Unsent(e) | NotCommitted::Taken(e) | NotCommitted::Failed(e) => e,
        }
    }
}

/// How a group's attempt from memory ended.
enum Remembered {
    Committed,
    /// Another writer got there first, or a question or refusal needs the server: nothing was
    /// stored, and the group runs again under the streams' locks.
    Locked,
    Failed(WorldError),
}

/// A live connection and its prepared statements.
struct Conn {
    client: Client,
    st: Statements,
}

struct Statements {
    begin: Statement,
    ensure_runs: Statement,
    lock_runs: Statement,
    keys: Statement,
    terminals: Statement,
    estimates: Statement,
    insert_events: Statement,
    insert_terminals: Statement,
    put_estimates: Statement,
    put_runs: Statement,
    index_lock: Statement,
    index_holder: Statement,
    put_index: Statement,
    drop_index: Statement,
    guard: Statement,
    notify: Statement,
}

impl Statements {
    async fn prepare(db: &Db, c: &Client) -> std::result::Result<Statements, tokio_postgres::Error> {
        let t = |name: &str| db.table(name);
        let text_array = Type::TEXT_ARRAY;
        let int_array = Type::INT8_ARRAY;
        Ok(Statements {
            begin: c.prepare_typed("BEGIN ISOLATION LEVEL READ COMMITTED", &[]).await?,
            ensure_runs: c
                .prepare_typed(
                    &format!(
                        "INSERT INTO {} (run_id) SELECT r FROM unnest($1::text[]) AS r ORDER BY r ON CONFLICT (run_id) DO NOTHING",
                        t("runs")
                    ),
                    std::slice::from_ref(&text_array),
                )
                .await?,
            lock_runs: c
                .prepare_typed(
                    &format!(
                        "SELECT run_id, last_sequence, input_tokens, output_tokens, cached_tokens, reasoning_tokens \
                         FROM {} WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE",
                        t("runs")
                    ),
                    std::slice::from_ref(&text_array),
                )
                .await?,
            keys: c
                .prepare_typed(
                    &format!(
                        "SELECT e.run_id, e.idempotency_key, e.sequence, e.request_digest, e.envelope \
                         FROM {} e JOIN unnest($1::text[], $2::text[]) AS k(run_id, key) \
                         ON e.run_id = k.run_id AND e.idempotency_key = k.key",
                        t("events")
                    ),
                    &[text_array.clone(), text_array.clone()],
                )
                .await?,
            terminals: c
                .prepare_typed(
                    &format!(
                        "SELECT t.run_id, t.node_id, t.sequence FROM {} t \
                         JOIN unnest($1::text[], $2::text[]) AS k(run_id, node_id) \
                         ON t.run_id = k.run_id AND t.node_id = k.node_id",
                        t("terminals")
                    ),
                    &[text_array.clone(), text_array.clone()],
                )
                .await?,
            estimates: c
                .prepare_typed(
                    &format!("SELECT run_id, model, open FROM {} WHERE run_id = ANY($1)", t("estimates")),
                    std::slice::from_ref(&text_array),
                )
                .await?,
            insert_events: c
                .prepare_typed(
                    &format!(
                        "INSERT INTO {} (run_id, sequence, event_id, type, idempotency_key, request_digest, recorded_at, envelope) \
                         SELECT * FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[])",
                        t("events")
                    ),
                    &[
                        text_array.clone(),
                        int_array.clone(),
                        text_array.clone(),
                        text_array.clone(),
                        text_array.clone(),
                        text_array.clone(),
                        text_array.clone(),
                        text_array.clone(),
                    ],
                )
                .await?,
            insert_terminals: c
                .prepare_typed(
                    &format!(
                        "INSERT INTO {} (run_id, node_id, sequence, type) \
                         SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[])",
                        t("terminals")
                    ),
                    &[text_array.clone(), text_array.clone(), int_array.clone(), text_array.clone()],
                )
                .await?,
            put_estimates: c
                .prepare_typed(
                    &format!(
                        "INSERT INTO {} AS e (run_id, model, open) SELECT * FROM unnest($1::text[], $2::text[], $3::int8[]) \
                         ON CONFLICT (run_id, model) DO UPDATE SET open = excluded.open",
                        t("estimates")
                    ),
                    &[text_array.clone(), text_array.clone(), int_array.clone()],
                )
                .await?,
            // Rows are taken in id order, as `lock_runs` takes them, so that two writers never
            // wait for each other's rows the other way round. Every stream written already has
            // its row; the insert is there only to take the rows in that order.
            put_runs: c
                .prepare_typed(
                    &format!(
                        "INSERT INTO {} AS r (run_id, last_sequence, first_recorded_at, last_recorded_at, \
                         input_tokens, output_tokens, cached_tokens, reasoning_tokens, status, written_after) \
                         SELECT u.run_id, u.last, u.first, u.at, u.i, u.o, u.c, u.rt, u.st, u.after \
                         FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], \
                         $8::text[], $9::int8[], $10::text[]) AS u(run_id, last, at, i, o, c, rt, st, after, first) \
                         ORDER BY u.run_id \
                         ON CONFLICT (run_id) DO UPDATE SET \
                         last_sequence = CASE WHEN r.last_sequence = excluded.written_after \
                         THEN excluded.last_sequence ELSE -1 END, written_after = excluded.written_after, \
                         first_recorded_at = coalesce(r.first_recorded_at, excluded.first_recorded_at), \
                         last_recorded_at = excluded.last_recorded_at, input_tokens = excluded.input_tokens, \
                         output_tokens = excluded.output_tokens, cached_tokens = excluded.cached_tokens, \
                         reasoning_tokens = excluded.reasoning_tokens, \
                         status = CASE WHEN excluded.status IS NULL THEN r.status \
                         WHEN excluded.status = '' THEN CASE WHEN r.status = 'pending' THEN 'running' ELSE r.status END \
                         ELSE excluded.status END",
                        t("runs")
                    ),
                    &[
                        text_array.clone(),
                        int_array.clone(),
                        text_array.clone(),
                        int_array.clone(),
                        int_array.clone(),
                        int_array.clone(),
                        int_array.clone(),
                        text_array.clone(),
                        int_array.clone(),
                        text_array.clone(),
                    ],
                )
                .await?,
            index_lock: c
                .prepare_typed("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", &[Type::TEXT])
                .await?,
            index_holder: c
                .prepare_typed(
                    &format!("SELECT run_id FROM {} WHERE name = $1 AND key = $2", t("index_entries")),
                    &[Type::TEXT, Type::TEXT],
                )
                .await?,
            put_index: c
                .prepare_typed(
                    &format!(
                        "INSERT INTO {} (name, key, value, run_id, sequence) \
                         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[]) \
                         ON CONFLICT (name, key) DO UPDATE SET \
                         value = excluded.value, run_id = excluded.run_id, sequence = excluded.sequence",
                        t("index_entries")
                    ),
                    &[
                        text_array.clone(),
                        text_array.clone(),
                        text_array.clone(),
                        text_array.clone(),
                        int_array.clone(),
                    ],
                )
                .await?,
            drop_index: c
                .prepare_typed(
                    &format!(
                        "DELETE FROM {} AS i USING unnest($1::text[], $2::text[]) AS k(name, key) \
                         WHERE i.name = k.name AND i.key = k.key",
                        t("index_entries")
                    ),
                    &[text_array.clone(), text_array.clone()],
                )
                .await?,
            guard: c.prepare_typed("SELECT pg_current_xact_id()::text", &[]).await?,
            notify: c
                .prepare_typed("SELECT pg_notify($1, $2)", &[Type::TEXT, Type::TEXT])
                .await?,
        })
    }
}

/// The payload of a commit's notification: its streams, one per line, or nothing (anything may
/// have changed) when they would not fit in a notification.
fn announcement(streams: &[&str]) -> String {
    let text = streams.join("\n");
    if text.len() < 7000 {
        text
    } else {
        String::new()
    }
}

impl PgWriter {
    pub fn new(db: Arc<Db>) -> Result<PgWriter> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| WorldError::Path {
                message: format!("the PostgreSQL writer's runtime could not be made: {e}"),
            })?;
        Ok(PgWriter {
            db,
            rt,
            conn: None,
            tails: HashMap::new(),
            #[cfg(test)]
            remembered_commits: 0,
        })
    }

    /// The writer's connection, made (and the schema checked) if there is none or it was lost.
    /// What the writer remembered of its streams is forgotten with a lost connection: the server
    /// may have restarted, and at `synchronous_commit` off, lost the last commits it had
    /// acknowledged, so that a stream's last sequence is no longer what was remembered.
    async fn conn(db: &Db, conn: &mut Option<Conn>, tails: &mut HashMap<String, Tail>) -> Result<()> {
        // The connection's task runs only inside calls: let it read what arrived meanwhile (the
        // end of a connection the server closed) before the connection is used.
        tokio::task::yield_now().await;
        if conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            *conn = None;
        }
        if conn.is_none() {
            tails.clear();
            let client = db.connect().await?;
            db.ensure_schema(&client).await?;
            let st = Statements::prepare(db, &client)
                .await
                .map_err(|e| db.error("preparing the writer's statements", &e))?;
            *conn = Some(Conn { client, st });
        }
        Ok(())
    }

    /// Lock the streams `runs` (sorted, distinct) and read what the rules will ask of them.
    /// `ensure` names the streams that may have no `runs` row yet.
    async fn read_scope(
        db: &Db,
        c: &Conn,
        runs: &[String],
        ensure: &[&str],
        scope: &Scope<'_>,
        known: &mut Known,
    ) -> Result<()> {
        let fail = |doing: &'static str| move |e: tokio_postgres::Error| db.error(doing, &e);
        let (key_runs, keys): (Vec<&str>, Vec<&str>) = scope.keys.iter().copied().unzip();
        let mut node_runs: Vec<&str> = runs.iter().map(String::as_str).collect();
        let mut nodes: Vec<&str> = vec![""; runs.len()];
        for (run, node) in &scope.nodes {
            node_runs.push(run);
            nodes.push(node);
        }
        let estimate_runs: Vec<&str> = scope
            .estimates
            .iter()
            .copied()
            .filter(|r| !known.estimated(r))
            .collect();
        // Statements with nothing to ask are not sent.
        let (ensured, locked, found, ended, estimates) = futures_util::try_join!(
            async {
                if ensure.is_empty() {
                    return Ok(0);
                }
                c.client
                    .execute(&c.st.ensure_runs, &[&ensure])
                    .await
                    .map_err(fail("adding streams"))
            },
            async {
                c.client
                    .query(&c.st.lock_runs, &[&runs])
                    .await
                    .map_err(fail("locking streams"))
            },
            async {
                if keys.is_empty() {
                    return Ok(Vec::new());
                }
                c.client
                    .query(&c.st.keys, &[&key_runs, &keys])
                    .await
                    .map_err(fail("reading idempotency keys"))
            },
            async {
                c.client
                    .query(&c.st.terminals, &[&node_runs, &nodes])
                    .await
                    .map_err(fail("reading stream ends"))
            },
            async {
                if estimate_runs.is_empty() {
                    return Ok(Vec::new());
                }
                c.client
                    .query(&c.st.estimates, &[&estimate_runs])
                    .await
                    .map_err(fail("reading budget estimates"))
            },
        )?;
        let _ = ensured;
        for row in &locked {
            let tokens: [i64; 4] = [col(row, 2)?, col(row, 3)?, col(row, 4)?, col(row, 5)?];
            known.runs.insert(
                col(row, 0)?,
                RunState {
                    last: col::<i64>(row, 1)? as u64,
                    usage: tokens.map(|t| t as u64),
                },
            );
        }
        for run in runs {
            if !known.runs.contains_key(run) {
                return Err(WorldError::RuntimeIntegrity {
                    reason: format!("stream {run} has no row in {} after it was added", db.table("runs")),
                });
            }
            known.asked_ends.insert(run.clone());
        }
        for (run, node) in &scope.nodes {
            known.asked_nodes.insert((run.to_string(), node.to_string()));
        }
        for row in &found {
            known.keys.insert(
                (col(row, 0)?, col(row, 1)?),
                crate::store::KeyedEvent {
                    sequence: col::<i64>(row, 2)? as u64,
                    digest: col::<Option<String>>(row, 3)?.unwrap_or_default(),
                    envelope: col(row, 4)?,
                },
            );
        }
        for (run, key) in &scope.keys {
            known.asked_keys.insert((run.to_string(), key.to_string()));
        }
        for row in &ended {
            known
                .terminals
                .insert((col(row, 0)?, col(row, 1)?), col::<i64>(row, 2)? as u64);
        }
        for run in &estimate_runs {
            known.estimates.entry(run.to_string()).or_default();
        }
        for row in &estimates {
            let run: String = col(row, 0)?;
            known
                .estimates
                .entry(run)
                .or_default()
                .insert(col(row, 1)?, col::<i64>(row, 2)? as u64);
        }
        Ok(())
    }

    /// Write what `tx` staged and commit (with `begin`, sending `BEGIN` first, for a transaction
    /// not yet begun); `Ok` only once the commit is known to have happened.
    async fn write_and_commit(db: &Db, c: &Conn, tx: &PgTx<'_>, begin: bool) -> std::result::Result<(), NotCommitted> {
        let fail = |doing: &'static str| move |e: tokio_postgres::Error| db.error(doing, &e);
        let w = tx.writes();
        let streams: Vec<&str> = w.runs.iter().map(|r| r.0).collect();
        let begun = async {
            if begin {
                c.client.execute(&c.st.begin, &[]).await?;
            }
            Ok::<_, tokio_postgres::Error>(())
        };
        // The streams' rows first: a transaction begun here takes their locks with this write.
        let runs = async {
            if !w.runs.is_empty() {
                let (ids, last, at, i, o, ca, rt, st, after) = w.run_columns();
                c.client
                    .execute(
                        &c.st.put_runs,
                        &[&ids, &last, &at, &i, &o, &ca, &rt, &st, &after, &w.first_recorded],
                    )
                    .await
                    .map_err(fail("recording the streams' last sequences"))?;
            }
            Ok(())
        };
        let inserts = async {
            if !w.events.0.is_empty() {
                let e = &w.events;
                c.client
                    .execute(&c.st.insert_events, &[&e.0, &e.1, &e.2, &e.3, &e.4, &e.5, &e.6, &e.7])
                    .await
                    .map_err(fail("inserting events"))?;
            }
            Ok::<_, WorldError>(())
        };
        let terminals = async {
            if !w.terminals.0.is_empty() {
                let t = &w.terminals;
                c.client
                    .execute(&c.st.insert_terminals, &[&t.0, &t.1, &t.2, &t.3])
                    .await
                    .map_err(fail("recording stream ends"))?;
            }
            Ok(())
        };
        let estimates = async {
            if !w.estimates.0.is_empty() {
                let e = &w.estimates;
                c.client
                    .execute(&c.st.put_estimates, &[&e.0, &e.1, &e.2])
                    .await
                    .map_err(fail("recording budget estimates"))?;
            }
            Ok(())
        };
        // Each statement is a future of its own, so that all are sent before `COMMIT`.
        let index_set = async {
            if !w.index_set.0.is_empty() {
                let s = &w.index_set;
                c.client
                    .execute(&c.st.put_index, &[&s.0, &s.1, &s.2, &s.3, &s.4])
                    .await
                    .map_err(fail("writing index entries"))?;
            }
            Ok(())
        };
        let index_removed = async {
            if !w.index_removed.0.is_empty() {
                let r = &w.index_removed;
                c.client
                    .execute(&c.st.drop_index, &[&r.0, &r.1])
                    .await
                    .map_err(fail("removing index entries"))?;
            }
            Ok(())
        };
        let guard = async { c.client.query_one(&c.st.guard, &[]).await };
        let commit = async { c.client.batch_execute("COMMIT").await };
        // A hint for other processes' live views, sent behind the `COMMIT` in the same round
        // trip, so the server runs it after the commit and outside the transaction. Its failure
        // loses nothing: live views poll too.
        let notice = announcement(&streams);
        let channel = db.channel();
        let notify = async {
            if !streams.is_empty() {
                let _ = c.client.query(&c.st.notify, &[&channel, &notice]).await;
            }
        };
        let (begun, counted, inserted, ended, estimated, set, removed, guarded, committed, ()) = futures_util::join!(
            begun,
            runs,
            inserts,
            terminals,
            estimates,
            index_set,
            index_removed,
            guard,
            commit,
            notify
        );
        let xid = guarded.as_ref().ok().and_then(|row| row.try_get::<_, String>(0).ok());
        match begun {
            Err(e) if e.is_closed() => return Err(NotCommitted::Unsent(db.error("beginning a transaction", &e))),
            Err(e) => return Err(NotCommitted::Failed(db.error("beginning a transaction", &e))),
            Ok(()) => {}
        }
        // The first failure is the cause; the guard's and the commit's follow from it.
        if let Err(e) = counted.and(inserted).and(ended).and(estimated).and(set).and(removed) {
            let taken = matches!(&e, WorldError::Database { sqlstate: Some(s), .. } if s == UNIQUE_VIOLATION || s == CHECK_VIOLATION);
            return Err(if taken {
                NotCommitted::Taken(e)
            } else {
                NotCommitted::Failed(e)
            });
        }
        let lost = match (guarded, committed) {
            (Ok(_), Ok(())) => return Ok(()),
            (Err(e), _) if !e.is_closed() => return Err(NotCommitted::Failed(db.error("committing", &e))),
            (_, Err(e)) if !e.is_closed() => return Err(NotCommitted::Failed(db.error("committing", &e))),
            // Committed or not, as the server says; this connection is gone either way.
            (_, Err(e)) | (Err(e), _) => e,
        };
        let probe = w.events.0.first().map(|run| (*run, w.events.1[0], w.events.2[0]));
        Self::lost_commit(db, xid, probe, &lost)
            .await
            .map_err(NotCommitted::Failed)
    }

    /// The outcome of a group whose connection went while its `COMMIT` may have reached the
    /// server: asked of the server by the transaction's id, where that came back.
    /// A transaction id the server says committed is checked against one of the group's rows
    /// (`probe`: stream, sequence, event id): after a crash of the server at `synchronous_commit`
    /// off, ids are handed out again, and the id may name another transaction.
    async fn lost_commit(
        db: &Db,
        xid: Option<String>,
        probe: Option<(&str, i64, &str)>,
        e: &tokio_postgres::Error,
    ) -> Result<()> {
        let unknown = || WorldError::Database {
            context: "committing".into(),
            server: Box::new(db.server.clone()),
            message: format!(
                "the connection was lost while committing ({e}), and whether the commit happened cannot be known: \
                 retry with the same appendIdempotencyKey to find out"
            ),
            sqlstate: None,
        };
        let Some(xid) = xid else {
            return Err(unknown());
        };
        let status = async {
            let client = db.connect().await.ok()?;
            let row = client
                .query_one("SELECT pg_xact_status($1::text::xid8)", &[&xid])
                .await
                .ok()?;
            let status = row.try_get::<_, Option<String>>(0).ok().flatten()?;
            let Some((run, sequence, event_id)) = probe.filter(|_| status == "committed") else {
                return Some(status);
            };
            let found = client
                .query_opt(
                    &format!(
                        "SELECT 1 FROM {} WHERE run_id = $1 AND sequence = $2 AND event_id = $3",
                        db.table("events")
                    ),
                    &[&run, &sequence, &event_id],
                )
                .await
                .ok()?;
            Some(if found.is_some() { status } else { "aborted".to_string() })
        }
        .await;
        match status.as_deref() {
            Some("committed") => Ok(()),
            Some("aborted") => Err(WorldError::Database {
                context: "committing".into(),
                server: Box::new(db.server.clone()),
                message: format!("the connection was lost while committing ({e}); nothing was stored"),
                sqlstate: None,
            }),
            _ => Err(unknown()),
        }
    }
}

impl LogWriter for PgWriter {
    fn transaction(&mut self, scope: &Scope<'_>, body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>) -> Result<()> {
        // Owners are locked with the streams appended to, all in id order.
        let mut runs: Vec<String> = scope.runs.iter().chain(&scope.owners).map(|r| r.to_string()).collect();
        runs.sort();
        runs.dedup();
        if self.remembers(&runs, scope) {
            match self.commit_remembered(&runs, body) {
                Remembered::Committed => return Ok(()),
                Remembered::Failed(e) => return Err(self.failed(e)),
                Remembered::Locked => {
                    for run in &runs {
                        self.tails.remove(run);
                    }
                }
            }
        }
        self.under_locks(scope, &runs, body)
    }

    /// One transaction: the stream's `runs` row locked (so no other host's append to it commits
    /// meanwhile), its rows deleted from every table, and its `runs` row kept at sequence 0, so
    /// that a writer that still remembers the stream's old tail is refused by the `runs` upsert's
    /// check and runs its group again under the locks.
    fn delete_streams(&mut self, run_ids: &[&str]) -> Result<Vec<u64>> {
        let db = self.db.clone();
        let mut sorted: Vec<&str> = run_ids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        for run in &sorted {
            self.tails.remove(*run);
        }
        let (rt, conn, tails) = (&self.rt, &mut self.conn, &mut self.tails);
        let outcome = rt.block_on(async {
            Self::conn(&db, conn, tails).await?;
            let c = conn.as_ref().expect("just connected");
            let db: &Db = &db;
            let fail = |doing: &'static str| move |e: tokio_postgres::Error| db.error(doing, &e);
            c.client
                .batch_execute("BEGIN")
                .await
                .map_err(fail("beginning a deletion"))?;
            let runs = db.table("runs");
            // In id order, as appends take them.
            c.client
                .query(
                    &format!("SELECT 1 FROM {runs} WHERE run_id = ANY($1) ORDER BY run_id FOR UPDATE"),
                    &[&sorted],
                )
                .await
                .map_err(fail("locking runs to delete them"))?;
            let counted = c
                .client
                .query(
                    &format!(
                        "WITH d AS (DELETE FROM {} WHERE run_id = ANY($1) RETURNING run_id) \
                         SELECT run_id, count(*) FROM d GROUP BY run_id",
                        db.table("events")
                    ),
                    &[&sorted],
                )
                .await
                .map_err(fail("deleting runs' events"))?;
            for table in ["terminals", "estimates", "index_entries", "fold_snapshots"] {
                c.client
                    .execute(
                        &format!("DELETE FROM {} WHERE run_id = ANY($1)", db.table(table)),
                        &[&sorted],
                    )
                    .await
                    .map_err(fail("deleting runs' rows"))?;
            }
            c.client
                .execute(
                    &format!(
                        "UPDATE {runs} SET last_sequence = 0, written_after = 0, first_recorded_at = NULL, \
                         last_recorded_at = NULL, status = NULL, input_tokens = 0, output_tokens = 0, \
                         cached_tokens = 0, reasoning_tokens = 0 WHERE run_id = ANY($1)"
                    ),
                    &[&sorted],
                )
                .await
                .map_err(fail("deleting runs' catalog rows"))?;
            c.client
                .batch_execute("COMMIT")
                .await
                .map_err(fail("committing a deletion"))?;
            let mut removed = HashMap::new();
            for row in &counted {
                removed.insert(col::<String>(row, 0)?, col::<i64>(row, 1)? as u64);
            }
            Ok::<_, WorldError>(removed)
        });
        let removed = outcome.map_err(|e| self.failed(e))?;
        Ok(run_ids.iter().map(|r| removed.get(*r).copied().unwrap_or(0)).collect())
    }

    /// `VACUUM (ANALYZE)` of the world's tables: their free space goes back to the operating
    /// system where it is at the end of a table, and is kept for reuse otherwise. Writers do not
    /// wait for it.
    fn compact(&mut self) -> Result<()> {
        let db = self.db.clone();
        let (rt, conn, tails) = (&self.rt, &mut self.conn, &mut self.tails);
        let outcome = rt.block_on(async {
            Self::conn(&db, conn, tails).await?;
            let c = conn.as_ref().expect("just connected");
            for table in [
                "events",
                "runs",
                "terminals",
                "estimates",
                "index_entries",
                "fold_snapshots",
                "artifacts",
                "artifact_chunks",
                "artifact_objects",
            ] {
                c.client
                    .batch_execute(&format!("VACUUM (ANALYZE) {}", db.table(table)))
                    .await
                    .map_err(|e| db.error("compacting the world's tables", &e))?;
            }
            Ok::<_, WorldError>(())
        });
        outcome.map_err(|e| self.failed(e))
    }

    /// Every commit waits for the server.
    fn transaction_if_immediate(
        &mut self,
        _scope: &Scope<'_>,
        _body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>,
    ) -> Option<Result<()>> {
        None
    }

    fn commits_quickly(&self) -> bool {
        false
    }
}

impl PgWriter {
    /// Whether a group on `runs` can start from what the writer remembers: it has committed to
    /// each of them, knows the estimates of those whose estimates the group asks, and no append
    /// stores an artifact on the strength of its checks.
    fn remembers(&self, runs: &[String], scope: &Scope<'_>) -> bool {
        !scope.stores_artifacts
            && scope.owners.is_empty()
            && runs.iter().all(|r| self.tails.contains_key(r))
            && scope
                .estimates
                .iter()
                .all(|r| self.tails.get(*r).is_some_and(|t| t.estimates.is_some()))
    }

    /// Run the group on what the writer remembers of `runs` and commit it in one round trip.
    fn commit_remembered(&mut self, runs: &[String], body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>) -> Remembered {
        let db = self.db.clone();
        if let Err(e) = self.rt.block_on(Self::conn(&db, &mut self.conn, &mut self.tails)) {
            return Remembered::Failed(e);
        }
        if !runs.iter().all(|r| self.tails.contains_key(r)) {
            // Forgotten with a lost connection.
            return Remembered::Locked;
        }
        let c = self.conn.as_ref().expect("just connected");
        let mut tx = PgTx::new(&self.db, &self.rt, c, Known::remembered(runs, &self.tails), true);
        let ran = body(&mut tx);
        if tx.needs_server || ran.is_err() {
            return Remembered::Locked;
        }
        match self.rt.block_on(Self::write_and_commit(&db, c, &tx, true)) {
            Ok(()) => {
                let tails = tx.tails_after();
                self.remember(tails);
                #[cfg(test)]
                {
                    self.remembered_commits += 1;
                }
                Remembered::Committed
            }
            // Nothing was stored either way; under the locks, a lost connection is made again.
            Err(NotCommitted::Taken(_)) | Err(NotCommitted::Unsent(_)) => Remembered::Locked,
            Err(NotCommitted::Failed(e)) => Remembered::Failed(e),
        }
    }

    /// Run the group on what is read under the locks of its streams, in two round trips.
    fn under_locks(
        &mut self,
        scope: &Scope<'_>,
        runs: &[String],
        body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>,
    ) -> Result<()> {
        let db = self.db.clone();
        let (conn, tails) = (&mut self.conn, &mut self.tails);
        let outcome = self.rt.block_on(async {
            // A connection found gone before anything of this transaction was sent is made
            // again, once: nothing can have been stored.
            let mut tries = 0;
            loop {
                tries += 1;
                Self::conn(&db, conn, tails).await?;
                let c = conn.as_ref().expect("just connected");
                // The streams the writer does not know to have their row.
                let ensure: Vec<&str> = runs
                    .iter()
                    .map(String::as_str)
                    .filter(|r| !tails.contains_key(*r))
                    .collect();
                let mut known = Known::default();
                // `BEGIN` and the reads go in one round trip, in the order sent.
                let (begun, read) = futures_util::join!(
                    c.client.execute(&c.st.begin, &[]),
                    Self::read_scope(&db, c, runs, &ensure, scope, &mut known)
                );
                match begun {
                    Ok(_) => return Ok::<_, WorldError>((read, known)),
                    Err(e) if e.is_closed() && tries == 1 => *conn = None,
                    Err(e) => return Err(db.error("beginning a transaction", &e)),
                }
            }
        });
        let (read, known) = match outcome {
            Ok(v) => v,
            Err(e) => return Err(self.failed(e)),
        };
        if let Err(e) = read {
            return Err(self.failed(e));
        }
        let c = self.conn.as_ref().expect("connected");
        let mut tx = PgTx::new(&self.db, &self.rt, c, known, false);
        if let Err(e) = body(&mut tx) {
            // Refused: nothing is written, and what was read under the locks holds.
            let tails = tx.tails_read();
            self.remember(tails);
            return Err(self.rolled_back(e));
        }
        let db = self.db.clone();
        match self.rt.block_on(Self::write_and_commit(&db, c, &tx, false)) {
            Ok(()) => {
                let tails = tx.tails_after();
                self.remember(tails);
                Ok(())
            }
            Err(e) => Err(self.failed(e.error())),
        }
    }

    /// Keep what a commit left of its streams.
    fn remember(&mut self, tails: Vec<(String, Tail)>) {
        if self.tails.len() + tails.len() > KNOWN_STREAMS {
            self.tails.clear();
        }
        self.tails.extend(tails);
    }

    /// After a failure: forget the streams (a commit whose outcome is unknown may have moved
    /// them on), roll back what is open, and drop a connection that is gone.
    fn failed(&mut self, e: WorldError) -> WorldError {
        self.tails.clear();
        self.rolled_back(e)
    }

    /// Roll back what is open, and drop a connection that is gone.
    fn rolled_back(&mut self, e: WorldError) -> WorldError {
        if let Some(c) = &self.conn {
            if c.client.is_closed() {
                self.conn = None;
            } else {
                let rolled_back = self.rt.block_on(c.client.batch_execute("ROLLBACK"));
                if rolled_back.is_err() {
                    self.conn = None;
                }
            }
        }
        e
    }
}
