//! `hspack export`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use hspack::format::schema::check_field_name;
use hspack::{DType, Dataset, Tensor};
use safetensors::{Dtype, View};

#[derive(Clone, Copy, clap::ValueEnum)]
enum To {
    /// One .safetensors file holding every field.
    Safetensors,
    /// A folder with one .npy file per field (bf16 and fp8 as their raw bits, uint16 and
    /// uint8: numpy has no such types).
    Npy,
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(help = super::DATASET)]
    dir: PathBuf,
    #[command(flatten)]
    sample: super::SampleArg,
    /// Output format.
    #[arg(long)]
    to: To,
    /// Output file (safetensors) or folder (npy). A file there already is refused, unless
    /// --force; a path inside the dataset's folder always.
    #[arg(long, short)]
    out: PathBuf,
    /// Replace output files already there (each written beside it first, then renamed over it).
    #[arg(long)]
    force: bool,
    /// Export only these fields (comma-separated).
    #[arg(long, value_delimiter = ',')]
    fields: Vec<String>,
}

struct StView<'a>(&'a Tensor, Vec<usize>);

impl View for &StView<'_> {
    fn dtype(&self) -> Dtype {
        match self.0.dtype {
            DType::Bool => Dtype::BOOL,
            DType::U8 => Dtype::U8,
            DType::I8 => Dtype::I8,
            DType::I16 => Dtype::I16,
            DType::I32 => Dtype::I32,
            DType::I64 => Dtype::I64,
            DType::F16 => Dtype::F16,
            DType::BF16 => Dtype::BF16,
            DType::F32 => Dtype::F32,
            DType::F64 => Dtype::F64,
            DType::F8E4M3FN => Dtype::F8_E4M3,
            _ => Dtype::F8_E5M2,
        }
    }
    fn shape(&self) -> &[usize] {
        &self.1
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.0.bytes())
    }
    fn data_len(&self) -> usize {
        self.0.bytes().len()
    }
}

/// The numpy dtype string of a dtype, where numpy has one.
fn npy_descr(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::Bool => "|b1",
        DType::U8 => "|u1",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        // numpy has no bf16 or fp8: store the raw bits as unsigned integers.
        DType::BF16 => "<u2",
        DType::F8E4M3FN | DType::F8E5M2 => "|u1",
        _ => return None,
    })
}

/// The numpy type a dtype numpy lacks is exported as (its raw bits).
fn raw_bits(d: DType) -> Option<&'static str> {
    match d {
        DType::BF16 => Some("uint16"),
        DType::F8E4M3FN | DType::F8E5M2 => Some("uint8"),
        _ => None,
    }
}

/// The name `ml_dtypes` and torch both give a dtype numpy lacks.
fn lacked_type_name(d: DType) -> &'static str {
    match d {
        DType::F8E4M3FN => "float8_e4m3fn",
        DType::F8E5M2 => "float8_e5m2",
        _ => "bfloat16",
    }
}

/// `dir/{name}{ext}`: joins one plain path component and refuses anything else, so a field
/// name never leads outside `dir`, even one that got past the naming rule of manifests.
fn file_in(dir: &Path, name: &str, ext: &str) -> anyhow::Result<PathBuf> {
    check_field_name(name).with_context(|| format!("cannot export field {name:?} as a file"))?;
    let file = format!("{name}{ext}");
    let mut parts = Path::new(&file).components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(one)), None) if one == file.as_str() => Ok(dir.join(one)),
        _ => anyhow::bail!(
            "cannot export field {name:?}: {file:?} is not a plain file name, so it could land outside {}; rename the field",
            dir.display()
        ),
    }
}

