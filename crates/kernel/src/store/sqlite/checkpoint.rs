//! At durability `normal`, the thread that checkpoints the WAL beside the writer, the writeback
//! that starts the WAL's frames on their way to the disk, and reading the wal-index.

use super::connect::{connect, Access};
use super::files::beside;
use crate::error::{Result, WorldError};
use rusqlite::Connection;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// WAL pages not yet checkpointed at which the checkpoint thread is woken after a commit
/// (SQLite's automatic checkpoint runs at the same size, inside the commit).
pub(super) const CHECKPOINT_AT: i32 = 1000;

/// WAL pages after a commit past which the writer checkpoints inside the commit after all, as
/// SQLite would: the checkpoint thread cannot let the WAL start over while commits keep coming,
/// so this bounds the WAL (about 32 MiB of 4 KiB pages).
pub(super) const CHECKPOINT_INLINE_AT: i32 = 8000;

/// At durability `normal`, the thread that checkpoints the WAL with a connection of its own.
///
/// A checkpoint fsyncs the WAL, copies its pages into the database and fsyncs that; run inside
/// a commit, as SQLite's automatic checkpoint does, it stalls every append queued behind it for
/// those fsyncs (at `normal` they are the only ones). Run beside the writer, the fsyncs overlap
/// the next commits. At `full` every commit fsyncs anyway, and a second thread fsyncing beside it
/// made group commits slower, so `full` keeps SQLite's automatic checkpoint.
pub(super) struct Checkpointer {
    pub(super) wal: Arc<WalState>,
    pub(super) wake: crossbeam_channel::Sender<()>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

/// What the writer, its WAL hook and the checkpoint thread know of the WAL.
#[derive(Default)]
pub(super) struct WalState {
    /// The WAL's size in pages after the writer's last commit (what the WAL hook was told).
    pub(super) pages: AtomicI32,
    /// How far into the WAL the last checkpoint got, in pages; 0 once the WAL has started over.
    pub(super) checkpointed: AtomicI32,
    /// How many times the writer has seen the WAL start over: a checkpoint that began before the
    /// latest does not say how far into the new one it got.
    pub(super) restarts: AtomicU32,
    /// Held while a checkpoint runs.
    pub(super) running: Mutex<()>,
    /// Set while a transaction is committed now: its commit never checkpoints inside itself.
    pub(super) now: AtomicBool,
    /// WAL bytes whose writeback the writer has started (see [`Writeback`]).
    pub(super) written_back: AtomicU64,
}

impl WalState {
    /// Pages of the WAL not yet checkpointed, as far as the writer knows.
    pub(super) fn pending(&self) -> i32 {
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

    pub(super) fn running(&self) -> std::sync::MutexGuard<'_, ()> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Checkpointer {
    pub(super) fn start(writer: &mut Connection, path: &Path) -> Result<Checkpointer> {
        let conn = connect(path, Access::ReadWrite)?;
        let (wake, woken) = crossbeam_channel::bounded::<()>(1);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let wal = Arc::new(WalState::default());
        let state = wal.clone();
        let thread = crate::runtime::start_thread("little-world-ckpt", move || {
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
        let memory_page = crate::bytes::memory_page().unwrap_or(4096) as i64;
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

/// WAL bytes written since writeback was last started past which the writer starts it again.
pub(super) const WRITEBACK_EVERY: i64 = 1024 * 1024;

/// Starts the kernel writing the WAL's new frames to the disk as commits add them, without waiting
/// for it (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`, on Linux). At `normal` a commit does
/// not sync, so the frames would sit in the page cache until a checkpoint's fsync, which would
/// then write them all while the checkpoint (or the writer, checkpointing inside its commit)
/// waits. Started as they come, most are on the disk by then. It changes nothing of what is
/// durable when: only the fsyncs SQLite runs make anything durable.
pub(super) struct Writeback {
    pub(super) wal: std::path::PathBuf,
    pub(super) file: Option<std::fs::File>,
    pub(super) page_size: i64,
    /// The system's memory page: writeback is started up to a page boundary only, so that a page
    /// the next frame will write into is not written out half-filled (and, where the disk wants
    /// pages held still while they are written, the next commit does not wait for it).
    pub(super) memory_page: i64,
    /// How many times the WAL had started over when writeback was last considered.
    pub(super) restarts: u32,
    /// How far into the WAL (in bytes) writeback has been started.
    pub(super) started: i64,
}

impl Writeback {
    pub(super) fn new(wal: std::path::PathBuf, page_size: i64, memory_page: i64) -> Writeback {
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
    pub(super) fn end_of(&self, frames: i64) -> i64 {
        32 + frames * (24 + self.page_size)
    }

    /// A commit left the WAL `frames` frames long, the WAL having started over `restarts` times
    /// (see [`WalState::restarts`]): the byte range (offset, length) whose writeback to start
    /// now, if [`WRITEBACK_EVERY`] bytes have been added since it was last started. The WAL
    /// starting over starts the count over.
    pub(super) fn due(&mut self, frames: i64, restarts: u32) -> Option<(i64, i64)> {
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
    pub(super) fn committed(&mut self, frames: i64, restarts: u32) -> i64 {
        let Some((offset, len)) = self.due(frames, restarts) else {
            return 0;
        };
        #[cfg(target_os = "linux")]
        {
            if self.file.is_none() {
                self.file = crate::files::open_own(&self.wal, false, false).ok();
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

/// The wal-index's pages, as SQLite maps them (`WALINDEX_PGSZ`).
pub(super) const WAL_INDEX_PAGE: std::ffi::c_int = 32 * 1024;

/// The WAL's size in frames and how many of them are checkpointed, read from the wal-index that
/// SQLite has mapped for `conn` (the `-shm`, whose layout SQLite documents in "WAL-mode File
/// Format": the header's `mxFrame` at byte 16, the checkpoint information's `nBackfill` at byte
/// 96, native-endian). Reached through the database file's own `xShmMap`: a descriptor of our own
/// on the `-shm` would drop SQLite's POSIX locks on it when closed. `None` where it cannot be read.
pub(super) fn wal_index(conn: &Connection) -> Option<(u32, u32)> {
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
