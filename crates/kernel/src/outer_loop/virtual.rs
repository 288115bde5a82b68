//! The outer-loop manifests of a virtual world: canonical texts in a map.

use super::{unpoisoned, ManifestStore};
use crate::error::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Manifests kept in memory, by id; one mutex serializes every write.
#[derive(Default)]
pub struct VirtualManifests {
    texts: Mutex<HashMap<String, String>>,
    turn: Arc<Mutex<()>>,
}

impl VirtualManifests {
    /// No manifest stored.
    pub fn new() -> VirtualManifests {
        VirtualManifests::default()
    }
}

impl ManifestStore for VirtualManifests {
    fn place(&self, id: &str) -> String {
        format!("{id} (in memory)")
    }

    fn load(&self, id: &str) -> Result<Option<Vec<u8>>> {
        Ok(unpoisoned(&self.texts).get(id).map(|t| t.as_bytes().to_vec()))
    }

    fn publish(&self, id: &str, text: &str, first: bool) -> Result<bool> {
        let mut texts = unpoisoned(&self.texts);
        if first && texts.contains_key(id) {
            return Ok(false);
        }
        texts.insert(id.to_string(), text.to_string());
        Ok(true)
    }

    fn turn(&self, _id: &str) -> Arc<Mutex<()>> {
        self.turn.clone()
    }
}
