//! Authenticated, length-prefixed frames over a byte stream (tokio TCP in practice), generic over
//! the message type: the checkpoint servers use it now and the cluster transport reuses it.
//!
//! Rules the code keeps:
//!
//! 1. **Frames.** A frame is a 4-byte little-endian length `n` then `n` bytes. `n` is checked
//!    against the connection's maximum *before* any buffer is allocated: a frame claiming more
//!    is refused ([`WireError::FrameTooLarge`]) and the connection closed.
//! 2. **Handshake** (challenge-response on the shared [`Key`]; no secret ever crosses the wire):
//!    the client sends `HELLO_MAGIC ‖ nonce_c`; the server answers
//!    `nonce_s ‖ mac(key, SERVER_PROOF, nonce_c ‖ nonce_s)`; the client checks it (a server
//!    with another key is refused: [`WireError::WrongKey`]) and answers
//!    `mac(key, CLIENT_PROOF, nonce_c ‖ nonce_s)`, which the server checks (a client with another
//!    key is dropped). Nonces are 32 fresh random bytes from each side, so a recorded handshake
//!    cannot be replayed. The whole handshake has a deadline ([`HANDSHAKE_TIMEOUT`]).
//! 3. **Session.** Both sides derive `session = blake3::derive_key(SESSION, key ‖ nonce_c ‖
//!    nonce_s)`. Every later frame body is `seq (u64 LE) ‖ mac (32 bytes) ‖ payload` where
//!    `mac = keyed_blake3(session, direction ‖ seq ‖ payload)`; the direction byte (0 client to
//!    server, 1 server to client) stops a frame being reflected back to its sender.
//! 4. **Order.** Each direction numbers its frames 0, 1, 2, ...; a receiver accepts exactly the
//!    next number. A replayed, dropped or reordered frame is [`WireError::Sequence`].
//! 5. **Any violation closes the connection**: bad MAC, bad sequence, oversized or malformed
//!    frame, undecodable payload. The error is returned to the caller (the server logs it and
//!    keeps serving other connections); a connection is never used after an error.
//! 6. Payloads are postcard-encoded serde values. Decoding a payload never allocates more than
//!    the frame's length, which rule 1 bounds.
//! 7. **Memory follows the bytes.** A frame's buffer grows as its bytes arrive, in steps of at
//!    most [`READ_CHUNK`] or what has arrived so far, never to the declared length up front: a
//!    peer that declares 48 MiB and sends 1 KiB makes the receiver hold about 64 KiB. Before the
//!    handshake the limit is 64 bytes (a hello or a proof), whatever `max_frame` says.
//! 8. **Budget.** A server receives with [`Connection::recv_within`]: each frame reserves its
//!    declared length from a [`FrameBudget`] shared by all connections before its body is read
//!    (waiting while the budget is spent; a frame larger than the whole budget is refused), and
//!    keeps the reservation until the caller drops it (after answering). Its body must then
//!    arrive within a deadline, so a peer that stalls mid-frame releases its reservation. So
//!    the bytes of requests a server holds never exceed its budget, and reserving whole frames
//!    (rather than chunks) means a frame that got its reservation can always complete.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::key::Key;

/// Magic that opens a client hello: names the protocol and its version.
pub const HELLO_MAGIC: &[u8; 8] = b"VFWIRE01";
/// Default maximum frame: 64 MiB, above a log segment batch's fragment (segments are a few MiB)
/// and far below what would hurt a server's memory if many clients sent one at once.
pub const DEFAULT_MAX_FRAME: usize = 64 << 20;
/// Deadline for the whole handshake; an unauthenticated peer cannot hold a connection longer.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Step by which a frame buffer grows while its bytes arrive (rule 7): 64 KiB, a log segment's
/// size, so a typical frame is read in one or two steps.
pub const READ_CHUNK: usize = 64 << 10;
/// Largest handshake message (rule 7): a hello is 40 bytes, a server reply 64, a proof 32.
const HANDSHAKE_MAX: usize = 64;

const SERVER_PROOF: &str = "veriflow wire v1 server proof";
const CLIENT_PROOF: &str = "veriflow wire v1 client proof";
const SESSION: &str = "veriflow wire v1 session key";
/// seq (8) + mac (32).
const AUTH_LEN: usize = 40;

