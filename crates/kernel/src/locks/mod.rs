//! Run and outer-loop locks: fencing across processes, over a backend that keeps them.
//!
//! [`Locks`] holds the rules every world keeps: a lock's name (`run:<runId>`,
//! `outer-loop:<outerLoopId>`), a fresh unguessable token per owner, taking it with a wait
//! (polling the backend until the holder lets go or the wait runs out, then `RunLockedError`),
//! letting go only by the token that owns it, and remembering the locks it handed out:
//! [`Locks::close`] (the world's close) lets go of them, and a taker still waiting then gives up
//! with `WorldError::Closed`. A [`LockStore`] answers one attempt at a time: `local` keeps lock
//! directories in the data directory, fenced by `flock`s; `memory` a map.

pub mod local;
pub mod postgres;
pub mod r#virtual;

use crate::clock;
use crate::error::{Result, WorldError};
use crate::ids::sha256_hex;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::io::ErrorKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// How often a waiting taker tries again.
const POLL: Duration = Duration::from_millis(20);

/// Who holds a lock, as stored in `owner.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub pid: u32,
    pub token: String,
    pub created_at: String,
    /// Whether the owner holds an `flock` on this very file for as long as it holds the lock
    /// (see [`crate::process`]): then the lock is held exactly while that flock is, whatever the pid
    /// means here. Absent in records of earlier versions, and where the file system has no
    /// flock: then the pid is all there is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flock: bool,
}

impl Owner {
    /// This process, holding `token` from now.
    pub(super) fn me(token: &str) -> Owner {
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
pub struct Busy {
    pub(super) pid: u32,
    pub(super) holder: String,
}

impl Busy {
    pub(super) fn of(owner: &Owner) -> Busy {
        Busy {
            pid: owner.pid,
            // Not the token: whoever reads the message could release the lock with it.
            holder: format!("by pid {} since {}", owner.pid, owner.created_at),
        }
    }

    /// A taker that is writing its owner record (which says who it is once it is written).
    pub(super) fn writing(owner: Option<&Owner>) -> Busy {
        Busy {
            pid: owner.map_or(0, |o| o.pid),
            holder: match owner {
                Some(o) => format!("by pid {}, which is writing its owner file", o.pid),
                None => "by a taker that is writing its owner file".into(),
            },
        }
    }

    /// A lock directory whose `owner.json` could not be read.
    pub(super) fn unknown(e: &std::io::Error) -> Busy {
        let holder = if e.kind() == ErrorKind::NotFound {
            "by a taker that has not written its owner file yet".to_string()
        } else {
            format!("by an owner whose owner file is unreadable ({e})")
        };
        Busy { pid: 0, holder }
    }

    /// A stale holder another taker is removing.
    pub(super) fn being_recovered(self) -> Busy {
        Busy {
            holder: format!("{}, presumed gone: another taker is recovering the lock", self.holder),
            ..self
        }
    }

    pub(super) fn error(self, name: &str) -> WorldError {
        WorldError::RunLocked {
            name: name.to_string(),
            owner_pid: self.pid,
            holder: self.holder,
        }
    }
}

/// What a backend gives a taker to keep for as long as it holds a lock (the local store's open,
/// flocked `owner.json`), dropped after the lock is let go of; `None` when there is nothing.
pub type Keep = Option<Box<dyn Send>>;

/// One attempt at a lock: `Ok` when it is now the taker's, with what to keep; else who holds it.
pub type Attempt = std::result::Result<Keep, Busy>;

/// Where a world's locks are kept: one attempt at a time, the waiting and bookkeeping being
/// [`Locks`]'.
pub trait LockStore: Send + Sync {
    /// One attempt at taking `name` for the owner `token`: a holder that is gone is recovered.
    fn try_take(&self, name: &str, token: &str) -> Result<Attempt>;
    /// Let go of `name` if `token` holds it. A lock that is free is a no-op; one another token
    /// holds is refused with `RunLockedError`.
    fn let_go(&self, name: &str, token: &str) -> Result<()>;
}

/// The locks of a world, kept by its backend, and the ones it handed out.
pub struct Locks {
    store: Box<dyn LockStore>,
    handed: Mutex<Handed>,
}

/// What a world's locks remember of their own.
#[derive(Default)]
struct Handed {
    /// Set by [`Locks::close`]: nothing more is handed out.
    closed: bool,
    /// Locks handed out and not seen released: name → token, and what the backend gave to keep
    /// while held (dropped only after the lock is let go of).
    held: HashMap<String, (String, Keep)>,
    /// `(name, token)` of the locks `close` let go of: releasing one afterwards is a no-op.
    released_at_close: HashSet<(String, String)>,
}

impl Locks {
    /// The locks `store` keeps.
    pub fn new(store: impl LockStore + 'static) -> Locks {
        Locks {
            store: Box::new(store),
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
            match self.store.try_take(name, &token)? {
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
    fn hand_out(&self, name: &str, token: String, owner_file: Keep) -> Result<Held> {
        let mut handed = self.handed();
        if handed.closed {
            drop(handed);
            self.store.let_go(name, &token)?;
            drop(owner_file);
            return Err(WorldError::Closed);
        }
        handed.held.insert(name.to_string(), (token.clone(), owner_file));
        Ok(Held {
            name: name.to_string(),
            token,
        })
    }

    /// Whether this world handed out `name` with `token` and it has not been released.
    pub fn holds(&self, name: &str, token: &str) -> bool {
        self.handed().held.get(name).is_some_and(|(t, _)| t == token)
    }

    /// Let go of a lock. Letting go of a lock that is already free is a no-op; a token that does
    /// not own a held lock is refused with `RunLockedError`. Works after [`Locks::close`] too: a
    /// lock close let go of is then already free.
    pub fn release(&self, name: &str, token: &str) -> Result<()> {
        let key = (name.to_string(), token.to_string());
        if self.handed().released_at_close.contains(&key) {
            return Ok(());
        }
        self.store.let_go(name, token)?;
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
        let held: Vec<(String, (String, Keep))> = {
            let mut handed = self.handed();
            handed.closed = true;
            handed.held.drain().collect()
        };
        let mut first_error = None;
        for (name, (token, owner_file)) in held {
            match self.store.let_go(&name, &token) {
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
}
