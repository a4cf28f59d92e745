//! Just enough of PostgreSQL's frontend/backend protocol (v3) to read a split's binary COPY.
//!
//! PostgreSQL sends a `COPY … TO STDOUT` one row per CopyData message. Through sqlx each row
//! is a message read from an 8 KiB socket buffer and handed over by an async stream, which
//! costs about as much executor CPU as decoding the row. A split reads over a connection of
//! its own instead: 256 KiB socket reads, and the CopyData frames are cut from the buffer and
//! parsed where they lie, with no await between rows of the same read.
//!
//! The connection is made from the source's sqlx options (host or socket, port, user,
//! database, the session settings) and authenticates with trust, password, MD5 or
//! SCRAM-SHA-256. Whatever it does not speak — TLS, Kerberos/GSS/SSPI, a password it was not
//! given — answers [`Connected::Unsupported`], and the split reads through sqlx as before.

use std::fmt;
use std::io;
use std::time::Duration;

use base64::Engine as _;
use base64::prelude::BASE64_STANDARD;
use bytes::{Buf, BufMut, BytesMut};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;

/// Bytes asked of the socket per read.
const READ_BYTES: usize = 256 * 1024;
/// PostgreSQL's own limit on a message (1 GiB).
const MAX_MESSAGE: usize = 1 << 30;
const PROTOCOL_3_0: i32 = 196_608;
const SSL_REQUEST: i32 = 80_877_103;
const CANCEL_REQUEST: i32 = 80_877_102;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where and as whom to connect: a PostgreSQL source's options, as sqlx would use them.
#[derive(Clone)]
pub struct Target {
    addr: Addr,
    user: String,
    database: Option<String>,
    password: Option<String>,
    ssl: PgSslMode,
    /// Startup parameters besides user and database.
    params: Vec<(String, String)>,
}

#[derive(Clone, Debug, PartialEq)]
enum Addr {
    Tcp(String, u16),
    Unix(String),
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("addr", &self.addr)
            .field("user", &self.user)
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// The target of `options`; `password` is the one configured (sqlx does not hand it out).
    pub fn new(options: &PgConnectOptions, password: Option<String>) -> Self {
        let port = options.get_port();
        let host = options.get_host();
        let addr = match options.get_socket() {
            Some(dir) => Addr::Unix(format!("{}/.s.PGSQL.{port}", dir.display())),
            None if host.starts_with('/') => Addr::Unix(format!("{host}/.s.PGSQL.{port}")),
            None => Addr::Tcp(host.to_string(), port),
        };
        // The session sqlx would open: its fixed settings, then the source's own.
        let mut params: Vec<(String, String)> = [
            ("DateStyle", "ISO, MDY"),
            ("client_encoding", "UTF8"),
            ("TimeZone", "UTC"),
            ("extra_float_digits", "2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(name) = options.get_application_name() {
            params.push(("application_name".into(), name.into()));
        }
        if let Some(o) = options.get_options() {
            params.push(("options".into(), o.into()));
        }
        Self {
            addr,
            user: options.get_username().to_string(),
            database: options.get_database().map(str::to_string),
            password,
            ssl: options.get_ssl_mode(),
            params,
        }
    }
}

/// An error of this connection: the server's words, or what went wrong on the way.
#[derive(Debug)]
pub enum WireError {
    Io(io::Error),
    /// An ErrorResponse.
    Server(String),
    Protocol(String),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "connection error: {e}"),
            Self::Server(m) => write!(f, "error returned from database: {m}"),
            Self::Protocol(m) => write!(f, "protocol error: {m}"),
        }
    }
}

impl std::error::Error for WireError {}

impl From<io::Error> for WireError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

type Result<T, E = WireError> = std::result::Result<T, E>;

fn protocol(m: impl Into<String>) -> WireError {
    WireError::Protocol(m.into())
}

