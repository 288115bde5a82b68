//! The writer's WAL writes, gathered: a VFS over SQLite's default one that writes a commit's
//! frames to the WAL in a few large writes rather than two small ones per frame.
//!
//! SQLite writes each WAL frame with two `pwrite`s, its 24-byte header and then its page. A frame
//! is 24 bytes longer than a page, so each write lands across two pages of the file's cache and
//! the kernel's buffered-write path runs three times per frame. That path was a third of the
//! writer's time appending 64 KiB payloads; gathered into large writes, the same frames are
//! written in well under half the time.
//!
//! Only the writer's connection opens its WAL through this VFS, and only its WAL is wrapped:
//! every other file is the default VFS's own. Frames are gathered only while the writes follow
//! the WAL's format exactly, each frame header (24 bytes, at a frame's place) then its page,
//! appended one after another, and the gathered bytes are written as soon as a commit frame's
//! page is complete. SQLite publishes a commit (the wal-index header other connections read)
//! only after writing its commit frame, so no connection, and no recovery after a crash, can
//! meet a committed frame that is not in the file. Any other write (a page rewritten in place, a
//! header's checksum rewritten, a write of another size or place) first writes what is gathered
//! and then goes straight to the file, as do reads, syncs, truncations and size queries, which
//! write what is gathered first. A crash loses only gathered frames of a transaction that had
//! not committed, which SQLite's recovery would ignore anyway.

use rusqlite::ffi;
use std::ffi::{c_int, c_void, CStr};
use std::sync::OnceLock;

/// The VFS's name, for `sqlite3_open_v2`.
pub const NAME: &CStr = c"little-workflow-wal";

/// Gathered bytes are written once they reach this many (and at every commit).
const GATHER_MAX: usize = 1024 * 1024;

/// Bytes given to the default VFS per write: SQLite's unix VFS writes at most 128 KiB - 1 per
/// call (its own callers write a page at most, 64 KiB) and reports the rest as a full disk.
/// Writes of 124 KiB take as long per frame as writes of 1 MiB.
const WRITE_MAX: usize = 124 * 1024;

/// Bytes of a WAL header and of a frame header (SQLite's file format).
const WAL_HEADER: usize = 32;
const FRAME_HEADER: usize = 24;

/// Register the VFS (once per process); whether it is there to use. Must be called after any
/// `sqlite3_config`, since finding the default VFS initializes SQLite.
pub fn register() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find returns SQLite's default VFS, which lives as long as the
        // process; the copy made of it here is leaked, so it does too, as sqlite3_vfs_register
        // requires.
        unsafe {
            let base = ffi::sqlite3_vfs_find(std::ptr::null());
            if base.is_null() || (*base).xOpen.is_none() {
                return false;
            }
            let _ = BASE.set(Base(base));
            let mut vfs: ffi::sqlite3_vfs = std::ptr::read(base);
            vfs.zName = NAME.as_ptr();
            vfs.pNext = std::ptr::null_mut();
            vfs.szOsFile = (INNER_AT + (*base).szOsFile as usize) as c_int;
            vfs.xOpen = Some(x_open);
            // pAppData stays the default VFS's: its functions, copied above, read it.
            ffi::sqlite3_vfs_register(Box::leak(Box::new(vfs)), 0) == ffi::SQLITE_OK
        }
    })
}

/// The default VFS this one wraps.
struct Base(*mut ffi::sqlite3_vfs);
// SAFETY: a pointer to SQLite's registered default VFS, which never changes or goes away.
unsafe impl Send for Base {}
unsafe impl Sync for Base {}
static BASE: OnceLock<Base> = OnceLock::new();

/// A WAL file opened through this VFS: SQLite's file object, then (at `INNER_AT`) the default
/// VFS's own object for the same file.
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    gather: *mut Gather,
}

/// Where the default VFS's file object starts within ours.
const INNER_AT: usize = std::mem::size_of::<WalFile>().next_multiple_of(16);

/// What a WAL file of this VFS holds back, and what it knows of the WAL.
struct Gather {
    /// The gathered bytes, from file offset `start`.
    buf: Vec<u8>,
    start: i64,
    /// What the next write must be to be gathered too.
    next: Expect,
    /// The WAL's page size, from its header; `None` until known (and if it makes no sense).
    page: Option<usize>,
    /// Whether the WAL's header has been read for its page size since it was last written.
    looked: bool,
    /// The end of the furthest write since the WAL header was last written: frames appended
    /// there are new; writes before it rewrite frames already written.
    high: i64,
    /// Writes made to the file, for tests.
    #[cfg(test)]
    writes: u64,
}

