//! The locks of a local world, as directories under `<dataDir>/locks/`, with stale-owner
//! recovery.
//!
//! A lock is the directory `<dataDir>/locks/<sha256(name)>/`; creating it (`mkdir`, atomic on every
//! local file system) is taking the lock, and `owner.json` inside says who holds it:
//! `{pid, token, createdAt, flock}`. The data directory is resolved to its real path when the
//! world opens, so two paths to one directory contend for the same lock.
//!
//! The owner keeps `owner.json` open with an `flock` on it for as long as it holds the lock, and
//! says so (`flock: true`); it is flocked before it is named `owner.json`. The lock is held
//! exactly while that flock is: the kernel lets go of it when the owner ends, however it ends,
//! and every process on the machine sees that, whatever its pid namespace. A pid cannot tell as
//! much: a container restarted on its data directory often gets its old pid back, and took its
//! own previous run's locks for live ones. A record without the flag (an earlier version's, or a
//! file system without flock) falls back to whether its pid exists.
//!
//! An owner whose process is gone is stale, and the next taker recovers the lock. A lock
//! directory whose `owner.json` is not written yet belongs to a taker that is between `mkdir` and
//! naming its record `owner.json.tmp`: while its taker holds the flock on that record, it is held;
//! once the taker has let go of a whole record, written under a flock, without naming it, it is
//! stale at once (the taker died, or failed and removed its directory itself); otherwise it is
//! only presumed stale after a grace of 30 seconds. A taker creates its record only where there
//! is none and names it `owner.json` by a link, only where there is none: one that stalled past
//! the grace while others recovered its directory and took the lock gives up on finding their
//! record, touching nothing (see [`write_owner`]). A stale lock is renamed aside
//! before it is deleted, so a taker never sees it half removed. A taker that fails to write or
//! sync its `owner.json` removes the directory again: it never hands out a token for it.
//!
//! Recovery runs under a lock of its own, an `flock` on `<hash>.recovery-lock` (see
//! [`RecoveryLock`]), so two recoverers cannot both win, and re-checks staleness once it holds it.
//! While another taker holds that flock, the lock counts as held (the taker waits and polls as
//! usual). Recovery directories `<hash>.recovery/` of earlier versions are not looked at.
//!
//! Within a process, the operations on one lock directory are serialized (see [`gate`]): two
//! releases of one lock cannot both pass the owner check, the second then removing the lock of
//! the next owner.

use super::{new_token, Attempt, Busy, LockStore, Owner};
use crate::durable::sync_dir;
use crate::error::{Result, WorldError};
use crate::files;
use crate::ids::sha256_hex;
use crate::process;
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

/// How long a lock directory without a readable owner is presumed to be in the making.
pub const OWNER_GRACE: Duration = Duration::from_secs(30);

/// How many rounds one attempt makes (the lock vanishing or being recovered under it) before it
/// reports the lock as held and leaves the rest to the taker's next poll.
const ROUNDS: usize = 8;

/// Locks as directories under a data directory.
pub struct LocalLocks {
    dir: PathBuf,
}

impl LocalLocks {
    /// The locks of the local world at `data_dir` (already resolved to its real path); creates
    /// their directory and deletes what killed operations left behind.
    pub fn open(data_dir: &Path) -> Result<LocalLocks> {
        let dir = data_dir.join("locks");
        crate::durable::create_dir_synced(&dir, "the locks directory")?;
        remove_leftovers(&dir);
        Ok(LocalLocks { dir })
    }

    /// The locks of a world opened for reading only, which takes none: nothing is created or
    /// cleaned up.
    pub fn read_only(data_dir: &Path) -> LocalLocks {
        LocalLocks {
            dir: data_dir.join("locks"),
        }
    }
}

impl LockStore for LocalLocks {
    fn try_take(&self, name: &str, token: &str) -> Result<Attempt> {
        let dir = &self.dir;
        let taken = take_local(dir, &dir.join(sha256_hex(name.as_bytes())), token)?;
        Ok(taken.map(|file| file.map(|f| Box::new(f) as Box<dyn Send>)))
    }

