//! The store's files as the world opened them, and the paths SQLite can open.

use crate::core::error::{Result, WorldError};
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

/// The identity (device, inode) of the file at `path`, read without opening it.
pub(super) fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    std::fs::metadata(path).map(|m| crate::core::files::identity(&m))
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
