//! The local world's event store: bundled SQLite in WAL mode at `<dataDir>/events/events.db`.
//!
//! One writer connection, owned by the world's writer thread, takes `BEGIN IMMEDIATE` for each
//! group of appends, so the sequence it reads with `MAX(sequence)` cannot change under it, even
//! with another process appending to the same file. Readers take connections of their own from a
//! small pool; in WAL mode they never wait for the writer.

use super::schema;
use super::{Changes, KeyedEvent, LogReader, LogTx, LogWriter, RowRef, StreamSummary};
use crate::core::error::{Result, WorldError};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How durable a commit is when its append resolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: the WAL is fsynced at every commit (one fsync per group of appends).
    Full,
    /// `synchronous=NORMAL`: survives a process crash; the last commits may be lost on power loss.
    Normal,
}

/// How much of the database a reader maps into memory.
const READER_MMAP: i64 = 1 << 30;

/// How long a connection waits for another process's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Open (creating if needed) the event store of `data_dir`.
pub fn open(data_dir: &Path, durability: Durability) -> Result<(SqliteWriter, SqliteReader)> {
    let dir = data_dir.join("events");
    let path = dir.join("events.db");
    check_path_length(&path)?;
    crate::core::artifacts::create_dir_synced(&dir, "the events directory")?;
    let mut conn = connect_as(&path, Access::ReadWrite, true)?;
    let checkpointer = prepare_writer(&mut conn, &path, durability).map_err(|e| on(&conn, e))?;
    // All three exist now (the connection has read the database in WAL mode); SQLite keeps the
    // -shm and the -wal beside the database's real path, the target of a symlinked database.
    let db = OpenedFile::at(&path)?;
    let files = vec![
        db.clone(),
        OpenedFile::at(&beside(&db.path, "-shm"))?,
        OpenedFile::at(&beside(&db.path, "-wal"))?,
    ];
    let mut reader = SqliteReader::new(path.clone(), Access::ReadWrite);
    reader.identity = files.clone();
    Ok((
        SqliteWriter {
            conn: std::mem::ManuallyDrop::new(conn),
            tails: HashMap::new(),
            data_version: None,
            files,
            damage: None,
            checkpointer,
        },
        reader,
    ))
}

/// Check, upgrade and configure the writer's connection; at `normal`, start its checkpoint thread.
fn prepare_writer(conn: &mut Connection, path: &Path, durability: Durability) -> Result<Option<Checkpointer>> {
    let shown = path.display().to_string();
    schema::check(conn, &shown)?;
    schema::fence_writer(conn)?;
    let mode = enable_wal(conn)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(WorldError::Path {
            message: format!("{shown}: cannot use WAL mode (journal_mode is {mode})"),
        });
    }
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)
        .map_err(|e| WorldError::sqlite("setting synchronous", e))?;
    schema::migrate(conn, &shown)?;
    Ok(match durability {
        Durability::Normal => Some(Checkpointer::start(conn, path)?),
        Durability::Full => None,
    })
}

/// Open the event store of `data_dir` for reading only: nothing is created, upgraded or written,
/// so a world written by an earlier version stays openable by it. The store must hold a world of
/// this build's schema version or an earlier one (reads use the table every version has).
pub fn open_read_only(data_dir: &Path) -> Result<SqliteReader> {
    let path = data_dir.join("events").join("events.db");
    check_path_length(&path)?;
    if !path.is_file() {
        return Err(WorldError::Path {
            message: format!("no world at {}: {} does not exist", data_dir.display(), path.display()),
        });
    }
    let access = read_only_access(&path);
    let mut reader = SqliteReader::new(path.clone(), access);
    reader.identity = vec![OpenedFile::at(&path)?];
    let shown = path.display().to_string();
    let version = reader.with_conn(|conn| schema::check(conn, &shown)).map_err(|e| match e {
        // SQLite says only that it cannot write: the reason is that the WAL holds commits that
        // must be recovered into the store's index (the -shm), which takes write access.
        WorldError::Sqlite { source, .. } if access == Access::ReadOnly && cannot_write(&source) => WorldError::Path {
            message: format!(
                "{shown} cannot be read without write access to {}: its WAL holds commits that no process has open, and \
                 reading them takes recovering them, which writes the -shm beside it. Open the world once where it can be \
                 written (any little command there does), and it can be read from here",
                path.parent().unwrap_or(&path).display()
            ),
        },
        e => e,
    })?;
    if version == 0 {
        return Err(WorldError::Path {
            message: format!("{shown} holds no world yet: open it once for writing to create one"),
        });
    }
    Ok(reader)
}

/// Process-wide SQLite settings, applied once before the first connection: no memory statistics,
/// which would otherwise take a global mutex on every allocation.
fn configure_sqlite_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sqlite3_config is called before this process opens its first connection through
        // this copy of SQLite; if SQLite were already initialized it returns SQLITE_MISUSE and
        // changes nothing, which is harmless.
        unsafe {
            rusqlite::ffi::sqlite3_config(rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS, 0 as std::ffi::c_int);
        }
    });
}

/// Put the database in WAL mode (a no-op when it already is). Switching a fresh database needs an
/// exclusive lock, and SQLite reports a concurrent opener's lock as busy at once rather than
/// through the busy handler, so the switch is retried for as long as the busy timeout.
fn enable_wal(conn: &Connection) -> Result<String> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    loop {
        let current: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .map_err(|e| WorldError::sqlite("reading journal_mode", e))?;
        if current.eq_ignore_ascii_case("wal") {
            return Ok(current);
        }
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get::<_, String>(0)) {
            Ok(mode) => return Ok(mode),
            Err(rusqlite::Error::SqliteFailure(f, _))
                if f.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(WorldError::sqlite("enabling WAL", e)),
        }
    }
}

/// Whether SQLite failed for want of write access (to recover a WAL, or to make its `-shm`).
fn cannot_write(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)
    )
}

/// Whether a connection may write (and create the database), or only read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    ReadWrite,
    ReadOnly,
    /// Only read, from a store this process cannot write (a read-only mount, a directory of
    /// another user) whose WAL is empty: the database file holds every commit, so it is opened
    /// `immutable`, without the `-shm` SQLite would otherwise have to create there.
    Immutable,
}

/// How a reader that may not write opens the store at `db`: where this process can write its
/// directory, as any read-only connection; else, with an empty (or no) WAL, the database alone
/// ([`Access::Immutable`]); else as a read-only connection too, which reads the WAL through a
/// `-shm` that another process keeps, and fails where the WAL needs recovering first.
fn read_only_access(db: &Path) -> Access {
    use std::os::unix::ffi::OsStrExt;
    let real = db.canonicalize().unwrap_or_else(|_| db.to_path_buf());
    let writable = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            // SAFETY: access(2) reads the NUL-terminated path, which outlives the call.
            .is_ok_and(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK) } == 0)
    };
    if real.parent().is_some_and(writable) {
        return Access::ReadOnly;
    }
    match std::fs::metadata(beside(&real, "-wal")) {
        Ok(m) if m.len() > 0 => Access::ReadOnly,
        _ => Access::Immutable,
    }
}

/// A `file:` URI for `path` with `query`, each byte outside the unreserved set percent-encoded.
fn file_uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push('?');
    uri.push_str(query);
    uri
}

fn connect(path: &Path, access: Access) -> Result<Connection> {
    connect_as(path, access, false)
}

/// Open a connection; `writer`: the world's writer, whose WAL writes are gathered (see
/// [`super::wal_vfs`]) where that VFS could be registered.
fn connect_as(path: &Path, access: Access, writer: bool) -> Result<Connection> {
    configure_sqlite_once();
    // SQLite would open a FIFO where one of its files belongs, and wait on it for ever. It keeps
    // the -wal and -shm beside the database's real path.
    let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    for file in [path.to_path_buf(), beside(&real, "-wal"), beside(&real, "-shm")] {
        crate::core::files::regular_or_absent(&file).map_err(|why| match why {
            crate::core::files::Unreadable::Io(e) => WorldError::io("opening the event store", Some(file.clone()), e),
            other => WorldError::Path {
                message: format!(
                    "{}; a world's event store keeps only files there",
                    other.describe(&file)
                ),
            },
        })?;
    }
    let flags = match access {
        Access::ReadWrite => OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        Access::ReadOnly => OpenFlags::SQLITE_OPEN_READ_ONLY,
        Access::Immutable => OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
    } | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let opened = if writer && super::wal_vfs::register() {
        Connection::open_with_flags_and_vfs(path, flags, super::wal_vfs::NAME)
    } else if access == Access::Immutable {
        Connection::open_with_flags(file_uri(path, "immutable=1"), flags)
    } else {
        Connection::open_with_flags(path, flags)
    };
    let conn = opened.map_err(|e| {
        let mut err = WorldError::sqlite("opening", e).in_database(path, None);
        // SQLite's "unable to open database file" hides why; opening the file here tells.
        if let WorldError::Sqlite { os: os @ None, .. } = &mut err {
            use std::os::unix::fs::OpenOptionsExt;
            let tried = std::fs::OpenOptions::new()
                .custom_flags(libc::O_NONBLOCK)
                .read(true)
                .write(access == Access::ReadWrite)
                .create(access == Access::ReadWrite)
                .truncate(false)
                .open(path);
            if let Err(cause) = tried {
                *os = Some(cause.to_string());
            }
        }
        err
    })?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| on(&conn, WorldError::sqlite("setting busy_timeout", e)))?;
    Ok(conn)
}

/// A file of the event store as the world opened it: its real path, and its identity then. Taken
/// by path, with no descriptor of its own: closing one would drop every POSIX lock this process
/// holds on the file, other connections' too.
#[derive(Debug, Clone)]
struct OpenedFile {
    path: PathBuf,
    id: (u64, u64),
}

impl OpenedFile {
    /// The file now at `path`, resolved.
    fn at(path: &Path) -> Result<OpenedFile> {
        let real = path
            .canonicalize()
            .map_err(|e| WorldError::io("resolving", Some(path.to_path_buf()), e))?;
        let id = file_id(&real).map_err(|e| WorldError::io("opening", Some(real.clone()), e))?;
        Ok(OpenedFile { path: real, id })
    }

