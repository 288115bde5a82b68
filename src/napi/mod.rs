//! The binding: converts values and wraps core calls for JavaScript. No rules live here.
//!
//! Payloads cross as JSON text in both directions; `world.ts` does `JSON.stringify` on the way
//! in and `JSON.parse` on the way out, which is several times faster than building objects field
//! by field through N-API.

mod completion;
mod functions;
mod idle;
mod world;

use crate::core::error::WorldError;
use napi::{sys, Env, Status};

/// Throw `e` as a JavaScript error carrying its `code` and `details`.
pub(crate) fn throw(env: &Env, e: &WorldError) -> napi::Error {
    unsafe {
        let value = completion::error_value(env.raw(), e);
        sys::napi_throw(env.raw(), value);
    }
    napi::Error::from_status(Status::PendingException)
}

/// A JavaScript value made by raw N-API calls, handed back as is.
pub struct RawValue(sys::napi_value);

impl napi::bindgen_prelude::ToNapiValue for RawValue {
    unsafe fn to_napi_value(_env: sys::napi_env, val: Self) -> napi::Result<sys::napi_value> {
        Ok(val.0)
    }
}