/// What went wrong on a connection, grouped by what the caller should do. After any of these
/// the connection is closed (rule 5).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    // --- retry (maybe elsewhere) ---
    /// The stream failed (refused, reset, ...).
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection.
    #[error("connection closed by peer")]
    Closed,
    /// No answer within the deadline.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    // --- fix the configuration ---
    /// The peer does not know our key (or we do not know its): use the same key file on both.
    #[error("peer failed to prove knowledge of the shared key (different key files?)")]
    WrongKey,
    // --- the peer broke the protocol (a bug or an attack); the connection is closed ---
    /// A frame's length field exceeds the maximum (checked before allocating).
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge {
        /// Claimed length.
        len: u64,
        /// The limit.
        max: usize,
    },
    /// A frame's MAC does not verify: forged or corrupted.
    #[error("frame authentication failed (bad MAC)")]
    BadMac,
    /// A frame arrived out of order or twice.
    #[error("frame sequence {got}, expected {expected} (replayed or reordered)")]
    Sequence {
        /// Number received.
        got: u64,
        /// Number expected.
        expected: u64,
    },
    /// A frame is too short or its payload does not decode.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// The handshake did not follow the protocol.
    #[error("handshake failed: {0}")]
    Handshake(String),
}

impl WireError {
    /// Whether retrying (on a new connection) may help.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            WireError::Io(_) | WireError::Closed | WireError::Timeout(_)
        )
    }
}

/// Which end of the connection we are (the direction byte of rule 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

impl Side {
    fn send_dir(self) -> u8 {
        match self {
            Side::Client => 0,
            Side::Server => 1,
        }
    }
    fn recv_dir(self) -> u8 {
        1 - self.send_dir()
    }
}

/// An authenticated connection (rules 2-5).
#[derive(Debug)]
pub struct Connection<S> {
    stream: S,
    session: [u8; 32],
    side: Side,
    send_seq: u64,
    recv_seq: u64,
    max_frame: usize,
}

async fn write_raw<S: AsyncWrite + Unpin>(s: &mut S, parts: &[&[u8]]) -> Result<(), WireError> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(len).map_err(|_| WireError::FrameTooLarge {
        len: len as u64,
        max: u32::MAX as usize,
    })?;
    s.write_all(&len.to_le_bytes()).await?;
    for p in parts {
        s.write_all(p).await?;
    }
    s.flush().await?;
    Ok(())
}

/// Reads a frame's 4-byte length and checks it against `max` (rule 1).
async fn read_len<S: AsyncRead + Unpin>(s: &mut S, max: usize) -> Result<usize, WireError> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(WireError::Closed),
        Err(e) => return Err(e.into()),
    }
    let n = u32::from_le_bytes(len);
    let n_usize = usize::try_from(n).unwrap_or(usize::MAX);
    if n_usize > max {
        return Err(WireError::FrameTooLarge {
            len: u64::from(n),
            max,
        });
    }
    Ok(n_usize)
}

/// Reads a frame body of `n` bytes, growing the buffer only as bytes arrive (rule 7), and keeps
/// `budget`'s count of buffered bytes up to date while it does.
async fn read_body<S: AsyncRead + Unpin>(
    s: &mut S,
    n: usize,
    budget: Option<&FrameBudget>,
) -> Result<Vec<u8>, WireError> {
    let mut buf: Vec<u8> = Vec::new();
    let mut counted = Buffered { budget, bytes: 0 };
    while buf.len() < n {
        if buf.len() == buf.capacity() {
            let grow = (n - buf.len()).min(buf.len().max(READ_CHUNK));
            buf.reserve_exact(grow);
            counted.set(buf.capacity());
        }
        let want = (buf.capacity() - buf.len()).min(n - buf.len());
        let got = (&mut *s)
            .take(want as u64)
            .read_buf(&mut buf)
            .await
            .map_err(WireError::from)?;
        if got == 0 {
            return Err(WireError::Closed);
        }
        if let Some(b) = budget {
            b.inner.received.fetch_add(got as u64, Ordering::Relaxed);
        }
    }
    Ok(buf)
}

