//! `hspack show`.

use std::path::PathBuf;
use std::process::ExitCode;

use hspack::verify::count;
use hspack::Dataset;

use super::shape_text;

#[derive(clap::Args)]
pub struct Args {
    #[arg(help = super::DATASET)]
    dir: PathBuf,
    #[command(flatten)]
    sample: super::SampleArg,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// A value for people: whole numbers without decimals, others to 4 places.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.4}")
    }
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = match Dataset::open(&a.dir) {
        Ok(ds) => ds,
        Err(e) => return super::open_failed(e, false),
    };
    // Past the manifest, a failed read is damage (exit 1) or an error (exit 2), as in export.
    let s = match a.sample.sample(&ds) {
        Ok(s) => s,
        Err(e) => return Ok(super::read_failed(e)),
    };
    let mut fields = Vec::new();
    for f in &ds.schema().fields {
        let t = match s.read(&f.name, None) {
            Ok(t) => t,
            Err(e) => return Ok(super::read_failed(e.into())),
        };
        let stats = Some(t.to_f64())
            .filter(|v| !v.is_empty())
            .map(|v| Stats::of(&v));
        fields.push((f.name.clone(), f.dtype, t.shape.clone(), stats));
    }
    if a.json {
        let v = serde_json::json!({
            "key": s.key(), "ordinal": s.ordinal(), "tokens": s.rows(), "loss_tokens": s.loss_rows(),
            "fields": fields.iter().map(|(n, d, shape, st)| serde_json::json!({
                "name": n, "dtype": d.name(), "shape": shape,
                "min": st.as_ref().and_then(|s| s.finite.map(|f| f.0)),
                "max": st.as_ref().and_then(|s| s.finite.map(|f| f.1)),
                "mean": st.as_ref().and_then(|s| s.finite.map(|f| f.2)),
                "nan": st.as_ref().map(|s| s.nan), "inf": st.as_ref().map(|s| s.inf),
                "head": st.as_ref().map(|s| s.head.clone()),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    let loss = match s.loss_rows() {
        Some(n) => count(n, "loss token"),
        None => "no loss mask".to_string(),
    };
    println!(
        "sample {} `{}`: {}, {loss}",
        s.ordinal(),
        s.key(),
        count(s.rows(), "token")
    );
    let width = fields.iter().map(|f| f.0.len()).max().unwrap_or(0);
    for (n, d, shape, st) in fields {
        let shape = shape_text(&shape);
        match st {
            Some(st) => {
                let more = if st.head.len() < st.elems { " …" } else { "" };
                let head: Vec<String> = st.head.into_iter().map(number).collect();
                let range = match st.finite {
                    Some((min, max, mean)) => {
                        format!("min {}  max {}  mean {mean:.4}", number(min), number(max))
                    }
                    None => "no finite value".to_string(),
                };
                let odd = match (st.nan, st.inf) {
                    (0, 0) => String::new(),
                    (nan, inf) => format!("  ({nan} NaN, {inf} infinite: not in min, max, mean)"),
                };
                println!(
                    "  {n:<width$}  {:<8} {shape:<14} {range}  first {}{more}{odd}",
                    d.name(),
                    head.join(" ")
                )
            }
            None => println!("  {n:<width$}  {:<8} {shape}", d.name()),
        }
    }
    let lossy = ds.schema().quantized_fields();
    if !lossy.is_empty() {
        println!(
            "  lossy: {} decoded from fp8 (approximate values; see `hspack info`)",
            lossy.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A field's values in brief.
struct Stats {
    /// Min, max and mean of the finite values; `None` where there is none.
    finite: Option<(f64, f64, f64)>,
    /// NaN values, and infinite ones.
    nan: usize,
    inf: usize,
    /// The first values.
    head: Vec<f64>,
    elems: usize,
}

impl Stats {
    fn of(v: &[f64]) -> Stats {
        let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        let range = (!finite.is_empty()).then(|| {
            let min = finite.iter().copied().fold(f64::INFINITY, f64::min);
            let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (min, max, finite.iter().sum::<f64>() / finite.len() as f64)
        });
        Stats {
            finite: range,
            nan: v.iter().filter(|x| x.is_nan()).count(),
            inf: v.iter().filter(|x| x.is_infinite()).count(),
            head: v.iter().take(6).copied().collect(),
            elems: v.len(),
        }
    }
}
