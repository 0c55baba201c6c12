//! A plain HTTP file server for tests: serves a folder on a free port of 127.0.0.1, with
//! `HEAD`, `GET` and single `Range: bytes=a-b` / `bytes=-n` requests (what a static file host
//! or CDN answers), one thread per connection, `Connection: close`. Counts the requests.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A running server; it serves until the test process ends.
pub struct HttpFiles {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Requests answered so far.
    pub requests: Arc<AtomicU64>,
}

impl HttpFiles {
    /// Serves `root`.
    pub fn start(root: &Path) -> HttpFiles {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicU64::new(0));
        let (root, counted) = (root.to_path_buf(), Arc::clone(&requests));
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let (root, counted) = (root.clone(), Arc::clone(&counted));
                std::thread::spawn(move || {
                    counted.fetch_add(1, Ordering::Relaxed);
                    let _ = serve(conn, &root);
                });
            }
        });
        HttpFiles { port, requests }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn serve(conn: TcpStream, root: &Path) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
    let mut range = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("range") {
                range = value.trim().strip_prefix("bytes=").map(str::to_string);
            }
        }
    }
    let path: PathBuf = root.join(target.trim_start_matches('/'));
    let mut out = conn;
    let Ok(bytes) = std::fs::read(&path) else {
        return out.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    };
    let len = bytes.len() as u64;
    let span = range.and_then(|r| {
        let (a, b) = r.split_once('-')?;
        match (a.parse::<u64>().ok(), b.parse::<u64>().ok()) {
            (Some(a), Some(b)) => Some((a, b.min(len.saturating_sub(1)))),
            (Some(a), None) => Some((a, len.saturating_sub(1))),
            (None, Some(n)) => Some((len.saturating_sub(n), len.saturating_sub(1))),
            (None, None) => None,
        }
    });
    let (status, body, extra) = match span {
        Some((a, b)) if a < len && a <= b => (
            "206 Partial Content",
            &bytes[a as usize..=b as usize],
            format!("Content-Range: bytes {a}-{b}/{len}\r\n"),
        ),
        Some(_) => (
            "416 Range Not Satisfiable",
            &bytes[..0],
            format!("Content-Range: bytes */{len}\r\n"),
        ),
        None => ("200 OK", &bytes[..], String::new()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\nLast-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\nETag: \"{len}\"\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    out.write_all(head.as_bytes())?;
    if method != "HEAD" {
        out.write_all(body)?;
    }
    Ok(())
}
