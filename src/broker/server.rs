//! The broker's state and event loop, in plain Rust (the background worker in `worker.rs` only
//! wraps it in PostgreSQL's process conventions).
//!
//! The broker keeps one fd per chunk id. `PUT` stores the fd that came with the request (a
//! duplicate id is refused and the new fd closed), `GET` answers with the stored fd attached,
//! `RELEASE` closes it. Requests whose epoch is not the broker's are refused with `StaleEpoch`:
//! after a crash-restart the epoch changes, so no id from before can ever resolve. Connections
//! from another uid are closed at accept (`SO_PEERCRED`); malformed messages get `BadRequest` or
//! `VersionMismatch` and the connection stays usable. `retain` is the garbage sweep: it closes
//! every fd whose id the registry no longer knows.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::protocol::{self, DecodeError, Op, Request, Response, Status, MAX_MESSAGE};

/// The fd table.
pub struct Broker {
    epoch: u64,
    chunks: HashMap<u64, OwnedFd>,
}

impl Broker {
    pub fn new(epoch: u64) -> Broker {
        Broker { epoch, chunks: HashMap::new() }
    }

    pub fn held(&self) -> usize {
        self.chunks.len()
    }

    /// Answers one message. Returns the response and, for a successful `GET`, the fd to attach.
    pub fn handle(&mut self, msg: &[u8], fd: Option<OwnedFd>) -> (Response, Option<BorrowedFd<'_>>) {
        let reply = |status| (Response { status, value: 0 }, None);
        let req = match Request::decode(msg) {
            Ok(r) => r,
            Err(DecodeError::Version(_)) => return reply(Status::VersionMismatch),
            Err(_) => return reply(Status::BadRequest),
        };
        if req.op != Op::Put && fd.is_some() {
            return reply(Status::BadRequest); // an unexpected fd is dropped (closed) here
        }
        if req.epoch != self.epoch {
            return reply(Status::StaleEpoch);
        }
        match req.op {
            Op::Put => {
                let Some(fd) = fd else { return reply(Status::MissingFd) };
                if req.chunk == 0 || self.chunks.contains_key(&req.chunk) {
                    return reply(Status::Duplicate);
                }
                self.chunks.insert(req.chunk, fd);
                reply(Status::Ok)
            }
            Op::Get => match self.chunks.get(&req.chunk) {
                Some(fd) => (Response { status: Status::Ok, value: 0 }, Some(fd.as_fd())),
                None => reply(Status::UnknownChunk),
            },
            Op::Release => match self.chunks.remove(&req.chunk) {
                Some(_) => reply(Status::Ok),
                None => reply(Status::UnknownChunk),
            },
            Op::Stats => (Response { status: Status::Ok, value: self.chunks.len() as u64 }, None),
        }
    }

    /// Closes every fd whose chunk id is not in `known`; returns how many were closed.
    pub fn retain(&mut self, known: &HashSet<u64>) -> usize {
        let before = self.chunks.len();
        self.chunks.retain(|id, _| known.contains(id));
        before - self.chunks.len()
    }
}

/// A listening socket, its connected clients, and the fd table.
pub struct Server {
    listener: OwnedFd,
    clients: Vec<OwnedFd>,
    uid: u32,
    pub broker: Broker,
}

impl Server {
    /// Binds a seqpacket socket at `path` (replacing a stale one), mode 0600.
    pub fn bind(path: &Path, epoch: u64) -> io::Result<Server> {
        let _ = std::fs::remove_file(path);
        // SAFETY: plain socket creation; the fd is owned right away.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd owned by nobody else.
        let listener = unsafe { OwnedFd::from_raw_fd(fd) };
        let (addr, len) = sockaddr(path)?;
        // SAFETY: addr is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::bind(listener.as_raw_fd(), &addr as *const _ as *const libc::sockaddr, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        // SAFETY: listen on our bound socket.
        if unsafe { libc::listen(listener.as_raw_fd(), 128) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        Ok(Server { listener, clients: Vec::new(), uid, broker: Broker::new(epoch) })
    }

    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// The sockets to wait on: the listener first, then every client.
    pub fn watched_fds(&self) -> Vec<RawFd> {
        std::iter::once(self.listener.as_raw_fd()).chain(self.clients.iter().map(|c| c.as_raw_fd())).collect()
    }

    /// Handles readiness of one watched socket: accepts on the listener, or answers one request
    /// from a client (dropping the client if it has gone). Returns whether a request was answered.
    pub fn on_readable(&mut self, fd: RawFd) -> io::Result<bool> {
        if fd == self.listener.as_raw_fd() {
            self.accept()?;
            return Ok(false);
        }
        let Some(i) = self.clients.iter().position(|c| c.as_raw_fd() == fd) else { return Ok(false) };
        match self.serve_one(i) {
            Ok(true) => Ok(true),
            Ok(false) | Err(_) => {
                self.clients.swap_remove(i); // closes the connection
                Ok(false)
            }
        }
    }

    /// Waits up to `timeout_ms` for activity with poll(2), then handles it. Returns the number
    /// of requests answered. (The background worker waits with PostgreSQL's WaitEventSet
    /// instead, so that its latch and interrupts are served too.)
    pub fn poll_once(&mut self, timeout_ms: i32) -> io::Result<usize> {
        let mut pfds: Vec<libc::pollfd> =
            self.watched_fds().into_iter().map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
        // SAFETY: pfds is a valid array of pollfd for the duration of the call.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
        }
        let mut answered = 0;
        for p in pfds.iter().filter(|p| p.revents != 0) {
            answered += self.on_readable(p.fd)? as usize;
        }
        Ok(answered)
    }

