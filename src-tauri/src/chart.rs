//! The app's charts, drawn in Rust with plotters as SVG that the UI drops into the page: a training's
//! loss curve ([`loss`]), one tool's held-out answers by kind ([`kinds`]), a depth ladder's exact
//! calls per rung ([`ladder`]) and the reliability of the models' confidence ([`reliability`]). All are drawn in one frame ([`draw`], [`styled`]): the same ink, type and grid, on the light theme and the dark.

use std::collections::BTreeMap;

use needle_engine::calls::ladder::Ladder;
use needle_engine::calls::reliability::Bin;
use needle_engine::calls::AnswerKind;
use plotters::chart::MeshStyle;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Mid grey reads on both the light and the dark theme.
const INK: RGBColor = RGBColor(128, 128, 128);
const TRAIN: RGBColor = RGBColor(47, 111, 235);
const VAL: RGBColor = RGBColor(232, 124, 30);

const LOSS_SIZE: (u32, u32) = (760, 260);
/// Small enough for a row of them, one per tool.
const KINDS_SIZE: (u32, u32) = (300, 200);
const LADDER_SIZE: (u32, u32) = (520, 220);
const RELIABILITY_SIZE: (u32, u32) = (420, 300);
/// The models of a reliability chart, in the order given: base, tuned, the file.
const MODEL_COLORS: [RGBColor; 3] = [RGBColor(128, 128, 128), TRAIN, RGBColor(46, 160, 67)];

type Area<'s> = DrawingArea<SVGBackend<'s>, Shift>;
type Drawn<'s> = Result<(), DrawingAreaErrorKind<<SVGBackend<'s> as DrawingBackend>::ErrorType>>;

/// The chart `paint` draws on a `size` canvas, as SVG markup.
fn draw(size: (u32, u32), paint: impl for<'s> FnOnce(&Area<'s>) -> Drawn<'s>) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        // Drawing into a String cannot fail short of running out of memory; an unfinished chart is
        // still better than none, so the error is not propagated.
        let _ = paint(&root).and_then(|()| root.present());
    }
    svg
}

fn label_style() -> TextStyle<'static> {
    ("sans-serif", 13).into_font().color(&INK)
}

/// The frame every chart's mesh is drawn in: grey axes and labels, a faint grid on the major ticks.
fn styled<'m, 'a, 'b, X, Y>(
    mesh: &'m mut MeshStyle<'a, 'b, X, Y, SVGBackend<'a>>,
) -> &'m mut MeshStyle<'a, 'b, X, Y, SVGBackend<'a>>
where
    X: Ranged + ValueFormatter<X::ValueType>,
    Y: Ranged + ValueFormatter<Y::ValueType>,
{
    mesh.axis_style(INK)
        .bold_line_style(INK.mix(0.25))
        .light_line_style(TRANSPARENT)
        .label_style(label_style())
        .axis_desc_style(label_style())
}

/// Train loss per step and validation loss per epoch, each `(step, loss)`, over `0..=steps`.
pub fn loss(train: &[(usize, f32)], val: &[(usize, f32)], steps: usize) -> String {
    draw(LOSS_SIZE, |root| {
        let losses = train.iter().chain(val).map(|&(_, loss)| loss).filter(|l| l.is_finite());
        let (low, high) = losses.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), l| (lo.min(l), hi.max(l)));
        let (low, high) = if low <= high { (low, high) } else { (0.0, 1.0) };
        let pad = ((high - low) * 0.08).max(0.05);
        let x_max = steps.max(train.last().map_or(1, |&(step, _)| step)).max(1);
        let mut chart = ChartBuilder::on(root)
            .margin(12)
            .x_label_area_size(34)
            .y_label_area_size(48)
            .build_cartesian_2d(0..x_max, (low - pad).max(0.0)..high + pad)?;
        styled(&mut chart.configure_mesh()).x_desc("step").y_desc("loss").draw()?;
        chart
            .draw_series(LineSeries::new(train.iter().copied(), TRAIN.stroke_width(2)))?
            .label("train")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], TRAIN.stroke_width(2)));
        if !val.is_empty() {
            chart
                .draw_series(LineSeries::new(val.iter().copied(), VAL.stroke_width(2)))?
                .label("validation")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], VAL.stroke_width(2)));
            chart.draw_series(val.iter().map(|&point| Circle::new(point, 4, VAL.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(label_style())
            .border_style(INK.mix(0.5))
            .background_style(TRANSPARENT)
            .draw()?;
        Ok(())
    })
}

