//! The prep thread and the writer thread of a world, and the bound on what the prep thread may
//! run ahead of the writer.

use super::append::{PrepMsg, WriteMsg};
use super::{Ends, Running};
use crate::artifacts::ArtifactStore;
use crate::clock;
use crate::error::{Result, WorldError};
use crate::events::{self, PreparedAppend};
use crate::runtime::{panic_error, Completer, Output, Pool, Ticket};
use crate::store::{LogReader, LogTx, LogWriter, Scope};
use crate::vocabulary::Materializer;
use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Most appends committed in one transaction.
pub const MAX_GROUP: usize = 4096;

/// Start a thread of the world's own; failing to (at the process's thread limit) is `WORLD_IO`.
pub(super) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    crate::runtime::start_thread(name, f)
        .map(drop)
        .map_err(|e| WorldError::io(format!("starting the thread {name}"), None, e))
}

pub(super) fn prep_loop(
    rx: Receiver<PrepMsg>,
    to_writer: ToWriter,
    artifacts: &ArtifactStore,
    reader: &dyn LogReader,
    completer: &dyn Completer,
    pending: &AtomicUsize,
    unsettled: &AtomicUsize,
) {
    while let Ok(msg) = rx.recv() {
        match msg {
            PrepMsg::Append(ticket, req) => {
                let prepared =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| events::prepare(req, artifacts)))
                        .unwrap_or_else(|p| Err(panic_error(p)));
                match prepared {
                    // Answered by a read of its key, and never by the writer.
                    Ok(p) if p.refused.is_some() => answer_refused(reader, completer, unsettled, ticket, p),
                    Ok(p) => to_writer.append(ticket, p),
                    Err(e) => {
                        unsettled.fetch_sub(1, Ordering::AcqRel);
                        completer.complete(vec![(ticket, Err(e))]);
                    }
                }
                // Only now, with the append passed on, may the caller send straight to the writer.
                pending.fetch_sub(1, Ordering::AcqRel);
            }
            PrepMsg::Group(ticket, reqs) => {
                let prepared = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    reqs.into_iter()
                        .map(|req| events::prepare(req, artifacts))
                        .collect::<Result<Vec<_>>>()
                }))
                .unwrap_or_else(|p| Err(panic_error(p)));
                match prepared {
                    Ok(group) => to_writer.group(ticket, group),
                    Err(e) => {
                        unsettled.fetch_sub(1, Ordering::AcqRel);
                        completer.complete(vec![(ticket, Err(e))]);
                    }
                }
                pending.fetch_sub(1, Ordering::AcqRel);
            }
            PrepMsg::Refused(ticket, p) => {
                answer_refused(reader, completer, unsettled, ticket, *p);
                pending.fetch_sub(1, Ordering::AcqRel);
            }
            PrepMsg::Close(ticket, let_go) => {
                let _ = to_writer.tx.send(WriteMsg::Close(ticket, let_go));
                return;
            }
        }
    }
}

/// Settle an append prepared with a refusal (see [`events::answer_refused`]).
fn answer_refused(
    reader: &dyn LogReader,
    completer: &dyn Completer,
    unsettled: &AtomicUsize,
    ticket: Ticket,
    prepared: PreparedAppend,
) {
    let answer = events::answer_refused(reader, prepared).map(Output::Json);
    unsettled.fetch_sub(1, Ordering::AcqRel);
    completer.complete(vec![(ticket, answer)]);
}

/// The writer of a read-only world. [`World::append`] refuses before anything reaches it; it
/// refuses too.
pub(super) struct ReadOnlyLog;

impl LogWriter for ReadOnlyLog {
    fn transaction(&mut self, _scope: &Scope<'_>, _body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>) -> Result<()> {
        Err(WorldError::Path {
            message: "an append needs a writable world, and this one was opened read-only".into(),
        })
    }

    fn transaction_if_immediate(
        &mut self,
        _scope: &Scope<'_>,
        _body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>,
    ) -> Option<Result<()>> {
        None
    }

    fn delete_streams(&mut self, _runs: &[&str]) -> Result<Vec<u64>> {
        Err(WorldError::Path {
            message: "deleting a run needs a writable world, and this one was opened read-only".into(),
        })
    }
}

/// Takes a run's fold snapshot in the background (see [`Materializer::take_snapshot`]),
/// counted as an operation running, so that a close waits for it.
pub(super) struct Snapshots {
    pub(super) reader: Arc<dyn LogReader>,
    pub(super) materializer: Arc<dyn Materializer>,
    pub(super) running: Arc<Running>,
}

