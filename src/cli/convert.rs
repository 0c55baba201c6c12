//! `hspack convert`.

use std::path::PathBuf;
use std::process::ExitCode;

use hspack::convert::spec::FieldArg;
use hspack::convert::{self, ConvertSpec, Mapping, Preset, Progress};
use hspack::verify::count;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::{human_bytes, rate_text, EXIT_SKIPPED};

const LAYOUTS: &str = "\
Layouts (none of these formats records layer ids: give --layers, in the order listed):
  specforge    rows_*/data_N.ckpt[.gz]: input_ids [T], loss_mask [T], aux_hidden_state [1,T,k*H]
               (k layers, default layer-input), hidden_state [1,T,H] (default final-norm).
               --layers AUX1,..,AUXk,LAST   e.g. --layers 2,30,58,61
               Fields: input_ids, loss_mask, aux_hidden_state (stacked [k,H], the source bytes
               as they are), hidden.LAST.
  eagle        */data_N.ckpt (EAGLE ge_data): input_ids [T], loss_mask [T], hidden_state [T,H]
               (HF hidden_states[-1], default final-norm).   --layers LAST
  modelopt     {conversation_id}.pt: input_ids [T], aux_hidden_states [T,k*H] (optional, default
               layer-input), hidden_states [T,H] (default final-norm), loss_mask (optional).
               --layers AUX1,..,AUXk,LAST. Fields as specforge. --key-from conversation_id
               keys samples by the stored id instead of the file name.
  speculators  *.pt|*.safetensors: token_ids [T], hidden_states [T,L,H], loss_mask (optional).
               --layers with L ids and --point (required). Fields: hidden_states (stacked
               [L,H], as stored) when every layer has one point; when only the last differs,
               aux_hidden_state (the first L-1) and hidden.LAST.
  --split-layers  one field hidden.L per layer instead of the stacked fields.
  generic      --field NAME=TENSOR[:part=K/N][:index=K][:axis=A][:role=ids|mask|hidden|other]
               [:layer=L][:point=P][:optional], one per field. Fields named input_ids, loss_mask
               and hidden.L get those roles. Lists flatten to TENSOR.0, TENSOR.1, ...
               Stacked: NAME=TENSOR:layers=L0,L1,.. from [T,k*H] or [T,k,H] (no copy), or
               NAME=T0+T1+..:layers=L0,L1,.. from one tensor per layer. --mapping FILE.json
               holds the fields and the other options in one file (see the README).
Layer ids follow the HF hidden_states[i] convention: id i is the input of layer i; an id equal to
--num-layers is the final-norm output. Every field keeps its source dtype, bit for bit.
Files: one per sample (key: relative path without extension); --group-by 'PATTERN' joins files
whose relative path matches it, {key} naming the sample and {part} the file within it.
Names in a group: what the file of part P holds is named P.NAME (P alone for a file holding one
bare tensor or value), in --field, --split-by and --key-from alike: '{key}_{part}.pt' over
fwd_0_meta.pt and fwd_0_L2.pt gives meta.rids, meta.seq_lens, L2, ... A group lacking a part
other groups have is refused, naming the missing file.
--split-by lengths:TENSOR|cu_seqlens:TENSOR splits a file packing several requests along the
tokens into samples KEY/0, KEY/1, ...; with --split-by-file '{stem}.lens.pt' the tensor is in
the file of that name beside each batch (--split-by lengths for its bare tensor).
--key-from NAME keys each sample by a value stored in its file instead of its file name (a str,
an int or a one-element integer tensor); with --split-by, a list of ids or a 1-D integer tensor
keys each request by its own id, as per-forward-pass dumps keep them:
  --split-by lengths:seq_lens --key-from rids    (requests keyed by their rid, not KEY/j)
Order: samples follow their keys in natural order (digits compare as numbers: data_2 before
data_10), requests of a file in file order; a rerun over the same files gives the same order.
Resume: rerun the same command; samples already in the dataset are skipped and counted so.
Exit codes: 0 everything converted; 2 error (nothing after a bad file is committed); 3 with
--skip-bad, bad files were skipped (listed in the report and in --json): the dataset lacks them.";

