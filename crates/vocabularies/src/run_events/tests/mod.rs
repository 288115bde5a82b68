//! Tests of the run-event vocabulary across files: every type's valid and invalid drafts, the
//! stream split, the stored read, the cost restore and the fold.

mod costs;
mod fold;
mod kernel;
mod support;
mod validation;
