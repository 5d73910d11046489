//! The Export step's state: the worker builds run in, the trainings' records, the hub and its token,
//! the one upload slot and the one ladder sweep.

use std::sync::Arc;

use needle_engine::hub::Hub;

use crate::export::ladder;
use crate::export::publish::{self, Publishing};
use crate::record::trainings::Records;
use crate::secrets::keys::Keys;
use crate::worker::process::Worker;

/// Shared by the Export step's commands; cloning is cheap.
#[derive(Clone)]
pub struct ExportStep {
    pub worker: Worker,
    pub records: Records,
    pub hub: Hub,
    pub token: Arc<Keys>,
    pub publishing: Arc<Publishing>,
    pub ladder: ladder::Sweep,
}

impl ExportStep {
    pub fn publish_place(&self) -> publish::Place<'_> {
        publish::Place { records: &self.records, hub: &self.hub, token: &self.token, publishing: &self.publishing }
    }
}