/// Reads one frame (rules 1 and 7: the length is checked before anything is allocated, and
/// the buffer grows with the bytes that arrive).
async fn read_raw<S: AsyncRead + Unpin>(s: &mut S, max: usize) -> Result<Vec<u8>, WireError> {
    let n = read_len(s, max).await?;
    read_body(s, n, None).await
}

/// Reads one frame within `budget` (rules 1, 7, 8): the length is checked, the declared
/// length reserved, then the body read within `body_deadline`.
pub(crate) async fn recv_frame_within<S: AsyncRead + Unpin>(
    s: &mut S,
    max: usize,
    budget: &FrameBudget,
    body_deadline: Duration,
) -> Result<(Vec<u8>, Reservation), WireError> {
    let n = read_len(s, max).await?;
    let reservation = budget.reserve(n).await?;
    let frame = tokio::time::timeout(body_deadline, read_body(s, n, Some(budget)))
        .await
        .map_err(|_| WireError::Timeout(body_deadline))??;
    Ok((frame, reservation))
}

/// A memory budget for the frames a server is receiving, shared by its connections (rule 8),
/// with counters for tests and monitoring. Cloning gives another handle on the same budget.
#[derive(Debug, Clone)]
pub struct FrameBudget {
    inner: Arc<BudgetInner>,
}

#[derive(Debug)]
struct BudgetInner {
    permits: Arc<tokio::sync::Semaphore>,
    limit: usize,
    reserved: AtomicUsize,
    buffered: AtomicUsize,
    peak_buffered: AtomicUsize,
    received: AtomicU64,
}

impl FrameBudget {
    /// A budget of `limit` bytes (at most `tokio::sync::Semaphore::MAX_PERMITS`).
    pub fn new(limit: usize) -> FrameBudget {
        let limit = limit.min(tokio::sync::Semaphore::MAX_PERMITS);
        FrameBudget {
            inner: Arc::new(BudgetInner {
                permits: Arc::new(tokio::sync::Semaphore::new(limit)),
                limit,
                reserved: AtomicUsize::new(0),
                buffered: AtomicUsize::new(0),
                peak_buffered: AtomicUsize::new(0),
                received: AtomicU64::new(0),
            }),
        }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Bytes reserved by frames being received or not yet answered (never above the limit).
    pub fn reserved(&self) -> usize {
        self.inner.reserved.load(Ordering::SeqCst)
    }

    /// Bytes of frame buffers allocated right now (capacity, rule 7).
    pub fn buffered(&self) -> usize {
        self.inner.buffered.load(Ordering::SeqCst)
    }

    /// The most [`FrameBudget::buffered`] has ever been.
    pub fn peak_buffered(&self) -> usize {
        self.inner.peak_buffered.load(Ordering::SeqCst)
    }

    /// Frame body bytes read so far, in total.
    pub fn received(&self) -> u64 {
        self.inner.received.load(Ordering::SeqCst)
    }

    /// Reserves `n` bytes, waiting until they are free (rule 8).
    async fn reserve(&self, n: usize) -> Result<Reservation, WireError> {
        if n > self.inner.limit {
            return Err(WireError::FrameTooLarge {
                len: n as u64,
                max: self.inner.limit,
            });
        }
        // n <= limit <= MAX_PERMITS; a frame length came from a u32.
        let permits = u32::try_from(n).map_err(|_| WireError::FrameTooLarge {
            len: n as u64,
            max: u32::MAX as usize,
        })?;
        let permit = self
            .inner
            .permits
            .clone()
            .acquire_many_owned(permits)
            .await
            .map_err(|_| WireError::Closed)?; // the semaphore is never closed
        self.inner.reserved.fetch_add(n, Ordering::SeqCst);
        Ok(Reservation {
            budget: self.clone(),
            bytes: n,
            _permit: permit,
        })
    }
}

/// A received frame's share of a [`FrameBudget`] (rule 8); dropping it gives the bytes back.
#[derive(Debug)]
pub struct Reservation {
    budget: FrameBudget,
    bytes: usize,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Reservation {
    /// Bytes reserved.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget
            .inner
            .reserved
            .fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// Keeps a budget's `buffered` count equal to one buffer's capacity while it lives.
struct Buffered<'a> {
    budget: Option<&'a FrameBudget>,
    bytes: usize,
}

impl Buffered<'_> {
    fn set(&mut self, bytes: usize) {
        if let Some(b) = self.budget {
            if bytes >= self.bytes {
                let now = b
                    .inner
                    .buffered
                    .fetch_add(bytes - self.bytes, Ordering::SeqCst)
                    + (bytes - self.bytes);
                b.inner.peak_buffered.fetch_max(now, Ordering::SeqCst);
            } else {
                b.inner
                    .buffered
                    .fetch_sub(self.bytes - bytes, Ordering::SeqCst);
            }
        }
        self.bytes = bytes;
    }
}

impl Drop for Buffered<'_> {
    fn drop(&mut self) {
        self.set(0);
    }
}

fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut n);
    n
}

fn transcript(nc: &[u8; 32], ns: &[u8; 32]) -> [u8; 64] {
    let mut t = [0u8; 64];
    t[..32].copy_from_slice(nc);
    t[32..].copy_from_slice(ns);
    t
}

fn session_key(key: &Key, nc: &[u8; 32], ns: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(SESSION);
    h.update(key.as_bytes());
    h.update(nc);
    h.update(ns);
    *h.finalize().as_bytes()
}

fn array32(b: &[u8]) -> Result<[u8; 32], WireError> {
    b.try_into()
        .map_err(|_| WireError::Handshake(format!("expected 32 bytes, got {}", b.len())))
}

async fn with_deadline<T>(
    d: Duration,
    f: impl std::future::Future<Output = Result<T, WireError>>,
) -> Result<T, WireError> {
    tokio::time::timeout(d, f)
        .await
        .map_err(|_| WireError::Timeout(d))?
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// Runs the client side of the handshake (rule 2) on `stream`.
    pub async fn client(stream: S, key: &Key, max_frame: usize) -> Result<Self, WireError> {
        with_deadline(
            HANDSHAKE_TIMEOUT,
            Self::client_inner(stream, key, max_frame),
        )
        .await
    }

    async fn client_inner(mut stream: S, key: &Key, max_frame: usize) -> Result<Self, WireError> {
        let nc = nonce();
        write_raw(&mut stream, &[HELLO_MAGIC, &nc]).await?;
        let reply = read_raw(&mut stream, HANDSHAKE_MAX).await?;
        if reply.len() != 64 {
            return Err(WireError::Handshake(format!(
                "server reply of {} bytes, expected 64",
                reply.len()
            )));
        }
        let ns = array32(&reply[..32])?;
        let proof = array32(&reply[32..])?;
        let t = transcript(&nc, &ns);
        if !key.verify(SERVER_PROOF, &t, &proof) {
            return Err(WireError::WrongKey);
        }
        write_raw(&mut stream, &[&key.mac(CLIENT_PROOF, &t)]).await?;
        Ok(Self {
            stream,
            session: session_key(key, &nc, &ns),
            side: Side::Client,
            send_seq: 0,
            recv_seq: 0,
            max_frame,
        })
    }

    /// Runs the server side of the handshake (rule 2) on `stream`.
    pub async fn server(stream: S, key: &Key, max_frame: usize) -> Result<Self, WireError> {
        with_deadline(
            HANDSHAKE_TIMEOUT,
            Self::server_inner(stream, key, max_frame),
        )
        .await
    }

    async fn server_inner(mut stream: S, key: &Key, max_frame: usize) -> Result<Self, WireError> {
        let hello = read_raw(&mut stream, HANDSHAKE_MAX).await?;
        if hello.len() != 40 || &hello[..8] != HELLO_MAGIC {
            return Err(WireError::Handshake(
                "not a veriflow hello (wrong protocol or version)".into(),
            ));
        }
        let nc = array32(&hello[8..])?;
        let ns = nonce();
        let t = transcript(&nc, &ns);
        write_raw(&mut stream, &[&ns, &key.mac(SERVER_PROOF, &t)]).await?;
        let proof = read_raw(&mut stream, HANDSHAKE_MAX).await?;
        let proof = array32(&proof)?;
        if !key.verify(CLIENT_PROOF, &t, &proof) {
            return Err(WireError::WrongKey);
        }
        Ok(Self {
            stream,
            session: session_key(key, &nc, &ns),
            side: Side::Server,
            send_seq: 0,
            recv_seq: 0,
            max_frame,
        })
    }

    fn mac(&self, dir: u8, seq: u64, payload: &[u8]) -> [u8; 32] {
        frame_mac(&self.session, dir, seq, payload)
    }

    /// Sends one message (rule 3).
    pub async fn send<M: Serialize>(&mut self, msg: &M) -> Result<(), WireError> {
        let payload =
            postcard::to_stdvec(msg).map_err(|e| WireError::Malformed(format!("encode: {e}")))?;
        if payload.len() + AUTH_LEN > self.max_frame {
            return Err(WireError::FrameTooLarge {
                len: (payload.len() + AUTH_LEN) as u64,
                max: self.max_frame,
            });
        }
        self.send_payload(&payload).await
    }

    /// Sends an already encoded payload, authenticated (rule 3).
    async fn send_payload(&mut self, payload: &[u8]) -> Result<(), WireError> {
        let seq = self.send_seq;
        self.send_seq += 1;
        let mac = self.mac(self.side.send_dir(), seq, payload);
        write_raw(&mut self.stream, &[&seq.to_le_bytes(), &mac, payload]).await
    }

    /// Receives one message (rules 1, 3-6).
    pub async fn recv<M: DeserializeOwned>(&mut self) -> Result<M, WireError> {
        let frame = read_raw(&mut self.stream, self.max_frame).await?;
        let msg = open_frame(&self.session, self.side.recv_dir(), self.recv_seq, &frame)?;
        self.recv_seq += 1;
        Ok(msg)
    }
    /// A value both ends of this connection, and only they, derive from its session: a
    /// proof bound to it cannot be replayed on another connection (channel binding). It is
    /// not the session key, which it does not reveal.
    pub fn channel_binding(&self) -> [u8; 32] {
        blake3::derive_key("veriflow wire v1 channel binding", &self.session)
    }

    /// Receives one message within a [`FrameBudget`] (rules 1, 3-8): the frame's declared length
    /// is reserved before its body is read, the body must arrive within `body_deadline`, and the
    /// returned [`Reservation`] holds the bytes until the caller drops it.
    pub async fn recv_within<M: DeserializeOwned>(
        &mut self,
        budget: &FrameBudget,
        body_deadline: Duration,
    ) -> Result<(M, Reservation), WireError> {
        let (frame, reservation) =
            recv_frame_within(&mut self.stream, self.max_frame, budget, body_deadline).await?;
        let msg = open_frame(&self.session, self.side.recv_dir(), self.recv_seq, &frame)?;
        self.recv_seq += 1;
        Ok((msg, reservation))
    }

    /// Test helper: the bytes of the next frame carrying `payload` (length, sequence number,
    /// MAC and payload), counted as sent but not written, so a test can send it piecewise.
    #[doc(hidden)]
    pub fn seal_next(&mut self, payload: &[u8]) -> Vec<u8> {
        let seq = self.send_seq;
        self.send_seq += 1;
        let mac = self.mac(self.side.send_dir(), seq, payload);
        let len = u32::try_from(payload.len() + AUTH_LEN).unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(4 + AUTH_LEN + payload.len());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&mac);
        out.extend_from_slice(payload);
        out
    }

    /// The underlying stream (tests use it to inject bad frames).
    pub fn stream_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Test helper: sends `payload` as raw bytes with a chosen sequence number and a valid MAC.
    #[doc(hidden)]
    pub async fn send_raw_with_seq(&mut self, seq: u64, payload: &[u8]) -> Result<(), WireError> {
        let mac = self.mac(self.side.send_dir(), seq, payload);
        write_raw(&mut self.stream, &[&seq.to_le_bytes(), &mac, payload]).await
    }
}