impl Snapshots {
    /// After `outcomes` of `batch`, cut into `units`, committed: a snapshot of each run that has
    /// reached a multiple of [`Materializer::snapshot_every`] events.
    fn after_commit(&self, batch: &[PreparedAppend], units: &[usize], outcomes: &[events::UnitOutcome]) {
        let mut rest = batch;
        let every = self.materializer.snapshot_every();
        for (&n, outcome) in units.iter().zip(outcomes) {
            let (unit, after) = rest.split_at(n);
            rest = after;
            let Ok(envelopes) = outcome else { continue };
            for (item, envelope) in unit.iter().zip(envelopes) {
                if events::sequence_of(envelope).is_some_and(|s| s % every == 0) {
                    self.take(item.run_id.clone());
                }
            }
        }
    }

    fn take(&self, run_id: String) {
        let (reader, materializer) = (self.reader.clone(), self.materializer.clone());
        self.running.start();
        let ends = Ends(self.running.clone());
        // A snapshot is a cache: one not taken (at the thread limit, or on a failed read) only
        // leaves folds reading further.
        let _ = Pool::global().spawn(move || {
            let _ends = ends;
            let _ = materializer.take_snapshot(&*reader, &run_id);
        });
    }
}

pub(super) fn writer_loop(
    rx: Receiver<WriteMsg>,
    writer: &Mutex<Option<Box<dyn LogWriter>>>,
    artifacts: &ArtifactStore,
    completer: &dyn Completer,
    unsettled: &AtomicUsize,
    backlog: &Backlog,
    snapshots: Option<Snapshots>,
) {
    // The batch's appends, cut into units (one append, or a group: see `World::append_group`),
    // and per unit its ticket and whether it is a group.
    let mut tickets: Vec<(Ticket, bool)> = Vec::new();
    let mut batch: Vec<PreparedAppend> = Vec::new();
    let mut units: Vec<usize> = Vec::new();
    let mut counted = 0;
    // Whether the last group was one append its caller awaited alone, which the store could not
    // commit on the caller's thread: that caller's next append is then likely to follow within
    // microseconds, and a writer that parked would pay a thread wake-up for each of them.
    let mut lone = false;
    loop {
        let first = if lone && unsettled.load(Ordering::Acquire) == 0 {
            next_soon(&rx)
        } else {
            rx.recv().ok()
        };
        let Some(first) = first else {
            return;
        };
        lone = false;
        let mut close = None;
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                WriteMsg::Append(t, p, bytes, alone) => {
                    lone = alone && tickets.is_empty();
                    tickets.push((t, false));
                    batch.push(p);
                    units.push(1);
                    counted += bytes;
                }
                WriteMsg::Group(t, group, bytes) => {
                    tickets.push((t, true));
                    units.push(group.len());
                    batch.extend(group);
                    counted += bytes;
                }
                WriteMsg::Close(t, let_go) => {
                    close = Some((t, let_go));
                    break;
                }
            }
            if batch.len() < MAX_GROUP {
                next = rx.try_recv().ok();
                lone &= next.is_none();
            }
        }
        if !batch.is_empty() {
            let recorded_at = clock::now_iso();
            let mut lent = writer.lock().unwrap_or_else(|p| p.into_inner());
            let writer = lent
                .as_mut()
                .expect("the writer is there until the writer thread closes it");
            let outcomes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                events::commit_units(&mut **writer, artifacts, &mut batch, &units, &recorded_at)
            }))
            .unwrap_or_else(|p| {
                let e = panic_error(p);
                units.iter().map(|_| Err(e.clone())).collect()
            });
            drop(lent);
            if let Some(s) = &snapshots {
                s.after_commit(&batch, &units, &outcomes);
            }
            let done = tickets
                .drain(..)
                .zip(outcomes)
                .map(|((t, group), outcome)| {
                    let output = outcome.map(|mut envelopes| match group {
                        true => Output::List(envelopes.into_iter().map(Output::Json).collect()),
                        false => Output::Json(envelopes.pop().expect("one append, one envelope")),
                    });
                    (t, output)
                })
                .collect();
            unsettled.fetch_sub(units.len(), Ordering::AcqRel);
            batch.clear();
            units.clear();
            backlog.remove(std::mem::take(&mut counted));
            completer.complete(done);
        }
        if let Some((t, let_go)) = close {
            // The readers' connections close before the writer's, so that SQLite's checkpoint at
            // the store's last close runs through the writer's (see `SqliteWriter`'s drop).
            let_go();
            drop(writer.lock().unwrap_or_else(|p| p.into_inner()).take());
            completer.complete(vec![(t, Ok(Output::Unit))]);
            return;
        }
    }
}

