//! Test support for adapter tests: a default [`StepContext`] rooted at a directory
//! ([`step_context`]), and an [`EventSink`] that records what an adapter reports and folds it
//! with the driver's own sub-change fold ([`crate::fold`]), so a test can feed `recover` a
//! realistic [`PriorStep`]. Used by the unit tests, by `adapters/tests/*` and by the binary's
//! tests.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use crate::fold::{fold_sub_change, SubChangeEvent, SubChangeFields};
use crate::{Event, EventSink, PriorStep, PriorSubChange, StepContext, SubStatus};

/// A step `step` of stack `test` rooted at `dir` (its stack directory), working in `dir/work`,
/// with no cache, no `env`, no time limit, no `--force`, no secrets and a fresh cancellation
/// token. A test sets what it varies over it:
/// `StepContext { env, timeout: Some(t), ..step_context(dir) }`, so a field added to
/// [`StepContext`] needs its default here only.
pub fn step_context(dir: &Path) -> StepContext {
    StepContext {
        step: "step".into(),
        stack: "test".into(),
        stack_dir: dir.to_path_buf(),
        work_dir: dir.join("work"),
        cache_dir: None,
        env: BTreeMap::new(),
        timeout: None,
        cancel: Default::default(),
        processes: Default::default(),
        force: false,
        reapply_missing: false,
        secrets: Default::default(),
        started_by: Default::default(),
    }
}

/// Records every event; output lines are kept apart from sub-change events.
#[derive(Default)]
pub struct Recorder {
    events: Mutex<Vec<Event>>,
    output: Mutex<Vec<String>>,
}

impl EventSink for Recorder {
    fn emit(&self, event: Event) {
        match event {
            Event::Output { line, .. } => self.output.lock().unwrap_or_else(|e| e.into_inner()).push(line),
            event => self.events.lock().unwrap_or_else(|e| e.into_inner()).push(event),
        }
    }
}

impl Recorder {
    /// Every event but output lines, in order.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The tool's output lines, in order.
    pub fn output(&self) -> Vec<String> {
        self.output.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Ids of the sub-change events of one kind, sorted (a sub-change may appear twice).
    pub fn ids_with(&self, wanted: SubStatus) -> Vec<String> {
        let mut ids: Vec<String> = self
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Started { id } => Some((id, SubStatus::Started)),
                Event::Done { id, .. } | Event::InPlace { id, .. } => Some((id, SubStatus::Done)),
                Event::Failed { id, .. } => Some((id, SubStatus::Failed)),
                Event::Pending { id, .. } => Some((id, SubStatus::Pending)),
                _ => None,
            })
            .filter(|(_, status)| *status == wanted)
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        ids
    }

    pub fn started(&self) -> Vec<String> {
        self.ids_with(SubStatus::Started)
    }

    pub fn done(&self) -> Vec<String> {
        self.ids_with(SubStatus::Done)
    }

    /// Ids reported in place (not applied), sorted.
    pub fn in_place(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::InPlace { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        ids.sort();
        ids
    }

    pub fn failed(&self) -> Vec<String> {
        self.ids_with(SubStatus::Failed)
    }

    pub fn pending(&self) -> Vec<String> {
        self.ids_with(SubStatus::Pending)
    }

    /// `(id, error)` of every failure, in order.
    pub fn failures(&self) -> Vec<(String, String)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Failed { id, error } => Some((id, error)),
                _ => None,
            })
            .collect()
    }

    /// The error of the first failure of `id`.
    pub fn error_of(&self, id: &str) -> Option<String> {
        self.failures().into_iter().find(|(i, _)| i == id).map(|(_, error)| error)
    }

    /// Every `Planned` list, in order.
    pub fn planned(&self) -> Vec<Vec<String>> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Planned { ids } => Some(ids),
                _ => None,
            })
            .collect()
    }

    pub fn warnings(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Warning { message } => Some(message),
                _ => None,
            })
            .collect()
    }

    /// Every output reported, the last value of each key.
    pub fn outputs(&self) -> crate::outputs::Outputs {
        let mut out = crate::outputs::Outputs::new();
        for event in self.events() {
            if let Event::Outputs { values } = event {
                out.extend(values);
            }
        }
        out
    }

    /// The last value recorded for a fact.
    pub fn fact(&self, key: &str) -> Option<serde_json::Value> {
        self.events().into_iter().rev().find_map(|e| match e {
            Event::Fact { key: k, value } if k == key => Some(value),
            _ => None,
        })
    }

    /// What the checkpoint would hold after these events, folded as the driver does: the last
    /// word on each sub-change, in the order they first appeared, and the latest facts.
    pub fn prior(&self) -> PriorStep {
        type Fields = (SubStatus, Option<String>, Option<String>, bool);
        let mut order: Vec<String> = Vec::new();
        let mut state: BTreeMap<String, Fields> = BTreeMap::new();
        let mut facts = BTreeMap::new();
        fn fold(order: &mut Vec<String>, state: &mut BTreeMap<String, Fields>, id: &str, event: SubChangeEvent<'_>) {
            if !order.iter().any(|o| o == id) {
                order.push(id.to_string());
            }
            let (status, error, note, in_place) =
                state.entry(id.to_string()).or_insert((SubStatus::Pending, None, None, false));
            fold_sub_change(SubChangeFields { status, error, note, in_place }, event);
        }
        let (o, st) = (&mut order, &mut state);
        for event in self.events() {
            match &event {
                Event::Planned { ids } => ids.iter().for_each(|id| fold(o, st, id, SubChangeEvent::Planned)),
                Event::Started { id } => fold(o, st, id, SubChangeEvent::Started),
                Event::Done { id, note } => fold(o, st, id, SubChangeEvent::Done { note: note.as_deref() }),
                Event::InPlace { id, note } => fold(o, st, id, SubChangeEvent::InPlace { note: note.as_deref() }),
                Event::Failed { id, error } => fold(o, st, id, SubChangeEvent::Failed { error }),
                Event::Pending { id, reason } => fold(o, st, id, SubChangeEvent::Pending { reason }),
                Event::Moved { from, to } => {
                    if let Some(old) = st.remove(from) {
                        let at = o.iter().position(|id| id == from);
                        if st.contains_key(to) {
                            o.retain(|id| id != from);
                        } else {
                            st.insert(to.clone(), old);
                            if let Some(at) = at {
                                o[at] = to.clone();
                            }
                        }
                    }
                }
                Event::Fact { key, value } => {
                    facts.insert(key.clone(), value.clone());
                }
                Event::Output { .. } | Event::Warning { .. } | Event::Outputs { .. } => {}
            }
        }
        PriorStep {
            sub_changes: order
                .into_iter()
                .map(|id| {
                    let (status, error, _, _) = state[&id].clone();
                    PriorSubChange { id, status, error }
                })
                .collect(),
            facts,
        }
    }
}