enum Socket {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

impl Socket {
    async fn connect(addr: &Addr) -> io::Result<Self> {
        let connect = async {
            match addr {
                Addr::Tcp(host, port) => {
                    let s = TcpStream::connect((host.as_str(), *port)).await?;
                    s.set_nodelay(true)?;
                    Ok(Self::Tcp(s))
                }
                #[cfg(unix)]
                Addr::Unix(path) => Ok(Self::Unix(UnixStream::connect(path).await?)),
                #[cfg(not(unix))]
                Addr::Unix(_) => Err(io::Error::other("unix sockets need a unix system")),
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connecting timed out"))?
    }

    async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Self::Tcp(s) => s.write_all(bytes).await,
            #[cfg(unix)]
            Self::Unix(s) => s.write_all(bytes).await,
        }
    }

    async fn read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read_buf(buf).await,
            #[cfg(unix)]
            Self::Unix(s) => s.read_buf(buf).await,
        }
    }

    async fn read_u8(&mut self) -> io::Result<u8> {
        match self {
            Self::Tcp(s) => s.read_u8().await,
            #[cfg(unix)]
            Self::Unix(s) => s.read_u8().await,
        }
    }
}

impl Drop for CopyConn {
    /// Says goodbye (Terminate) if the socket takes it now, so that the server does not log
    /// a lost connection.
    fn drop(&mut self) {
        let bye = [b'X', 0, 0, 0, 4];
        let _ = match &self.socket {
            Socket::Tcp(s) => s.try_write(&bye),
            #[cfg(unix)]
            Socket::Unix(s) => s.try_write(&bye),
        };
    }
}

/// The outcome of [`CopyConn::connect`].
pub enum Connected {
    Ready(CopyConn),
    /// The connection needs what this client does not speak; read through sqlx instead.
    Unsupported(&'static str),
}

/// A message of the COPY stream, as [`CopyConn::next_frame`] finds it in the buffer.
pub enum Frame {
    /// A CopyData message: its payload is [`CopyConn::data`] until the next call.
    Data,
    /// The buffer holds no whole message: [`CopyConn::read_more`].
    NeedMore,
    /// The COPY ended and the server is ready for the next query.
    Done,
}

/// A session that runs one COPY … TO STDOUT and streams its data.
pub struct CopyConn {
    socket: Socket,
    inbox: Inbox,
    addr: Addr,
    /// BackendKeyData: what a cancel request names.
    key: Option<(i32, i32)>,
}

impl CopyConn {
    /// Connects and authenticates.
    pub async fn connect(target: &Target) -> Result<Connected> {
        let mut socket = Socket::connect(&target.addr).await?;
        if !matches!(target.ssl, PgSslMode::Disable) {
            // Whether the server would encrypt: sqlx's session would, and this one cannot.
            let mut req = BytesMut::with_capacity(8);
            req.put_i32(8);
            req.put_i32(SSL_REQUEST);
            socket.write_all(&req).await?;
            match (socket.read_u8().await?, target.ssl) {
                (b'N', PgSslMode::Allow | PgSslMode::Prefer) => {}
                (b'N' | b'S', _) => return Ok(Connected::Unsupported("TLS")),
                // An ErrorResponse: a server older than SSLRequest; sqlx says what it is.
                _ => return Ok(Connected::Unsupported("the server refused SSLRequest")),
            }
        }
        let mut conn = Self {
            socket,
            inbox: Inbox::new(),
            addr: target.addr.clone(),
            key: None,
        };
        conn.send(&startup(target)).await?;
        let mut scram: Option<Scram> = None;
        loop {
            let (tag, mut body) = conn.message().await?;
            match tag {
                b'R' => {
                    let code = get_i32(&mut body)?;
                    let reply = match code {
                        0 => None,
                        3 => match &target.password {
                            Some(p) => Some(message(b'p', &cstr(p))),
                            None => return Ok(Connected::Unsupported("no password configured")),
                        },
                        5 => match &target.password {
                            Some(p) => {
                                let salt = body.get(..4).ok_or_else(|| protocol("short salt"))?;
                                Some(message(b'p', &cstr(&md5_password(&target.user, p, salt))))
                            }
                            None => return Ok(Connected::Unsupported("no password configured")),
                        },
                        10 => {
                            let mechanisms = body[..]
                                .split(|&b| b == 0)
                                .filter(|m| !m.is_empty())
                                .collect::<Vec<_>>();
                            if !mechanisms.contains(&&b"SCRAM-SHA-256"[..]) {
                                return Ok(Connected::Unsupported("SASL without SCRAM-SHA-256"));
                            }
                            let Some(p) = &target.password else {
                                return Ok(Connected::Unsupported("no password configured"));
                            };
                            let s = Scram::new("", p, &random_nonce());
                            let first = s.client_first();
                            let mut m = BytesMut::new();
                            m.put_slice(b"SCRAM-SHA-256\0");
                            m.put_i32(first.len() as i32);
                            m.put_slice(first.as_bytes());
                            scram = Some(s);
                            Some(message(b'p', &m))
                        }
                        11 => {
                            let s = scram.as_mut().ok_or_else(|| protocol("SASL out of turn"))?;
                            let server_first = std::str::from_utf8(&body)
                                .map_err(|_| protocol("SASL message is not UTF-8"))?;
                            Some(message(b'p', s.client_final(server_first)?.as_bytes()))
                        }
                        12 => {
                            let s = scram.as_ref().ok_or_else(|| protocol("SASL out of turn"))?;
                            let server_final = std::str::from_utf8(&body)
                                .map_err(|_| protocol("SASL message is not UTF-8"))?;
                            s.verify_server(server_final)?;
                            None
                        }
                        _ => return Ok(Connected::Unsupported("authentication method")),
                    };
                    if let Some(reply) = reply {
                        conn.send(&reply).await?;
                    }
                }
                b'K' => {
                    let pid = get_i32(&mut body)?;
                    let secret = get_i32(&mut body)?;
                    conn.key = Some((pid, secret));
                }
                b'E' => return Err(WireError::Server(error_text(&body))),
                b'Z' => {
                    conn.inbox.idle = true;
                    return Ok(Connected::Ready(conn));
                }
                b'S' | b'N' | b'v' => {} // parameter status, notice, protocol negotiation
                other => {
                    return Err(protocol(format!(
                        "unexpected message '{}' while connecting",
                        other as char
                    )));
                }
            }
        }
    }