    fn let_go(&self, name: &str, token: &str) -> Result<()> {
        let dir = &self.dir;
        let lock_dir = dir.join(sha256_hex(name.as_bytes()));
        // Under the gate, nothing in this process changes the directory between the owner
        // check and the rename; no other process removes a live owner's lock.
        let _gate = gate(&lock_dir);
        match read_owner(&lock_dir) {
            Ok(Some(o)) if o.token == token => {
                hook("release.checked")?;
                remove_aside(dir, &lock_dir, token)
            }
            Ok(Some(o)) => Err(Busy::of(&o).error(name)),
            Ok(None) => Ok(()),
            Err(_) if !lock_dir.exists() => Ok(()),
            Err(e) => Err(Busy::unknown(&e).error(name)),
        }
    }
}

/// Whether the process that wrote `owner`, stored at `file`, still holds it.
fn running(owner: &Owner, file: &Path) -> bool {
    match owner.flock.then(|| process::is_locked(file)).flatten() {
        Some(locked) => locked,
        None => process::alive(owner.pid),
    }
}

/// Serializes, within this process, the operations on one lock directory: every world on the
/// same data directory shares it. Striped: two directories may share a stripe, which only makes
/// them wait for each other; no operation takes two.
fn gate(lock_dir: &Path) -> MutexGuard<'static, ()> {
    const STRIPES: usize = 64;
    static GATES: [Mutex<()>; STRIPES] = [const { Mutex::new(()) }; STRIPES];
    let mut h = DefaultHasher::new();
    lock_dir.hash(&mut h);
    GATES[(h.finish() % STRIPES as u64) as usize]
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// One attempt at a lock: `Ok` when it is now ours, with the open, flocked `owner.json` to keep
/// (none in memory, or where the file system has no flock); else who holds it.
type LocalAttempt = std::result::Result<Option<fs::File>, Busy>;

/// One attempt at taking `lock_dir` for `token` (see [`Attempt`]).
fn take_local(dir: &Path, lock_dir: &Path, token: &str) -> Result<LocalAttempt> {
    let _gate = gate(lock_dir);
    for _ in 0..ROUNDS {
        match fs::create_dir(lock_dir) {
            // Its identity at once: the longer before it is taken, the longer a stall (a paused
            // container) in which others may recover this directory and make another there.
            Ok(()) => return write_owner(dir, lock_dir, dir_id(lock_dir), token),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => match inspect(lock_dir) {
                Holder::Live(busy) => return Ok(Err(busy)),
                Holder::Stale(busy) => {
                    if !recover(dir, lock_dir)? {
                        return Ok(Err(busy.being_recovered()));
                    }
                }
                Holder::Gone => {}
            },
            Err(e) => return Err(WorldError::io("taking a lock", Some(lock_dir.to_path_buf()), e)),
        }
    }
    Ok(Err(Busy {
        pid: 0,
        holder: "(it changed hands repeatedly during this attempt)".into(),
    }))
}

