//! Run and outer-loop locks: fencing across processes, with stale-owner recovery.
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
//!
//! [`Locks`] remembers the locks it handed out: [`Locks::close`] (the world's close) lets go of
//! them, and a taker still waiting then gives up with `WorldError::Closed`.

use crate::core::artifacts::sync_dir;
use crate::core::clock;
use crate::core::error::{Result, WorldError};
use crate::core::files;
use crate::core::ids::sha256_hex;
use crate::core::process;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// How long a lock directory without a readable owner is presumed to be in the making.
pub const OWNER_GRACE: Duration = Duration::from_secs(30);
/// How often a waiting taker tries again.
const POLL: Duration = Duration::from_millis(20);
/// How many rounds one attempt makes (the lock vanishing or being recovered under it) before it
/// reports the lock as held and leaves the rest to the taker's next poll.
const ROUNDS: usize = 8;

/// Who holds a lock, as stored in `owner.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub pid: u32,
    pub token: String,
    pub created_at: String,
    /// Whether the owner holds an `flock` on this very file for as long as it holds the lock
    /// (see [`process`]): then the lock is held exactly while that flock is, whatever the pid
    /// means here. Absent in records of earlier versions, and where the file system has no
    /// flock: then the pid is all there is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flock: bool,
}

impl Owner {
    /// Whether the process that wrote this record, stored at `file`, still holds it.
    fn running(&self, file: &Path) -> bool {
        match self.flock.then(|| process::is_locked(file)).flatten() {
            Some(locked) => locked,
            None => process::alive(self.pid),
        }
    }

    /// This process, holding `token` from now.
    fn me(token: &str) -> Owner {
        Owner {
            pid: std::process::id(),
            token: token.to_string(),
            created_at: clock::now_iso(),
            flock: false,
        }
    }
}

/// A lock this process holds.
#[derive(Debug, Clone)]
pub struct Held {
    /// The lock's name (`run:<runId>` or `outer-loop:<outerLoopId>`).
    pub name: String,
    pub token: String,
}

/// The lock name of a run.
pub fn run_lock_name(run_id: &str) -> String {
    format!("run:{run_id}")
}

/// The lock name of an outer loop.
pub fn outer_loop_lock_name(outer_loop_id: &str) -> String {
    format!("outer-loop:{outer_loop_id}")
}

