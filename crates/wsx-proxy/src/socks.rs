//! The server side of a SOCKS5 handshake (RFC 1928), CONNECT only, with optional
//! username/password authentication (RFC 1929).
//!
//! ```text
//! client: 05 n methods…              server: 05 method (00 none, 02 user/pass, ff none acceptable)
//! [client: 01 ulen user plen pass    server: 01 status (00 ok)]
//! client: 05 cmd 00 atyp addr port   server: 05 rep 00 atyp bound-addr bound-port
//! ```
//!
//! The destination may be an IPv4 or IPv6 address or a name (atyp 3); names are not resolved
//! here but carried to the far gateway, which resolves them. Anything else gets the reply
//! code the RFC gives it: a command other than CONNECT 07, an unknown address type 08, bad
//! credentials status 01; a wrong version byte ends the connection without an answer.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use wsx_tunnel::Target;

const VERSION: u8 = 5;
const AUTH_VERSION: u8 = 1;
const NO_AUTH: u8 = 0x00;
const USER_PASS: u8 = 0x02;
const NO_ACCEPTABLE: u8 = 0xff;
const CONNECT: u8 = 1;
const ATYP_V4: u8 = 1;
const ATYP_NAME: u8 = 3;
const ATYP_V6: u8 = 4;

/// Reply codes (RFC 1928 §6).
pub(crate) mod reply {
    pub(crate) const SUCCEEDED: u8 = 0;
    pub(crate) const GENERAL_FAILURE: u8 = 1;
    pub(crate) const NETWORK_UNREACHABLE: u8 = 3;
    pub(crate) const HOST_UNREACHABLE: u8 = 4;
    pub(crate) const REFUSED: u8 = 5;
    pub(crate) const TTL_EXPIRED: u8 = 6;
    pub(crate) const COMMAND_NOT_SUPPORTED: u8 = 7;
    pub(crate) const ADDRESS_NOT_SUPPORTED: u8 = 8;
}

/// A username and password a SOCKS listener accepts.
#[derive(Clone, PartialEq, Eq)]
pub struct SocksUser {
    pub name: String,
    pub password: String,
}

impl std::fmt::Debug for SocksUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SocksUser({:?}, <secret>)", self.name)
    }
}

/// Why a handshake ended without a destination (any answer the RFC asks for was sent).
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("reading or writing: {0}")]
    Io(#[from] io::Error),
    #[error("not SOCKS version 5 (first byte {0:#04x})")]
    Version(u8),
    #[error("no acceptable authentication method offered")]
    NoAcceptableMethod,
    #[error("wrong username or password")]
    AuthFailed,
    #[error("command {0} is not supported (only CONNECT)")]
    Command(u8),
    #[error("address type {0} is not supported")]
    AddressType(u8),
    #[error("the destination name is not valid")]
    Name,
}

/// Runs the server's side up to the request and returns the destination. The caller
/// answers the request with [`send_reply`] once it knows the outcome.
pub(crate) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    users: &[SocksUser],
) -> Result<Target, HandshakeError> {
    let [version, count] = read_array(s).await?;
    if version != VERSION {
        return Err(HandshakeError::Version(version));
    }
    let mut methods = vec![0u8; usize::from(count)];
    s.read_exact(&mut methods).await?;
    let wanted = if users.is_empty() { NO_AUTH } else { USER_PASS };
    if !methods.contains(&wanted) {
        s.write_all(&[VERSION, NO_ACCEPTABLE]).await?;
        return Err(HandshakeError::NoAcceptableMethod);
    }
    s.write_all(&[VERSION, wanted]).await?;
    if wanted == USER_PASS {
        authenticate(s, users).await?;
    }
    let [version, command, _reserved, kind] = read_array(s).await?;
    if version != VERSION {
        return Err(HandshakeError::Version(version));
    }
    let target = match kind {
        ATYP_V4 => {
            let ip: [u8; 4] = read_array(s).await?;
            Target::Addr(SocketAddr::new(
                Ipv4Addr::from(ip).into(),
                read_port(s).await?,
            ))
        }
        ATYP_V6 => {
            let ip: [u8; 16] = read_array(s).await?;
            Target::Addr(SocketAddr::new(
                Ipv6Addr::from(ip).into(),
                read_port(s).await?,
            ))
        }
        ATYP_NAME => {
            let [len] = read_array(s).await?;
            let mut name = vec![0u8; usize::from(len)];
            s.read_exact(&mut name).await?;
            let port = read_port(s).await?;
            match String::from_utf8(name) {
                Ok(host) if !host.is_empty() => match host.parse::<IpAddr>() {
                    // Some clients send literal addresses as names.
                    Ok(ip) => Target::Addr(SocketAddr::new(ip, port)),
                    Err(_) => Target::Name { host, port },
                },
                _ => {
                    send_reply(s, reply::GENERAL_FAILURE, None).await?;
                    return Err(HandshakeError::Name);
                }
            }
        }
        other => {
            // The address's length is unknown: answer and stop reading.
            send_reply(s, reply::ADDRESS_NOT_SUPPORTED, None).await?;
            return Err(HandshakeError::AddressType(other));
        }
    };
    if command != CONNECT {
        send_reply(s, reply::COMMAND_NOT_SUPPORTED, None).await?;
        return Err(HandshakeError::Command(command));
    }
    Ok(target)
}

