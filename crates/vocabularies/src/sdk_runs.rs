//! The Workflow SDK's run events as `@little-workflow/world/vercel` stores them
//! (`workflow.run_created`, ...): the world checks no field of them (the SDK's World does), and
//! the runs catalog takes a run's status from them.

use little_world_kernel::catalog::StatusChange;
use little_world_kernel::vocabulary::Vocabulary;
use serde_json::{Map, Value};

/// The Workflow SDK's run statuses, as the runs catalog asks them.
pub struct SdkRuns;

/// It knows no type, so holds no append to rules of its own: the SDK's World has checked the
/// event.
impl Vocabulary for SdkRuns {
    fn status_change(&self, _stream_id: &str, t: &str, _payload: &Map<String, Value>) -> Option<StatusChange> {
        let status = match t {
            "workflow.run_created" => "pending",
            "workflow.run_started" => "running",
            "workflow.run_completed" => "completed",
            "workflow.run_failed" => "failed",
            "workflow.run_cancelled" => "cancelled",
            _ => return None,
        };
        Some(StatusChange::Set(status))
    }
}
