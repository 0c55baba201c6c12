//! The lane pipeline: threads decode runs of units into shards of their own (a
//! [`ShardLane`] each), and the calling thread commits the shards in source order.
//!
//! Writes into one file do not get faster with more threads; writes into several files do, so
//! threads write shards, not samples. Ordinals follow the source order whatever the threads.
//! Memory is bounded: a thread holds one decoded unit at a time, and at most `1.5 × jobs`
//! groups are started ahead of the next commit.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};

use crate::read::{Dataset, ReadOptions};
use crate::store::captures::{sample_digest, sample_tensors, written_digest, CaptureConfig};
use crate::write::{DatasetWriter, Lanes, ShardLane, WriteOptions};

use super::groups::shard_groups;
use super::job::RunError;
use super::prepare::{sample_rows, Decoder, Prepared};
use super::report::Progress;
use super::unit_error::UnitError;
use super::units::Unit;

/// How the lanes run.
pub(super) struct LaneOptions<'a> {
    /// Threads, each writing its own shards.
    pub jobs: usize,
    /// Writer options: the shard size and sample count, fsync.
    pub write: &'a WriteOptions,
    /// End a group at its first bad unit (without `--skip-bad`).
    pub stop_at_bad: bool,
    /// Skip samples whose keys the dataset holds as they come.
    pub skip_present: bool,
    /// Compare every such sample with what the dataset holds before it is skipped: its
    /// source is deleted after (`--delete-source`).
    pub compare_all: bool,
    /// Units (by key) whose files the key log says gave what the dataset holds: without
    /// `compare_all`, their samples are skipped uncompared; others' are compared.
    pub trusted: &'a HashSet<String>,
    /// Record each sample appended as this capture (its key and digest).
    pub capture: Option<&'a CaptureConfig>,
}

/// Commits a written group of units: records what they gave, commits its shards.
pub(super) type Commit<'c> =
    dyn FnMut(&[Unit], GroupDone, &mut DatasetWriter) -> Result<(), RunError> + 'c;

/// Writes `todo` into shards on `lanes.jobs` threads, a group of units each (planned by
/// [`shard_groups`]), and hands each written group to `commit` in source order.
pub(super) fn write_in_lanes(
    decoder: &Decoder,
    todo: &[Unit],
    writer: &mut DatasetWriter,
    lanes: LaneOptions<'_>,
    progress: &mut dyn FnMut(Progress),
    commit: &mut Commit<'_>,
) -> Result<(), RunError> {
    let jobs = lanes.jobs.max(1);
    let groups = shard_groups(todo, lanes.write, jobs);
    // Groups started ahead of the next commit: enough to keep every thread busy while one
    // finishes late, few enough that uncommitted shards stay a bounded share of the disk.
    let window = jobs + jobs.div_ceil(2);
    // Units whose samples the dataset holds were left out of `todo` by key, except split
    // units (keys known only once decoded) and keys taken from the files: with those, a
    // sample already committed is skipped as it comes, even when the key log is gone.
    let present: HashSet<String> = if lanes.skip_present {
        writer.keys().map(str::to_string).collect()
    } else {
        HashSet::new()
    };
    // What the dataset holds under those keys, compared with what the sources give before a
    // sample is skipped (and its file deleted as converted before).
    let stored = match !present.is_empty() {
        false => None,
        true => Some(Dataset::open_in(
            std::sync::Arc::clone(writer.storage()),
            ReadOptions::default(),
        )?),
    };
    let lane = LaneJob {
        decoder,
        todo,
        lanes: writer.lanes(),
        write: lanes.write,
        stop_at_bad: lanes.stop_at_bad,
        present: &present,
        compare_all: lanes.compare_all,
        trusted: lanes.trusted,
        stored: stored.as_ref(),
        capture: lanes.capture,
        stop: AtomicBool::new(false),
    };
    let (job_tx, job_rx) = mpsc::channel::<usize>();
    let job_rx = Mutex::new(job_rx);
    std::thread::scope(|scope| {
        // Owned by this closure: however it returns, the queue closes and the threads end.
        let job_tx = job_tx;
        let (msg_tx, msg_rx) = mpsc::channel::<Message>();
        // No more threads than groups; where the system refuses one, those started do the
        // work (none started is an error, not a panic).
        for i in 0..jobs.min(groups.len()) {
            let msg_tx = msg_tx.clone();
            let (job_rx, lane, groups) = (&job_rx, &lane, &groups);
            let started = std::thread::Builder::new().spawn_scoped(scope, move || loop {
                let next = job_rx.lock().map(|rx| rx.recv());
                let Ok(Ok(g)) = next else { break };
                let first = &todo[groups[g].start].files[0].1;
                let done = caught(first, || lane.run(groups[g].clone(), &msg_tx));
                if msg_tx.send(Message::Group(g, done)).is_err() {
                    break;
                }
            });
            match started {
                Ok(_) => {}
                Err(_) if i > 0 => break,
                Err(e) => {
                    return Err(RunError::Dataset(crate::Error::Io {
                        path: writer.dir().to_path_buf(),
                        op: "start a conversion thread",
                        source: e,
                    }))
                }
            }
        }
        drop(msg_tx);
        let stopping = |e: RunError| {
            lane.stop.store(true, Ordering::Relaxed);
            Err(e)
        };
        let mut fed = 0;
        let mut ready = BTreeMap::new();
        for next in 0..groups.len() {
            while fed < groups.len() && fed < next + window {
                let _ = job_tx.send(fed);
                fed += 1;
            }
            let done = loop {
                if let Some(done) = ready.remove(&next) {
                    break done;
                }
                match msg_rx.recv() {
                    Ok(Message::Unit { bytes }) => progress(Progress::Advance { bytes }),
                    Ok(Message::Group(g, done)) => {
                        ready.insert(g, done);
                    }
                    Err(_) => unreachable!("workers stay while groups are queued"),
                }
            };
            let committed = match done {
                Ok(done) => commit(&todo[groups[next].clone()], done, writer),
                Err(e) => Err(e),
            };
            if let Err(e) = committed {
                return stopping(e);
            }
        }
        Ok(())
    })
}