    /// Whether the session may run another query: its last COPY ended, outside any
    /// transaction, with nothing unread.
    pub fn reusable(&self) -> bool {
        self.inbox.idle && self.inbox.buf.len() == self.inbox.current
    }

    /// Sends `sql` (statements with one `COPY … TO STDOUT`) and waits for the COPY to
    /// start.
    pub async fn start_copy(&mut self, sql: &str) -> Result<()> {
        self.inbox.idle = false;
        self.send(&message(b'Q', &cstr(sql))).await?;
        let mut failed = None;
        loop {
            let (tag, body) = self.message().await?;
            match tag {
                b'H' if failed.is_none() => return Ok(()),
                b'E' => failed = Some(WireError::Server(error_text(&body))),
                b'Z' => {
                    return Err(failed.unwrap_or_else(|| protocol("the statement did not COPY")));
                }
                b'C' | b'S' | b'N' | b'A' | b'I' => {}
                other => {
                    return Err(protocol(format!(
                        "unexpected message '{}' before COPY",
                        other as char
                    )));
                }
            }
        }
    }

    /// The next message of the COPY stream found in the buffer, without waiting. The
    /// previous CopyData message is dropped from the buffer.
    pub fn next_frame(&mut self) -> Result<Frame> {
        self.inbox.next_frame()
    }

    /// The payload of the CopyData message [`CopyConn::next_frame`] found last: rows to decode
    /// where the socket read put them.
    pub fn data(&self) -> &[u8] {
        self.inbox.data()
    }

