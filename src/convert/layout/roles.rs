//! Hidden-state roles: which layer each captured state is, and where it was captured.

use crate::format::{eagle3, CapturePoint, Role};

use super::{point_name, LayoutError, LayoutOptions};

/// Hidden-state roles and names for `count` captured states: ids from `--layers`, points from
/// `--point`, else `defaults[i]` (`None`: the preset cannot know, so `--point` is required).
pub fn hidden_roles(
    layout: &str,
    count: usize,
    what: &str,
    options: &LayoutOptions,
    defaults: &[Option<CapturePoint>],
) -> Result<Vec<(String, Role)>, LayoutError> {
    if options.layers.len() != count {
        return Err(LayoutError::Layers {
            detail: format!(
                "the {layout} layout holds {} ({what}) but the files do not say which layers \
                 they are: give --layers with {} in that order (got {}), e.g. {}",
                crate::error::count(count as u64, "hidden state"),
                crate::error::count(count as u64, "layer id"),
                options.layers.len(),
                example_layers(count, options.num_layers, defaults)
            ),
        });
    }
    let points: Vec<CapturePoint> = match options.points.len() {
        0 => {
            let mut out = Vec::with_capacity(count);
            for (i, &id) in options.layers.iter().enumerate() {
                let point = if options.num_layers == Some(id) {
                    Some(CapturePoint::FinalNorm)
                } else {
                    match defaults.get(i).copied().flatten() {
                        Some(CapturePoint::FinalNorm) => {
                            return Err(final_norm_id(layout, i, options, defaults))
                        }
                        p => p,
                    }
                };
                out.push(point.ok_or_else(|| LayoutError::Layers {
                    detail: format!(
                        "the {layout} layout does not say where layer {id} was captured: give \
                         --point layer-input|layer-output|final-norm (one for all layers, or one \
                         per layer)"
                    ),
                })?);
            }
            out
        }
        1 => vec![options.points[0]; count],
        n if n == count => options.points.clone(),
        n => {
            return Err(LayoutError::Layers {
                detail: format!("--point has {n} entries; give one, or one per layer ({count})"),
            })
        }
    };
    if let Some(n) = options.num_layers {
        for (&id, &point) in options.layers.iter().zip(&points) {
            layer_fits(id, point, n).map_err(|detail| LayoutError::Layers {
                detail: format!("--layers {id} with --point {}: {detail}", point_name(point)),
            })?;
        }
    }
    Ok(options
        .layers
        .iter()
        .zip(points)
        .map(|(&layer, point)| {
            (
                eagle3::hidden_field(layer),
                Role::HiddenState { layer, point },
            )
        })
        .collect())
}

/// `--layers` as a model of `num_layers` layers (61 where not given, then said) would give it:
/// the states a preset takes for the final norm's output as `num_layers`, the others spread
/// from layer 2 to `num_layers - 3`, as EAGLE-3 picks them.
fn example_layers(
    count: usize,
    num_layers: Option<u32>,
    defaults: &[Option<CapturePoint>],
) -> String {
    let n = num_layers.unwrap_or(61);
    let is_final = |i: usize| defaults.get(i).copied().flatten() == Some(CapturePoint::FinalNorm);
    let others = (0..count).filter(|&i| !is_final(i)).count() as u32;
    let mut k = 0;
    let ids: Vec<String> = (0..count)
        .map(|i| match is_final(i) {
            true => n.to_string(),
            false => {
                let span = n.saturating_sub(5);
                let id = 2
                    + (k * span)
                        .checked_div(others.saturating_sub(1))
                        .unwrap_or(0);
                k += 1;
                id.to_string()
            }
        })
        .collect();
    let given = match num_layers {
        Some(_) => String::new(),
        None if (0..count).any(is_final) => format!(" --num-layers {n}"),
        None => String::new(),
    };
    format!("--layers {}{given}", ids.join(","))
}

/// The error for a preset whose default labels layer `options.layers[i]` the final-norm
/// output when `--num-layers` does not say so; it names the flags that would.
fn final_norm_id(
    layout: &str,
    i: usize,
    options: &LayoutOptions,
    defaults: &[Option<CapturePoint>],
) -> LayoutError {
    let id = options.layers[i];
    let join = |v: Vec<String>| v.join(",");
    let layers = join(
        options
            .layers
            .iter()
            .enumerate()
            .map(|(j, &l)| match (j == i, options.num_layers) {
                (true, Some(n)) => n.to_string(),
                _ => l.to_string(),
            })
            .collect(),
    );
    let points = join(
        (0..options.layers.len())
            .map(|j| match defaults.get(j).copied().flatten() {
                _ if j == i => point_name(CapturePoint::LayerOutput).to_string(),
                Some(p) => point_name(p).to_string(),
                None => "layer-input".to_string(),
            })
            .collect(),
    );
    LayoutError::FinalNormId {
        layout: layout.to_string(),
        id,
        num_layers: options.num_layers,
        layers,
        points,
    }
}

/// Refuses layer id `id` captured at `point` in a model of `n` decoder layers (`--num-layers`):
/// ids 0 to n - 1 are layers (their input or output), and id n is the final norm's output,
/// as HF's `hidden_states[i]` counts them. The message says what to give instead.
pub fn layer_fits(id: u32, point: CapturePoint, n: u32) -> Result<(), String> {
    let last = n.saturating_sub(1);
    match point {
        CapturePoint::FinalNorm if id != n => Err(format!(
            "a model of --num-layers {n} has its final-norm output at id {n}, not {id}; give id \
             {n} for it, or the point where id {id} was taken (layer-input or layer-output)"
        )),
        CapturePoint::FinalNorm => Ok(()),
        _ if id >= n => Err(format!(
            "a model of --num-layers {n} has layers 0 to {last}, and id {n} is its final-norm \
             output; give --point final-norm for it (or leave --point out), or the layer id it \
             was taken at"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example a missing `--layers` is told: ids a model of `--num-layers` layers has,
    /// the final norm's output where the preset takes one (it suggested `--layers 2` for a
    /// final-norm state, which the next run refused as not the final norm).
    #[test]
    fn the_example_layers_fit_the_model_and_the_presets_final_norm() {
        let last = Some(CapturePoint::FinalNorm);
        let eagle3 = [None, None, None, last];
        assert_eq!(example_layers(4, Some(61), &eagle3), "--layers 2,30,58,61");
        assert_eq!(
            example_layers(4, None, &eagle3),
            "--layers 2,30,58,61 --num-layers 61"
        );
        assert_eq!(example_layers(1, Some(61), &[last]), "--layers 61");
        assert_eq!(example_layers(2, Some(32), &[]), "--layers 2,29");
        assert_eq!(example_layers(1, Some(32), &[]), "--layers 2");
    }
}
