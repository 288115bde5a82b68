//! Promises that the core's threads settle, a whole group at a time.
//!
//! Each world owns one N-API threadsafe function. A pending operation is a raw `napi_deferred`
//! whose address is the core's [`Ticket`]; when the core completes a group (a group commit is one
//! call), the group crosses to the JavaScript thread in a single threadsafe call, where every
//! promise in it is resolved or rejected. No libuv pool thread is involved and none waits.
//!
//! Under load, settling runs in bursts of about a millisecond: past that, groups wait until the
//! event loop has turned (a libuv idle handle tells), so timers and I/O keep their turns however
//! fast the writer commits. See [`Pacing`].
//!
//! The threadsafe function is referenced only while operations are in flight, so an idle world
//! never keeps the process alive, and a pending append always does.
//!
//! An operation started while nothing else is in flight may instead be waited for right here, for
//! a bounded few hundred microseconds: when the world's thread finishes it in time, the promise is
//! settled before the call returns, saving the wake-up of the JavaScript thread that a lone
//! awaited append would otherwise pay. Those settlements count in the bursts too, so a caller
//! awaiting one append after another still lets the loop turn. See [`JsCompleter::wait_briefly`].
//!
//! Node destroys every threadsafe function when its environment tears down, possibly before the
//! world that owns one is finalized, and a core thread may still be finishing work then. So the
//! function's liveness is a flag under a lock that every call and the release take: once Node's
//! finalizer has run, completions are dropped and the release is skipped.

use crate::idle::Idle;
use little_world_kernel::error::WorldError;
use little_world_kernel::runtime::{Completer, Output, Ticket};
use napi::sys;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// State shared by the completer, the JavaScript-thread callback and Node's finalizer.
struct Shared {
    /// The threadsafe function, or `None` once Node has finalized it.
    tsfn: Mutex<Option<Tsfn>>,
    /// Operations started and not yet settled (touched on the JavaScript thread only).
    in_flight: AtomicUsize,
    /// The one operation the JavaScript thread is waiting for in place, if any.
    waited: Mutex<Waited>,
    /// How settling shares the JavaScript thread with the rest of the event loop.
    pacing: Mutex<Pacing>,
}

/// Node runs a threadsafe function's queued calls in one go, and also the calls that arrive
/// while it runs them. Under load the writer commits the next group while the JavaScript thread
/// still settles the last, so timers and I/O could wait several milliseconds. Settling therefore
/// runs in bursts of at most [`BURST`] or [`BURST_SETTLEMENTS`]: past either, groups wait in
/// `stash`, and an idle handle (which runs once the loop has turned, after its timers) sends an
/// empty group through the threadsafe function to settle them in a new burst.
/// Touched on the JavaScript thread only.
#[derive(Default)]
struct Pacing {
    /// When the current burst began; the idle handle that ends it is started then.
    burst: Option<std::time::Instant>,
    /// Promises settled in the current burst.
    settled: usize,
    /// Past the budget: groups wait in `stash` until the loop has turned.
    yielding: bool,
    stash: std::collections::VecDeque<Batch>,
    /// `None` where libuv cannot be reached: then settling is not paced.
    idle: Option<Idle>,
}

/// The longest the JavaScript thread settles before letting the event loop turn.
const BURST: std::time::Duration = std::time::Duration::from_millis(1);
/// The most promises settled in one burst: their continuations run after each settling call
/// returns, partly outside what [`BURST`] measures.
const BURST_SETTLEMENTS: usize = 256;

/// The state of an operation waited for in place.
enum Waited {
    /// Nothing is waited for.
    None,
    /// The JavaScript thread waits for this ticket.
    Armed(Ticket),
    /// The ticket finished while waited for; its result is here.
    Done(Ticket, little_world_kernel::error::Result<Output>),
}

#[derive(Clone, Copy)]
struct Tsfn(sys::napi_threadsafe_function);

// SAFETY: N-API allows calling and releasing a threadsafe function from any thread; the lock
// around it keeps those calls from racing Node's finalizer.
unsafe impl Send for Tsfn {}

