//! A world: one data directory (or one in-memory store) and the threads that serve it.
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

use crate::core::artifacts::{ArtifactStore, Data, Encoding, NewArtifact};
use crate::core::bytes::Bytes;
use crate::core::clock;
use crate::core::error::{Result, WorldError};
use crate::core::events::{self, AppendRequest, PreparedAppend};
use crate::core::ids;
use crate::core::locks::Locks;
use crate::core::materialize::{self, pricing::Pricing};
use crate::core::outer_loop::OuterLoops;
use crate::core::runtime::{panic_error, Completer, Output, Pool, Ticket};
use crate::core::store::memory::MemoryLog;
use crate::core::store::sqlite::{self, Durability};
use crate::core::store::{LogReader, LogTx, LogWriter};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Most appends committed in one transaction.
pub const MAX_GROUP: usize = 4096;

/// Payloads up to this size (as JSON text) are prepared on the caller's thread when nothing is in
/// flight: a few microseconds of work that would otherwise cost a thread hop. Larger ones (and
/// everything queued behind them) go through the prep thread, so call order is kept and large
/// payloads never occupy the caller.
pub const INLINE_PREP_MAX: usize = 16 * 1024;

/// Payloads up to this size (as JSON text) are prepared on the caller's thread while other
/// appends are in flight too, when the prep thread has nothing queued. With 64 runs appending at
/// once, each awaiting its last append (the bench's (b), 277-byte payloads), the prep thread spent
/// three times its CPU waiting for a core, in the middle of each append's round trip; prepared on
/// the caller's thread, such appends went 17-23% faster. Past about 500 bytes the preparing costs
/// the caller's thread more than the hop saves (64 runs at once, in A/B runs: 337 bytes +4%,
/// 437 bytes +2%, about 640 bytes -4%, 2 KiB -9%, 8 KiB -12%).
pub const INLINE_UNDER_LOAD_MAX: usize = 512;

/// How long the writer keeps looking for the next append before it parks, so that a caller
/// awaiting each append in turn does not pay a thread wake-up per append.
const WRITER_SPIN: std::time::Duration = std::time::Duration::from_micros(60);

/// Which kind of world this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorldKind {
    Local,
    Virtual,
}

impl WorldKind {
    /// `"local"` or `"virtual"`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorldKind::Local => "local",
            WorldKind::Virtual => "virtual",
        }
    }
}

/// Where appends go: the prep thread, or straight to the writer once prepared.
struct Submit {
    prep: Sender<PrepMsg>,
    write: Sender<WriteMsg>,
    /// Appends sent to the prep thread and not yet passed on by it.
    prep_pending: Arc<AtomicUsize>,
    /// Appends submitted and not yet settled (by the writer, or by the prep thread's refusal).
    unsettled: Arc<AtomicUsize>,
}

impl Submit {
    /// Send an append to the prep thread, counted as unsettled and as pending there until it
    /// is passed on or answered.
    fn to_prep(&self, msg: PrepMsg) -> Result<()> {
        self.unsettled.fetch_add(1, Ordering::AcqRel);
        self.prep_pending.fetch_add(1, Ordering::AcqRel);
        if self.prep.send(msg).is_err() {
            self.prep_pending.fetch_sub(1, Ordering::AcqRel);
            self.unsettled.fetch_sub(1, Ordering::AcqRel);
            return Err(WorldError::Closed);
        }
        Ok(())
    }
}

enum PrepMsg {
    Append(Ticket, AppendRequest),
    /// An append prepared on the caller's thread with a refusal, to be answered in call order
    /// (see [`events::answer_refused`]), and so before a close sent after it.
    Refused(Ticket, Box<PreparedAppend>),
    Close(Ticket, AfterClose),
}

/// What the writer does once every append queued before a close has committed, before the close
/// completes: let go of the world's locks (see [`World::close`]).
type AfterClose = Box<dyn FnOnce() + Send>;

// Appends move through the channel by value; boxing each would cost an allocation per append to
// save channel slots that are few and short-lived.
#[allow(clippy::large_enum_variant)]
enum WriteMsg {
    /// An append, and the bytes the prep thread counted into the [`Backlog`] for it (0 from the
    /// caller's thread).
    Append(Ticket, PreparedAppend, usize),
    Close(Ticket, AfterClose),
}

