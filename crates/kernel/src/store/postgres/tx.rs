//! The transaction the append rules see: what was read under the streams' locks, and the rows
//! staged on top of it, written in one go at commit.
//!
//! A savepoint is a mark in the staged lists, as in the virtual store: nothing reaches the server
//! before the group's writes, so undoing an append is truncating what it staged. A question the
//! transaction's [`Scope`](crate::store::Scope) did not announce is asked of the server on
//! the spot (locking a stream first), which is slower and as correct.
//!
//! A transaction may instead start from what the writer remembers of its streams ([`Tail`]s,
//! kept from its own commits). It then asks the server nothing: an idempotency key or a node end
//! it does not know of is taken to be absent, and the writes say so to the server, whose unique
//! keys refuse the commit if it was not (another writer appended, or the key is taken). Anything
//! it could not answer without the server, and any append it refuses, sets
//! [`PgTx::needs_server`]: a refusal made from memory is not sent, since what was remembered may
//! be out of date, and the group is run again under the streams' locks.

mod writes;

pub(super) use writes::Writes;

use super::Conn;
use crate::catalog::{CatalogNote, CatalogStage};
use crate::error::{Result, WorldError};
use crate::pg::{col, Db};
use crate::store::{KeyedEvent, LogTx, RowRef, StagedIndex};
use std::collections::{HashMap, HashSet};
use tokio_postgres::types::ToSql;

/// A stream's state when its lock was taken.
pub(super) struct RunState {
    pub last: u64,
    pub usage: [u64; 4],
}

/// What the writer remembers of a stream after a commit of its own: all of it changes only with
/// an event of the stream, so it holds for as long as `last` is still the stream's last sequence.
#[derive(Debug, Clone)]
pub(super) struct Tail {
    pub last: u64,
    pub usage: [u64; 4],
    /// The sequence of the stream's own end, if it has ended.
    pub ended: Option<u64>,
    /// The stream's open budget estimates by model, when they were read.
    pub estimates: Option<HashMap<String, u64>>,
}

/// What was read under the locks.
#[derive(Default)]
pub(super) struct Known {
    pub runs: HashMap<String, RunState>,
    pub keys: HashMap<(String, String), KeyedEvent>,
    pub asked_keys: HashSet<(String, String)>,
    /// Terminal events by `(stream, node)` ('' for the stream's own end).
    pub terminals: HashMap<(String, String), u64>,
    pub asked_ends: HashSet<String>,
    pub asked_nodes: HashSet<(String, String)>,
    /// Open budget estimates by stream, then model.
    pub estimates: HashMap<String, HashMap<String, u64>>,
    /// The stream holding each index entry read, by `(index, key)`: read under the entry's
    /// advisory lock, held until the transaction ends.
    pub index: HashMap<(String, String), Option<String>>,
}

impl Known {
    pub fn estimated(&self, run: &str) -> bool {
        self.estimates.contains_key(run)
    }

    /// What the writer remembers of `runs`, each of which has a tail in `tails`.
    pub fn remembered(runs: &[String], tails: &HashMap<String, Tail>) -> Known {
        let mut known = Known::default();
        for run in runs {
            let tail = &tails[run];
            known.runs.insert(
                run.clone(),
                RunState {
                    last: tail.last,
                    usage: tail.usage,
                },
            );
            known.asked_ends.insert(run.clone());
            if let Some(end) = tail.ended {
                known.terminals.insert((run.clone(), String::new()), end);
            }
            if let Some(models) = &tail.estimates {
                known.estimates.insert(run.clone(), models.clone());
            }
        }
        known
    }
}

struct Staged {
    run_id: String,
    sequence: u64,
    event_id: String,
    event_type: String,
    key: Option<String>,
    digest: Option<String>,
    recorded_at: String,
    envelope: String,
}

pub(super) struct PgTx<'a> {
    db: &'a Db,
    /// The writer's runtime, which drives its connection.
    rt: &'a tokio::runtime::Runtime,
    conn: &'a Conn,
    known: Known,
    rows: Vec<Staged>,
    terminals: Vec<(String, String, u64, String)>,
    /// Stream, model, amount, released.
    estimates: Vec<(String, String, u64, bool)>,
    usage: Vec<(String, [u64; 4])>,
    /// Index, key, value (`None` removes), stream, sequence.
    index: Vec<StagedIndex>,
    catalog: CatalogStage,
    mark: (usize, usize, usize, usize, usize, usize),
    /// Started from what the writer remembers, without locks (see the module's doc).
    remembered: bool,
    /// Set when a transaction started from memory met a question or a refusal that needs the
    /// server: its group is to be run again under the streams' locks.
    pub needs_server: bool,
}

