//! A process's connection to the broker: blocking request/response with send and receive
//! timeouts (set before `connect`, so that a broker whose backlog is full bounds the connect
//! too), so that a broker that stopped answering is an ERROR in the caller, never a hang.
//!
//! Errors, by code: a transport failure (connect, send, receive: the broker is not running, or
//! closed this connection, e.g. as idle at its client cap) is `SystemError` (58000) and worth
//! one reconnect; a broker at its client cap or out of fds says so (`TooManyClients`,
//! `OutOfResources`: `ConfigurationLimitExceeded`, 53400), and a refusal of the request itself
//! has its own code (`StaleEpoch`: 55000, a malformed exchange: 08P01).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use super::protocol::{self, Op, Request, Response, Status, MAX_MESSAGE};
use super::server::sockaddr;
use crate::error::{Code, Kind, Result, UvmError};

pub struct Client {
    sock: OwnedFd,
}

/// A failed connect, send or receive: of kind `BrokerConnection`, which the segment layer
/// retries once on a fresh connection.
fn broker_error(what: &str, e: io::Error) -> UvmError {
    UvmError::new(Code::SystemError, format!("could not {what} the pg_uvm_share broker: {e}"))
        .with_kind(Kind::BrokerConnection)
        .hint("Check the server log for the broker's status.")
}

/// The error for a broker that refused the connection or request for want of resources.
fn refused(status: Status) -> Option<UvmError> {
    match status {
        Status::TooManyClients => Some(
            UvmError::new(Code::ConfigurationLimitExceeded, "too many connections to the pg_uvm_share broker")
                .detail("The broker serves one connection per server process and a few more; it refused this one.")
                .hint("Something other than the server's processes may be holding connections to its socket."),
        ),
        Status::OutOfResources => Some(
            UvmError::new(Code::ConfigurationLimitExceeded, "the pg_uvm_share broker is out of file descriptors")
                .detail("The broker holds one file descriptor per chunk and one per connection.")
                .hint("Raise the server's open-file limit (ulimit -n, or LimitNOFILE under systemd)."),
        ),
        _ => None,
    }
}

impl Client {
    /// Connects to the broker's socket; every reply must come within `timeout`.
    pub fn connect_with_timeout(path: &Path, timeout: Duration) -> Result<Client> {
        // SAFETY: plain socket creation; the fd is owned right away.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(broker_error("connect to", io::Error::last_os_error()));
        }
        // SAFETY: a fresh fd owned by nobody else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        protocol::set_timeouts(sock.as_fd(), timeout).map_err(|e| broker_error("connect to", e))?;
        let (addr, len) = sockaddr(path).map_err(|e| broker_error("connect to", e))?;
        // SAFETY: addr is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::connect(sock.as_raw_fd(), &addr as *const _ as *const libc::sockaddr, len) } != 0 {
            return Err(broker_error("connect to", io::Error::last_os_error()));
        }
        Ok(Client { sock })
    }

    pub fn connect(path: &Path) -> Result<Client> {
        Self::connect_with_timeout(path, Duration::from_secs(30))
    }

    fn call(&self, req: Request, fd: Option<BorrowedFd<'_>>) -> Result<(Response, Option<OwnedFd>)> {
        let mut buf = [0u8; MAX_MESSAGE];
        if let Err(e) = protocol::send_msg(self.sock.as_fd(), &req.encode(), fd) {
            return Err(self.refusal_notice().unwrap_or_else(|| broker_error("send to", e)));
        }
        let (n, fd) = match protocol::recv_msg(self.sock.as_fd(), &mut buf) {
            Ok((0, _)) => {
                let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
                return Err(self.refusal_notice().unwrap_or_else(|| broker_error("receive from", eof)));
            }
            Ok(got) => got,
            Err(e) => return Err(self.refusal_notice().unwrap_or_else(|| broker_error("receive from", e))),
        };
        let resp = Response::decode(&buf[..n]).map_err(|e| {
            UvmError::new(Code::ProtocolViolation, format!("malformed reply from the pg_uvm_share broker: {e:?}"))
        })?;
        match resp.status {
            Status::Ok => Ok((resp, fd)),
            Status::StaleEpoch => Err(UvmError::new(
                Code::ObjectNotInPrerequisiteState,
                "chunk belongs to an earlier epoch of the pg_uvm_share broker",
            )
            .detail("The server restarted after a crash; segments from before it are gone.")),
            Status::UnknownChunk => {
                Err(UvmError::new(Code::SystemError, format!("chunk {} is unknown to the pg_uvm_share broker", req.chunk)))
            }
            s => Err(refused(s).unwrap_or_else(|| {
                UvmError::new(Code::ProtocolViolation, format!("pg_uvm_share broker refused {:?}: {s:?}", req.op))
            })),
        }
    }

    /// After a transport failure: the notice a broker that refused this connection (at its cap,
    /// or out of fds) sent before closing it, if it is still queued. (Closing a connection with
    /// our request unread makes the first receive report ECONNRESET before the notice.)
    fn refusal_notice(&self) -> Option<UvmError> {
        let mut buf = [0u8; MAX_MESSAGE];
        let got = protocol::recv(self.sock.as_fd(), &mut buf, true).ok()?;
        refused(Response::decode(&buf[..got.len]).ok()?.status)
    }

    /// Hands `fd` to the broker under (epoch, chunk).
    pub fn put(&self, epoch: u64, chunk: u64, fd: BorrowedFd<'_>) -> Result<()> {
        self.call(Request { op: Op::Put, epoch, chunk }, Some(fd)).map(|_| ())
    }

    /// A duplicate of the fd kept under (epoch, chunk).
    pub fn get(&self, epoch: u64, chunk: u64) -> Result<OwnedFd> {
        let (_, fd) = self.call(Request { op: Op::Get, epoch, chunk }, None)?;
        fd.ok_or_else(|| UvmError::new(Code::ProtocolViolation, "pg_uvm_share broker sent no fd"))
    }

    /// Asks the broker to close the fd kept under (epoch, chunk).
    pub fn release(&self, epoch: u64, chunk: u64) -> Result<()> {
        self.call(Request { op: Op::Release, epoch, chunk }, None).map(|_| ())
    }

    /// How many chunk fds the broker holds.
    pub fn stats(&self, epoch: u64) -> Result<u64> {
        self.call(Request { op: Op::Stats, epoch, chunk: 0 }, None).map(|(r, _)| r.value)
    }
}
