//! The one training the app holds at a time: taken when a training starts or resumes, freed by its
//! watcher once its record is saved, stopped by Cancel, and ended when the app closes.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::ground::lock;
use crate::worker::process::{CancelAnswer, Process};

/// How long a closing app waits for its training worker to save what it learned after being asked
/// to stop (a step of the full model on a CPU can take seconds), and then after killing it.
const STOP_GRACE: Duration = Duration::from_secs(15);
const KILL_GRACE: Duration = Duration::from_secs(3);

/// What a second Start hears while a training holds the slot.
const ALREADY_GOING: &str = "a training is already going: cancel it or wait for it to finish";

/// The training slot; clones share it.
#[derive(Clone, Default)]
pub struct TrainingSlot(Arc<Mutex<Option<Active>>>);

/// The training in progress.
struct Active {
    id: String,
    process: Arc<Process>,
    /// Cancel was pressed once: the worker was asked to stop after its step.
    stopping: bool,
    /// The app is closing: the training ends cut short, to be resumed.
    closing: bool,
}

/// The free slot, held from the check that it is free until the training's worker is in it, so two
/// Starts can never both begin.
pub struct Claim<'a>(MutexGuard<'a, Option<Active>>);

impl TrainingSlot {
    /// Claims the slot for a new training, or says that one is going.
    pub fn begin(&self) -> Result<Claim<'_>, String> {
        let active = lock(&self.0);
        match *active {
            Some(_) => Err(ALREADY_GOING.into()),
            None => Ok(Claim(active)),
        }
    }

    /// The id of the training in progress.
    pub fn running(&self) -> Option<String> {
        lock(&self.0).as_ref().map(|training| training.id.clone())
    }

    /// Whether training `id` is ending because the app is closing.
    pub fn is_closing(&self, id: &str) -> bool {
        lock(&self.0).as_ref().is_some_and(|training| training.id == id && training.closing)
    }

    /// Frees the slot of training `id` (if it still holds it), running `save` under the slot's lock so
    /// the final record and the freed slot appear together: whoever sees the training ended can start the
    /// next one, and nobody sees a running record with no worker.
    pub fn finish<T>(&self, id: &str, save: impl FnOnce() -> T) -> T {
        let mut active = lock(&self.0);
        let saved = save();
        if active.as_ref().is_some_and(|training| training.id == id) {
            *active = None;
        }
        saved
    }

    /// First press: ask the worker to stop after its step. Second press: end it now.
    pub fn cancel(&self) -> CancelAnswer {
        match lock(&self.0).as_mut() {
            None => CancelAnswer::Idle,
            Some(training) => training.process.cancel(&mut training.stopping),
        }
    }

    /// The app is closing: the training is asked to stop and save what it learned, and killed if it has
    /// not within [`STOP_GRACE`]. Returns when its watcher has saved the record and freed the slot
    /// (or the graces have passed).
    pub fn close(&self) {
        let asked = match lock(&self.0).as_mut() {
            Some(training) => {
                training.closing = true;
                training.process.ask_to_stop();
                true
            }
            None => false,
        };
        if asked && !self.wait_free(STOP_GRACE) {
            if let Some(training) = lock(&self.0).as_ref() {
                training.process.kill();
            }
            self.wait_free(KILL_GRACE);
        }
    }

    fn wait_free(&self, grace: Duration) -> bool {
        let deadline = Instant::now() + grace;
        while lock(&self.0).is_some() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }
}

impl Claim<'_> {
    /// Puts training `id`'s worker in the slot.
    pub fn fill(mut self, id: String, process: Arc<Process>) {
        *self.0 = Some(Active { id, process, stopping: false, closing: false });
    }
}
