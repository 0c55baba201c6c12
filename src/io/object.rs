//! A dataset under an object-store prefix: `s3://`, `gs://`, `az://` and `http(s)://`
//! (read-only), through the `object_store` crate. Credentials, region and endpoint come from
//! the usual environment variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...), else for
//! S3 from the AWS CLI's profile ([`super::aws_profile`]); plain `http` is allowed for an
//! endpoint on this machine only.
//!
//! Reads fetch byte ranges: opening a file fetches its last [`TAIL`] bytes (which tell its
//! size, and hold a shard's footer and usually its index), later reads only the ranges asked
//! for. Transient errors are retried with backoff by `object_store` (bounded: 10 retries,
//! 3 minutes; a request that carries a file's bytes up goes through a client of its own,
//! allowed [`BODY_TIMEOUT`] where the 30 s of other requests would fail a slow uplink); a short
//! read is an error. A new file is published with `If-None-Match: *`
//! (a single put) or, when larger than [`PART`], by a multipart upload started only where no
//! object is and, on S3, completed with `If-None-Match: *` too ([`super::object_upload`]);
//! the manifest is replaced with `If-Match` on the ETag of the one read.

use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, GetRange, ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutMode, PutOptions,
    PutPayload, UpdateVersion,
};

use crate::error::{Error, Result};
use crate::format::manifest::TEMP_SUFFIX;
use crate::per_process::PerProcess;

use super::bytes::FileBytes;
use super::object_upload::{Upload, Uploader};
use super::runtime::{block_on, runtime};
use super::{expect_whole, FileReader, NewFile, Storage, WriterLease};

/// Bytes fetched from the end of a file when it is opened.
pub const TAIL: u64 = 64 << 10;
/// Part size of multipart uploads; files up to this size go up in one put.
pub const PART: usize = 32 << 20;
/// Parts of one upload in flight at once.
const PARTS_IN_FLIGHT: usize = 8;

/// A dataset under an object-store URL.
#[derive(Debug, Clone)]
pub struct ObjectStorage {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    url: url::Url,
    root: PathBuf,
    prefix: ObjectPath,
    read_only: bool,
    /// The clients of this process (rebuilt in a forked child, whose connections would hang).
    store: PerProcess<Clients>,
}

/// The clients of one store: for everything, and for what carries a file's bytes up (none
/// over http): whole-file puts and multipart uploads.
#[derive(Debug)]
struct Clients {
    store: Arc<dyn ObjectStore>,
    /// Whole-file puts: the client of `uploader.parts`.
    bodies: Option<Arc<dyn ObjectStore>>,
    uploader: Option<Uploader>,
}

/// How long one request that carries a file's bytes up (a part, or a whole file of up to
/// [`PART`]) may take, where the environment sets no timeout (`AWS_TIMEOUT`,
/// `GOOGLE_TIMEOUT`, `AZURE_TIMEOUT`). `object_store`'s 30 s would fail every part on an
/// uplink slower than the parts in flight need (a copy's 4 shards of 8 parts of 32 MiB at
/// 300 Mbit/s), and each retry send it again, so the copy could never finish; 10 minutes
/// carries a part at 56 KB/s. Other requests keep the 30 s: a stalled one is found soon.
const BODY_TIMEOUT: &str = "10m";
/// Retries of such a request stop after this long: past [`BODY_TIMEOUT`], so a part that
/// timed out is sent once more, and within the 15 minutes a signed request stays valid.
const BODY_RETRY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(12 * 60);

/// True when the environment names the timeout of a client whose variables start with
/// `prefix` (`AWS`, `GOOGLE`, `AZURE`), as the builders' `from_env` read them.
fn timeout_named(prefix: &str) -> bool {
    let name = format!("{prefix}_TIMEOUT");
    std::env::vars_os().any(|(k, _)| k.to_str().is_some_and(|k| k.eq_ignore_ascii_case(&name)))
}

/// The retries of the requests that carry a file's bytes up.
fn body_retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        retry_timeout: BODY_RETRY_TIMEOUT,
        ..Default::default()
    }
}

pub(super) fn other(path: &Path, op: &'static str, detail: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        op,
        source: std::io::Error::other(detail.to_string()),
    }
}

/// `e` and every error it came from, as text: what a client library says of the cause often
/// lies below the error it returns (`HTTP error: builder error`, then why).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// How the variables of the client of the storage at `location` (a URL) start:
/// `AWS_ALLOW_HTTP`, `GOOGLE_TIMEOUT`...
fn variable_prefix(location: &Path) -> &'static str {
    let scheme = url::Url::parse(&location.to_string_lossy())
        .ok()
        .and_then(|u| ObjectStoreScheme::parse(&u).ok())
        .map(|(scheme, _)| scheme);
    match scheme {
        Some(ObjectStoreScheme::MicrosoftAzure) => "AZURE",
        Some(ObjectStoreScheme::GoogleCloudStorage) => "GOOGLE",
        _ => "AWS",
    }
}