/// Runs `f`, turning a panic (a bug) into an error naming `file`: a thread that panicked must
/// end the run with an error, not leave the committing thread waiting for its group.
fn caught<T>(file: &Path, f: impl FnOnce() -> Result<T, RunError>) -> Result<T, RunError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let detail = match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
            (Some(s), _) => s.to_string(),
            (_, Some(s)) => s.clone(),
            _ => "a thread panicked".into(),
        };
        Err(RunError::Internal {
            file: file.to_path_buf(),
            detail,
        })
    })
}

/// From the threads writing groups to the thread committing them.
enum Message {
    /// A unit was decoded and written (or found bad), of `bytes` source bytes.
    Unit { bytes: u64 },
    /// A group is written.
    Group(usize, Result<GroupDone, RunError>),
}

/// A written group: its shards, and what became of each unit, in order. A group stopped at a
/// bad unit (without `--skip-bad`) ends with that unit.
pub(super) struct GroupDone {
    pub lanes: Vec<ShardLane>,
    pub outcomes: Vec<Outcome>,
}

pub(super) enum Outcome {
    /// Samples appended, and samples skipped as committed before, of the unit's key.
    Converted {
        key: String,
        /// Whether `key` was read from the files and goes to the key log.
        stored_key: bool,
        appended: u64,
        present: u64,
        /// The sample keys, when read one per request (`key_from` naming a list of ids).
        request_keys: Vec<String>,
        /// With a capture config: `(capture key, digest, sample key)` of each sample
        /// appended.
        captures: Vec<([u8; 32], [u8; 32], String)>,
        /// A sample the dataset held under the same capture holds other hidden states than
        /// the source's: the source is kept (never deleted).
        kept: bool,
    },
    /// Why the unit is bad.
    Bad(UnitError),
}

/// What every writing thread shares.
struct LaneJob<'a> {
    decoder: &'a Decoder,
    todo: &'a [Unit],
    lanes: Lanes,
    write: &'a WriteOptions,
    stop_at_bad: bool,
    /// Keys committed before this run, with split units or `--key-from` (others are skipped
    /// whole before the run).
    present: &'a HashSet<String>,
    /// Compare every sample skipped as held with what the dataset holds.
    compare_all: bool,
    /// Units whose held samples are skipped uncompared, without `compare_all`.
    trusted: &'a HashSet<String>,
    /// The dataset as committed before this run, where `present` holds keys.
    stored: Option<&'a Dataset>,
    capture: Option<&'a CaptureConfig>,
    /// Set when the run fails: threads leave their groups.
    stop: AtomicBool,
}

