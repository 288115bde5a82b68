//! How work leaves the caller's thread and how its answers come back.
//!
//! The core never blocks its caller. Every operation is handed a [`Ticket`] (an opaque number the
//! binding maps to a promise), runs on a thread of the world's own, and reports back through a
//! [`Completer`], in batches where it can: a group commit completes all of its appends in one call.
//! Reads and file work run on a shared pool of named threads, never on the libuv pool.

use crate::core::error::Result;
use crossbeam_channel::{unbounded, Sender};
use std::sync::OnceLock;

/// Opaque identity of one pending operation, chosen by the caller.
pub type Ticket = u64;

/// What an operation produced.
#[derive(Debug)]
pub enum Output {
    /// Text: JSON for the caller to parse, or a string payload.
    Json(String),
    /// Raw bytes.
    Bytes(crate::core::bytes::Bytes),
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

/// Stack size of every thread the core starts: parsing and folding recurse through payloads up
/// to 1,000 levels deep.
pub const THREAD_STACK: usize = 16 * 1024 * 1024;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed set of threads for reads, folds and file I/O, shared by every world in the process.
pub struct Pool {
    tx: Sender<Job>,
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
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("little-world-io-{i}"))
                .stack_size(THREAD_STACK)
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        // A panicking job must not take the pool thread down with it.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .expect("spawning a pool thread");
        }
        Pool { tx }
    }

    /// Run `job` on the pool.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        // The pool's threads live as long as the process, so the channel never disconnects.
        let _ = self.tx.send(Box::new(job));
    }

    /// Run `work` on the pool and deliver its result to `completer` under `ticket`.
    pub fn run(
        &self,
        completer: std::sync::Arc<dyn Completer>,
        ticket: Ticket,
        work: impl FnOnce() -> Result<Output> + Send + 'static,
    ) {
        self.spawn(move || {
            let out =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|p| Err(panic_error(p)));
            completer.complete(vec![(ticket, out)]);
        });
    }
}

/// What a caught panic becomes: a `RuntimeIntegrity` error naming the panic's message. It takes
/// the box itself: a `&Box<dyn Any>` would coerce to a `&dyn Any` of the box, whose message
/// cannot be read (the pool's jobs once reported only "a thread panicked" that way).
pub fn panic_error(p: Box<dyn std::any::Any + Send>) -> crate::core::error::WorldError {
    crate::core::error::WorldError::RuntimeIntegrity {
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

    #[test]
    fn a_panicking_job_completes_with_its_panic_message() {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let collect = Arc::new(Collect(Mutex::new(Vec::new()), tx));
        Pool::global().run(collect.clone(), 7, || panic!("the job broke: {}", 42));
        rx.recv().unwrap();
        let done = collect.0.lock().unwrap();
        let (ticket, out) = &done[0];
        assert_eq!(*ticket, 7);
        let err = out.as_ref().unwrap_err();
        assert_eq!(err.code(), "RUNTIME_INTEGRITY");
        assert!(err.to_string().contains("the job broke: 42"), "{err}");
    }
}
