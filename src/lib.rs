//! `@little-workflow/world`'s binding: converts values between JavaScript and the kernel
//! (`little_world_kernel`) and its vocabularies (`little_world_vocabularies`), and wraps their
//! calls for Node.js. No rules live here.
//!
//! Payloads cross as JSON text in both directions; `world.ts` does `JSON.stringify` on the way
//! in and `JSON.parse` on the way out, which is several times faster than building objects field
//! by field through N-API.

#![deny(clippy::all)]
// napi-derive registers the exports only outside `cargo test`.
#![cfg_attr(test, allow(dead_code))]

mod completion;
mod functions;
mod idle;
mod world;

use little_world_kernel::error::WorldError;
use napi::{sys, Env, Status};

/// Register the package's vocabularies with the kernel when the addon loads, before any world
/// opens.
#[napi_derive::module_init]
fn init() {
    little_world_vocabularies::register();
}

/// Throw `e` as a JavaScript error carrying its `code` and `details`.
pub(crate) fn throw(env: &Env, e: &WorldError) -> napi::Error {
    // SAFETY: `env` is the current call's, on the JavaScript thread.
    unsafe {
        let value = completion::error_value(env.raw(), e);
        sys::napi_throw(env.raw(), value);
    }
    napi::Error::from_status(Status::PendingException)
}

/// Run `f`, turning a panic into the core's error for it (an internal `RuntimeIntegrity`), so that
/// no panic unwinds into Node, which would end the process.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, WorldError>) -> Result<T, WorldError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(little_world_kernel::runtime::panic_error(p)))
}

/// A JavaScript value made by raw N-API calls, handed back as is.
pub struct RawValue(sys::napi_value);

impl napi::bindgen_prelude::ToNapiValue for RawValue {
    /// SAFETY: napi-rs calls it on the JavaScript thread to return a value from the call in
    /// progress; the value was made in that call (a promise from `JsCompleter::begin`), so it is
    /// still valid in its handle scope.
    unsafe fn to_napi_value(_env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        Ok(val.0)
    }
}

/// Keep this library loaded once a JavaScript environment has loaded it. Node unloads an addon
/// loaded only by a worker thread when that worker exits, while the threads this library starts
/// for the whole process (its I/O pool) still run its code: the next worker to load it crashed the process (SIGSEGV), as a test runner's thread pool does.
/// Marked `RTLD_NODELETE`, it stays mapped until the process ends.
#[cfg(unix)]
#[napi_derive::module_init]
fn stay_loaded() {
    // SAFETY: dladdr reads the loader's record of the object holding this function, and dlopen
    // with RTLD_NOLOAD only takes another reference to that already-loaded object (marking it
    // never to be unloaded); on any failure nothing changes but that the library may be unloaded.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        let me = stay_loaded as *const () as *const libc::c_void;
        if libc::dladdr(me, &mut info) != 0 && !info.dli_fname.is_null() {
            libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE);
        }
    }
}
