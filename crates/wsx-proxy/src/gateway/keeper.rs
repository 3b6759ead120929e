//! The peer keeper: the peer set follows the configuration; a keeper per peer with an
//! endpoint connects whenever there is no healthy tunnel (the peer may have connected to us
//! instead), watches the tunnel's health and reconnects; tunnels the peers open are
//! accepted and watched the same way; each tunnel in service has a task serving the
//! streams the peer opens on it.
//!
//! A tunnel silent for the health timeout takes no new sessions (they go to another tunnel,
//! or follow the peer's failure policy) but is kept: its sessions wait for it, and a link
//! that comes back within the tunnel's idle timeout (30 s) finds them still open. A new
//! handshake is not tried meanwhile, since it would replace the silent connection and reset
//! them; a peer that restarted connects itself (its handshake replaces the old connection).
//! A tunnel leaves service when it ends (closed, replaced, or idle past that timeout); it
//! logs its totals then ("tunnel totals"), and each peer's compression totals are logged at
//! stop.
//!
//! A keeper does not connect while a tunnel the peer opened is being accepted, nor right
//! after the peer's newer handshake replaced its own: a second connection of ours would
//! reach a peer that already holds the one it made, which would take ours for a restart
//! and drop its own, and sessions opened on that one meanwhile would be lost.

use super::{Inner, PeerEntry};
use crate::peers::{Peer, PeerConfig, PrefixTable};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};
use wsx_tunnel::driver::Tunnel;
use wsx_tunnel::{ConnectError, ConnectionError};

/// How long a handshake may take before the peer keeper starts over.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(4);
/// How often tunnel health is checked.
const HEALTH_CHECK: Duration = Duration::from_millis(200);
/// Wait before reconnecting to a peer whose tunnel failed.
const RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// The close code of a tunnel given up for silence.
const CLOSE_SILENT: u64 = 1;
/// The close code of a tunnel to a peer removed from the configuration.
const CLOSE_REMOVED: u64 = 2;

impl Inner {
    /// Brings the peer set in line with `configs`: new peers start, removed ones stop and
    /// their tunnels close, changed ones keep their tunnels unless the endpoint changed.
    pub(super) fn apply_peers(self: &Arc<Self>, configs: &[PeerConfig]) {
        let mut set = self.peer_set();
        let mut keep = HashMap::new();
        for config in configs {
            let existing = set.by_key.remove(&config.public_key);
            let entry = match existing {
                Some(entry) if entry.peer.config().endpoint == config.endpoint => {
                    entry.peer.set_config(config.clone());
                    entry
                }
                previous => {
                    if let Some(previous) = previous {
                        retire(previous);
                    }
                    let entry = PeerEntry {
                        peer: Arc::new(Peer::new(config.clone())),
                        cancel: self.stop.child_token(),
                    };
                    if let Some(endpoint) = config.endpoint {
                        let keeper = self.clone().keep_peer(
                            entry.peer.clone(),
                            endpoint,
                            entry.cancel.clone(),
                        );
                        tokio::spawn(keeper.instrument(info_span!("peer", name = %config.name)));
                    }
                    entry
                }
            };
            keep.insert(config.public_key, entry);
        }
        for (_, removed) in set.by_key.drain() {
            retire(removed);
        }
        let peers: Vec<Arc<Peer>> = keep.values().map(|e| e.peer.clone()).collect();
        set.table = Arc::new(PrefixTable::new(&peers));
        set.by_key = keep;

        fn retire(entry: PeerEntry) {
            entry.cancel.cancel();
            for tunnel in entry.peer.tunnels() {
                tunnel.close(CLOSE_REMOVED, b"peer removed");
            }
        }
    }