    /// Refuse `doing` once the file at the path is gone or another (deleted and made again, or
    /// moved): the world would act on a store no path leads to, or on one it does not own.
    /// `consequence` follows the "deleted" in the message. One `stat`.
    fn check(&self, doing: &str, consequence: &str) -> Result<()> {
        match file_id(&self.path) {
            Ok(now) if now == self.id => Ok(()),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(WorldError::io("checking the event store", Some(self.path.clone()), e))
            }
            _ => Err(self.damaged(doing, consequence)),
        }
    }

    /// Whether the file at the path is still this one.
    fn is_unchanged(&self) -> bool {
        matches!(file_id(&self.path), Ok(id) if id == self.id)
    }

    /// The error [`OpenedFile::check`] gives once the file is gone or another.
    fn damaged(&self, doing: &str, consequence: &str) -> WorldError {
        WorldError::io(
            doing,
            Some(self.path.clone()),
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("deleted, moved or replaced while this world had it open{consequence}"),
            ),
        )
    }
}

/// The identity (device, inode) of the file at `path`, read without opening it.
fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| crate::core::files::identity(&m))
}

/// `err`, naming the database file of `conn` and, for an I/O failure, what the operating system
/// said (SQLite reports only "disk I/O error").
fn on(conn: &Connection, err: WorldError) -> WorldError {
    match conn.path() {
        Some(p) if !p.is_empty() => err.in_database(Path::new(p), Some(conn)),
        _ => err,
    }
}

/// Refuse a data directory whose event store SQLite could not open for the length of its path,
/// before anything is created for it: its path is predicted from the deepest directory on the way
/// that exists (resolved, as SQLite resolves the store's) and the names after it.
pub fn check_data_dir_length(data_dir: &Path) -> Result<()> {
    use std::path::Component;
    let absolute = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let mut existing = absolute.as_path();
    let mut names = Vec::new();
    while !existing.exists() {
        let Some(parent) = existing.parent() else { break };
        if let Some(last) = existing.components().next_back() {
            names.push(last);
        }
        existing = parent;
    }
    let mut predicted = existing.canonicalize().unwrap_or_else(|_| existing.to_path_buf());
    // The names after the deepest existing directory name no symlinks (nothing exists there),
    // so their `..` and `.` are resolved by name.
    for name in names.iter().rev() {
        match name {
            Component::ParentDir => {
                predicted.pop();
            }
            Component::CurDir => {}
            other => predicted.push(other),
        }
    }
    check_path_length(&predicted.join("events").join("events.db"))
}

/// Longest path of a database file SQLite opens: its unix VFS allows 512 bytes for any path, and a
/// database's path must leave room for its `-journal` suffix.
#[cfg(unix)]
const MAX_DATABASE_PATH: usize = 512 - "-journal".len();

