//! The writer's connection and its two round trips: reading what a group's rules will ask under
//! its streams' locks ([`Conn::read_scope`]), and writing what they staged and committing
//! ([`Conn::write_and_commit`]). The statements are in `writer.sql`.

use super::tx::{Known, PgTx, RunState, Writes};
use crate::error::{Result, WorldError};
use crate::pg::{col, Db};
use crate::store::{KeyedEvent, Scope};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

/// The SQLSTATE of a unique key's refusal.
const UNIQUE_VIOLATION: &str = "23505";

/// The SQLSTATE of a check's refusal: the `runs` upsert's, of a stream whose last sequence is not
/// the one the group started after (deleted, or written by another host, since the writer
/// remembered it).
const CHECK_VIOLATION: &str = "23514";

/// Why a group's writes did not commit.
pub(super) enum NotCommitted {
    /// The connection was found gone at `BEGIN`: nothing reached the server.
    Unsent(WorldError),
    /// A unique key refused a write: the transaction rolled back.
    Taken(WorldError),
    Failed(WorldError),
}

impl NotCommitted {
    pub(super) fn error(self) -> WorldError {
        match self {
            NotCommitted::Unsent(e) | NotCommitted::Taken(e) | NotCommitted::Failed(e) => e,
        }
    }
}

/// A live connection and its prepared statements.
pub(super) struct Conn {
    pub(super) client: Client,
    pub(super) st: Statements,
}

/// The writer's statements, prepared on each connection.
pub(super) struct Statements {
    pub(super) begin: Statement,
    ensure_runs: Statement,
    lock_runs: Statement,
    pub(super) keys: Statement,
    pub(super) terminals: Statement,
    pub(super) estimates: Statement,
    insert_events: Statement,
    insert_terminals: Statement,
    put_estimates: Statement,
    put_runs: Statement,
    pub(super) index_lock: Statement,
    pub(super) index_holder: Statement,
    put_index: Statement,
    drop_index: Statement,
    guard: Statement,
    notify: Statement,
}

/// The writer's statements, each after a line `-- name: <name>`.
const WRITER_SQL: &str = include_str!("writer.sql");

/// The statement `name` of [`WRITER_SQL`], for the world's schema.
fn writer_sql(db: &Db, name: &str) -> String {
    let marker = format!("-- name: {name}\n");
    let at = WRITER_SQL.find(&marker).map(|at| at + marker.len());
    let text = at
        .map(|at| &WRITER_SQL[at..])
        .unwrap_or_else(|| panic!("writer.sql has no statement {name}"));
    let end = text.find("\n\n").unwrap_or(text.len());
    text[..end].replace("{s}", &db.schema)
}

impl Statements {
    pub(super) async fn prepare(db: &Db, c: &Client) -> std::result::Result<Statements, tokio_postgres::Error> {
        let sql = |name: &str| writer_sql(db, name);
        Ok(Statements {
            begin: c.prepare(&sql("begin")).await?,
            ensure_runs: c.prepare(&sql("ensure_runs")).await?,
            lock_runs: c.prepare(&sql("lock_runs")).await?,
            keys: c.prepare(&sql("keys")).await?,
            terminals: c.prepare(&sql("terminals")).await?,
            estimates: c.prepare(&sql("estimates")).await?,
            insert_events: c.prepare(&sql("insert_events")).await?,
            insert_terminals: c.prepare(&sql("insert_terminals")).await?,
            put_estimates: c.prepare(&sql("put_estimates")).await?,
            put_runs: c.prepare(&sql("put_runs")).await?,
            index_lock: c.prepare(&sql("index_lock")).await?,
            index_holder: c.prepare(&sql("index_holder")).await?,
            put_index: c.prepare(&sql("put_index")).await?,
            drop_index: c.prepare(&sql("drop_index")).await?,
            guard: c.prepare(&sql("guard")).await?,
            notify: c.prepare(&sql("notify")).await?,
        })
    }
}

/// What [`Conn::read_scope`] asks: the streams, the nodes whose ends (and the streams' own),
/// the idempotency keys, and the streams whose open estimates are not known yet.
struct Questions<'a> {
    runs: &'a [String],
    ensure: &'a [&'a str],
    key_runs: Vec<&'a str>,
    keys: Vec<&'a str>,
    node_runs: Vec<&'a str>,
    nodes: Vec<&'a str>,
    estimate_runs: Vec<&'a str>,
}

/// The rows that answer [`Questions`], in their order.
struct Answers {
    locked: Vec<Row>,
    keyed: Vec<Row>,
    ended: Vec<Row>,
    estimates: Vec<Row>,
}