    /// Keeps a tunnel to a peer up: connects whenever there is no healthy one (the peer may
    /// have connected to us instead), watches it, reconnects.
    async fn keep_peer(
        self: Arc<Self>,
        peer: Arc<Peer>,
        endpoint: SocketAddr,
        cancel: CancellationToken,
    ) {
        let key = peer.config().public_key;
        let mut failures = 0u32;
        while !cancel.is_cancelled() {
            let health = self.config().sessions.health_timeout;
            // A tunnel in service, even a silent one, is waited for rather than replaced; so
            // is one the peer opened, on its way into service.
            if !peer.tunnels().is_empty() || peer.is_accepting() {
                sleep_or_cancel(HEALTH_CHECK, &cancel).await;
                continue;
            }
            let tunnel = match self.driver.connect(endpoint, key) {
                Ok(t) => t,
                // Accepted by the driver a moment ago, not yet counted by `accept_tunnels`:
                // connecting now would make the peer drop it for ours.
                Err(ConnectError::PeerConnecting(_)) => {
                    debug!("the peer is connecting to us; waiting for its tunnel");
                    await_replacement(&peer, &cancel).await;
                    continue;
                }
                Err(e) => {
                    warn!(error = %e, %endpoint, "cannot connect");
                    sleep_or_cancel(RECONNECT_DELAY, &cancel).await;
                    continue;
                }
            };
            let handshake = tokio::select! {
                r = tokio::time::timeout(HANDSHAKE_WAIT, tunnel.established()) => r,
                () = cancel.cancelled() => break,
            };
            match handshake {
                Ok(Ok(())) => {
                    failures = 0;
                    self.adopt(&peer, tunnel.clone(), &cancel);
                    self.watch(&peer, &tunnel, &cancel).await;
                    if tunnel.error() == Some(ConnectionError::Replaced) {
                        await_replacement(&peer, &cancel).await;
                    }
                }
                // The peer connected at the same moment and its attempt won: use that one.
                Ok(Err(ConnectionError::Replaced)) => {
                    debug!("our handshake lost to the peer's");
                    await_replacement(&peer, &cancel).await;
                }
                Ok(Err(e)) => {
                    failures += 1;
                    log_failure(failures, &format!("handshake failed: {e}"), endpoint);
                    sleep_or_cancel(RECONNECT_DELAY, &cancel).await;
                }
                Err(_) => {
                    tunnel.close(CLOSE_SILENT, b"handshake timed out");
                    // The peer ignores our attempt when its own, made at the same moment,
                    // wins; then its tunnel is in service by now.
                    if peer.usable_tunnel(health).is_some() {
                        debug!("no answer to the handshake; the peer's own tunnel is up");
                    } else {
                        failures += 1;
                        // The initiation is padded to 1,200 bytes: a path that does not
                        // carry that drops it, which looks like this.
                        log_failure(
                            failures,
                            "no answer to the handshake (is the peer running, does it know our \
                             key, and does the path carry 1,200-byte UDP datagrams?)",
                            endpoint,
                        );
                    }
                }
            }
        }
    }

    /// Takes a tunnel into service: it carries new streams and its incoming streams are
    /// served.
    fn adopt(self: &Arc<Self>, peer: &Arc<Peer>, tunnel: Tunnel, cancel: &CancellationToken) {
        // In service first, then to the shaper: a shaper turned on meanwhile finds it
        // among the peer's tunnels, or is seen here (adding it twice is harmless).
        peer.add_tunnel(tunnel.clone());
        if let Some(shaping) = self.shaping() {
            shaping.add_tunnel(&tunnel);
        }
        let cipher = tunnel.stats().cipher.map_or("none", |c| c.as_str());
        info!(remote = %tunnel.remote_address(), rtt = ?tunnel.rtt(), cipher, "tunnel in service");
        let name = peer.config().name;
        let serve = self
            .clone()
            .serve_tunnel(peer.clone(), tunnel, cancel.clone());
        tokio::spawn(serve.instrument(info_span!("peer", %name)));
    }

    /// Returns when the tunnel has ended, and takes it out of service; says when it goes
    /// silent for the health timeout (it then takes no new sessions) and when it is heard
    /// again.
    async fn watch(&self, peer: &Peer, tunnel: &Tunnel, cancel: &CancellationToken) {
        let mut interval = tokio::time::interval(HEALTH_CHECK);
        let mut silent_since_warned = false;
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                () = cancel.cancelled() => break,
            }
            if let Some(e) = tunnel.error() {
                warn!(error = %e, "tunnel closed");
                break;
            }
            let silent = tunnel.silent_for();
            let limit = self.config().sessions.health_timeout;
            // Silent while the peer is heard on another tunnel: the peer dropped this one
            // (both sides connected at once, and its side of this one lost).
            if silent >= limit && peer.usable_tunnel(limit).is_some_and(|t| &t != tunnel) {
                info!("peer heard on a newer tunnel; this one is closed");
                tunnel.close(CLOSE_SILENT, b"superseded");
                break;
            }
            if silent >= limit && !silent_since_warned {
                silent_since_warned = true;
                warn!(
                    silent = ?silent,
                    "peer not heard from: new sessions go elsewhere (on_failure) while its \
                     sessions wait for it, up to the tunnel's idle timeout"
                );
            } else if silent < limit && silent_since_warned {
                silent_since_warned = false;
                info!("peer heard from again: the tunnel takes new sessions");
            }
        }
        peer.remove_tunnel(tunnel);
        let shaper = self
            .shaper
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(shaping) = shaper {
            shaping.remove_tunnel(tunnel);
        }
        log_tunnel_totals(tunnel);
    }

    pub(super) async fn accept_tunnels(self: Arc<Self>) {
        loop {
            let tunnel = tokio::select! {
                t = self.driver.accept() => match t { Some(t) => t, None => return },
                () = self.stop.cancelled() => return,
            };
            let entry = self
                .peer_set()
                .by_key
                .get(&tunnel.peer())
                .map(|e| (e.peer.clone(), e.cancel.clone()));
            let Some((peer, cancel)) = entry else {
                tunnel.close(CLOSE_REMOVED, b"not a peer");
                continue;
            };
            let name = peer.config().name;
            let this = self.clone();
            let accepting = peer.accepting();
            tokio::spawn(
                async move {
                    match tokio::time::timeout(HANDSHAKE_WAIT, tunnel.established()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return debug!(error = %e, "accepted tunnel ended"),
                        Err(_) => return debug!("accepted tunnel never confirmed"),
                    }
                    this.adopt(&peer, tunnel.clone(), &cancel);
                    drop(accepting);
                    this.watch(&peer, &tunnel, &cancel).await;
                }
                .instrument(info_span!("peer", %name)),
            );
        }
    }

    /// Serves the streams the peer opens on `tunnel`.
    async fn serve_tunnel(
        self: Arc<Self>,
        peer: Arc<Peer>,
        tunnel: Tunnel,
        cancel: CancellationToken,
    ) {
        loop {
            let stream = tokio::select! {
                s = tunnel.accept_stream() => match s { Ok(s) => s, Err(_) => return },
                () = cancel.cancelled() => return,
            };
            let this = self.clone();
            let (peer, tunnel) = (peer.clone(), tunnel.clone());
            self.sessions_tracker
                .spawn(async move { this.inbound(peer, tunnel, stream).await });
        }
    }

    /// Stops every peer's keeper and watchers (their tunnels leave service and log their
    /// totals), logging what compression did for each peer.
    pub(super) fn stop_peers(&self) {
        for entry in self.peer_set().by_key.values() {
            log_compression_totals(&entry.peer);
            entry.cancel.cancel();
        }
    }
}