/// Refuses an output path inside the dataset's folder `dir`: an export there would put files
/// among the dataset's, or replace one of them.
fn outside_dataset(out: &Path, dir: &Path) -> anyhow::Result<()> {
    // What of `out` is there yet: itself, or the nearest folder above it.
    let there = out
        .ancestors()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .find_map(|p| std::fs::canonicalize(p).ok());
    // A dataset that is no folder (object storage, `STORE/NAME`) has no files here to hit.
    if let (Some(there), Ok(dir)) = (there, std::fs::canonicalize(dir)) {
        if there.starts_with(&dir) {
            anyhow::bail!(
                "{} is inside the dataset's folder {}: an export there would put files among \
                 the dataset's or replace one of them; choose an --out outside it",
                out.display(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// A file there already, refused unless `force`, before anything is written.
fn refuse_existing(path: &Path, force: bool) -> anyhow::Result<()> {
    if !force && std::fs::symlink_metadata(path).is_ok() {
        anyhow::bail!(
            "{} exists; choose another --out, or give --force to replace it",
            path.display()
        );
    }
    Ok(())
}

/// Writes the file `path` with `write`, into a new file beside it first, then links it in
/// (renames it over a file there with `force`): a file there is never written into, so one
/// another process maps is never cut short under it, and a failed write leaves nothing.
fn publish(
    path: &Path,
    force: bool,
    write: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let name = path.file_name().context("the output path names no file")?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !folder.is_dir() {
        anyhow::bail!(
            "cannot write {}: there is no folder {}; make it first (`mkdir -p {}`), or choose \
             another --out",
            path.display(),
            folder.display(),
            folder.display()
        );
    }
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".hspack-export-{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = write(&tmp).and_then(|()| {
        let linked = match force {
            true => std::fs::rename(&tmp, path),
            false => std::fs::hard_link(&tmp, path),
        };
        match linked {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => refuse_existing(path, false),
            other => other.with_context(|| format!("cannot write {}", path.display())),
        }
    });
    let _ = std::fs::remove_file(&tmp);
    written
}

fn write_npy(path: &Path, t: &Tensor) -> anyhow::Result<()> {
    let descr = npy_descr(t.dtype).context("no numpy dtype")?;
    let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
    let shape = if shape.len() == 1 {
        format!("({},)", shape[0])
    } else {
        format!("({})", shape.join(", "))
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.bytes().len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(t.bytes());
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}

pub fn run(a: Args) -> anyhow::Result<ExitCode> {
    let ds = match Dataset::open(&a.dir) {
        Ok(ds) => ds,
        Err(e) => return super::open_failed(e, false),
    };
    let read = || -> anyhow::Result<_> {
        let s = a.sample.sample(&ds)?;
        let names: Vec<String> = if a.fields.is_empty() {
            ds.schema().fields.iter().map(|f| f.name.clone()).collect()
        } else {
            a.fields.clone()
        };
        if let Some(twice) = names
            .iter()
            .find(|n| names.iter().filter(|m| m == n).count() > 1)
        {
            anyhow::bail!("--fields names `{twice}` twice: name each field once");
        }
        let mut tensors = Vec::new();
        for n in &names {
            tensors.push((n.clone(), s.read(n, None)?));
        }
        Ok((s, tensors))
    };
    outside_dataset(&a.out, &a.dir)?;
    // Damage met reading the sample exits 1, as `verify` does; other errors 2.
    let (s, tensors) = match read() {
        Ok(read) => read,
        Err(e) => return Ok(super::read_failed(e)),
    };
    match a.to {
        To::Safetensors => {
            let views: Vec<(String, StView)> = tensors
                .iter()
                .map(|(n, t)| {
                    (
                        n.clone(),
                        StView(t, t.shape.iter().map(|&d| d as usize).collect()),
                    )
                })
                .collect();
            if let Some((n, _)) = tensors.iter().find(|(n, _)| n == "__metadata__") {
                anyhow::bail!(
                    "field `{n}` cannot be exported to safetensors, which keeps that name for \
                     its metadata; export it with --to npy"
                );
            }
            refuse_existing(&a.out, a.force)?;
            let mut info = HashMap::new();
            info.insert("hspack_key".to_string(), s.key().to_string());
            info.insert("hspack_ordinal".to_string(), s.ordinal().to_string());
            publish(&a.out, a.force, |tmp| {
                safetensors::serialize_to_file(
                    views.iter().map(|(n, v)| (n.clone(), v)),
                    Some(info),
                    tmp,
                )
                .with_context(|| format!("cannot write {}", tmp.display()))
            })?;
        }
        To::Npy => {
            let files = tensors
                .iter()
                .map(|(n, _)| file_in(&a.out, n, ".npy"))
                .collect::<anyhow::Result<Vec<_>>>()?;
            for path in &files {
                refuse_existing(path, a.force)?;
            }
            std::fs::create_dir_all(&a.out)
                .with_context(|| format!("cannot create {}", a.out.display()))?;
            for (path, (_, t)) in files.iter().zip(&tensors) {
                publish(path, a.force, |tmp| write_npy(tmp, t))?;
                if let Some(bits) = raw_bits(t.dtype) {
                    eprintln!(
                        "NOTE {}: {} stored as its raw bits ({bits}: numpy has no {1}); view it \
                         as {1} with ml_dtypes (`a.view(ml_dtypes.{2})`) or torch \
                         (`torch.from_numpy(a).view(torch.{2})`)",
                        path.display(),
                        t.dtype.name(),
                        lacked_type_name(t.dtype),
                    );
                }
            }
        }
    }
    eprintln!(
        "exported {} fields of `{}` to {}",
        tensors.len(),
        s.key(),
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_stay_in_the_output_folder() {
        let out = Path::new("out");
        assert_eq!(
            file_in(out, "hidden.2", ".npy").unwrap(),
            Path::new("out/hidden.2.npy")
        );
        for name in [
            "../../PWN",
            "/tmp/x/PWN",
            "a/b",
            "a\\b",
            ".",
            "..",
            "",
            "x/",
        ] {
            let e = format!("{:#}", file_in(out, name, ".npy").unwrap_err());
            assert!(e.contains(&format!("{name:?}")), "{name:?}: {e}");
        }
    }
}