/// Refuse a database path SQLite cannot open for its length, saying so (SQLite says only "unable
/// to open database file"), before any directory is created for it.
fn check_path_length(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let len = std::path::absolute(path).map_or(0, |p| p.as_os_str().len());
        if len > MAX_DATABASE_PATH {
            return Err(WorldError::Path {
                message: format!(
                    "{}: the path of the event store would be {len} bytes long, and SQLite opens at most \
                     {MAX_DATABASE_PATH}: choose a data directory with a shorter path",
                    path.display()
                ),
            });
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// The writer's connection.
pub struct SqliteWriter {
    /// Closed when the writer is dropped, unless the store's files were replaced in a way that
    /// makes closing it unsafe (see [`Damage::Unsafe`]).
    conn: std::mem::ManuallyDrop<Connection>,
    /// What this writer knows of each run's tail: the last sequence, and the run's terminal event.
    /// Valid only while no other connection has committed since this writer's last commit, which
    /// `PRAGMA data_version` tells at the start of each transaction; otherwise it is cleared.
    tails: HashMap<String, Tail>,
    data_version: Option<i64>,
    /// The database, its `-shm` and its `-wal` (see [`SqliteWriter::check_files`]).
    files: Vec<OpenedFile>,
    /// Set once a file of the store was found deleted or replaced, with the index in `files` of
    /// the first found: nothing is written any more.
    damage: Option<(Damage, usize)>,
    checkpointer: Option<Checkpointer>,
}

/// The index of the `-wal` in [`SqliteWriter::files`], after the database and its `-shm`.
const WAL: usize = 2;

/// What the writer could make safe once a file of its store was deleted or replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Damage {
    /// Only the WAL was: what it held was checkpointed into the database through this writer's
    /// connection, which still reads the deleted WAL, so every commit is in `events.db`.
    Rescued,
    /// The database or its `-shm` was, or the checkpoint failed. Closing the connection could
    /// make SQLite, taking it for the store's last connection, checkpoint into a file no path
    /// leads to and delete the `-wal` and `-shm` now at the paths, which another process may be
    /// using: the connection is left open until the process ends instead.
    Unsafe,
}

/// WAL pages not yet checkpointed at which the checkpoint thread is woken after a commit
/// (SQLite's automatic checkpoint runs at the same size, inside the commit).
const CHECKPOINT_AT: i32 = 1000;

/// WAL pages after a commit past which the writer checkpoints inside the commit after all, as
/// SQLite would: the checkpoint thread cannot let the WAL start over while commits keep coming,
/// so this bounds the WAL (about 32 MiB of 4 KiB pages).
const CHECKPOINT_INLINE_AT: i32 = 8000;

/// At durability `normal`, the thread that checkpoints the WAL with a connection of its own.
///
/// A checkpoint fsyncs the WAL, copies its pages into the database and fsyncs that; run inside
/// a commit, as SQLite's automatic checkpoint does, it stalls every append queued behind it for
/// those fsyncs (at `normal` they are the only ones). Run beside the writer, the fsyncs overlap
/// the next commits. At `full` every commit fsyncs anyway, and a second thread fsyncing beside it
/// made group commits slower, so `full` keeps SQLite's automatic checkpoint.
struct Checkpointer {
    wal: Arc<WalState>,
    wake: crossbeam_channel::Sender<()>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the writer, its WAL hook and the checkpoint thread know of the WAL.
#[derive(Default)]
struct WalState {
    /// The WAL's size in pages after the writer's last commit (what the WAL hook was told).
    pages: AtomicI32,
    /// How far into the WAL the last checkpoint got, in pages; 0 once the WAL has started over.
    checkpointed: AtomicI32,
    /// How many times the writer has seen the WAL start over: a checkpoint that began before the
    /// latest does not say how far into the new one it got.
    restarts: AtomicU32,
    /// Held while a checkpoint runs.
    running: Mutex<()>,
    /// Set while a transaction is committed now: its commit never checkpoints inside itself.
    now: AtomicBool,
    /// WAL bytes whose writeback the writer has started (see [`Writeback`]).
    written_back: AtomicU64,
}

impl WalState {
    /// Pages of the WAL not yet checkpointed, as far as the writer knows.
    fn pending(&self) -> i32 {
        let (pages, done) = (
            self.pages.load(Ordering::Relaxed),
            self.checkpointed.load(Ordering::Relaxed),
        );
        if pages >= done {
            pages - done
        } else {
            pages
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, ()> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Checkpointer {
    fn start(writer: &mut Connection, path: &Path) -> Result<Checkpointer> {
        let conn = connect(path, Access::ReadWrite)?;
        let (wake, woken) = crossbeam_channel::bounded::<()>(1);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let wal = Arc::new(WalState::default());
        let state = wal.clone();
        let thread = crate::core::runtime::start_thread("little-world-ckpt", move || {
            run_when_idle();
            while woken.recv().is_ok() && !stopping.load(Ordering::Acquire) {
                loop {
                    let before = state.checkpointed.load(Ordering::Relaxed);
                    let restarts = state.restarts.load(Ordering::Acquire);
                    {
                        let _running = state.running();
                        // As SQLite's automatic checkpoint does, a failed one is left for the next.
                        // (A passive checkpoint never waits for a lock, so the writer never waits
                        // here for anything but the checkpoint's own work.)
                        let done = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i32>(2));
                        if let (Ok(done), true) = (done, state.restarts.load(Ordering::Acquire) == restarts) {
                            state.checkpointed.store(done, Ordering::Relaxed);
                        }
                    }
                    // A stop sent meanwhile is drained with the wakes, but its flag was set
                    // before it was sent, so it is seen here.
                    while woken.try_recv().is_ok() {}
                    if stopping.load(Ordering::Acquire) {
                        return;
                    }
                    // A checkpoint copies what the WAL held when it began: go on while commits
                    // during it left enough behind, and while it gets somewhere (a reader's
                    // snapshot can hold it back).
                    let after = state.checkpointed.load(Ordering::Relaxed);
                    if state.pending() < CHECKPOINT_AT || after <= before {
                        break;
                    }
                }
            }
        })
        .map_err(|e| WorldError::io("starting the checkpoint thread", None, e))?;
        let hook_wake = wake.clone();
        let state = wal.clone();
        let page_size: i64 = writer
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .map_err(|e| WorldError::sqlite("reading the page size", e))?;
        // The database exists by now (the writer has opened it in WAL mode). Unresolved, the
        // writeback would find no WAL beside a symlink and quietly start none.
        let real = path
            .canonicalize()
            .map_err(|e| WorldError::io("resolving", Some(path.to_path_buf()), e))?;
        let memory_page = crate::core::bytes::memory_page().unwrap_or(4096) as i64;
        let mut writeback = Writeback::new(beside(&real, "-wal"), page_size, memory_page);
        // Replaces SQLite's automatic checkpoint, which is a WAL hook too.
        writer
            .wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages: std::ffi::c_int| {
                if pages < state.pages.swap(pages, Ordering::Relaxed) {
                    // The WAL has started over.
                    state.restarts.fetch_add(1, Ordering::AcqRel);
                    state.checkpointed.store(0, Ordering::Relaxed);
                }
                // Not on the calling thread of a transaction committed now (a lone append,
                // awaited on JavaScript's thread): the next commit of the writer's starts it.
                if !state.now.load(Ordering::Relaxed) {
                    let started = writeback.committed(i64::from(pages), state.restarts.load(Ordering::Acquire));
                    state.written_back.fetch_add(started as u64, Ordering::Relaxed);
                }
                if pages >= CHECKPOINT_INLINE_AT && !state.now.load(Ordering::Relaxed) {
                    // The thread has fallen behind: let it finish (two checkpoints at once would
                    // find each other busy), then finish the job here, with no commit between.
                    let _running = state.running();
                    // The commit has happened whatever this returns: an error here would make it
                    // look failed, so (like SQLite's automatic checkpoint) it is not reported.
                    if let Ok((_, done)) = wal.checkpoint_v2(rusqlite::wal::CheckpointMode::PASSIVE) {
                        state.checkpointed.store(done, Ordering::Relaxed);
                    }
                } else if state.pending() >= CHECKPOINT_AT {
                    let _ = hook_wake.try_send(());
                }
                Ok(())
            }))
            .map_err(|e| WorldError::sqlite("setting the WAL hook", e))?;
        Ok(Checkpointer {
            wal,
            wake,
            stop,
            thread: Some(thread),
        })
    }
}

/// The path of a file SQLite keeps beside the database (its `-wal` or `-shm`): the database's
/// real path (the target of a symlinked database), with `suffix` appended.
fn beside(real_db: &Path, suffix: &str) -> PathBuf {
    let mut p = real_db.as_os_str().to_owned();
    p.push(suffix);
    p.into()
}

/// WAL bytes written since writeback was last started past which the writer starts it again.
const WRITEBACK_EVERY: i64 = 1024 * 1024;

/// Starts the kernel writing the WAL's new frames to the disk as commits add them, without waiting
/// for it (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`, on Linux). At `normal` a commit does
/// not sync, so the frames would sit in the page cache until a checkpoint's fsync, which would
/// then write them all while the checkpoint (or the writer, checkpointing inside its commit)
/// waits. Started as they come, most are on the disk by then. It changes nothing of what is
/// durable when: only the fsyncs SQLite runs make anything durable.
struct Writeback {
    wal: std::path::PathBuf,
    file: Option<std::fs::File>,
    page_size: i64,
    /// The system's memory page: writeback is started up to a page boundary only, so that a page
    /// the next frame will write into is not written out half-filled (and, where the disk wants
    /// pages held still while they are written, the next commit does not wait for it).
    memory_page: i64,
    /// How many times the WAL had started over when writeback was last considered.
    restarts: u32,
    /// How far into the WAL (in bytes) writeback has been started.
    started: i64,
}

impl Writeback {
    fn new(wal: std::path::PathBuf, page_size: i64, memory_page: i64) -> Writeback {
        Writeback {
            wal,
            file: None,
            page_size,
            memory_page,
            restarts: 0,
            started: 0,
        }
    }

    /// Where the WAL's first `frames` frames end: a 32-byte header, then frames of a 24-byte
    /// header and a page each ("WAL-mode File Format").
    fn end_of(&self, frames: i64) -> i64 {
        32 + frames * (24 + self.page_size)
    }

    /// A commit left the WAL `frames` frames long, the WAL having started over `restarts` times
    /// (see [`WalState::restarts`]): the byte range (offset, length) whose writeback to start
    /// now, if [`WRITEBACK_EVERY`] bytes have been added since it was last started. The WAL
    /// starting over starts the count over.
    fn due(&mut self, frames: i64, restarts: u32) -> Option<(i64, i64)> {
        if restarts != self.restarts {
            self.restarts = restarts;
            self.started = 0;
        }
        let to = self.end_of(frames) / self.memory_page * self.memory_page;
        if to - self.started < WRITEBACK_EVERY {
            return None;
        }
        let from = std::mem::replace(&mut self.started, to);
        Some((from, to - from))
    }

    /// Start the writeback of what a commit made due (see [`Writeback::due`]); returns the bytes
    /// whose writeback was started. A failure (a WAL that cannot be opened, a system without
    /// `sync_file_range`) starts none: the checkpoint's fsync writes them.
    fn committed(&mut self, frames: i64, restarts: u32) -> i64 {
        let Some((offset, len)) = self.due(frames, restarts) else {
            return 0;
        };
        #[cfg(target_os = "linux")]
        {
            if self.file.is_none() {
                self.file = crate::core::files::open_own(&self.wal, false, false).ok();
            }
            if let Some(f) = &self.file {
                use std::os::fd::AsRawFd;
                // SAFETY: a plain system call on a descriptor this struct owns, asking the kernel
                // to start writing pages already in its cache.
                let done = unsafe { libc::sync_file_range(f.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
                if done == 0 {
                    return len;
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (offset, len, &self.file, &self.wal);
        0
    }
}

/// Let the calling thread run only when no other thread wants the CPU. Run at normal priority, the
/// checkpoint thread took the JavaScript thread's core often enough to raise the event-loop stall
/// p99 during (b) from ~2.6 to ~3.6 ms (5.4 ms at worst); at idle priority, 2.7-3.2 ms in A/B runs.
/// Should it be starved, the writer's inline checkpoint still bounds the WAL.
fn run_when_idle() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sets the scheduling policy of the calling thread (pid 0), lowering it, which
        // needs no privilege. On failure the thread keeps its normal priority.
        unsafe {
            libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // If the channel is full the thread is about to wake anyway.
        let _ = self.wake.try_send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A run's last sequence and the sequence of its terminal event, if it has one.
#[derive(Debug, Clone, Copy)]
struct Tail {
    last: u64,
    ended: Option<u64>,
}

/// Most runs whose tails the writer remembers; past this it starts over.
const MAX_TAILS: usize = 100_000;

impl SqliteWriter {
    fn exec(&self, sql: &str, what: &str) -> Result<()> {
        exec(&self.conn, sql, what)
    }

    /// Refuse to write once the database, its `-shm` or its `-wal` has been deleted (or replaced)
    /// while open: a cleaner of old files, an `rm -rf` of the data directory. SQLite would carry
    /// on: commits would go to a file no path leads to any more, lost at close, and other
    /// processes, creating the files anew, would hand out the same sequences. One `stat` of each.
    /// Once this has failed it keeps failing: the writer is damaged (see [`Damage`]).
    fn check_files(&mut self) -> Result<()> {
        let (damage, changed) = match self.damage {
            Some(d) => d,
            None => match self.files.iter().position(|f| !f.is_unchanged()) {
                None => return Ok(()),
                Some(i) => (self.secure(i), i),
            },
        };
        let consequence = if damage == Damage::Rescued {
            ", so appends would be lost and other processes would not see them (every append committed before \
             was copied into the database); close the world before appending"
        } else {
            ", so appends would be lost and other processes would not see them; close the world (and restore the \
             data directory) before appending"
        };
        Err(self.files[changed].damaged("appending to the event store", consequence))
    }

    /// A file of the store, `self.files[changed]`, was deleted or replaced: stop writing, and
    /// where only the WAL was, checkpoint it into the database (see [`Damage::Rescued`]).
    fn secure(&mut self, changed: usize) -> Damage {
        let wal_only = changed == WAL && self.files[..WAL].iter().all(OpenedFile::is_unchanged);
        let rescued = wal_only && {
            let _ = self.exec("ROLLBACK", "rolling back");
            // Every frame of the WAL this connection reads is copied into the database, which is
            // synced (busy is 0 when the checkpoint could finish, and log equals checkpointed).
            match self.conn.query_row("PRAGMA wal_checkpoint(FULL)", [], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
            }) {
                Ok((busy, log, done)) => busy == 0 && log == done,
                Err(_) => false,
            }
        };
        let damage = if rescued { Damage::Rescued } else { Damage::Unsafe };
        self.damage = Some((damage, changed));
        self.tails.clear();
        self.data_version = None;
        damage
    }

    /// Refuse to write once a later version has upgraded the world while this writer had it open:
    /// it would append without keeping the tables it does not know. The schema's trigger fences
    /// writers of earlier schemas; this one runs no triggers (see [`schema::fence_writer`]).
    fn check_not_upgraded(&self) -> Result<()> {
        match schema::newer_than_this_build(&self.conn)? {
            None => Ok(()),
            Some(version) => Err(WorldError::Path {
                message: format!(
                    "{}: the world was upgraded by a newer version of @little-workflow/world (to schema {version}; this \
                     version writes schema {}) while this one had it open, so this version may not append to it any \
                     more; append with that version",
                    self.conn.path().unwrap_or("the event store"),
                    schema::SCHEMA_VERSION
                ),
            }),
        }
    }

    fn data_version(&self) -> Result<i64> {
        self.conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .map_err(|e| WorldError::sqlite("reading PRAGMA data_version", e))
    }
}

/// WAL pages short of [`CHECKPOINT_INLINE_AT`] past which a transaction is not committed now
/// (see [`SqliteWriter::transaction_now`]): more than a transaction of one small append can add,
/// so that its commit never checkpoints inside itself.
const NOW_MARGIN: i32 = 256;

impl LogWriter for SqliteWriter {
    fn transaction(&mut self, body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>) -> Result<()> {
        self.exec("BEGIN IMMEDIATE", "beginning a write transaction")
            .and_then(|()| self.begun_version())
            .and_then(|version| self.write(body, version))
            .map_err(|e| on(&self.conn, e))
    }

    /// Only at durability `normal`, where a commit does not sync (the checkpoint thread does), when
    /// no other connection holds the write lock (asked once, without the busy timeout), and when
    /// the wal-index says, under that lock, that the commit neither writes a WAL's first header
    /// (SQLite syncs it, at `normal` too: into an empty WAL, or starting the WAL over once a
    /// checkpoint has copied all of it) nor checkpoints inside itself (near
    /// [`CHECKPOINT_INLINE_AT`]). The WAL's size is read there, not taken from what this
    /// connection's hook was told, since other connections commit too.
    fn transaction_now(&mut self, body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>) -> Option<Result<()>> {
        let wal = self.checkpointer.as_ref()?.wal.clone();
        self.conn.busy_timeout(Duration::ZERO).ok()?;
        let begun = self.exec("BEGIN IMMEDIATE", "beginning a write transaction");
        if let Err(e) = self.conn.busy_timeout(BUSY_TIMEOUT) {
            let _ = self.exec("ROLLBACK", "rolling back");
            return Some(Err(on(&self.conn, WorldError::sqlite("setting busy_timeout", e))));
        }
        // Busy, or failing in a way the writer's thread will meet again and report.
        begun.ok()?;
        // The WAL's size holds still under the write lock; the part checkpointed only grows, and
        // the WAL starts over only if it was all checkpointed when this transaction began.
        let quiet = match wal_index(&self.conn) {
            Some((frames, checkpointed)) => {
                frames > 0 && checkpointed < frames && frames < (CHECKPOINT_INLINE_AT - NOW_MARGIN) as u32
            }
            None => false,
        };
        if !quiet {
            let _ = self.exec("ROLLBACK", "rolling back");
            return None;
        }
        let version = self.begun_version().ok()?;
        wal.now.store(true, Ordering::Relaxed);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.write(body, version)));
        wal.now.store(false, Ordering::Relaxed);
        Some(
            result
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
                .map_err(|e| on(&self.conn, e)),
        )
    }
}

/// The wal-index's pages, as SQLite maps them (`WALINDEX_PGSZ`).
const WAL_INDEX_PAGE: std::ffi::c_int = 32 * 1024;

/// The WAL's size in frames and how many of them are checkpointed, read from the wal-index that
/// SQLite has mapped for `conn` (the `-shm`, whose layout SQLite documents in "WAL-mode File
/// Format": the header's `mxFrame` at byte 16, the checkpoint information's `nBackfill` at byte
/// 96, native-endian). Reached through the database file's own `xShmMap`: a descriptor of our own
/// on the `-shm` would drop SQLite's POSIX locks on it when closed. `None` where it cannot be read.
fn wal_index(conn: &Connection) -> Option<(u32, u32)> {
    use rusqlite::ffi;
    // SAFETY: `conn` is open and used by this thread alone (the caller has it mutably), and is in
    // a transaction on a WAL database, so its wal-index page 0 is mapped; `xShmMap` with
    // `bExtend` 0 only returns that mapping (or null). The two words are 4-aligned in a
    // page-aligned mapping that stays while the connection is open, and other processes change
    // them concurrently, so they are read atomically, as SQLite reads them.
    unsafe {
        let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
        let found = ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&mut file as *mut *mut ffi::sqlite3_file).cast(),
        );
        if found != ffi::SQLITE_OK || file.is_null() || (*file).pMethods.is_null() {
            return None;
        }
        let methods = &*(*file).pMethods;
        if methods.iVersion < 2 {
            return None;
        }
        let mut page: *mut std::ffi::c_void = std::ptr::null_mut();
        if (methods.xShmMap?)(file, 0, WAL_INDEX_PAGE, 0, &mut page) != ffi::SQLITE_OK || page.is_null() {
            return None;
        }
        let word = |at: usize| (*page.cast::<u8>().add(at).cast::<AtomicU32>()).load(Ordering::Acquire);
        Some((word(16), word(96)))
    }
}

impl SqliteWriter {
    /// `PRAGMA data_version` inside a transaction just begun; rolled back if it cannot be read.
    fn begun_version(&self) -> Result<i64> {
        self.data_version().inspect_err(|_| {
            let _ = self.exec("ROLLBACK", "rolling back");
        })
    }

    /// The body of a write transaction begun by the caller, who read `version`
    /// ([`SqliteWriter::begun_version`]): run `body`, then commit, or roll back.
    fn write(&mut self, body: &mut dyn FnMut(&mut dyn LogTx) -> Result<()>, version: i64) -> Result<()> {
        // Another connection has committed since this writer's last transaction (or this is its
        // first): it may have been a later version's upgrade.
        let others_committed = self.data_version != Some(version);
        let checked = self.check_files().and_then(|()| {
            if others_committed {
                self.check_not_upgraded()
            } else {
                Ok(())
            }
        });
        if let Err(e) = checked {
            let _ = self.exec("ROLLBACK", "rolling back");
            return Err(e);
        }
        if others_committed || self.tails.len() > MAX_TAILS {
            self.tails.clear();
        }
        let mut tx = SqliteTx {
            conn: &self.conn,
            tails: &self.tails,
            staged: Vec::new(),
            mark: 0,
        };
        let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&mut tx))) {
            Ok(result) => result,
            Err(panic) => {
                // Left open, the transaction would keep the database's write lock: every later
                // append here, and every writer in other processes, would fail (after the busy
                // timeout). Roll back, forget what this writer knew, and let the panic go on to
                // the writer loop, which settles the group with it.
                drop(tx);
                let _ = self.exec("ROLLBACK", "rolling back");
                self.tails.clear();
                self.data_version = None;
                std::panic::resume_unwind(panic);
            }
        };
        let staged = std::mem::take(&mut tx.staged);
        if let Err(e) = result {
            // Nothing of this transaction stays, so what was remembered before it still holds;
            // and no other connection can have committed while it held the write lock.
            let _ = self.exec("ROLLBACK", "rolling back");
            self.data_version = Some(version);
            return Err(e);
        }
        match self.exec("COMMIT", "committing appends") {
            Ok(()) => {
                // A file deleted or replaced between the check above and the commit: the commit
                // stands only where it was checkpointed into the database.
                if let Err(e) = self.check_files() {
                    if !matches!(self.damage, Some((Damage::Rescued, _))) {
                        return Err(e);
                    }
                }
                for (run, tail) in staged {
                    self.tails.insert(run, tail);
                }
                // Our own commits do not move our data_version; another connection's do.
                self.data_version = Some(version);
                Ok(())
            }
            Err(e) => {
                let _ = self.exec("ROLLBACK", "rolling back");
                self.tails.clear();
                self.data_version = None;
                Err(e)
            }
        }
    }
}