/// Write this process's owner record for `token` into the lock directory just made (`made`, its
/// identity then), and sync it. The record is flocked before it is named `owner.json`, so nobody
/// sees it without its flock; the open file is returned to be kept while the lock is held. On
/// failure the record and then the directory are removed again (see [`give_up`]): its token is
/// never handed out, so nobody else would let go of it.
///
/// Should this taker stall past the grace before its record is named, others recover the lock
/// and the path may name a later taker's directory, which is not to be written in or removed.
/// Its identity tells, unless the stall came before `made` was taken; the record is therefore
/// created only where there is none, named `owner.json` only where there is none (a link, not a
/// rename, where the file system has links) and checked to be what the name holds, so that such
/// a taker finds the other's record and gives up, touching nothing of it.
fn write_owner(dir: &Path, lock_dir: &Path, made: Option<(u64, u64)>, token: &str) -> Result<LocalAttempt> {
    let tmp = lock_dir.join("owner.json.tmp");
    let io = |e| WorldError::io("writing a lock owner", Some(lock_dir.to_path_buf()), e);
    let mine = || made.is_some() && dir_id(lock_dir) == made;
    let still_mine = || match mine() {
        true => Ok(()),
        false => Err(io(std::io::Error::other(
            "the lock was recovered by another taker while this one stalled",
        ))),
    };
    let another = || Busy::writing(None);
    // The record, kept open (and flocked) until the directory is handed out or removed again: a
    // whole record whose flock is gone is taken for an abandoned one (see [`in_making`]).
    let mut record: Option<fs::File> = None;
    let mut flocked = false;
    let mut try_again = false;
    let result = hook("owner.write").and_then(|()| {
        still_mine()?;
        let created = fs::OpenOptions::new().write(true).create_new(true).open(&tmp);
        let file = match created {
            Ok(f) => record.insert(f),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(Some(another())),
            Err(e) => return Err(io(e)),
        };
        hook("owner.created")?;
        flocked = match process::lock_for_life(file) {
            Some(true) => true,
            None => false,
            // A looker kept it past the wait: recorded without its flock, this lock would be
            // judged by its pid, which means nothing in another pid namespace. Try again.
            Some(false) => {
                try_again = true;
                return Ok(Some(Busy {
                    pid: 0,
                    holder: "(a looker held the new owner record too long; try again)".into(),
                }));
            }
        };
        let body = serde_json::to_vec(&Owner {
            flock: flocked,
            ..Owner::me(token)
        })
        .expect("owner serializes");
        file.write_all(&body).and_then(|()| file.sync_all()).map_err(io)?;
        still_mine()?;
        hook("owner.link")?;
        let owner_json = lock_dir.join("owner.json");
        match fs::hard_link(&tmp, &owner_json) {
            Ok(()) => {}
            // Named already: by a stalled taker's link, which went by path (below).
            Err(e) if e.kind() == ErrorKind::AlreadyExists && is(file, &owner_json) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                if is(file, &tmp) {
                    let _ = fs::remove_file(&tmp);
                }
                record = None;
                return Ok(Some(match read_owner(lock_dir) {
                    Ok(Some(o)) => Busy::of(&o),
                    _ => another(),
                }));
            }
            // A file system without hard links: named by a rename, as before links were used.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP | libc::ENOSYS)) => {
                fs::rename(&tmp, &owner_json).map_err(io)?
            }
            Err(e) => return Err(io(e)),
        }
        // A link goes by path: had the name come to hold another taker's record meanwhile (this
        // one stalled, its directory recovered, the next holder's released), that record would
        // now be named, not this one. It is that taker's, and nothing here is this one's.
        if !is(file, &owner_json) {
            record = None;
            return Ok(Some(another()));
        }
        if is(file, &tmp) {
            let _ = fs::remove_file(&tmp);
        }
        hook("owner.sync")?;
        sync_dir(lock_dir)?;
        sync_dir(dir)?;
        Ok(None)
    });
    match result {
        Ok(None) => Ok(Ok(record.filter(|_| flocked))),
        Ok(Some(busy)) => {
            // Else another taker's record is there: nothing here is this taker's to remove.
            if try_again {
                give_up(lock_dir, record.as_ref());
            }
            Ok(Err(busy))
        }
        Err(e) => {
            if mine() {
                give_up(lock_dir, record.as_ref());
            }
            drop(record);
            Err(e)
        }
    }
}

/// Remove what is provably this taker's: its record, by its names that still lead to it, then
/// the directory if that left it empty. Removing the directory by its path after a check could
/// remove the next holder's, made there while this taker stalled past the grace (found by review
/// with delays injected: two holders); a directory that holds anyone's record is not empty.
fn give_up(lock_dir: &Path, record: Option<&fs::File>) {
    if let Some(file) = record {
        for name in ["owner.json.tmp", "owner.json"] {
            let path = lock_dir.join(name);
            if is(file, &path) {
                let _ = fs::remove_file(&path);
            }
        }
    }
    if fs::remove_dir(lock_dir).is_ok() {
        if let Some(dir) = lock_dir.parent() {
            let _ = sync_dir(dir);
        }
    }
}

