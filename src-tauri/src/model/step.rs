//! The Model step's state: the hub, the hardware the worker trains on, the download slot and the
//! remembered preferences.

use std::sync::Arc;

use needle_engine::backend::BackendInfo;
use needle_engine::hub::Hub;

use crate::model::download::Downloads;
use crate::model::preferences::Remembered;

/// Shared by the Model step's commands; cloning is cheap.
#[derive(Clone)]
pub struct ModelStep {
    pub hub: Hub,
    pub hardware: BackendInfo,
    pub downloads: Arc<Downloads>,
    pub preferences: Arc<Remembered>,
}

impl ModelStep {
    pub fn new(hub: Hub, hardware: BackendInfo, preferences: Remembered) -> Self {
        Self { hub, hardware, downloads: Arc::default(), preferences: Arc::new(preferences) }
    }

    /// The device selector's choices: automatic, or one of the backends the worker has.
    pub fn devices(&self) -> Vec<String> {
        std::iter::once("auto".to_string()).chain(self.hardware.compiled.iter().map(ToString::to_string)).collect()
    }
}
