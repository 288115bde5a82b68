//! Field paths for error messages: `payload.a[3].b`, `payload["odd key"]`.
//!
//! Walks push and pop borrowed segments as they descend, and only format a path when they have
//! something to report, so a clean walk allocates nothing.

use crate::canonical::string_literal;
use std::fmt::Write;

/// One step into a JSON value.
#[derive(Debug, Clone, Copy)]
pub enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// A path under construction, rooted at a name such as `payload`.
#[derive(Debug)]
pub struct JsonPath<'a> {
    root: &'a str,
    segs: Vec<Seg<'a>>,
}

impl<'a> JsonPath<'a> {
    /// A path at `root`.
    pub fn new(root: &'a str) -> Self {
        JsonPath { root, segs: Vec::new() }
    }

    /// Descend into `seg`.
    pub fn push(&mut self, seg: Seg<'a>) {
        self.segs.push(seg);
    }

    /// Come back up one step.
    pub fn pop(&mut self) {
        self.segs.pop();
    }

    /// The path as text.
    pub fn render(&self) -> String {
        render(self.root, &self.segs)
    }

    /// The path as text with one more key at the end.
    pub fn render_with(&self, key: &str) -> String {
        let mut s = self.render();
        push_key(&mut s, key);
        s
    }
}

/// Format a root and segments as `root.a[3]["b c"]`.
pub fn render(root: &str, segs: &[Seg<'_>]) -> String {
    let mut s = String::from(root);
    for seg in segs {
        match seg {
            Seg::Key(k) => push_key(&mut s, k),
            Seg::Index(i) => {
                let _ = write!(s, "[{i}]");
            }
        }
    }
    s
}

/// Append `.key`, or `["key"]` when the key is not a plain identifier.
pub fn push_key(s: &mut String, key: &str) {
    if is_identifier(key) {
        s.push('.');
        s.push_str(key);
    } else {
        s.push('[');
        s.push_str(&string_literal(key));
        s.push(']');
    }
}

/// Join a dotted field name (`response.usage.inputTokens`) onto a root.
pub fn dotted(root: &str, field: &str) -> String {
    let mut s = String::from(root);
    for part in field.split('.') {
        push_key(&mut s, part);
    }
    s
}

fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '$')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_javascript_access() {
        let segs = [Seg::Key("a"), Seg::Index(3), Seg::Key("b c"), Seg::Key("_x1")];
        assert_eq!(render("payload", &segs), "payload.a[3][\"b c\"]._x1");
        assert_eq!(
            dotted("payload", "response.usage.inputTokens"),
            "payload.response.usage.inputTokens"
        );
    }
}
