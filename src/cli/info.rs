//! `hspack info`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use hspack::Dataset;

use hspack::verify::count;

use super::{human_bytes, shape_text};

#[derive(clap::Args)]
pub struct Args {
    #[arg(help = super::DATASET)]
    dir: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = match Dataset::open(&a.dir) {
        Ok(ds) => ds,
        Err(e) => return super::open_failed(e, a.json),
    };
    let m = ds.manifest();
    let manifest = || {
        a.dir
            .join(hspack::format::manifest::MANIFEST_FILE)
            .display()
            .to_string()
    };
    let bytes = m.shard_bytes().with_context(manifest)?;
    let raw = m.raw_bytes().with_context(manifest)?;
    let manifest_hash = blake3::hash(ds.manifest_bytes()).to_hex().to_string();
    if a.json {
        let v = serde_json::json!({
            "path": a.dir.display().to_string(),
            "dataset_id": m.dataset_id,
            "format_version": m.version,
            "samples": m.samples,
            "shards": m.shards.len(),
            "bytes": bytes,
            "raw_bytes": raw,
            "schema": m.schema,
            "segments": m.segments.len(),
            "table_files": m.table_files().iter().map(|t| &t.file).collect::<Vec<_>>(),
            "manifest_blake3": manifest_hash,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("dataset   {}", a.dir.display());
    println!("id        {}  (format v{})", m.dataset_id, m.version);
    println!("samples   {}", m.samples);
    println!(
        "shards    {}  ({} on disk, {} decoded)",
        m.shards.len(),
        human_bytes(bytes),
        human_bytes(raw)
    );
    let tables = m.table_files();
    match (m.is_segmented(), tables.as_slice()) {
        (true, _) => println!(
            "table     {} in {} (pandas: `pd.concat(map(pd.read_parquet, \
             hspack.open({:?}).table_files()))`)",
            count(m.samples, "row"),
            count(tables.len() as u64, "part"),
            a.dir.display().to_string()
        ),
        (false, [t]) => println!("table     {}", t.file),
        (false, _) => {
            println!("table     none (the writer did not finish; `hspack reindex` writes it)")
        }
    }
    if let Some(c) = &m.schema.capture {
        // A converted dump records what its flags said: "unknown" and 0 where none did.
        let unknown = c.model == "unknown" || c.num_layers == 0;
        println!(
            "capture   {}: {}, hidden {}, {}, tensor-parallel {}; by {} {}{}",
            match c.model.as_str() {
                "unknown" => "model unknown",
                model => model,
            },
            match c.num_layers {
                0 => "layer count unknown".to_string(),
                n => count(n.into(), "layer"),
            },
            c.hidden_size,
            c.dtype,
            c.tp_size,
            c.tool,
            c.tool_version,
            match unknown {
                true => " (convert's --model and --num-layers record them)",
                false => "",
            }
        );
    }
    println!("fields    (shape of one token's row)");
    let width = m
        .schema
        .fields
        .iter()
        .map(|f| f.name.len())
        .max()
        .unwrap_or(0);
    for f in &m.schema.fields {
        let stored = match f.quantized {
            Some(q) => format!(
                "  LOSSY: stored {}, a scale per {} values",
                q.scheme.name(),
                q.group
            ),
            None => String::new(),
        };
        println!(
            "  {:<width$}  {:<8} {:<12} {}{stored}",
            f.name,
            f.dtype.name(),
            shape_text(&f.shape),
            f.role
        );
    }
    let lossy = m.schema.quantized_fields();
    if !lossy.is_empty() {
        println!(
            "lossy     {} read back approximately (quantized when written); \
             `hspack compare EXACT {}` measures the error against an exact copy",
            lossy.join(", "),
            a.dir.display()
        );
    }
    println!("manifest  blake3 {manifest_hash} (run `hspack digest` to check the data behind it)");
    Ok(ExitCode::SUCCESS)
}
