//! The locks of a virtual world: owners in a map.

use super::{Attempt, Busy, LockStore, Owner};
use crate::error::Result;
use std::collections::HashMap;
use std::sync::Mutex;

/// Locks kept in memory, by name.
#[derive(Default)]
pub struct VirtualLocks {
    owners: Mutex<HashMap<String, Owner>>,
}

impl VirtualLocks {
    /// No lock held.
    pub fn new() -> VirtualLocks {
        VirtualLocks::default()
    }
}

impl LockStore for VirtualLocks {
    fn try_take(&self, name: &str, token: &str) -> Result<Attempt> {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(owner) = owners.get(name) {
            return Ok(Err(Busy::of(owner)));
        }
        owners.insert(name.to_string(), Owner::me(token));
        Ok(Ok(None))
    }

    fn let_go(&self, name: &str, token: &str) -> Result<()> {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        match owners.get(name) {
            None => Ok(()),
            Some(o) if o.token == token => {
                owners.remove(name);
                Ok(())
            }
            Some(o) => Err(Busy::of(o).error(name)),
        }
    }
}
