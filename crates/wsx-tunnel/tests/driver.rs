//! The driver on real UDP sockets over loopback: handshakes, hashed transfers in both
//! directions on many streams, control messages, resets, several peers on one socket, IPv4,
//! IPv6 and a dual-stack socket.
//!
//! Deadlines here only stop a hung test; nothing asserts on how long a transfer took.

use std::hash::{DefaultHasher, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use wsx_tunnel::driver::{Driver, Stream, Tunnel};
use wsx_tunnel::{ConnectionError, EndpointConfig, SecretKey, StreamMeta};

/// Generous: the machine is shared, and a debug build encrypts slowly.
const HANG: Duration = Duration::from_secs(120);

fn config(secret: &SecretKey, peers: &[&SecretKey]) -> EndpointConfig {
    let peers = peers.iter().map(|s| s.public_key()).collect();
    EndpointConfig::new(secret.clone(), peers, fastrand::u64(..))
}

/// `len` bytes of stream `seed`'s content.
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut data = vec![0u8; len];
    rng.fill(&mut data);
    data
}

fn hash(data: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(data);
    h.finish()
}

/// Writes `data`, finishes, and reads everything the peer sends until its finish.
async fn exchange(mut stream: Stream, data: Vec<u8>) -> Vec<u8> {
    let (mut reader, mut writer) = tokio::io::split(&mut stream);
    let write = async {
        writer.write_all(&data).await.expect("write");
        writer.shutdown().await.expect("finish");
    };
    let read = async {
        let mut received = Vec::new();
        reader.read_to_end(&mut received).await.expect("read");
        received
    };
    let ((), received) = tokio::join!(write, read);
    received
}

async fn connected_pair(bind_a: SocketAddr, bind_b: SocketAddr, connect_to: SocketAddr) -> Pair {
    connected_pair_with(bind_a, bind_b, connect_to, |c| c).await
}

/// [`connected_pair`] with both sides' configurations passed through `tweak`.
async fn connected_pair_with(
    bind_a: SocketAddr,
    bind_b: SocketAddr,
    connect_to: SocketAddr,
    tweak: impl Fn(EndpointConfig) -> EndpointConfig,
) -> Pair {
    let (ka, kb) = (SecretKey::generate(), SecretKey::generate());
    let a = Driver::bind(bind_a, tweak(config(&ka, &[&kb]))).expect("bind a");
    let b = Driver::bind(bind_b, tweak(config(&kb, &[&ka]))).expect("bind b");
    let to = SocketAddr::new(connect_to.ip(), b.local_addr().port());
    let client = a.connect(to, kb.public_key()).expect("connect");
    let server = timeout(HANG, b.accept())
        .await
        .expect("accept hung")
        .expect("accept");
    timeout(HANG, client.established())
        .await
        .expect("handshake hung")
        .expect("handshake");
    timeout(HANG, server.established())
        .await
        .expect("handshake hung")
        .expect("handshake");
    Pair {
        a,
        b,
        client,
        server,
    }
}

struct Pair {
    a: Driver,
    b: Driver,
    client: Tunnel,
    server: Tunnel,
}

/// Streams opened on `client`, each carrying its own content both ways; every byte checked.
async fn transfer(client: &Tunnel, server: &Tunnel, streams: u64, len: usize) {
    let server = server.clone();
    let serve = tokio::spawn(async move {
        let mut tasks = Vec::new();
        for _ in 0..streams {
            let stream = server.accept_stream().await.expect("accept stream");
            let seed: u64 = String::from_utf8(stream.meta().hint.clone())
                .expect("hint")
                .parse()
                .expect("seed");
            tasks.push(tokio::spawn(async move {
                let received = exchange(stream, content(seed + 1000, len)).await;
                assert_eq!(received.len(), len, "stream {seed}: bytes at the server");
                assert_eq!(hash(&received), hash(&content(seed, len)), "stream {seed}");
            }));
        }
        for t in tasks {
            t.await.expect("server stream task");
        }
    });
    let mut tasks = Vec::new();
    for seed in 0..streams {
        let meta = StreamMeta {
            destination: Some(SocketAddr::from((Ipv4Addr::new(192, 0, 2, 1), 445)).into()),
            hint: seed.to_string().into_bytes(),
            ..StreamMeta::default()
        };
        let stream = client.open(meta).expect("open");
        tasks.push(tokio::spawn(async move {
            let received = exchange(stream, content(seed, len)).await;
            assert_eq!(received.len(), len, "stream {seed}: bytes at the client");
            assert_eq!(
                hash(&received),
                hash(&content(seed + 1000, len)),
                "stream {seed}"
            );
        }));
    }
    for t in tasks {
        timeout(HANG, t)
            .await
            .expect("transfer hung")
            .expect("client stream task");
    }
    timeout(HANG, serve)
        .await
        .expect("server hung")
        .expect("server task");
}