/// The write that continues what is gathered.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Expect {
    /// Nothing is gathered.
    Nothing,
    /// The next frame's header, at the end of what is gathered.
    Header,
    /// The page of the frame whose header was gathered last, and whether that is a commit frame.
    Page { commit: bool },
}

impl Gather {
    /// Where what is gathered ends in the file.
    fn end(&self) -> i64 {
        self.start + self.buf.len() as i64
    }
}

/// Whether `offset` is where a frame starts, in a WAL of `page`-byte pages.
fn frame_at(offset: i64, page: usize) -> bool {
    offset >= WAL_HEADER as i64 && (offset - WAL_HEADER as i64) % (FRAME_HEADER + page) as i64 == 0
}

/// A page size SQLite could have written in a WAL header.
fn page_size(header: &[u8]) -> Option<usize> {
    let size = u32::from_be_bytes(header.get(8..12)?.try_into().ok()?) as usize;
    (size.is_power_of_two() && (512..=65536).contains(&size)).then_some(size)
}

/// Whether a frame header belongs to a commit frame (its "database size after commit" is set).
fn is_commit(header: &[u8]) -> bool {
    header[4..8] != [0, 0, 0, 0]
}

/// The default VFS's file object within ours.
///
/// # Safety
/// `file` must be a `WalFile` opened by `x_open`.
unsafe fn inner(file: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    (file as *mut u8).add(INNER_AT) as *mut ffi::sqlite3_file
}

/// The inner file's methods.
///
/// # Safety
/// As for [`inner`].
unsafe fn methods(file: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    &*(*inner(file)).pMethods
}

/// # Safety
/// As for [`inner`].
unsafe fn gather<'a>(file: *mut ffi::sqlite3_file) -> &'a mut Gather {
    &mut *(*(file as *mut WalFile)).gather
}

/// SQLite's xOpen for this VFS: a WAL is opened by the default VFS inside a `WalFile`, any other
/// file as the default VFS's own object.
///
/// SAFETY: SQLite calls it only through this VFS, so after `register` has set `BASE`, with `file`
/// pointing to `szOsFile` bytes it allocated (room for a `WalFile` and, at `INNER_AT`, the default
/// VFS's object) and keeps until the file is closed, and `name` and `out_flags` as the default
/// VFS's xOpen takes them. A WAL's `Gather` is boxed here and owned by the file until `x_close`.
unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let base = BASE.get().expect("registered").0;
    let open = (*base).xOpen.expect("checked at registration");
    if flags & ffi::SQLITE_OPEN_WAL == 0 {
        // Not a WAL: the default VFS's own file object, in the (larger) space SQLite gave us.
        return open(base, name, file, flags, out_flags);
    }
    let rc = open(base, name, inner(file), flags, out_flags);
    if rc != ffi::SQLITE_OK {
        // SQLite calls no method of a file whose open failed and left pMethods unset.
        (*file).pMethods = std::ptr::null();
        return rc;
    }
    (*(file as *mut WalFile)).gather = Box::into_raw(Box::new(Gather {
        buf: Vec::new(),
        start: 0,
        next: Expect::Nothing,
        page: None,
        looked: false,
        high: 0,
        #[cfg(test)]
        writes: 0,
    }));
    (*file).pMethods = &WAL_METHODS;
    ffi::SQLITE_OK
}

/// The methods of a WAL opened through this VFS.
///
/// SAFETY: the contract every `x_` method below relies on. SQLite calls them only with a file
/// `x_open` opened as a WAL and `x_close` has not yet closed, so `file` is a `WalFile` with a live
/// `Gather` and an open inner file. The file belongs to one connection, which one thread uses at
/// a time, so calls on it never overlap and nothing else holds its `Gather`.
/// Pointer arguments are valid for the call, as SQLite's own methods take them.
static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