/// An `object_store` error as hspack's, naming the object.
pub(super) fn object_error(path: &Path, op: &'static str, e: object_store::Error) -> Error {
    use std::io::ErrorKind;
    let kind = match &e {
        // Not a missing file (not damage): the place named is wrong, and no rerun mends it.
        _ if no_such_bucket(&e) => ErrorKind::InvalidInput,
        object_store::Error::NotFound { .. } => ErrorKind::NotFound,
        object_store::Error::AlreadyExists { .. } => ErrorKind::AlreadyExists,
        object_store::Error::PermissionDenied { .. } => ErrorKind::PermissionDenied,
        object_store::Error::Unauthenticated { .. } => ErrorKind::PermissionDenied,
        _ => ErrorKind::Other,
    };
    // With no keys anywhere, the client asks the instance metadata service last: its failure
    // says nothing of what to set.
    let said = e.to_string();
    let unnamed = std::env::var_os("AWS_ACCESS_KEY_ID").is_none()
        && std::env::var_os("AWS_WEB_IDENTITY_TOKEN_FILE").is_none();
    let asked_metadata = INSTANCE_METADATA.iter().any(|p| said.contains(p));
    let profile = (asked_metadata && unnamed).then(super::aws_profile::profile);
    let source = match profile.filter(|p| p.keys.is_none()) {
        Some(p) => std::io::Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "{said} (no AWS credentials found: {}; for an S3-compatible server set \
                 AWS_ENDPOINT_URL too)",
                p.missing_keys_hint()
            ),
        ),
        None if no_such_bucket(&e) => std::io::Error::new(
            kind,
            format!(
                "{said}: the bucket (or container) does not exist; check its name, and for an \
                 S3-compatible server AWS_ENDPOINT_URL and the region"
            ),
        ),
        None if chain(&e).contains("URL scheme is not allowed") => std::io::Error::new(
            kind,
            format!(
                "{said}: URL scheme is not allowed: the endpoint is plain http; use https, or \
                 allow http ({}_ALLOW_HTTP=true, on a network you trust)",
                variable_prefix(path)
            ),
        ),
        None if op == "publish" && chain(&e).contains("timed out") => {
            let prefix = variable_prefix(path);
            let limit = match timeout_named(prefix) {
                true => format!("what {prefix}_TIMEOUT says"),
                false => BODY_TIMEOUT.to_string(),
            };
            std::io::Error::new(
                ErrorKind::TimedOut,
                format!(
                    "{said}: sending the file's bytes timed out: the link to the storage is \
                     slower than the uploads in flight need (a part, or a whole file, is up to \
                     {} MiB; a request may take {limit}); send fewer files at once (`hspack cp \
                     --jobs 1`), or allow a request longer ({prefix}_TIMEOUT=30m)",
                    PART >> 20,
                ),
            )
        }
        None => std::io::Error::new(kind, e),
    };
    Error::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}

/// Paths of the instance metadata service, where credentials are asked for last.
const INSTANCE_METADATA: &[&str] = &["/latest/api/token", "/latest/meta-data/"];

/// An object that is not there (a bucket that is not there is an error of its own).
pub(super) fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. }) && !no_such_bucket(e)
}

/// A "not found" for the bucket or container itself, as S3 (`NoSuchBucket`), GCS and Azure
/// (`ContainerNotFound`) say it.
fn no_such_bucket(e: &object_store::Error) -> bool {
    let said = format!("{e:?}");
    matches!(e, object_store::Error::NotFound { .. })
        && ["NoSuchBucket", "ContainerNotFound", "bucket does not exist"]
            .iter()
            .any(|m| said.contains(m))
}

pub(super) fn is_conflict(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }
    )
}

/// True when `endpoint` is plain http to this machine.
fn local_http(endpoint: &str) -> bool {
    url::Url::parse(endpoint).is_ok_and(|u| {
        u.scheme() == "http"
            && matches!(
                u.host_str(),
                Some("localhost" | "127.0.0.1" | "[::1]" | "::1")
            )
    })
}

