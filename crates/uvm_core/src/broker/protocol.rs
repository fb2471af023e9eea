//! The broker's wire protocol: fixed-size little-endian messages over a `SOCK_SEQPACKET` Unix
//! socket, one request and one response per exchange, file descriptors in `SCM_RIGHTS`.
//!
//! ```text
//! request  = magic u32 "UVMB" | version u16 | op u16     | len u32 = 16 | epoch u64 | chunk u64
//! response = magic u32 "UVMB" | version u16 | status u16 | len u32 = 8  | value u64
//! ```
//!
//! `PUT` carries the chunk's fd with the request; a successful `GET` carries it with the
//! response. Seqpacket sockets keep message boundaries: a message longer than the receive buffer
//! is reported truncated (the kernel drops the rest), never read as two. Every length is checked
//! against what the op requires, and a message of another version is answered `VersionMismatch`
//! (never guessed at). Decoding is total (any bytes give a message or a `DecodeError`) and
//! canonical (a decoded message re-encodes to the same bytes); property tests check both.
//! `recv` reports everything that arrived, fds included, so that the server decides what to
//! refuse and every fd is owned (and closed) whatever it decides. This module is plain Rust and
//! is unit-tested over socketpairs.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

pub const MAGIC: u32 = u32::from_le_bytes(*b"UVMB");
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 12;
pub const REQUEST_LEN: usize = HEADER_LEN + 16;
pub const RESPONSE_LEN: usize = HEADER_LEN + 8;
/// Receive buffers are larger than any valid message so that oversized ones are detected.
pub const MAX_MESSAGE: usize = 64;

crate::wire_enum! {
    pub enum Op: u16 {
        /// Keep this fd under (epoch, chunk id).
        Put = 1,
        /// Send me a duplicate of the fd kept under (epoch, chunk id).
        Get = 2,
        /// Close the fd kept under (epoch, chunk id).
        Release = 3,
        /// How many fds do you hold? (value)
        Stats = 4,
    }
}

crate::wire_enum! {
    pub enum Status: u16 {
        Ok = 0,
        UnknownChunk = 1,
        StaleEpoch = 2,
        BadRequest = 3,
        Duplicate = 4,
        VersionMismatch = 5,
        MissingFd = 6,
        /// Sent to a connection refused at the broker's client cap, which then closes it.
        TooManyClients = 7,
        /// The broker is out of fds (or memory): a connection refused at accept, or a `PUT` whose
        /// fd could not be received.
        OutOfResources = 8,
    }
}

impl Status {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub epoch: u64,
    pub chunk: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: Status,
    pub value: u64,
}

/// Why a message could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    BadLength,
    BadMagic,
    Version(u16),
    BadOp,
}

