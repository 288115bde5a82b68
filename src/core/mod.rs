//! The pure core of the world: no napi below this line.
//!
//! `canonical` and `ids` define the bytes and the names; `events` the append rules; `store` the
//! backends those rules are written over; `world` the threads that serve one data directory.

pub mod archive;
pub mod artifacts;
pub mod bytes;
pub mod canonical;
pub mod catalog;
pub mod clock;
pub mod durable;
pub mod error;
pub mod events;
pub mod files;
pub mod ids;
pub mod json_path;
pub mod locks;
pub mod log_types;
pub mod materialize;
pub mod numbers;
pub mod outer_loop;
pub mod pg;
pub mod process;
pub mod run_events;
pub mod runtime;
pub mod sdk_runs;
pub mod secrets;
pub mod store;
pub mod verify;
pub mod vocabularies;
pub mod vocabulary;
pub mod world;
