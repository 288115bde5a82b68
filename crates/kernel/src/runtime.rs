//! How work leaves the caller's thread and how its answers come back.
//!
//! The core never blocks its caller. Every operation is handed a [`Ticket`] (an opaque number the
//! binding maps to a promise), runs on a thread of the world's own, and reports back through a
//! [`Completer`], in batches where it can: a group commit completes all of its appends in one call.
//! Reads and file work run on a shared pool of named threads, never on the libuv pool.

use crate::error::{Result, WorldError};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Opaque identity of one pending operation, chosen by the caller.
pub type Ticket = u64;

/// What an operation produced.
#[derive(Debug)]
pub enum Output {
    /// Text: JSON for the caller to parse, or a string payload.
    Json(String),
    /// Raw bytes.
    Bytes(crate::bytes::Bytes),
    /// Several results, in order.
    List(Vec<Output>),
    /// Nothing (the operation only had an effect).
    Unit,
}

/// Receives finished operations. Implementations must be cheap and must not block.
pub trait Completer: Send + Sync {
    /// Deliver a group of finished operations.
    fn complete(&self, done: Vec<(Ticket, Result<Output>)>);
}

/// The small tokio runtime every world's network I/O runs on: PostgreSQL connections and
/// object-store requests. Started on first use.
pub fn io_runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("little-world-net")
                .thread_stack_size(THREAD_STACK)
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| WorldError::Path {
            message: format!("the world's network threads could not be started: {e}"),
        })
}

/// Stack size of every thread the core starts: parsing and folding recurse through payloads up
/// to 1,000 levels deep.
pub const THREAD_STACK: usize = 16 * 1024 * 1024;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Start a thread of the core, named `name`, with [`THREAD_STACK`]. A process at its thread
/// limit (a container's pids limit, systemd's `TasksMax`) cannot start one: that is an error of
/// the operation that wanted the thread, never a panic, which would abort the process.
pub fn start_thread<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    may_start_thread()?;
    std::thread::Builder::new()
        .name(name.to_string())
        .stack_size(THREAD_STACK)
        .spawn(f)
}

/// [`start_thread`] within `scope`, for work split over two threads: a caller that cannot start
/// one does the work on its own thread instead.
pub fn start_scoped<'scope, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    name: &str,
    f: impl FnOnce() -> T + Send + 'scope,
) -> std::io::Result<std::thread::ScopedJoinHandle<'scope, T>> {
    may_start_thread()?;
    std::thread::Builder::new()
        .name(name.to_string())
        .stack_size(THREAD_STACK)
        .spawn_scoped(scope, f)
}

#[cfg(any(test, feature = "testing"))]
thread_local! {
    /// Of this thread's next thread starts: how many succeed, then how many fail.
    static FAILING_STARTS: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// Let the calling thread's next `ok` thread starts succeed and the `failing` after them fail
/// with `EAGAIN`, as the kernel's do at a process's thread limit.
#[cfg(any(test, feature = "testing"))]
pub fn fail_thread_starts(ok: usize, failing: usize) {
    FAILING_STARTS.with(|f| f.set((ok, failing)));
}

fn may_start_thread() -> std::io::Result<()> {
    #[cfg(any(test, feature = "testing"))]
    {
        let (ok, failing) = FAILING_STARTS.with(|f| f.get());
        if ok > 0 {
            FAILING_STARTS.with(|f| f.set((ok - 1, failing)));
        } else if failing > 0 {
            FAILING_STARTS.with(|f| f.set((0, failing - 1)));
            return Err(std::io::Error::from_raw_os_error(libc::EAGAIN));
        }
    }
    Ok(())
}

/// A fixed set of threads for reads, folds and file I/O, shared by every world in the process.
/// They are started on first use; should the process be at its thread limit then, the next use
/// tries again, and work waits only when none could be started.
pub struct Pool {
    tx: Sender<Job>,
    rx: Receiver<Job>,
    started: AtomicUsize,
    starting: Mutex<()>,
    threads: usize,
}

impl Pool {
    /// The process-wide pool.
    pub fn global() -> &'static Pool {
        static POOL: OnceLock<Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let n = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(2, 8);
            Pool::new(n)
        })
    }

    fn new(threads: usize) -> Pool {
        let (tx, rx) = unbounded::<Job>();
        Pool {
            tx,
            rx,
            started: AtomicUsize::new(0),
            starting: Mutex::new(()),
            threads,
        }
    }

    /// Start the threads not started yet. An error only when not one is running.
    fn start_threads(&self) -> Result<()> {
        if self.started.load(Ordering::Acquire) >= self.threads {
            return Ok(());
        }
        let _starting = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        while self.started.load(Ordering::Acquire) < self.threads {
            let rx = self.rx.clone();
            let i = self.started.load(Ordering::Acquire);
            let started = start_thread(&format!("little-world-io-{i}"), move || {
                while let Ok(job) = rx.recv() {
                    // A panicking job must not take the pool thread down with it.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            });
            match started {
                Ok(_) => self.started.fetch_add(1, Ordering::AcqRel),
                Err(_) if i > 0 => return Ok(()),
                Err(e) => return Err(WorldError::io("starting an I/O thread", None, e)),
            };
        }
        Ok(())
    }

    /// Run `job` on the pool.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) -> Result<()> {
        self.start_threads()?;
        // The pool's threads live as long as the process, so the channel never disconnects.
        let _ = self.tx.send(Box::new(job));
        Ok(())
    }

    /// Run `work` on the pool and deliver its result to `completer` under `ticket`.
    pub fn run(
        &self,
        completer: std::sync::Arc<dyn Completer>,
        ticket: Ticket,
        work: impl FnOnce() -> Result<Output> + Send + 'static,
    ) -> Result<()> {
        self.spawn(move || {
            let out =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|p| Err(panic_error(p)));
            completer.complete(vec![(ticket, out)]);
        })
    }
}

