//! The loss chart, drawn in Rust with plotters as SVG: the UI drops the markup into the page.

use plotters::prelude::*;

use crate::train::record::Curve;

const SIZE: (u32, u32) = (760, 260);
/// Mid grey reads on both the light and the dark theme.
const INK: RGBColor = RGBColor(128, 128, 128);
const TRAIN: RGBColor = RGBColor(47, 111, 235);
const VAL: RGBColor = RGBColor(232, 124, 30);

/// Train loss per step and validation loss per epoch, over `0..=steps` on the x axis.
pub fn loss_chart(curve: &Curve, steps: usize) -> String {
    let mut svg = String::new();
    // Drawing into a String cannot fail short of running out of memory; an unfinished chart is
    // still better than none, so the error is not propagated.
    let _ = draw(&mut svg, curve, steps);
    svg
}

fn draw<'s>(svg: &'s mut String, curve: &Curve, steps: usize) -> Result<(), Box<dyn std::error::Error + 's>> {
    let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
    let losses = curve.train.iter().chain(&curve.val).map(|&(_, loss)| loss).filter(|l| l.is_finite());
    let (low, high) = losses.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), l| (lo.min(l), hi.max(l)));
    let (low, high) = if low <= high { (low, high) } else { (0.0, 1.0) };
    let pad = ((high - low) * 0.08).max(0.05);
    let x_max = steps.max(curve.train.last().map_or(1, |&(step, _)| step)).max(1);
    let label_style = ("sans-serif", 13).into_font().color(&INK);
    let mut chart = ChartBuilder::on(&root)
        .margin(12)
        .x_label_area_size(34)
        .y_label_area_size(48)
        .build_cartesian_2d(0..x_max, (low - pad).max(0.0)..high + pad)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .axis_style(INK)
        .bold_line_style(INK.mix(0.25))
        .light_line_style(TRANSPARENT)
        .label_style(label_style.clone())
        .axis_desc_style(label_style.clone())
        .draw()?;
    chart
        .draw_series(LineSeries::new(curve.train.iter().copied(), TRAIN.stroke_width(2)))?
        .label("train")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], TRAIN.stroke_width(2)));
    if !curve.val.is_empty() {
        chart
            .draw_series(LineSeries::new(curve.val.iter().copied(), VAL.stroke_width(2)))?
            .label("validation")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], VAL.stroke_width(2)));
        chart.draw_series(curve.val.iter().map(|&point| Circle::new(point, 4, VAL.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(label_style)
        .border_style(INK.mix(0.5))
        .background_style(TRANSPARENT)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_both_series_and_the_axes() {
        let curve = Curve { train: vec![(1, 3.0), (2, 2.5), (3, 2.1)], val: vec![(3, 2.4)] };
        let svg = loss_chart(&curve, 6);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        for text in ["step", "loss", "train", "validation", "polyline"] {
            assert!(svg.contains(text), "{text} missing from the chart");
        }
    }

    #[test]
    fn an_empty_curve_still_draws_axes() {
        let svg = loss_chart(&Curve::default(), 10);
        assert!(svg.contains("step") && !svg.contains("validation"));
    }
}
