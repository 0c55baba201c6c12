//! A TCP proxy that injects faults between a client and a server: on some connections it
//! flips a byte, drops the connection mid-stream (a cut-off body or request) or stalls, in
//! either direction. Faults are drawn from a seeded generator, so a run can be replayed.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What happens to one direction of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// Byte `at` of the stream is flipped.
    Flip(u64),
    /// The connection is cut after `at` bytes.
    Drop(u64),
    /// Nothing is forwarded for this long after the first bytes.
    Stall(Duration),
}

/// A running proxy; it stops accepting when dropped.
pub struct FaultProxy {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Faults injected so far.
    pub injected: Arc<AtomicU64>,
    on: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    losing: Option<Arc<Losing>>,
}

/// Requests whose response is lost: the server gets them and answers, the client sees its
/// connection cut instead of the answer.
struct Losing {
    /// How such a request starts, e.g. `PUT /bucket/key `.
    request: std::sync::Mutex<Vec<u8>>,
    /// How many more to lose.
    left: AtomicU64,
    /// The first lines of the requests whose responses were lost; of those asked for by one
    /// [`FaultProxy::lose`] (from `since` on), each is lost once: its retry goes through.
    lost: std::sync::Mutex<Vec<String>>,
    since: AtomicU64,
}

impl FaultProxy {
    /// Proxies 127.0.0.1:`server`; about one connection direction in `one_in` gets a fault.
    pub fn start(server: u16, seed: u64, one_in: u64) -> FaultProxy {
        FaultProxy::run(server, seed, one_in, None)
    }

    /// Proxies 127.0.0.1:`server` without faults, but renames the conditional-write headers
    /// of every request (`If-Match`, `If-None-Match`) so that the server never sees them: a
    /// server that ignores conditions, as some S3-compatible servers do.
    pub fn ignoring_conditions(server: u16) -> FaultProxy {
        FaultProxy::run_with(server, 1, u64::MAX, None, true, None)
    }

    /// Proxies 127.0.0.1:`server` without faults, but answers every request that starts with
    /// `request` (such as `HEAD /bucket/key `) itself, with `status` (such as `403
    /// Forbidden`) and no body, never forwarding it: a server that refuses or fails one
    /// object's requests.
    pub fn answering(server: u16, request: &str, status: &str) -> FaultProxy {
        let canned = Canned {
            request: request.as_bytes().to_vec(),
            status: status.to_string(),
        };
        FaultProxy::run_with(server, 1, u64::MAX, None, false, Some(Arc::new(canned)))
    }

    /// Proxies 127.0.0.1:`server` without faults, except for the requests whose responses
    /// [`FaultProxy::lose`] asks to lose.
    pub fn losing_responses(server: u16) -> FaultProxy {
        let losing = Losing {
            request: Default::default(),
            left: AtomicU64::new(0),
            lost: Default::default(),
            since: AtomicU64::new(0),
        };
        FaultProxy::run(server, 1, u64::MAX, Some(Arc::new(losing)))
    }

    /// Loses the responses to the next `times` requests that start with `request` (such as
    /// `PUT /bucket/key`), once the server has answered them: what a client sees when the
    /// network fails after its write landed. A request is lost once: its retry (the same
    /// first line) goes through. For a [`FaultProxy::losing_responses`] proxy.
    pub fn lose(&self, request: &str, times: u64) {
        let losing = self.losing.as_ref().expect("a proxy losing responses");
        *losing.request.lock().unwrap() = request.as_bytes().to_vec();
        let lost = losing.lost.lock().unwrap();
        losing.since.store(lost.len() as u64, Ordering::SeqCst);
        losing.left.store(times, Ordering::SeqCst);
    }

    /// The first lines of the requests whose responses were lost so far.
    pub fn lost(&self) -> Vec<String> {
        let losing = self.losing.as_ref().expect("a proxy losing responses");
        losing.lost.lock().unwrap().clone()
    }

    fn run(server: u16, seed: u64, one_in: u64, losing: Option<Arc<Losing>>) -> FaultProxy {
        FaultProxy::run_with(server, seed, one_in, losing, false, None)
    }