#[tokio::test]
async fn ipv4_streams_both_ways_are_delivered_intact() {
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let p = connected_pair(lo, lo, lo).await;
    transfer(&p.client, &p.server, 8, 4 << 20).await;
    let (sa, sb) = (p.a.stats(), p.b.stats());
    // 64 MiB moved: far more datagrams than sendmsg calls means GSO batched them, and
    // fewer receive calls than datagrams means recvmmsg/GRO did.
    assert!(sa.datagrams_sent > 4 * sa.send_calls, "{sa:?}");
    assert!(sb.datagrams_received > 4 * sb.receive_calls, "{sb:?}");
    assert_eq!(sa.send_errors + sb.send_errors, 0);
    let stats = p.client.stats();
    assert!(stats.bytes_sent > 32 << 20, "{stats:?}");
}

#[tokio::test]
async fn ipv6_and_dual_stack_sockets_work() {
    let lo6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 0));
    let p = connected_pair(lo6, lo6, lo6).await;
    transfer(&p.client, &p.server, 2, 1 << 20).await;
    assert!(p.client.remote_address().is_ipv6());

    // A server on [::] accepts an IPv4 client and sees it as IPv4.
    let any6 = SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0));
    let lo4 = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let p = connected_pair(lo4, any6, lo4).await;
    transfer(&p.client, &p.server, 2, 1 << 20).await;
    assert!(
        p.server.remote_address().is_ipv4(),
        "{}",
        p.server.remote_address()
    );
}

#[tokio::test]
async fn one_socket_serves_several_peers() {
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let hub_key = SecretKey::generate();
    let keys: Vec<SecretKey> = (0..3).map(|_| SecretKey::generate()).collect();
    let hub = Driver::bind(lo, config(&hub_key, &keys.iter().collect::<Vec<_>>())).expect("bind");
    let mut pairs = Vec::new();
    for key in &keys {
        let spoke = Driver::bind(lo, config(key, &[&hub_key])).expect("bind spoke");
        let tunnel = spoke
            .connect(hub.local_addr(), hub_key.public_key())
            .expect("connect");
        let accepted = timeout(HANG, hub.accept())
            .await
            .expect("accept hung")
            .expect("accept");
        assert_eq!(accepted.peer(), key.public_key());
        timeout(HANG, tunnel.established())
            .await
            .expect("hung")
            .expect("handshake");
        pairs.push((spoke, tunnel, accepted));
    }
    let mut runs = Vec::new();
    for (_, client, server) in &pairs {
        let (client, server) = (client.clone(), server.clone());
        runs.push(tokio::spawn(async move {
            transfer(&client, &server, 3, 1 << 20).await;
        }));
    }
    for r in runs {
        r.await.expect("transfer");
    }
}

#[tokio::test]
async fn control_messages_arrive_in_order() {
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let p = connected_pair(lo, lo, lo).await;
    for i in 0..50u32 {
        p.client
            .send_control(&i.to_be_bytes())
            .expect("send control");
    }
    for i in 0..50u32 {
        let m = timeout(HANG, p.server.recv_control())
            .await
            .expect("hung")
            .expect("control");
        assert_eq!(m, i.to_be_bytes());
    }
}