/// The sending half of a split connection (rules 3-4 for one direction).
#[derive(Debug)]
pub struct WireWriter<W> {
    stream: W,
    session: [u8; 32],
    dir: u8,
    seq: u64,
    max_frame: usize,
}

/// The receiving half of a split connection (rules 1, 3-6 for one direction).
#[derive(Debug)]
pub struct WireReader<R> {
    stream: R,
    session: [u8; 32],
    dir: u8,
    seq: u64,
    max_frame: usize,
}

pub(crate) fn frame_mac(session: &[u8; 32], dir: u8, seq: u64, payload: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(session);
    h.update(&[dir]);
    h.update(&seq.to_le_bytes());
    h.update(payload);
    *h.finalize().as_bytes()
}

/// Checks a received frame's authentication and sequence number and decodes its payload
/// (rules 3-6).
pub(crate) fn open_frame<M: DeserializeOwned>(
    session: &[u8; 32],
    dir: u8,
    expected: u64,
    frame: &[u8],
) -> Result<M, WireError> {
    if frame.len() < AUTH_LEN {
        return Err(WireError::Malformed(format!(
            "frame of {} bytes is shorter than its authentication",
            frame.len()
        )));
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&frame[..8]);
    let seq = u64::from_le_bytes(seq);
    let tag = array32(&frame[8..AUTH_LEN])?;
    let payload = &frame[AUTH_LEN..];
    let want = frame_mac(session, dir, seq, payload);
    // Constant-time comparison through blake3::Hash's PartialEq.
    if blake3::Hash::from(want) != blake3::Hash::from(tag) {
        return Err(WireError::BadMac);
    }
    if seq != expected {
        return Err(WireError::Sequence { got: seq, expected });
    }
    postcard::from_bytes(payload).map_err(|e| WireError::Malformed(format!("decode: {e}")))
}