impl Drop for SqliteWriter {
    /// Close the connection, once sure that closing it loses nothing (see [`Damage`]).
    fn drop(&mut self) {
        if self.damage.is_none() {
            let _ = self.check_files();
        }
        if !matches!(self.damage, Some((Damage::Unsafe, _))) {
            // SAFETY: `conn` is dropped once, here, and not used after: this is the writer's drop.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.conn) };
        }
    }
}

struct SqliteTx<'c> {
    conn: &'c Connection,
    tails: &'c HashMap<String, Tail>,
    /// Tails written by this transaction, in order; the latest entry for a run wins.
    staged: Vec<(String, Tail)>,
    /// `staged.len()` at the open savepoint.
    mark: usize,
}

impl SqliteTx<'_> {
    fn exec(&self, sql: &str, what: &str) -> Result<()> {
        exec(self.conn, sql, what)
    }

    /// The tail of `run_id`: staged by this transaction, remembered, or read.
    fn tail(&self, run_id: &str) -> Result<Tail> {
        if let Some((_, t)) = self.staged.iter().rev().find(|(r, _)| r == run_id) {
            return Ok(*t);
        }
        if let Some(t) = self.tails.get(run_id) {
            return Ok(*t);
        }
        Ok(Tail {
            last: last_sequence(self.conn, run_id)?,
            ended: terminal(self.conn, run_id, "")?,
        })
    }
}

impl LogTx for SqliteTx<'_> {
    fn last_sequence(&mut self, run_id: &str) -> Result<u64> {
        self.tail(run_id).map(|t| t.last)
    }

    fn find_by_key(&mut self, run_id: &str, key: &str) -> Result<Option<KeyedEvent>> {
        find_by_key(self.conn, run_id, key)
    }

    fn insert(&mut self, row: &RowRef<'_>) -> Result<()> {
        let tail = self.tail(row.run_id)?;
        self.conn
            .prepare_cached(
                "INSERT INTO events (run_id, sequence, event_id, type, idempotency_key, request_digest, recorded_at, envelope)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    row.run_id,
                    row.sequence as i64,
                    row.event_id,
                    row.event_type,
                    row.key,
                    row.digest,
                    row.recorded_at,
                    row.envelope
                ])
            })
            .map_err(|e| match &e {
                rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ConstraintViolation => {
                    WorldError::RuntimeIntegrity {
                        reason: format!(
                            "{} sequence {} (or its idempotency key) is already taken: a writer bypassed the write lock ({e})",
                            row.run_id, row.sequence
                        ),
                    }
                }
                _ => WorldError::sqlite("inserting an event", e),
            })?;
        self.staged.push((
            row.run_id.to_string(),
            Tail {
                last: row.sequence,
                ..tail
            },
        ));
        Ok(())
    }

    fn terminal(&mut self, run_id: &str, node: &str) -> Result<Option<u64>> {
        if node.is_empty() {
            return self.tail(run_id).map(|t| t.ended);
        }
        terminal(self.conn, run_id, node)
    }

    fn insert_terminal(&mut self, run_id: &str, node: &str, sequence: u64, event_type: &str) -> Result<()> {
        let tail = self.tail(run_id)?;
        self.conn
            .prepare_cached("INSERT INTO terminals (run_id, node_id, sequence, type) VALUES (?1, ?2, ?3, ?4)")
            .and_then(|mut s| s.execute(params![run_id, node, sequence as i64, event_type]))
            .map_err(|e| WorldError::sqlite("recording a terminal event", e))?;
        if node.is_empty() {
            self.staged.push((
                run_id.to_string(),
                Tail {
                    ended: Some(sequence),
                    ..tail
                },
            ));
        }
        Ok(())
    }

    fn estimate(&mut self, run_id: &str, model: &str) -> Result<u64> {
        self.conn
            .prepare_cached("SELECT open FROM estimates WHERE run_id = ?1 AND model = ?2")
            .and_then(|mut s| s.query_row(params![run_id, model], |r| r.get::<_, i64>(0)).optional())
            .map(|v| v.map_or(0, |open| open.max(0) as u64))
            .map_err(|e| WorldError::sqlite("reading a budget estimate", e))
    }

    fn estimate_total(&mut self, run_id: &str) -> Result<u64> {
        // Each open amount is at most 2^53 - 1, and so is their sum: an i64 holds it.
        self.conn
            .prepare_cached("SELECT coalesce(sum(open), 0) FROM estimates WHERE run_id = ?1")
            .and_then(|mut s| s.query_row([run_id], |r| r.get::<_, i64>(0)))
            .map(|t| t.max(0) as u64)
            .map_err(|e| WorldError::sqlite("reading the conservative total", e))
    }

    fn add_estimate(&mut self, run_id: &str, model: &str, amount: u64, released: bool) -> Result<()> {
        let delta = if released { -(amount as i64) } else { amount as i64 };
        self.conn
            .prepare_cached(
                "INSERT INTO estimates (run_id, model, open) VALUES (?1, ?2, ?3)
                 ON CONFLICT (run_id, model) DO UPDATE SET open = open + excluded.open",
            )
            .and_then(|mut s| s.execute(params![run_id, model, delta]))
            .map(|_| ())
            .map_err(|e| WorldError::sqlite("recording a budget estimate", e))
    }

    fn usage(&mut self, run_id: &str) -> Result<[u64; 4]> {
        self.conn
            .prepare_cached(
                "SELECT input_tokens, output_tokens, cached_input_tokens, reasoning_tokens FROM usage_totals WHERE run_id = ?1",
            )
            .and_then(|mut s| {
                s.query_row([run_id], |r| {
                    let n = |i| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
                    Ok([n(0)?, n(1)?, n(2)?, n(3)?])
                })
                .optional()
            })
            .map(Option::unwrap_or_default)
            .map_err(|e| WorldError::sqlite("reading a run's token counts", e))
    }

    fn add_usage(&mut self, run_id: &str, tokens: [u64; 4]) -> Result<()> {
        // Each total is at most 2^53 - 1 (the caller checked), so an i64 holds it.
        let [a, b, c, d] = tokens.map(|n| n as i64);
        self.conn
            .prepare_cached(
                "INSERT INTO usage_totals (run_id, input_tokens, output_tokens, cached_input_tokens, reasoning_tokens)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (run_id) DO UPDATE SET
                    input_tokens = input_tokens + excluded.input_tokens,
                    output_tokens = output_tokens + excluded.output_tokens,
                    cached_input_tokens = cached_input_tokens + excluded.cached_input_tokens,
                    reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens",
            )
            .and_then(|mut s| s.execute(params![run_id, a, b, c, d]))
            .map(|_| ())
            .map_err(|e| WorldError::sqlite("adding to a run's token counts", e))
    }

    fn savepoint(&mut self) -> Result<()> {
        self.mark = self.staged.len();
        self.exec("SAVEPOINT append", "opening a savepoint")
    }

    fn release(&mut self) -> Result<()> {
        self.exec("RELEASE append", "releasing a savepoint")
    }

    fn rollback_to(&mut self) -> Result<()> {
        self.staged.truncate(self.mark);
        self.exec("ROLLBACK TO append", "rolling back a savepoint")?;
        self.exec("RELEASE append", "releasing a savepoint")
    }
}