impl LaneJob<'_> {
    /// Decodes the group's units one at a time and appends their samples to its shards.
    fn run(&self, group: Range<usize>, msg: &mpsc::Sender<Message>) -> Result<GroupDone, RunError> {
        let mut done = GroupDone {
            lanes: vec![self.lanes.open()?],
            outcomes: Vec::with_capacity(group.len()),
        };
        let mut first_unit_of: HashMap<String, &Path> = HashMap::new();
        for unit in &self.todo[group] {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let outcome = match self.decoder.prepare(unit) {
                Ok(p) => {
                    let file = &unit.files[0].1;
                    let per_request = self.decoder.key_from.is_some() && !p.stored_key;
                    let keys: Vec<&String> = match per_request {
                        true => p.samples.iter().map(|s| &s.0).collect(),
                        false => vec![&p.key],
                    };
                    for key in keys {
                        if let Some(other) = first_unit_of.insert(key.clone(), file) {
                            return Err(RunError::DuplicateKey {
                                key: key.clone(),
                                a: other.to_path_buf(),
                                b: file.clone(),
                            });
                        }
                    }
                    let compare = self.compare_all || !self.trusted.contains(&unit.key);
                    let outcome = self.append(&p, compare, &mut done.lanes);
                    self.decoder.recycle(p);
                    outcome?
                }
                Err(e) => Outcome::Bad(e),
            };
            let stop = self.stop_at_bad && matches!(outcome, Outcome::Bad(_));
            done.outcomes.push(outcome);
            let _ = msg.send(Message::Unit { bytes: unit.bytes });
            if stop {
                break;
            }
        }
        if self.write.durable {
            for lane in &mut done.lanes {
                lane.sync_data()?;
            }
        }
        Ok(done)
    }

    /// Refuses a sample whose key the dataset holds with other data (a source converted
    /// earlier gave the key): it is neither skipped as converted nor deleted. Quantized fields
    /// are compared as they decode. With a capture config, what is compared is the capture
    /// (its key: the token ids and loss mask under the config), as a sample copied from the
    /// store was never compared with its source's hidden states. Returns whether the stored
    /// sample holds the source's bytes: where it does not (the same capture, other hidden
    /// states), the source is not deleted.
    fn check_same_as_stored(
        &self,
        key: &str,
        named: &[(&str, &[u8])],
        p: &Prepared,
    ) -> Result<bool, RunError> {
        let Some(ds) = self.stored else {
            return Ok(true);
        };
        let ordinal = ds.get_by_key(key)?.ordinal();
        let stored = sample_tensors(ds, ordinal)?;
        let pairs: Vec<(&str, &[u8])> = stored
            .iter()
            .map(|(n, t)| (n.as_str(), t.bytes()))
            .collect();
        let schema = &self.decoder.schema;
        let equal = sample_digest(pairs.iter().copied()) == written_digest(schema, named);
        let captured = self
            .capture
            .and_then(|c| Some((c.key_of(schema, &pairs)?, c.key_of(schema, named)?)));
        let same = match captured {
            Some((held, given)) => held == given,
            None => equal,
        };
        if same {
            return Ok(equal);
        }
        Err(RunError::KeyHeldWithOtherData {
            key: key.to_string(),
            file: p.inputs.path().to_path_buf(),
        })
    }

    /// Appends the samples of `p`; those whose keys the dataset holds are skipped, compared
    /// with what it holds first where `compare` says.
    fn append(
        &self,
        p: &Prepared,
        compare: bool,
        lanes: &mut Vec<ShardLane>,
    ) -> Result<Outcome, RunError> {
        let decoder = self.decoder;
        let mut fields = Vec::with_capacity(decoder.specs.len());
        for f in 0..decoder.specs.len() {
            match decoder.field(p, f) {
                Ok(b) => fields.push(b),
                Err(e) => return Ok(Outcome::Bad(e)),
            }
        }
        let (mut appended, mut present, mut kept) = (0, 0, false);
        let mut captures = Vec::new();
        for (key, rows) in &p.samples {
            let named = sample_rows(&decoder.schema, &fields, rows);
            if self.present.contains(key) {
                if compare {
                    kept |= !self.check_same_as_stored(key, &named, p)?;
                }
                present += 1;
                continue;
            }
            let raw: u64 = named.iter().map(|(_, b)| b.len() as u64).sum();
            let lane = lanes.last_mut().expect("a group has a lane");
            if self
                .write
                .shard_is_full(lane.len(), lane.sample_count(), raw)
            {
                lanes.push(self.lanes.open()?);
            }
            lanes
                .last_mut()
                .expect("a group has a lane")
                .append(key, &named)?;
            appended += 1;
            if let Some(config) = self.capture {
                // Token ids that are no integers failed `capture_keys` and were not reused:
                // such a sample is converted, not recorded.
                if let Some(capture) = config.key_of(&decoder.schema, &named) {
                    let digest = written_digest(&decoder.schema, &named);
                    captures.push((capture, digest, key.clone()));
                }
            }
        }
        let per_request = decoder.key_from.is_some() && !p.stored_key;
        Ok(Outcome::Converted {
            key: p.key.clone(),
            stored_key: p.stored_key,
            appended,
            present,
            request_keys: match per_request {
                true => p.samples.iter().map(|s| s.0.clone()).collect(),
                false => Vec::new(),
            },
            captures,
            kept,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_error_naming_the_file() {
        let file = Path::new("/src/rows_0-16/data_3.ckpt");
        let e = caught::<()>(file, || panic!("index {} out of range", 7)).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, RunError::Internal { .. }), "{e:?}");
        assert!(
            text.contains("data_3.ckpt") && text.contains("index 7 out of range"),
            "{text}"
        );
        assert_eq!(caught(file, || Ok(5)).unwrap(), 5);
    }
}
