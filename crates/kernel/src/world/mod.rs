//! A world: one data directory, one in-memory store or one PostgreSQL schema, and the threads that
//! serve it.
//!
//! Appends flow one way through two threads of the world's own, each fed by a FIFO channel:
//!
//! ```text
//! caller ──► prep thread ──────────────► writer thread ──────────────► Completer
//!            parse, validate, canonical    BEGIN IMMEDIATE; per append:
//!            form, artifact references     SAVEPOINT, sequence, id, INSERT;
//!                                          COMMIT; complete the whole group
//! ```
//!
//! The writer drains everything queued into one transaction (group commit), so under load one
//! fsync covers many appends. Order is kept end to end: appends to a run commit in call order.
//! A small append made while nothing is in flight skips the prep thread: it is prepared on the
//! caller's thread and sent straight to the writer ([`INLINE_PREP_MAX`]); so is a smaller one made
//! under load while the prep thread has nothing queued ([`INLINE_UNDER_LOAD_MAX`]). One that its
//! caller waits for alone may skip both threads: where the store can commit it without waiting,
//! it is committed on the caller's thread too ([`World::append_awaited`]).
//! Reads go to the shared [`Pool`] with their own connections and never wait for the writer.
//!
//! A world is opened on what a backend gives it ([`Parts`]: an event store's writer and reader,
//! and its artifacts, locks and outer-loop manifests), each behind its trait: `local` opens a data
//! directory, `memory` a virtual world. Here: the world, its start and its close; `append`: where
//! an append goes; `threads`: the prep and writer threads; `reads`: listings, folds and verify;
//! `stores`: artifacts, locks and outer-loop manifests; `runs`: the listing of runs with their
//! status and cost.

mod append;
mod archive;
mod import;
mod lifecycle;
mod local;
mod postgres;
mod reads;
mod runs;
mod stores;
mod threads;
mod r#virtual;

use crate::artifacts::ArtifactStore;
use crate::error::{Result, WorldError};
use crate::locks::Locks;
use crate::outer_loop::OuterLoops;
use crate::runtime::{panic_error, Completer, Output, Pool, Ticket};
use crate::store::{LogReader, LogWriter};
use crate::vocabulary::Materializer;
use append::{AfterClose, PrepMsg, Submit, WriteMsg};
use crossbeam_channel::unbounded;
use runs::Statuses;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use threads::{prep_loop, spawn, writer_loop, Backlog, BacklogCloser, ReadOnlyLog, Snapshots, ToWriter};

pub use append::{INLINE_PREP_MAX, INLINE_UNDER_LOAD_MAX};
pub use archive::Export;
pub use import::Import;
pub use lifecycle::OWNER_INDEX;
pub use threads::MAX_GROUP;

/// What a backend gives a world: its event store and the stores of everything else, each behind
/// its trait.
pub struct Parts {
    /// `local`, `virtual`, ...: what `World.kind` says.
    pub kind: &'static str,
    /// The resolved data directory, for a world that has one.
    pub data_dir: Option<PathBuf>,
    /// The event store's writer; `None` for a world opened for reading only.
    pub writer: Option<Box<dyn LogWriter>>,
    pub reader: Arc<dyn LogReader>,
    pub artifacts: ArtifactStore,
    pub locks: Locks,
    pub outer_loops: OuterLoops,
}

/// A handle on an open world. Cheap to clone; the world's threads stop after [`World::close`] or
/// when the last handle is dropped.
#[derive(Clone)]
pub struct World {
    inner: Arc<Inner>,
}

struct Inner {
    kind: &'static str,
    data_dir: Option<PathBuf>,
    /// Opened without a writer: every write is refused before it starts.
    read_only: bool,
    /// Whether the writer commits without a network round trip (see
    /// [`LogWriter::commits_quickly`]).
    commits_quickly: bool,
    closed: AtomicBool,
    submit: Mutex<Option<Submit>>,
    reader: Arc<dyn LogReader>,
    artifacts: Arc<ArtifactStore>,
    locks: Arc<Locks>,
    outer_loops: Arc<OuterLoops>,
    materializer: Arc<dyn Materializer>,
    completer: Arc<dyn Completer>,
    /// The event store's writer: the writer thread's, lent to a caller's thread for an append
    /// committed there (see [`World::append_awaited`]); `None` once the world has closed.
    writer: SharedWriter,
    /// What [`World::runs`] worked out for each stream, by its length (see [`Statuses`]).
    statuses: Arc<Statuses>,
    /// Operations handed to the pool and not finished yet (see [`World::close`]).
    running: Arc<Running>,
}