/// Run a statement that takes no parameters and returns no rows, such as `COMMIT`.
fn exec(conn: &Connection, sql: &str, what: &str) -> Result<()> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.execute([]))
        .map(|_| ())
        .map_err(|e| WorldError::sqlite(what.to_string(), e))
}

fn terminal(conn: &Connection, run_id: &str, node: &str) -> Result<Option<u64>> {
    conn.prepare_cached("SELECT sequence FROM terminals WHERE run_id = ?1 AND node_id = ?2")
        .and_then(|mut s| s.query_row(params![run_id, node], |r| r.get::<_, i64>(0)).optional())
        .map(|v| v.map(|s| s as u64))
        .map_err(|e| WorldError::sqlite("looking up a terminal event", e))
}

fn last_sequence(conn: &Connection, run_id: &str) -> Result<u64> {
    conn.prepare_cached("SELECT MAX(sequence) FROM events WHERE run_id = ?1")
        .and_then(|mut s| s.query_row([run_id], |r| r.get::<_, Option<i64>>(0)))
        .map(|v| v.unwrap_or(0) as u64)
        .map_err(|e| WorldError::sqlite("reading the last sequence", e))
}

/// Most new rows whose streams [`SqliteReader::changes`] lists; past this, anything may have changed.
const CHANGES_LISTED: i64 = 100_000;

/// Read connections, pooled until the world closes.
pub struct SqliteReader {
    path: PathBuf,
    access: Access,
    pool: Mutex<Pool>,
    /// The store's files as the world opened them (the database, and for a writable world its
    /// `-shm` and `-wal`): every read is refused once the file at one of their paths is another
    /// (the data directory deleted and made again, by another world perhaps). A pooled
    /// connection would go on reading the deleted store; a new one would read a store this world
    /// does not own, or a WAL that is not the one the wal-index describes.
    identity: Vec<OpenedFile>,
}

/// The reader's idle connections; none are kept once it is closed.
#[derive(Default)]
struct Pool {
    idle: Vec<Connection>,
    closed: bool,
}

impl SqliteReader {
    fn new(path: PathBuf, access: Access) -> SqliteReader {
        SqliteReader {
            path,
            access,
            pool: Mutex::new(Pool::default()),
            identity: Vec::new(),
        }
    }

    fn with_conn<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        for file in &self.identity {
            file.check(
                "reading the event store",
                "; close the world and open the data directory again",
            )?;
        }
        if self.access == Access::Immutable
            && std::fs::metadata(beside(&self.identity[0].path, "-wal")).is_ok_and(|m| m.len() > 0)
        {
            // Read as a file nothing changes, the store now has a writer: its pages may change
            // under a read.
            return Err(WorldError::Path {
                message: format!(
                    "{}: another process has begun writing the world since this read-only world opened it; open it again to read what it writes",
                    self.path.display()
                ),
            });
        }
        let pooled = self.pool.lock().expect("reader pool").idle.pop();
        let conn = match pooled {
            Some(c) => c,
            None => {
                let c = connect(&self.path, self.access)?;
                // Readers map the database instead of copying each page through read(2).
                c.pragma_update(None, "query_only", true)
                    .and_then(|_| c.pragma_update(None, "mmap_size", READER_MMAP))
                    .map_err(|e| on(&c, WorldError::sqlite("opening a reader", e)))?;
                c
            }
        };
        let out = f(&conn).map_err(|e| on(&conn, e));
        let mut pool = self.pool.lock().expect("reader pool");
        if !pool.closed {
            pool.idle.push(conn);
        }
        out
    }
}

impl LogReader for SqliteReader {
    fn envelopes(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(&str) -> Result<()>,
    ) -> Result<()> {
        self.with_conn(|conn| {
            let limit = limit.map(|l| l.min(i64::MAX as u64) as i64).unwrap_or(-1);
            let mut stmt = conn
                .prepare_cached(
                    "SELECT envelope FROM events WHERE run_id = ?1 AND sequence > ?2 ORDER BY sequence LIMIT ?3",
                )
                .map_err(|e| WorldError::sqlite("listing events", e))?;
            let mut rows = stmt
                .query(params![run_id, after.min(i64::MAX as u64) as i64, limit])
                .map_err(|e| WorldError::sqlite("listing events", e))?;
            while let Some(row) = rows.next().map_err(|e| WorldError::sqlite("listing events", e))? {
                let text = row
                    .get_ref(0)
                    .and_then(|v| v.as_str().map_err(Into::into))
                    .map_err(|e| WorldError::sqlite("reading an envelope", e))?;
                sink(text)?;
            }
            Ok(())
        })
    }