/// Turn hidden-state dumps (SpecForge, EAGLE, ModelOpt, speculators, ad-hoc) into a dataset.
#[derive(clap::Args)]
#[command(after_long_help = LAYOUTS)]
pub struct Args {
    /// Source folder (walked recursively) or file.
    src: PathBuf,
    /// The dataset: a folder, a store's dataset STORE/NAME, or a URL (s3://, gs://, az://);
    /// created, or resumed when it already holds a dataset.
    dst: PathBuf,
    /// Layout of the source files (see --help for the tensors each expects).
    #[arg(long, value_enum)]
    layout: LayoutArg,
    /// Layer ids of the captured hidden states, comma-separated, in the layout's order.
    #[arg(long, value_delimiter = ',')]
    layers: Vec<u32>,
    /// Capture point: layer-input, layer-output or final-norm; one for all or one per layer.
    #[arg(long, value_delimiter = ',')]
    point: Vec<String>,
    /// Decoder layers of the model (capture metadata; this id means the final-norm output).
    #[arg(long)]
    num_layers: Option<u32>,
    /// Model name or path for the capture metadata.
    #[arg(long)]
    model: Option<String>,
    /// Expected hidden size: files with another are refused.
    #[arg(long)]
    hidden_size: Option<u64>,
    /// One field hidden.L per layer instead of the presets' stacked aux_hidden_state /
    /// hidden_states fields (a copy that de-interleaves the layers).
    #[arg(long)]
    split_layers: bool,
    /// A JSON file holding what the flags say (fields, group-by, split-by, split-by-file,
    /// key-from, layers, points, num-layers, model); a key there and its flag together are an
    /// error.
    #[arg(long)]
    mapping: Option<PathBuf>,
    /// Generic layout field: NAME=TENSOR[:OPTION]... (repeat per field).
    #[arg(long = "field")]
    fields: Vec<String>,
    /// Join files into one sample by a pattern with {key} and {part}.
    #[arg(long)]
    group_by: Option<String>,
    /// Split each file into requests: lengths:TENSOR or cu_seqlens:TENSOR.
    #[arg(long)]
    split_by: Option<String>,
    /// Take the --split-by tensor from a file beside each batch file, named by this pattern
    /// with {stem} (the batch's name without extension), e.g. '{stem}.lens.pt'.
    #[arg(long)]
    split_by_file: Option<String>,
    /// Key each sample by a value stored in its file (a str, an int or a one-element integer
    /// tensor, e.g. ModelOpt's conversation_id) instead of its file name; two files with one
    /// key are an error naming both.
    #[arg(long)]
    key_from: Option<String>,
    /// Drop padded rows: `mask` (after the last loss-mask row) or `ids[:PAD]` (trailing PAD ids,
    /// default 0).
    #[arg(long)]
    trim_padding: Option<String>,
    /// Delete each source file once its shard is committed and its chunks verify; a file
    /// holding a tensor no field reads, or a value that is not a tensor (a str, a number) that
    /// --key-from does not read, is refused, not deleted. Shards not yet committed need
    /// free space: about 1.5 × jobs shards.
    #[arg(long)]
    delete_source: bool,
    /// With --delete-source, delete the sources even where the dataset does not hold them
    /// exactly: with --quantize (FP8 approximations) or --trim-padding (rows left out), which
    /// --delete-source alone refuses.
    #[arg(long)]
    delete_lossy_source: bool,
    /// List bad files in the report and go on instead of stopping; the exit code is then 3
    /// when any file was skipped.
    #[arg(long)]
    skip_bad: bool,
    /// Report of bad files (JSON lines); default DST/convert-report.jsonl.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Threads (default: the cores). Each decodes its own run of source files into its own
    /// shard, so shards are written at once; they are committed in source order.
    #[arg(long, short)]
    jobs: Option<usize>,
    /// Largest shard, in MiB. Shards are made smaller (down to 64 MiB) so that every thread
    /// gets several: a run writes about 4 × jobs shards or more.
    #[arg(long, default_value_t = 2048)]
    shard_mib: u64,
    /// Commit a shard once it holds this many samples.
    #[arg(long, default_value_t = 65_536)]
    shard_samples: u64,
    /// Chunk codec: none, zstd, zstd-bytegroup.
    #[arg(long, default_value = "none")]
    codec: String,
    /// Store fields as FP8 with one f32 scale per row and layer (lossy, about half the bytes
    /// of bf16): `fp8` for every hidden-state field, `fp8:NAME,NAME` for the fields named.
    /// Token ids, loss masks and fields not named stay exact; `hspack info` shows it, and
    /// `hspack compare EXACT QUANTIZED` measures the error.
    #[arg(long, value_name = "fp8[:FIELDS]")]
    quantize: Option<String>,
    /// The capture the dumps are of, for a destination STORE/NAME: a JSON file with `model`,
    /// `revision`, `config_hash`, `engine`, `deterministic`, `dtype` and `layers`, as
    /// `hspack.capture` records them (FORMAT.md §11.7; `fields` may be left out). Samples whose
    /// capture the store holds are copied from it without reading their hidden states, and
    /// every sample converted is recorded as that capture, so later captures skip it.
    #[arg(long, value_name = "FILE")]
    capture_config: Option<PathBuf>,
    /// Skip fsync at commits (scratch data only; refused with --delete-source).
    #[arg(long)]
    no_fsync: bool,
    /// No progress bar and no report on stderr.
    #[arg(long, short)]
    quiet: bool,
    /// Print the report as JSON on stdout, bad files included.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LayoutArg {
    Specforge,
    Eagle,
    Modelopt,
    Speculators,
    Generic,
}