impl ObjectStorage {
    /// The dataset at `location`, a URL (`s3://bucket/prefix`, `gs://`, `az://`,
    /// `https://`).
    pub fn open(location: &str) -> Result<ObjectStorage> {
        let root = PathBuf::from(location.trim_end_matches('/'));
        let url = url::Url::parse(location).map_err(|e| Error::Unsupported {
            path: root.clone(),
            detail: format!("not a URL ({e})"),
        })?;
        let (scheme, prefix) = ObjectStoreScheme::parse(&url).map_err(|e| Error::Unsupported {
            path: root.clone(),
            detail: format!(
                "{e}; hspack reads s3://, gs://, az://, http(s):// and file:// URLs and folders"
            ),
        })?;
        let read_only = scheme == ObjectStoreScheme::Http;
        let storage = ObjectStorage {
            inner: Arc::new(Inner {
                prefix: prefix.clone(),
                url,
                root,
                read_only,
                store: PerProcess::new(),
            }),
        };
        storage.store()?; // configuration errors now, not at the first read
        Ok(storage)
    }

    pub(super) fn store(&self) -> Result<Arc<dyn ObjectStore>> {
        Ok(Arc::clone(&self.clients()?.store))
    }

    fn clients(&self) -> Result<Arc<Clients>> {
        let inner = &self.inner;
        inner.store.get(|| build_store(&inner.url, &inner.root))
    }

    /// The client of whole-file puts.
    fn bodies(&self, name: &str) -> Result<Arc<dyn ObjectStore>> {
        self.clients()?
            .bodies
            .clone()
            .ok_or_else(|| Error::Unsupported {
                path: self.path(name),
                detail: "this storage takes no uploads".into(),
            })
    }

    /// The clients of multipart uploads.
    fn uploader(&self, name: &str) -> Result<Uploader> {
        self.clients()?
            .uploader
            .clone()
            .ok_or_else(|| Error::Unsupported {
                path: self.path(name),
                detail: "this storage takes no uploads".into(),
            })
    }

    pub(super) fn object(&self, name: &str) -> ObjectPath {
        self.inner.prefix.clone().join(name)
    }

    pub(super) fn writable(&self, name: &str) -> Result<()> {
        match self.inner.read_only {
            true => Err(Error::Unsupported {
                path: self.path(name),
                detail: "datasets served over http(s) are read-only; copy to s3://, gs://, \
                         az:// or a folder to write"
                    .into(),
            }),
            false => Ok(()),
        }
    }

    pub(super) fn run<T>(
        &self,
        name: &str,
        op: &'static str,
        f: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> Result<object_store::Result<T>> {
        block_on(f).map_err(|e| other(&self.path(name), op, e))
    }

    /// True when object `name` holds `bytes`: asked after a put that failed, which may have
    /// landed all the same (its response lost in transit; or its retry, refused on the
    /// condition the landed put changed). What is there decides; a read that fails says no.
    fn holds(&self, name: &str, bytes: &[u8]) -> bool {
        self.read(name).ok().flatten().as_deref() == Some(bytes)
    }

    /// The whole of `name` and the version it was read at (for a put `If-Match` on it), or
    /// `None` when there is no such object.
    pub(super) fn read_versioned(&self, name: &str) -> Result<Option<(Vec<u8>, UpdateVersion)>> {
        let store = self.store()?;
        let path = self.object(name);
        let got = self.run(name, "read", async {
            let got = store.get(&path).await?;
            let meta = got.meta.clone();
            Ok((meta, got.bytes().await?))
        })?;
        match got {
            Ok((meta, bytes)) => Ok(Some((
                bytes.to_vec(),
                UpdateVersion {
                    e_tag: meta.e_tag,
                    version: meta.version,
                },
            ))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(object_error(&self.path(name), "read", e)),
        }
    }
}

fn build_store(url: &url::Url, root: &Path) -> Result<Clients> {
    let bad = |e: object_store::Error| Error::Unsupported {
        path: root.to_path_buf(),
        detail: format!("cannot use this storage: {e}"),
    };
    let (scheme, _) = ObjectStoreScheme::parse(url).map_err(|e| Error::Unsupported {
        path: root.to_path_buf(),
        detail: e.to_string(),
    })?;
    // Bodies go up through a client of their own (`bodies`), with a longer timeout.
    fn plain<T: ObjectStore + object_store::multipart::MultipartStore>(
        store: T,
        bodies: T,
    ) -> Clients {
        let store = Arc::new(store);
        let bodies = Arc::new(bodies);
        Clients {
            store: Arc::clone(&store) as Arc<dyn ObjectStore>,
            bodies: Some(Arc::clone(&bodies) as _),
            uploader: Some(Uploader {
                parts: bodies,
                complete: store,
            }),
        }
    }
    use object_store::ClientConfigKey::Timeout;
    let clients = match scheme {
        ObjectStoreScheme::AmazonS3 => {
            use object_store::aws::AmazonS3ConfigKey::Client;
            let (builder, local) = s3_builder(url);
            let store = Arc::new(builder.clone().build().map_err(bad)?);
            let mut bodies = builder
                .clone()
                .with_retry(body_retries())
                .with_credentials(Arc::clone(store.credentials()));
            if !timeout_named("AWS") {
                bodies = bodies.with_config(Client(Timeout), BODY_TIMEOUT);
            }
            let bodies = Arc::new(bodies.build().map_err(bad)?);
            // The completions of multipart uploads go through a client that sends
            // `If-None-Match: *` with every request it makes: it makes no other, and takes
            // its credentials from the main client (so no credential request of its own
            // carries the header).
            let mut headers = http::HeaderMap::new();
            headers.insert("If-None-Match", http::HeaderValue::from_static("*"));
            let mut options = s3_client_options_from_env().with_default_headers(headers);
            if local {
                options = options.with_allow_http(true);
            }
            let completer = builder
                .with_client_options(options)
                .with_credentials(Arc::clone(store.credentials()))
                .build()
                .map_err(bad)?;
            Clients {
                store: store as Arc<dyn ObjectStore>,
                bodies: Some(Arc::clone(&bodies) as _),
                uploader: Some(Uploader {
                    parts: bodies,
                    complete: Arc::new(completer),
                }),
            }
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            use object_store::gcp::GoogleConfigKey::Client;
            let builder =
                object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url.as_str());
            let mut bodies = builder.clone().with_retry(body_retries());
            if !timeout_named("GOOGLE") {
                bodies = bodies.with_config(Client(Timeout), BODY_TIMEOUT);
            }
            plain(builder.build().map_err(bad)?, bodies.build().map_err(bad)?)
        }
        ObjectStoreScheme::MicrosoftAzure => {
            use object_store::azure::AzureConfigKey::Client;
            let builder =
                object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url.as_str());
            let mut bodies = builder.clone().with_retry(body_retries());
            if !timeout_named("AZURE") {
                bodies = bodies.with_config(Client(Timeout), BODY_TIMEOUT);
            }
            plain(builder.build().map_err(bad)?, bodies.build().map_err(bad)?)
        }
        ObjectStoreScheme::Http => {
            let origin = &url[..url::Position::BeforePath];
            let options =
                object_store::ClientOptions::new().with_allow_http(url.scheme() == "http");
            Clients {
                store: Arc::new(
                    object_store::http::HttpBuilder::new()
                        .with_url(origin)
                        .with_client_options(options)
                        .build()
                        .map_err(bad)?,
                ),
                bodies: None,
                uploader: None,
            }
        }
        other => {
            return Err(Error::Unsupported {
                path: root.to_path_buf(),
                detail: format!("{other:?} URLs are not datasets hspack opens"),
            })
        }
    };
    Ok(clients)
}