    fn rows(
        &self,
        run_id: &str,
        after: u64,
        limit: Option<u64>,
        sink: &mut dyn FnMut(RowRef<'_>) -> Result<()>,
    ) -> Result<()> {
        self.with_conn(|conn| {
            let limit = limit.map(|l| l.min(i64::MAX as u64) as i64).unwrap_or(-1);
            let mut stmt = conn
                .prepare_cached(
                    "SELECT run_id, sequence, event_id, type, idempotency_key, request_digest, recorded_at, envelope
                     FROM events WHERE run_id = ?1 AND sequence > ?2 ORDER BY sequence LIMIT ?3",
                )
                .map_err(|e| WorldError::sqlite("reading events", e))?;
            let mut rows = stmt
                .query(params![run_id, after.min(i64::MAX as u64) as i64, limit])
                .map_err(|e| WorldError::sqlite("reading events", e))?;
            while let Some(r) = rows.next().map_err(|e| WorldError::sqlite("reading events", e))? {
                let text = |i: usize| -> rusqlite::Result<&str> { r.get_ref(i)?.as_str().map_err(Into::into) };
                let opt =
                    |i: usize| -> rusqlite::Result<Option<&str>> { r.get_ref(i)?.as_str_or_null().map_err(Into::into) };
                let row = (|| {
                    Ok::<_, rusqlite::Error>(RowRef {
                        run_id: text(0)?,
                        sequence: r.get::<_, i64>(1)? as u64,
                        event_id: text(2)?,
                        event_type: text(3)?,
                        key: opt(4)?,
                        digest: opt(5)?,
                        recorded_at: text(6)?,
                        envelope: text(7)?,
                    })
                })()
                .map_err(|e| WorldError::sqlite("reading an event row", e))?;
                sink(row)?;
            }
            Ok(())
        })
    }

    fn streams(&self) -> Result<Vec<StreamSummary>> {
        self.with_conn(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT run_id, count(*), max(sequence), min(recorded_at), max(recorded_at)
                     FROM events GROUP BY run_id ORDER BY run_id",
                )
                .map_err(|e| WorldError::sqlite("listing runs", e))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(StreamSummary {
                        run_id: r.get(0)?,
                        event_count: r.get::<_, i64>(1)? as u64,
                        last_sequence: r.get::<_, i64>(2)? as u64,
                        first_recorded_at: r.get(3)?,
                        last_recorded_at: r.get(4)?,
                    })
                })
                .map_err(|e| WorldError::sqlite("listing runs", e))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
                .map_err(|e| WorldError::sqlite("listing runs", e))
        })
    }

    fn last_sequence(&self, run_id: &str) -> Result<u64> {
        self.with_conn(|conn| last_sequence(conn, run_id))
    }

    /// By rowid, which only grows while rows are only added: the streams of the rows after the
    /// mark, up to the greatest rowid read first (so a row committed between the two statements
    /// is left for the next call).
    fn changes(&self, since: Option<i64>) -> Result<Changes> {
        self.with_conn(|conn| {
            let err = |e| WorldError::sqlite("looking for new events", e);
            let mark: i64 = conn
                .prepare_cached("SELECT coalesce(max(rowid), 0) FROM events")
                .and_then(|mut s| s.query_row([], |r| r.get(0)))
                .map_err(err)?;
            let streams = match since {
                None => Some(Vec::new()),
                Some(since) if mark == since => Some(Vec::new()),
                Some(since) if mark < since || mark - since > CHANGES_LISTED => None,
                Some(since) => Some(
                    conn.prepare_cached("SELECT DISTINCT run_id FROM events WHERE rowid > ?1 AND rowid <= ?2")
                        .and_then(|mut s| {
                            s.query_map([since, mark], |r| r.get::<_, String>(0))?
                                .collect::<rusqlite::Result<Vec<_>>>()
                        })
                        .map_err(err)?,
                ),
            };
            Ok(Changes { mark, streams })
        })
    }

    fn find_by_key(&self, run_id: &str, key: &str) -> Result<Option<KeyedEvent>> {
        self.with_conn(|conn| find_by_key(conn, run_id, key))
    }

    /// SQLite's own check, then each run's rows counted through the `(run_id, sequence)` index
    /// against a scan of the table: `quick_check` does not compare indexes with their tables, and
    /// that index is the one every read of a run goes through.
    fn check_storage(&self, thorough: bool) -> Result<Vec<String>> {
        self.with_conn(|conn| {
            let pragma = if thorough { "PRAGMA integrity_check" } else { "PRAGMA quick_check" };
            // A database too damaged to be checked (or counted) is itself what the check found.
            let failed = |doing: &str, e: rusqlite::Error| -> Result<Vec<String>> {
                match WorldError::sqlite(doing, e) {
                    e @ WorldError::EventLogCorrupt { .. } => Ok(vec![e.to_string()]),
                    e => Err(e),
                }
            };
            let mut found: Vec<String> = match conn
                .prepare(pragma)
                .and_then(|mut s| s.query_map([], |r| r.get::<_, String>(0))?.collect())
            {
                Ok(found) => found,
                Err(e) => return failed("checking the database", e),
            };
            if found.len() == 1 && found[0] == "ok" {
                found.clear();
            }
            let count = |sql: &str| -> rusqlite::Result<HashMap<String, (i64, i64)>> {
                conn.prepare(sql).and_then(|mut s| {
                    s.query_map([], |r| Ok((r.get::<_, String>(0)?, (r.get(1)?, r.get(2)?))))?
                        .collect()
                })
            };
            let counted = count(
                "SELECT run_id, count(*), max(sequence) FROM events INDEXED BY sqlite_autoindex_events_1 GROUP BY run_id",
            )
            .and_then(|i| Ok((i, count("SELECT run_id, count(*), max(sequence) FROM events NOT INDEXED GROUP BY run_id")?)));
            let (by_index, by_table) = match counted {
                Ok(both) => both,
                Err(e) => {
                    found.extend(failed("counting each run's rows", e)?);
                    return Ok(found);
                }
            };
            let mut runs: Vec<&String> = by_index.keys().chain(by_table.keys()).collect();
            runs.sort();
            runs.dedup();
            for run in runs {
                let (i, t) = (by_index.get(run), by_table.get(run));
                if i != t {
                    let say = |c: Option<&(i64, i64)>| match c {
                        Some((n, max)) => format!("{n} rows up to sequence {max}"),
                        None => "no rows".to_string(),
                    };
                    found.push(format!(
                        "run {}: the table holds {}, its index {}",
                        crate::core::canonical::string_literal(run),
                        say(t),
                        say(i)
                    ));
                }
            }
            Ok(found)
        })
    }

    fn close(&self) {
        let idle = {
            let mut pool = self.pool.lock().expect("reader pool");
            pool.closed = true;
            std::mem::take(&mut pool.idle)
        };
        drop(idle);
    }
}

