//! The backends' last known health, kept in the state dir so a restarted
//! daemon starts from it: a restart never sends a new connection to a
//! backend that was down, nor holds one back that was up.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{BackendHealth, BackendKey};

pub(crate) const SAVED_FILE: &str = "backend-health.json";
/// A file larger than this is not read (it is not one hostmesh wrote).
const MAX_SAVED_BYTES: u64 = 256 << 20;

#[derive(Serialize, Deserialize)]
struct Saved {
    backends: Vec<(BackendKey, BackendHealth)>,
}

/// The saved states, if any; an unreadable or corrupt file is an error
/// the caller logs (and starts without).
pub(crate) fn load(state_dir: &Path) -> io::Result<BTreeMap<BackendKey, BackendHealth>> {
    let saved: Option<Saved> = crate::state::read_saved_json(&state_dir.join(SAVED_FILE), MAX_SAVED_BYTES)?;
    Ok(saved.map(|s| s.backends.into_iter().collect()).unwrap_or_default())
}

pub(crate) fn save(state_dir: &Path, states: &BTreeMap<BackendKey, BackendHealth>) -> io::Result<()> {
    let saved = Saved { backends: states.iter().map(|(k, v)| (k.clone(), v.clone())).collect() };
    crate::state::save_json(&state_dir.join(SAVED_FILE), &saved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Health;

    #[test]
    fn saved_states_load_back_and_a_missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_empty());
        let key = BackendKey { service: "web".into(), backend: "10.0.1.1:80".parse().unwrap() };
        let states = BTreeMap::from([(key, BackendHealth::new(Health::Down, 7))]);
        save(dir.path(), &states).unwrap();
        assert_eq!(load(dir.path()).unwrap(), states);
        std::fs::write(dir.path().join(SAVED_FILE), "{").unwrap();
        assert!(load(dir.path()).unwrap_err().to_string().contains(SAVED_FILE));
    }
}