fn header(buf: &mut [u8], code: u16, len: u32) {
    buf[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    buf[4..6].copy_from_slice(&VERSION.to_le_bytes());
    buf[6..8].copy_from_slice(&code.to_le_bytes());
    buf[8..12].copy_from_slice(&len.to_le_bytes());
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Checks magic, version and the length field against the actual length; returns the code.
fn check_header(b: &[u8], expected_len: usize) -> Result<u16, DecodeError> {
    if b.len() < HEADER_LEN {
        return Err(DecodeError::BadLength);
    }
    if u32_at(b, 0) != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = u16_at(b, 4);
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    if b.len() != expected_len || u32_at(b, 8) as usize != expected_len - HEADER_LEN {
        return Err(DecodeError::BadLength);
    }
    Ok(u16_at(b, 6))
}

impl Request {
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        header(&mut b, self.op as u16, 16);
        b[12..20].copy_from_slice(&self.epoch.to_le_bytes());
        b[20..28].copy_from_slice(&self.chunk.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Request, DecodeError> {
        let op = Op::from_repr(check_header(b, REQUEST_LEN)?).ok_or(DecodeError::BadOp)?;
        Ok(Request { op, epoch: u64_at(b, 12), chunk: u64_at(b, 20) })
    }
}

impl Response {
    pub fn encode(&self) -> [u8; RESPONSE_LEN] {
        let mut b = [0u8; RESPONSE_LEN];
        header(&mut b, self.status as u16, 8);
        b[12..20].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Response, DecodeError> {
        let status = Status::from_repr(check_header(b, RESPONSE_LEN)?).ok_or(DecodeError::BadOp)?;
        Ok(Response { status, value: u64_at(b, 12) })
    }
}

const CMSG_SPACE_ONE_FD: usize = 24; // CMSG_SPACE(sizeof(int)) on 64-bit Linux
/// Room for 12 fds: a request carries at most one, so surplus fds are received (and closed)
/// rather than silently discarded, and a control block that does not fit is `fds_truncated`.
const CMSG_BUF: usize = 64;

/// Sends one message, with `fd` attached in `SCM_RIGHTS` if given. Never raises SIGPIPE
/// (`MSG_NOSIGNAL`: a peer that has gone is an `EPIPE` error). With `nonblocking`, a socket whose
/// peer's queue is full gives `WouldBlock` instead of waiting (`MSG_DONTWAIT`).
pub fn send(sock: BorrowedFd<'_>, msg: &[u8], fd: Option<BorrowedFd<'_>>, nonblocking: bool) -> io::Result<()> {
    let mut iov = libc::iovec { iov_base: msg.as_ptr() as *mut libc::c_void, iov_len: msg.len() };
    let mut cbuf = [0u64; CMSG_SPACE_ONE_FD / 8];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut hdr: libc::msghdr = unsafe { zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if let Some(fd) = fd {
        hdr.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        hdr.msg_controllen = CMSG_SPACE_ONE_FD;
        // SAFETY: msg_control points to a buffer of CMSG_SPACE(sizeof(int)) bytes, so the first
        // header and its data fit; CMSG_* compute offsets within it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&hdr);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd.as_raw_fd());
        }
    }
    let flags = libc::MSG_NOSIGNAL | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    loop {
        // SAFETY: hdr references live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &hdr, flags) };
        if n >= 0 {
            // A seqpacket message is sent whole or not at all; anything else is a broken socket.
            return if n as usize == msg.len() { Ok(()) } else { Err(io::Error::from(io::ErrorKind::WriteZero)) };
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Sends one message, waiting if the peer's queue is full (the client's side).
pub fn send_msg(sock: BorrowedFd<'_>, msg: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    send(sock, msg, fd, false)
}

/// What one `recvmsg` delivered. Every fd that arrived is in `fds` and owned here: dropping a
/// `Received` closes them, so no path that refuses a message can leak one.
#[derive(Debug, Default)]
pub struct Received {
    /// Bytes of the message that fit in the buffer. 0 is end of file (or an empty message,
    /// which a seqpacket socket cannot tell apart from it: both end the conversation).
    pub len: usize,
    /// Every fd passed in `SCM_RIGHTS`, in order.
    pub fds: Vec<OwnedFd>,
    /// `MSG_TRUNC`: the message was longer than the buffer; the kernel discarded the rest.
    pub truncated: bool,
    /// `MSG_CTRUNC`: fds did not fit in the control buffer, or this process had no free fd
    /// number for them (`EMFILE`); the kernel closed those it could not deliver.
    pub fds_truncated: bool,
    /// A control message other than `SCM_RIGHTS` came along (nothing valid sends one).
    pub foreign_control: bool,
}

impl Received {
    /// Whether the message is well-formed at the transport level: whole, with its control block
    /// whole, and carrying nothing but fds.
    pub fn is_clean(&self) -> bool {
        !self.truncated && !self.fds_truncated && !self.foreign_control
    }
}

/// Receives one message into `buf`. With `nonblocking`, an empty queue gives `WouldBlock`.
/// Errors are those of `recvmsg(2)` (`ECONNRESET` when the peer died with unread data, ...).
pub fn recv(sock: BorrowedFd<'_>, buf: &mut [u8], nonblocking: bool) -> io::Result<Received> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    let mut cbuf = [0u64; CMSG_BUF / 8];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut hdr: libc::msghdr = unsafe { zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    hdr.msg_controllen = CMSG_BUF;
    let flags = libc::MSG_CMSG_CLOEXEC | if nonblocking { libc::MSG_DONTWAIT } else { 0 };
    let n = loop {
        // SAFETY: hdr references live buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut hdr, flags) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    };
    let mut got = Received {
        len: n.min(buf.len()),
        truncated: hdr.msg_flags & libc::MSG_TRUNC != 0,
        fds_truncated: hdr.msg_flags & libc::MSG_CTRUNC != 0,
        ..Received::default()
    };
    // SAFETY: walking the control messages the kernel wrote, within msg_controllen (which the
    // kernel set to what it used, at most CMSG_BUF); every count is bounded by the buffer.
    unsafe {
        let header_len = libc::CMSG_LEN(0) as usize;
        let mut c = libc::CMSG_FIRSTHDR(&hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count = ((*c).cmsg_len.saturating_sub(header_len) / size_of::<RawFd>()).min(CMSG_BUF / size_of::<RawFd>());
                for i in 0..count {
                    // each received fd is new in this process and owned by us from here on
                    got.fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            } else {
                got.foreign_control = true;
            }
            c = libc::CMSG_NXTHDR(&hdr, c);
        }
    }
    Ok(got)
}

/// Receives one reply (the client's side, blocking up to the socket's receive timeout); returns
/// its length (0: peer closed) and the fd that came with it. A truncated message, more than one
/// fd or a foreign control message is `InvalidData` (and every fd that came is closed).
pub fn recv_msg(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut got = recv(sock, buf, false)?;
    if !got.is_clean() || got.fds.len() > 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "malformed message"));
    }
    Ok((got.len, got.fds.pop()))
}

/// Sets `sock`'s receive and send timeouts: a blocking call on it fails with EAGAIN after
/// `timeout` instead of waiting for ever (the client's calls, and the tests' raw connections).
pub fn set_timeouts(sock: BorrowedFd<'_>, timeout: std::time::Duration) -> io::Result<()> {
    let tv = libc::timeval { tv_sec: timeout.as_secs() as libc::time_t, tv_usec: timeout.subsec_micros() as libc::suseconds_t };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: setsockopt reads a timeval from a live local.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &tv as *const libc::timeval as *const libc::c_void,
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The uid of the process at the other end of a connected Unix socket.
pub fn peer_uid(sock: BorrowedFd<'_>) -> io::Result<u32> {
    peer_cred(sock).map(|c| c.uid)
}

/// The pid of the process at the other end of a connected Unix socket (as of its connect).
pub fn peer_pid(sock: BorrowedFd<'_>) -> io::Result<libc::pid_t> {
    peer_cred(sock).map(|c| c.pid)
}

fn peer_cred(sock: BorrowedFd<'_>) -> io::Result<libc::ucred> {
    // SAFETY: ucred is plain data; getsockopt writes at most `len` bytes into it.
    unsafe {
        let mut cred: libc::ucred = zeroed();
        let mut len = size_of::<libc::ucred>() as libc::socklen_t;
        if libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(cred)
    }
}

/// A connected seqpacket socket pair (tests, and nothing else).
pub fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two fds into the array on success.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_and_statuses_round_trip_through_their_numbers() {
        for &op in Op::ALL {
            assert_eq!(Op::from_repr(op as u16), Some(op));
        }
        for &st in Status::ALL {
            assert_eq!(Status::from_repr(st as u16), Some(st));
        }
        assert_eq!((Op::from_repr(0), Status::from_repr(9)), (None, None));
    }
    use std::os::fd::AsFd;

    #[test]
    fn request_round_trip() {
        let r = Request { op: Op::Get, epoch: 0xdead_beef_0102, chunk: 77 };
        let b = r.encode();
        assert_eq!(b.len(), REQUEST_LEN);
        assert_eq!(&b[0..4], b"UVMB");
        assert_eq!(Request::decode(&b), Ok(r));
    }

    #[test]
    fn response_round_trip() {
        let r = Response { status: Status::StaleEpoch, value: 5 };
        assert_eq!(Response::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn lengths_magic_version_and_ops_are_checked() {
        let good = Request { op: Op::Put, epoch: 1, chunk: 2 }.encode();
        assert_eq!(Request::decode(&good[..REQUEST_LEN - 1]), Err(DecodeError::BadLength));
        assert_eq!(Request::decode(&good[..4]), Err(DecodeError::BadLength));
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(Request::decode(&long), Err(DecodeError::BadLength));
        let mut bad_len_field = good;
        bad_len_field[8] = 15;
        assert_eq!(Request::decode(&bad_len_field), Err(DecodeError::BadLength));
        let mut bad_magic = good;
        bad_magic[0] = b'X';
        assert_eq!(Request::decode(&bad_magic), Err(DecodeError::BadMagic));
        let mut v2 = good;
        v2[4] = 2;
        assert_eq!(Request::decode(&v2), Err(DecodeError::Version(2)));
        let mut bad_op = good;
        bad_op[6] = 99;
        assert_eq!(Request::decode(&bad_op), Err(DecodeError::BadOp));
        // a response is not a request
        assert_eq!(Request::decode(&Response { status: Status::Ok, value: 0 }.encode()), Err(DecodeError::BadLength));
    }

    #[test]
    fn fds_travel_with_messages() {
        let (a, b) = socketpair().unwrap();
        let (p, q) = socketpair().unwrap(); // something to pass
        send_msg(a.as_fd(), b"hello", Some(p.as_fd())).unwrap();
        let mut buf = [0u8; MAX_MESSAGE];
        let (n, fd) = recv_msg(b.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        // the received fd is the same socket: a message sent on it arrives at q
        send_msg(fd.unwrap().as_fd(), b"x", None).unwrap();
        let (n, fd) = recv_msg(q.as_fd(), &mut buf).unwrap();
        assert_eq!((n, fd.is_none()), (1, true));
        drop(a);
        assert_eq!(recv_msg(b.as_fd(), &mut buf).unwrap().0, 0);
    }

    #[test]
    fn oversized_messages_are_rejected() {
        let (a, b) = socketpair().unwrap();
        send_msg(a.as_fd(), &[0u8; 100], None).unwrap();
        let mut buf = [0u8; MAX_MESSAGE];
        assert!(recv_msg(b.as_fd(), &mut buf).is_err());
    }

    #[test]
    fn foreign_control_messages_and_surplus_fds_are_reported() {
        // With SO_PASSCRED the kernel attaches SCM_CREDENTIALS to every message: a control
        // message that is not SCM_RIGHTS, which the server refuses.
        let (a, b) = socketpair().unwrap();
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads an int from a live local.
        let rc = unsafe {
            libc::setsockopt(
                b.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                &on as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        send_msg(a.as_fd(), b"hi", None).unwrap();
        let mut buf = [0u8; MAX_MESSAGE];
        let got = recv(b.as_fd(), &mut buf, true).unwrap();
        assert!(got.foreign_control && !got.is_clean(), "{got:?}");
        send_msg(a.as_fd(), b"hi", None).unwrap();
        assert_eq!(recv_msg(b.as_fd(), &mut buf).unwrap_err().kind(), io::ErrorKind::InvalidData);
        // More fds than the control buffer holds: those that fit are received (to be closed),
        // the rest dropped by the kernel, and the message is marked.
        let (c, d) = socketpair().unwrap();
        let (p, _q) = socketpair().unwrap();
        let fds = [p.as_raw_fd(); 20];
        let mut cbuf = [0u64; 16];
        let mut iov = libc::iovec { iov_base: b"x".as_ptr() as *mut libc::c_void, iov_len: 1 };
        // SAFETY: msghdr is plain data; the control buffer (128 bytes) holds one header and 20 fds.
        unsafe {
            let mut hdr: libc::msghdr = zeroed();
            hdr.msg_iov = &mut iov;
            hdr.msg_iovlen = 1;
            hdr.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            hdr.msg_controllen = libc::CMSG_SPACE(80) as usize;
            let cm = libc::CMSG_FIRSTHDR(&hdr);
            (*cm).cmsg_level = libc::SOL_SOCKET;
            (*cm).cmsg_type = libc::SCM_RIGHTS;
            (*cm).cmsg_len = libc::CMSG_LEN(80) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cm) as *mut RawFd, 20);
            assert_eq!(libc::sendmsg(c.as_raw_fd(), &hdr, 0), 1);
        }
        let got = recv(d.as_fd(), &mut buf, true).unwrap();
        assert!(got.fds_truncated && !got.is_clean() && got.fds.len() == (CMSG_BUF - 16) / 4, "{got:?}");
    }

    #[test]
    fn peer_uid_is_ours() {
        let (a, _b) = socketpair().unwrap();
        // SAFETY: geteuid has no preconditions.
        assert_eq!(peer_uid(a.as_fd()).unwrap(), unsafe { libc::geteuid() });
    }

    // --- property tests (bounded in CI; for a long run: PROPTEST_CASES=1000000 cargo test --lib
    // broker::) ------------------------------------------------------------------------------

    use proptest::prelude::*;

    /// Bytes that are mostly near a valid message (a valid one with a few bytes changed, cut or
    /// extended) and sometimes anything at all, so that every check is reached.
    fn message_like(valid: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
        let mutated = (Just(valid), prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4), 0usize..40)
            .prop_map(|(mut b, edits, len)| {
                for (i, v) in edits {
                    let at = i.index(b.len());
                    b[at] = v;
                }
                b.resize(len, 0);
                b
            });
        prop_oneof![mutated, prop::collection::vec(any::<u8>(), 0..300)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::testing::proptest_cases(2048)))]

        #[test]
        fn any_bytes_decode_to_a_valid_request_or_a_typed_error(
            b in message_like(Request { op: Op::Put, epoch: 3, chunk: 4 }.encode().to_vec())
        ) {
            match Request::decode(&b) {
                // A message that decodes is canonical: it is exactly the encoding of what it says.
                Ok(r) => prop_assert_eq!(&r.encode()[..], &b[..]),
                Err(DecodeError::BadLength) => prop_assert!(
                    b.len() != REQUEST_LEN || u32::from_le_bytes(b[8..12].try_into().unwrap()) != 16
                ),
                Err(DecodeError::BadMagic) => prop_assert!(b.len() >= HEADER_LEN && b[..4] != *b"UVMB"),
                Err(DecodeError::Version(v)) => prop_assert!(v != VERSION && b[..4] == *b"UVMB"),
                Err(DecodeError::BadOp) => prop_assert!(b.len() == REQUEST_LEN && !(1..=4).contains(&u16_at(&b, 6))),
            }
        }

        #[test]
        fn any_bytes_decode_to_a_valid_response_or_a_typed_error(
            b in message_like(Response { status: Status::Ok, value: 9 }.encode().to_vec())
        ) {
            match Response::decode(&b) {
                Ok(r) => prop_assert_eq!(&r.encode()[..], &b[..]),
                Err(DecodeError::BadLength) => prop_assert!(
                    b.len() != RESPONSE_LEN || u32::from_le_bytes(b[8..12].try_into().unwrap()) != 8
                ),
                Err(DecodeError::BadMagic) => prop_assert!(b.len() >= HEADER_LEN && b[..4] != *b"UVMB"),
                Err(DecodeError::Version(v)) => prop_assert!(v != VERSION),
                Err(DecodeError::BadOp) => prop_assert!(u16_at(&b, 6) > 8),
            }
        }

        #[test]
        fn requests_round_trip(op in 1u16..=4, epoch: u64, chunk: u64) {
            let r = Request { op: Op::from_repr(op).unwrap(), epoch, chunk };
            prop_assert_eq!(Request::decode(&r.encode()), Ok(r));
        }

        #[test]
        fn responses_round_trip(status in 0u16..=8, value: u64) {
            let r = Response { status: Status::from_repr(status).unwrap(), value };
            prop_assert_eq!(Response::decode(&r.encode()), Ok(r));
        }

        /// Whatever comes over a real socket (any length, up to well past the buffer), `recv`
        /// reports it without panicking, and `recv_msg` refuses what does not fit.
        #[test]
        fn received_messages_of_any_length(len in 1usize..5000) {
            let (a, b) = socketpair().unwrap();
            send_msg(a.as_fd(), &vec![0x5a; len], None).unwrap();
            let mut buf = [0u8; MAX_MESSAGE];
            let got = recv(b.as_fd(), &mut buf, true).unwrap();
            prop_assert_eq!(got.len, len.min(MAX_MESSAGE));
            prop_assert_eq!(got.truncated, len > MAX_MESSAGE);
            prop_assert!(got.fds.is_empty() && !got.fds_truncated && !got.foreign_control);
        }
    }
}