fn apply(open: u64, amount: u64, released: bool) -> u64 {
    if released {
        open.saturating_sub(amount)
    } else {
        open.saturating_add(amount)
    }
}

impl<'a> PgTx<'a> {
    /// A transaction on what was read under the streams' locks (`remembered` false) or on what
    /// the writer remembers (true).
    pub fn new(
        db: &'a Db,
        rt: &'a tokio::runtime::Runtime,
        conn: &'a Conn,
        known: Known,
        remembered: bool,
    ) -> PgTx<'a> {
        PgTx {
            db,
            rt,
            conn,
            known,
            rows: Vec::new(),
            terminals: Vec::new(),
            estimates: Vec::new(),
            usage: Vec::new(),
            index: Vec::new(),
            catalog: CatalogStage::default(),
            mark: (0, 0, 0, 0, 0, 0),
            remembered,
            needs_server: false,
        }
    }

    /// In a transaction started from memory, a question only the server can answer: the group is
    /// to be run again under the streams' locks, and this run's answer does not matter.
    fn ask_server(&mut self) -> Result<()> {
        if self.remembered {
            self.needs_server = true;
            return Err(WorldError::RuntimeIntegrity {
                reason: "internal: a question for the server in a transaction started from memory".into(),
            });
        }
        Ok(())
    }

    /// Each stream's state once this transaction commits: what was known of it, and what was
    /// staged on top.
    pub fn tails_after(&self) -> Vec<(String, Tail)> {
        self.tails(true)
    }

    /// Each stream's state as read, for a transaction that is rolled back.
    pub fn tails_read(&self) -> Vec<(String, Tail)> {
        self.tails(false)
    }

    fn tails(&self, committed: bool) -> Vec<(String, Tail)> {
        self.known
            .runs
            .iter()
            .map(|(run, state)| {
                let mut tail = Tail {
                    last: state.last,
                    usage: state.usage,
                    ended: self.known.terminals.get(&(run.clone(), String::new())).copied(),
                    estimates: self.known.estimates.get(run).cloned(),
                };
                if !committed {
                    return (run.clone(), tail);
                }
                if let Some(row) = self.rows.iter().rev().find(|r| &r.run_id == run) {
                    tail.last = row.sequence;
                }
                for (_, tokens) in self.usage.iter().filter(|u| &u.0 == run) {
                    tail.usage = std::array::from_fn(|i| tail.usage[i].saturating_add(tokens[i]));
                }
                if let Some(t) = self.terminals.iter().find(|t| &t.0 == run && t.1.is_empty()) {
                    tail.ended = Some(t.2);
                }
                if let Some(models) = &mut tail.estimates {
                    for (_, model, amount, released) in self.estimates.iter().filter(|e| &e.0 == run) {
                        let open = models.entry(model.clone()).or_insert(0);
                        *open = apply(*open, *amount, *released);
                    }
                }
                (run.clone(), tail)
            })
            .collect()
    }

    /// Lock `run` and read its state, for a question the scope did not announce.
    fn read_run(&mut self, run: &str) -> Result<()> {
        self.ask_server()?;
        let runs = vec![run.to_string()];
        let scope = crate::store::Scope {
            runs: vec![run],
            ..Default::default()
        };
        let (db, rt, conn) = (self.db, self.rt, self.conn);
        rt.block_on(conn.read_scope(db, &runs, &[run], &scope, &mut self.known))
    }

    fn run(&mut self, run: &str) -> Result<&RunState> {
        if !self.known.runs.contains_key(run) {
            self.read_run(run)?;
        }
        Ok(&self.known.runs[run])
    }

    /// The open estimates of `run` by model, as stored (read now if they were not).
    fn stored_estimates(&mut self, run: &str) -> Result<&HashMap<String, u64>> {
        if !self.known.estimated(run) {
            self.ask_server()?;
            let (db, rt, conn) = (self.db, self.rt, self.conn);
            let rows = rt
                .block_on(conn.client.query(&conn.st.estimates, &[&vec![run]]))
                .map_err(|e| db.error("reading budget estimates", &e))?;
            let mut models = HashMap::new();
            for row in &rows {
                models.insert(col::<String>(row, 1)?, col::<i64>(row, 2)? as u64);
            }
            self.known.estimates.insert(run.to_string(), models);
        }
        Ok(&self.known.estimates[run])
    }
}