#[tokio::test]
async fn a_reset_reaches_the_reader_and_a_dropped_stream_is_reset() {
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let p = connected_pair(lo, lo, lo).await;

    let mut stream = p.client.open(StreamMeta::default()).expect("open");
    stream.write_all(b"partial").await.expect("write");
    let mut peer = timeout(HANG, p.server.accept_stream())
        .await
        .expect("hung")
        .expect("accept");
    let mut buf = [0u8; 7];
    timeout(HANG, peer.read_exact(&mut buf))
        .await
        .expect("hung")
        .expect("read");
    assert_eq!(&buf, b"partial");
    stream.reset(42);
    let err = timeout(HANG, peer.read(&mut buf))
        .await
        .expect("hung")
        .expect_err("reset");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    assert!(err.to_string().contains("42"), "{err}");

    // Dropping an unfinished stream resets it, so the peer does not wait for more.
    let mut stream = p.client.open(StreamMeta::default()).expect("open");
    stream.write_all(b"x").await.expect("write");
    let mut peer = timeout(HANG, p.server.accept_stream())
        .await
        .expect("hung")
        .expect("accept");
    drop(stream);
    let mut rest = Vec::new();
    let err = timeout(HANG, peer.read_to_end(&mut rest))
        .await
        .expect("hung")
        .expect_err("reset");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
}

#[tokio::test]
async fn closing_ends_both_sides_and_unknown_keys_get_no_answer() {
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let p = connected_pair(lo, lo, lo).await;
    p.client.close(7, b"bye");
    let reason = timeout(HANG, p.server.closed()).await.expect("close hung");
    assert_eq!(
        reason,
        ConnectionError::PeerClosed {
            code: 7,
            reason: "bye".into()
        }
    );
    assert_eq!(p.client.error(), Some(ConnectionError::LocallyClosed));

    // A stranger's initiation is dropped silently: its handshake never completes.
    let stranger = SecretKey::generate();
    let mut config = config(&stranger, &[]);
    config.peers = vec![p.b.public_key()];
    config.transport.handshake_attempts = 1;
    let s = Driver::bind(lo, config).expect("bind");
    let t = s
        .connect(p.b.local_addr(), p.b.public_key())
        .expect("connect");
    let outcome = timeout(HANG, t.established()).await.expect("hung");
    assert!(outcome.is_err(), "a stranger completed a handshake");
    assert!(p.b.stats().endpoint.handshakes_rejected >= 1);
    s.shutdown(Duration::ZERO).await;
    p.a.shutdown(Duration::ZERO).await;
    p.b.shutdown(Duration::ZERO).await;
}

#[tokio::test]
async fn dropping_the_last_handle_closes_the_connection() {
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let Pair {
        a,
        b,
        client,
        server,
    } = connected_pair(lo, lo, lo).await;
    let meta = StreamMeta {
        destination: Some(SocketAddr::from((Ipv4Addr::new(192, 0, 2, 1), 80)).into()),
        ..StreamMeta::default()
    };
    let stream = client.open(meta).expect("open");

    // A stream keeps its connection: with the tunnel handle gone, it still carries data.
    drop(client);
    let data = content(7, 100_000);
    let sent = tokio::spawn(exchange(stream, data.clone()));
    let accepted = timeout(HANG, server.accept_stream()).await.expect("hung");
    let received = exchange(accepted.expect("accept stream"), Vec::new()).await;
    assert_eq!(hash(&received), hash(&data));
    assert!(timeout(HANG, sent).await.expect("hung").is_ok());

    // The stream has ended and was dropped: nothing holds the connection any more.
    let reason = timeout(HANG, server.closed()).await.expect("close hung");
    assert_eq!(
        reason,
        ConnectionError::PeerClosed {
            code: Tunnel::CLOSE_DROPPED,
            reason: "dropped".into()
        }
    );
    a.shutdown(Duration::ZERO).await;
    b.shutdown(Duration::ZERO).await;
}

