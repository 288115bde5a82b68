//! The vocabularies this package registers with the kernel, in the order it asks them.

use crate::core::log_types::LogTypes;
use crate::core::run_events::RunEvents;
use crate::core::sdk_runs::SdkRuns;
use crate::core::secrets::CredentialScreen;
use crate::core::vocabulary::Vocabulary;

/// Every vocabulary: the run events first (a session's status is theirs alone), then the event
/// log's own types, the Workflow SDK's run statuses and the credential screen.
pub fn all() -> Vec<&'static dyn Vocabulary> {
    vec![&RunEvents, &LogTypes, &SdkRuns, &CredentialScreen]
}

/// Register [`all`] with the kernel (once per process; later calls change nothing).
pub fn register() {
    crate::core::vocabulary::register(all());
}