/// The S3 client's configuration, from the environment and the AWS CLI's profile; true when
/// the endpoint is plain http on this machine.
fn s3_builder(url: &url::Url) -> (object_store::aws::AmazonS3Builder, bool) {
    let env = |keys: &[&str]| keys.iter().find_map(|k| std::env::var(k).ok());
    let profile = super::aws_profile::profile();
    let endpoint =
        env(&["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"]).or(profile.endpoint);
    // The server checks each upload against its SHA-256: bytes damaged on the way are
    // refused there.
    let mut b = object_store::aws::AmazonS3Builder::from_env()
        .with_url(url.as_str())
        .with_checksum_algorithm(object_store::aws::Checksum::SHA256);
    let named = env(&["AWS_ACCESS_KEY_ID", "AWS_WEB_IDENTITY_TOKEN_FILE"]).is_some();
    if let (false, Some((id, secret, token))) = (named, profile.keys) {
        b = b.with_access_key_id(id).with_secret_access_key(secret);
        if let Some(token) = token {
            b = b.with_token(token);
        }
    }
    let mut local = false;
    if let Some(endpoint) = &endpoint {
        b = b.with_endpoint(endpoint);
        if local_http(endpoint) {
            local = true;
            b = b
                .with_allow_http(true)
                .with_virtual_hosted_style_request(false);
        }
    }
    if env(&["AWS_REGION", "AWS_DEFAULT_REGION"]).is_none() {
        b = b.with_region(profile.region.as_deref().unwrap_or("us-east-1"));
    }
    (b, local)
}

/// The HTTP client options the environment gives an S3 client (`AWS_ALLOW_HTTP`,
/// `AWS_PROXY_URL`, timeouts...), as `AmazonS3Builder::from_env` reads them: for a second
/// client whose options are set whole.
fn s3_client_options_from_env() -> object_store::ClientOptions {
    use object_store::aws::AmazonS3ConfigKey;
    let mut options = object_store::ClientOptions::new();
    for (key, value) in std::env::vars() {
        if !key.starts_with("AWS_") {
            continue;
        }
        if let Ok(AmazonS3ConfigKey::Client(k)) = key.to_ascii_lowercase().parse() {
            options = options.with_config(k, value);
        }
    }
    options
}

