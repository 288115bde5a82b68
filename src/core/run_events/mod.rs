//! The run-event vocabulary of seed `004_*` (a sister engine's `RunEvent` / `SessionEvent`).