/// A fresh, unguessable token.
fn new_token() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let seed = format!("{}:{nanos}:{:?}:{n}", std::process::id(), std::thread::current().id());
    format!("lck_{}", &sha256_hex(seed.as_bytes())[..24])
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Who keeps a lock from being taken right now: the pid for `RunLockedError.ownerPid` (0 when
/// unknown) and a description for the message.
struct Busy {
    pid: u32,
    holder: String,
}

impl Busy {
    fn of(owner: &Owner) -> Busy {
        Busy {
            pid: owner.pid,
            // Not the token: whoever reads the message could release the lock with it.
            holder: format!("by pid {} since {}", owner.pid, owner.created_at),
        }
    }

    /// A taker that is writing its owner record (which says who it is once it is written).
    fn writing(owner: Option<&Owner>) -> Busy {
        Busy {
            pid: owner.map_or(0, |o| o.pid),
            holder: match owner {
                Some(o) => format!("by pid {}, which is writing its owner file", o.pid),
                None => "by a taker that is writing its owner file".into(),
            },
        }
    }

    /// A lock directory whose `owner.json` could not be read.
    fn unknown(e: &std::io::Error) -> Busy {
        let holder = if e.kind() == ErrorKind::NotFound {
            "by a taker that has not written its owner file yet".to_string()
        } else {
            format!("by an owner whose owner file is unreadable ({e})")
        };
        Busy { pid: 0, holder }
    }

    /// A stale holder another taker is removing.
    fn being_recovered(self) -> Busy {
        Busy {
            holder: format!("{}, presumed gone: another taker is recovering the lock", self.holder),
            ..self
        }
    }

    fn error(self, name: &str) -> WorldError {
        WorldError::RunLocked {
            name: name.to_string(),
            owner_pid: self.pid,
            holder: self.holder,
        }
    }
}

/// The locks of a world, on disk or in memory, and the ones it handed out.
pub struct Locks {
    store: Store,
    handed: Mutex<Handed>,
}

enum Store {
    Local { dir: PathBuf },
    Memory(Mutex<HashMap<String, Owner>>),
}

/// What a world's locks remember of their own.
#[derive(Default)]
struct Handed {
    /// Set by [`Locks::close`]: nothing more is handed out.
    closed: bool,
    /// Locks handed out and not seen released: name → token, and the open `owner.json` whose
    /// flock says the lock is held (dropped only after the lock directory is gone).
    held: HashMap<String, (String, Option<fs::File>)>,
    /// `(name, token)` of the locks `close` let go of: releasing one afterwards is a no-op.
    released_at_close: HashSet<(String, String)>,
}

impl Locks {
    /// The locks of the local world at `data_dir` (already resolved to its real path).
    pub fn local(data_dir: &Path) -> Result<Locks> {
        let dir = data_dir.join("locks");
        crate::core::artifacts::create_dir_synced(&dir, "the locks directory")?;
        remove_leftovers(&dir);
        Ok(Locks::new(Store::Local { dir }))
    }

    /// The locks of a world opened for reading only, which takes none: nothing is created or
    /// cleaned up.
    pub fn local_read_only(data_dir: &Path) -> Locks {
        Locks::new(Store::Local {
            dir: data_dir.join("locks"),
        })
    }

    /// Locks kept in memory, for a virtual world.
    pub fn memory() -> Locks {
        Locks::new(Store::Memory(Mutex::new(HashMap::new())))
    }

    fn new(store: Store) -> Locks {
        Locks {
            store,
            handed: Mutex::new(Handed::default()),
        }
    }

    fn handed(&self) -> MutexGuard<'_, Handed> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take the lock `name`, waiting up to `wait` for a live owner to let go. Fails with
    /// `WorldError::Closed` once [`Locks::close`] has run, also while waiting.
    pub fn acquire(&self, name: &str, wait: Duration) -> Result<Held> {
        let deadline = Instant::now() + wait;
        let token = new_token();
        loop {
            if self.handed().closed {
                return Err(WorldError::Closed);
            }
            match self.try_take(name, &token)? {
                Ok(owner_file) => return self.hand_out(name, token, owner_file),
                Err(busy) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(busy.error(name));
                    }
                    std::thread::sleep(POLL.min(deadline - now));
                }
            }
        }
    }

    /// Remember a lock just taken, unless the world closed meanwhile: then let go of it again.
    fn hand_out(&self, name: &str, token: String, owner_file: Option<fs::File>) -> Result<Held> {
        let mut handed = self.handed();
        if handed.closed {
            drop(handed);
            self.let_go(name, &token)?;
            drop(owner_file);
            return Err(WorldError::Closed);
        }
        handed.held.insert(name.to_string(), (token.clone(), owner_file));
        Ok(Held {
            name: name.to_string(),
            token,
        })
    }

    /// Let go of a lock. Letting go of a lock that is already free is a no-op; a token that does
    /// not own a held lock is refused with `RunLockedError`. Works after [`Locks::close`] too: a
    /// lock close let go of is then already free.
    pub fn release(&self, name: &str, token: &str) -> Result<()> {
        let key = (name.to_string(), token.to_string());
        if self.handed().released_at_close.contains(&key) {
            return Ok(());
        }
        self.let_go(name, token)?;
        let mut handed = self.handed();
        if handed.held.get(name).is_some_and(|(t, _)| t == token) {
            // Its flock goes only now, with the lock directory already gone.
            handed.held.remove(name);
        }
        Ok(())
    }

    /// Hand out no more locks: a taker still waiting gives up at its next poll (with
    /// `WorldError::Closed`), and one that takes a lock from now on lets go of it again. The locks
    /// already handed out stay held until [`Locks::close`].
    pub fn stop(&self) {
        self.handed().closed = true;
    }

    /// Let go of every lock handed out and not released, and hand out no more: a taker still
    /// waiting gives up at its next poll. Returns the first failure; a lock that could not be let
    /// go of can still be released afterwards, and is recoverable once this process is gone.
    pub fn close(&self) -> Result<()> {
        let held: Vec<(String, (String, Option<fs::File>))> = {
            let mut handed = self.handed();
            handed.closed = true;
            handed.held.drain().collect()
        };
        let mut first_error = None;
        for (name, (token, owner_file)) in held {
            match self.let_go(&name, &token) {
                Ok(()) => {
                    self.handed().released_at_close.insert((name, token));
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            // Let go of the flock either way: a lock that could not be removed is then
            // recoverable by others while this process lives on.
            drop(owner_file);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// One attempt: `Ok` when the lock is now ours (with its open `owner.json` on disk, when
    /// flocked), else who holds it.
    fn try_take(&self, name: &str, token: &str) -> Result<Attempt> {
        match &self.store {
            Store::Memory(map) => {
                let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(owner) = map.get(name) {
                    return Ok(Err(Busy::of(owner)));
                }
                map.insert(name.to_string(), Owner::me(token));
                Ok(Ok(None))
            }
            Store::Local { dir } => take_local(dir, &dir.join(sha256_hex(name.as_bytes())), token),
        }
    }

    /// Remove the lock `name` if `token` holds it (see [`Locks::release`]).
    fn let_go(&self, name: &str, token: &str) -> Result<()> {
        match &self.store {
            Store::Memory(map) => {
                let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
                match map.get(name) {
                    None => Ok(()),
                    Some(o) if o.token == token => {
                        map.remove(name);
                        Ok(())
                    }
                    Some(o) => Err(Busy::of(o).error(name)),
                }
            }
            Store::Local { dir } => {
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
type Attempt = std::result::Result<Option<fs::File>, Busy>;

/// One attempt at taking `lock_dir` for `token` (see [`Attempt`]).
fn take_local(dir: &Path, lock_dir: &Path, token: &str) -> Result<Attempt> {
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
fn write_owner(dir: &Path, lock_dir: &Path, made: Option<(u64, u64)>, token: &str) -> Result<Attempt> {
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
        Ok(Some(owner)) if owner.running(&lock_dir.join("owner.json")) => Holder::Live(Busy::of(&owner)),
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
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;

    const DEAD_PID: u32 = 2_147_483_646;

    fn lock_dir(data: &Path, name: &str) -> PathBuf {
        data.join("locks").join(sha256_hex(name.as_bytes()))
    }

    /// A lock directory owned by a process that is gone.
    fn dead_lock(data: &Path, name: &str) -> PathBuf {
        let dir = lock_dir(data, name);
        fs::create_dir(&dir).unwrap();
        let dead = Owner {
            pid: DEAD_PID,
            token: "lck_dead".into(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            flock: false,
        };
        fs::write(dir.join("owner.json"), serde_json::to_vec(&dead).unwrap()).unwrap();
        dir
    }

    fn backdate(path: &Path, by: Duration) {
        let t = SystemTime::now() - by;
        fs::File::open(path).unwrap().set_modified(t).unwrap();
    }

    fn set_hook(f: impl FnMut(&str) -> std::io::Result<()> + 'static) {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    }

    fn clear_hook() {
        HOOK.with(|h| *h.borrow_mut() = None);
    }

    /// The entries of the locks directory other than lock directories themselves and the
    /// recovery-lock files (kept for good, by design).
    fn leftovers(data: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(data.join("locks"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains('.') && !n.ends_with(".recovery-lock"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn opening_deletes_what_killed_operations_left_behind() {
        let data = tempfile::tempdir().unwrap();
        let locks = data.path().join("locks");
        fs::create_dir_all(&locks).unwrap();
        let aside = locks.join(format!("{}.stale.lck_x.removed", "a".repeat(64)));
        let old_staged = locks.join(format!("{}.recovery.lck_y.staged", "b".repeat(64)));
        let fresh_staged = locks.join(format!("{}.recovery.lck_z.staged", "c".repeat(64)));
        for d in [&aside, &old_staged, &fresh_staged] {
            fs::create_dir(d).unwrap();
            fs::write(d.join("owner.json"), b"{}").unwrap();
        }
        backdate(&old_staged, OWNER_GRACE * 2);
        Locks::local(data.path()).unwrap();
        assert!(!aside.exists() && !old_staged.exists());
        assert!(fresh_staged.exists(), "a taker may be staging it right now");
    }

    /// A taker killed after writing its record and before naming it `owner.json` left a whole
    /// record: that tells at once whether it is gone, rather than the 30 s grace.
    #[test]
    fn a_taker_killed_before_naming_its_record_is_judged_by_the_record() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::local(dir.path()).unwrap();
        let name = "run:run_named";
        let record = |flock: bool| {
            serde_json::to_vec(&Owner {
                flock,
                ..Owner::me("lck_writing")
            })
            .unwrap()
        };
        let lock = lock_dir(dir.path(), name);
        fs::create_dir(&lock).unwrap();
        let tmp = lock.join("owner.json.tmp");
        // Its taker is there while it holds the flock on the record: the message names its pid.
        let writing = fs::File::create(&tmp).unwrap();
        if process::lock_for_life(&writing) != Some(true) {
            return; // no flock on this file system
        }
        fs::write(&tmp, record(true)).unwrap();
        let err = locks.acquire(name, Duration::ZERO).unwrap_err();
        assert_eq!(err.code(), "RUN_LOCKED");
        assert_eq!(
            err.to_string(),
            format!(
                "{name} is locked by pid {}, which is writing its owner file",
                std::process::id()
            )
        );
        // Killed: the flock is gone, and the lock is taken at once, well within the grace.
        drop(writing);
        let held = locks.acquire(name, Duration::ZERO).unwrap();
        assert_ne!(held.token, "lck_writing");
        locks.release(name, &held.token).unwrap();

        // A record written without a flock, or cut short, says nothing: the grace applies (a pid
        // means nothing in another pid namespace).
        fs::create_dir(&lock).unwrap();
        for body in [record(false), record(true)[..10].to_vec()] {
            fs::write(&tmp, body).unwrap();
            let err = locks.acquire(name, Duration::ZERO).unwrap_err();
            assert!(err.to_string().ends_with("has not written its owner file yet"), "{err}");
        }
        backdate(&lock, OWNER_GRACE * 2);
        locks.acquire(name, Duration::ZERO).unwrap();
    }

    /// A taker that stalled before it took its directory's identity, while others recovered the
    /// directory and the next taker took it, finds that taker's record and touches nothing.
    #[test]
    fn a_taker_that_finds_another_takers_record_in_its_directory_gives_up_touching_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let locks_dir = dir.path().join("locks");
        fs::create_dir(&locks_dir).unwrap();
        let lock = locks_dir.join("lock");
        fs::create_dir(&lock).unwrap();
        let theirs = serde_json::to_vec(&Owner::me("lck_next")).unwrap();
        fs::write(lock.join("owner.json"), &theirs).unwrap();
        // Its identity is the next taker's directory's: only the record can tell.
        let out = write_owner(&locks_dir, &lock, dir_id(&lock), "lck_stalled").unwrap();
        assert!(out.is_err(), "it took the lock");
        assert_eq!(fs::read(lock.join("owner.json")).unwrap(), theirs);
        assert!(!lock.join("owner.json.tmp").exists());

        // Its record's name came to hold another taker's record before the link (this one stalled,
        // the next holder released, the one after made its record): that one is named, and left
        // as it is, with its name.
        fs::remove_file(lock.join("owner.json")).unwrap();
        let other = lock.join("other");
        set_hook(move |step| {
            if step == "owner.link" {
                let tmp = other.with_file_name("owner.json.tmp");
                fs::remove_file(&tmp)?;
                fs::write(&other, b"theirs")?;
                fs::rename(&other, &tmp)?;
            }
            Ok(())
        });
        let out = write_owner(&locks_dir, &lock, dir_id(&lock), "lck_stalled").unwrap();
        clear_hook();
        assert!(out.is_err(), "it took the lock");
        assert_eq!(fs::read(lock.join("owner.json")).unwrap(), b"theirs");
        assert_eq!(fs::read(lock.join("owner.json.tmp")).unwrap(), b"theirs");
        fs::remove_file(lock.join("owner.json")).unwrap();
        fs::remove_file(lock.join("owner.json.tmp")).unwrap();

        // The same while the next taker is still writing its record.
        fs::write(lock.join("owner.json.tmp"), b"{").unwrap();
        assert!(write_owner(&locks_dir, &lock, dir_id(&lock), "lck_stalled")
            .unwrap()
            .is_err());
        assert_eq!(fs::read(lock.join("owner.json.tmp")).unwrap(), b"{");
    }

    /// A looker that holds a new record past the wait makes the taker try again, rather than
    /// record no flock (then judged by a pid, which means nothing in another pid namespace).
    #[test]
    fn a_record_a_looker_holds_too_long_is_given_up_and_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::local(dir.path()).unwrap();
        let name = "run:run_looked";
        let lock = lock_dir(dir.path(), name);
        let tmp = lock.join("owner.json.tmp");
        let mut looker = None;
        set_hook(move |step| {
            if step == "owner.created" && looker.is_none() {
                let f = fs::File::open(&tmp)?;
                process::held_elsewhere(&f); // a looker's shared flock, kept
                looker = Some(f);
            }
            Ok(())
        });
        let err = locks.acquire(name, Duration::ZERO).unwrap_err();
        clear_hook();
        assert_eq!(err.code(), "RUN_LOCKED");
        assert!(err.to_string().contains("a looker held the new owner record"), "{err}");
        assert!(!lock.exists());
        let held = locks.acquire(name, Duration::ZERO).unwrap();
        let owner: Owner = serde_json::from_slice(&fs::read(lock.join("owner.json")).unwrap()).unwrap();
        assert!(owner.flock && owner.token == held.token);
    }

    /// A record is judged by one open of it: one named `owner.json`, or replaced by the next
    /// taker's, between reading it and looking at its flock is not taken for an abandoned one.
    #[test]
    fn a_record_in_the_making_is_judged_by_the_file_that_was_read() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("lock");
        fs::create_dir(&lock).unwrap();
        let tmp = lock.join("owner.json.tmp");
        let body = serde_json::to_vec(&Owner {
            flock: true,
            ..Owner::me("lck_x")
        })
        .unwrap();
        let write = || {
            let f = fs::File::create(&tmp).unwrap();
            let flocked = process::lock_for_life(&f) == Some(true);
            fs::write(&tmp, &body).unwrap();
            (f, flocked)
        };
        let (holder, flocked) = write();
        if !flocked {
            return; // no flock on this file system
        }
        assert!(matches!(in_making(&tmp), InMaking::Held(Some(o)) if o.token == "lck_x"));

        // Named owner.json meanwhile: its taker still holds it.
        let (named, to) = (tmp.clone(), lock.join("owner.json"));
        set_hook(move |step| {
            if step == "in_making.read" {
                fs::rename(&named, &to)?;
            }
            Ok(())
        });
        assert!(matches!(in_making(&tmp), InMaking::Held(_)));
        clear_hook();

        // Released, and the next taker's record made (not flocked yet) in a directory of its own.
        fs::remove_file(lock.join("owner.json")).unwrap();
        let (holder2, _) = write();
        drop(holder);
        let mut holder2 = Some(holder2);
        let (old, next) = (lock.clone(), tmp.clone());
        set_hook(move |step| {
            if step == "in_making.read" {
                drop(holder2.take());
                fs::rename(&old, old.with_extension("released"))?;
                fs::create_dir(&old)?;
                fs::File::create(&next)?;
            }
            Ok(())
        });
        assert!(matches!(in_making(&tmp), InMaking::Unknown));
        clear_hook();

        // Let go of without being named: abandoned.
        fs::write(&tmp, &body).unwrap();
        assert!(matches!(in_making(&tmp), InMaking::Abandoned(o) if o.token == "lck_x"));
    }

    #[test]
    fn one_holder_at_a_time_and_release_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        for locks in [Locks::local(dir.path()).unwrap(), Locks::memory()] {
            let a = locks.acquire("run:run_a", Duration::ZERO).unwrap();
            let err = locks.acquire("run:run_a", Duration::from_millis(50)).unwrap_err();
            assert_eq!(err.code(), "RUN_LOCKED");
            assert!(locks.acquire("run:run_b", Duration::ZERO).is_ok());
            assert_eq!(
                locks.release("run:run_a", "lck_not_the_owner").unwrap_err().code(),
                "RUN_LOCKED"
            );
            locks.release("run:run_a", &a.token).unwrap();
            locks.release("run:run_a", &a.token).unwrap();
            let b = locks.acquire("run:run_a", Duration::ZERO).unwrap();
            assert_ne!(a.token, b.token);
        }
    }

    #[test]
    fn a_waiting_taker_gets_the_lock_when_it_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Arc::new(Locks::local(dir.path()).unwrap());
        let a = locks.acquire("run:run_w", Duration::ZERO).unwrap();
        let l2 = locks.clone();
        let waiter = std::thread::spawn(move || l2.acquire("run:run_w", Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(100));
        locks.release("run:run_w", &a.token).unwrap();
        assert!(waiter.join().unwrap().is_ok());
    }

    #[test]
    fn a_dead_owner_is_recovered_and_a_fresh_ownerless_lock_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::local(dir.path()).unwrap();
        dead_lock(dir.path(), "run:run_dead");
        let held = locks.acquire("run:run_dead", Duration::ZERO).unwrap();
        assert_ne!(held.token, "lck_dead");

        // A lock directory whose owner is not written yet is respected during the grace, and the
        // message says so (rather than "pid 0 (token )").
        let fresh = lock_dir(dir.path(), "run:run_fresh");
        fs::create_dir(&fresh).unwrap();
        let err = locks.acquire("run:run_fresh", Duration::ZERO).unwrap_err();
        assert_eq!(err.code(), "RUN_LOCKED");
        assert_eq!(
            err.to_string(),
            "run:run_fresh is locked by a taker that has not written its owner file yet"
        );
        let err = locks.release("run:run_fresh", "lck_x").unwrap_err();
        assert!(err.to_string().contains("not written its owner file yet"), "{err}");
        fs::write(fresh.join("owner.json"), b"{not json").unwrap();
        let err = locks.acquire("run:run_fresh", Duration::ZERO).unwrap_err();
        assert!(err.to_string().contains("owner file is unreadable"), "{err}");
        // After the grace it is presumed abandoned.
        backdate(&fresh, OWNER_GRACE + Duration::from_secs(1));
        locks.acquire("run:run_fresh", Duration::ZERO).unwrap();
        assert_eq!(leftovers(dir.path()), Vec::<String>::new());
    }

    /// A container restarted on its data directory often gets its old pid back: the locks its
    /// previous run held used to look held by a live process (itself) for as long as it ran.
    /// Now a flocked record is held exactly while its flock is.
    #[cfg(unix)]
    #[test]
    fn a_lock_is_held_while_its_owner_file_is_flocked_whatever_its_pid() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::local(dir.path()).unwrap();
        // This process's pid, as a restarted container's would be, but no flock held: gone.
        let owned_by = |name: &str, flock: bool| {
            let lock = lock_dir(dir.path(), name);
            fs::create_dir(&lock).unwrap();
            let owner = Owner {
                flock,
                ..Owner::me("lck_before")
            };
            fs::write(lock.join("owner.json"), serde_json::to_vec(&owner).unwrap()).unwrap();
        };
        owned_by("run:run_restarted", true);
        let held = locks.acquire("run:run_restarted", Duration::ZERO).unwrap();
        assert_ne!(held.token, "lck_before");
        let stored: Owner =
            serde_json::from_slice(&fs::read(lock_dir(dir.path(), "run:run_restarted").join("owner.json")).unwrap())
                .unwrap();
        assert!(stored.flock && stored.pid == std::process::id());
        // Held by this process: another world in it (its own open file) cannot take it.
        let other = Locks::local(dir.path()).unwrap();
        assert_eq!(
            other.acquire("run:run_restarted", Duration::ZERO).unwrap_err().code(),
            "RUN_LOCKED"
        );
        // A record of an earlier version (no flock) with a live pid: held, as before.
        owned_by("run:run_old_format", false);
        assert_eq!(
            locks.acquire("run:run_old_format", Duration::ZERO).unwrap_err().code(),
            "RUN_LOCKED"
        );

        // A world dropped without close no longer keeps its locks until the process exits.
        drop(locks);
        let held = other.acquire("run:run_restarted", Duration::ZERO).unwrap();
        other.release(&held.name, &held.token).unwrap();
        assert!(!lock_dir(dir.path(), "run:run_restarted").exists());
    }

    /// Someone else's recovery counts as holding the lock: the taker waits for it as usual.
    /// (A `.recovery` directory once made `try_take` recurse without end.)
    #[test]
    fn a_lock_another_taker_is_recovering_counts_as_held() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::local(dir.path()).unwrap();
        let name = "run:run_r";
        let lock = dead_lock(dir.path(), name);
        // Another taker recovering it holds the flock on its recovery-lock file.
        let recovering = fs::File::create(lock.with_extension("recovery-lock")).unwrap();
        if process::lock_for_life(&recovering) != Some(true) {
            return; // no flock on this file system
        }
        let err = locks.acquire(name, Duration::ZERO).unwrap_err();
        assert_eq!(err.code(), "RUN_LOCKED");
        assert!(
            err.to_string().contains("another taker is recovering the lock"),
            "{err}"
        );
        // waitMs is respected: the taker polls until its deadline.
        let started = Instant::now();
        let err = locks.acquire(name, Duration::from_millis(120)).unwrap_err();
        assert_eq!(err.code(), "RUN_LOCKED");
        assert!(started.elapsed() >= Duration::from_millis(120));
        drop(recovering);
        let held = locks.acquire(name, Duration::ZERO).unwrap();
        assert_ne!(held.token, "lck_dead");
    }

    /// A recoverer killed mid-recovery leaves its recovery-lock file unlocked: it blocks nobody,
    /// whatever its pid was (pid 1 exists in every container, and used to keep such a lock "live"
    /// forever). Recovery directories of earlier versions are not looked at.
    #[test]
    fn a_recovery_lock_left_by_a_killed_recoverer_blocks_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::local(dir.path()).unwrap();
        let lock = dead_lock(dir.path(), "run:run_k");
        fs::write(lock.with_extension("recovery-lock"), b"").unwrap();
        let old_format = lock.with_extension("recovery");
        fs::create_dir(&old_format).unwrap();
        let pid1 = Owner {
            pid: 1,
            ..Owner::me("lck_old")
        };
        fs::write(old_format.join("lck_old"), serde_json::to_vec(&pid1).unwrap()).unwrap();
        locks.acquire("run:run_k", Duration::ZERO).unwrap();
    }

    /// A taker that stalls past the grace while it writes its owner file (a paused container)
    /// holds the flock on that file: it is not taken for gone. And one whose lock was recovered
    /// meanwhile gives up without touching the next taker's lock.
    #[cfg(unix)]
    #[test]
    fn a_taker_stalled_while_writing_its_owner_keeps_or_cleanly_loses_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::local(dir.path()).unwrap();
        let writing = lock_dir(dir.path(), "run:run_w");
        fs::create_dir(&writing).unwrap();
        let tmp = fs::File::create(writing.join("owner.json.tmp")).unwrap();
        assert_eq!(process::lock_for_life(&tmp), Some(true));
        backdate(&writing, OWNER_GRACE * 2);
        let err = locks.acquire("run:run_w", Duration::ZERO).unwrap_err();
        assert!(err.to_string().contains("writing its owner file"), "{err}");
        drop(tmp);
        locks.acquire("run:run_w", Duration::ZERO).unwrap();

        // Stalled, and recovered meanwhile: the path now names the next taker's directory.
        let next = lock_dir(dir.path(), "run:run_s");
        let moved = dir.path().join("locks").join("moved-aside");
        let (next_hook, moved_hook) = (next.clone(), moved.clone());
        set_hook(move |step| {
            if step == "owner.write" {
                fs::rename(&next_hook, &moved_hook)?;
                fs::create_dir(&next_hook)?;
                fs::write(
                    next_hook.join("owner.json"),
                    b"{\"pid\":1,\"token\":\"lck_next\",\"createdAt\":\"x\"}",
                )?;
            }
            Ok(())
        });
        let err = locks.acquire("run:run_s", Duration::ZERO).unwrap_err();
        clear_hook();
        assert!(err.to_string().contains("recovered by another taker"), "{err}");
        let kept: Owner = serde_json::from_slice(&fs::read(next.join("owner.json")).unwrap()).unwrap();
        assert_eq!(kept.token, "lck_next");
    }

    /// Two releases of one lock at once (double release is a no-op, so callers may do it): the
    /// slower one must not remove the lock the next owner took in between.
    #[test]
    fn two_releases_at_once_cannot_remove_the_next_owners_lock() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Arc::new(Locks::local(dir.path()).unwrap());
        let name = "run:run_twice";
        let first = locks.acquire(name, Duration::ZERO).unwrap();
        let (checked_tx, checked_rx) = mpsc::channel();
        let slow = {
            let locks = locks.clone();
            let token = first.token.clone();
            std::thread::spawn(move || {
                // This release pauses between its owner check and its rename.
                set_hook(move |step| {
                    if step == "release.checked" {
                        let _ = checked_tx.send(());
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    Ok(())
                });
                locks.release(name, &token)
            })
        };
        checked_rx.recv().unwrap();
        locks.release(name, &first.token).unwrap();
        let next = locks.acquire(name, Duration::from_secs(5)).unwrap();
        slow.join().unwrap().unwrap();
        let owner = read_owner(&lock_dir(dir.path(), name)).unwrap();
        assert_eq!(
            owner.map(|o| o.token),
            Some(next.token),
            "the next owner's lock was removed"
        );
    }

    #[test]
    fn a_lock_whose_owner_cannot_be_written_or_synced_is_not_left_behind() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::local(dir.path()).unwrap();
        for step in ["owner.write", "owner.sync"] {
            set_hook(move |s| {
                if s == step {
                    Err(std::io::Error::other("injected"))
                } else {
                    Ok(())
                }
            });
            let err = locks.acquire("run:run_io", Duration::ZERO).unwrap_err();
            clear_hook();
            assert_eq!(err.code(), "WORLD_IO", "{step}");
            assert!(!lock_dir(dir.path(), "run:run_io").exists(), "{step}");
            assert_eq!(leftovers(dir.path()), Vec::<String>::new(), "{step}");
            let held = locks.acquire("run:run_io", Duration::ZERO).unwrap();
            locks.release("run:run_io", &held.token).unwrap();
        }
    }

    #[test]
    fn close_lets_go_of_held_locks_and_stops_waiting_takers() {
        let dir = tempfile::tempdir().unwrap();
        // Two worlds on one data directory.
        let a = Arc::new(Locks::local(dir.path()).unwrap());
        let b = Locks::local(dir.path()).unwrap();
        let x = a.acquire("run:run_x", Duration::ZERO).unwrap();
        let y = a.acquire("outer-loop:ol_y", Duration::ZERO).unwrap();
        let released = a.acquire("run:run_done", Duration::ZERO).unwrap();
        a.release("run:run_done", &released.token).unwrap();
        let z = b.acquire("run:run_z", Duration::ZERO).unwrap();
        let waiting = {
            let a = a.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                (a.acquire("run:run_z", Duration::from_secs(10)), started.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        a.close().unwrap();
        let (out, waited) = waiting.join().unwrap();
        assert_eq!(out.unwrap_err().code(), "WORLD_CLOSED");
        assert!(waited < Duration::from_secs(2), "waited {waited:?}");
        // The closed world's locks are free for others at once.
        b.acquire("run:run_x", Duration::ZERO).unwrap();
        b.acquire("outer-loop:ol_y", Duration::ZERO).unwrap();
        // Releasing them afterwards is the no-op a double release is, even now that b holds them.
        a.release("run:run_x", &x.token).unwrap();
        a.release("outer-loop:ol_y", &y.token).unwrap();
        a.release("run:run_done", &released.token).unwrap();
        assert!(read_owner(&lock_dir(dir.path(), "run:run_x")).unwrap().is_some());
        assert_eq!(
            a.acquire("run:run_n", Duration::ZERO).unwrap_err().code(),
            "WORLD_CLOSED"
        );
        b.release("run:run_z", &z.token).unwrap();

        // The same in memory.
        let m = Arc::new(Locks::memory());
        let held = m.acquire("run:run_m", Duration::ZERO).unwrap();
        let waiting = {
            let m = m.clone();
            std::thread::spawn(move || m.acquire("run:run_m", Duration::from_secs(10)))
        };
        std::thread::sleep(Duration::from_millis(100));
        m.close().unwrap();
        assert_eq!(waiting.join().unwrap().unwrap_err().code(), "WORLD_CLOSED");
        match &m.store {
            Store::Memory(map) => assert!(map.lock().unwrap().is_empty()),
            Store::Local { .. } => unreachable!(),
        }
        m.release("run:run_m", &held.token).unwrap();
        assert_eq!(
            m.acquire("run:run_m", Duration::ZERO).unwrap_err().code(),
            "WORLD_CLOSED"
        );
    }
}
