//! The kernel of `@little-workflow/world`: an append-only event log over SQLite, PostgreSQL or
//! a virtual store in memory, with its artifacts, locks and outer loops, knowing no event type by name.
//!
//! `canonical` and `ids` define the bytes and the names; `events` the append rules; `store` the
//! backends those rules are written over; `world` the threads that serve one world. What an event
//! of a type means (its fields, whether it ends a run, what it costs) is a vocabulary's, asked
//! through [`vocabulary::Vocabulary`]: the kernel loops over the vocabularies a process registers
//! and names none of them.

#![deny(clippy::all)]

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
pub mod numbers;
pub mod outer_loop;
pub mod pg;
pub mod process;
pub mod runtime;
pub mod store;
pub mod verify;
pub mod vocabulary;
pub mod world;