    /// Reads what the socket has (at least one byte) into the buffer.
    pub async fn read_more(&mut self) -> Result<()> {
        let buf = self.inbox.space();
        if self.socket.read_buf(buf).await? == 0 {
            return Err(WireError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )));
        }
        Ok(())
    }

    /// Asks the server to cancel what this session runs (a CancelRequest over a connection
    /// of its own), then closes this one.
    pub async fn cancel(self) {
        let (key, addr) = (self.key, self.addr.clone());
        drop(self);
        let Some((pid, secret)) = key else {
            return;
        };
        if let Ok(mut s) = Socket::connect(&addr).await {
            let mut req = BytesMut::with_capacity(16);
            req.put_i32(16);
            req.put_i32(CANCEL_REQUEST);
            req.put_i32(pid);
            req.put_i32(secret);
            let _ = s.write_all(&req).await;
        }
    }

    /// The next whole message (tag, body), reading as needed.
    async fn message(&mut self) -> Result<(u8, BytesMut)> {
        loop {
            if let Some(message) = self.inbox.take()? {
                return Ok(message);
            }
            self.read_more().await?;
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        Ok(self.socket.write_all(bytes).await?)
    }
}

/// What the server sent and was not handled yet: whole messages are taken from its start.
struct Inbox {
    buf: BytesMut,
    /// The length of the CopyData message at the buffer's start, once [`Inbox::next_frame`]
    /// found it (0: none).
    current: usize,
    /// The COPY's CopyDone arrived; CommandComplete and ReadyForQuery follow.
    copy_done: bool,
    /// The last ReadyForQuery said the session is outside a transaction.
    idle: bool,
}

impl Inbox {
    fn new() -> Self {
        Self {
            buf: BytesMut::with_capacity(READ_BYTES),
            current: 0,
            copy_done: false,
            idle: false,
        }
    }

    /// The next message of the COPY stream found in the buffer, without waiting. The
    /// previous CopyData message is dropped from the buffer.
    pub fn next_frame(&mut self) -> Result<Frame> {
        self.buf.advance(std::mem::take(&mut self.current));
        loop {
            let Some(len) = self.whole_message()? else {
                return Ok(Frame::NeedMore);
            };
            let tag = self.buf[0];
            if tag == b'd' && !self.copy_done {
                self.current = len;
                return Ok(Frame::Data);
            }
            let body = self.buf.split_to(len).split_off(5);
            match tag {
                b'c' => self.copy_done = true,
                b'C' | b'S' | b'N' | b'A' => {}
                b'Z' if self.copy_done => {
                    // Ready for the next query: outside any transaction ('I') or not.
                    self.idle = body.first() == Some(&b'I');
                    self.copy_done = false;
                    return Ok(Frame::Done);
                }
                b'E' => return Err(WireError::Server(error_text(&body))),
                other => {
                    return Err(protocol(format!(
                        "unexpected message '{}' during COPY",
                        other as char
                    )));
                }
            }
        }
    }

    /// The payload of the CopyData message [`Inbox::next_frame`] found last.
    pub fn data(&self) -> &[u8] {
        &self.buf[5.min(self.current)..self.current]
    }

    /// The buffer, with room for a socket read at its end.
    fn space(&mut self) -> &mut BytesMut {
        self.buf.advance(std::mem::take(&mut self.current));
        if self.buf.capacity() - self.buf.len() < READ_BYTES / 4 {
            self.buf.reserve(READ_BYTES);
        }
        &mut self.buf
    }

    /// The whole message (tag, body) at the buffer's start, if it is all there.
    fn take(&mut self) -> Result<Option<(u8, BytesMut)>> {
        self.buf.advance(std::mem::take(&mut self.current));
        Ok(match self.whole_message()? {
            Some(len) => {
                let tag = self.buf[0];
                Some((tag, self.buf.split_to(len).split_off(5)))
            }
            None => None,
        })
    }

