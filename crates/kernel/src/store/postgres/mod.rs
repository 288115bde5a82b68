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
mod round_trips;
#[cfg(test)]
mod tests;
mod tx;

use crate::error::{Result, WorldError};
use crate::pg::{col, Db};
use crate::store::{LogTx, LogWriter, Scope};
pub use reader::PgReader;
use round_trips::{Conn, NotCommitted, Statements};
use std::collections::HashMap;
use std::sync::Arc;
use tx::{Known, PgTx, Tail};

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

/// How a group's attempt from memory ended.
enum Remembered {
    Committed,
    /// Another writer got there first, or a question or refusal needs the server: nothing was
    /// stored, and the group runs again under the streams' locks.
    Locked,
    Failed(WorldError),
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
        match self.rt.block_on(c.write_and_commit(&db, &tx, true)) {
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
                    c.read_scope(&db, runs, &ensure, scope, &mut known)
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
        match self.rt.block_on(c.write_and_commit(&db, &tx, false)) {
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
