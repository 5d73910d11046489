//! The record of trainings every step reads: what a training was asked to do ([`request`]) and what
//! came of it, one folder per training in the app's data folder ([`trainings`]). The Train step
//! writes it; Evaluate, Export and History read it and add what they make (scores, the built file,
//! where it was published, the threshold picked and the acceptance run, [`acceptance`]). It stands on
//! [`crate::worker`] only, so any step may import it.

pub mod acceptance;
pub mod request;
pub mod trainings;
