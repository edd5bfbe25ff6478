//! A run's outputs that are never written down: the sensitive values its steps produced,
//! held in memory by producing step and key and passed to their consumers only.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use rdeploy_adapters::outputs::OutputValue;
use rdeploy_adapters::secrets::Secret;

/// Sensitive output values by producing step and key, held in memory only.
pub type SensitiveOutputs = Arc<Mutex<HashMap<String, BTreeMap<String, Secret>>>>;

/// Keeps what a step's `Outputs` event says in the vault: its sensitive values by key; a key
/// that is plain now is no longer sensitive.
pub fn keep(vault: &SensitiveOutputs, step: &str, values: &BTreeMap<String, OutputValue>) {
    let mut vault = vault.lock().unwrap_or_else(|e| e.into_inner());
    let mine = vault.entry(step.to_string()).or_default();
    for (key, value) in values {
        match value {
            OutputValue::Plain(_) => {
                mine.remove(key);
            }
            OutputValue::Sensitive(secret) => {
                mine.insert(key.clone(), secret.clone());
            }
        }
    }
}