/// Per model (its name and reliability table), each bin's share of right answers against its mean
/// confidence, one line per model, empty bins left out; the diagonal is perfect calibration.
pub fn reliability(models: &[(&str, &[Bin])]) -> String {
    draw(RELIABILITY_SIZE, |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(12)
            .x_label_area_size(34)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..1f64, 0f64..1f64)?;
        styled(&mut chart.configure_mesh())
            .x_desc("confidence")
            .y_desc("share right")
            .x_labels(6)
            .y_labels(6)
            .draw()?;
        chart.draw_series(LineSeries::new([(0.0, 0.0), (1.0, 1.0)], INK.mix(0.6).stroke_width(1)))?;
        for (i, (name, bins)) in models.iter().enumerate() {
            let color = MODEL_COLORS[i % MODEL_COLORS.len()];
            let points: Vec<(f64, f64)> = (bins.iter())
                .filter_map(|bin| Some((bin.confidence?, bin.right as f64 / bin.answers as f64)))
                .collect();
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
                .label(*name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(points.iter().map(|&point| Circle::new(point, 4, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(label_style())
            .border_style(INK.mix(0.5))
            .background_style(TRANSPARENT)
            .draw()?;
        Ok(())
    })
}

/// The colour a kind is drawn in, as the chart's bars and the page's legend show it: right in green,
/// each way of being wrong in its own colour.
pub fn kind_color(kind: AnswerKind) -> RGBColor {
    match kind {
        AnswerKind::Exact => RGBColor(46, 160, 67),
        AnswerKind::UnreadableExpected => RGBColor(110, 110, 110),
        AnswerKind::Unparseable => RGBColor(214, 39, 40),
        AnswerKind::Withheld => RGBColor(188, 189, 34),
        AnswerKind::FalseFire => RGBColor(148, 103, 189),
        AnswerKind::FalseRefusal => RGBColor(23, 190, 207),
        AnswerKind::WrongCount => RGBColor(140, 86, 75),
        AnswerKind::WrongTool => RGBColor(255, 127, 14),
        AnswerKind::WrongArguments => RGBColor(227, 119, 194),
    }
}

/// `#rrggbb`, for the page.
pub fn css(color: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", color.0, color.1, color.2)
}

/// One stacked bar per model (its name, and its answers by kind), the kinds stacked in their order
/// from exact at the bottom; the legend is the page's, shared by every tool's chart.
pub fn kinds(bars: &[(&str, &BTreeMap<AnswerKind, usize>)]) -> String {
    let most = bars.iter().map(|(_, kinds)| kinds.values().sum::<usize>()).max().unwrap_or(0);
    let bars: Vec<(String, &BTreeMap<AnswerKind, usize>)> =
        bars.iter().map(|(name, kinds)| (name.to_string(), *kinds)).collect();
    stacked(KINDS_SIZE, &bars, most, (None, "answers"))
}

/// One bar per rung, shallowest first: its exact calls out of the examples, in the colour of exact
/// answers, so the smallest rung that still makes the calls stands out.
pub fn ladder(ladder: &Ladder) -> String {
    let exact: Vec<BTreeMap<AnswerKind, usize>> =
        ladder.rungs.iter().map(|rung| BTreeMap::from([(AnswerKind::Exact, rung.calls.exact)])).collect();
    let bars: Vec<(String, &BTreeMap<AnswerKind, usize>)> =
        ladder.rungs.iter().zip(&exact).map(|(rung, exact)| (rung.layers.to_string(), exact)).collect();
    stacked(LADDER_SIZE, &bars, ladder.examples, (Some("layers"), "exact calls"))
}

/// Named bars of answers stacked by kind on a scale up to `top`, with the axes' descriptions.
fn stacked(
    size: (u32, u32),
    bars: &[(String, &BTreeMap<AnswerKind, usize>)],
    top: usize,
    (x_desc, y_desc): (Option<&str>, &str),
) -> String {
    draw(size, |root| {
        let most = top.max(1);
        let mut chart = ChartBuilder::on(root)
            .margin(8)
            .x_label_area_size(if x_desc.is_some() { 34 } else { 28 })
            .y_label_area_size(34)
            // An integer range counts both its ends: one segment per bar.
            .build_cartesian_2d((0..bars.len().saturating_sub(1)).into_segmented(), 0..most)?;
        let name = |at: &SegmentValue<usize>| match at {
            SegmentValue::CenterOf(i) => bars.get(*i).map_or_else(String::new, |(name, _)| name.clone()),
            _ => String::new(),
        };
        let mut mesh = chart.configure_mesh();
        styled(&mut mesh).disable_x_mesh().x_labels(bars.len()).y_labels(most.min(5)).x_label_formatter(&name);
        if let Some(x_desc) = x_desc {
            mesh.x_desc(x_desc);
        }
        mesh.y_desc(y_desc).draw()?;
        let blocks = bars.iter().enumerate().flat_map(|(i, (_, kinds))| {
            kinds.iter().scan(0, move |bottom, (&kind, &n)| {
                let from = *bottom;
                *bottom += n;
                let corners = [(SegmentValue::Exact(i), from), (SegmentValue::Exact(i + 1), from + n)];
                let mut block = Rectangle::new(corners, kind_color(kind).filled());
                block.set_margin(0, 0, 10, 10);
                Some(block)
            })
        });
        chart.draw_series(blocks)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loss_chart_draws_both_series_and_the_axes() {
        let svg = loss(&[(1, 3.0), (2, 2.5), (3, 2.1)], &[(3, 2.4)], 6);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        for text in ["step", "loss", "train", "validation", "polyline"] {
            assert!(svg.contains(text), "{text} missing from the chart");
        }
    }

    #[test]
    fn the_reliability_chart_draws_a_line_per_model_through_its_filled_bins() {
        let bins = |points: &[(usize, usize, f64)]| -> Vec<Bin> {
            (0..10)
                .map(|i| {
                    let filled = points.iter().find(|(at, ..)| *at == i);
                    Bin {
                        from: i as f64 / 10.0,
                        to: (i + 1) as f64 / 10.0,
                        answers: filled.map_or(0, |_| 4),
                        right: filled.map_or(0, |(_, right, _)| *right),
                        confidence: filled.map(|(.., c)| *c),
                    }
                })
                .collect()
        };
        let (base, tuned) = (bins(&[(2, 1, 0.25), (9, 2, 0.95)]), bins(&[(4, 2, 0.45), (8, 3, 0.85), (9, 4, 0.97)]));
        let svg = reliability(&[("Base", &base), ("Tuned", &tuned)]);
        for text in ["confidence", "share right", "Base", "Tuned"] {
            assert!(svg.contains(text), "{text} missing from the chart");
        }
        assert_eq!(svg.matches("<circle").count(), 5, "one dot per filled bin: {svg}");
        for color in &MODEL_COLORS[..2] {
            assert!(svg.to_lowercase().contains(&css(*color)), "no {} line", css(*color));
        }
    }

    #[test]
    fn an_empty_curve_still_draws_axes() {
        let svg = loss(&[], &[], 10);
        assert!(svg.contains("step") && !svg.contains("validation"));
    }

    #[test]
    fn the_kinds_chart_stacks_one_block_per_kind_of_each_bar_in_its_colour() {
        let base = BTreeMap::from([(AnswerKind::Exact, 2), (AnswerKind::Unparseable, 4)]);
        let tuned = BTreeMap::from([(AnswerKind::Exact, 5), (AnswerKind::WrongArguments, 1)]);
        let svg = kinds(&[("Base", &base), ("Tuned", &tuned)]);
        assert!(svg.starts_with("<svg") && svg.contains("Base") && svg.contains("Tuned"), "{svg}");
        for kind in [AnswerKind::Exact, AnswerKind::Unparseable, AnswerKind::WrongArguments] {
            let fill = css(kind_color(kind));
            assert!(svg.to_lowercase().contains(&fill), "no {kind:?} block ({fill}) in {svg}");
        }
        let exact = css(kind_color(AnswerKind::Exact));
        assert_eq!(svg.to_lowercase().matches(&exact).count(), 2, "one exact block per bar");
    }

    #[test]
    fn the_ladder_chart_draws_one_exact_bar_per_rung_named_by_its_layers() {
        use needle_engine::calls::ladder::Rung;
        use needle_engine::calls::Accuracy;
        let rung = |layers, exact| Rung {
            layers,
            cact_bytes: 1000,
            calls: Accuracy { examples: 8, exact, ..Accuracy::default() },
        };
        let svg = ladder(&Ladder { num_layers: 4, examples: 8, rungs: vec![rung(2, 3), rung(3, 5), rung(4, 7)] });
        assert!(svg.contains("layers") && svg.contains("exact calls"), "{svg}");
        let exact = css(kind_color(AnswerKind::Exact));
        assert_eq!(svg.to_lowercase().matches(&exact).count(), 3, "one bar per rung in {svg}");
    }
}