impl Connection<tokio::net::TcpStream> {
    /// Splits an authenticated TCP connection into halves that can be used from two tasks at
    /// once (a reader and a writer); each keeps its own sequence numbers.
    pub fn into_split(
        self,
    ) -> (
        WireReader<tokio::net::tcp::OwnedReadHalf>,
        WireWriter<tokio::net::tcp::OwnedWriteHalf>,
    ) {
        let (r, w) = self.stream.into_split();
        (
            WireReader {
                stream: r,
                session: self.session,
                dir: self.side.recv_dir(),
                seq: self.recv_seq,
                max_frame: self.max_frame,
            },
            WireWriter {
                stream: w,
                session: self.session,
                dir: self.side.send_dir(),
                seq: self.send_seq,
                max_frame: self.max_frame,
            },
        )
    }
}

impl<W: AsyncWrite + Unpin> WireWriter<W> {
    /// Sends one message, as one write of one frame.
    pub async fn send<M: Serialize>(&mut self, msg: &M) -> Result<(), WireError> {
        let payload =
            postcard::to_stdvec(msg).map_err(|e| WireError::Malformed(format!("encode: {e}")))?;
        if payload.len() + AUTH_LEN > self.max_frame {
            return Err(WireError::FrameTooLarge {
                len: (payload.len() + AUTH_LEN) as u64,
                max: self.max_frame,
            });
        }
        let seq = self.seq;
        self.seq += 1;
        let mac = frame_mac(&self.session, self.dir, seq, &payload);
        let len = (payload.len() + AUTH_LEN) as u32; // bounded by max_frame above
        let mut buf = Vec::with_capacity(4 + AUTH_LEN + payload.len());
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(&seq.to_le_bytes());
        buf.extend_from_slice(&mac);
        buf.extend_from_slice(&payload);
        self.stream.write_all(&buf).await?;
        self.stream.flush().await?;
        Ok(())
    }
}