    fn run_with(
        server: u16,
        seed: u64,
        one_in: u64,
        losing: Option<Arc<Losing>>,
        unconditional: bool,
        canned: Option<Arc<Canned>>,
    ) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let injected = Arc::new(AtomicU64::new(0));
        let on = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let (inj, on2, stop2) = (injected.clone(), on.clone(), stop.clone());
        let watched = losing.clone();
        std::thread::spawn(move || {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            for client in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(upstream) = TcpStream::connect(("127.0.0.1", server)) else {
                    continue;
                };
                let mut draw = || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut fault = |on: bool| -> Fault {
                    let r = draw();
                    if !on || r % one_in != 0 {
                        return Fault::None;
                    }
                    let at = (r >> 16) % 40_000;
                    match (r >> 8) % 3 {
                        0 => Fault::Flip(at),
                        1 => Fault::Drop(at),
                        _ => Fault::Stall(Duration::from_millis(300 + at % 700)),
                    }
                };
                let enabled = on2.load(Ordering::Relaxed);
                let (up, down) = (fault(enabled), fault(enabled));
                for f in [up, down] {
                    if f != Fault::None {
                        inj.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let lose = Lose {
                    watch: watched.clone(),
                    armed: Arc::new(AtomicBool::new(false)),
                    injected: inj.clone(),
                };
                let answer = Lose {
                    watch: None,
                    ..lose.clone()
                };
                let canned = canned.clone().map(|c| (c, client.try_clone().unwrap()));
                std::thread::spawn(move || pump(client, upstream, up, lose, unconditional, canned));
                std::thread::spawn(move || pump(u2, c2, down, answer, false, None));
            }
        });
        FaultProxy {
            port,
            injected,
            on,
            stop,
            losing,
        }
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Turns fault injection on or off for new connections.
    pub fn set_faults(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port)); // wakes the accept loop
    }
}

/// Requests the proxy answers itself ([`FaultProxy::answering`]).
pub struct Canned {
    request: Vec<u8>,
    status: String,
}

/// One connection's lost responses: the request direction watches for a request to lose
/// (`watch`) and arms the connection; the answer direction, once armed, cuts it.
#[derive(Clone)]
struct Lose {
    watch: Option<Arc<Losing>>,
    armed: Arc<AtomicBool>,
    injected: Arc<AtomicU64>,
}

impl Lose {
    /// Whether the bytes `from` has just read cut the connection here.
    fn cuts(&self, chunk: &[u8]) -> bool {
        match &self.watch {
            Some(losing) => {
                let line = chunk.split(|&b| b == b'\r').next().unwrap_or_default();
                let line = String::from_utf8_lossy(line).into_owned();
                let mut lost = losing.lost.lock().unwrap();
                let asked = chunk.starts_with(&losing.request.lock().unwrap())
                    && !lost[losing.since.load(Ordering::SeqCst) as usize..].contains(&line)
                    && losing
                        .left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                if asked {
                    lost.push(line);
                    self.armed.store(true, Ordering::SeqCst);
                }
                false
            }
            None if self.armed.load(Ordering::SeqCst) => {
                self.injected.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

/// Copies `from` to `to`, applying `fault` and `lose` (and with `unconditional`, renaming
/// the conditional-write headers); closes both when either side ends.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    fault: Fault,
    lose: Lose,
    unconditional: bool,
    mut canned: Option<(Arc<Canned>, TcpStream)>,
) {
    let mut buf = vec![0u8; 16 << 10];
    let mut pos = 0u64;
    let mut stalled = false;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &mut buf[..n];
        if let Some((c, client)) = canned
            .as_mut()
            .filter(|(c, _)| chunk.starts_with(&c.request))
        {
            let reply = format!("HTTP/1.1 {}\r\nContent-Length: 0\r\n\r\n", c.status);
            if client.write_all(reply.as_bytes()).is_err() {
                break;
            }
            continue;
        }
        if lose.cuts(chunk) {
            break;
        }
        if unconditional {
            // Same lengths: the request stays well-formed, the headers unknown to the server.
            for (header, renamed) in [
                (&b"\r\nif-none-match:"[..], &b"\r\nx-no-matching:"[..]),
                (b"\r\nif-match:", b"\r\nx-ignore:"),
            ] {
                let mut i = 0;
                while i + header.len() <= chunk.len() {
                    if chunk[i..i + header.len()].eq_ignore_ascii_case(header) {
                        chunk[i..i + header.len()].copy_from_slice(renamed);
                    }
                    i += 1;
                }
            }
        }
        let end = pos + n as u64;
        match fault {
            Fault::Flip(at) if (pos..end).contains(&at) => chunk[(at - pos) as usize] ^= 0x20,
            Fault::Drop(at) if (pos..end).contains(&at) => {
                let _ = to.write_all(&chunk[..(at - pos) as usize]);
                break;
            }
            Fault::Stall(d) if !stalled => {
                stalled = true;
                std::thread::sleep(d);
            }
            _ => {}
        }
        if to.write_all(chunk).is_err() {
            break;
        }
        pos = end;
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
