//! `hspack compare`.

use std::path::PathBuf;
use std::process::ExitCode;

use hspack::compare::{compare, CompareOptions};
use hspack::verify::count;
use hspack::Dataset;

#[derive(clap::Args)]
pub struct Args {
    /// The reference dataset (the exact one).
    a: PathBuf,
    /// The dataset compared with it (e.g. a copy converted with `--quantize fp8`).
    b: PathBuf,
    /// Compare only the first N samples of the reference (1 or more).
    #[arg(long, value_name = "N")]
    samples: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let (x, y) = match (Dataset::open(&a.a), Dataset::open(&a.b)) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => return super::open_failed(e, a.json),
    };
    let options = CompareOptions { samples: a.samples };
    let c = match compare(&x, &y, &options) {
        Ok(c) => c,
        Err(e) => return Ok(super::read_failed(e.into())),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} ({}) of {} against {}",
        count(c.samples, "sample"),
        count(c.rows, "token"),
        a.b.display(),
        a.a.display()
    );
    let width = c
        .fields
        .iter()
        .map(|f| f.field.len())
        .max()
        .unwrap_or(5)
        .max(5);
    println!(
        "{:<width$}  {:>5}  {:<10}  {:>12}  {:>10}  {:>10}  {:>10}  {:>10}",
        "field", "layer", "stored", "values", "differ", "max |err|", "rel err", "cos mean/min"
    );
    for f in &c.fields {
        let layer = f.layer.map_or("-".to_string(), |l| l.to_string());
        let differ = match f.values {
            0 => "-".to_string(),
            v => format!("{:.1}%", 100.0 * f.differing as f64 / v as f64),
        };
        println!(
            "{:<width$}  {:>5}  {:<10}  {:>12}  {:>10}  {:>10.3e}  {:>10.3e}  {:.6}/{:.6}",
            f.field,
            layer,
            f.stored,
            f.values,
            differ,
            f.max_abs,
            f.rel_l2,
            f.cosine_mean,
            f.cosine_min
        );
    }
    println!("rel err: ‖a − b‖ / ‖a‖ over the field (or layer); cos: per token row");
    for f in c.fields.iter().filter(|f| f.non_finite > 0) {
        let layer = f.layer.map_or(String::new(), |l| format!(" (layer {l})"));
        println!(
            "NOTE {}{layer}: {} values NaN or infinite in either dataset, left out of max |err|, \
             rel err and cos ({} of all values differ)",
            f.field, f.non_finite, f.differing
        );
    }
    Ok(ExitCode::SUCCESS)
}
