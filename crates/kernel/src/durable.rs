//! Writing files that survive a crash: temporary files renamed (or linked) into place, directories
//! created and synced, and the cleanup of the temporary files a crashed writer left.

use crate::error::{Result, WorldError};
use crate::{files, process};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A temporary file name that says which process writes it, unique within the process
/// (`<stem>.<pid>.<counter>-<nanos>-flock.tmp`). The `flock` part says its writer holds an
/// `flock` on it (see [`TmpFile`]). Earlier versions named theirs without it, and find the pid
/// where they look for it (the second part from the end), so they judge these files by pid as
/// they judge their own, and never take a live writer's file for a leftover.
fn tmp_name(stem: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{stem}.{}.{n}-{nanos}-flock.tmp", std::process::id())
}

/// A temporary file this process is writing, to be renamed (or linked) into place. Its writer
/// holds an `flock` on it from its creation until the `TmpFile` is dropped, after the rename, so
/// a world opening meanwhile, in any process and any pid namespace, tells it from the leftover of
/// a writer that is gone ([`remove_stale_tmp`]). A pid in the name could not: pids mean nothing
/// across namespaces, and a restarted container often gets its old one back.
pub struct TmpFile {
    pub path: PathBuf,
    file: File,
}

impl TmpFile {
    /// A new, empty, locked file in `dir` named after `stem`.
    fn create(dir: &Path, stem: &str) -> Result<TmpFile> {
        // A cleanup may take the new file for a leftover before it is locked: it then holds the
        // lock or has removed the file, and a fresh name is tried. Bounded, so a file system that
        // says odd things about the files in it cannot spin this forever.
        for _ in 0..16 {
            let path = dir.join(tmp_name(stem));
            let file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| WorldError::io("creating a temporary file", Some(path.clone()), e))?;
            match process::try_lock(&file) {
                // Still at its name: a cleanup may have removed it meanwhile.
                Some(true) if files::names(&file, &path) => return Ok(TmpFile { path, file }),
                Some(_) => continue,
                // No flock on this file system: a cleanup goes by the pid in the name.
                None => return Ok(TmpFile { path, file }),
            }
        }
        Err(WorldError::io(
            "creating a temporary file",
            Some(dir.to_path_buf()),
            std::io::Error::other("another process kept removing it"),
        ))
    }

    /// A new locked file in `dir` holding `bytes`, fsynced. Removed again if writing fails.
    pub fn write_synced(dir: &Path, stem: &str, bytes: &[u8]) -> Result<TmpFile> {
        let mut tmp = TmpFile::create(dir, stem)?;
        let io = |e| WorldError::io("writing a file", Some(tmp.path.clone()), e);
        let written = tmp.file.write_all(bytes).and_then(|()| tmp.file.sync_all()).map_err(io);
        tmp.or_remove(written)
    }

    /// `self` if `result` is `Ok`; otherwise remove the file and return the error.
    fn or_remove(self, result: Result<()>) -> Result<TmpFile> {
        match result {
            Ok(()) => Ok(self),
            Err(e) => {
                let _ = fs::remove_file(&self.path);
                Err(e)
            }
        }
    }
}

/// Remove the `*.tmp` files in `dir` whose writers are gone: a [`TmpFile`] once no process holds
/// its lock (removed while this one holds it, so no writer can take it up meanwhile), one an
/// earlier version wrote (or one on a file system without `flock`) once no process has the pid
/// in its name.
pub fn remove_stale_tmp(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        // Only a regular file can be one of the world's own (its type as the directory lists it,
        // a symbolic link not followed): anything else is left alone, and never opened.
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".tmp") else {
            continue;
        };
        let path = entry.path();
        let pid_gone = || {
            let pid = stem.rsplit('.').nth(1).and_then(|p| p.parse::<u32>().ok());
            pid.is_none_or(|p| !process::alive(p))
        };
        // A TmpFile's lock, taken here, is held while the file is removed, so that no writer can
        // take the file up meanwhile.
        let mut held = None;
        let gone = if stem.ends_with("-flock") {
            let Ok(file) = files::open_own(&path, false, false) else {
                continue;
            };
            process::try_lock(held.insert(file)).unwrap_or_else(pid_gone)
        } else {
            pid_gone()
        };
        if gone {
            let _ = fs::remove_file(&path);
        }
    }
}

/// Create `dir` and any missing parents, fsyncing each parent a directory was created in, so the
/// new directories themselves survive a crash (not only what is later written into them).
/// `what` names the directory in an error.
pub fn create_dir_synced(dir: &Path, what: &str) -> Result<()> {
    let io = |e| WorldError::io(format!("creating {what}"), Some(dir.to_path_buf()), e);
    // The missing directories (none when `dir` exists), deepest first.
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty() && !d.is_dir()) {
        missing.push(d);
        at = d.parent();
    }
    for d in missing.into_iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {
                if let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
                    sync_dir(parent)?;
                }
            }
            // Another process (or world) made it meanwhile; it syncs its parent.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(WorldError::Path {
                    message: format!(
                        "cannot create {what} {}: {} is not a directory",
                        dir.display(),
                        d.display()
                    ),
                })
            }
            Err(e) => return Err(io(e)),
        }
    }
    Ok(())
}

/// fsync a directory, so the names just renamed or linked into it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_DIRECTORY: whatever else is at the path is refused without being opened for real.
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NONBLOCK)
            .open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| WorldError::io("syncing a directory", Some(dir.to_path_buf()), e))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}
