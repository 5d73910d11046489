//! What the Evaluate step draws and words for a training, beyond the scores its record holds: per
//! tool, a chart of each scored model's answers by kind; the kinds' names and colours (the charts'
//! one legend, and the headings of the wrong answers); and the tuned model's three rows in words.

use std::collections::{BTreeMap, BTreeSet};

use needle_engine::calls::{AnswerKind, ModelScore};
use serde::Serialize;

use crate::chart;
use crate::evaluate::gaps;
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
    Evaluation { charts, kinds, gaps }
}