use files::names as is;

/// The identity (device, inode) of the directory at `path`, if any.
fn dir_id(path: &Path) -> Option<(u64, u64)> {
    fs::symlink_metadata(path).ok().map(|m| files::identity(&m))
}

enum Holder {
    Live(Busy),
    Stale(Busy),
    /// The directory vanished meanwhile: try again.
    Gone,
}

/// Read `owner.json`: `Ok(None)` when the lock directory does not exist.
fn read_owner(lock_dir: &Path) -> std::io::Result<Option<Owner>> {
    match read_record(&lock_dir.join("owner.json")) {
        Err(e) if e.kind() == ErrorKind::NotFound && !lock_dir.exists() => Ok(None),
        other => other.map(Some),
    }
}

/// The owner record in the file at `path`.
fn read_record(path: &Path) -> std::io::Result<Owner> {
    let bytes = files::read_small(path, RECORD_MAX).map_err(|e| e.into_io(path))?;
    serde_json::from_slice(&bytes).map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))
}

/// No owner record is this large (it holds a pid, a token, a time and a flag).
const RECORD_MAX: u64 = 64 << 10;

fn inspect(lock_dir: &Path) -> Holder {
    match read_owner(lock_dir) {
        Ok(Some(owner)) if running(&owner, &lock_dir.join("owner.json")) => Holder::Live(Busy::of(&owner)),
        Ok(Some(owner)) => Holder::Stale(Busy::of(&owner)),
        Ok(None) => Holder::Gone,
        // No readable owner yet: a taker between mkdir and naming its record. While it holds the
        // flock on the record it is writing, it is there however long it takes; once it let go
        // of a whole record it never named, it is gone; otherwise it is presumed gone after the
        // grace.
        Err(e) => match in_making(&lock_dir.join("owner.json.tmp")) {
            InMaking::Held(owner) => Holder::Live(Busy::writing(owner.as_ref())),
            InMaking::Abandoned(owner) => Holder::Stale(Busy::of(&owner)),
            InMaking::Unknown => match age(lock_dir) {
                None => Holder::Gone,
                Some(a) if a > OWNER_GRACE => Holder::Stale(Busy::unknown(&e)),
                Some(_) => Holder::Live(Busy::unknown(&e)),
            },
        },
    }
}

/// What the record a taker is writing (`owner.json.tmp`) says of it.
enum InMaking {
    /// Its taker holds the flock on it (with the record, once it is whole).
    Held(Option<Owner>),
    /// A whole record, written under a flock its taker has let go of without naming it: the
    /// taker died between writing and naming it (9 of 40 kills of a taker in an acquire/release
    /// loop), or failed and has removed its directory (it holds the flock until then).
    Abandoned(Owner),
    /// No record, or one that cannot tell (not whole yet, or written without a flock).
    Unknown,
}

/// Judge the record at `tmp` by one open of it: its contents, its flock and its being still at
/// `tmp` are all of the same file. Judged by its path instead, a record named `owner.json`
/// meanwhile, or the next taker's fresh one, was taken for an abandoned one (found by review
/// with delays injected between the opens: two holders at once).
fn in_making(tmp: &Path) -> InMaking {
    let Ok((file, len)) = files::open_file(tmp) else {
        return InMaking::Unknown;
    };
    let whole = files::read_opened(&file, len, RECORD_MAX)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Owner>(&bytes).ok());
    let _ = hook("in_making.read");
    match process::held_elsewhere(&file) {
        Some(true) => InMaking::Held(whole),
        Some(false) => {
            // Still at its path, so its taker never named it `owner.json`.
            let here = is(&file, tmp);
            match whole {
                Some(owner) if owner.flock && here => InMaking::Abandoned(owner),
                _ => InMaking::Unknown,
            }
        }
        None => InMaking::Unknown,
    }
}