/// Write `bytes` at `offset` to the file itself, in writes of at most `WRITE_MAX` bytes.
///
/// SAFETY: within an xMethod call on `file`, under the contract of [`WAL_METHODS`]; the caller
/// holds no reference from [`gather`] across the call.
unsafe fn write_through(file: *mut ffi::sqlite3_file, bytes: &[u8], offset: i64) -> c_int {
    let write = methods(file).xWrite.expect("the default VFS writes");
    for (i, piece) in bytes.chunks(WRITE_MAX).enumerate() {
        #[cfg(test)]
        {
            gather(file).writes += 1;
        }
        let at = offset + (i * WRITE_MAX) as i64;
        let rc = write(inner(file), piece.as_ptr() as *const c_void, piece.len() as c_int, at);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    ffi::SQLITE_OK
}

/// Write what is gathered. On failure it is dropped: the transaction it belonged to fails, and
/// SQLite writes its frames again, if at all, in a later one.
///
/// SAFETY: as for [`write_through`].
unsafe fn flush(file: *mut ffi::sqlite3_file) -> c_int {
    let g = gather(file);
    g.next = Expect::Nothing;
    if g.buf.is_empty() {
        return ffi::SQLITE_OK;
    }
    let bytes = std::mem::take(&mut g.buf);
    let rc = write_through(file, &bytes, g.start);
    let g = gather(file);
    g.buf = bytes;
    g.buf.clear();
    rc
}

/// The WAL's page size, read from its header if not yet known.
///
/// SAFETY: as for [`write_through`].
unsafe fn known_page(file: *mut ffi::sqlite3_file) -> Option<usize> {
    let g = gather(file);
    if g.page.is_some() || g.looked {
        return g.page;
    }
    g.looked = true;
    let mut header = [0u8; WAL_HEADER];
    let read = methods(file).xRead.expect("the default VFS reads");
    if read(inner(file), header.as_mut_ptr() as *mut c_void, WAL_HEADER as c_int, 0) != ffi::SQLITE_OK {
        return None;
    }
    let page = page_size(&header);
    gather(file).page = page;
    page
}

/// SAFETY: the contract of [`WAL_METHODS`]; `data`, when not null, holds `amount` bytes for the
/// call.
unsafe extern "C" fn x_write(file: *mut ffi::sqlite3_file, data: *const c_void, amount: c_int, offset: i64) -> c_int {
    if amount <= 0 || data.is_null() {
        // Never asked of a WAL; passed on as it came.
        let rc = flush(file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        return (methods(file).xWrite.expect("the default VFS writes"))(inner(file), data, amount, offset);
    }
    let bytes = std::slice::from_raw_parts(data as *const u8, amount as usize);
    let rc = write(file, bytes, offset);
    let g = gather(file);
    g.high = g.high.max(offset + bytes.len() as i64);
    rc
}

/// Gather `bytes` if they continue the WAL's format where they go; otherwise write what is
/// gathered and then them.
///
/// SAFETY: as for [`write_through`]; `bytes` are the caller's, not what is gathered.
unsafe fn write(file: *mut ffi::sqlite3_file, bytes: &[u8], offset: i64) -> c_int {
    // Read from the WAL's header (once) only for what may be a frame header.
    let page = if bytes.len() == FRAME_HEADER {
        known_page(file)
    } else {
        None
    };
    let g = gather(file);
    let gathered = !g.buf.is_empty();
    let contiguous = gathered && offset == g.end();
    // What must follow this write for it to be gathered, if it may be.
    let then = if offset == 0 && bytes.len() == WAL_HEADER {
        // A new WAL header: the WAL starts over (or begins), and says its page size.
        g.page = page_size(bytes);
        g.looked = true;
        g.high = 0;
        g.page.map(|_| Expect::Header)
    } else if bytes.len() == FRAME_HEADER
        && (if gathered {
            contiguous && g.next == Expect::Header
        } else {
            offset >= g.high
        })
        && page.is_some_and(|page| frame_at(offset, page))
    {
        // A frame header: a frame appended after what is gathered, or after everything written
        // (one rewritten, to correct its checksum, lies before that and goes to the file).
        Some(Expect::Page {
            commit: is_commit(bytes),
        })
    } else if contiguous && matches!(g.next, Expect::Page { .. }) && Some(bytes.len()) == g.page {
        Some(Expect::Header)
    } else {
        None
    };
    let Some(then) = then else {
        let rc = flush(file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        return write_through(file, bytes, offset);
    };
    if gathered && !contiguous {
        // Only a new WAL header starts afresh while something is gathered.
        let rc = flush(file);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    let g = gather(file);
    let commit_written = matches!(g.next, Expect::Page { commit: true }) && then == Expect::Header;
    if g.buf.is_empty() {
        g.start = offset;
    }
    g.buf.extend_from_slice(bytes);
    g.next = then;
    // A commit frame's page completes the commit: it goes to the file now, before SQLite can
    // publish the commit. Past the limit, what is gathered goes at the end of a frame.
    if commit_written || (then == Expect::Header && g.buf.len() >= GATHER_MAX) {
        return flush(file);
    }
    ffi::SQLITE_OK
}

/// SAFETY: the contract of [`WAL_METHODS`]; SQLite closes a file once and calls none of its
/// methods after, so the `Gather` freed here is never reached again.
unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let flushed = flush(file);
    let rc = (methods(file).xClose.expect("the default VFS closes"))(inner(file));
    drop(Box::from_raw((*(file as *mut WalFile)).gather));
    (*file).pMethods = std::ptr::null();
    if flushed != ffi::SQLITE_OK {
        flushed
    } else {
        rc
    }
}

/// SAFETY: the contract of [`WAL_METHODS`]; `data` has room for `amount` bytes for the call.
unsafe extern "C" fn x_read(file: *mut ffi::sqlite3_file, data: *mut c_void, amount: c_int, offset: i64) -> c_int {
    let rc = flush(file);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    (methods(file).xRead.expect("the default VFS reads"))(inner(file), data, amount, offset)
}

/// SAFETY: the contract of [`WAL_METHODS`].
unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: i64) -> c_int {
    let rc = flush(file);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let g = gather(file);
    g.high = g.high.min(size);
    (methods(file).xTruncate.expect("the default VFS truncates"))(inner(file), size)
}

/// SAFETY: the contract of [`WAL_METHODS`].
unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    let rc = flush(file);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    (methods(file).xSync.expect("the default VFS syncs"))(inner(file), flags)
}

/// SAFETY: the contract of [`WAL_METHODS`]; `size` is writable for the call.
unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, size: *mut i64) -> c_int {
    let rc = flush(file);
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    (methods(file).xFileSize.expect("the default VFS sizes"))(inner(file), size)
}