impl Storage for ObjectStorage {
    fn root(&self) -> &Path {
        &self.inner.root
    }

    fn path(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("{}/{name}", self.inner.root.display()))
    }

    fn create_root(&self) -> Result<()> {
        self.writable("")
    }

    fn list(&self) -> Result<Vec<String>> {
        // A plain web server answers a listing (WebDAV `PROPFIND`) with 501, which the client
        // retries for minutes: what is served over http(s) is read by the names its files
        // list (`verify` then does not look for files an interrupted writer left).
        if self.inner.read_only {
            return Err(Error::Unsupported {
                path: self.root().to_path_buf(),
                detail: "a server reached over http(s) lists no folder: a command that lists \
                         one (`store ls`, `store du`, `store verify`, a copy's destination) \
                         needs s3://, gs://, az:// or a folder; copy the dataset or store there"
                    .into(),
            });
        }
        let store = self.store()?;
        let listed = self.run("", "list", async {
            store.list_with_delimiter(Some(&self.inner.prefix)).await
        })?;
        let listed = listed.map_err(|e| object_error(self.root(), "list", e))?;
        Ok(listed
            .objects
            .into_iter()
            .filter_map(|o| o.location.filename().map(str::to_string))
            .collect())
    }

    fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let store = self.store()?;
        let path = self.object(name);
        let got = self.run(name, "read", async {
            store.get(&path).await?.bytes().await
        })?;
        match got {
            Ok(b) => Ok(Some(b.to_vec())),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(object_error(&self.path(name), "read", e)),
        }
    }

    fn read_bounded(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        // One GET, as `read`; its body is taken piece by piece and dropped past `max + 1`.
        let store = self.store()?;
        let path = self.object(name);
        let limit = usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX);
        let got = self.run(name, "read", async {
            let mut body = store.get(&path).await?.into_stream();
            let mut out = Vec::new();
            while out.len() < limit {
                match std::future::poll_fn(|cx| body.as_mut().poll_next(cx)).await {
                    Some(piece) => out.extend_from_slice(&piece?),
                    None => break,
                }
            }
            out.truncate(limit);
            Ok(out)
        })?;
        match got {
            Ok(b) => Ok(Some(b)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(object_error(&self.path(name), "read", e)),
        }
    }

    fn size(&self, name: &str) -> Result<Option<u64>> {
        let store = self.store()?;
        let path = self.object(name);
        match self.run(name, "stat", async { store.head(&path).await })? {
            Ok(meta) => Ok(Some(meta.size)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(object_error(&self.path(name), "stat", e)),
        }
    }

    fn open(&self, name: &str) -> Result<Arc<dyn FileReader>> {
        let store = self.store()?;
        let path = self.object(name);
        let shown = self.path(name);
        let fetched = self.run(name, "open", async {
            let options = GetOptions {
                range: Some(GetRange::Suffix(TAIL)),
                ..GetOptions::default()
            };
            let got = store.get_opts(&path, options).await?;
            let (range, meta) = (got.range.clone(), got.meta.clone());
            Ok((range, meta, got.bytes().await?))
        })?;
        let (meta, tail) = match fetched {
            Ok((range, meta, bytes)) => {
                let tail = expect_whole(&shown, &range, FileBytes::copy_of(&bytes))?;
                (meta, Some((range.start, tail)))
            }
            Err(e) if is_not_found(&e) => return Err(object_error(&shown, "open", e)),
            // An empty object has no suffix to fetch: ask for its size alone.
            Err(_) => {
                let meta = self.run(name, "open", store.head(&path))?;
                (meta.map_err(|e| object_error(&shown, "open", e))?, None)
            }
        };
        Ok(Arc::new(ObjectFile {
            storage: self.clone(),
            path,
            shown,
            len: meta.size,
            tail,
            modified: ModifiedAt::of(&meta),
            version: meta.version,
            e_tag: meta.e_tag,
        }))
    }

    fn create(&self, temp: &str) -> Result<Box<dyn NewFile>> {
        let name = temp.strip_suffix(TEMP_SUFFIX).unwrap_or(temp);
        self.writable(name)?;
        Ok(Box::new(ObjectNewFile {
            storage: self.clone(),
            name: name.to_string(),
            buf: Vec::new(),
            len: 0,
            upload: None,
            spool: None,
            pid: std::process::id(),
        }))
    }

    fn replace(
        &self,
        name: &str,
        bytes: &[u8],
        expected: Option<blake3::Hash>,
        _durable: bool,
    ) -> Result<()> {
        self.writable(name)?;
        let store = self.store()?;
        let path = self.object(name);
        let shown = self.path(name);
        let conflict = |detail: &str| Error::CommitConflict {
            path: shown.clone(),
            detail: detail.into(),
        };
        let mode = match expected {
            None => PutMode::Overwrite,
            Some(expected) => {
                let Some((found, version)) = self.read_versioned(name)? else {
                    return Err(conflict("the file is gone"));
                };
                if blake3::hash(&found) != expected {
                    return Err(conflict("it is not the one this writer last read or wrote"));
                }
                PutMode::Update(version)
            }
        };
        let payload = PutPayload::from(bytes.to_vec());
        let put = self.run(name, "replace", async {
            store.put_opts(&path, payload, PutOptions::from(mode)).await
        })?;
        match put {
            Ok(_) => Ok(()),
            Err(_) if self.holds(name, bytes) => Ok(()),
            Err(e) if is_conflict(&e) => Err(conflict("it changed while it was being replaced")),
            Err(e) => Err(object_error(&shown, "replace", e)),
        }
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.writable(name)?;
        let store = self.store()?;
        let path = self.object(name);
        match self.run(name, "remove", async { store.delete(&path).await })? {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(object_error(&self.path(name), "remove", e)),
        }
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn lock(&self) -> Result<Box<dyn WriterLease>> {
        Ok(Box::new(super::object_lease::ObjectLease::take(self)?))
    }

    fn join(&self, _alone: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn WriterLease>> {
        super::object_lease::join(self)?;
        Ok(Box::<super::object_lease::Member>::default())
    }

    fn commit_lock(&self) -> Result<Box<dyn WriterLease>> {
        Ok(Box::new(super::object_lease::ObjectLease::take_shared(
            self,
        )?))
    }
}

/// A published object, read by ranges.
#[derive(Debug)]
struct ObjectFile {
    storage: ObjectStorage,
    path: ObjectPath,
    shown: PathBuf,
    len: u64,
    /// The last bytes, fetched at open: (their offset, the bytes).
    tail: Option<(u64, FileBytes)>,
    /// The object's version id (a versioned bucket) and ETag, as opened: every ranged read
    /// asks for bytes only while the ETag is the same (`If-Match`), or for that version, so a
    /// dataset written again under the same names while it is read is an error, never a mix
    /// of the two writes' bytes.
    version: Option<String>,
    e_tag: Option<String>,
    /// Where the server gives neither (a static HTTP server may send no ETag), the time the
    /// object was last modified, as opened: reads ask for bytes only while it is unmodified
    /// since (`If-Unmodified-Since`), and check the time the reply gives.
    modified: Option<ModifiedAt>,
}

/// The last-modified time of an object as its server gave it, and as text (what names
/// the object's version to a cache).
#[derive(Debug)]
struct ModifiedAt {
    at: object_store::ObjectMeta,
    text: String,
}

impl ModifiedAt {
    /// What pins an object that has no strong ETag and no version id: its last-modified time.
    fn of(meta: &object_store::ObjectMeta) -> Option<ModifiedAt> {
        let strong = meta.e_tag.as_deref().is_some_and(|t| !t.starts_with("W/"));
        (!strong && meta.version.is_none()).then(|| ModifiedAt {
            at: meta.clone(),
            text: format!("modified {}", meta.last_modified.to_rfc3339()),
        })
    }
}

impl FileReader for ObjectFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn version(&self) -> Option<&str> {
        let modified = self.modified.as_ref().map(|m| m.text.as_str());
        self.version
            .as_deref()
            .or(self.e_tag.as_deref())
            .or(modified)
    }

    fn read(&self, range: Range<u64>) -> Result<FileBytes> {
        if range.start > range.end || range.end > self.len {
            return Err(super::local::out_of_file(&self.shown, &range, self.len));
        }
        if let Some((at, tail)) = &self.tail {
            if range.start >= *at {
                let r = (range.start - at) as usize..(range.end - at) as usize;
                if let Some(b) = tail.slice(r) {
                    return Ok(b);
                }
            }
        }
        if range.is_empty() {
            return Ok(FileBytes::from_vec(Vec::new()));
        }
        let store = self.storage.store()?;
        // Pinned by `If-Match` on a strong ETag (a weak one never matches: the comparison is
        // strong); by version id only where there is none, since S3 asks a reader naming a
        // version for a permission (`s3:GetObjectVersion`) that `s3:GetObject` lacks.
        let if_match = self.e_tag.clone().filter(|t| !t.starts_with("W/"));
        let options = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            version: self.version.clone().filter(|_| if_match.is_none()),
            if_match,
            if_unmodified_since: self.modified.as_ref().map(|m| m.at.last_modified),
            ..GetOptions::default()
        };
        let got = block_on(async {
            let got = store.get_opts(&self.path, options).await?;
            // A server that ignores the condition: the reply says what it read.
            let changed = self.modified.as_ref().is_some_and(|m| {
                got.meta.last_modified != m.at.last_modified || got.meta.size != m.at.size
            });
            if changed {
                return Err(object_store::Error::Precondition {
                    path: self.path.to_string(),
                    source: "the object changed since it was opened".into(),
                });
            }
            got.bytes().await
        })
        .map_err(|e| other(&self.shown, "read", e))?
        .map_err(|e| match e {
            object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. } => {
                other(
                    &self.shown,
                    "read",
                    "the object was deleted or written again since the dataset was opened \
                         (a copy or writer replaced it): open the dataset again",
                )
            }
            e => other(
                &self.shown,
                "read",
                format!("bytes {}..{}: {e}", range.start, range.end),
            ),
        })?;
        expect_whole(&self.shown, &range, FileBytes::copy_of(&got))
    }

    fn whole(&self) -> Option<FileBytes> {
        match &self.tail {
            Some((0, tail)) => Some(tail.clone()),
            _ => None,
        }
    }
}

