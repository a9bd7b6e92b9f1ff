//! Folded stacks (`frame;frame;frame VALUE`, root first): the input of inferno, Brendan Gregg's
//! flamegraph.pl and Pyroscope. The frames are the flame graph's (`pinguard flamegraph`).

use super::{Data, Weight};

/// One line per callsite with a non-zero weight, the callsites in `report`'s order.
pub fn lines(d: &Data, weight: Weight) -> Vec<String> {
    let mut out: Vec<String> = d
        .merged
        .callsites
        .iter()
        .zip(&d.values)
        .filter(|(_, v)| v.get(weight) != 0)
        .map(|(c, v)| {
            format!(
                "{} {}",
                crate::flamegraph::stack(c).join(";"),
                v.get(weight)
            )
        })
        .collect();
    if d.folded.get(weight) != 0 {
        out.push(format!(
            "{} {}",
            super::folded_name(d),
            d.folded.get(weight)
        ));
    }
    out
}

pub fn render(d: &Data, weight: Weight) -> Result<Vec<u8>, String> {
    let lines = lines(d, weight);
    if lines.is_empty() {
        return Err(super::nothing(weight));
    }
    Ok(lines
        .iter()
        .flat_map(|l| [l.as_str(), "\n"])
        .collect::<String>()
        .into_bytes())
}