/// How long ago `path` was last modified (zero if in the future); `None` when it is gone.
fn age(path: &Path) -> Option<Duration> {
    let modified = fs::metadata(path).and_then(|m| m.modified()).ok()?;
    Some(SystemTime::now().duration_since(modified).unwrap_or(Duration::ZERO))
}

/// Remove a stale lock under the recovery lock, re-checking that it is still stale. `false` when
/// another live taker is recovering it.
fn recover(dir: &Path, lock_dir: &Path) -> Result<bool> {
    let Some(_recovery) = RecoveryLock::take(lock_dir)? else {
        return Ok(false);
    };
    match inspect(lock_dir) {
        Holder::Stale(_) => remove_aside(dir, lock_dir, "stale")?,
        Holder::Live(_) | Holder::Gone => {}
    }
    Ok(true)
}

/// The recovery lock of one lock directory, held by this process while it recovers: an `flock`
/// on `<hash>.recovery-lock` beside it. The kernel lets go of it when its holder ends, however
/// it ends, and every process on the host sees that, so a recoverer killed mid-recovery never
/// blocks the lock and a live one is never taken for dead (whatever pid namespace either is in).
/// The file is never deleted: a taker that had opened it before a delete would lock the deleted
/// file while the next one locked a new one. Where the file system has no flock, recovery runs
/// without it, as takers there are judged by their pids anyway.
struct RecoveryLock {
    _file: Option<fs::File>,
}

impl RecoveryLock {
    /// Take the recovery lock of `lock_dir`; `None` while a live taker holds it.
    fn take(lock_dir: &Path) -> Result<Option<RecoveryLock>> {
        let path = lock_dir.with_extension("recovery-lock");
        let file = files::open_own(&path, true, true)
            .map_err(|e| WorldError::io("taking a recovery lock", Some(path.clone()), e))?;
        Ok(match process::try_lock(&file) {
            Some(true) => Some(RecoveryLock { _file: Some(file) }),
            Some(false) => None,
            None => Some(RecoveryLock { _file: None }),
        })
    }
}

fn file_name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap_or("lock")
}

/// Delete what a process killed mid-operation left in `dir`: lock directories renamed aside
/// (`*.removed`: no longer a lock under any name, so deleting them is always safe) and recovery
/// locks staged but never placed (`*.staged`), once older than the grace; staging one takes
/// microseconds, so an older one's taker is gone.
fn remove_leftovers(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = entry.path();
        let leftover =
            name.ends_with(".removed") || (name.ends_with(".staged") && age(&path).is_some_and(|a| a > OWNER_GRACE));
        if leftover {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// Rename a lock directory aside (atomically freeing the name), then delete it.
fn remove_aside(dir: &Path, lock_dir: &Path, tag: &str) -> Result<()> {
    let aside = dir.join(format!("{}.{tag}.{}.removed", file_name(lock_dir), new_token()));
    match fs::rename(lock_dir, &aside) {
        Ok(()) => {
            let _ = fs::remove_dir_all(&aside);
            sync_dir(dir)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(WorldError::io("removing a lock", Some(lock_dir.to_path_buf()), e)),
    }
}

#[cfg(test)]
type HookFn = Box<dyn FnMut(&str) -> std::io::Result<()>>;

#[cfg(test)]
thread_local! {
    /// What a test does at the named steps of this thread's lock operations.
    static HOOK: std::cell::RefCell<Option<HookFn>> = const { std::cell::RefCell::new(None) };
}

/// A test's seam at a named step: it may fail the step, or act (as another process would) there.
/// Does nothing outside tests.
#[cfg(test)]
fn hook(step: &str) -> Result<()> {
    let Some(mut f) = HOOK.with(|h| h.borrow_mut().take()) else {
        return Ok(());
    };
    let out = f(step);
    HOOK.with(|h| *h.borrow_mut() = Some(f));
    out.map_err(|e| WorldError::io(format!("at {step}"), None, e))
}

#[cfg(not(test))]
#[inline(always)]
fn hook(_step: &str) -> Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests;