    fn accept(&mut self) -> io::Result<()> {
        // SAFETY: accept4 on our listening socket; the new fd is owned right away.
        let fd =
            unsafe { libc::accept4(self.listener.as_raw_fd(), std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ECONNABORTED) => Ok(()),
                _ => Err(e),
            };
        }
        // SAFETY: a fresh fd owned by nobody else.
        let conn = unsafe { OwnedFd::from_raw_fd(fd) };
        match protocol::peer_uid(conn.as_fd()) {
            Ok(uid) if uid == self.uid => self.clients.push(conn),
            _ => {} // another user: closed by dropping `conn`
        }
        Ok(())
    }

    /// Answers one request from client `i`; false when the client has gone.
    fn serve_one(&mut self, i: usize) -> io::Result<bool> {
        let mut buf = [0u8; MAX_MESSAGE];
        let conn = self.clients[i].as_fd();
        let resp = match protocol::recv_msg(conn, &mut buf) {
            Ok((0, _)) => return Ok(false),
            Ok((n, fd)) => self.broker.handle(&buf[..n], fd),
            // oversized or truncated: refuse it, keep the connection
            Err(e) if e.kind() == io::ErrorKind::InvalidData => (Response { status: Status::BadRequest, value: 0 }, None),
            Err(e) => return Err(e),
        };
        protocol::send_msg(conn, &resp.0.encode(), resp.1)?;
        Ok(true)
    }
}

/// A `sockaddr_un` for `path` (relative paths allowed: backends run in the data directory).
pub fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "socket path too long"));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    Ok((addr, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::client::Client;
    use crate::provider::{host::HostProvider, Provider};
    use crate::registry::Tier;

    fn memfd() -> OwnedFd {
        HostProvider.create_chunk(Tier::Host, 4096).unwrap()
    }

    #[test]
    fn put_get_release_stats() {
        let mut b = Broker::new(9);
        let put = Request { op: Op::Put, epoch: 9, chunk: 1 }.encode();
        assert_eq!(b.handle(&put, Some(memfd())).0.status, Status::Ok);
        assert_eq!(b.handle(&put, Some(memfd())).0.status, Status::Duplicate);
        assert_eq!(b.handle(&put, None).0.status, Status::MissingFd);
        let get = Request { op: Op::Get, epoch: 9, chunk: 1 }.encode();
        let (r, fd) = b.handle(&get, None);
        assert_eq!((r.status, fd.is_some()), (Status::Ok, true));
        let stats = Request { op: Op::Stats, epoch: 9, chunk: 0 }.encode();
        assert_eq!(b.handle(&stats, None).0.value, 1);
        let rel = Request { op: Op::Release, epoch: 9, chunk: 1 }.encode();
        assert_eq!(b.handle(&rel, None).0.status, Status::Ok);
        assert_eq!(b.handle(&rel, None).0.status, Status::UnknownChunk);
        assert_eq!(b.handle(&get, None).0.status, Status::UnknownChunk);
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn stale_epochs_and_garbage_are_refused() {
        let mut b = Broker::new(9);
        let put = Request { op: Op::Put, epoch: 8, chunk: 1 }.encode();
        assert_eq!(b.handle(&put, Some(memfd())).0.status, Status::StaleEpoch);
        assert_eq!(b.held(), 0);
        assert_eq!(b.handle(b"nonsense", None).0.status, Status::BadRequest);
        let mut v2 = Request { op: Op::Get, epoch: 9, chunk: 1 }.encode();
        v2[4] = 7;
        assert_eq!(b.handle(&v2, None).0.status, Status::VersionMismatch);
        // an fd sent with a GET is refused (and closed)
        let get = Request { op: Op::Get, epoch: 9, chunk: 1 }.encode();
        assert_eq!(b.handle(&get, Some(memfd())).0.status, Status::BadRequest);
    }

    #[test]
    fn retain_closes_unknown_ids() {
        let mut b = Broker::new(1);
        for id in 1..=3 {
            b.handle(&Request { op: Op::Put, epoch: 1, chunk: id }.encode(), Some(memfd()));
        }
        assert_eq!(b.retain(&[2u64].into_iter().collect()), 2);
        assert_eq!(b.held(), 1);
    }

    #[test]
    fn clients_talk_to_a_server_thread() {
        let dir = std::env::temp_dir().join(format!("uvm-broker-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("b.sock");
        let mut server = Server::bind(&path, 5).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let t = std::thread::spawn(move || {
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                server.poll_once(20).unwrap();
            }
            server.broker.held()
        });
        let c1 = Client::connect(&path).unwrap();
        let c2 = Client::connect(&path).unwrap();
        // c1 creates a chunk, writes into it and hands it over; c2 gets it and reads the bytes.
        let fd = memfd();
        // SAFETY: pwrite into our own memfd.
        unsafe { libc::pwrite(fd.as_raw_fd(), b"shared!".as_ptr() as *const libc::c_void, 7, 0) };
        c1.put(5, 42, fd.as_fd()).unwrap();
        drop(fd);
        let got = c2.get(5, 42).unwrap();
        let mut buf = [0u8; 7];
        // SAFETY: pread from the received memfd into a local buffer.
        unsafe { libc::pread(got.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, 7, 0) };
        assert_eq!(&buf, b"shared!");
        assert_eq!(c2.stats(5).unwrap(), 1);
        let e = c2.get(4, 42).unwrap_err();
        assert!(e.message.contains("epoch"), "{e}");
        assert!(c2.get(5, 43).is_err());
        c1.release(5, 42).unwrap();
        assert_eq!(c1.stats(5).unwrap(), 0);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(t.join().unwrap(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
