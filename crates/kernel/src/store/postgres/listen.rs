//! Word of other processes' commits, through `LISTEN` on the schema's channel.
//!
//! One connection per world listens, on the runtime, for as long as the world is open and
//! someone has asked. Each writer's commit is followed by a `NOTIFY` naming its streams (see the
//! module above); the listener hands those names to whoever waits ([`Announcer::next`]). A
//! notification is only a wake-up: readers then read their streams by sequence, or ask what
//! changed, so one that is lost (the connection went, the server restarted) delays a reader until
//! its next poll and loses nothing. After each reconnection the waiters are told that anything
//! may have changed, since notifications sent meanwhile are gone.

use crate::pg::Db;
use crate::store::Announcer;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::AsyncMessage;

type Done = Box<dyn FnOnce(Option<Vec<String>>) + Send>;

type Waiters = Arc<Mutex<HashMap<u64, Done>>>;

pub struct Listener {
    waiters: Waiters,
    /// The runtime the listener and the waiters' timers run on.
    runtime: tokio::runtime::Handle,
    next_id: AtomicU64,
    stopped: AtomicBool,
    stop: tokio::sync::Notify,
}

impl Listener {
    /// Start listening for `db`'s commits.
    pub fn start(db: Arc<Db>) -> Arc<Listener> {
        let runtime = db.block_on(async { tokio::runtime::Handle::current() });
        let listener = Arc::new(Listener {
            waiters: Arc::new(Mutex::new(HashMap::new())),
            runtime: runtime.clone(),
            next_id: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            stop: tokio::sync::Notify::new(),
        });
        let me = listener.clone();
        runtime.spawn(async move { me.run(db).await });
        listener
    }

    /// Stop listening; waiters are told at once that anything may have changed.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.stop.notify_waiters();
        self.announce(Vec::new());
    }

    fn announce(&self, streams: Vec<String>) {
        let waiting: Vec<Done> = self
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, d)| d)
            .collect();
        for done in waiting {
            done(Some(streams.clone()));
        }
    }

    async fn run(self: Arc<Listener>, db: Arc<Db>) {
        let mut first = true;
        while !self.stopped.load(Ordering::Acquire) {
            let (config, tls) = db.config();
            if let Ok((client, mut connection)) = config.connect(tls.clone()).await {
                let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                let sql = format!("LISTEN \"{}\"", db.channel());
                let listen = client.batch_execute(&sql);
                // The LISTEN's answer arrives through the connection, which is read below.
                let mut listen = std::pin::pin!(listen);
                let mut listening = false;
                loop {
                    tokio::select! {
                        _ = self.stop.notified() => return,
                        done = &mut listen, if !listening => {
                            if done.is_err() {
                                break;
                            }
                            listening = true;
                            if !first {
                                self.announce(Vec::new());
                            }
                            first = false;
                        }
                        message = messages.next() => match message {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                let streams = n.payload().split('\n').filter(|s| !s.is_empty()).map(str::to_string).collect();
                                self.announce(streams);
                            }
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => break,
                        },
                    }
                }
            }
            tokio::select! {
                _ = self.stop.notified() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }
}

impl Announcer for Listener {
    fn next(&self, timeout: Duration, done: Done) {
        if self.stopped.load(Ordering::Acquire) {
            done(Some(Vec::new()));
            return;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.waiters.lock().unwrap_or_else(|p| p.into_inner()).insert(id, done);
        let waiters = self.waiters.clone();
        self.runtime.spawn(async move {
            tokio::time::sleep(timeout).await;
            let done = waiters.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            if let Some(done) = done {
                done(None);
            }
        });
    }
}