/// What a stream sent just before its last handle went, or just before its driver shut
/// down, still arrives, FIN included: the connection closes only once the peer has
/// acknowledged it (or, shutting down, when the flush time is up).
#[tokio::test]
async fn what_was_sent_last_arrives_before_the_close() {
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    for shut_down in [false, true] {
        let Pair {
            a,
            b,
            client,
            server,
        } = connected_pair(lo, lo, lo).await;
        let data = content(11, 1_000_000);
        let mut stream = client.open(StreamMeta::default()).expect("open");
        let accepting = server.clone();
        // The peer has nothing to say: it finishes at once and reads.
        let reader = tokio::spawn(async move {
            let mut accepted = accepting.accept_stream().await.expect("accept stream");
            accepted.shutdown().await.expect("finish");
            let mut received = Vec::new();
            accepted.read_to_end(&mut received).await.map(|_| received)
        });
        // The OPEN goes out with the first bytes; the peer's FIN comes back.
        stream.write_all(&data[..1]).await.expect("write");
        let mut nothing = Vec::new();
        stream.read_to_end(&mut nothing).await.expect("read");
        // The rest written into the connection's buffers, finished and let go of: most of
        // it has not been sent yet.
        stream.write_all(&data[1..]).await.expect("write");
        stream.shutdown().await.expect("finish");
        drop(stream);
        let (code, reason, a) = if shut_down {
            timeout(HANG, a.shutdown(HANG))
                .await
                .expect("shutdown hung");
            (0, "shutting down", None)
        } else {
            drop(client);
            (Tunnel::CLOSE_DROPPED, "dropped", Some(a))
        };
        let received = timeout(HANG, reader)
            .await
            .expect("hung")
            .expect("reader task")
            .expect("the stream ended cleanly");
        assert_eq!(hash(&received), hash(&data));
        let closed = timeout(HANG, server.closed()).await.expect("close hung");
        assert_eq!(
            closed,
            ConnectionError::PeerClosed {
                code,
                reason: reason.into()
            }
        );
        if let Some(a) = a {
            a.shutdown(Duration::ZERO).await;
        }
        b.shutdown(Duration::ZERO).await;
    }
}

/// A connection nobody holds waits for delivery no longer than its idle timeout: a peer
/// that keeps it alive but never reads what it was sent has it closed all the same.
#[tokio::test]
async fn a_connection_nobody_holds_waits_no_longer_than_the_idle_timeout() {
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let small = |mut c: EndpointConfig| {
        // 3 s: long enough that a runtime held off the CPU for a second (a busy CI machine)
        // does not let the peer time out by itself first.
        c.transport.idle_timeout = Duration::from_secs(3);
        c.transport.keepalive = Duration::from_millis(200);
        c.transport.stream_window = 64 * 1024;
        c.transport.connection_window = 64 * 1024;
        c
    };
    let Pair {
        a,
        b,
        client,
        server,
    } = connected_pair_with(lo, lo, lo, small).await;
    let mut stream = client.open(StreamMeta::default()).expect("open");
    stream.write_all(b"x").await.expect("write");
    // The peer takes the stream, finishes its side at once and never reads.
    let mut held = timeout(HANG, server.accept_stream())
        .await
        .expect("hung")
        .expect("accept stream");
    held.shutdown().await.expect("finish");
    let mut nothing = Vec::new();
    stream.read_to_end(&mut nothing).await.expect("read");
    // Four windows' worth, finished, and both directions ended here: dropping the stream
    // does not reset it, and most of what it holds can never be delivered.
    stream
        .write_all(&content(5, 256 * 1024))
        .await
        .expect("write");
    stream.shutdown().await.expect("finish");
    drop((stream, client));
    // Hung if the connection waited for ever (the guard is ten idle timeouts).
    let closed = timeout(Duration::from_secs(30), server.closed())
        .await
        .expect("the connection nobody holds was not closed");
    assert_eq!(
        closed,
        ConnectionError::PeerClosed {
            code: Tunnel::CLOSE_DROPPED,
            reason: "dropped".into()
        }
    );
    drop(held);
    a.shutdown(Duration::ZERO).await;
    b.shutdown(Duration::ZERO).await;
}