/// A handle on an open world. Cheap to clone; the world's threads stop after [`World::close`] or
/// when the last handle is dropped.
#[derive(Clone)]
pub struct World {
    inner: Arc<Inner>,
}

struct Inner {
    kind: WorldKind,
    data_dir: Option<PathBuf>,
    /// Opened with [`World::open_local_read_only`]: every write is refused before it starts.
    read_only: bool,
    closed: AtomicBool,
    submit: Mutex<Option<Submit>>,
    reader: Arc<dyn LogReader>,
    artifacts: Arc<ArtifactStore>,
    locks: Arc<Locks>,
    outer_loops: Arc<OuterLoops>,
    pricing: Arc<Pricing>,
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

/// Each stream's status and cost as last worked out, with the stream's last sequence and event
/// count then. A stream's status is a function of its events alone, which are never changed,
/// only added to, so while both numbers are the same the status is too: a listing of runs folds
/// only the streams that grew since the last one (it folded every stream on every call, and the
/// inspector asks every few seconds). Started over past [`MAX_STATUSES`] streams.
type Statuses = Mutex<std::collections::HashMap<String, ((u64, u64), serde_json::Value, serde_json::Value)>>;

/// Most streams whose status a world remembers.
const MAX_STATUSES: usize = 100_000;

/// What a world keeps besides its event log.
struct Stores {
    artifacts: Arc<ArtifactStore>,
    locks: Locks,
    outer_loops: OuterLoops,
}

impl World {
    /// Open (creating if needed) the local world at `data_dir`.
    pub fn open_local(
        data_dir: &Path,
        durability: Durability,
        pricing: Pricing,
        completer: Arc<dyn Completer>,
    ) -> Result<World> {
        sqlite::check_data_dir_length(data_dir)?;
        crate::core::durable::create_dir_synced(data_dir, "the data directory")?;
        let data_dir = data_dir
            .canonicalize()
            .map_err(|e| WorldError::io("resolving the data directory", Some(data_dir.to_path_buf()), e))?;
        if !data_dir.is_dir() {
            return Err(WorldError::Path {
                message: format!("{} is not a directory", data_dir.display()),
            });
        }
        let (writer, reader) = sqlite::open(&data_dir, durability)?;
        let stores = Stores {
            artifacts: Arc::new(ArtifactStore::new(crate::core::artifacts::local::LocalArtifacts::open(
                &data_dir,
            )?)),
            locks: Locks::new(crate::core::locks::local::LocalLocks::open(&data_dir)?),
            outer_loops: OuterLoops::local(&data_dir)?,
        };
        Self::start(
            WorldKind::Local,
            Some(data_dir),
            Some(Box::new(writer)),
            Arc::new(reader),
            stores,
            pricing,
            completer,
        )
    }

