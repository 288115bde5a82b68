//! Whether the process behind a record is still there: by its pid, or better, by a file lock it
//! holds for as long as it lives.
//!
//! A pid alone cannot tell. Pids are reused, and a container restarted on the same data directory
//! often gets its old pid back (node as pid 1): the locks its previous run held then looked held
//! by a live process, itself. And a pid means nothing in another pid namespace. So a process that
//! owns something keeps an `flock` on a file of it ([`lock_for_life`]), which the kernel lets go
//! of when the process ends, however it ends, and whoever shares the file system sees that
//! ([`is_locked`]), in whatever namespace.

use std::fs::File;
use std::path::Path;

/// Whether a process with this id exists (in this pid namespace).
pub fn alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        if pid == 0 || pid > i32::MAX as u32 {
            return false;
        }
        // SAFETY: signal 0 checks for existence and permission only.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// Take an exclusive `flock` on `file`, held for as long as this open file stays open (dropping
/// the `File` lets go, and so does the end of the process). `Some(false)` when another holder
/// kept it past the wait, `None` where the file system has no flock. Each `open` is its own
/// holder, so two opens in one process exclude each other too.
///
/// Meant for a file just created: the only other holders it can have are lookers ([`is_locked`]),
/// whose shared lock lasts a moment, so it waits out theirs (up to [`LOOKER_WAIT`]). Not waiting,
/// a looker's moment made 2-54 of 300 contended lock takers record no flock at all, and their
/// locks were then judged by pid alone.
pub fn lock_for_life(file: &File) -> Option<bool> {
    let until = std::time::Instant::now() + LOOKER_WAIT;
    loop {
        match try_lock(file) {
            Some(false) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_micros(50))
            }
            taken => return taken,
        }
    }
}

/// How long [`lock_for_life`] waits for lookers to let go of a file.
const LOOKER_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// [`lock_for_life`], telling why not: `Some(false)` while another open file holds the lock,
/// `None` where the file system has no flock.
pub fn try_lock(file: &File) -> Option<bool> {
    flock_now(file, true)
}

/// Whether some open file holds an `flock` on `path` right now: `None` when that cannot be told
/// (the file is gone, or the file system has no flock).
pub fn is_locked(path: &Path) -> Option<bool> {
    held_elsewhere(&crate::files::open_own(path, false, false).ok()?)
}

/// Whether another open file holds an `flock` on the file `file` is open on: `None` where the
/// file system has no flock. Its momentary shared lock lasts until `file` is dropped.
pub fn held_elsewhere(file: &File) -> Option<bool> {
    // A shared lock is refused only while someone holds the exclusive one; taking it for a moment
    // blocks no other looker.
    flock_now(file, false).map(|taken| !taken)
}

/// Try an exclusive (or shared) `flock` on `file` without waiting: `Some(true)` when taken,
/// `Some(false)` when another open file holds a conflicting one, `None` when there is no flock.
fn flock_now(file: &File, exclusive: bool) -> Option<bool> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
        // SAFETY: flock on a descriptor this `File` owns.
        if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return Some(true);
        }
        let e = std::io::Error::last_os_error();
        (e.raw_os_error() == Some(libc::EWOULDBLOCK)).then_some(false)
    }
    #[cfg(not(unix))]
    {
        let _ = (file, exclusive);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_lock_lasts_as_long_as_its_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("owner.json");
        let held = File::create(&path).unwrap();
        assert_eq!(is_locked(&path), Some(false));
        assert_eq!(lock_for_life(&held), Some(true));
        assert_eq!(is_locked(&path), Some(true), "another open in this process sees it");
        assert_eq!(
            lock_for_life(&File::open(&path).unwrap()),
            Some(false),
            "and cannot take it"
        );
        drop(held);
        assert_eq!(is_locked(&path), Some(false));
        assert_eq!(is_locked(&dir.path().join("gone")), None);
    }
}
