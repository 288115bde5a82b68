//! A libuv idle handle on Node's event loop: a callback that runs once per turn of the loop, after
//! its timers, while started (and keeps the loop from sleeping in the meantime).
//!
//! Node exports libuv for addons; its functions are looked up in the running process, so a
//! platform or runtime without them simply goes without (see [`Idle::new`]). The handle is not
//! referenced: it never keeps the process alive by itself.

use napi::sys;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

type UvIdleCb = unsafe extern "C" fn(handle: *mut c_void);
type UvCloseCb = unsafe extern "C" fn(handle: *mut c_void);

type HandleSize = unsafe extern "C" fn(c_int) -> usize;
type IdleInit = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;
type IdleStart = unsafe extern "C" fn(*mut c_void, UvIdleCb) -> c_int;
type IdleStop = unsafe extern "C" fn(*mut c_void) -> c_int;
type Unref = unsafe extern "C" fn(*mut c_void);
type Close = unsafe extern "C" fn(*mut c_void, Option<UvCloseCb>);

/// The libuv functions this needs.
struct Uv {
    handle_size: HandleSize,
    idle_init: IdleInit,
    idle_start: IdleStart,
    idle_stop: IdleStop,
    unref: Unref,
    close: Close,
}

/// `UV_IDLE` in libuv's `uv_handle_type`.
const UV_IDLE: c_int = 6;

fn uv() -> Option<&'static Uv> {
    static FOUND: OnceLock<Option<Uv>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            #[cfg(unix)]
            {
                // SAFETY: each name is looked up in the running process with RTLD_DEFAULT; when
                // present it is libuv's function of exactly the declared signature.
                unsafe {
                    let find = |name: &std::ffi::CStr| {
                        let f = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
                        (!f.is_null()).then_some(f)
                    };
                    Some(Uv {
                        handle_size: std::mem::transmute::<*mut c_void, HandleSize>(find(c"uv_handle_size")?),
                        idle_init: std::mem::transmute::<*mut c_void, IdleInit>(find(c"uv_idle_init")?),
                        idle_start: std::mem::transmute::<*mut c_void, IdleStart>(find(c"uv_idle_start")?),
                        idle_stop: std::mem::transmute::<*mut c_void, IdleStop>(find(c"uv_idle_stop")?),
                        unref: std::mem::transmute::<*mut c_void, Unref>(find(c"uv_unref")?),
                        close: std::mem::transmute::<*mut c_void, Close>(find(c"uv_close")?),
                    })
                }
            }
            #[cfg(not(unix))]
            {
                None
            }
        })
        .as_ref()
}

/// An idle handle; used on the JavaScript thread only.
pub struct Idle {
    handle: *mut c_void,
    started: bool,
}

// SAFETY: the handle is only touched on the JavaScript thread (callers guarantee it); the value
// merely lives inside state that other threads also reach.
unsafe impl Send for Idle {}

impl Idle {
    /// A stopped idle handle on `env`'s loop whose callback finds `data` with [`Idle::data`];
    /// `None` when libuv is not reachable.
    ///
    /// SAFETY: on the JavaScript thread with the `env` of the call in progress. `data` must stay
    /// valid until the handle is closed with [`Idle::close`] (dropping an `Idle` leaves the handle
    /// on the loop), and the handle is used on that thread only.
    pub unsafe fn new(env: sys::napi_env, data: *const c_void) -> Option<Idle> {
        let uv = uv()?;
        let mut event_loop = std::ptr::null_mut();
        if sys::napi_get_uv_event_loop(env, &mut event_loop) != sys::Status::napi_ok || event_loop.is_null() {
            return None;
        }
        // The handle's memory, 8-aligned; its first field is libuv's `void* data`.
        let words = (uv.handle_size)(UV_IDLE).div_ceil(8).max(1);
        let handle = Box::into_raw(vec![0u64; words].into_boxed_slice()).cast::<c_void>();
        if (uv.idle_init)(event_loop.cast(), handle) != 0 {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                handle.cast::<u64>(),
                words,
            )));
            return None;
        }
        *handle.cast::<*const c_void>() = data;
        (uv.unref)(handle);
        Some(Idle { handle, started: false })
    }

    /// The `data` given to [`Idle::new`], from the handle a callback receives.
    ///
    /// SAFETY: `handle` is one that [`Idle::new`] made and libuv has not yet freed, as the one
    /// passed to its callback is; its first word is that `data`.
    pub unsafe fn data(handle: *mut c_void) -> *const c_void {
        *handle.cast::<*const c_void>()
    }

    /// Run `cb` on each turn of the loop from now on; false if libuv refused.
    ///
    /// SAFETY: on the JavaScript thread, whose loop owns the handle. `cb` runs there with this
    /// handle until it is stopped or closed, and must be sound with the `data` it was made with.
    pub unsafe fn start(&mut self, cb: UvIdleCb) -> bool {
        if !self.started {
            if let Some(uv) = uv() {
                self.started = (uv.idle_start)(self.handle, cb) == 0;
            }
        }
        self.started
    }

    /// Stop running the callback.
    ///
    /// SAFETY: on the JavaScript thread, whose loop owns the handle.
    pub unsafe fn stop(&mut self) {
        if self.started {
            if let Some(uv) = uv() {
                (uv.idle_stop)(self.handle);
            }
            self.started = false;
        }
    }

    /// Close the handle; its memory is freed once libuv is done with it.
    ///
    /// SAFETY: on the JavaScript thread, whose loop owns the handle. Once closed, the callback no
    /// longer runs, and the `Idle` is consumed, so nothing uses the handle again.
    pub unsafe fn close(self) {
        if let Some(uv) = uv() {
            (uv.close)(self.handle, Some(free_handle));
        }
    }
}

/// libuv's close callback: frees a handle's memory.
///
/// SAFETY: libuv calls it once, on the loop's thread, after [`Idle::close`], with the handle that
/// [`Idle::new`] allocated (as many words as computed here); libuv no longer uses it.
unsafe extern "C" fn free_handle(handle: *mut c_void) {
    let words = uv().map_or(1, |uv| (uv.handle_size)(UV_IDLE).div_ceil(8).max(1));
    drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
        handle.cast::<u64>(),
        words,
    )));
}