/// RFC 1929: the client's username and password against the configured users, each
/// compared in constant time.
async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    users: &[SocksUser],
) -> Result<(), HandshakeError> {
    let [version, len] = read_array(s).await?;
    if version != AUTH_VERSION {
        return Err(HandshakeError::Version(version));
    }
    let mut name = vec![0u8; usize::from(len)];
    s.read_exact(&mut name).await?;
    let [len] = read_array(s).await?;
    let mut password = vec![0u8; usize::from(len)];
    s.read_exact(&mut password).await?;
    let mut ok = subtle::Choice::from(0);
    for user in users {
        ok |= user.name.as_bytes().ct_eq(&name) & user.password.as_bytes().ct_eq(&password);
    }
    if bool::from(ok) {
        s.write_all(&[AUTH_VERSION, 0]).await?;
        Ok(())
    } else {
        s.write_all(&[AUTH_VERSION, 1]).await?;
        Err(HandshakeError::AuthFailed)
    }
}

/// Answers the request: `code`, and the address the gateway connected from (all zeros when
/// none, as the RFC allows).
pub(crate) async fn send_reply<S: AsyncWrite + Unpin>(
    s: &mut S,
    code: u8,
    bound: Option<SocketAddr>,
) -> io::Result<()> {
    let bound = bound.unwrap_or_else(|| SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0));
    let mut out = Vec::with_capacity(22);
    out.extend_from_slice(&[VERSION, code, 0]);
    match bound.ip() {
        IpAddr::V4(ip) => {
            out.push(ATYP_V4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(ATYP_V6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&bound.port().to_be_bytes());
    s.write_all(&out).await
}

/// The reply code for a failed connect.
pub(crate) fn connect_error_reply(e: &io::Error) -> u8 {
    use crate::relay::code;
    match crate::relay::connect_error_code(e) {
        code::REFUSED => reply::REFUSED,
        code::UNREACHABLE => reply::HOST_UNREACHABLE,
        code::TIMED_OUT => reply::TTL_EXPIRED,
        _ if e.kind() == io::ErrorKind::NotFound => reply::HOST_UNREACHABLE,
        _ => reply::GENERAL_FAILURE,
    }
}

async fn read_array<const N: usize, S: AsyncRead + Unpin>(s: &mut S) -> io::Result<[u8; N]> {
    let mut out = [0u8; N];
    s.read_exact(&mut out).await?;
    Ok(out)
}

async fn read_port<S: AsyncRead + Unpin>(s: &mut S) -> io::Result<u16> {
    Ok(u16::from_be_bytes(read_array(s).await?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs a handshake over `input`; returns the result and what the server wrote.
    fn run(input: &[u8], users: &[SocksUser]) -> (Result<Target, HandshakeError>, Vec<u8>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        runtime.block_on(async {
            let mut written = Vec::new();
            let result = handshake(&mut tokio::io::join(input, &mut written), users).await;
            (result, written)
        })
    }

    fn user() -> Vec<SocksUser> {
        vec![SocksUser {
            name: "alice".into(),
            password: "s3cret".into(),
        }]
    }

    #[test]
    fn connect_to_a_name_without_auth() {
        let mut input = vec![5, 2, 0, 2, 5, 1, 0, 3, 11];
        input.extend_from_slice(b"example.net");
        input.extend_from_slice(&443u16.to_be_bytes());
        let (result, written) = run(&input, &[]);
        assert_eq!(
            result.unwrap_or_else(|e| panic!("{e}")),
            Target::Name {
                host: "example.net".into(),
                port: 443
            }
        );
        assert_eq!(written, [5, 0]);
    }

    #[test]
    fn connect_to_addresses_of_both_families() {
        let (r, _) = run(&[5, 1, 0, 5, 1, 0, 1, 10, 0, 0, 1, 0, 80], &[]);
        assert_eq!(
            r.unwrap_or_else(|e| panic!("{e}")),
            Target::Addr("10.0.0.1:80".parse().unwrap_or_else(|e| panic!("{e}")))
        );
        let mut input = vec![5, 1, 0, 5, 1, 0, 4];
        input.extend_from_slice(
            &"fd00::1"
                .parse::<Ipv6Addr>()
                .unwrap_or_else(|e| panic!("{e}"))
                .octets(),
        );
        input.extend_from_slice(&[0, 22]);
        let (r, _) = run(&input, &[]);
        assert_eq!(
            r.unwrap_or_else(|e| panic!("{e}")),
            Target::Addr("[fd00::1]:22".parse().unwrap_or_else(|e| panic!("{e}")))
        );
    }

    #[test]
    fn username_and_password_are_checked() {
        let request = [5, 1, 0, 1, 10, 0, 0, 1, 0, 80];
        let login = |name: &[u8], password: &[u8]| {
            let mut input = vec![5, 1, 2, 1, name.len() as u8];
            input.extend_from_slice(name);
            input.push(password.len() as u8);
            input.extend_from_slice(password);
            input.extend_from_slice(&request);
            input
        };
        let (r, written) = run(&login(b"alice", b"s3cret"), &user());
        assert!(r.is_ok(), "{r:?}");
        assert_eq!(written, [5, 2, 1, 0]);
        let (r, written) = run(&login(b"alice", b"guess"), &user());
        assert!(matches!(r, Err(HandshakeError::AuthFailed)), "{r:?}");
        assert_eq!(written, [5, 2, 1, 1]);
        // A client that offers only "no authentication" is refused.
        let (r, written) = run(&[5, 1, 0], &user());
        assert!(
            matches!(r, Err(HandshakeError::NoAcceptableMethod)),
            "{r:?}"
        );
        assert_eq!(written, [5, 0xff]);
    }

    #[test]
    fn bad_requests_get_the_rfc_reply_codes() {
        // BIND: command not supported.
        let (r, written) = run(&[5, 1, 0, 5, 2, 0, 1, 10, 0, 0, 1, 0, 80], &[]);
        assert!(matches!(r, Err(HandshakeError::Command(2))), "{r:?}");
        assert_eq!(&written[2..4], [5, reply::COMMAND_NOT_SUPPORTED]);
        // Address type 9.
        let (r, written) = run(&[5, 1, 0, 5, 1, 0, 9, 1, 2, 3], &[]);
        assert!(matches!(r, Err(HandshakeError::AddressType(9))), "{r:?}");
        assert_eq!(&written[2..4], [5, reply::ADDRESS_NOT_SUPPORTED]);
        // SOCKS4: no answer at all.
        let (r, written) = run(&[4, 1, 0, 80, 10, 0, 0, 1, 0], &[]);
        assert!(matches!(r, Err(HandshakeError::Version(4))), "{r:?}");
        assert!(written.is_empty());
        // An empty name.
        let (r, _) = run(&[5, 1, 0, 5, 1, 0, 3, 0, 0, 80], &[]);
        assert!(matches!(r, Err(HandshakeError::Name)), "{r:?}");
    }

    proptest! {
        #[test]
        fn any_bytes_end_in_a_target_or_an_error(input in proptest::collection::vec(any::<u8>(), 0..64),
                                                  auth in any::<bool>()) {
            let users = if auth { user() } else { Vec::new() };
            let (_, written) = run(&input, &users);
            // The server never writes more than its greeting, one auth status and a reply.
            prop_assert!(written.len() <= 2 + 2 + 22);
        }
    }
}
