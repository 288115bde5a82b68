//! `@little-workflow/world`: the durable storage layer of a TypeScript workflow runtime.
//!
//! [`core`] holds every rule and all storage, with no napi anywhere in it; [`napi`] only converts
//! values and wraps core calls for JavaScript.

#![deny(clippy::all)]

pub mod core;
// napi-derive registers the exports only outside `cargo test`.
#[cfg_attr(test, allow(dead_code))]
mod napi;

/// Rust's allocations in this library (not Node's) come from mimalloc: appends allocate on one
/// thread and free on another, which glibc's arenas handle with locks and consolidation passes.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
