//! The columns of a group's writes, borrowed from what its transaction staged: one array per
//! column, for one statement per table (`unnest`).

use super::{apply, PgTx};
use crate::catalog::StatusChange;
use std::collections::{HashMap, HashSet};

/// The columns of the group's writes, borrowed from the staged rows.
#[allow(clippy::type_complexity)]
pub(in crate::store::postgres) struct Writes<'a> {
    pub events: (
        Vec<&'a str>,
        Vec<i64>,
        Vec<&'a str>,
        Vec<&'a str>,
        Vec<Option<&'a str>>,
        Vec<Option<&'a str>>,
        Vec<&'a str>,
        Vec<&'a str>,
    ),
    pub terminals: (Vec<&'a str>, Vec<&'a str>, Vec<i64>, Vec<&'a str>),
    pub estimates: (Vec<&'a str>, Vec<&'a str>, Vec<i64>),
    /// Index entries set: index, key, value, stream, sequence.
    pub index_set: (Vec<&'a str>, Vec<&'a str>, Vec<&'a str>, Vec<&'a str>, Vec<i64>),
    /// Index entries removed: index, key.
    pub index_removed: (Vec<&'a str>, Vec<&'a str>),
    /// Each stream written to: its last sequence, its last `recordedAt`, its token counts, the
    /// change of its status, and the last sequence the group started after.
    pub runs: Vec<(&'a str, u64, &'a str, [u64; 4], StatusChange, u64)>,
    /// The `recordedAt` of each stream's first row in the group (an import's rows differ in it).
    pub first_recorded: Vec<&'a str>,
}

impl Writes<'_> {
    #[allow(clippy::type_complexity)]
    /// The streams' rows as columns; a change of status as the status it sets, `''` for one that
    /// moves a pending stream to running, and null for none; last, the sequence each stream's
    /// group started after.
    pub fn run_columns(
        &self,
    ) -> (
        Vec<&str>,
        Vec<i64>,
        Vec<&str>,
        Vec<i64>,
        Vec<i64>,
        Vec<i64>,
        Vec<i64>,
        Vec<Option<&str>>,
        Vec<i64>,
    ) {
        let mut out = (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        );
        for (run, last, at, usage, status, after) in &self.runs {
            out.8.push(*after as i64);
            out.7.push(match status.parts() {
                (Some(set), _) => Some(set),
                (None, true) => Some(""),
                (None, false) => None,
            });
            out.0.push(*run);
            out.1.push(*last as i64);
            out.2.push(*at);
            out.3.push(usage[0] as i64);
            out.4.push(usage[1] as i64);
            out.5.push(usage[2] as i64);
            out.6.push(usage[3] as i64);
        }
        out
    }
}

impl PgTx<'_> {
    /// The group's writes, as columns.
    pub fn writes(&self) -> Writes<'_> {
        let mut w = Writes {
            events: Default::default(),
            terminals: Default::default(),
            estimates: Default::default(),
            index_set: Default::default(),
            index_removed: Default::default(),
            runs: Vec::new(),
            first_recorded: Vec::new(),
        };
        let mut runs: HashMap<&str, usize> = HashMap::new();
        for r in &self.rows {
            let e = &mut w.events;
            e.0.push(&r.run_id);
            e.1.push(r.sequence as i64);
            e.2.push(&r.event_id);
            e.3.push(&r.event_type);
            e.4.push(r.key.as_deref());
            e.5.push(r.digest.as_deref());
            e.6.push(&r.recorded_at);
            e.7.push(&r.envelope);
            let at = *runs.entry(&r.run_id).or_insert_with(|| {
                let known = &self.known.runs[&r.run_id];
                w.runs
                    .push((&r.run_id, 0, "", known.usage, StatusChange::Keep, known.last));
                w.first_recorded.push(&r.recorded_at);
                w.runs.len() - 1
            });
            w.runs[at].1 = r.sequence;
            w.runs[at].2 = &r.recorded_at;
        }
        for c in self.catalog.writes() {
            if let Some(&at) = runs.get(c.run_id.as_str()) {
                w.runs[at].4 = c.status;
            }
        }
        for (run, tokens) in &self.usage {
            if let Some(&at) = runs.get(run.as_str()) {
                let usage = &mut w.runs[at].3;
                *usage = std::array::from_fn(|i| usage[i].saturating_add(tokens[i]));
            }
        }
        for (run, node, sequence, event_type) in &self.terminals {
            let t = &mut w.terminals;
            t.0.push(run);
            t.1.push(node);
            t.2.push(*sequence as i64);
            t.3.push(event_type);
        }
        let mut open: Vec<((&str, &str), u64)> = Vec::new();
        for (run, model, amount, released) in &self.estimates {
            let key = (run.as_str(), model.as_str());
            match open.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => *v = apply(*v, *amount, *released),
                None => {
                    let stored = self
                        .known
                        .estimates
                        .get(run)
                        .and_then(|m| m.get(model))
                        .copied()
                        .unwrap_or(0);
                    open.push((key, apply(stored, *amount, *released)));
                }
            }
        }
        for ((run, model), value) in open {
            w.estimates.0.push(run);
            w.estimates.1.push(model);
            w.estimates.2.push(value as i64);
        }
        // Each entry's last write is the one that stands.
        let mut seen = HashSet::new();
        for e in self.index.iter().rev() {
            if !seen.insert((&e.index, &e.key)) {
                continue;
            }
            match &e.value {
                Some(value) => {
                    let s = &mut w.index_set;
                    s.0.push(&e.index);
                    s.1.push(&e.key);
                    s.2.push(value);
                    s.3.push(&e.run_id);
                    s.4.push(e.sequence as i64);
                }
                None => {
                    w.index_removed.0.push(&e.index);
                    w.index_removed.1.push(&e.key);
                }
            }
        }
        w
    }
}
