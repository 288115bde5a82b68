//! `@little-workflow/world`: the durable storage layer of a TypeScript workflow runtime.
//!
//! [`core`] holds every rule and all storage, with no napi anywhere in it; [`napi`] only converts
//! values and wraps core calls for JavaScript.

#![deny(clippy::all)]

pub mod core;
// napi-derive registers the exports only outside `cargo test`.
#[cfg_attr(test, allow(dead_code))]
mod napi;