/// SAFETY: the contract of [`WAL_METHODS`].
unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    (methods(file).xLock.expect("the default VFS locks"))(inner(file), level)
}

/// SAFETY: the contract of [`WAL_METHODS`].
unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    (methods(file).xUnlock.expect("the default VFS unlocks"))(inner(file), level)
}

/// SAFETY: the contract of [`WAL_METHODS`]; `out` is writable for the call.
unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    (methods(file).xCheckReservedLock.expect("the default VFS checks locks"))(inner(file), out)
}

/// SAFETY: the contract of [`WAL_METHODS`]; `arg` is what `op` takes, passed on to the default
/// VFS as given.
unsafe extern "C" fn x_file_control(file: *mut ffi::sqlite3_file, op: c_int, arg: *mut c_void) -> c_int {
    (methods(file).xFileControl.expect("the default VFS has file controls"))(inner(file), op, arg)
}

/// SAFETY: the contract of [`WAL_METHODS`].
unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    (methods(file).xSectorSize.expect("the default VFS has a sector size"))(inner(file))
}

/// SAFETY: the contract of [`WAL_METHODS`].
unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    (methods(file)
        .xDeviceCharacteristics
        .expect("the default VFS has characteristics"))(inner(file))
}

/// `conn`'s WAL file object (open once it has read in WAL mode), or null. The connection keeps
/// it open while it lives.
#[cfg(test)]
fn wal_file(conn: &rusqlite::Connection) -> *mut ffi::sqlite3_file {
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: SQLITE_FCNTL_JOURNAL_POINTER stores the connection's journal (here WAL) file object
    // into `file`, or leaves it null.
    unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_JOURNAL_POINTER,
            &mut file as *mut _ as *mut c_void,
        );
    }
    file
}

