//! What the Evaluate step draws and words for a training, beyond the scores its record holds: per
//! tool, a chart of each scored model's answers by kind; the kinds' names and colours (the charts'
//! one legend, and the headings of the wrong answers); the tuned model's three rows in words; and how
//! far each model's confidence can be relied on, with the threshold it ships with.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use needle_engine::calls::{AnswerKind, ModelScore, Reliability};
use serde::Serialize;

use crate::chart;
use crate::evaluate::{gaps, threshold};
use crate::record::trainings::HistoryEntry;

#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    /// One per expected tool (`(no call)` among them), in name order; none for scores recorded
    /// before answers were told apart by kind.
    pub charts: Vec<ToolChart>,
    /// The kinds the charts show, in their stacking order.
    pub kinds: Vec<KindKey>,
    /// What quantizing and the file cost, once the `.cact` is built and scored.
    pub gaps: Option<String>,
    /// The models' confidence; `None` for scores recorded before it was kept.
    pub confidence: Option<ConfidenceView>,
}

/// The reliability of the models' confidence, and the gate the model ships with.
#[derive(Debug, Clone, Serialize)]
pub struct ConfidenceView {
    /// The reliability chart (SVG markup): each model's share right against its confidence.
    pub chart: String,
    /// Base, tuned and `.cact` (when scored), in the chart's order.
    pub models: Vec<ModelConfidence>,
    /// The threshold the model ships with: the one picked, else the one its figures propose.
    pub threshold: f64,
    /// Whether the user picked it.
    pub picked: bool,
    /// Where it is written beside the built `.cact`, once one is built.
    pub file: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelConfidence {
    pub model: String,
    pub figures: Reliability,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolChart {
    pub tool: String,
    /// SVG markup.
    pub svg: String,
}

/// A kind as the page names and colours it.
#[derive(Debug, Clone, Serialize)]
pub struct KindKey {
    pub kind: AnswerKind,
    pub label: &'static str,
    /// `#rrggbb`.
    pub color: String,
}

pub fn evaluation(entry: &HistoryEntry) -> Evaluation {
    let cact = entry.cact.as_ref();
    let rows = cact.and_then(|cact| cact.rows.as_ref());
    // The bars of each chart: the models scored, from the base to the file that ships.
    let mut models: Vec<(&str, &ModelScore)> = Vec::new();
    if let Some(scores) = &entry.scores {
        models.extend([("Base", &scores.base), ("Tuned", &scores.tuned)]);
    }
    if let Some(rows) = rows {
        models.extend([("Simulated", &rows.simulated), (".cact", &rows.cact)]);
    }
    let empty = BTreeMap::new();
    let tools: BTreeSet<&String> = models.iter().flat_map(|(_, score)| score.calls.breakdown.per_tool.keys()).collect();
    let charts = tools
        .iter()
        .map(|tool| {
            let bars: Vec<(&str, &BTreeMap<AnswerKind, usize>)> = (models.iter())
                .map(|(name, score)| (*name, score.calls.breakdown.per_tool.get(*tool).unwrap_or(&empty)))
                .collect();
            ToolChart { tool: tool.to_string(), svg: chart::kinds(&bars) }
        })
        .collect();
    let shown: BTreeSet<AnswerKind> = (models.iter())
        .flat_map(|(_, score)| score.calls.breakdown.per_tool.values().flat_map(|kinds| kinds.keys().copied()))
        .collect();
    let kinds = (shown.into_iter())
        .map(|kind| KindKey { kind, label: kind.label(), color: chart::css(chart::kind_color(kind)) })
        .collect();
    let gaps = cact.zip(rows).map(|(cact, rows)| gaps::explain(rows, &cact.scheme));
    Evaluation { charts, kinds, gaps, confidence: confidence(entry, &models) }
}

/// The confidence of the base, the tuned model and the `.cact`, of those `models` that have figures.
fn confidence(entry: &HistoryEntry, models: &[(&str, &ModelScore)]) -> Option<ConfidenceView> {
    let models: Vec<ModelConfidence> = (models.iter())
        .filter(|(name, _)| *name != "Simulated")
        .filter_map(|(name, score)| {
            Some(ModelConfidence { model: name.to_string(), figures: score.calls.confidence.clone()? })
        })
        .collect();
    if models.is_empty() {
        return None;
    }
    let bins: Vec<(&str, &[needle_engine::calls::reliability::Bin])> =
        models.iter().map(|model| (model.model.as_str(), model.figures.bins.as_slice())).collect();
    Some(ConfidenceView {
        chart: chart::reliability(&bins),
        threshold: threshold::current(entry),
        picked: entry.threshold.is_some(),
        file: entry.cact.as_ref().map(|cact| threshold::path_beside(&cact.path)),
        models,
    })
}