/// Our connection was replaced by a newer one the peer made: waits (at most a handshake's
/// time) for that one to come into service through `accept_tunnels`, which may not have
/// counted it yet when the replacement is seen here.
async fn await_replacement(peer: &Peer, cancel: &CancellationToken) {
    let start = tokio::time::Instant::now();
    while peer.tunnels().is_empty() && !cancel.is_cancelled() {
        let waited = start.elapsed();
        if waited >= HANDSHAKE_WAIT || (waited >= HEALTH_CHECK && !peer.is_accepting()) {
            return;
        }
        sleep_or_cancel(HEALTH_CHECK, cancel).await;
    }
}

/// What a tunnel carried in its life, logged for operators when it leaves service:
/// packets, losses and FEC (the API shows the same counters while it is in service).
fn log_tunnel_totals(tunnel: &Tunnel) {
    // Sent: every packet and byte, then by kind (data and ACK-only packets are the ones
    // tracked for loss), what was lost and what the peer rebuilt, and the path's loss over
    // the tracked packets. Received: what this side rebuilt of the peer's packets, and the
    // groups it could not.
    let t = tunnel.stats();
    info!(
        packets_sent = t.packets_sent,
        bytes_sent = t.bytes_sent,
        data_packets_sent = t.eliciting_sent,
        ack_only_sent = t.ack_only_sent,
        fec_parity_sent = t.fec.parity_sent,
        packets_lost = t.packets_lost,
        fec_recovered_by_peer = t.fec.recovered_by_peer,
        loss_ratio = t.loss_ratio(),
        packets_received = t.packets_received,
        fec_recovered_here = t.fec.recovered,
        fec_unrecoverable_groups_received = t.fec.unrecoverable_groups,
        "tunnel totals"
    );
}

/// What compression did for a peer's sessions since the start, logged at shutdown.
fn log_compression_totals(peer: &Peer) {
    let c = peer.compression();
    info!(
        peer = %peer.config().name,
        plain_sent = c.plain_sent,
        wire_sent = c.wire_sent,
        chunks_deflated = c.chunks_deflated,
        chunks_incompressible = c.chunks_incompressible,
        chunks_stored = c.chunks_stored,
        compress_ms = c.compress_time.as_millis() as u64,
        wire_received = c.wire_received,
        plain_received = c.plain_received,
        inflate_ms = c.inflate_time.as_millis() as u64,
        "compression totals"
    );
}

/// Logs the first failures to reach a peer, then only every tenth, so a peer that is down for
/// hours does not flood the journal.
fn log_failure(failures: u32, what: &str, endpoint: SocketAddr) {
    if failures <= 3 || failures % 10 == 0 {
        warn!(%endpoint, failures, "{what}");
    }
}

async fn sleep_or_cancel(duration: Duration, cancel: &CancellationToken) {
    tokio::select! {
        () = tokio::time::sleep(duration) => {}
        () = cancel.cancelled() => {}
    }
}
