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
    /// Serves `root`, each file with an ETag (its length) and one fixed last-modified time.
    pub fn start(root: &Path) -> HttpFiles {
        HttpFiles::serving(root, true)
    }

    /// Serves `root` as a server that sends no ETag: each file with its modification time
    /// as its last-modified time (and `If-Unmodified-Since` not honoured).
    pub fn start_without_etags(root: &Path) -> HttpFiles {
        HttpFiles::serving(root, false)
    }

    fn serving(root: &Path, etags: bool) -> HttpFiles {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicU64::new(0));
        let (root, counted) = (root.to_path_buf(), Arc::clone(&requests));
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let (root, counted) = (root.clone(), Arc::clone(&counted));
                std::thread::spawn(move || {
                    counted.fetch_add(1, Ordering::Relaxed);
                    let _ = serve(conn, &root, etags);
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

fn serve(conn: TcpStream, root: &Path, etags: bool) -> std::io::Result<()> {
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
    let identity = match etags {
        true => format!("Last-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\nETag: \"{len}\"\r\n"),
        false => {
            let modified = std::fs::metadata(&path)?.modified()?;
            let secs = modified
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            format!("Last-Modified: {}\r\n", http_date(secs))
        }
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\n{identity}{extra}Connection: close\r\n\r\n",
        body.len()
    );
    out.write_all(head.as_bytes())?;
    if method != "HEAD" {
        out.write_all(body)?;
    }
    Ok(())
}

/// `secs` after the epoch as an HTTP date (`Thu, 01 Jan 2026 00:00:00 GMT`).
fn http_date(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[month as usize - 1],
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}
