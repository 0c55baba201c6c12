//! One writer per dataset in object storage: a lease object, `.hspack-writer.lease`, taken
//! with a conditional put and renewed while the writer lives.
//!
//! Object stores have no lock a dead process releases, so the lease expires instead: its
//! holder rewrites it every third of [`lease_ttl`] (`If-Match` on the ETag it wrote last); a
//! writer that finds it unexpired is refused ([`Error::Locked`], naming the holder), one that
//! finds it expired (its writer died, or hung for longer than the TTL) takes it over with
//! `If-Match` on the ETag it read, so of two contenders one wins. A writer dropped normally
//! marks its lease expired. Expiry compares the holder's clock with the contender's, so
//! clocks that disagree by more than the TTL make a takeover early or late: nothing more.
//!
//! Safety does not rest on the lease or on clocks. A writer that takes a dataset over first
//! writes its token into the manifest (`writer.lease`, FORMAT.md §6) by compare-and-swap, and
//! only then removes what the previous writer left; every commit replaces the manifest only
//! over the one its writer last wrote. So a writer whose lease was taken over (it hung past
//! the TTL, its network was cut) fails its next commit with [`Error::CommitConflict`] and can
//! never list a shard the new holder removed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use object_store::{PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use super::object::{is_conflict, object_error, ObjectStorage};
use super::{Storage, WriterLease};

/// Name of the lease object in the dataset's prefix.
pub const LEASE_FILE: &str = ".hspack-writer.lease";

/// How long a lease lasts unless renewed: 60 s, or `HSPACK_WRITER_LEASE_SECS`.
pub fn lease_ttl() -> Duration {
    env_seconds("HSPACK_WRITER_LEASE_SECS", 60.0, false)
}

/// The longest life or wait a variable may give: a week.
const MAX_ENV_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// The seconds the variable `name` gives (zero only `with_zero`; at most [`MAX_ENV_SECS`]),
/// else `default`.
fn env_seconds(name: &str, default: f64, with_zero: bool) -> Duration {
    let secs = std::env::var(name)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && (*s > 0.0 || (with_zero && *s == 0.0)))
        .unwrap_or(default)
        .min(MAX_ENV_SECS);
    Duration::from_secs_f64(secs)
}

/// What the lease object holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LeaseText {
    token: String,
    host: String,
    pid: u32,
    /// Milliseconds since the Unix epoch, by the holder's clock; 0 once released.
    expires_unix_ms: u64,
    /// Held for one commit by one of several writers sharing the dataset
    /// (`WriteOptions::shared`), who wait for each other; a sole writer holds it for its life.
    #[serde(default)]
    shared: bool,
    /// When a collector revoked it (an expired lease of an add, §11.6 of FORMAT.md), by the
    /// collector's clock; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revoked_unix_ms: Option<u64>,
}

impl LeaseText {
    fn live(&self) -> bool {
        self.expires_unix_ms > now_ms()
    }

    /// Who holds it, for [`Error::Locked`].
    fn holder(&self, storage: &ObjectStorage, file: &str) -> Error {
        let expires = self.expires_unix_ms.saturating_sub(now_ms()) as f64 / 1000.0;
        // No such process here: interrupted or killed (its lease stays until it expires),
        // unless it runs in another container of the same host name, which cannot be told.
        let gone = match crate::io::lock::exited_here(self.pid, &self.host) {
            true => {
                "; no process of that id runs here: if it was interrupted or killed, run \
                 again once its lease expires"
            }
            false => "",
        };
        let holder = format!(
            "pid {} on {}, by its lease {file}, which expires in {expires:.0} s unless that \
             writer renews it{}{gone}",
            self.pid,
            self.host,
            match self.shared {
                true => " (a writer sharing the dataset, committing)",
                false => "",
            }
        );
        Error::Locked {
            path: storage.root().to_path_buf(),
            holder,
        }
    }
}

/// How long a lock is waited for (the commit lease or lock of a writer sharing a dataset,
/// the store's leases and locks): 600 s, or `HSPACK_COMMIT_WAIT_SECS`.
pub fn commit_wait() -> Duration {
    env_seconds("HSPACK_COMMIT_WAIT_SECS", 600.0, true)
}

/// A writer sharing a dataset in object storage, between its commits: it holds nothing.
#[derive(Debug)]
pub struct Member {
    pid: u32,
}