    /// The length of the whole message at the buffer's start, once it is all there.
    fn whole_message(&mut self) -> Result<Option<usize>> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        if len < 4 || len as usize > MAX_MESSAGE {
            return Err(protocol(format!("message of length {len}")));
        }
        let whole = 1 + len as usize;
        if self.buf.len() < whole {
            self.buf.reserve(whole - self.buf.len());
            return Ok(None);
        }
        Ok(Some(whole))
    }
}

fn get_i32(body: &mut BytesMut) -> Result<i32> {
    if body.len() < 4 {
        return Err(protocol("short message"));
    }
    Ok(body.get_i32())
}

/// A frontend message: tag, length, body.
fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(5 + body.len());
    m.push(tag);
    m.extend_from_slice(&(4 + body.len() as i32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// `s` NUL-terminated.
fn cstr(s: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(s.len() + 1);
    v.extend_from_slice(s.as_bytes());
    v.push(0);
    v
}

fn startup(target: &Target) -> Vec<u8> {
    // Length (filled in last), protocol version, NUL-terminated names and values, NUL.
    let mut m = vec![0; 4];
    m.extend_from_slice(&PROTOCOL_3_0.to_be_bytes());
    let mut put = |k: &str, v: &str| {
        m.extend_from_slice(&cstr(k));
        m.extend_from_slice(&cstr(v));
    };
    put("user", &target.user);
    if let Some(db) = &target.database {
        put("database", db);
    }
    for (k, v) in &target.params {
        put(k, v);
    }
    m.push(0);
    let len = (m.len() as i32).to_be_bytes();
    m[..4].copy_from_slice(&len);
    m
}

/// An ErrorResponse's fields as one line: message, detail, hint, SQLSTATE.
fn error_text(body: &[u8]) -> String {
    let mut message = String::new();
    let (mut detail, mut hint, mut code) = (None, None, None);
    for field in body.split(|&b| b == 0).filter(|f| !f.is_empty()) {
        let value = String::from_utf8_lossy(&field[1..]).into_owned();
        match field[0] {
            b'M' => message = value,
            b'D' => detail = Some(value),
            b'H' => hint = Some(value),
            b'C' => code = Some(value),
            _ => {}
        }
    }
    for (label, v) in [("DETAIL", detail), ("HINT", hint)] {
        if let Some(v) = v {
            message.push_str(&format!(" ({label}: {v})"));
        }
    }
    if let Some(code) = code {
        message.push_str(&format!(" [SQLSTATE {code}]"));
    }
    message
}

/// The answer to AuthenticationMD5Password: "md5" + md5(md5(password + user) + salt).
fn md5_password(user: &str, password: &str, salt: &[u8]) -> String {
    let inner = format!("{:x}", md5::Md5::digest(format!("{password}{user}")));
    let mut outer = md5::Md5::new();
    outer.update(inner.as_bytes());
    outer.update(salt);
    format!("md5{:x}", outer.finalize())
}

/// A client nonce: 24 random bytes, base64 (printable, no comma).
fn random_nonce() -> String {
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    BASE64_STANDARD.encode(&bytes[..24])
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], data: &[u8]) -> Result<[u8; 32]> {
    let mut mac = HmacSha256::new_from_slice(key).map_err(|e| protocol(format!("HMAC: {e}")))?;
    mac.update(data);
    Ok(mac.finalize().into_bytes().into())
}

/// SCRAM-SHA-256 without channel binding (RFC 5802, RFC 7677).
struct Scram {
    /// The name in the first message: empty for PostgreSQL, which takes the startup's.
    user: String,
    password: String,
    client_nonce: String,
    /// AuthMessage and SaltedPassword, once the server's first message is in.
    state: Option<(String, [u8; 32])>,
}

impl Scram {
    fn new(user: &str, password: &str, client_nonce: &str) -> Self {
        // PostgreSQL stores the SASLprep of a password when it has one, the bytes otherwise.
        let password = stringprep::saslprep(password)
            .map(|p| p.into_owned())
            .unwrap_or_else(|_| password.to_string());
        Self {
            user: user.to_string(),
            password,
            client_nonce: client_nonce.to_string(),
            state: None,
        }
    }

    fn first_bare(&self) -> String {
        format!("n={},r={}", self.user, self.client_nonce)
    }

    fn client_first(&self) -> String {
        format!("n,,{}", self.first_bare())
    }

    fn client_final(&mut self, server_first: &str) -> Result<String> {
        let attr = |name: &str| {
            server_first
                .split(',')
                .find_map(|kv| kv.strip_prefix(name))
                .ok_or_else(|| protocol(format!("SCRAM server message without {name}")))
        };
        let nonce = attr("r=")?;
        if !nonce.starts_with(&self.client_nonce) {
            return Err(protocol("SCRAM server nonce does not extend the client's"));
        }
        let salt = BASE64_STANDARD
            .decode(attr("s=")?)
            .map_err(|_| protocol("SCRAM salt is not base64"))?;
        let iterations: u32 = attr("i=")?
            .parse()
            .map_err(|_| protocol("SCRAM iteration count is not a number"))?;
        if iterations == 0 {
            return Err(protocol("SCRAM iteration count is 0"));
        }
        // Hi(password, salt, i): PBKDF2 with HMAC-SHA-256, one block.
        let mut block = salt.clone();
        block.extend_from_slice(&1u32.to_be_bytes());
        let mut u = hmac(self.password.as_bytes(), &block)?;
        let mut salted = u;
        for _ in 1..iterations {
            u = hmac(self.password.as_bytes(), &u)?;
            salted.iter_mut().zip(u).for_each(|(s, x)| *s ^= x);
        }
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.first_bare());
        let client_key = hmac(&salted, b"Client Key")?;
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        let signature = hmac(&stored_key, auth_message.as_bytes())?;
        let proof: Vec<u8> = client_key
            .iter()
            .zip(signature)
            .map(|(k, s)| k ^ s)
            .collect();
        self.state = Some((auth_message, salted));
        Ok(format!(
            "{without_proof},p={}",
            BASE64_STANDARD.encode(proof)
        ))
    }

    /// Checks the server's signature: a server that does not know the password cannot make it.
    fn verify_server(&self, server_final: &str) -> Result<()> {
        let (auth_message, salted) = self
            .state
            .as_ref()
            .ok_or_else(|| protocol("SCRAM final message out of turn"))?;
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(WireError::Server(format!(
                "SCRAM authentication failed: {e}"
            )));
        }
        let verifier = server_final
            .split(',')
            .find_map(|kv| kv.strip_prefix("v="))
            .ok_or_else(|| protocol("SCRAM final message without a verifier"))?;
        let server_key = hmac(salted, b"Server Key")?;
        let expected = hmac(&server_key, auth_message.as_bytes())?;
        if BASE64_STANDARD.decode(verifier).ok().as_deref() != Some(&expected[..]) {
            return Err(protocol(
                "the server's SCRAM signature is wrong (it does not know the password)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 section 3's exchange, message for message.
    #[test]
    fn scram_sha_256_follows_rfc_7677() {
        let mut s = Scram::new("user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(s.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        assert_eq!(
            s.client_final(server_first).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert!(
            s.verify_server("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
                .is_ok()
        );
        // A server that does not know the password cannot sign; a failure is the server's.
        assert!(s.verify_server("v=AAAA").is_err());
        let e = s.verify_server("e=invalid-proof").unwrap_err();
        assert!(e.to_string().contains("invalid-proof"), "{e}");
        // PostgreSQL's first message leaves the name out.
        assert_eq!(Scram::new("", "p", "n").client_first(), "n,,n=,r=n");
        // A server nonce that does not extend ours is refused.
        let mut t = Scram::new("", "pencil", "abc");
        assert!(t.client_final("r=xyz,s=AAAA,i=1").is_err());
    }

    #[test]
    fn md5_password_matches_postgres() {
        // md5(md5("secret" || "basin") || salt), computed with Python's hashlib.
        assert_eq!(
            md5_password("basin", "secret", &[1, 2, 3, 4]),
            "md5b428c6a8176d08deab04567abfe91d9b"
        );
    }

    /// Backend messages as PostgreSQL sends them: tag, length, body.
    fn backend(messages: &[(u8, &[u8])]) -> Vec<u8> {
        messages.iter().flat_map(|(t, b)| message(*t, b)).collect()
    }

    /// Feeds `stream` to an inbox in pieces of `size` bytes; the CopyData payloads and
    /// whether the COPY ended, or the error.
    fn read_copy(stream: &[u8], size: usize) -> Result<(Vec<Vec<u8>>, bool)> {
        let mut inbox = Inbox::new();
        let mut pieces = stream.chunks(size);
        let mut data = vec![];
        loop {
            match inbox.next_frame()? {
                Frame::Data => data.push(inbox.data().to_vec()),
                Frame::Done => return Ok((data, true)),
                Frame::NeedMore => match pieces.next() {
                    Some(p) => inbox.space().extend_from_slice(p),
                    None => return Ok((data, false)),
                },
            }
        }
    }

    #[test]
    fn copy_frames_are_cut_from_reads_of_any_size() {
        let stream = backend(&[
            (b'd', b"row one"),
            (b'N', b"SNOTICE\0Mhello\0\0"),
            (b'd', b""),
            (b'd', &[7u8; 1000]),
            (b'c', b""),
            (b'C', b"COPY 3\0"),
            (b'Z', b"I"),
        ]);
        for size in [1, 2, 5, 13, 999, stream.len()] {
            let (data, done) = read_copy(&stream, size).unwrap();
            assert!(done, "pieces of {size}");
            assert_eq!(data, [b"row one".to_vec(), vec![], vec![7u8; 1000]]);
        }
        // An error mid-stream is the server's message; a cut stream is not done.
        let failed = backend(&[
            (b'd', b"row"),
            (
                b'E',
                b"SERROR\0C57014\0Mcanceling statement due to user request\0\0",
            ),
        ]);
        let e = read_copy(&failed, 3).unwrap_err().to_string();
        assert!(
            e.contains("canceling statement") && e.contains("57014"),
            "{e}"
        );
        assert!(!read_copy(&stream[..stream.len() - 1], 4).unwrap().1);
        // A length no message may have.
        let mut bad = vec![b'd'];
        bad.extend_from_slice(&(-5i32).to_be_bytes());
        assert!(read_copy(&bad, 5).is_err());
    }

    #[test]
    fn error_responses_read_as_one_line() {
        let body = b"SERROR\0C42P01\0Mrelation \"x\" does not exist\0HCheck the name.\0\0";
        assert_eq!(
            error_text(body),
            "relation \"x\" does not exist (HINT: Check the name.) [SQLSTATE 42P01]"
        );
    }

    #[test]
    fn startup_names_user_database_and_settings() {
        let options = PgConnectOptions::new_without_pgpass()
            .host("127.0.0.1")
            .port(5433)
            .username("u")
            .database("d")
            .options([("statement_timeout", "5s")]);
        let target = Target::new(&options, None);
        assert_eq!(target.addr, Addr::Tcp("127.0.0.1".into(), 5433));
        let m = startup(&target);
        assert_eq!(
            i32::from_be_bytes(m[..4].try_into().unwrap()) as usize,
            m.len()
        );
        let text = String::from_utf8_lossy(&m[8..]).replace('\0', "|");
        assert!(text.starts_with("user|u|database|d|"), "{text}");
        assert!(text.contains("options|-c statement_timeout=5s|"), "{text}");
        assert!(text.ends_with("||"), "{text}");
        let socket = PgConnectOptions::new_without_pgpass()
            .host("/run/pg")
            .port(5432);
        assert_eq!(
            Target::new(&socket, None).addr,
            Addr::Unix("/run/pg/.s.PGSQL.5432".into())
        );
    }
}