/// Whether `conn`'s WAL is written through this VFS.
#[cfg(test)]
pub fn gathers(conn: &rusqlite::Connection) -> bool {
    let file = wal_file(conn);
    // SAFETY: a file object the connection holds open; only its methods pointer is read.
    !file.is_null() && std::ptr::eq(unsafe { (*file).pMethods }, &WAL_METHODS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};
    use std::path::Path;

    const PAGE: usize = 4096;

    /// A connection to `path` through this VFS, in WAL mode at `synchronous`.
    fn gathering(path: &Path, synchronous: &str) -> Connection {
        assert!(register());
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let conn = Connection::open_with_flags_and_vfs(path, flags, NAME).unwrap();
        conn.execute_batch(&format!(
            "PRAGMA page_size = {PAGE}; PRAGMA journal_mode = WAL; PRAGMA synchronous = {synchronous};
             PRAGMA wal_autocheckpoint = 0;
             CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT NOT NULL);"
        ))
        .unwrap();
        conn
    }

    /// The WAL's file object of `conn`, and what it has written so far.
    fn wal_writes(conn: &Connection) -> (u64, bool) {
        assert!(gathers(conn), "the WAL is gathered");
        // SAFETY: the connection's WAL, opened by this VFS and held open while `conn` lives.
        let g = unsafe { gather(wal_file(conn)) };
        (g.writes, g.buf.is_empty())
    }

    fn insert(conn: &Connection, from: i64, rows: i64, fill: char) {
        let v = fill.to_string().repeat(3000);
        let mut s = conn
            .prepare_cached("INSERT OR REPLACE INTO t (k, v) VALUES (?1, ?2)")
            .unwrap();
        for k in from..from + rows {
            s.execute(rusqlite::params![k, format!("{k}:{v}")]).unwrap();
        }
    }

    /// What a crash right now would leave recovered: the database and its WAL copied elsewhere
    /// (without the wal-index), opened, so that SQLite rebuilds the index from the WAL's frames
    /// and keeps only those of commits whose checksums hold; its rows, checked whole.
    fn recovered(path: &Path) -> Vec<(i64, String)> {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("copy.db");
        std::fs::copy(path, &copy).unwrap();
        let wal = path.with_extension("db-wal");
        if wal.exists() {
            std::fs::copy(&wal, copy.with_extension("db-wal")).unwrap();
        }
        let conn = Connection::open(&copy).unwrap();
        let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        assert_eq!(check, "ok");
        let mut s = conn.prepare("SELECT k, v FROM t ORDER BY k").unwrap();
        let rows = s.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        rows.map(|r| r.unwrap()).collect()
    }

    /// The rows `recovered` should find: key `k` holding `fill` repeated, as `insert` writes it.
    fn expected(rows: impl IntoIterator<Item = (i64, char)>) -> Vec<(i64, String)> {
        rows.into_iter()
            .map(|(k, c)| (k, format!("{k}:{}", c.to_string().repeat(3000))))
            .collect()
    }

    #[test]
    fn a_commits_frames_go_to_the_wal_in_a_few_writes_and_before_the_commit_returns() {
        for synchronous in ["NORMAL", "FULL"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.db");
            let conn = gathering(&path, synchronous);
            let (before, _) = wal_writes(&conn);
            conn.execute_batch("BEGIN").unwrap();
            insert(&conn, 1, 200, 'a');
            conn.execute_batch("COMMIT").unwrap();
            let (after, empty) = wal_writes(&conn);
            assert!(empty, "{synchronous}: nothing is left gathered after a commit");
            // 200 rows of ~3 KB: at least 150 frames of 4,120 bytes, written as SQLite writes
            // them in 300 or more writes; gathered, in pieces of 124 KiB.
            let frames = (std::fs::metadata(path.with_extension("db-wal")).unwrap().len() as usize - 32) / (PAGE + 24);
            assert!(frames >= 150, "{frames} frames");
            let most = (frames * (PAGE + 24)).div_ceil(WRITE_MAX) as u64 + 2;
            assert!(
                after - before <= most,
                "{synchronous}: {} writes for {frames} frames",
                after - before
            );
            // Everything committed is in the file: a crash now would keep it.
            assert_eq!(recovered(&path), expected((1..=200).map(|k| (k, 'a'))));
        }
    }

    #[test]
    fn spills_rollbacks_rewritten_pages_and_a_wal_started_over_all_recover_as_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let conn = gathering(&path, "NORMAL");
        // A small page cache spills a transaction's pages to the WAL before it commits, and a
        // page changed again after it spilled is rewritten in place (its frame's checksum too).
        conn.execute_batch("PRAGMA cache_size = 10").unwrap();
        let mut want: std::collections::BTreeMap<i64, char> = Default::default();

        conn.execute_batch("BEGIN").unwrap();
        insert(&conn, 1, 100, 'a');
        insert(&conn, 1, 100, 'b');
        conn.execute_batch("COMMIT").unwrap();
        want.extend((1..=100).map(|k| (k, 'b')));
        assert_eq!(recovered(&path), expected(want.clone()));

        // A transaction that spilled and then rolled back leaves only what was committed.
        conn.execute_batch("BEGIN").unwrap();
        insert(&conn, 50, 200, 'x');
        conn.execute_batch("ROLLBACK").unwrap();
        assert_eq!(recovered(&path), expected(want.clone()));

        // A savepoint rolled back inside a committed transaction.
        conn.execute_batch("BEGIN").unwrap();
        insert(&conn, 101, 30, 'c');
        conn.execute_batch("SAVEPOINT s").unwrap();
        insert(&conn, 131, 100, 'y');
        conn.execute_batch("ROLLBACK TO s; RELEASE s").unwrap();
        insert(&conn, 10, 5, 'd');
        conn.execute_batch("COMMIT").unwrap();
        want.extend((101..=130).map(|k| (k, 'c')));
        want.extend((10..=14).map(|k| (k, 'd')));
        assert_eq!(recovered(&path), expected(want.clone()));
        assert!(wal_writes(&conn).1);

        // Once everything is checkpointed, the next commit starts the WAL over from its header.
        let wal = path.with_extension("db-wal");
        let long = std::fs::metadata(&wal).unwrap().len();
        conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .unwrap();
        insert(&conn, 200, 3, 'e');
        want.extend((200..=202).map(|k| (k, 'e')));
        assert_eq!(
            std::fs::metadata(&wal).unwrap().len(),
            long,
            "the WAL was written over, not grown"
        );
        assert_eq!(recovered(&path), expected(want.clone()));

        // Another connection sees each commit as it returns.
        let other = Connection::open(&path).unwrap();
        for k in 300..320 {
            insert(&conn, k, 1, 'f');
            let v: String = other
                .query_row("SELECT v FROM t WHERE k = ?1", [k], |r| r.get(0))
                .unwrap();
            assert_eq!(v, format!("{k}:{}", "f".repeat(3000)));
        }
    }

    #[test]
    fn writes_that_do_not_follow_the_wal_format_go_straight_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let conn = gathering(&path, "NORMAL");
        insert(&conn, 1, 1, 'a');
        assert!(gathers(&conn));
        let file = wal_file(&conn);
        // SAFETY: the connection's WAL, opened by this VFS; the writes below go through its own
        // methods, past the end of every frame SQLite wrote (which it never reads without a
        // commit of its own).
        unsafe {
            let end = std::fs::metadata(path.with_extension("db-wal")).unwrap().len() as i64;
            let write =
                |bytes: &[u8], at: i64| x_write(file, bytes.as_ptr() as *const c_void, bytes.len() as c_int, at);
            // A frame header then a page: gathered.
            let mut header = [0u8; FRAME_HEADER];
            header[3] = 2;
            assert_eq!(write(&header, end), ffi::SQLITE_OK);
            assert_eq!(gather(file).buf.len(), FRAME_HEADER);
            assert_eq!(write(&[7u8; PAGE], end + FRAME_HEADER as i64), ffi::SQLITE_OK);
            assert_eq!(
                gather(file).buf.len(),
                FRAME_HEADER + PAGE,
                "a frame that does not commit stays gathered"
            );
            // A write of another size, where the next header would go: what was gathered is
            // written, and so is it.
            assert_eq!(write(&[9u8; 100], end + (FRAME_HEADER + PAGE) as i64), ffi::SQLITE_OK);
            assert!(gather(file).buf.is_empty());
            let on_disk = std::fs::read(path.with_extension("db-wal")).unwrap();
            assert_eq!(on_disk.len() as i64, end + (FRAME_HEADER + PAGE) as i64 + 100);
            assert_eq!(on_disk[end as usize + FRAME_HEADER], 7);
            // A header that is not at a frame's place is not gathered either.
            assert_eq!(write(&header, end + 1), ffi::SQLITE_OK);
            assert!(gather(file).buf.is_empty());
            // A commit frame is written as soon as its page is.
            let at = end + 2 * (FRAME_HEADER + PAGE) as i64;
            header[7] = 3;
            assert_eq!(write(&header, at), ffi::SQLITE_OK);
            assert_eq!(write(&[5u8; PAGE], at + FRAME_HEADER as i64), ffi::SQLITE_OK);
            assert!(gather(file).buf.is_empty());
            assert_eq!(
                std::fs::read(path.with_extension("db-wal")).unwrap()[at as usize + FRAME_HEADER],
                5
            );
        }
    }
}
