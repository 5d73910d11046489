//! The History step's state: the trainings' records, and the slot that says which one is going.

use serde::Serialize;

use crate::chart;
use crate::record::trainings::{HistoryEntry, Records};
use crate::train::slot::TrainingSlot;

/// Shared by the History step's commands; cloning is cheap.
#[derive(Clone)]
pub struct HistoryStep {
    pub records: Records,
    pub slot: TrainingSlot,
}

/// A past training reopened: its record and its chart.
#[derive(Debug, Serialize)]
pub struct Opened {
    pub entry: HistoryEntry,
    pub chart: Option<String>,
}

impl HistoryStep {
    /// The past trainings, newest first, the one going marked as such.
    pub fn list(&self) -> Vec<HistoryEntry> {
        self.records.list(self.slot.running().as_deref())
    }

    pub fn open(&self, id: &str) -> Result<Opened, String> {
        let record = self.records.load(id)?;
        let entry = self.records.listed(record.entry, self.slot.running().as_deref());
        let chart =
            (!record.curve.train.is_empty()).then(|| chart::loss(&record.curve.train, &record.curve.val, entry.steps));
        Ok(Opened { entry, chart })
    }
}