impl<R: AsyncRead + Unpin> WireReader<R> {
    /// Receives one message (rules 1, 3-6).
    pub async fn recv<M: DeserializeOwned>(&mut self) -> Result<M, WireError> {
        let frame = read_raw(&mut self.stream, self.max_frame).await?;
        let msg = open_frame(&self.session, self.dir, self.seq, &frame)?;
        self.seq += 1;
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    enum Msg {
        Ping(u32),
        Data(#[serde(with = "serde_bytes")] Vec<u8>),
    }

    async fn pair(
        ka: &Key,
        kb: &Key,
    ) -> (
        Result<Connection<tokio::io::DuplexStream>, WireError>,
        Result<Connection<tokio::io::DuplexStream>, WireError>,
    ) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let ka = ka.clone();
        let kb = kb.clone();
        let server = tokio::spawn(async move { Connection::server(b, &kb, 1 << 20).await });
        let client = Connection::client(a, &ka, 1 << 20).await;
        let server = server.await.expect("server task");
        (client, server)
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn round_trip_and_sequence() {
        rt().block_on(async {
            let k = Key::from_bytes([7; 32]);
            let (c, s) = pair(&k, &k).await;
            let (mut c, mut s) = (c.unwrap(), s.unwrap());
            for i in 0..3 {
                c.send(&Msg::Ping(i)).await.unwrap();
                assert_eq!(s.recv::<Msg>().await.unwrap(), Msg::Ping(i));
                s.send(&Msg::Data(vec![i as u8; 1000])).await.unwrap();
                assert_eq!(
                    c.recv::<Msg>().await.unwrap(),
                    Msg::Data(vec![i as u8; 1000])
                );
            }
        });
    }

    #[test]
    fn wrong_key_is_refused_on_both_sides() {
        rt().block_on(async {
            let (c, s) = pair(&Key::from_bytes([1; 32]), &Key::from_bytes([2; 32])).await;
            assert!(matches!(c, Err(WireError::WrongKey)), "{c:?}");
            // The client gave up before proving anything: the server sees the close.
            assert!(s.is_err());
        });
    }

    #[test]
    fn replayed_and_forged_frames_are_refused() {
        rt().block_on(async {
            let k = Key::from_bytes([3; 32]);
            let (c, s) = pair(&k, &k).await;
            let (mut c, mut s) = (c.unwrap(), s.unwrap());
            let payload = postcard::to_stdvec(&Msg::Ping(1)).unwrap();
            c.send_raw_with_seq(0, &payload).await.unwrap();
            assert_eq!(s.recv::<Msg>().await.unwrap(), Msg::Ping(1));
            c.send_raw_with_seq(0, &payload).await.unwrap(); // replay
            assert!(matches!(
                s.recv::<Msg>().await,
                Err(WireError::Sequence {
                    got: 0,
                    expected: 1
                })
            ));

            let (c, s) = pair(&k, &k).await;
            let (mut c, mut s) = (c.unwrap(), s.unwrap());
            // A frame with a wrong MAC.
            write_raw(c.stream_mut(), &[&0u64.to_le_bytes(), &[0u8; 32], &payload])
                .await
                .unwrap();
            assert!(matches!(s.recv::<Msg>().await, Err(WireError::BadMac)));

            let (c, s) = pair(&k, &k).await;
            let (mut c, mut s) = (c.unwrap(), s.unwrap());
            // A valid MAC over a payload that is not a Msg.
            c.send_raw_with_seq(0, &[9, 9, 9]).await.unwrap();
            assert!(matches!(
                s.recv::<Msg>().await,
                Err(WireError::Malformed(_))
            ));
        });
    }

    #[test]
    fn huge_length_is_refused_before_allocation() {
        rt().block_on(async {
            let k = Key::from_bytes([4; 32]);
            let (c, s) = pair(&k, &k).await;
            let (mut c, mut s) = (c.unwrap(), s.unwrap());
            // Claims 4 GiB - 1 and sends nothing more: if the reader allocated first it would
            // try to reserve 4 GiB; it must refuse from the length alone.
            c.stream_mut()
                .write_all(&u32::MAX.to_le_bytes())
                .await
                .unwrap();
            let r = s.recv::<Msg>().await;
            assert!(
                matches!(
                    r,
                    Err(WireError::FrameTooLarge {
                        len: 4294967295,
                        ..
                    })
                ),
                "{r:?}"
            );
        });
    }

    #[test]
    fn garbage_hello_is_refused() {
        rt().block_on(async {
            let (mut a, b) = tokio::io::duplex(1024);
            let k = Key::from_bytes([5; 32]);
            let server = tokio::spawn(async move { Connection::server(b, &k, 1024).await });
            a.write_all(&[40, 0, 0, 0]).await.unwrap();
            a.write_all(&[0u8; 40]).await.unwrap();
            assert!(matches!(
                server.await.unwrap(),
                Err(WireError::Handshake(_))
            ));
        });
    }
}
