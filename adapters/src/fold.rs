//! The one fold of a sub-change's recorded state. The driver's journal (`Deploy::apply` in the
//! binary) and the test [`Recorder`](crate::testing::Recorder) both call [`fold_sub_change`],
//! so the [`PriorStep`](crate::PriorStep) an adapter test feeds `recover` is the one the driver
//! would build from the same events.

use crate::SubStatus;

/// What one journal record or adapter event says happened to a sub-change.
#[derive(Clone, Copy, Debug)]
pub enum SubChangeEvent<'a> {
    /// Listed by the plan: a new sub-change starts pending; a known one keeps its state.
    Planned,
    Started,
    Done {
        note: Option<&'a str>,
    },
    /// Found in place by the step's preview: done, and not applied again.
    InPlace {
        note: Option<&'a str>,
    },
    Failed {
        error: &'a str,
    },
    Pending {
        reason: &'a str,
    },
}

/// A sub-change's state as the checkpoint keeps it.
pub struct SubChangeFields<'s> {
    pub status: &'s mut SubStatus,
    pub error: &'s mut Option<String>,
    pub note: &'s mut Option<String>,
    /// Done because it was found in place, not because the tool applied it.
    pub in_place: &'s mut bool,
}

/// Folds one event into a sub-change's state (the caller creates it pending when new).
pub fn fold_sub_change(sub: SubChangeFields<'_>, event: SubChangeEvent<'_>) {
    match event {
        SubChangeEvent::Planned => {}
        SubChangeEvent::Started => {
            *sub.status = SubStatus::Started;
            *sub.error = None;
            *sub.in_place = false;
        }
        SubChangeEvent::Done { note } => {
            *sub.status = SubStatus::Done;
            *sub.error = None;
            *sub.note = note.map(str::to_string);
            *sub.in_place = false;
        }
        SubChangeEvent::InPlace { note } => {
            *sub.status = SubStatus::Done;
            *sub.error = None;
            *sub.note = note.map(str::to_string);
            *sub.in_place = true;
        }
        SubChangeEvent::Failed { error } => {
            *sub.status = SubStatus::Failed;
            *sub.in_place = false;
            *sub.error = Some(error.to_string());
        }
        SubChangeEvent::Pending { reason } => {
            *sub.status = SubStatus::Pending;
            *sub.note = Some(reason.to_string());
        }
    }
}
