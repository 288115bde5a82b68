//! The store's files as the world opened them, and the paths SQLite can open.

use crate::error::{Result, WorldError};
use std::path::{Path, PathBuf};

/// A file of the event store as the world opened it: its real path, and its identity then. Taken
/// by path, with no descriptor of its own: closing one would drop every POSIX lock this process
/// holds on the file, other connections' too.
#[derive(Debug, Clone)]
pub(super) struct OpenedFile {
    pub(super) path: PathBuf,
    pub(super) id: (u64, u64),
}

impl OpenedFile {
    /// The file now at `path`, resolved.
    pub(super) fn at(path: &Path) -> Result<OpenedFile> {
        let real = path
            .canonicalize()
            .map_err(|e| WorldError::io("resolving", Some(path.to_path_buf()), e))?;
        let id = file_id(&real).map_err(|e| WorldError::io("opening", Some(real.clone()), e))?;
        Ok(OpenedFile { path: real, id })
    }

    /// Refuse `doing` once the file at the path is gone or another (deleted and made again, or
    /// moved): the world would act on a store no path leads to, or on one it does not own.
    /// `consequence` follows the "deleted" in the message. One `stat`.
    pub(super) fn check(&self, doing: &str, consequence: &str) -> Result<()> {
        match file_id(&self.path) {
            Ok(now) if now == self.id => Ok(()),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(WorldError::io("checking the event store", Some(self.path.clone()), e))
            }
            _ => Err(self.damaged(doing, consequence)),
        }
    }

    /// Whether the file at the path is still this one.
    pub(super) fn is_unchanged(&self) -> bool {
        matches!(file_id(&self.path), Ok(id) if id == self.id)
    }

    /// The error [`OpenedFile::check`] gives once the file is gone or another.
    pub(super) fn damaged(&self, doing: &str, consequence: &str) -> WorldError {
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

/// The index of the `-wal` in [`StoreFiles::files`], after the database and its `-shm`.
pub(super) const WAL: usize = 2;

/// The store's files as the world opened them, shared by its writer and its readers: the
/// database, and for a writable world its `-shm` and `-wal`. Each look at them tells whether one
/// has been deleted or replaced since.
///
/// The database is looked at with `stat` each time, which also finds the data directory moved
/// away. The `-shm` and `-wal` are too where nothing better can be had, but on Linux their
/// directory is watched instead (inotify), and they are looked at only once the watch has seen
/// one of their names deleted, moved or made, or lost count: a `stat` of a file just fsynced
/// waits for the file system's journal, twenty times as long as one of a file at rest, which
/// took a quarter of the rate of appends awaited one by one.
pub(super) struct StoreFiles {
    pub(super) files: Vec<OpenedFile>,
    watch: std::sync::Mutex<Option<DirWatch>>,
    /// Set once the watch has seen something of the `-shm` or `-wal`: both are looked at every
    /// time from then on.
    suspect: std::sync::atomic::AtomicBool,
}

impl StoreFiles {
    /// The files `files` (the database first), watching the directory of those after it.
    pub(super) fn new(files: Vec<OpenedFile>) -> StoreFiles {
        let watched: Vec<&Path> = files.iter().skip(1).map(|f| f.path.as_path()).collect();
        let watch = DirWatch::new(&watched);
        StoreFiles {
            files,
            watch: std::sync::Mutex::new(watch),
            suspect: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The index in [`StoreFiles::files`] of the first file found deleted or replaced.
    pub(super) fn changed(&self) -> Option<usize> {
        if !self.files.first()?.is_unchanged() {
            return Some(0);
        }
        if self.files.len() > 1 && self.may_have_changed() {
            return (1..self.files.len()).find(|&i| !self.files[i].is_unchanged());
        }
        None
    }

    /// Refuse `doing` once a file is gone or another (see [`OpenedFile::check`]).
    pub(super) fn check(&self, doing: &str, consequence: &str) -> Result<()> {
        match self.changed() {
            None => Ok(()),
            Some(i) => self.files[i]
                .check(doing, consequence)
                .and(Err(self.files[i].damaged(doing, consequence))),
        }
    }

    /// Whether the watched files may have changed: the watch saw something of them, now or
    /// before, or there is no watch.
    fn may_have_changed(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.suspect.load(Ordering::Acquire) {
            return true;
        }
        let saw = match self.watch.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(watch) => watch.saw_change(),
            None => true,
        };
        if saw {
            self.suspect.store(true, Ordering::Release);
        }
        saw
    }

    /// Let go of the watch's descriptor: the world has closed. The files are looked at with
    /// `stat` from then on.
    pub(super) fn close(&self) {
        drop(self.watch.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// A watch on the directory of some files, for their names being deleted, moved away, moved onto
/// or made, and for the directory itself going.
#[cfg(target_os = "linux")]
struct DirWatch {
    fd: std::os::fd::OwnedFd,
    names: Vec<std::ffi::OsString>,
}

#[cfg(target_os = "linux")]
impl DirWatch {
    /// Watch the directory of `files`, which all have the same one; `None` where inotify cannot
    /// (out of instances, say), or for no files.
    fn new(files: &[&Path]) -> Option<DirWatch> {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        let dir = files.first()?.parent()?;
        if files.iter().any(|f| f.parent() != Some(dir)) {
            return None;
        }
        let names = files
            .iter()
            .map(|f| f.file_name().map(|n| n.to_os_string()))
            .collect::<Option<Vec<_>>>()?;
        let dir = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: inotify_init1 takes no pointers; a descriptor it returns is new, and owned here.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` was just returned by inotify_init1 and is owned by nothing else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let mask = libc::IN_DELETE
            | libc::IN_MOVED_FROM
            | libc::IN_MOVED_TO
            | libc::IN_CREATE
            | libc::IN_DELETE_SELF
            | libc::IN_MOVE_SELF
            | libc::IN_ONLYDIR;
        use std::os::fd::AsRawFd;
        // SAFETY: `dir` is NUL-terminated and outlives the call; `fd` is an inotify descriptor.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), dir.as_ptr(), mask) };
        (wd >= 0).then_some(DirWatch { fd, names })
    }

    /// Read every event queued: whether one names a watched file, is of the directory itself, or
    /// says events were lost. An error reading counts as having seen one.
    fn saw_change(&mut self) -> bool {
        use std::os::fd::AsRawFd;
        use std::os::unix::ffi::OsStrExt;
        const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
        let mut buf = [0u8; 4096];
        let mut seen = false;
        loop {
            // SAFETY: read(2) writes at most `buf.len()` bytes into `buf`.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                match err.kind() {
                    std::io::ErrorKind::Interrupted => continue,
                    std::io::ErrorKind::WouldBlock => return seen,
                    _ => return true,
                }
            }
            let n = n as usize;
            if n == 0 {
                return seen;
            }
            let mut at = 0;
            while at + HEADER <= n {
                // SAFETY: the kernel writes whole events, a header and then `len` bytes of name;
                // `at` is at a header's start, inside what was read. Read unaligned, since `buf`
                // has no alignment of its own.
                let event = unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast::<libc::inotify_event>()) };
                let name = &buf[(at + HEADER).min(n)..(at + HEADER + event.len as usize).min(n)];
                let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
                let of_dir = libc::IN_Q_OVERFLOW | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED;
                if event.mask & of_dir != 0 || self.names.iter().any(|n| n.as_bytes() == name) {
                    seen = true;
                }
                at += HEADER + event.len as usize;
            }
        }
    }
}

/// Elsewhere there is no watch: the files are looked at every time.
#[cfg(not(target_os = "linux"))]
struct DirWatch;

#[cfg(not(target_os = "linux"))]
impl DirWatch {
    fn new(_files: &[&Path]) -> Option<DirWatch> {
        None
    }

    fn saw_change(&mut self) -> bool {
        true
    }
}

/// The identity (device, inode) of the file at `path`, read without opening it.
pub(super) fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| crate::files::identity(&m))
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
pub(super) const MAX_DATABASE_PATH: usize = 512 - "-journal".len();

/// Refuse a database path SQLite cannot open for its length, saying so (SQLite says only "unable
/// to open database file"), before any directory is created for it.
pub(super) fn check_path_length(path: &Path) -> Result<()> {
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

/// The path of a file SQLite keeps beside the database (its `-wal` or `-shm`): the database's
/// real path (the target of a symlinked database), with `suffix` appended.
pub(super) fn beside(real_db: &Path, suffix: &str) -> PathBuf {
    let mut p = real_db.as_os_str().to_owned();
    p.push(suffix);
    p.into()
}