impl<'a> Questions<'a> {
    fn of(runs: &'a [String], ensure: &'a [&'a str], scope: &'a Scope<'_>, known: &Known) -> Questions<'a> {
        let (key_runs, keys) = scope.keys.iter().copied().unzip();
        let mut node_runs: Vec<&str> = runs.iter().map(String::as_str).collect();
        let mut nodes: Vec<&str> = vec![""; runs.len()];
        for (run, node) in &scope.nodes {
            node_runs.push(run);
            nodes.push(node);
        }
        let estimate_runs = scope
            .estimates
            .iter()
            .copied()
            .filter(|r| !known.estimated(r))
            .collect();
        Questions {
            runs,
            ensure,
            key_runs,
            keys,
            node_runs,
            nodes,
            estimate_runs,
        }
    }

    /// Send every question in one round trip; a statement with nothing to ask is not sent.
    async fn ask(&self, db: &Db, c: &Conn) -> Result<Answers> {
        let ensure: [&(dyn ToSql + Sync); 1] = [&self.ensure];
        let runs: [&(dyn ToSql + Sync); 1] = [&self.runs];
        let keys: [&(dyn ToSql + Sync); 2] = [&self.key_runs, &self.keys];
        let nodes: [&(dyn ToSql + Sync); 2] = [&self.node_runs, &self.nodes];
        let estimates: [&(dyn ToSql + Sync); 1] = [&self.estimate_runs];
        let (_, locked, keyed, ended, estimates) = futures_util::try_join!(
            query_if(
                db,
                c,
                &c.st.ensure_runs,
                &ensure,
                !self.ensure.is_empty(),
                "adding streams"
            ),
            query_if(db, c, &c.st.lock_runs, &runs, true, "locking streams"),
            query_if(
                db,
                c,
                &c.st.keys,
                &keys,
                !self.keys.is_empty(),
                "reading idempotency keys"
            ),
            query_if(db, c, &c.st.terminals, &nodes, true, "reading stream ends"),
            query_if(
                db,
                c,
                &c.st.estimates,
                &estimates,
                !self.estimate_runs.is_empty(),
                "reading budget estimates"
            ),
        )?;
        Ok(Answers {
            locked,
            keyed,
            ended,
            estimates,
        })
    }

    /// Keep the answers in `known`, with what was asked, so that a question is not asked twice.
    fn learn(&self, db: &Db, scope: &Scope<'_>, answers: Answers, known: &mut Known) -> Result<()> {
        for row in &answers.locked {
            let tokens: [i64; 4] = [col(row, 2)?, col(row, 3)?, col(row, 4)?, col(row, 5)?];
            let state = RunState {
                last: col::<i64>(row, 1)? as u64,
                usage: tokens.map(|t| t as u64),
            };
            known.runs.insert(col(row, 0)?, state);
        }
        for run in self.runs {
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
        for row in &answers.keyed {
            let event = KeyedEvent {
                sequence: col::<i64>(row, 2)? as u64,
                digest: col::<Option<String>>(row, 3)?.unwrap_or_default(),
                envelope: col(row, 4)?,
            };
            known.keys.insert((col(row, 0)?, col(row, 1)?), event);
        }
        for (run, key) in &scope.keys {
            known.asked_keys.insert((run.to_string(), key.to_string()));
        }
        for row in &answers.ended {
            known
                .terminals
                .insert((col(row, 0)?, col(row, 1)?), col::<i64>(row, 2)? as u64);
        }
        for run in &self.estimate_runs {
            known.estimates.entry(run.to_string()).or_default();
        }
        for row in &answers.estimates {
            let run: String = col(row, 0)?;
            known
                .estimates
                .entry(run)
                .or_default()
                .insert(col(row, 1)?, col::<i64>(row, 2)? as u64);
        }
        Ok(())
    }
}

/// What each part of [`Conn::write_and_commit`]'s round trip came back with.
struct Sent {
    begun: std::result::Result<(), tokio_postgres::Error>,
    /// The writes', the first failure of them.
    written: Result<()>,
    guarded: std::result::Result<Row, tokio_postgres::Error>,
    committed: std::result::Result<(), tokio_postgres::Error>,
}

impl Conn {
    /// Lock the streams `runs` (sorted, distinct) and read what the rules will ask of them into
    /// `known`. `ensure` names the streams that may have no `runs` row yet.
    pub(super) async fn read_scope(
        &self,
        db: &Db,
        runs: &[String],
        ensure: &[&str],
        scope: &Scope<'_>,
        known: &mut Known,
    ) -> Result<()> {
        let questions = Questions::of(runs, ensure, scope, known);
        let answers = questions.ask(db, self).await?;
        questions.learn(db, scope, answers, known)
    }

    /// Write what `tx` staged and commit (with `begin`, sending `BEGIN` first, for a transaction
    /// not yet begun); `Ok` only once the commit is known to have happened.
    pub(super) async fn write_and_commit(
        &self,
        db: &Db,
        tx: &PgTx<'_>,
        begin: bool,
    ) -> std::result::Result<(), NotCommitted> {
        let w = tx.writes();
        let sent = self.send(db, &w, begin).await;
        settle(db, &w, sent).await
    }

    /// `BEGIN` if asked, the group's writes (each statement a future of its own, so that all are
    /// sent before `COMMIT`), the guard, `COMMIT`, and a notification behind it: one round trip.
    async fn send(&self, db: &Db, w: &Writes<'_>, begin: bool) -> Sent {
        let c = self;
        let begun = async {
            if begin {
                c.client.execute(&c.st.begin, &[]).await?;
            }
            Ok::<_, tokio_postgres::Error>(())
        };
        // The streams' rows first: a transaction begun here takes their locks with this write.
        let (ids, last, at, i, o, ca, rt, st, after) = w.run_columns();
        let run_params: [&(dyn ToSql + Sync); 10] =
            [&ids, &last, &at, &i, &o, &ca, &rt, &st, &after, &w.first_recorded];
        let (e, t, es, set, rm) = (&w.events, &w.terminals, &w.estimates, &w.index_set, &w.index_removed);
        let event_params: [&(dyn ToSql + Sync); 8] = [&e.0, &e.1, &e.2, &e.3, &e.4, &e.5, &e.6, &e.7];
        let terminal_params: [&(dyn ToSql + Sync); 4] = [&t.0, &t.1, &t.2, &t.3];
        let estimate_params: [&(dyn ToSql + Sync); 3] = [&es.0, &es.1, &es.2];
        let set_params: [&(dyn ToSql + Sync); 5] = [&set.0, &set.1, &set.2, &set.3, &set.4];
        let removed_params: [&(dyn ToSql + Sync); 2] = [&rm.0, &rm.1];
        // A hint for other processes' live views, sent behind the `COMMIT` in the same round
        // trip, so the server runs it after the commit and outside the transaction. Its failure
        // loses nothing: live views poll too.
        let streams: Vec<&str> = w.runs.iter().map(|r| r.0).collect();
        let (channel, notice) = (db.channel(), announcement(&streams));
        let notify = async {
            if !streams.is_empty() {
                let _ = c.client.query(&c.st.notify, &[&channel, &notice]).await;
            }
        };
        let (begun, runs, events, ends, estimates, set, removed, guarded, committed, ()) = futures_util::join!(
            begun,
            query_if(
                db,
                c,
                &c.st.put_runs,
                &run_params,
                !w.runs.is_empty(),
                "recording the streams' last sequences"
            ),
            query_if(
                db,
                c,
                &c.st.insert_events,
                &event_params,
                !e.0.is_empty(),
                "inserting events"
            ),
            query_if(
                db,
                c,
                &c.st.insert_terminals,
                &terminal_params,
                !t.0.is_empty(),
                "recording stream ends"
            ),
            query_if(
                db,
                c,
                &c.st.put_estimates,
                &estimate_params,
                !es.0.is_empty(),
                "recording budget estimates"
            ),
            query_if(
                db,
                c,
                &c.st.put_index,
                &set_params,
                !set.0.is_empty(),
                "writing index entries"
            ),
            query_if(
                db,
                c,
                &c.st.drop_index,
                &removed_params,
                !rm.0.is_empty(),
                "removing index entries"
            ),
            c.client.query_one(&c.st.guard, &[]),
            c.client.batch_execute("COMMIT"),
            notify
        );
        Sent {
            begun,
            // The first failure is the cause; the guard's and the commit's follow from it.
            written: runs
                .and(events)
                .and(ends)
                .and(estimates)
                .and(set)
                .and(removed)
                .map(drop),
            guarded,
            committed,
        }
    }
}

/// Run `st` with `params` when there is something to ask or write (`any`); its rows, if any.
async fn query_if(
    db: &Db,
    c: &Conn,
    st: &Statement,
    params: &[&(dyn ToSql + Sync)],
    any: bool,
    doing: &'static str,
) -> Result<Vec<Row>> {
    if !any {
        return Ok(Vec::new());
    }
    c.client.query(st, params).await.map_err(|e| db.error(doing, &e))
}

/// The outcome of a group's round trip: committed only when every write and the guard
/// succeeded and `COMMIT` returned, or, where the connection went meanwhile, when the server
/// says so.
async fn settle(db: &Db, w: &Writes<'_>, sent: Sent) -> std::result::Result<(), NotCommitted> {
    let xid = sent
        .guarded
        .as_ref()
        .ok()
        .and_then(|row| row.try_get::<_, String>(0).ok());
    match sent.begun {
        Err(e) if e.is_closed() => return Err(NotCommitted::Unsent(db.error("beginning a transaction", &e))),
        Err(e) => return Err(NotCommitted::Failed(db.error("beginning a transaction", &e))),
        Ok(()) => {}
    }
    if let Err(e) = sent.written {
        let taken = matches!(&e, WorldError::Database { sqlstate: Some(s), .. } if s == UNIQUE_VIOLATION || s == CHECK_VIOLATION);
        return Err(if taken {
            NotCommitted::Taken(e)
        } else {
            NotCommitted::Failed(e)
        });
    }
    let lost = match (sent.guarded, sent.committed) {
        (Ok(_), Ok(())) => return Ok(()),
        (Err(e), _) if !e.is_closed() => return Err(NotCommitted::Failed(db.error("committing", &e))),
        (_, Err(e)) if !e.is_closed() => return Err(NotCommitted::Failed(db.error("committing", &e))),
        // Committed or not, as the server says; this connection is gone either way.
        (_, Err(e)) | (Err(e), _) => e,
    };
    let probe = w.events.0.first().map(|run| (*run, w.events.1[0], w.events.2[0]));
    lost_commit(db, xid, probe, &lost).await.map_err(NotCommitted::Failed)
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