    /// Open the existing local world at `data_dir` for reading only: nothing in the directory is
    /// created, upgraded, cleaned up or written, and every write fails with `WorldError::Path`.
    /// For looking at a world another process (or an earlier version) owns.
    pub fn open_local_read_only(data_dir: &Path, pricing: Pricing, completer: Arc<dyn Completer>) -> Result<World> {
        let data_dir = data_dir.canonicalize().map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                WorldError::Path {
                    message: format!("no world at {}: the directory does not exist", data_dir.display()),
                }
            } else {
                WorldError::io("resolving the data directory", Some(data_dir.to_path_buf()), e)
            }
        })?;
        if !data_dir.is_dir() {
            return Err(WorldError::Path {
                message: format!("{} is not a directory", data_dir.display()),
            });
        }
        let reader = sqlite::open_read_only(&data_dir)?;
        let stores = Stores {
            artifacts: Arc::new(ArtifactStore::new(
                crate::core::artifacts::local::LocalArtifacts::read_only(&data_dir),
            )),
            locks: Locks::new(crate::core::locks::local::LocalLocks::read_only(&data_dir)),
            outer_loops: OuterLoops::local_read_only(&data_dir),
        };
        Self::start(
            WorldKind::Local,
            Some(data_dir),
            None,
            Arc::new(reader),
            stores,
            pricing,
            completer,
        )
    }

    /// Open a fresh in-memory world.
    pub fn open_virtual(pricing: Pricing, completer: Arc<dyn Completer>) -> Result<World> {
        let log = MemoryLog::new();
        let stores = Stores {
            artifacts: Arc::new(ArtifactStore::new(
                crate::core::artifacts::memory::MemoryArtifacts::new(),
            )),
            locks: Locks::new(crate::core::locks::memory::MemoryLocks::new()),
            outer_loops: OuterLoops::memory(),
        };
        Self::start(
            WorldKind::Virtual,
            None,
            Some(Box::new(log.clone())),
            Arc::new(log),
            stores,
            pricing,
            completer,
        )
    }

    /// Start the world's threads. Without a `writer` the world is read-only.
    fn start(
        kind: WorldKind,
        data_dir: Option<PathBuf>,
        writer: Option<Box<dyn LogWriter>>,
        reader: Arc<dyn LogReader>,
        stores: Stores,
        pricing: Pricing,
        completer: Arc<dyn Completer>,
    ) -> Result<World> {
        let read_only = writer.is_none();
        let writer: SharedWriter = Arc::new(Mutex::new(Some(writer.unwrap_or_else(|| Box::new(ReadOnlyLog)))));
        let artifacts = stores.artifacts;
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
                writer_loop(write_rx, &writer, &artifacts, &*completer, &unsettled, &backlog)
            })?;
        }
        Ok(World {
            inner: Arc::new(Inner {
                kind,
                data_dir,
                read_only,
                closed: AtomicBool::new(false),
                submit: Mutex::new(Some(Submit {
                    prep: prep_tx,
                    write: write_tx,
                    prep_pending,
                    unsettled,
                })),
                reader,
                artifacts,
                locks: Arc::new(stores.locks),
                outer_loops: Arc::new(stores.outer_loops),
                pricing: Arc::new(pricing),
                completer,
                writer,
                statuses: Arc::default(),
                running: Arc::default(),
            }),
        })
    }

    /// `local` or `virtual`.
    pub fn kind(&self) -> WorldKind {
        self.inner.kind
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

    /// Queue an append. Errors that need no I/O (a closed world, a malformed run id) return at
    /// once; everything else arrives through the completer under `ticket` with the envelope's
    /// canonical JSON.
    pub fn append(&self, ticket: Ticket, req: AppendRequest) -> Result<()> {
        self.append_with(ticket, req, false)
    }

    /// As [`World::append`], for a caller that waits for this append on its own thread. With
    /// nothing in flight and the writer idle, the append is committed right here when the store
    /// can commit it without waiting for a lock or a disk (at durability `normal`: see
    /// [`LogWriter::transaction_now`]), and completed before this returns: the caller would
    /// otherwise spend the same time waiting for the writer's thread, plus two thread hand-offs.
    pub fn append_awaited(&self, ticket: Ticket, req: AppendRequest) -> Result<()> {
        self.append_with(ticket, req, true)
    }

    fn append_with(&self, ticket: Ticket, req: AppendRequest, awaited: bool) -> Result<()> {
        self.ensure_open()?;
        self.ensure_writable("an append")?;
        match req.draft {
            Some(crate::core::run_events::Stream::Session) => ids::check_session_id(&req.run_id)?,
            _ => ids::check_run_id(&req.run_id)?,
        }
        let guard = self.inner.submit.lock().expect("submit lock");
        let Some(submit) = guard.as_ref() else {
            return Err(WorldError::Closed);
        };
        // A small append is prepared here when nothing is in flight, or (a smaller one) when
        // nothing is queued for the prep thread, and goes straight to the writer, after every
        // append sent before it, so call order is kept. This saves a thread hop: on the one
        // append a caller is waiting for, and under load (see `INLINE_UNDER_LOAD_MAX`). Larger
        // payloads, and everything sent after one until the prep thread has passed it on, are
        // prepared there, beside the caller. Only an append with nothing unsettled before it may
        // be committed here.
        let size = req.payload_json.len() + req.strings.iter().map(String::len).sum::<usize>();
        let idle = submit.unsettled.load(Ordering::Acquire) == 0;
        if size <= INLINE_PREP_MAX
            && (idle || (size <= INLINE_UNDER_LOAD_MAX && submit.prep_pending.load(Ordering::Acquire) == 0))
        {
            let prepared = events::prepare(req, &*self.inner.artifacts)?;
            if prepared.refused.is_some() {
                // Answered by the prep thread with a read of its key, and never by the writer.
                return submit.to_prep(PrepMsg::Refused(ticket, Box::new(prepared)));
            }
            let prepared = if awaited && idle {
                self.commit_now(ticket, prepared)
            } else {
                Some(prepared)
            };
            let Some(prepared) = prepared else {
                return Ok(());
            };
            submit.unsettled.fetch_add(1, Ordering::AcqRel);
            if submit.write.send(WriteMsg::Append(ticket, prepared, 0)).is_err() {
                submit.unsettled.fetch_sub(1, Ordering::AcqRel);
                return Err(WorldError::Closed);
            }
            return Ok(());
        }
        submit.to_prep(PrepMsg::Append(ticket, req))
    }

    /// Commit `prepared` on this thread and complete it, if the writer is idle and the store can
    /// (see [`events::commit_now`]); otherwise hand it back. Called with the submit lock held and
    /// nothing unsettled, so every earlier append has committed and none can start meanwhile.
    fn commit_now(&self, ticket: Ticket, mut prepared: PreparedAppend) -> Option<PreparedAppend> {
        if prepared.spill.is_some() {
            return Some(prepared); // It writes an artifact file first.
        }
        // Held by the writer's thread from a group's start to its end, and after close.
        let Ok(mut lent) = self.inner.writer.try_lock() else {
            return Some(prepared);
        };
        let Some(writer) = lent.as_mut() else {
            return Some(prepared);
        };
        let recorded_at = clock::now_iso();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            events::commit_now(&mut **writer, &*self.inner.artifacts, &mut prepared, &recorded_at)
        }))
        .unwrap_or_else(|p| Some(Err(panic_error(p))));
        drop(lent);
        match outcome {
            Some(outcome) => {
                self.inner.completer.complete(vec![(ticket, outcome.map(Output::Json))]);
                None
            }
            None => Some(prepared),
        }
    }

    /// Committed envelopes of `run_id` after `after` (at most `limit`, and with `max_units` about
    /// that many UTF-16 code units of text: see [`events::packed::list_packed_within`]), packed
    /// for JavaScript: completes with `[text, table, text, table, ...]`, one pair per part (see
    /// [`events::packed`]).
    pub fn list_packed(
        &self,
        ticket: Ticket,
        run_id: String,
        after: u64,
        limit: Option<u64>,
        max_units: Option<usize>,
    ) -> Result<()> {
        self.ensure_open()?;
        ids::check_stream_id(&run_id)?;
        let reader = self.inner.reader.clone();
        self.run(ticket, move || {
            let parts = match max_units {
                Some(max) => events::packed::list_packed_within(&*reader, &run_id, after, limit, max)?,
                None => events::packed::list_packed_parallel(&*reader, &run_id, after, limit)?,
            };
            Ok(Output::List(
                parts
                    .into_iter()
                    .flat_map(|p| {
                        let table: Vec<u8> = p.table.iter().flat_map(|f| f.to_le_bytes()).collect();
                        [Output::Json(p.text), Output::Bytes(Bytes::Owned(table))]
                    })
                    .collect(),
            ))
        })
    }

    /// What was committed since `since` (see [`crate::core::store::LogReader::changes`]), as JSON:
    /// `{"mark":…,"streams":[…] or null}`.
    pub fn changes(&self, ticket: Ticket, since: Option<i64>) -> Result<()> {
        let reader = self.inner.reader.clone();
        self.run(ticket, move || {
            let changes = reader.changes(since)?;
            Ok(Output::Json(
                serde_json::to_string(&changes).expect("changes serialize"),
            ))
        })
    }

    /// A stream's events as run (or session) events, as a JSON array; with `strict` (the replay
    /// read) refuses when a row would be dropped.
    pub fn run_events(&self, ticket: Ticket, stream_id: String, strict: bool) -> Result<()> {
        ids::check_stream_id(&stream_id)?;
        let reader = self.inner.reader.clone();
        self.run(ticket, move || {
            crate::core::run_events::stored::read_log(&*reader, &stream_id, strict).map(Output::Json)
        })
    }

    /// Fold a run's stored events into its state; completes with the state's canonical JSON.
    pub fn materialize(&self, ticket: Ticket, run_id: String) -> Result<()> {
        ids::check_stream_id(&run_id)?;
        let reader = self.inner.reader.clone();
        let pricing = self.inner.pricing.clone();
        self.run(ticket, move || {
            materialize::fold_stored(&*reader, &run_id, &pricing).map(Output::Json)
        })
    }

    /// The world's pricing registry (the bundled one with the world's own merged over it).
    pub fn pricing(&self) -> &Pricing {
        &self.inner.pricing
    }

    /// Publish an artifact; completes with its manifest's JSON.
    pub fn write_artifact(&self, ticket: Ticket, meta: NewArtifact, data: Data) -> Result<()> {
        self.ensure_open()?;
        self.ensure_writable("writing an artifact")?;
        let store = self.inner.artifacts.clone();
        self.run(ticket, move || {
            store.write(meta, data).map(|m| Output::Json(m.to_json()))
        })
    }

    /// Read and verify an artifact; completes with `[manifest JSON, payload]`, the payload as text
    /// for `json` and `utf8`, as bytes for `bytes`.
    pub fn read_artifact(&self, ticket: Ticket, reference: &str) -> Result<()> {
        let id = crate::core::artifacts::parse_ref(reference)?.to_string();
        let store = self.inner.artifacts.clone();
        self.run(ticket, move || {
            let (manifest, bytes) = store.read(&id)?;
            let payload = match manifest.encoding {
                Encoding::Bytes => Output::Bytes(bytes),
                Encoding::Json | Encoding::Utf8 => Output::Json(String::from_utf8(bytes.into_vec()).map_err(|_| {
                    WorldError::ArtifactManifestCorrupt {
                        artifact_id: id.clone(),
                        reason: "the blob of a text artifact is not UTF-8".into(),
                    }
                })?),
            };
            Ok(Output::List(vec![Output::Json(manifest.to_json()), payload]))
        })
    }

    /// Take the lock of a run (`kind` `run`) or an outer loop (`outer-loop`) by its id, waiting up
    /// to `wait`; completes with `{name, token}`. Runs on a thread of its own, since it may sleep
    /// while it waits.
    pub fn acquire_lock(&self, ticket: Ticket, kind: &str, id: &str, wait: std::time::Duration) -> Result<()> {
        self.ensure_open()?;
        let name = match kind {
            "run" => ids::check_run_id(id).map(|()| crate::core::locks::run_lock_name(id))?,
            "outer-loop" => crate::core::outer_loop::check_outer_loop_id(id)
                .map(|()| crate::core::locks::outer_loop_lock_name(id))?,
            other => {
                return Err(WorldError::validation(
                    "kind",
                    format!("is not a kind of lock: {other}"),
                ))
            }
        };
        self.ensure_writable("taking a lock")?;
        let locks = self.inner.locks.clone();
        let completer = self.inner.completer.clone();
        spawn("little-world-lock", move || {
            let out = locks
                .acquire(&name, wait)
                .map(|h| Output::Json(serde_json::json!({"name": h.name, "token": h.token}).to_string()));
            completer.complete(vec![(ticket, out)]);
        })
    }

    /// Let go of a lock (see [`Locks::release`]). Also on a closed world: its close let go of its
    /// locks, and releasing one again is the no-op a double release is.
    pub fn release_lock(&self, ticket: Ticket, name: String, token: String) -> Result<()> {
        self.ensure_writable("releasing a lock")?;
        let locks = self.inner.locks.clone();
        Pool::global().run(self.inner.completer.clone(), ticket, move || {
            locks.release(&name, &token).map(|()| Output::Unit)
        })
    }

    /// Read an outer-loop manifest; completes with its JSON, or `null`.
    pub fn read_outer_loop(&self, ticket: Ticket, id: String) -> Result<()> {
        crate::core::outer_loop::check_outer_loop_id(&id)?;
        let loops = self.inner.outer_loops.clone();
        self.run(ticket, move || {
            Ok(Output::Json(loops.read(&id)?.unwrap_or_else(|| "null".into())))
        })
    }

    /// Write an outer-loop manifest.
    pub fn write_outer_loop(&self, ticket: Ticket, manifest_json: String) -> Result<()> {
        self.ensure_open()?;
        self.ensure_writable("writing an outer-loop manifest")?;
        let loops = self.inner.outer_loops.clone();
        self.run(ticket, move || loops.write(&manifest_json).map(|()| Output::Unit))
    }

    /// Re-check one run (or everything), the store's own check `thorough` or fast; completes
    /// with the report's JSON.
    pub fn verify(&self, ticket: Ticket, run_id: Option<String>, thorough: bool) -> Result<()> {
        if let Some(r) = &run_id {
            ids::check_stream_id(r)?;
        }
        let reader = self.inner.reader.clone();
        let artifacts = self.inner.artifacts.clone();
        self.run(ticket, move || {
            let report = crate::core::verify::verify(&*reader, &artifacts, run_id.as_deref(), thorough)?;
            Ok(Output::Json(
                serde_json::to_string(&report).expect("a report serializes"),
            ))
        })
    }

    /// Every run in the world with its event count, times, status and cost; completes with JSON.
    pub fn runs(&self, ticket: Ticket) -> Result<()> {
        let reader = self.inner.reader.clone();
        let pricing = self.inner.pricing.clone();
        let statuses = self.inner.statuses.clone();
        self.run(ticket, move || {
            let mut out = Vec::new();
            let streams = reader.streams()?;
            // Listed in order of id, each once: anything else is an index that is damaged.
            if let Some(w) = streams.windows(2).find(|w| w[0].run_id >= w[1].run_id) {
                return Err(WorldError::EventLogCorrupt {
                    run_id: Some(w[1].run_id.clone()),
                    sequence: None,
                    reason: "the store lists its runs out of order or one twice: its index is damaged (run `little verify --thorough`)".into(),
                });
            }
            for s in streams {
                let mut row = serde_json::to_value(&s).expect("summary serializes");
                let length = (s.last_sequence, s.event_count);
                let known = statuses
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&s.run_id)
                    .filter(|(at, ..)| *at == length)
                    .map(|(_, status, cost)| (status.clone(), cost.clone()));
                let (status, cost) = match known {
                    Some(known) => known,
                    None => match stream_status(&*reader, &s.run_id, &pricing) {
                        Ok((status, cost)) => {
                            let mut statuses = statuses.lock().unwrap_or_else(|p| p.into_inner());
                            if statuses.len() >= MAX_STATUSES {
                                statuses.clear();
                            }
                            statuses.insert(s.run_id.clone(), (length, status.clone(), cost.clone()));
                            (status, cost)
                        }
                        // A damaged stream is listed as such; `little verify` says what is wrong
                        // with it. (Not remembered: the read may have failed for a passing reason.)
                        Err(_) => (serde_json::json!("unreadable"), serde_json::Value::Null),
                    },
                };
                row["status"] = status;
                row["costUsd"] = cost;
                out.push(row);
            }
            Ok(Output::Json(serde_json::Value::Array(out).to_string()))
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

/// A stream's status and cost in dollars: from the run-event fold for a seed-004 stream (a
/// session is `open` until `session:cancelled`), else from the materializer.
fn stream_status(
    reader: &dyn LogReader,
    id: &str,
    pricing: &Pricing,
) -> Result<(serde_json::Value, serde_json::Value)> {
    use crate::core::run_events::{self, stored};
    // Both texts are this build's own JSON, around payloads of up to 1,000 levels.
    let parse = |text: String, around: usize| {
        crate::core::canonical::parse_around(&text, around).map_err(|e| WorldError::RuntimeIntegrity {
            reason: format!("internal error: {id}'s own JSON {e}"),
        })
    };
    let log = parse(stored::read_log(reader, id, false)?, 1)?;
    let events = log.as_array().map(Vec::as_slice).unwrap_or_default();
    if events.is_empty() {
        let state = parse(materialize::fold_stored(reader, id, pricing)?, 3)?;
        return Ok((state["status"].clone(), state["usage"]["costUsd"].clone()));
    }
    if stored::stream_of(id) == run_events::Stream::Session {
        let cancelled = events.iter().any(|e| e["type"] == "session:cancelled");
        return Ok((
            serde_json::json!(if cancelled { "cancelled" } else { "open" }),
            serde_json::Value::Null,
        ));
    }
    let state = run_events::fold(events)?;
    // Micro-cents are 1e-6 cents: 1e-8 dollars.
    let realized = state["costs"]["realizedCostMicrocents"].as_u64().unwrap_or(0);
    let usd = format!("{}.{:08}", realized / 100_000_000, realized % 100_000_000)
        .parse::<f64>()
        .unwrap_or(0.0);
    Ok((state["status"].clone(), serde_json::json!(usd)))
}

/// Start a thread of the world's own; failing to (at the process's thread limit) is `WORLD_IO`.
fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    crate::core::runtime::start_thread(name, f)
        .map(drop)
        .map_err(|e| WorldError::io(format!("starting the thread {name}"), None, e))
}

fn prep_loop(
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
struct ReadOnlyLog;

impl LogWriter for ReadOnlyLog {
    fn transaction(&mut self, _body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>) -> Result<()> {
        Err(WorldError::Path {
            message: "an append needs a writable world, and this one was opened read-only".into(),
        })
    }
}

fn writer_loop(
    rx: Receiver<WriteMsg>,
    writer: &Mutex<Option<Box<dyn LogWriter>>>,
    artifacts: &ArtifactStore,
    completer: &dyn Completer,
    unsettled: &AtomicUsize,
    backlog: &Backlog,
) {
    let mut tickets: Vec<Ticket> = Vec::new();
    let mut batch: Vec<PreparedAppend> = Vec::new();
    let mut counted = 0;
    loop {
        // Spin only when nothing is in flight: the next append is then one a caller is awaiting
        // alone. Under load, the prep and JavaScript threads need the cores more.
        let spin = unsettled.load(Ordering::Acquire) == 0;
        let first = match next_message(&rx, spin) {
            Some(m) => m,
            None => return,
        };
        let mut close = None;
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                WriteMsg::Append(t, p, bytes) => {
                    tickets.push(t);
                    batch.push(p);
                    counted += bytes;
                }
                WriteMsg::Close(t, let_go) => {
                    close = Some((t, let_go));
                    break;
                }
            }
            if batch.len() < MAX_GROUP {
                next = rx.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            let recorded_at = clock::now_iso();
            let mut lent = writer.lock().unwrap_or_else(|p| p.into_inner());
            let writer = lent
                .as_mut()
                .expect("the writer is there until the writer thread closes it");
            let outcomes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                events::commit_batch(&mut **writer, artifacts, &mut batch, &recorded_at)
            }))
            .unwrap_or_else(|p| {
                let e = panic_error(p);
                batch.iter().map(|_| Err(e.clone())).collect()
            });
            drop(lent);
            let done = tickets
                .drain(..)
                .zip(outcomes.into_iter().map(|o| o.map(Output::Json)))
                .collect();
            unsettled.fetch_sub(batch.len(), Ordering::AcqRel);
            batch.clear();
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

/// Bytes of appends the prep thread has prepared and the writer not yet committed, past which
/// the prep thread waits for the writer. The writer is the slower of the two (per 64 KiB payload,
/// ~90 µs of the prep thread's CPU against ~110 µs of the writer's), so a prep thread that ran on
/// ahead only held a core that the checkpoint thread, which runs when a core is idle, could have
/// used: the writer then checkpointed the WAL itself, inside its commits.
const BACKLOG_MAX: usize = 4 * 1024 * 1024;

/// How long the prep thread waits for the writer before it looks again, should a wake-up be
/// missed (none should be).
const BACKLOG_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

/// What the prep thread has handed the writer and the writer not yet committed (see
/// [`BACKLOG_MAX`]).
#[derive(Default)]
struct Backlog {
    bytes: AtomicUsize,
    /// Set once the writer thread has ended (or never started): nothing is waited for any more.
    closed: AtomicBool,
    lock: Mutex<()>,
    drained: std::sync::Condvar,
}

/// The prep thread's way to the writer.
struct ToWriter {
    tx: Sender<WriteMsg>,
    backlog: Arc<Backlog>,
}

impl ToWriter {
    /// Pass a prepared append on, counted into the backlog; then wait while the backlog is over
    /// [`BACKLOG_MAX`].
    fn append(&self, ticket: Ticket, prepared: PreparedAppend) {
        let bytes = prepared.head.len();
        self.backlog.add(bytes);
        if self.tx.send(WriteMsg::Append(ticket, prepared, bytes)).is_err() {
            // No writer: nothing will drain it.
            self.backlog.remove(bytes);
            return;
        }
        self.backlog.wait_below_max();
    }
}

/// Closes the [`Backlog`] when dropped: held by the writer thread, so that however it ends (or
/// if it never starts), the prep thread does not wait for it.
struct BacklogCloser(Arc<Backlog>);

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

/// The next message for the writer: looked for briefly without sleeping (when `spin`), then
/// waited for.
fn next_message(rx: &Receiver<WriteMsg>, spin: bool) -> Option<WriteMsg> {
    if !spin {
        return rx.recv().ok();
    }
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

#[cfg(test)]
mod tests;