/// A new object. Bytes written in order are put at once or, past [`PART`], uploaded in parts
/// as they come (a copy); a file written out of order (a shard, whose headers are written
/// last) goes to a spool file in the temp folder (`TMPDIR`), unlinked from the start so a
/// crash leaves nothing, and is uploaded when published.
struct ObjectNewFile {
    storage: ObjectStorage,
    name: String,
    buf: Vec<u8>,
    len: u64,
    upload: Option<Upload>,
    spool: Option<std::fs::File>,
    /// The process that writes it: a forked child's copy never aborts its upload.
    pid: u32,
}

/// How long dropping a file waits for its unfinished multipart upload to be aborted.
const ABORT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Drop for ObjectNewFile {
    /// A multipart upload started and never completed (a failed part, a refused name, an
    /// error on the way to publishing) is aborted: an incomplete upload is invisible to
    /// listings, so nothing else would remove its parts, billed until a lifecycle rule does.
    fn drop(&mut self) {
        let Some(upload) = self.upload.take() else {
            return;
        };
        if self.pid != std::process::id() {
            // The parent's: not aborted, and its tasks, on the parent's runtime, not touched.
            std::mem::forget(upload);
            return;
        }
        // Bounded: where the network is gone, the error that got here is not held up for the
        // client's whole retry budget (the parts are then left to a lifecycle rule).
        let _ = block_on(async { tokio::time::timeout(ABORT_WAIT, upload.abort()).await });
    }
}

