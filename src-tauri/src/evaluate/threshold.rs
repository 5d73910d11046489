//! The confidence threshold a training's model ships with: the one the user picked in Evaluate, else
//! the one its held-out answers propose. It is kept with the training and written beside the built
//! `.cact` (`tuned.cact` → `tuned.threshold.json`), the small file the app developer's code reads to
//! gate the model's calls.

use std::path::{Path, PathBuf};

use needle_engine::calls::Reliability;
use serde::{Deserialize, Serialize};

use crate::record::trainings::{HistoryEntry, Records};

/// What `<file>.threshold.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThresholdFile {
    /// Act on a turn's calls when its confidence is at least this; below it, hand the turn off (to a
    /// larger model, or a question back to the user).
    pub min_confidence: f64,
    /// The `.cact` it gates (its file name, beside this file).
    pub model: String,
    /// On the training's held-out answers (the `.cact`'s, else the tuned model's): the share of right
    /// answers the gate keeps and of wrong ones it stops; `None` without such answers.
    pub kept_right: Option<f64>,
    pub stopped_wrong: Option<f64>,
    /// How many held-out answers those shares are over.
    pub answers: usize,
}

/// The figures of the model that ships: the `.cact`'s once scored, else the tuned model's.
pub fn shipped_figures(entry: &HistoryEntry) -> Option<&Reliability> {
    let cact = entry.cact.as_ref().and_then(|cact| cact.rows.as_ref()).map(|rows| &rows.cact);
    let tuned = entry.scores.as_ref().map(|scores| &scores.tuned);
    cact.or(tuned).and_then(|score| score.calls.confidence.as_ref())
}

/// The threshold the training's model ships with: the one picked, else the one its figures
/// propose, else 0 (no gate).
pub fn current(entry: &HistoryEntry) -> f64 {
    entry.threshold.or_else(|| shipped_figures(entry).map(|figures| figures.proposed)).unwrap_or(0.0)
}

/// Where the threshold of the `.cact` at `cact` is written.
pub fn path_beside(cact: &Path) -> PathBuf {
    cact.with_extension("threshold.json")
}

/// Keeps `threshold` as training `id`'s pick, and writes it beside its `.cact` when one is built.
pub fn pick(records: &Records, id: &str, threshold: f64) -> Result<HistoryEntry, String> {
    if !(0.0..=1.0).contains(&threshold) {
        return Err(format!("a threshold of {threshold}: pick a confidence in [0, 1] (0 gates nothing)"));
    }
    let mut record = records.load(id)?;
    record.entry.threshold = Some(threshold);
    write_beside_cact(&record.entry)?;
    records.save(&record)?;
    Ok(record.entry)
}

/// Writes the picked threshold beside the training's `.cact`; nothing when either is missing.
pub fn write_beside_cact(entry: &HistoryEntry) -> Result<(), String> {
    let (Some(threshold), Some(cact)) = (entry.threshold, &entry.cact) else { return Ok(()) };
    let figures = shipped_figures(entry);
    let row = figures.and_then(|figures| figures.at(threshold));
    let file = ThresholdFile {
        min_confidence: threshold,
        model: cact.path.file_name().map_or_else(String::new, |name| name.to_string_lossy().into_owned()),
        kept_right: row.and_then(|row| row.kept_right),
        stopped_wrong: row.and_then(|row| row.stopped_wrong),
        answers: figures.map_or(0, |figures| figures.answers),
    };
    let path = path_beside(&cact.path);
    let json = serde_json::to_vec_pretty(&file).map_err(|error| error.to_string())?;
    needle_engine::atomic::write_atomically(&path, &json)
        .map_err(|error| format!("could not write the threshold beside the .cact, {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use needle_engine::calls::{Accuracy, CallScores, ModelScore, Scored};
    use needle_engine::settings::presets;

    use super::*;
    use crate::record::request::TrainingRequest;
    use crate::record::trainings::CactInfo;

    fn scored(confidences: &[(bool, f64)]) -> ModelScore {
        let answers: Vec<Scored> =
            confidences.iter().map(|&(exact, confidence)| Scored { exact, confidence }).collect();
        ModelScore {
            calls: Accuracy { confidence: Reliability::of(&answers), ..Accuracy::default() },
            ..ModelScore::default()
        }
    }

    #[test]
    fn a_picked_threshold_is_kept_and_written_beside_the_cact_with_what_it_keeps_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let records = Records::open(dir.path());
        let request = TrainingRequest {
            dataset: "/data/smart_home.jsonl".into(),
            checkpoint: "/m/base.safetensors".into(),
            tokenizer: "/m/tokenizer.model".into(),
            device: "auto".into(),
            settings: presets()[0].settings,
        };
        let (mut record, _) = records.create(&request).unwrap();
        let tuned =
            scored(&[(true, 0.9), (true, 0.8), (false, 0.7), (true, 0.6), (true, 0.4), (false, 0.4), (false, 0.2)]);
        record.entry.scores = Some(CallScores { base: scored(&[(false, 0.5)]), tuned });
        records.save(&record).unwrap();
        let id = record.entry.id.clone();
        // Before a pick, the figures propose one: the highest that stops at most 10% of right answers.
        assert_eq!(current(&record.entry), 0.4);
        assert!(pick(&records, &id, 1.5).unwrap_err().contains("[0, 1]"));

        // Picked before the build: kept, and no file to write beside yet.
        let picked = pick(&records, &id, 0.5).unwrap();
        assert_eq!((picked.threshold, current(&picked)), (Some(0.5), 0.5));
        assert_eq!(records.load(&id).unwrap().entry.threshold, Some(0.5));
        // Once built, the file beside the .cact says the gate and what it does on the held-out answers.
        let cact = dir.path().join("tuned.cact");
        let mut record = records.load(&id).unwrap();
        record.entry.cact = Some(CactInfo {
            path: cact.clone(),
            bytes: 1,
            tensors: 1,
            scheme: "W4A8".into(),
            rows: None,
            scores_error: None,
            published: None,
            layers: None,
        });
        records.save(&record).unwrap();
        pick(&records, &id, 0.5).unwrap();
        let written: ThresholdFile =
            serde_json::from_slice(&std::fs::read(dir.path().join("tuned.threshold.json")).unwrap()).unwrap();
        let want = ThresholdFile {
            min_confidence: 0.5,
            model: "tuned.cact".into(),
            kept_right: Some(0.75),
            stopped_wrong: Some(2.0 / 3.0),
            answers: 7,
        };
        assert_eq!(written, want);
    }
}