type SharedWriter = Arc<Mutex<Option<Box<dyn LogWriter>>>>;

/// A count of operations in flight, and a way to wait until there are none.
#[derive(Default)]
struct Running {
    count: Mutex<usize>,
    none: std::sync::Condvar,
}

impl Running {
    fn start(&self) {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    }

    fn end(&self) {
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        *count -= 1;
        if *count == 0 {
            self.none.notify_all();
        }
    }

    fn wait_for_none(&self) {
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        while *count > 0 {
            count = self.none.wait(count).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Ends an operation's count in [`Running`] when dropped.
struct Ends(Arc<Running>);

impl Drop for Ends {
    fn drop(&mut self) {
        self.0.end();
    }
}

impl World {
    /// Open a world on what a backend gives (`parts`), and start its threads. Without a writer
    /// the world is read-only.
    pub fn open(parts: Parts, materializer: Arc<dyn Materializer>, completer: Arc<dyn Completer>) -> Result<World> {
        let Parts {
            kind,
            data_dir,
            writer,
            reader,
            artifacts,
            locks,
            outer_loops,
        } = parts;
        let running: Arc<Running> = Arc::default();
        let snapshots = (writer.is_some() && reader.fold_snapshots().is_some()).then(|| Snapshots {
            reader: reader.clone(),
            materializer: materializer.clone(),
            running: running.clone(),
        });
        let read_only = writer.is_none();
        let commits_quickly = writer.as_ref().is_none_or(|w| w.commits_quickly());
        let writer: SharedWriter = Arc::new(Mutex::new(Some(writer.unwrap_or_else(|| Box::new(ReadOnlyLog)))));
        let artifacts = Arc::new(artifacts);
        let (prep_tx, prep_rx) = unbounded::<PrepMsg>();
        let (write_tx, write_rx) = unbounded::<WriteMsg>();
        let prep_pending = Arc::new(AtomicUsize::new(0));
        let unsettled = Arc::new(AtomicUsize::new(0));
        let backlog = Arc::new(Backlog::default());
        {
            let completer = completer.clone();
            let artifacts = artifacts.clone();
            let write_tx = write_tx.clone();
            let pending = prep_pending.clone();
            let unsettled = unsettled.clone();
            let reader = reader.clone();
            let backlog = backlog.clone();
            spawn("little-world-prep", move || {
                prep_loop(
                    prep_rx,
                    ToWriter { tx: write_tx, backlog },
                    &artifacts,
                    &*reader,
                    &*completer,
                    &pending,
                    &unsettled,
                )
            })?;
        }
        {
            let completer = completer.clone();
            let unsettled = unsettled.clone();
            let artifacts = artifacts.clone();
            let writer = writer.clone();
            // Should this fail, dropping `prep_tx` ends the prep thread; and the backlog is
            // closed, so that it does not wait for a writer that never started.
            let closes = BacklogCloser(backlog.clone());
            spawn("little-world-writer", move || {
                let _closes = closes;
                writer_loop(
                    write_rx,
                    &writer,
                    &artifacts,
                    &*completer,
                    &unsettled,
                    &backlog,
                    snapshots,
                )
            })?;
        }
        Ok(World {
            inner: Arc::new(Inner {
                kind,
                data_dir,
                read_only,
                commits_quickly,
                closed: AtomicBool::new(false),
                submit: Mutex::new(Some(Submit {
                    prep: prep_tx,
                    write: write_tx,
                    prep_pending,
                    unsettled,
                })),
                reader,
                artifacts,
                locks: Arc::new(locks),
                outer_loops: Arc::new(outer_loops),
                materializer,
                completer,
                writer,
                statuses: Arc::default(),
                running,
            }),
        })
    }

    /// `local`, `virtual`, or the kind of another backend.
    pub fn kind(&self) -> &'static str {
        self.inner.kind
    }

    /// Whether an append can commit within about a hundred microseconds, so that a caller
    /// awaiting it alone may wait in place (see [`LogWriter::commits_quickly`]).
    pub fn commits_quickly(&self) -> bool {
        self.inner.commits_quickly
    }

    /// The resolved data directory of a local world.
    pub fn data_dir(&self) -> Option<&Path> {
        self.inner.data_dir.as_deref()
    }

    /// The world's artifact store.
    pub fn artifacts(&self) -> &Arc<ArtifactStore> {
        &self.inner.artifacts
    }

    /// The world's reader.
    pub fn reader(&self) -> &Arc<dyn LogReader> {
        &self.inner.reader
    }

    /// Whether `close` has been called.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    fn ensure_open(&self) -> Result<()> {
        if self.is_closed() {
            Err(WorldError::Closed)
        } else {
            Ok(())
        }
    }

    /// Refuse `what` (a write) on a world opened read-only.
    fn ensure_writable(&self, what: &str) -> Result<()> {
        if !self.inner.read_only {
            return Ok(());
        }
        let at = self
            .data_dir()
            .map(|d| format!(" at {}", d.display()))
            .unwrap_or_default();
        Err(WorldError::Path {
            message: format!("{what} needs a writable world, and the world{at} was opened read-only"),
        })
    }

    /// Run `work` on the pool, completing `ticket` with its result.
    pub fn run(&self, ticket: Ticket, work: impl FnOnce() -> Result<Output> + Send + 'static) -> Result<()> {
        self.ensure_open()?;
        let running = self.inner.running.clone();
        running.start();
        let ended = running.clone();
        let completer = self.inner.completer.clone();
        let submitted = Pool::global().spawn(move || {
            // Counted as running until its answer is on its way, so that it reaches JavaScript
            // before the answer of a close that waits for it; ended however this ends.
            let _ended = Ends(ended);
            let out =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|p| Err(panic_error(p)));
            completer.complete(vec![(ticket, out)]);
        });
        if submitted.is_err() {
            running.end();
        }
        submitted
    }