impl std::fmt::Debug for ObjectNewFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectNewFile")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish()
    }
}

impl ObjectNewFile {
    fn shown(&self) -> PathBuf {
        self.storage.path(&self.name)
    }

    /// Starts the multipart upload, where no object is.
    fn start_upload(&mut self) -> Result<()> {
        let store = self.storage.store()?;
        let path = self.storage.object(&self.name);
        let shown = self.shown();
        let head = self.storage.run(&self.name, "publish", store.head(&path))?;
        match head {
            Ok(_) => {
                return Err(Error::CommitConflict {
                    path: shown,
                    detail: "an object with this name exists already".into(),
                })
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(object_error(&shown, "publish", e)),
        }
        let uploader = self.storage.uploader(&self.name)?;
        let upload = self
            .storage
            .run(&self.name, "publish", Upload::start(&uploader, path))?
            .map_err(|e| object_error(&shown, "publish", e))?;
        self.upload = Some(upload);
        Ok(())
    }

    /// Hands the buffered bytes to the upload, waiting while too many parts are in flight:
    /// all of them where `last`, else whole parts of [`PART`] (the rest kept for later).
    fn send_parts(&mut self, last: bool) -> Result<()> {
        let shown = self.shown();
        let rt = runtime().map_err(|e| other(&shown, "publish", e))?;
        let upload = self.upload.as_mut().expect("started");
        let mut rest = bytes::Bytes::from(std::mem::take(&mut self.buf));
        while rest.len() >= PART || (last && !rest.is_empty()) {
            let part = rest.split_to(rest.len().min(PART));
            {
                let _in_runtime = rt.enter();
                upload.write(part);
            }
            rt.block_on(upload.wait_for_capacity(PARTS_IN_FLIGHT))
                .map_err(|e| object_error(&shown, "publish", e))?;
        }
        self.buf = rest.to_vec();
        Ok(())
    }

    /// Moves what was written so far into a new spool file, which takes every later write.
    fn start_spool(&mut self) -> Result<()> {
        let dir = std::env::temp_dir();
        let spool_error = |e: std::io::Error| Error::Io {
            path: dir.clone(),
            op: "create a spool file (set TMPDIR to a folder with room for a shard)",
            source: e,
        };
        let id = crate::format::manifest::hex(&super::unique_id(self.name.as_bytes()));
        let path = dir.join(format!(".hspack-spool-{id}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(spool_error)?;
        // Unlinked now: the space is freed when the file is closed, however the process ends.
        std::fs::remove_file(&path).map_err(spool_error)?;
        file.write_all_at(&self.buf, 0).map_err(spool_error)?;
        self.buf = Vec::new();
        self.spool = Some(file);
        Ok(())
    }

    /// Uploads the spool file: one put, or parts read back from it in turn.
    fn upload_spool(&mut self, spool: std::fs::File) -> Result<()> {
        let read_error = |e: std::io::Error| Error::Io {
            path: std::env::temp_dir(),
            op: "read the spool file",
            source: e,
        };
        if self.len <= PART as u64 {
            self.buf = vec![0; self.len as usize];
            return spool.read_exact_at(&mut self.buf, 0).map_err(read_error);
        }
        self.start_upload()?;
        let mut at = 0;
        while at < self.len {
            let n = (self.len - at).min(PART as u64) as usize;
            self.buf.resize(n, 0);
            spool.read_exact_at(&mut self.buf, at).map_err(read_error)?;
            self.send_parts(false)?;
            at += n as u64;
        }
        Ok(())
    }
}

impl NewFile for ObjectNewFile {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        if offset != self.len && self.upload.is_none() && self.spool.is_none() {
            self.start_spool()?;
        }
        if let Some(spool) = &self.spool {
            super::local::write_in_pieces(spool, offset, bytes, |_| {}).map_err(|e| Error::Io {
                path: std::env::temp_dir(),
                op: "write the spool file (set TMPDIR to a folder with room for a shard)",
                source: e,
            })?;
            self.len = self.len.max(offset + bytes.len() as u64);
            return Ok(());
        }
        if offset != self.len {
            return Err(Error::Unsupported {
                path: self.shown(),
                detail: format!(
                    "object storage takes a new file's bytes in order (asked to write at \
                     {offset}, {} bytes written)",
                    self.len
                ),
            });
        }
        self.buf.extend_from_slice(bytes);
        self.len += bytes.len() as u64;
        if self.buf.len() >= PART {
            if self.upload.is_none() {
                self.start_upload()?;
            }
            self.send_parts(false)?;
        }
        Ok(())
    }

    fn sync_data(&mut self) -> Result<()> {
        Ok(())
    }

    fn sync_all(&mut self) -> Result<()> {
        Ok(())
    }

    fn publish_new(mut self: Box<Self>, name: &str, _durable: bool) -> Result<()> {
        let shown = self.storage.path(name);
        if self.upload.is_none() {
            // Nothing went up yet: the object can still take any name.
            self.name = name.to_string();
        }
        if let Some(spool) = self.spool.take() {
            self.upload_spool(spool)?;
        }
        if name != self.name {
            return Err(Error::Unsupported {
                path: shown,
                detail: format!(
                    "a new object is published under the name it was started for ({})",
                    self.name
                ),
            });
        }
        if self.upload.is_some() {
            if !self.buf.is_empty() {
                self.send_parts(true)?;
            }
            let upload = self.upload.take().expect("started");
            return match self.storage.run(name, "publish", upload.finish())? {
                Ok(()) => Ok(()),
                // A completion that landed and whose response was lost is refused when
                // retried: an object of this one's length is taken for it (a writer's names
                // are its own; a copy proves what landed before taking it).
                Err(ref e) if is_conflict(e) && self.storage.size(name)? == Some(self.len) => {
                    Ok(())
                }
                // Another object took the name since the upload started: it stays.
                Err(e) if is_conflict(&e) => Err(Error::CommitConflict {
                    path: shown,
                    detail: "an object with this name was published while this one was \
                             uploaded"
                        .into(),
                }),
                Err(e) => Err(object_error(&shown, "publish", e)),
            };
        }
        let store = self.storage.bodies(name)?;
        let path = self.storage.object(name);
        let bytes = bytes::Bytes::from(std::mem::take(&mut self.buf));
        let payload = PutPayload::from(bytes.clone());
        let put = self.storage.run(name, "publish", async {
            store
                .put_opts(&path, payload, PutOptions::from(PutMode::Create))
                .await
        })?;
        match put {
            Ok(_) => Ok(()),
            Err(_) if self.storage.holds(name, &bytes) => Ok(()),
            Err(e) if is_conflict(&e) => Err(Error::CommitConflict {
                path: shown,
                detail: "an object with this name exists already".into(),
            }),
            Err(e) => Err(object_error(&shown, "publish", e)),
        }
    }

    fn abandon(self: Box<Self>) {
        // Dropped: an upload started is aborted.
    }
}
