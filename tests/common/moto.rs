//! A real S3-compatible server for tests: `python3 -m moto.server` (PyPI `moto[server]`) on a
//! free port of 127.0.0.1, stopped when dropped. It enforces conditional puts.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto server.
pub struct Moto {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Moto {
    /// Starts a server and points the AWS environment variables of this process at it (one
    /// server per test process), or
    /// says why it cannot: where `CI` is set a missing server fails the test, elsewhere the
    /// test says loudly that it did not run.
    pub fn start() -> Option<Moto> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let spawned = Command::new("python3")
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut moto = match spawned {
            Ok(child) => Moto { child, port },
            Err(e) => return unavailable(&format!("cannot run python3 ({e})")),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = moto.child.try_wait() {
                return unavailable(&format!(
                    "`python3 -m moto.server` exited ({status}): pip install 'moto[server]'"
                ));
            }
            if Instant::now() > deadline {
                return unavailable("moto.server did not listen within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // One server per test process (its tests run in one #[test]), so nothing races.
        std::env::set_var("AWS_ENDPOINT_URL", moto.endpoint());
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        std::env::set_var("AWS_REGION", "us-east-1");
        Some(moto)
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Creates bucket `name`.
    pub fn bucket(&self, name: &str) {
        self.request("PUT", &format!("/{name}"));
    }

    /// The reply to an unsigned `method` request of `target`, which must succeed.
    fn request(&self, method: &str, target: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            s,
            "{method} {target} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(
            reply.starts_with("HTTP/1.1 200"),
            "{method} {target}: {reply}"
        );
        reply
    }
}

impl Moto {
    /// The keys of bucket `bucket`'s multipart uploads started and neither completed nor
    /// aborted (invisible to listings).
    pub fn multipart_uploads(&self, bucket: &str) -> Vec<String> {
        self.request("GET", &format!("/{bucket}?uploads"))
            .split("<Key>")
            .skip(1)
            .filter_map(|k| k.split("</Key>").next())
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unavailable(why: &str) -> Option<Moto> {
    if std::env::var_os("CI").is_some() {
        panic!("the S3 tests need a moto server: {why}");
    }
    eprintln!("NOT RUN: the S3 tests need a moto server: {why}");
    None
}

/// Replaces lease object `file` of `storage` with one that expired (`shared`: a shared
/// writer's commit lease), as another machine sees a lease whose holder stopped renewing it:
/// the next writer, add or collection takes it over.
pub fn expire_lease(storage: &dyn hspack::io::Storage, file: &str, shared: bool) {
    let text = format!(
        r#"{{"token":"00","host":"elsewhere","pid":1,"expires_unix_ms":0,"shared":{shared}}}"#
    );
    storage.replace(file, text.as_bytes(), None, false).unwrap();
}