/// How long the writer looks for the next append before it parks, after one awaited alone.
const WRITER_SPIN: std::time::Duration = std::time::Duration::from_micros(60);

/// The next message for the writer: looked for without sleeping for [`WRITER_SPIN`], then
/// waited for.
fn next_soon(rx: &Receiver<WriteMsg>) -> Option<WriteMsg> {
    let until = std::time::Instant::now() + WRITER_SPIN;
    loop {
        match rx.try_recv() {
            Ok(m) => return Some(m),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
            Err(crossbeam_channel::TryRecvError::Empty) if std::time::Instant::now() < until => std::hint::spin_loop(),
            Err(crossbeam_channel::TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}

/// Bytes of appends the prep thread has prepared and the writer not yet committed, past which
/// the prep thread waits for the writer. The writer is the slower of the two on large payloads,
/// so a prep thread that ran on
/// ahead only held a core that the checkpoint thread, which runs when a core is idle, could have
/// used: the writer then checkpointed the WAL itself, inside its commits.
pub(super) const BACKLOG_MAX: usize = 4 * 1024 * 1024;

/// How long the prep thread waits for the writer before it looks again, should a wake-up be
/// missed (none should be).
const BACKLOG_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

/// What the prep thread has handed the writer and the writer not yet committed (see
/// [`BACKLOG_MAX`]).
#[derive(Default)]
pub(super) struct Backlog {
    pub(super) bytes: AtomicUsize,
    /// Set once the writer thread has ended (or never started): nothing is waited for any more.
    pub(super) closed: AtomicBool,
    pub(super) lock: Mutex<()>,
    pub(super) drained: std::sync::Condvar,
}

/// The prep thread's way to the writer.
pub(super) struct ToWriter {
    pub(super) tx: Sender<WriteMsg>,
    pub(super) backlog: Arc<Backlog>,
}

impl ToWriter {
    /// Pass a prepared append on, counted into the backlog; then wait while the backlog is over
    /// [`BACKLOG_MAX`].
    fn append(&self, ticket: Ticket, prepared: PreparedAppend) {
        let bytes = prepared.head.len();
        self.backlog.add(bytes);
        if self.tx.send(WriteMsg::Append(ticket, prepared, bytes, false)).is_err() {
            // No writer: nothing will drain it.
            self.backlog.remove(bytes);
            return;
        }
        self.backlog.wait_below_max();
    }

    /// Pass a prepared group on, as [`ToWriter::append`] does an append.
    fn group(&self, ticket: Ticket, group: Vec<PreparedAppend>) {
        let bytes = group.iter().map(|p| p.head.len()).sum();
        self.backlog.add(bytes);
        if self.tx.send(WriteMsg::Group(ticket, group, bytes)).is_err() {
            self.backlog.remove(bytes);
            return;
        }
        self.backlog.wait_below_max();
    }
}

/// Closes the [`Backlog`] when dropped: held by the writer thread, so that however it ends (or
/// if it never starts), the prep thread does not wait for it.
pub(super) struct BacklogCloser(pub(super) Arc<Backlog>);

impl Drop for BacklogCloser {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        let _held = self.0.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.0.drained.notify_all();
    }
}

impl Backlog {
    fn add(&self, bytes: usize) {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    /// The writer committed (or refused) appends counted at `bytes`.
    fn remove(&self, bytes: usize) {
        if bytes > 0 && self.bytes.fetch_sub(bytes, Ordering::AcqRel) > BACKLOG_MAX {
            // The prep thread may be waiting: it checks under the lock, so taking it here means
            // it either has not checked yet (and will see the new count) or is waiting.
            let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.drained.notify_all();
        }
    }

    /// Wait while the backlog is over [`BACKLOG_MAX`] and the writer is there to drain it.
    fn wait_below_max(&self) {
        let over = || self.bytes.load(Ordering::Acquire) > BACKLOG_MAX && !self.closed.load(Ordering::Acquire);
        if !over() {
            return;
        }
        let mut held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        while over() {
            held = match self.drained.wait_timeout(held, BACKLOG_WAIT) {
                Ok((h, _)) => h,
                Err(p) => p.into_inner().0,
            };
        }
    }
}
