//! Opening a connection to the store: for writing, for reading, or, where the directory cannot be
//! written, reading the database file alone.

use super::files::beside;
use crate::error::{Result, WorldError};
use rusqlite::{Connection, OpenFlags};
use std::path::Path;
use std::time::Duration;

/// How long a connection waits for another process's write lock before failing.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Put the database in WAL mode (a no-op when it already is). Switching a fresh database needs an
/// exclusive lock, and SQLite reports a concurrent opener's lock as busy at once rather than
/// through the busy handler, so the switch is retried for as long as the busy timeout.
pub(super) fn enable_wal(conn: &Connection) -> Result<String> {
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
pub(super) fn cannot_write(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)
    )
}

/// Whether a connection may write (and create the database), or only read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
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
pub(super) fn read_only_access(db: &Path) -> Access {
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
pub(super) fn file_uri(path: &Path, query: &str) -> String {
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

pub(super) fn connect(path: &Path, access: Access) -> Result<Connection> {
    connect_as(path, access, false)
}

/// Open a connection; `writer`: the world's writer, whose WAL writes are gathered (see
/// [`super::wal_vfs`]) where that VFS could be registered.
pub(super) fn connect_as(path: &Path, access: Access, writer: bool) -> Result<Connection> {
    // SQLite would open a FIFO where one of its files belongs, and wait on it for ever. It keeps
    // the -wal and -shm beside the database's real path.
    let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    for file in [path.to_path_buf(), beside(&real, "-wal"), beside(&real, "-shm")] {
        crate::files::regular_or_absent(&file).map_err(|why| match why {
            crate::files::Unreadable::Io(e) => WorldError::io("opening the event store", Some(file.clone()), e),
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

/// `err`, naming the database file of `conn` and, for an I/O failure, what the operating system
/// said (SQLite reports only "disk I/O error").
pub(super) fn on(conn: &Connection, err: WorldError) -> WorldError {
    match conn.path() {
        Some(p) if !p.is_empty() => err.in_database(Path::new(p), Some(conn)),
        _ => err,
    }
}