impl Default for Member {
    /// A member of this process.
    fn default() -> Member {
        Member {
            pid: std::process::id(),
        }
    }
}

impl WriterLease for Member {
    fn is_owner(&self) -> bool {
        self.pid == std::process::id()
    }
}

/// Joins the dataset in `storage` as one of several writers: refused while a sole writer
/// holds its lease. Nothing is held: each commit takes the lease ([`ObjectLease::take_shared`]).
pub fn join(storage: &ObjectStorage) -> Result<()> {
    storage.writable(LEASE_FILE)?;
    match read(storage, LEASE_FILE)? {
        Some((text, _)) if text.live() && !text.shared => Err(text.holder(storage, LEASE_FILE)),
        _ => Ok(()),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// A held lease: renewed on a thread of the process that took it.
#[derive(Debug)]
pub struct ObjectLease {
    token: String,
    pid: u32,
    state: Arc<Held>,
    /// Dropped to stop the renewing thread.
    stop: Option<mpsc::Sender<()>>,
}

#[derive(Debug)]
struct Held {
    storage: ObjectStorage,
    /// The lease object's name.
    file: String,
    /// Deleted when released (a lease of a name only its holder uses), not marked expired.
    remove_on_release: bool,
    text: Mutex<(LeaseText, UpdateVersion)>,
    lost: AtomicBool,
    /// The life each renewal gives.
    ttl: Duration,
}

impl ObjectLease {
    /// Takes the lease of the dataset in `storage`, or says who holds it.
    pub fn take(storage: &ObjectStorage) -> Result<ObjectLease> {
        ObjectLease::take_file(storage, LEASE_FILE)
    }

    /// Takes the lease object `file` of `storage`, or says who holds it.
    pub fn take_file(storage: &ObjectStorage, file: &str) -> Result<ObjectLease> {
        ObjectLease::try_take(storage, file, false, false)?
            .map_err(|held| held.holder(storage, file))
    }

    /// Makes a new lease object `file`, a name no other holder uses (it fails when the name is
    /// taken), deleted when released.
    pub fn take_new(storage: &ObjectStorage, file: &str) -> Result<ObjectLease> {
        ObjectLease::try_take(storage, file, true, true)?.map_err(|held| held.holder(storage, file))
    }

    /// Takes the lease for one commit of a writer sharing the dataset, waiting while other
    /// such writers hold it (up to [`commit_wait`]); refused at once by a sole writer's.
    pub fn take_shared(storage: &ObjectStorage) -> Result<ObjectLease> {
        ObjectLease::take_waiting(storage, LEASE_FILE)
    }

    /// Takes lease object `file`, waiting while holders that took it this way hold it (up to
    /// [`commit_wait`]); refused at once by one that took it with [`ObjectLease::take_file`].
    pub fn take_waiting(storage: &ObjectStorage, file: &str) -> Result<ObjectLease> {
        let deadline = std::time::Instant::now() + commit_wait();
        let mut pause = Backoff::up_to(Duration::from_millis(200));
        loop {
            match ObjectLease::try_take(storage, file, true, false)? {
                Ok(lease) => return Ok(lease),
                Err(held) if !held.shared || std::time::Instant::now() >= deadline => {
                    return Err(held.holder(storage, file))
                }
                Err(_) => pause.wait(),
            }
        }
    }

    /// Takes the lease, or returns what the live holder wrote.
    fn try_take(
        storage: &ObjectStorage,
        file: &str,
        shared: bool,
        new: bool,
    ) -> Result<std::result::Result<ObjectLease, LeaseText>> {
        storage.writable(file)?;
        let token = hex16(super::unique_id(
            storage.root().as_os_str().as_encoded_bytes(),
        ));
        let ttl = lease_ttl();
        for _ in 0..8 {
            let found = match new {
                true => None,
                false => read(storage, file)?,
            };
            let mode = match &found {
                None => PutMode::Create,
                Some((text, version)) => {
                    if text.live() {
                        return Ok(Err(text.clone()));
                    }
                    PutMode::Update(version.clone())
                }
            };
            let text = LeaseText {
                token: token.clone(),
                host: super::lock::host_name(),
                pid: std::process::id(),
                expires_unix_ms: now_ms() + ttl.as_millis() as u64,
                shared,
                revoked_unix_ms: None,
            };
            // A put whose response was lost may have landed: refused when retried (it
            // finds its own write), or failed in transit. The lease, read again, tells.
            let put = match put(storage, file, &text, mode) {
                Ok(Some(version)) => Some(version),
                Ok(None) => landed(storage, file, &token)?,
                Err(e) => Some(landed(storage, file, &token).ok().flatten().ok_or(e)?),
            };
            match put {
                Some(version) => {
                    let version = match enforced(storage, file, &text, version) {
                        Ok(version) => version,
                        Err(e) => {
                            // Not held: left live, it would keep every writer out for its life.
                            let _ = storage.delete(file);
                            return Err(e);
                        }
                    };
                    let state = Arc::new(Held {
                        storage: storage.clone(),
                        file: file.to_string(),
                        remove_on_release: new,
                        text: Mutex::new((text, version)),
                        lost: AtomicBool::new(false),
                        ttl,
                    });
                    let (stop, stopped) = mpsc::channel();
                    let renewing = Arc::clone(&state);
                    std::thread::Builder::new()
                        .name("hspack-lease".into())
                        .spawn(move || renew_until_stopped(&renewing, &stopped, ttl))
                        .map_err(|e| super::object::other(storage.root(), "lease", e))?;
                    return Ok(Ok(ObjectLease {
                        token,
                        pid: std::process::id(),
                        state,
                        stop: Some(stop),
                    }));
                }
                // Another writer put or renewed the lease between our read and our put.
                None if !new => continue,
                None => break,
            }
        }
        Err(Error::Locked {
            path: storage.root().to_path_buf(),
            holder: format!("writers racing for its lease {file}"),
        })
    }
}

/// The prefixes (with the endpoint they were reached at) of this process whose server was
/// seen to enforce conditional puts.
static ENFORCING: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// `version`, once the server is seen to refuse the conditional puts leases and manifests
/// rest on (once per prefix and process): a create over the lease just taken (`If-None-Match`)
/// and an update against a version it does not have (`If-Match`). A server that ignores them
/// would let two writers both commit, each over the other's manifest: refused, naming it.
fn enforced(
    storage: &ObjectStorage,
    file: &str,
    text: &LeaseText,
    version: UpdateVersion,
) -> Result<UpdateVersion> {
    let endpoint = ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .unwrap_or_default();
    let root = format!("{} at {endpoint}", storage.root().display());
    let known = |seen: &Vec<String>| seen.contains(&root);
    if crate::per_process::lock_for_an_instant(&ENFORCING).is_some_and(|seen| known(&seen)) {
        return Ok(version);
    }
    // Neither the ETag (S3, Azure) nor the generation (GCS) of any object.
    let stale = UpdateVersion {
        e_tag: Some("\"00000000000000000000000000000000\"".into()),
        version: Some("1".into()),
    };
    for (mode, header) in [
        (PutMode::Create, "If-None-Match"),
        (PutMode::Update(stale), "If-Match"),
    ] {
        if put(storage, file, text, mode)?.is_some() {
            let _ = storage.delete(file);
            return Err(Error::Unsupported {
                path: storage.root().to_path_buf(),
                detail: format!(
                    "the server ignores conditional writes ({header}): it let a put through \
                     that had to be refused, so two writers could both commit and lose each \
                     other's samples; write to a server that enforces them (AWS S3, or an \
                     S3-compatible server with conditional writes)"
                ),
            });
        }
    }
    if let Some(mut seen) = crate::per_process::lock_for_an_instant(&ENFORCING) {
        if !known(&seen) {
            seen.push(root);
        }
    }
    Ok(version)
}

fn hex16(bytes: [u8; 16]) -> String {
    crate::format::manifest::hex(&bytes)
}

/// Pauses between looks at a lease held by another: from 20 ms, doubling up to a bound,
/// jittered so that waiting processes do not poll in step.
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Pauses that grow up to `max`.
    pub fn up_to(max: Duration) -> Backoff {
        Backoff {
            next: Duration::from_millis(20),
            max,
        }
    }

    /// Sleeps the next pause.
    pub fn wait(&mut self) {
        let jitter = u64::from(super::unique_id(b"pause")[0]);
        std::thread::sleep(self.next + Duration::from_millis(jitter % 20));
        self.next = (self.next * 2).min(self.max);
    }
}

/// Who holds lease object `file` of `storage`, as [`Error::Locked`], while it is live; `None`
/// when it is missing or expired.
pub fn live_holder(storage: &ObjectStorage, file: &str) -> Result<Option<Error>> {
    Ok(read(storage, file)?
        .filter(|(text, _)| text.live())
        .map(|(text, _)| text.holder(storage, file)))
}

/// How long a revoked lease object stays before a collection deletes it: an hour, or ten
/// lease lives where that is longer. While it is there, its holder's renewals fail on its
/// version; after, they fail on a server that refuses `If-Match` on a missing object (S3).
fn revoked_kept() -> Duration {
    (lease_ttl() * 10).max(Duration::from_secs(3600))
}

/// Revokes lease object `file` when it has expired: rewritten as revoked with `If-Match` on
/// the version read, so its holder's next renewal, and its next [`ObjectLease::confirm`],
/// fail (a holder that hung past the lease learns it lost it). A lease revoked longer ago
/// than [`revoked_kept`] is deleted. Returns who holds it when it is live (and left alone),
/// as [`live_holder`] does.
pub fn revoke_expired(storage: &ObjectStorage, file: &str) -> Result<Option<Error>> {
    let Some((mut text, version)) = read(storage, file)? else {
        return Ok(None);
    };
    if text.live() {
        return Ok(Some(text.holder(storage, file)));
    }
    match text.revoked_unix_ms {
        Some(at) if now_ms().saturating_sub(at) > revoked_kept().as_millis() as u64 => {
            storage.delete(file)?;
            Ok(None)
        }
        Some(_) => Ok(None),
        None => {
            text.expires_unix_ms = 0;
            text.revoked_unix_ms = Some(now_ms());
            match put(storage, file, &text, PutMode::Update(version))? {
                Some(_) => Ok(None),
                // Renewed or revoked meanwhile: look again.
                None => live_holder(storage, file),
            }
        }
    }
}

/// The version of lease object `file` while it is the live, unrevoked lease of the holder
/// with `token`; `None` when it is not (another holder's, expired, revoked or missing).
fn landed(storage: &ObjectStorage, file: &str, token: &str) -> Result<Option<UpdateVersion>> {
    Ok(held_by(storage, file, token)?.map(|(_, version)| version))
}

/// The lease object as contenders read it now, and its version, when it is live and
/// `token`'s (not revoked); else `None`.
fn held_by(
    storage: &ObjectStorage,
    file: &str,
    token: &str,
) -> Result<Option<(LeaseText, UpdateVersion)>> {
    Ok(read(storage, file)?
        .filter(|(text, _)| text.token == token && text.live() && text.revoked_unix_ms.is_none()))
}

/// The lease object and its version, or `None` when there is none.
fn read(storage: &ObjectStorage, file: &str) -> Result<Option<(LeaseText, UpdateVersion)>> {
    let Some((bytes, version)) = storage.read_versioned(file)? else {
        return Ok(None);
    };
    // A lease object that is not one of ours (damaged, or cut short) has expired: it can be
    // taken over, with `If-Match` like any other.
    let text = serde_json::from_slice(&bytes).unwrap_or(LeaseText {
        token: String::new(),
        host: "unknown".into(),
        pid: 0,
        expires_unix_ms: 0,
        shared: false,
        revoked_unix_ms: None,
    });
    Ok(Some((text, version)))
}

/// Puts `text` under `mode`: its new version, or `None` when the condition failed (or, for
/// an update, the object is gone).
fn put(
    storage: &ObjectStorage,
    file: &str,
    text: &LeaseText,
    mode: PutMode,
) -> Result<Option<UpdateVersion>> {
    let store = storage.store()?;
    let path = storage.object(file);
    let shown = storage.path(file);
    let update = matches!(mode, PutMode::Update(_));
    let bytes = serde_json::to_vec(text).expect("a lease always serializes");
    let put = storage.run(file, "lease", async {
        store
            .put_opts(&path, PutPayload::from(bytes), PutOptions::from(mode))
            .await
    })?;
    match put {
        Ok(r) => Ok(Some(UpdateVersion {
            e_tag: r.e_tag,
            version: r.version,
        })),
        Err(e) if is_conflict(&e) => Ok(None),
        Err(e) if update && super::object::is_not_found(&e) => Ok(None),
        Err(e) => Err(object_error(&shown, "lease", e)),
    }
}

/// Rewrites the lease every third of `ttl` until stopped or lost. A failed renewal is tried
/// again after a twelfth; a lease another writer took over, or a collection revoked, or
/// that expired (its life as last written passed before a renewal landed), is marked lost.
fn renew_until_stopped(held: &Held, stopped: &mpsc::Receiver<()>, ttl: Duration) {
    // After a failed renewal, the next is tried sooner: the life left is two thirds at most.
    let mut wait = ttl / 3;
    loop {
        match stopped.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let mut guard = held.text.lock().unwrap_or_else(|e| e.into_inner());
        let (text, version) = &mut *guard;
        if !text.live() {
            // Past the life it last wrote (the holder hung, or renewals failed): another may
            // have taken it, or judged it gone, meanwhile. Never renewed back to life.
            held.lost.store(true, Ordering::SeqCst);
            return;
        }
        let mut next = text.clone();
        next.expires_unix_ms = now_ms() + ttl.as_millis() as u64;
        wait = (ttl / 12).max(Duration::from_millis(100)).min(ttl / 3);
        match put(
            &held.storage,
            &held.file,
            &next,
            PutMode::Update(version.clone()),
        ) {
            Ok(Some(v)) => {
                *text = next;
                *version = v;
                wait = ttl / 3;
            }
            // The version moved. A renewal whose response was lost (a retried put then finds
            // its own write) moves it too: the lease, read again, is still this holder's.
            Ok(None) => match landed(&held.storage, &held.file, &text.token) {
                Ok(Some(v)) => {
                    *text = next;
                    *version = v;
                    wait = ttl / 3;
                }
                Ok(None) => {
                    held.lost.store(true, Ordering::SeqCst);
                    return;
                }
                Err(_) => {}
            },
            Err(_) => {}
        }
    }
}

impl ObjectLease {
    /// Reads the lease object now and fails unless it is still this holder's: a check that
    /// does not wait for the renewing thread, for a holder about to publish what the lease
    /// guards (it may have hung past the lease's life, and been revoked meanwhile).
    ///
    /// It also fails (without giving the lease up) when less than a third of the lease's life
    /// is left by the life last written (renewals failing, or the holder stalled): what it is
    /// about to do might then land after the lease expired and another took it.
    pub fn confirm(&self) -> Result<()> {
        self.check()?;
        let held = &self.state;
        let Some((seen, _)) = held_by(&held.storage, &held.file, &self.token)? else {
            held.lost.store(true, Ordering::SeqCst);
            return self.check();
        };
        // Still this holder's: is enough of its life left, by the expiry contenders read
        // (not this process's: a renewal in flight, or one that hangs, has not landed)?
        let at = seen.expires_unix_ms;
        let margin = (held.ttl / 3).as_millis() as u64;
        match at < now_ms().saturating_add(margin) {
            true => Err(Error::Io {
                path: held.storage.path(&held.file),
                op: "confirm the lease",
                source: std::io::Error::other(format!(
                    "less than a third of this holder's lease is left ({} ms; its renewals \
                     are failing or late), so it stops before a change that could land after \
                     another took the lease over; run again once the storage answers",
                    at.saturating_sub(now_ms())
                )),
            }),
            false => Ok(()),
        }
    }
}

impl WriterLease for ObjectLease {
    fn is_owner(&self) -> bool {
        std::process::id() == self.pid
    }

    fn token(&self) -> Option<&str> {
        Some(&self.token)
    }

    fn confirm(&self) -> Result<()> {
        ObjectLease::confirm(self)
    }

    fn check(&self) -> Result<()> {
        if !self.state.lost.load(Ordering::SeqCst) {
            return Ok(());
        }
        Err(Error::CommitConflict {
            path: self.state.storage.path(&self.state.file),
            detail: "this writer's lease expired and was taken over or revoked (the writer \
                     stopped renewing it for longer than its life); this commit was not published: \
                     run again (what was committed before stays)"
                .into(),
        })
    }
}

impl Drop for ObjectLease {
    fn drop(&mut self) {
        if !self.is_owner() {
            // A forked child's copy: the lease is the parent's.
            return;
        }
        drop(self.stop.take());
        if self.state.lost.load(Ordering::SeqCst) {
            return;
        }
        if self.state.remove_on_release {
            let _ = self.state.storage.delete(&self.state.file);
            return;
        }
        // Released: marked expired, over the version this writer wrote last only.
        let guard = self.state.text.lock().unwrap_or_else(|e| e.into_inner());
        let (text, version) = &*guard;
        let mut released = text.clone();
        released.expires_unix_ms = 0;
        let _ = put(
            &self.state.storage,
            &self.state.file,
            &released,
            PutMode::Update(version.clone()),
        );
    }
}