    /// Stop accepting work; `ticket` completes once every queued append has committed, the world
    /// has let go of the locks it holds, and the operations begun before the close are done and
    /// have given up their connections. A taker still waiting gives up at once with
    /// `WorldError::Closed`. The locks are let go of only after the appends: a lock fences a run,
    /// and another process that takes it must find every append made under it.
    pub fn close(&self, ticket: Ticket) -> Result<()> {
        let submit = self.inner.submit.lock().expect("submit lock").take();
        self.inner.closed.store(true, Ordering::Release);
        self.inner.locks.stop();
        let locks = self.inner.locks.clone();
        let running = self.inner.running.clone();
        let reader = self.inner.reader.clone();
        // On the writer thread, or a thread of its own: letting go of a lock on disk is a few file
        // operations and an fsync. A lock that cannot be let go of can still be released after
        // the close (see `release_lock`), and is recoverable by others once this process is gone.
        // Then, once the operations begun before the close are done, the reader's connections
        // go: pooled, they kept their file descriptors until the world object was collected (a
        // process that opened and closed worlds ran out of them), and once the close has
        // completed, no connection of this world is left (another copy of SQLite in the process
        // may then open the store; see world.ts).
        let let_go: AfterClose = Box::new(move || {
            let _ = locks.close();
            running.wait_for_none();
            reader.close();
        });
        let (ticket, let_go) = match submit {
            Some(s) => match s.prep.send(PrepMsg::Close(ticket, let_go)) {
                Ok(()) => return Ok(()),
                Err(crossbeam_channel::SendError(PrepMsg::Close(t, f))) => (t, f),
                Err(_) => unreachable!("a close message comes back as sent"),
            },
            // Closed before: its close lets go of what was handed out until then.
            None => (ticket, let_go),
        };
        let completer = self.inner.completer.clone();
        let finish = move || {
            let_go();
            completer.complete(vec![(ticket, Ok(Output::Unit))]);
        };
        let slot = Arc::new(Mutex::new(Some(finish)));
        let taken = slot.clone();
        let started = spawn("little-world-close", move || {
            if let Some(finish) = taken.lock().unwrap_or_else(|p| p.into_inner()).take() {
                finish();
            }
        });
        if started.is_err() {
            // At the process's thread limit, the close still happens: here, a few file operations.
            if let Some(finish) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
                finish();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