/// The row of `run_id` appended with idempotency key `key`, as `conn` sees the store.
fn find_by_key(conn: &Connection, run_id: &str, key: &str) -> Result<Option<KeyedEvent>> {
    conn.prepare_cached(
        "SELECT sequence, request_digest, envelope FROM events WHERE run_id = ?1 AND idempotency_key = ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![run_id, key], |r| {
            Ok(KeyedEvent {
                sequence: r.get::<_, i64>(0)? as u64,
                digest: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                envelope: r.get(2)?,
            })
        })
        .optional()
    })
    .map_err(|e| WorldError::sqlite("looking up an idempotency key", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_database_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("events")).unwrap();
        std::fs::write(dir.path().join("events/events.db"), vec![0x42u8; 8192]).unwrap();
        let err = open(dir.path(), Durability::Full).err().unwrap();
        assert_eq!(err.code(), "EVENT_LOG_CORRUPT", "{err}");
    }

    #[test]
    fn a_foreign_database_is_refused_and_left_untouched() {
        // Also one that keeps a user_version of its own, which used to pass for a world's schema
        // version: switched to WAL, then failing, or opening as a world without tables.
        for (version, tables) in [(0, true), (1, true), (2, true), (3, true), (3, false), (7, true)] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("events")).unwrap();
            let path = dir.path().join("events/events.db");
            let conn = Connection::open(&path).unwrap();
            if tables {
                conn.execute_batch("CREATE TABLE customers (id INTEGER); INSERT INTO customers VALUES (1);")
                    .unwrap();
            }
            conn.pragma_update(None, "user_version", version).unwrap();
            drop(conn);
            let before = std::fs::read(&path).unwrap();
            let err = open(dir.path(), Durability::Normal).err().unwrap();
            assert_eq!(err.code(), "WORLD_PATH", "user_version {version}: {err}");
            assert!(
                err.to_string().contains("another application"),
                "user_version {version}: {err}"
            );
            let err = open_read_only(dir.path()).err().unwrap();
            assert!(
                err.to_string().contains("another application"),
                "user_version {version}: {err}"
            );
            assert_eq!(std::fs::read(&path).unwrap(), before);
            assert!(!dir.path().join("events/events.db-wal").exists());
        }
    }

    /// Commit `rows` rows of about a page each to `run_id` after `after`, in one transaction.
    fn commit_rows(writer: &mut SqliteWriter, run_id: &str, after: u64, rows: u64) {
        writer
            .transaction(&mut |tx| insert_rows(tx, run_id, after, rows))
            .unwrap();
    }

    /// A body that inserts `rows` rows of about a page each to `run_id` after `after`.
    fn insert_rows(tx: &mut dyn LogTx, run_id: &str, after: u64, rows: u64) -> Result<()> {
        let pad = "p".repeat(3000);
        for seq in after + 1..=after + rows {
            let envelope = format!("{{\"n\":{seq},\"pad\":\"{pad}\"}}");
            tx.insert(&RowRef::plain(run_id, seq, "evt_0000000000000000", &envelope))?;
        }
        Ok(())
    }

    fn count_rows(reader: &SqliteReader, run_id: &str) -> usize {
        let mut n = 0;
        reader
            .envelopes(run_id, 0, None, &mut |_| {
                n += 1;
                Ok(())
            })
            .unwrap();
        n
    }

    #[test]
    fn a_transaction_now_runs_only_where_nothing_would_wait() {
        // At `full` the commit syncs: never now.
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, _reader) = open(dir.path(), Durability::Full).unwrap();
        assert!(writer
            .transaction_now(&mut |tx| insert_rows(tx, "run_n", 0, 1))
            .is_none());

        let dir = tempfile::tempdir().unwrap();
        let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
        writer.transaction(&mut |tx| insert_rows(tx, "run_n", 0, 1)).unwrap();
        writer
            .transaction_now(&mut |tx| insert_rows(tx, "run_n", 1, 1))
            .unwrap()
            .unwrap();
        assert_eq!(count_rows(&reader, "run_n"), 2);

        // Another connection's commits count too: with the WAL grown near the size at which a
        // commit checkpoints inside itself by another connection (its own automatic checkpoint
        // off), not now, though this writer's hook was told nothing of it.
        let another = Connection::open(dir.path().join("events/events.db")).unwrap();
        another
            .execute_batch(&format!(
                "PRAGMA wal_autocheckpoint = 0;
                 WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < {CHECKPOINT_INLINE_AT})
                 INSERT INTO estimates (run_id, model, open) SELECT 'run_o', printf('%.3000d', n), 1 FROM c;"
            ))
            .unwrap();
        assert!(writer.checkpointer.as_ref().unwrap().wal.pages.load(Ordering::Relaxed) < 100);
        assert!(writer
            .transaction_now(&mut |tx| insert_rows(tx, "run_n", 2, 1))
            .is_none());
        // A transaction that may wait commits, and checkpoints inside itself; the WAL starts over at
        // the next, and then a transaction runs now again.
        writer.transaction(&mut |tx| insert_rows(tx, "run_n", 2, 1)).unwrap();
        writer.transaction(&mut |tx| insert_rows(tx, "run_n", 3, 1)).unwrap();
        writer
            .transaction_now(&mut |tx| insert_rows(tx, "run_n", 4, 1))
            .unwrap()
            .unwrap();
        assert_eq!(count_rows(&reader, "run_n"), 5);

        // Another connection holds the write lock: declined at once, nothing written, and the
        // body never ran.
        let other = Connection::open(dir.path().join("events/events.db")).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let asked = std::time::Instant::now();
        let mut ran = false;
        let declined = writer.transaction_now(&mut |tx| {
            ran = true;
            insert_rows(tx, "run_n", 5, 1)
        });
        assert!(declined.is_none());
        assert!(!ran);
        // Not the 30 s busy timeout (a bound far from any machine's speed, not a measurement).
        assert!(asked.elapsed() < Duration::from_secs(10), "{:?}", asked.elapsed());
        // The busy timeout is back for the transactions that may wait: this one waits for the
        // other connection's commit rather than failing at once.
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            other.execute_batch("COMMIT").unwrap();
        });
        writer.transaction(&mut |tx| insert_rows(tx, "run_n", 5, 1)).unwrap();
        releaser.join().unwrap();
        assert_eq!(count_rows(&reader, "run_n"), 6);
    }

    #[test]
    fn a_transaction_now_is_declined_before_its_commit_could_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
        writer.transaction(&mut |tx| insert_rows(tx, "run_w", 0, 1)).unwrap();
        // A reader's snapshot from before keeps the WAL from starting over, so it only grows.
        let snapshot = Connection::open(dir.path().join("events/events.db")).unwrap();
        snapshot.execute_batch("BEGIN; SELECT COUNT(*) FROM events;").unwrap();
        let (mut rows, mut now) = (1, 0);
        loop {
            let before = writer.checkpointer.as_ref().unwrap().wal.pages.load(Ordering::Relaxed);
            let outcome = writer.transaction_now(&mut |tx| insert_rows(tx, "run_w", rows, 100));
            if before >= CHECKPOINT_INLINE_AT - NOW_MARGIN {
                assert!(outcome.is_none(), "a commit now at {before} WAL pages");
                break;
            }
            match outcome {
                Some(result) => {
                    result.unwrap();
                    now += 1;
                }
                // The checkpoint thread was running (woken by the growing WAL, with nothing it
                // may copy): as the world does, commit on a thread that may wait.
                None => writer
                    .transaction(&mut |tx| insert_rows(tx, "run_w", rows, 100))
                    .unwrap(),
            }
            rows += 100;
            assert!(rows < 20_000, "the WAL stopped growing at {before} pages");
        }
        assert!(now > 0, "no transaction was committed now");
        // What may wait still commits (and checkpoints inside itself, as before).
        writer.transaction(&mut |tx| insert_rows(tx, "run_w", rows, 1)).unwrap();
        drop(snapshot);
        assert_eq!(count_rows(&reader, "run_w") as u64, rows + 1);
    }

    /// Wait up to 30 s for `ready`.
    fn wait_for(what: &str, ready: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !ready() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_transaction_now_is_declined_where_its_commit_would_start_the_wal_over() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
        let wal = writer.checkpointer.as_ref().unwrap().wal.clone();
        // Enough to wake the checkpoint thread, which then copies all of it.
        commit_rows(&mut writer, "run_s", 0, CHECKPOINT_AT as u64 + 200);
        wait_for("the checkpoint thread never caught up", || {
            wal.checkpointed.load(Ordering::Relaxed) >= wal.pages.load(Ordering::Relaxed)
        });
        // The next commit starts the WAL over, writing (and syncing) its header: not now.
        let mut ran = false;
        assert!(writer
            .transaction_now(&mut |tx| {
                ran = true;
                insert_rows(tx, "run_s", 1200, 1)
            })
            .is_none());
        assert!(!ran);
        writer.transaction(&mut |tx| insert_rows(tx, "run_s", 1200, 1)).unwrap();
        let pages = wal.pages.load(Ordering::Relaxed);
        assert!(pages < 16, "the WAL did not start over: {pages} pages");
        assert_eq!(wal.checkpointed.load(Ordering::Relaxed), 0);
        writer
            .transaction_now(&mut |tx| insert_rows(tx, "run_s", 1201, 1))
            .unwrap()
            .unwrap();
        assert_eq!(count_rows(&reader, "run_s"), 1202);
    }

    #[test]
    fn the_checkpoint_thread_catches_up_with_the_commits_made_while_it_ran() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
        let wal = writer.checkpointer.as_ref().unwrap().wal.clone();
        // Commits without a pause, well past the size that wakes the thread and short of the
        // one at which a commit checkpoints inside itself; then none.
        let mut n = 0;
        while n < 3 * CHECKPOINT_AT as u64 {
            commit_rows(&mut writer, "run_c", n, 50);
            n += 50;
        }
        // The thread goes on until less than a wake's worth is left, though the wakes sent while
        // it ran were for pages it could not copy.
        wait_for("the checkpoint thread left a wake's worth behind", || {
            wal.pending() < CHECKPOINT_AT
        });
        assert_eq!(count_rows(&reader, "run_c") as u64, n);
    }

    #[test]
    fn a_panic_inside_a_transaction_rolls_it_back_and_releases_the_write_lock() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
        commit_rows(&mut writer, "run_p", 0, 1);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = writer.transaction(&mut |tx| {
                tx.insert(&RowRef::plain("run_p", 2, "evt_0000000000000000", "{}"))?;
                panic!("a bug in the middle of a group");
            });
        }));
        assert!(panicked.is_err(), "the panic goes on to the caller");
        // Nothing of the panicked transaction stays, and this writer can write again.
        assert_eq!(reader.last_sequence("run_p").unwrap(), 1);
        commit_rows(&mut writer, "run_p", 1, 1);
        assert_eq!(reader.last_sequence("run_p").unwrap(), 2);
        // Another connection (another process) is not kept waiting on a lock left behind.
        let (mut other, _) = open(dir.path(), Durability::Normal).unwrap();
        other.conn.busy_timeout(Duration::from_millis(200)).unwrap();
        commit_rows(&mut other, "run_p", 2, 1);
        assert_eq!(reader.last_sequence("run_p").unwrap(), 3);
    }

    fn file_len(path: &Path) -> u64 {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    }

    #[test]
    fn writeback_is_due_every_mebibyte_up_to_a_memory_page_boundary_and_again_when_the_wal_starts_over() {
        let mut w = Writeback::new("unused-wal".into(), 4096, 4096);
        let end = |frames: i64| 32 + frames * (4096 + 24);
        let page_below = |bytes: i64| bytes / 4096 * 4096;
        // 1 MiB is reached within frame 255 (ending at 1,050,632 bytes), and the writeback stops
        // at the memory page boundary below its end.
        assert_eq!(w.due(1, 0), None);
        assert_eq!(w.due(254, 0), None);
        assert_eq!(w.due(255, 0), Some((0, page_below(end(255)))));
        assert_eq!(page_below(end(255)), 1_048_576);
        // From where the last one ended, contiguously.
        assert_eq!(w.due(300, 0), None);
        assert_eq!(w.due(600, 0), Some((1_048_576, page_below(end(600)) - 1_048_576)));
        // The WAL started over: counted from its start again, even once it has grown past where
        // the writeback had got to (commits in between were not seen).
        assert_eq!(w.due(700, 1), Some((0, page_below(end(700)))));
        assert_eq!(w.due(10, 2), None);
        assert_eq!(w.due(255, 2), Some((0, 1_048_576)));
        // Other page sizes, of the database and of memory.
        let mut w = Writeback::new("unused-wal".into(), 65536, 16384);
        assert_eq!(w.due(15, 0), None);
        assert_eq!(w.due(16, 0), Some((0, (32 + 16 * (65536 + 24)) / 16384 * 16384)));
    }

    /// The writer's connection opens its WAL through the VFS that gathers frames, at either
    /// durability; a reader's connection (which never writes the WAL) uses the default VFS.
    #[test]
    fn the_writers_wal_is_gathered_and_a_readers_is_not() {
        for durability in [Durability::Normal, Durability::Full] {
            let dir = tempfile::tempdir().unwrap();
            let (mut writer, reader) = open(dir.path(), durability).unwrap();
            commit_rows(&mut writer, "run_g", 0, 20);
            assert!(super::super::wal_vfs::gathers(&writer.conn), "{durability:?}");
            assert_eq!(count_rows(&reader, "run_g"), 20);
            assert!(!reader
                .with_conn(|conn| Ok(super::super::wal_vfs::gathers(conn)))
                .unwrap());
        }
    }

    /// The writer starts the writeback of the WAL as commits add to it (`sync_file_range`, which
    /// the kernel must accept for the count to grow), and commits stay readable.
    #[cfg(target_os = "linux")]
    #[test]
    fn at_normal_the_writer_starts_writing_the_wal_back_as_commits_add_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
        let wal = writer.checkpointer.as_ref().unwrap().wal.clone();
        // 100 rows of about a page each: some 400 KiB of frames a transaction.
        let mut n = 0;
        while n < 1000 {
            commit_rows(&mut writer, "run_wb", n, 100);
            n += 100;
        }
        let started = wal.written_back.load(Ordering::Relaxed);
        assert!(started >= 3 << 20, "writeback was started for {started} bytes");
        assert_eq!(count_rows(&reader, "run_wb") as u64, n);

        // A transaction committed now never starts it on its (the caller's) thread, though
        // more than a mebibyte of frames is committed so.
        let mut now = 0;
        for _ in 0..600 {
            let before = wal.written_back.load(Ordering::Relaxed);
            match writer.transaction_now(&mut |tx| insert_rows(tx, "run_wb", n, 1)) {
                Some(done) => {
                    done.unwrap();
                    now += 1;
                    assert_eq!(wal.written_back.load(Ordering::Relaxed), before);
                }
                None => commit_rows(&mut writer, "run_wb", n, 1),
            }
            n += 1;
        }
        assert!(now > 300, "{now} transactions were committed now");
        assert_eq!(count_rows(&reader, "run_wb") as u64, n);
    }

    #[test]
    fn at_normal_a_thread_of_its_own_checkpoints_and_the_wal_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (db, wal) = (
            dir.path().join("events/events.db"),
            dir.path().join("events/events.db-wal"),
        );
        let (mut writer, reader) = open(dir.path(), Durability::Normal).unwrap();
        // Past the size at which the checkpoint thread is woken, but far below the inline one.
        let mut n = 0;
        while n < 2 * CHECKPOINT_AT as u64 {
            commit_rows(&mut writer, "run_ckpt", n, 100);
            n += 100;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while file_len(&db) < 1 << 20 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            file_len(&db) >= 1 << 20,
            "nothing was checkpointed: the database holds {} bytes",
            file_len(&db)
        );
        // Commits without a pause, to three times the inline size: the WAL starts over instead of
        // growing, passing the inline size by one transaction (100 rows, 2 pages each at most).
        let frame = 4096 + 24;
        let bound = (CHECKPOINT_INLINE_AT as u64 + 200) * frame + 32;
        let mut largest = 0;
        while n < 3 * CHECKPOINT_INLINE_AT as u64 {
            commit_rows(&mut writer, "run_ckpt", n, 100);
            n += 100;
            largest = largest.max(file_len(&wal));
        }
        assert!(largest <= bound, "the WAL grew to {largest} bytes (bound {bound})");
        assert_eq!(reader.last_sequence("run_ckpt").unwrap(), n);
        assert_eq!(count_rows(&reader, "run_ckpt") as u64, n);
        // Closing joins the thread; the last connection out removes the WAL.
        drop(writer);
        drop(reader);
        assert!(!wal.exists());
    }

    #[test]
    fn a_data_directory_too_long_for_sqlite_is_refused_saying_so_before_anything_is_created() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().canonicalize().unwrap();
        // The store is `<data dir>/events/events.db`: 17 bytes past the data directory.
        let fits = MAX_DATABASE_PATH - 17 - base.as_os_str().len() - 1;
        let dir_of = |n: usize| {
            let name = "d".repeat(n);
            let mut d = base.clone();
            for part in name.as_bytes().chunks(200) {
                d.push(std::str::from_utf8(part).unwrap());
            }
            d
        };
        // Each 200-byte component adds a separator: aim the total at the limit exactly.
        let mut n = fits;
        while dir_of(n).join("events/events.db").as_os_str().len() > MAX_DATABASE_PATH {
            n -= 1;
        }
        let ok = dir_of(n);
        assert_eq!(ok.join("events/events.db").as_os_str().len(), MAX_DATABASE_PATH);
        std::fs::create_dir_all(&ok).unwrap();
        open(&ok, Durability::Normal).map(drop).unwrap();
        let long = dir_of(n + 1);
        std::fs::create_dir_all(&long).unwrap();
        let err = open(&long, Durability::Normal).map(drop).unwrap_err();
        assert_eq!(err.code(), "WORLD_PATH", "{err}");
        assert!(err.to_string().contains("SQLite opens at most 504"), "{err}");
        assert!(!long.join("events").exists());
        assert_eq!(open_read_only(&long).map(drop).unwrap_err().code(), "WORLD_PATH");
        // Predicted for a directory that does not exist yet, before it is created.
        assert!(check_data_dir_length(&dir_of(n)).is_ok());
        let missing = dir_of(n + 1).join("x");
        assert_eq!(check_data_dir_length(&missing).unwrap_err().code(), "WORLD_PATH");
        let fresh = root.path().join("fresh").join("f".repeat(100));
        assert!(check_data_dir_length(&fresh).is_ok());
        // A `..` after a directory that does not exist yet undoes it.
        let dotted = dir_of(n).join("missing").join("..");
        assert!(check_data_dir_length(&dotted).is_ok());
        assert_eq!(
            check_data_dir_length(&dir_of(n).join("missing/../y"))
                .unwrap_err()
                .code(),
            "WORLD_PATH"
        );
    }

    #[test]
    fn a_file_uri_escapes_what_a_uri_would_read_as_its_own() {
        assert_eq!(
            file_uri(Path::new("/a b/c?d#e%f/events.db"), "immutable=1"),
            "file:/a%20b/c%3Fd%23e%25f/events.db?immutable=1"
        );
        // Opened as such, the store at an odd path reads.
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("odd ?#% name");
        let (mut writer, _) = open(&dir, Durability::Normal).unwrap();
        commit_rows(&mut writer, "run_u", 0, 2);
        drop(writer);
        let db = dir.join("events/events.db");
        let conn = connect(&db, Access::Immutable).unwrap();
        assert_eq!(last_sequence(&conn, "run_u").unwrap(), 2);
    }

    #[test]
    fn something_else_where_a_file_of_the_store_belongs_is_refused_saying_what_and_where() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path(), Durability::Normal).unwrap());
        // A directory where the WAL file belongs: SQLite would say only "unable to open database
        // file".
        let wal = dir.path().join("events/events.db-wal");
        std::fs::create_dir(&wal).unwrap();
        let err = open(dir.path(), Durability::Normal).map(drop).unwrap_err();
        assert_eq!(err.code(), "WORLD_PATH", "{err}");
        assert!(err.to_string().contains(&*wal.to_string_lossy()), "{err}");
        assert!(err.to_string().contains("is a directory"), "{err}");

        // And the database itself a directory.
        let other = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(other.path().join("events/events.db")).unwrap();
        let err = open(other.path(), Durability::Normal).map(drop).unwrap_err();
        assert_eq!(err.code(), "WORLD_PATH", "{err}");
        assert!(err.to_string().contains("is a directory"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_writer_whose_files_were_deleted_while_open_refuses_to_write() {
        for deleted in ["the data directory", "events.db-shm", "events.db-wal", "events.db"] {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().join("world");
            let (mut writer, _reader) = open(&dir, Durability::Normal).unwrap();
            commit_rows(&mut writer, "run_d", 0, 1);
            assert_eq!(_reader.last_sequence("run_d").unwrap(), 1); // pools a connection
            match deleted {
                "the data directory" => std::fs::remove_dir_all(&dir).unwrap(),
                file => std::fs::remove_file(dir.join("events").join(file)).unwrap(),
            }
            // A reader of the world takes no new connection to whatever is at the path now.
            if deleted == "the data directory" {
                drop(open(&dir, Durability::Normal).unwrap());
                // Not even through a connection it pooled before (which reads the deleted store).
                let err = _reader.last_sequence("run_d").unwrap_err();
                assert!(err.to_string().contains("deleted, moved or replaced"), "{err}");
            }
            let err = writer.transaction(&mut |_| Ok(())).unwrap_err();
            assert_eq!(err.code(), "WORLD_IO", "{deleted}: {err}");
            assert!(
                err.to_string()
                    .contains("deleted, moved or replaced while this world had it open"),
                "{deleted}: {err}"
            );
            // Nothing is held: a fresh store at the path takes the write lock at once. (This
            // process's SQLite keeps sharing the deleted `-shm` among its connections to the same
            // database, and a world opened on it here is refused too.)
            match deleted {
                "events.db" => {
                    let (mut other, _) = open(&dir, Durability::Normal).unwrap();
                    other.transaction(&mut |_| Ok(())).unwrap();
                }
                "events.db-shm" => assert_eq!(open(&dir, Durability::Normal).map(drop).unwrap_err().code(), "WORLD_IO"),
                _ => {}
            }
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_writer_whose_wal_was_deleted_copies_it_into_the_database_before_refusing() {
        for durability in [Durability::Full, Durability::Normal] {
            let dir = tempfile::tempdir().unwrap();
            let (mut writer, reader) = open(dir.path(), durability).unwrap();
            commit_rows(&mut writer, "run_w", 0, 3);
            std::fs::remove_file(dir.path().join("events/events.db-wal")).unwrap();
            let err = writer
                .transaction(&mut |tx| insert_rows(tx, "run_w", 3, 1))
                .unwrap_err();
            assert_eq!(err.code(), "WORLD_IO", "{err}");
            assert_eq!(writer.damage, Some((Damage::Rescued, WAL)));
            drop(reader);
            drop(writer);
            // The database file alone holds the three rows: nothing is left in any WAL.
            let db = rusqlite::Connection::open(dir.path().join("events/events.db")).unwrap();
            let n: i64 = db.query_row("SELECT count(*) FROM events", [], |r| r.get(0)).unwrap();
            assert_eq!(n, 3, "{durability:?}");
        }
    }

    /// Whether this process holds a lock on bytes `start..start + len` of `path`, as another
    /// process sees it. Asked from a child: a descriptor opened and closed here to ask would
    /// itself drop every POSIX lock this process holds on the file.
    #[cfg(target_os = "linux")]
    fn locked_by_this_process(path: &Path, start: i64, len: i64) -> bool {
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: the child calls only async-signal-safe functions (open, fcntl, _exit) before
        // it exits; the parent waits for it.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                let fd = libc::open(c_path.as_ptr(), libc::O_RDWR);
                let mut fl: libc::flock = std::mem::zeroed();
                fl.l_type = libc::F_WRLCK as libc::c_short;
                fl.l_whence = libc::SEEK_SET as libc::c_short;
                fl.l_start = start;
                fl.l_len = len;
                let code = if fd < 0 || libc::fcntl(fd, libc::F_GETLK, &mut fl) != 0 {
                    2
                } else if fl.l_type == libc::F_UNLCK as libc::c_short {
                    0
                } else {
                    1
                };
                libc::_exit(code);
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            match libc::WEXITSTATUS(status) {
                0 => false,
                1 => true,
                _ => panic!("could not ask about the locks on {}", path.display()),
            }
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn closing_a_writer_leaves_the_locks_of_other_connections_to_the_same_store() {
        let dir = tempfile::tempdir().unwrap();
        let (first, _) = open(dir.path(), Durability::Normal).unwrap();
        let (mut second, _) = open(dir.path(), Durability::Normal).unwrap();
        commit_rows(&mut second, "run_l", 0, 1);
        let shm = dir.path().join("events/events.db-shm");
        // Every WAL connection holds a shared lock on the -shm's "DMS" byte (offset 128 of the
        // locking region at 120) while open: the sign to others that it is in use.
        assert!(locked_by_this_process(&shm, 128, 1));
        drop(first);
        assert!(
            locked_by_this_process(&shm, 128, 1),
            "the second writer's lock went with the first"
        );
        commit_rows(&mut second, "run_l", 1, 1);
    }

    #[cfg(unix)]
    #[test]
    fn a_store_whose_database_is_a_symlink_opens_and_writes() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("elsewhere");
        std::fs::create_dir_all(&target).unwrap();
        drop(open(&target, Durability::Normal).unwrap());
        let dir = root.path().join("world");
        std::fs::create_dir_all(dir.join("events")).unwrap();
        std::os::unix::fs::symlink(target.join("events/events.db"), dir.join("events/events.db")).unwrap();
        let (mut writer, _) = open(&dir, Durability::Normal).unwrap();
        commit_rows(&mut writer, "run_s", 0, 2);
        // SQLite keeps the WAL beside the real path too: its writeback is started there.
        #[cfg(target_os = "linux")]
        {
            let mut n = 2;
            while n < 1000 {
                commit_rows(&mut writer, "run_s", n, 100);
                n += 100;
            }
            let wal = &writer.checkpointer.as_ref().unwrap().wal;
            let started = wal.written_back.load(Ordering::Relaxed);
            assert!(started >= 3 << 20, "writeback was started for {started} bytes");
        }
    }
}