/// The spec the flags and the `--mapping` file give; a key of the file whose flag is given too
/// is refused.
fn spec(a: &Args) -> anyhow::Result<ConvertSpec> {
    let mapping = a.mapping.as_deref().map(Mapping::read).transpose()?;
    let layout = match a.layout {
        LayoutArg::Specforge => Preset::SpecForge,
        LayoutArg::Eagle => Preset::Eagle,
        LayoutArg::Modelopt => Preset::ModelOpt,
        LayoutArg::Speculators => Preset::Speculators,
        LayoutArg::Generic => Preset::Generic,
    };
    let mut spec = ConvertSpec {
        fields: a.fields.iter().cloned().map(FieldArg::Flag).collect(),
        layers: a.layers.clone(),
        points: a.point.clone(),
        num_layers: a.num_layers,
        model: a.model.clone(),
        hidden_size: a.hidden_size,
        split_layers: a.split_layers,
        group_by: a.group_by.clone(),
        split_by: a.split_by.as_deref().map(str::parse).transpose()?,
        split_by_file: a.split_by_file.clone(),
        key_from: a.key_from.clone(),
        trim_padding: a.trim_padding.as_deref().map(str::parse).transpose()?,
        delete_source: a.delete_source,
        delete_lossy_source: a.delete_lossy_source,
        skip_bad: a.skip_bad,
        report: a.report.clone(),
        jobs: a.jobs,
        shard_mib: a.shard_mib,
        shard_samples: a.shard_samples,
        codec: a.codec.clone(),
        quantize: a.quantize.clone(),
        fsync: !a.no_fsync,
        capture: a
            .capture_config
            .as_deref()
            .map(|path| -> anyhow::Result<_> {
                let text = std::fs::read(path)
                    .map_err(|e| anyhow::anyhow!("{}: cannot read the capture config: {e}", path.display()))?;
                serde_json::from_slice(&text).map_err(|e| {
                    anyhow::anyhow!("{}: not a capture config ({e}); give a JSON object with model, revision, config_hash, engine, deterministic, dtype and layers", path.display())
                })
            })
            .transpose()?,
        ..ConvertSpec::new(&a.src, &a.dst, layout)
    };
    if let (Some(m), Some(path)) = (mapping, &a.mapping) {
        spec.merge_mapping(m, path)?;
    }
    Ok(spec)
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let spec = spec(&a)?;
    let bar = ProgressBar::new(0);
    if a.quiet || a.json {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template(
            "convert [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    let (mut done, mut total) = (0u64, 0u64);
    let report = convert::run(&spec, &mut |p| match p {
        Progress::Start { units, bytes } => {
            total = units;
            bar.set_length(bytes);
            bar.set_message(format!("0/{total} files"));
        }
        Progress::Advance { bytes } => {
            done += 1;
            bar.inc(bytes);
            bar.set_message(format!("{done}/{total} files"));
        }
    });
    bar.finish_and_clear();
    let r = report?;
    let secs = r.elapsed.as_secs_f64();
    if a.json {
        let v = serde_json::json!({
            "units": r.units, "converted": r.converted, "already_present": r.present,
            "samples": r.samples, "samples_already_present": r.samples_present,
            "reused": r.reused, "samples_reused": r.samples_reused,
            "captures_stale": r.captures_stale,
            "source_bytes": r.source_bytes, "ignored": r.ignored, "deleted": r.deleted, "kept": r.kept,
            "same_file": r.aliases.iter().map(|(file, first)| serde_json::json!({"file": file.display().to_string(), "converted_as": first.display().to_string()})).collect::<Vec<_>>(),
            "bad": r.bad.iter().map(|b| serde_json::json!({"file": b.file.display().to_string(), "error": b.error})).collect::<Vec<_>>(),
            "report": r.report_path.as_ref().map(|p| p.display().to_string()),
            "dataset": {"path": spec.dst.display().to_string(), "samples": r.stats.samples, "shards": r.stats.shards,
                        "bytes": r.stats.bytes},
            "seconds": secs,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    let mut lines = vec![
        format!(
            "converted {} of {} units ({} already in the dataset and skipped, {} bad, {} other \
             files ignored)",
            r.converted,
            r.units,
            r.present,
            r.bad.len(),
            r.ignored
        ),
        format!(
            "appended  {} ({} already in the dataset and skipped), {} of sources in \
             {secs:.2} s: {}",
            count(r.samples, "sample"),
            r.samples_present,
            human_bytes(r.source_bytes),
            rate_text(r.source_bytes, secs)
        ),
        format!(
            "dataset   {}: {} in {}, {}",
            spec.dst.display(),
            count(r.stats.samples, "sample"),
            count(r.stats.shards, "shard"),
            human_bytes(r.stats.bytes)
        ),
    ];
    if spec.capture.is_some() {
        let stale = match r.captures_stale {
            0 => String::new(),
            n => format!("; {n} recorded captures were gone or changed and were converted"),
        };
        lines.push(format!(
            "reused    {} samples from the store ({} files whose hidden states were not read){stale}",
            r.samples_reused, r.reused
        ));
    }
    if spec.delete_source {
        let kept = match r.kept {
            0 => String::new(),
            n => format!(
                "; kept {n} units whose samples the dataset holds with other hidden states \
                 than theirs (the same tokens and capture config), that could not be read \
                 again to compare, or whose files were written again after they were read: \
                 compare them before deleting them by hand (a rerun compares each with what \
                 the dataset holds, deleting what matches and refusing what does not)"
            ),
        };
        lines.push(format!("deleted   {} source files{kept}", r.deleted));
    }
    if !r.aliases.is_empty() {
        lines.push(format!(
            "linked    {} under a second name (a hard link, or a symbolic link to a file) of a \
             file converted under the name shown, so converted once:",
            count(r.aliases.len() as u64, "file")
        ));
        const SHOWN: usize = 20;
        for (file, first) in r.aliases.iter().take(SHOWN) {
            lines.push(format!("  {} is {}", file.display(), first.display()));
        }
        if r.aliases.len() > SHOWN {
            lines.push(format!("  ... and {} more", r.aliases.len() - SHOWN));
        }
    }
    if !r.bad.is_empty() {
        let listed = r
            .report_path
            .as_ref()
            .map(|p| format!(", listed in {}", p.display()))
            .unwrap_or_default();
        lines.push(format!(
            "skipped   {}, whose samples the dataset lacks{listed}:",
            count(r.bad.len() as u64, "bad file")
        ));
        const SHOWN: usize = 20;
        for b in r.bad.iter().take(SHOWN) {
            lines.push(format!("  {}: {}", b.file.display(), b.error));
        }
        if r.bad.len() > SHOWN {
            lines.push(format!("  ... and {} more", r.bad.len() - SHOWN));
        }
        lines.push(format!(
            "exit code {EXIT_SKIPPED}: fix or remove the bad files and rerun to add the rest"
        ));
    }
    if !a.quiet && !a.json {
        for l in lines {
            eprintln!("{l}");
        }
    }
    Ok(if r.bad.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_SKIPPED)
    })
}
