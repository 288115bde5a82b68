//! The vocabularies of `@little-workflow/world`, registered with its kernel: the event log's own
//! types ([`log_types`]), the run events of a sister engine ([`run_events`]), the Workflow SDK's
//! run statuses ([`sdk_runs`]), the credential screen ([`secrets`]), and the priced
//! materializer ([`materialize`]) a world is given to fold its runs with.
//!
//! This crate uses the kernel; the kernel never uses it.

#![deny(clippy::all)]

pub mod iso;
pub mod log_types;
pub mod materialize;
pub mod rules;
pub mod run_events;
pub mod sdk_runs;
pub mod secrets;

use little_world_kernel::vocabulary::Vocabulary;
use log_types::LogTypes;
use run_events::RunEvents;
use sdk_runs::SdkRuns;
use secrets::CredentialScreen;

/// Every vocabulary, in the order the kernel asks them: the run events first (a session's status
/// is theirs alone), then the event log's own types, the Workflow SDK's run statuses and the
/// credential screen.
pub fn all() -> Vec<&'static dyn Vocabulary> {
    vec![&RunEvents, &LogTypes, &SdkRuns, &CredentialScreen]
}

/// Register [`all`] with the kernel (once per process; later calls change nothing).
pub fn register() {
    little_world_kernel::vocabulary::register(all());
}