/// What a caught panic becomes: a `RuntimeIntegrity` error naming the panic's message. It takes
/// the box itself: a `&Box<dyn Any>` would coerce to a `&dyn Any` of the box, whose message
/// cannot be read (the pool's jobs once reported only "a thread panicked" that way).
pub fn panic_error(p: Box<dyn std::any::Any + Send>) -> WorldError {
    WorldError::RuntimeIntegrity {
        reason: format!("internal error: {}", panic_message(&*p)),
    }
}

/// The message of a caught panic.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a thread panicked".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    struct Collect(Mutex<Vec<(Ticket, Result<Output>)>>, crossbeam_channel::Sender<()>);

    impl Completer for Collect {
        fn complete(&self, done: Vec<(Ticket, Result<Output>)>) {
            self.0.lock().unwrap().extend(done);
            let _ = self.1.send(());
        }
    }

    /// A completer that keeps what it is given, and a receiver told of each completion.
    fn collecting() -> (Arc<Collect>, crossbeam_channel::Receiver<()>) {
        let (tx, rx) = crossbeam_channel::bounded(2);
        (Arc::new(Collect(Mutex::new(Vec::new()), tx)), rx)
    }

    #[test]
    fn a_panicking_job_completes_with_its_panic_message() {
        let (collect, rx) = collecting();
        Pool::global()
            .run(collect.clone(), 7, || panic!("the job broke: {}", 42))
            .unwrap();
        rx.recv().unwrap();
        let done = collect.0.lock().unwrap();
        let (ticket, out) = &done[0];
        assert_eq!(*ticket, 7);
        let err = out.as_ref().unwrap_err();
        assert_eq!(err.code(), "RUNTIME_INTEGRITY");
        assert!(err.to_string().contains("the job broke: 42"), "{err}");
    }

    #[test]
    fn a_pool_that_cannot_start_a_thread_fails_the_work_and_tries_again_later() {
        let (collect, rx) = collecting();
        let pool = Pool::new(2);
        fail_thread_starts(0, usize::MAX);
        let err = pool.run(collect.clone(), 1, || Ok(Output::Unit)).unwrap_err();
        assert_eq!(err.code(), "WORLD_IO");
        assert!(err.to_string().contains("starting an I/O thread"), "{err}");
        assert_eq!(pool.started.load(Ordering::Acquire), 0);
        fail_thread_starts(0, 0);
        pool.run(collect.clone(), 2, || Ok(Output::Unit)).unwrap();
        rx.recv().unwrap();
        assert_eq!(collect.0.lock().unwrap()[0].0, 2);
        assert_eq!(pool.started.load(Ordering::Acquire), 2);
    }

    #[test]
    fn a_pool_runs_with_the_threads_it_could_start() {
        let (collect, rx) = collecting();
        let pool = Pool::new(3);
        fail_thread_starts(1, usize::MAX);
        pool.run(collect.clone(), 1, || Ok(Output::Unit)).unwrap();
        rx.recv().unwrap();
        assert_eq!(pool.started.load(Ordering::Acquire), 1);
        fail_thread_starts(0, 0);
        pool.run(collect.clone(), 2, || Ok(Output::Unit)).unwrap();
        rx.recv().unwrap();
        assert_eq!(pool.started.load(Ordering::Acquire), 3);
    }
}