impl Shared {
    fn tsfn(&self) -> Option<Tsfn> {
        *self.tsfn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The core's view of a world's promises.
pub struct JsCompleter {
    shared: Arc<Shared>,
}

type Batch = Vec<(Ticket, little_world_kernel::error::Result<Output>)>;

/// Run an N-API call and turn a failed status into an error. Used only on the JavaScript thread,
/// with the `env` of the call in progress.
macro_rules! check {
    ($e:expr, $what:expr) => {{
        // SAFETY: every use passes the current call's `env` and pointers to locals that outlive
        // the call, on the JavaScript thread.
        let status = unsafe { $e };
        if status != sys::Status::napi_ok {
            return Err(napi::Error::from_reason(format!(
                "{} failed (napi status {status})",
                $what
            )));
        }
    }};
}

impl JsCompleter {
    /// Create the completer of one world. Must run on the JavaScript thread.
    pub fn new(env: sys::napi_env) -> napi::Result<JsCompleter> {
        let shared = Arc::new(Shared {
            tsfn: Mutex::new(None),
            in_flight: AtomicUsize::new(0),
            waited: Mutex::new(Waited::None),
            pacing: Mutex::new(Pacing::default()),
        });
        // One reference belongs to the threadsafe function and is dropped by its finalizer.
        let for_tsfn = Arc::into_raw(shared.clone()) as *mut c_void;
        let mut name = ptr::null_mut();
        let label = "little-workflow-world";
        check!(
            sys::napi_create_string_utf8(env, label.as_ptr().cast(), label.len() as isize, &mut name),
            "naming the completion channel"
        );
        let mut tsfn = ptr::null_mut();
        check!(
            sys::napi_create_threadsafe_function(
                env,
                ptr::null_mut(),
                ptr::null_mut(),
                name,
                0,
                1,
                for_tsfn,
                Some(finalize),
                for_tsfn,
                Some(call_js),
                &mut tsfn,
            ),
            "creating the completion channel"
        );
        *shared.tsfn.lock().expect("fresh lock") = Some(Tsfn(tsfn));
        // The idle handle finds the shared state through its data pointer; the threadsafe
        // function's finalizer closes the handle before releasing that state.
        // SAFETY: `env` is the current call's, on the JavaScript thread, and the pointer stays
        // valid until that finalizer (which holds its own reference to `shared`) has run.
        shared.pacing.lock().expect("fresh lock").idle = unsafe { Idle::new(env, Arc::as_ptr(&shared).cast()) };
        check!(
            sys::napi_unref_threadsafe_function(env, tsfn),
            "unreferencing the completion channel"
        );
        Ok(JsCompleter { shared })
    }

    /// Create a promise for a new operation; returns its ticket and the promise.
    pub fn begin(&self, env: sys::napi_env) -> napi::Result<(Ticket, sys::napi_value)> {
        let mut deferred = ptr::null_mut();
        let mut promise = ptr::null_mut();
        check!(
            sys::napi_create_promise(env, &mut deferred, &mut promise),
            "creating a promise"
        );
        if self.shared.in_flight.fetch_add(1, Ordering::Relaxed) == 0 {
            if let Some(Tsfn(tsfn)) = self.shared.tsfn() {
                check!(
                    sys::napi_ref_threadsafe_function(env, tsfn),
                    "referencing the completion channel"
                );
            }
        }
        Ok((deferred as usize as Ticket, promise))
    }

    /// Whether the operation just begun is the only one in flight, so it may be waited for in
    /// place.
    pub fn alone(&self) -> bool {
        self.shared.in_flight.load(Ordering::Relaxed) == 1
    }

    /// Whether the current burst of settling has room for one more promise (see [`Pacing`]).
    pub fn has_room(&self) -> bool {
        self.shared.pacing().has_room()
    }

    /// Arm the in-place wait for `ticket`, before its work is submitted.
    pub fn arm(&self, ticket: Ticket) {
        *self.shared.waited.lock().unwrap_or_else(|p| p.into_inner()) = Waited::Armed(ticket);
    }

    /// Wait up to `budget` for the armed ticket to finish, spinning on the JavaScript thread. If it
    /// finished, settle its promise now and return true; otherwise disarm, so the result arrives
    /// through the threadsafe function as usual, and return false.
    ///
    /// A promise settled in place counts in the current burst (see [`Pacing`]): a caller awaiting
    /// one append after another would otherwise never let the loop turn. Past the burst, a
    /// finished ticket waits with the groups for the loop to turn, and true is returned too.
    pub fn wait_briefly(&self, env: sys::napi_env, ticket: Ticket, budget: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + budget;
        loop {
            let mut waited = self.shared.waited.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(&*waited, Waited::Done(t, _) if *t == ticket) {
                let Waited::Done(_, result) = std::mem::replace(&mut *waited, Waited::None) else {
                    unreachable!()
                };
                drop(waited);
                let mut pacing = self.shared.pacing();
                if !pacing.has_room() {
                    pacing.stash.push_back(vec![(ticket, result)]);
                    return true;
                }
                // SAFETY: `wait_briefly` runs on the JavaScript thread, where the call that
                // submitted `ticket` is.
                unsafe { pacing.count(1) };
                drop(pacing);
                self.settle_now(env, ticket, result);
                return true;
            }
            if std::time::Instant::now() >= deadline {
                *waited = Waited::None;
                return false;
            }
            drop(waited);
            std::hint::spin_loop();
        }
    }

    /// Settle a ticket right away on the JavaScript thread (an error found before any work).
    pub fn settle_now(&self, env: sys::napi_env, ticket: Ticket, result: little_world_kernel::error::Result<Output>) {
        // SAFETY: called on the JavaScript thread with the current call's `env`, for a ticket
        // `begin` made and nothing else settles.
        unsafe { settle_batch(env, &self.shared, vec![(ticket, result)]) };
    }
}

impl Completer for JsCompleter {
    fn complete(&self, mut done: Batch) {
        if done.is_empty() {
            return;
        }
        if done.len() == 1 {
            let mut waited = self.shared.waited.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(&*waited, Waited::Armed(t) if *t == done[0].0) {
                let (ticket, result) = done.pop().expect("one result");
                *waited = Waited::Done(ticket, result);
                return;
            }
        }
        self.shared.send(done);
    }
}

impl Shared {
    /// Send a group to the JavaScript thread (an empty one resumes settling what waited).
    fn send(&self, batch: Batch) {
        let guard = self.tsfn.lock().unwrap_or_else(|p| p.into_inner());
        let Some(Tsfn(tsfn)) = *guard else {
            return; // Node has torn the environment down; nobody is left to settle these.
        };
        let data = Box::into_raw(Box::new(batch));
        // SAFETY: `tsfn` is alive while the guard is held (Node's finalizer clears it under the
        // same lock), and N-API may be called from any thread for a threadsafe function.
        let status = unsafe {
            sys::napi_call_threadsafe_function(tsfn, data.cast(), sys::ThreadsafeFunctionCallMode::nonblocking)
        };
        drop(guard);
        if status != sys::Status::napi_ok {
            // The environment is shutting down; nobody is left to settle these promises.
            // SAFETY: the call failed, so `call_js` never received `data`, which is still ours.
            drop(unsafe { Box::from_raw(data) });
        }
    }

    fn pacing(&self) -> std::sync::MutexGuard<'_, Pacing> {
        self.pacing.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for JsCompleter {
    fn drop(&mut self) {
        let guard = self.shared.tsfn.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Tsfn(tsfn)) = *guard {
            // SAFETY: the function is alive (the lock is held and Node has not finalized it),
            // and this completer's reference is released once, here.
            unsafe { sys::napi_release_threadsafe_function(tsfn, sys::ThreadsafeFunctionReleaseMode::release) };
        }
    }
}

/// Node's finalizer of the threadsafe function.
///
/// SAFETY: Node calls it once, on the JavaScript thread, with the `Shared` reference that
/// `JsCompleter::new` gave the function (`Arc::into_raw`), which is taken back here. The idle
/// handle, whose data is that `Shared`, is closed before the reference is dropped.
unsafe extern "C" fn finalize(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    let shared = Arc::from_raw(data.cast::<Shared>());
    *shared.tsfn.lock().unwrap_or_else(|p| p.into_inner()) = None;
    let idle = shared.pacing().idle.take();
    if let Some(idle) = idle {
        idle.close();
    }
}

/// The threadsafe function's call: settles a group sent by [`Shared::send`].
///
/// SAFETY: Node calls it on the JavaScript thread, once per queued call, with `data` the
/// `Box<Batch>` that `send` gave up (owned here from now on) and `context` the function's
/// `Shared`, alive until `finalize`, which runs after every queued call. A null `env` (the
/// environment tearing down) only drops the group.
unsafe extern "C" fn call_js(env: sys::napi_env, _cb: sys::napi_value, context: *mut c_void, data: *mut c_void) {
    let batch = *Box::from_raw(data.cast::<Batch>());
    if env.is_null() {
        return;
    }
    let shared = &*context.cast::<Shared>();
    if batch.is_empty() {
        resume(env, shared);
        return;
    }
    {
        let mut pacing = shared.pacing();
        if pacing.yielding || !pacing.stash.is_empty() {
            pacing.stash.push_back(batch);
            return;
        }
    }
    settle_paced(env, shared, batch);
}

/// Settle a group within the current burst, beginning one if none is running; past the burst's
/// budget, the groups after it wait for the loop to turn.
///
/// SAFETY: as for [`settle_batch`], and on the JavaScript thread, which owns the idle handle.
unsafe fn settle_paced(env: sys::napi_env, shared: &Shared, batch: Batch) {
    shared.pacing().count(batch.len());
    settle_batch(env, shared, batch);
}

impl Pacing {
    /// Count `n` settlements in the current burst, beginning one if none is running; past the
    /// burst's budget, what comes after waits for the loop to turn.
    ///
    /// # Safety
    /// On the JavaScript thread, which owns the idle handle.
    unsafe fn count(&mut self, n: usize) {
        let Some(idle) = &mut self.idle else {
            return;
        };
        match self.burst {
            None if !idle.start(on_turn) => {
                // Nothing would end the burst: settle unpaced from now on.
                if let Some(idle) = self.idle.take() {
                    idle.close();
                }
            }
            None => {
                self.burst = Some(std::time::Instant::now());
                self.settled = 0;
            }
            Some(_) if self.spent() => self.yielding = true,
            Some(_) => {}
        }
        self.settled += n;
    }

    /// Whether one more promise may be settled in the current burst (or a new one begun).
    fn has_room(&mut self) -> bool {
        if self.idle.is_none() {
            return true;
        }
        if self.yielding || !self.stash.is_empty() {
            return false;
        }
        if self.burst.is_some() && self.spent() {
            // The idle handle started with the burst ends it once the loop has turned.
            self.yielding = true;
            return false;
        }
        true
    }

    fn spent(&self) -> bool {
        self.burst.is_some_and(|start| start.elapsed() >= BURST) || self.settled >= BURST_SETTLEMENTS
    }
}

/// The idle handle: the loop has turned (its timers have run) since the burst began.
///
/// SAFETY: libuv calls it on the loop's thread, the JavaScript thread, with the handle
/// `JsCompleter::new` made, whose data is the world's `Shared`: `finalize` closes the handle
/// before releasing the function's reference, so that `Shared` outlives every call.
unsafe extern "C" fn on_turn(handle: *mut c_void) {
    let shared = &*Idle::data(handle).cast::<Shared>();
    let waiting = {
        let mut pacing = shared.pacing();
        if let Some(idle) = &mut pacing.idle {
            idle.stop();
        }
        pacing.burst = None;
        pacing.yielding || !pacing.stash.is_empty()
    };
    if waiting {
        // Settling needs a napi_env, which a threadsafe call has.
        shared.send(Vec::new());
    }
}

/// Settle what waited, in order, in a new burst.
///
/// SAFETY: as for [`settle_paced`]; every group stashed holds tickets no one else settles.
unsafe fn resume(env: sys::napi_env, shared: &Shared) {
    {
        let mut pacing = shared.pacing();
        pacing.yielding = false;
        pacing.burst = None;
    }
    loop {
        let batch = {
            let mut pacing = shared.pacing();
            if pacing.yielding {
                break;
            }
            match pacing.stash.pop_front() {
                Some(batch) => batch,
                None => break,
            }
        };
        settle_paced(env, shared, batch);
    }
}

/// Resolve or reject each ticket's promise, and unreference the function once none is in
/// flight.
///
/// SAFETY: on the JavaScript thread with the `env` of the call in progress. Each ticket is a
/// `napi_deferred` that [`JsCompleter::begin`] made and that is settled nowhere else: settling it
/// here consumes it.
unsafe fn settle_batch(env: sys::napi_env, shared: &Shared, batch: Batch) {
    let n = batch.len();
    for (ticket, result) in batch {
        let mut scope = ptr::null_mut();
        sys::napi_open_handle_scope(env, &mut scope);
        let deferred = ticket as usize as sys::napi_deferred;
        match result.and_then(|out| to_js(env, out)) {
            Ok(value) => {
                sys::napi_resolve_deferred(env, deferred, value);
            }
            Err(e) => {
                sys::napi_reject_deferred(env, deferred, error_value(env, &e));
            }
        }
        sys::napi_close_handle_scope(env, scope);
    }
    if shared.in_flight.fetch_sub(n, Ordering::Relaxed) == n {
        if let Some(Tsfn(tsfn)) = shared.tsfn() {
            sys::napi_unref_threadsafe_function(env, tsfn);
        }
    }
}

/// A JavaScript value for `out`; its bytes, if any, go to an external `Buffer`, which owns them
/// from then on.
///
/// SAFETY: on the JavaScript thread with the `env` of the call in progress, inside a handle scope
/// that the returned value belongs to.
unsafe fn to_js(env: sys::napi_env, out: Output) -> little_world_kernel::error::Result<sys::napi_value> {
    let mut value = ptr::null_mut();
    let status = match out {
        Output::Json(s) => sys::napi_create_string_utf8(env, data_of(&s), s.len() as isize, &mut value),
        Output::Bytes(bytes) if bytes.is_empty() => {
            let mut data = ptr::null_mut();
            sys::napi_create_buffer(env, 0, &mut data, &mut value)
        }
        Output::Bytes(bytes) if bytes.len() > MAX_BUFFER_LEN => {
            // Node would refuse it, but only after calling the finalizer (freeing the bytes),
            // so it must not be offered at all.
            return Err(WorldError::RuntimeIntegrity {
                reason: format!(
                    "a result of {} bytes is larger than a Node.js Buffer may be ({MAX_BUFFER_LEN} bytes)",
                    bytes.len()
                ),
            });
        }
        Output::Bytes(bytes) => {
            // Hand the bytes to JavaScript without copying; the finalizer drops our reference.
            let len = bytes.len();
            let data = bytes.as_ptr() as *mut c_void;
            let hint = Box::into_raw(Box::new(bytes));
            let status = sys::napi_create_external_buffer(env, len, data, Some(drop_bytes), hint.cast(), &mut value);
            if status != sys::Status::napi_ok {
                drop(Box::from_raw(hint));
            }
            status
        }
        Output::List(items) => {
            let status = sys::napi_create_array_with_length(env, items.len(), &mut value);
            if status == sys::Status::napi_ok {
                for (i, item) in items.into_iter().enumerate() {
                    let v = to_js(env, item)?;
                    sys::napi_set_element(env, value, i as u32, v);
                }
            }
            status
        }
        Output::Unit => sys::napi_get_undefined(env, &mut value),
    };
    if status != sys::Status::napi_ok {
        return Err(WorldError::RuntimeIntegrity {
            reason: format!("converting a result for JavaScript failed (napi status {status}); it may be too large"),
        });
    }
    Ok(value)
}

fn data_of(s: &str) -> *const std::ffi::c_char {
    s.as_ptr().cast()
}

/// The largest Buffer Node 20 makes (`buffer.constants.MAX_LENGTH`, 4 GiB; later versions allow
/// more). Given a longer external buffer, Node calls its finalizer and then fails, so a caller
/// that frees the bytes on failure would free them twice.
const MAX_BUFFER_LEN: usize = 1 << 32;

/// The finalizer of an external `Buffer` made by [`to_js`].
///
/// SAFETY: Node calls it once, when the buffer is let go of, with `hint` the `Box<Bytes>` that
/// `to_js` gave up and whose memory the buffer used; JavaScript no longer reaches those bytes.
unsafe extern "C" fn drop_bytes(_env: sys::napi_env, _data: *mut c_void, hint: *mut c_void) {
    drop(Box::from_raw(hint.cast::<little_world_kernel::bytes::Bytes>()));
}

/// A JavaScript `Error` for `e`, with `code` and a JSON `details` string for `world.ts`.
///
/// SAFETY: on the JavaScript thread with the `env` of the call in progress, inside a handle scope
/// that the returned value belongs to.
pub unsafe fn error_value(env: sys::napi_env, e: &WorldError) -> sys::napi_value {
    let mut code = ptr::null_mut();
    let mut msg = ptr::null_mut();
    let mut details = ptr::null_mut();
    let mut err = ptr::null_mut();
    let c = e.code();
    let m = e.to_string();
    let d = e.details().to_string();
    sys::napi_create_string_utf8(env, c.as_ptr().cast(), c.len() as isize, &mut code);
    sys::napi_create_string_utf8(env, m.as_ptr().cast(), m.len() as isize, &mut msg);
    sys::napi_create_string_utf8(env, d.as_ptr().cast(), d.len() as isize, &mut details);
    sys::napi_create_error(env, code, msg, &mut err);
    sys::napi_set_named_property(env, err, c"details".as_ptr(), details);
    err
}