impl LogTx for PgTx<'_> {
    fn last_sequence(&mut self, run_id: &str) -> Result<u64> {
        if let Some(r) = self.rows.iter().rev().find(|r| r.run_id == run_id) {
            return Ok(r.sequence);
        }
        Ok(self.run(run_id)?.last)
    }

    fn find_by_key(&mut self, run_id: &str, key: &str) -> Result<Option<KeyedEvent>> {
        if let Some(r) = self
            .rows
            .iter()
            .find(|r| r.run_id == run_id && r.key.as_deref() == Some(key))
        {
            return Ok(Some(KeyedEvent {
                sequence: r.sequence,
                digest: r.digest.clone().unwrap_or_default(),
                envelope: r.envelope.clone(),
            }));
        }
        let asked = (run_id.to_string(), key.to_string());
        if self.remembered && !self.known.asked_keys.contains(&asked) {
            // Taken to be free: the key's unique index refuses the commit if it was not.
            return Ok(None);
        }
        if !self.known.asked_keys.contains(&asked) {
            self.run(run_id)?;
            let (db, rt, conn) = (self.db, self.rt, self.conn);
            let rows = rt
                .block_on(conn.client.query(&conn.st.keys, &[&vec![run_id], &vec![key]]))
                .map_err(|e| db.error("reading idempotency keys", &e))?;
            if let Some(row) = rows.first() {
                self.known.keys.insert(
                    asked.clone(),
                    KeyedEvent {
                        sequence: col::<i64>(row, 2)? as u64,
                        digest: col::<Option<String>>(row, 3)?.unwrap_or_default(),
                        envelope: col(row, 4)?,
                    },
                );
            }
            self.known.asked_keys.insert(asked.clone());
        }
        Ok(self.known.keys.get(&asked).cloned())
    }

    fn insert(&mut self, row: &RowRef<'_>) -> Result<()> {
        if row.sequence != self.last_sequence(row.run_id)? + 1 {
            return Err(WorldError::RuntimeIntegrity {
                reason: format!(
                    "{} sequence {} would leave a hole or a duplicate",
                    row.run_id, row.sequence
                ),
            });
        }
        if let Some(key) = row.key {
            if self.find_by_key(row.run_id, key)?.is_some() {
                return Err(WorldError::RuntimeIntegrity {
                    reason: format!("{} idempotency key {key:?} is already taken", row.run_id),
                });
            }
        }
        self.rows.push(Staged {
            run_id: row.run_id.to_string(),
            sequence: row.sequence,
            event_id: row.event_id.to_string(),
            event_type: row.event_type.to_string(),
            key: row.key.map(str::to_string),
            digest: row.digest.map(str::to_string),
            recorded_at: row.recorded_at.to_string(),
            envelope: row.envelope.to_string(),
        });
        Ok(())
    }

    fn terminal(&mut self, run_id: &str, node: &str) -> Result<Option<u64>> {
        if let Some(t) = self.terminals.iter().find(|t| t.0 == run_id && t.1 == node) {
            return Ok(Some(t.2));
        }
        let asked = (run_id.to_string(), node.to_string());
        let announced = if node.is_empty() {
            self.known.asked_ends.contains(run_id)
        } else {
            self.known.asked_nodes.contains(&asked)
        };
        if !announced && self.remembered && !node.is_empty() {
            // A node end taken to be absent: every append that asks this goes on to record the
            // node's end (or is refused, which sends nothing), and the terminals' unique key
            // refuses the commit if the node had ended.
            return Ok(None);
        }
        if !announced {
            self.run(run_id)?;
            let (db, rt, conn) = (self.db, self.rt, self.conn);
            let rows = rt
                .block_on(conn.client.query(&conn.st.terminals, &[&vec![run_id], &vec![node]]))
                .map_err(|e| db.error("reading stream ends", &e))?;
            if let Some(row) = rows.first() {
                self.known.terminals.insert(asked.clone(), col::<i64>(row, 2)? as u64);
            }
            self.known.asked_nodes.insert(asked.clone());
            if node.is_empty() {
                self.known.asked_ends.insert(run_id.to_string());
            }
        }
        Ok(self.known.terminals.get(&asked).copied())
    }

    fn insert_terminal(&mut self, run_id: &str, node: &str, sequence: u64, event_type: &str) -> Result<()> {
        if self.terminal(run_id, node)?.is_some() {
            return Err(WorldError::RuntimeIntegrity {
                reason: format!("{run_id} node {node:?} already has a terminal event"),
            });
        }
        self.terminals
            .push((run_id.to_string(), node.to_string(), sequence, event_type.to_string()));
        Ok(())
    }

    fn estimate(&mut self, run_id: &str, model: &str) -> Result<u64> {
        let mut open = self.stored_estimates(run_id)?.get(model).copied().unwrap_or(0);
        for (_, _, amount, released) in self.estimates.iter().filter(|e| e.0 == run_id && e.1 == model) {
            open = apply(open, *amount, *released);
        }
        Ok(open)
    }

    fn estimate_total(&mut self, run_id: &str) -> Result<u64> {
        let mut models: Vec<String> = self.stored_estimates(run_id)?.keys().cloned().collect();
        for e in self.estimates.iter().filter(|e| e.0 == run_id) {
            if !models.contains(&e.1) {
                models.push(e.1.clone());
            }
        }
        let mut total = 0u64;
        for model in models {
            total = total.saturating_add(self.estimate(run_id, &model)?);
        }
        Ok(total)
    }

    fn add_estimate(&mut self, run_id: &str, model: &str, amount: u64, released: bool) -> Result<()> {
        self.stored_estimates(run_id)?;
        self.estimates
            .push((run_id.to_string(), model.to_string(), amount, released));
        Ok(())
    }

    fn usage(&mut self, run_id: &str) -> Result<[u64; 4]> {
        let mut usage = self.run(run_id)?.usage;
        for (_, tokens) in self.usage.iter().filter(|u| u.0 == run_id) {
            usage = std::array::from_fn(|i| usage[i].saturating_add(tokens[i]));
        }
        Ok(usage)
    }

    fn add_usage(&mut self, run_id: &str, tokens: [u64; 4]) -> Result<()> {
        self.run(run_id)?;
        self.usage.push((run_id.to_string(), tokens));
        Ok(())
    }

    fn index_holder(&mut self, index: &str, key: &str) -> Result<Option<String>> {
        if let Some(holder) = StagedIndex::holder_after(&self.index, index, key) {
            return Ok(holder);
        }
        let asked = (index.to_string(), key.to_string());
        if !self.known.index.contains_key(&asked) {
            self.ask_server()?;
            // The entry's lock, then its row, in one round trip: the read starts after the lock
            // is held, so it sees what an earlier holder committed.
            let (db, rt, conn) = (self.db, self.rt, self.conn);
            let lock_key = format!("{}\n{index}\n{key}", db.table("index_entries"));
            let lock_params: [&(dyn ToSql + Sync); 1] = [&lock_key];
            let holder_params: [&(dyn ToSql + Sync); 2] = [&index, &key];
            let (locked, rows) = rt.block_on(async {
                futures_util::join!(
                    conn.client.query(&conn.st.index_lock, &lock_params),
                    conn.client.query(&conn.st.index_holder, &holder_params)
                )
            });
            locked.map_err(|e| db.error("locking an index entry", &e))?;
            let rows = rows.map_err(|e| db.error("reading an index entry", &e))?;
            let holder = rows.first().map(|row| col::<String>(row, 0)).transpose()?;
            self.known.index.insert(asked.clone(), holder);
        }
        Ok(self.known.index[&asked].clone())
    }

    fn put_index(&mut self, index: &str, key: &str, value: Option<&str>, run_id: &str, sequence: u64) -> Result<()> {
        self.index.push(StagedIndex::new(index, key, value, run_id, sequence));
        Ok(())
    }

    fn catalog(&mut self, note: CatalogNote) -> Result<()> {
        self.catalog.note(note);
        Ok(())
    }

    fn savepoint(&mut self) -> Result<()> {
        self.mark = (
            self.rows.len(),
            self.terminals.len(),
            self.estimates.len(),
            self.usage.len(),
            self.index.len(),
            self.catalog.len(),
        );
        Ok(())
    }

    fn release(&mut self) -> Result<()> {
        Ok(())
    }

    fn rollback_to(&mut self) -> Result<()> {
        // A refusal made from memory may rest on a stream state that has moved on.
        self.needs_server |= self.remembered;
        self.rows.truncate(self.mark.0);
        self.terminals.truncate(self.mark.1);
        self.estimates.truncate(self.mark.2);
        self.usage.truncate(self.mark.3);
        self.index.truncate(self.mark.4);
        self.catalog.truncate(self.mark.5);
        Ok(())
    }

    fn may_run_again(&self) -> bool {
        self.remembered
    }
}
