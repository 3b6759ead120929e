//! End-to-end tests of wsx: real kernel TCP through the lab's namespaces and emulated WAN.
//! The tests live in `tests/`; they need root and are run by `cargo xtask test`.
//!
//! This library holds what they share: [`Daemon`] runs the `wsx` binary in a lab node with a
//! configuration and watches its log; [`Machine`] boots systemd in a lab node, so that the
//! deployment guide can be followed as written; [`transfer`] moves hashed bytes across.

// Test support: a failed setup is a failed test.
#![allow(clippy::unwrap_used)]

use std::hash::{DefaultHasher, Hasher};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use wsx_lab::traffic::{self, PayloadKind, SendOptions, SinkOptions};
use wsx_lab::{Lab, Node, WanSpec, addr};
use wsx_tunnel::SecretKey;

/// The `wsx` binary `cargo xtask test` built beside the test executables.
pub fn wsx_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("wsx"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no wsx binary near {}: run `cargo build -p wsx`",
                exe.display()
            )
        })
}

/// A `wsx run` in one lab node. Dropping it stops the daemon (SIGTERM, then SIGKILL).
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    log: Arc<(Mutex<Vec<String>>, Condvar)>,
    pub config: PathBuf,
    node: Node,
}

impl Daemon {
    /// Writes `config` into `dir` and starts the daemon with it; waits until it runs.
    pub fn start(lab: &Lab, node: Node, dir: &std::path::Path, config: &str) -> Self {
        let path = dir.join(format!("{}.toml", node.role()));
        std::fs::write(&path, config).unwrap();
        Self::start_with(lab, node, path)
    }

    /// Starts the daemon on an existing configuration file.
    pub fn start_with(lab: &Lab, node: Node, config: PathBuf) -> Self {
        Self::spawn(node, config, lab.command(node, wsx_binary()))
    }

    /// Writes `config` into `dir` and starts the daemon with no capabilities at all (root
    /// in name only: `setpriv` empties the bounding set), as an unprivileged deployment
    /// of forwarding listeners would run it.
    pub fn start_unprivileged(lab: &Lab, node: Node, dir: &Path, config: &str) -> Self {
        let path = dir.join(format!("{}.toml", node.role()));
        std::fs::write(&path, config).unwrap();
        let mut command = lab.command(node, "setpriv");
        command
            .args(["--bounding-set=-all", "--inh-caps=-all", "--no-new-privs"])
            .arg(wsx_binary());
        Self::spawn(node, path, command)
    }

    /// Writes `config` into `dir` and starts the daemon with at most `descriptors` open
    /// files (soft and hard: it cannot raise them), as a host with a low limit would.
    pub fn start_with_descriptor_limit(
        lab: &Lab,
        node: Node,
        dir: &Path,
        config: &str,
        descriptors: u32,
    ) -> Self {
        let path = dir.join(format!("{}.toml", node.role()));
        std::fs::write(&path, config).unwrap();
        let mut command = lab.command(node, "prlimit");
        command
            .arg(format!("--nofile={descriptors}:{descriptors}"))
            .arg(wsx_binary());
        Self::spawn(node, path, command)
    }

    /// The daemon's effective capabilities (`CapEff` of /proc/PID/status).
    pub fn effective_capabilities(&self) -> u64 {
        let pid = self.child.as_ref().unwrap().id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    }

    fn spawn(node: Node, config: PathBuf, mut command: Command) -> Self {
        let mut child = command
            .arg("run")
            .arg("--config")
            .arg(&config)
            .env("WSX_LOG", "info,wsx_proxy=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        let role = node.role();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[{role}] {line}");
                sink.0.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                sink.1.notify_all();
            }
        });
        let daemon = Self {
            child: Some(child),
            log,
            config,
            node,
        };
        daemon.wait_for("wsx running", Duration::from_secs(20));
        daemon
    }

    /// Waits until a log line contains `pattern` (counting lines already logged); panics
    /// after `timeout`.
    pub fn wait_for(&self, pattern: &str, timeout: Duration) {
        self.wait_for_count(pattern, 1, timeout);
    }

    /// Waits until `count` log lines contain `pattern`.
    pub fn wait_for_count(&self, pattern: &str, count: usize, timeout: Duration) {
        self.wait_for_count_all(&[pattern], count, timeout);
    }

    /// Waits until `count` log lines contain every one of `patterns`: the log is read by
    /// a thread of its own, so a line the gateway wrote may not be counted yet.
    pub fn wait_for_count_all(&self, patterns: &[&str], count: usize, timeout: Duration) {
        let what = format!("{count} log line(s) with {patterns:?}");
        self.wait_until(&what, timeout, |lines| {
            lines
                .iter()
                .filter(|l| patterns.iter().all(|p| l.contains(p)))
                .count()
                >= count
        });
    }

    /// Waits until a tunnel of this gateway is in service, by its log.
    pub fn wait_until_serving(&self, timeout: Duration) {
        self.wait_until("a tunnel in service", timeout, serving);
    }

    /// Whether a tunnel of this gateway is in service, by its log.
    pub fn is_serving(&self) -> bool {
        serving(&self.log.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Waits until `holds` is true of the log so far; panics after `timeout`, naming `what`.
    fn wait_until(&self, what: &str, timeout: Duration, holds: impl Fn(&[String]) -> bool) {
        let deadline = Instant::now() + timeout;
        let (lines, changed) = &*self.log;
        let mut guard = lines.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if holds(&guard) {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{:?}: no {what} within {timeout:?}; log:\n{}",
                self.node,
                guard.join("\n")
            );
            guard = changed
                .wait_timeout(guard, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The numbers of the `key=value` fields of the last log line containing `pattern`.
    pub fn fields(&self, pattern: &str) -> std::collections::HashMap<String, u64> {
        let lines = self.log.0.lock().unwrap_or_else(|e| e.into_inner());
        let line = lines
            .iter()
            .rev()
            .find(|l| l.contains(pattern))
            .unwrap_or_else(|| panic!("{:?}: no log line with {pattern:?}", self.node));
        line.split_whitespace()
            .filter_map(|token| {
                let (key, value) = token.split_once('=')?;
                Some((key.to_string(), value.parse().ok()?))
            })
            .collect()
    }

    /// How many log lines contain `pattern`.
    pub fn count(&self, pattern: &str) -> usize {
        self.count_all(&[pattern])
    }

    /// How many log lines contain every one of `patterns`.
    pub fn count_all(&self, patterns: &[&str]) -> usize {
        let lines = self.log.0.lock().unwrap_or_else(|e| e.into_inner());
        lines
            .iter()
            .filter(|l| patterns.iter().all(|p| l.contains(p)))
            .count()
    }

    /// How many sessions the daemon opened on `route` ("tunnel", "bypass", "inbound"),
    /// once the count has stopped changing: log lines arrive through a pipe and may trail
    /// the traffic they describe by a moment.
    pub fn sessions(&self, route: &str) -> usize {
        let pattern = format!("route=\"{route}\"");
        let mut last = self.count_all(&[&pattern, "session opened"]);
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = self.count_all(&[&pattern, "session opened"]);
            if now == last {
                return now;
            }
            last = now;
        }
    }

    /// The daemon's peak resident memory so far, KiB.
    pub fn max_rss_kb(&self) -> u64 {
        let pid = self.child.as_ref().map(|c| c.id()).unwrap();
        wsx_lab::usage_of(pid).unwrap().max_rss_kb
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: libc::c_int) {
        if let Some(child) = &self.child {
            // SAFETY: kill with a pid we own and a valid signal number.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }

    /// Stops the daemon with SIGTERM and waits for it; returns whether it exited cleanly.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        // SAFETY: as in `signal`.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.success();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the daemon with SIGKILL, as a crash would: nothing is cleaned up.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An HTTP request to a gateway's API at `api` from inside `node`'s namespace, with the
/// bearer `token` and an optional body (content type, text): the status and the body.
pub fn api_request(
    lab: &Lab,
    node: Node,
    (api, token): (&str, &str),
    (method, path): (&str, &str),
    body: Option<(&str, String)>,
) -> (u16, String) {
    let (method, url) = (method.to_owned(), format!("http://{api}{path}"));
    let authorization = format!("Bearer {token}");
    let body = body.map(|(t, b)| (t.to_owned(), b));
    lab.run_in(node, move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into();
        let request = ureq::http::Request::builder()
            .method(method.as_str())
            .uri(&url)
            .header("Authorization", authorization);
        let mut response = match body {
            Some((content_type, body)) => agent.run(
                request
                    .header("Content-Type", content_type)
                    .body(body)
                    .unwrap(),
            ),
            None => agent.run(request.body(()).unwrap()),
        }
        .unwrap();
        let status = response.status().as_u16();
        (status, response.body_mut().read_to_string().unwrap())
    })
    .unwrap()
}

/// A TCP listener on an ephemeral port of `ip` in `node`, and its address.
pub fn listen(lab: &Lab, node: Node, ip: IpAddr) -> (TcpListener, SocketAddr) {
    let listener = lab
        .run_in(node, move || TcpListener::bind(SocketAddr::new(ip, 0)))
        .unwrap()
        .unwrap();
    let address = listener.local_addr().unwrap();
    (listener, address)
}

/// Sends `flows` × `bytes` of random data from `from` to a sink in `to`, over IPv6 or IPv4;
/// returns the verified byte count.
pub fn transfer(lab: &Lab, from: Node, to: Node, ipv6: bool, flows: u16, bytes: u64) -> u64 {
    transfer_payload(lab, from, to, ipv6, flows, bytes, PayloadKind::Random)
}

/// [`transfer`] with a choice of payload.
pub fn transfer_payload(
    lab: &Lab,
    from: Node,
    to: Node,
    ipv6: bool,
    flows: u16,
    bytes: u64,
    payload: PayloadKind,
) -> u64 {
    let sink_ip = match to {
        Node::Client => addr::client(ipv6),
        _ => addr::server(ipv6),
    };
    let (listener, target) = listen(lab, to, sink_ip);
    transfer_through(lab, from, listener, target, flows, bytes, payload)
}

/// Sends `flows` × `bytes` from `from` to `connect_to` (the sink's own address, or an entry
/// point that leads to it), received and verified by a sink on `listener`; returns the
/// verified byte count.
pub fn transfer_through(
    lab: &Lab,
    from: Node,
    listener: TcpListener,
    connect_to: SocketAddr,
    flows: u16,
    bytes: u64,
    payload: PayloadKind,
) -> u64 {
    let target = connect_to;
    let sink = std::thread::spawn(move || {
        traffic::sink(
            &listener,
            SinkOptions {
                flows,
                idle_timeout: Duration::from_secs(30),
            },
        )
    });
    let options = SendOptions {
        to: target,
        flows,
        bytes: Some(bytes),
        seconds: 0.0,
        congestion: None,
        payload,
        seed: 7,
        receipt_timeout: Duration::from_secs(60),
        rate_bps: None,
    };
    let sent = lab
        .run_in(from, move || traffic::send(&options))
        .unwrap()
        .unwrap();
    // The sender's failure, if any, says more than the sink's missing connection.
    let received = sink.join().unwrap();
    assert!(
        sent.verified(),
        "sender: {:?}",
        sent.flows.iter().find(|f| !f.verified)
    );
    let received = received.unwrap();
    assert!(
        received.verified(),
        "sink: {:?}",
        received.flows.iter().find(|f| !f.verified)
    );
    received.flows.iter().map(|f| f.bytes).sum()
}

/// Neither the table nor the policy-routing rules of a gateway are left in `node`.
pub fn assert_no_rules(lab: &Lab, node: Node) {
    let netns = lab.netns(node);
    let tables = wsx_lab::netns::exec(&netns, "nft", &["list", "tables"]).unwrap();
    assert!(!tables.contains("wsx"), "{node:?}: {tables}");
    for family in ["-4", "-6"] {
        let rules = wsx_lab::netns::exec(&netns, "ip", &[family, "rule"]).unwrap();
        assert!(!rules.contains("0x7773"), "{node:?}: {rules}");
    }
}

/// Calls `check` every `every` until it returns a value; panics with its last complaint if
/// none came within `timeout`.
pub fn wait_until<T>(
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return value,
            Err(why) => assert!(Instant::now() < deadline, "not within {timeout:?}: {why}"),
        }
        std::thread::sleep(every);
    }
}

/// The lab the gateway tests run in: a 40 ms, 0.5 % loss, 100 Mbit/s WAN.
pub fn gateway_lab() -> Lab {
    let wan = WanSpec {
        rtt_ms: 40.0,
        loss_pct: 0.5,
        rate_mbit: 100.0,
        ..WanSpec::default()
    };
    Lab::start(&wan.emulator_config()).unwrap()
}

/// A server on site B that echoes every connection until it closes; its address.
pub fn echo_server(lab: &Lab) -> SocketAddr {
    let listener = lab
        .run_in(Node::Server, || {
            TcpListener::bind(SocketAddr::new(addr::server(false), 0))
        })
        .unwrap()
        .unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                while let Ok(n) = stream.read(&mut buf) {
                    if n == 0 || stream.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    address
}

/// A directory for one lab's configuration files.
pub fn config_dir(lab: &Lab) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wsx-e2e-{}", lab.name()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Configurations for both gateways of the lab, each pointing at the other.
#[derive(Debug, Clone)]
pub struct Configs {
    pub gw_a: String,
    pub gw_b: String,
}

/// gw-a with key `a` carries the server LAN's prefixes to gw-b with key `b`, and gw-b the
/// client LAN's to gw-a; both intercept on `lan0`.
pub fn configs_with(a: &SecretKey, b: &SecretKey) -> Configs {
    let config =
        |secret: &SecretKey, peer: &SecretKey, name: &str, endpoint: IpAddr, remote: String| {
            format!(
                r#"[tunnel]
listen = "[::]:4500"
private_key = "{}"

[intercept]
interfaces = ["lan0"]

[sessions]
connect_timeout = "3s"
drain_timeout = "2s"

[[peer]]
name = "{name}"
public_key = "{}"
endpoint = "{}"
prefixes = {remote}
"#,
                secret.to_base64(),
                peer.public_key(),
                SocketAddr::new(endpoint, 4500)
            )
        };
    Configs {
        gw_a: config(
            a,
            b,
            "gw-b",
            addr::GWB_WAN_V4.into(),
            toml_list(&addr::server_lan()),
        ),
        gw_b: config(
            b,
            a,
            "gw-a",
            addr::GWA_WAN_V4.into(),
            toml_list(&addr::client_lan()),
        ),
    }
}

/// Waits until each gateway has put `n` tunnels in service since it started, and both
/// have one in service at the same moment. When the two start (or one restarts) at once,
/// both may initiate: the tunnel one side put in service first is then replaced a round trip
/// later by the other's, and new sessions go direct in between (fail open). Tests that count
/// routes start after that.
pub fn wait_for_tunnel(gw_a: &Daemon, gw_b: &Daemon, n: usize) {
    let timeout = Duration::from_secs(20);
    for gw in [gw_a, gw_b] {
        gw.wait_for_count("tunnel in service", n, timeout);
    }
    // The keeper notices a tunnel's end at its next health check (every 200 ms): a state
    // that holds across one is settled.
    let health_check = Duration::from_millis(250);
    let deadline = Instant::now() + timeout;
    loop {
        for gw in [gw_a, gw_b] {
            gw.wait_until_serving(timeout);
        }
        std::thread::sleep(health_check);
        if gw_a.is_serving() && gw_b.is_serving() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the gateways did not settle on a tunnel"
        );
    }
}

/// Whether, by the log `lines`, a tunnel is in service: more put in service than ended
/// (the keeper notices an end at its next health check, so it may log the end of a replaced
/// tunnel after its successor's start: counts, not order).
fn serving(lines: &[String]) -> bool {
    let count = |pattern: &str| lines.iter().filter(|l| l.contains(pattern)).count();
    count("tunnel in service") > count("tunnel closed") + count("this one is closed")
}

/// A 64-bit digest of `data`, to compare what was sent with what arrived.
pub fn digest(data: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(data);
    h.finish()
}

/// `len` bytes of xorshift output from `seed`.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Strings as a TOML array.
pub fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

/// A lab node booted as a machine of its own: systemd runs as PID 1 of a new PID and mount
/// namespace inside the node's network namespace, so units, `systemctl` and `journalctl`
/// work there as on a gateway. `/etc`, `/usr`, `/var` and `/tmp` are overlays on this
/// host's (what is installed into the machine, by hand or by dpkg, stays in it and goes
/// with it; the workspace and its build stay visible wherever they are, `/tmp` included:
/// the machine's systemd-tmpfiles is told not to empty it); `/run` is empty.
/// Dropping it kills the machine; so does the end of the test process.
#[derive(Debug)]
pub struct Machine {
    unshare: Child,
    pid: u32,
    node: Node,
}

/// Run by `unshare` as the new namespaces' first process; becomes systemd.
const BOOT: &str = r#"set -e
mount -t proc proc /proc
mount -t tmpfs -o mode=0755 tmpfs /run
for dir in /etc /usr /var /tmp; do
    state=/run/machine-overlay$dir
    mkdir -p "$state/upper" "$state/work"
    mount -t overlay overlay -o "lowerdir=$dir,upperdir=$state/upper,workdir=$state/work" "$dir"
done
# systemd-tmpfiles empties /tmp at boot; the workspace may live there.
mkdir -p /etc/tmpfiles.d
: > /etc/tmpfiles.d/tmp.conf
exec env container=wsx-lab /lib/systemd/systemd --system --unit=basic.target
"#;

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Machine {
    /// Boots systemd in `node` and waits until it has reached its target.
    pub fn boot(lab: &Lab, node: Node) -> Self {
        let mut unshare = lab
            .command(node, "unshare")
            .args(["--pid", "--fork", "--mount", "--propagation", "private"])
            .args(["--kill-child=SIGKILL", "sh", "-c", BOOT])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // `ip netns exec` execs unshare in place, so the child's pid is unshare's; its one
        // child is the namespace's PID 1.
        let children = format!("/proc/{0}/task/{0}/children", unshare.id());
        let pid = wait_until(Duration::from_secs(10), Duration::from_millis(20), || {
            if let Some(status) = unshare.try_wait().unwrap() {
                panic!("{node:?}: the machine did not start: {status}");
            }
            std::fs::read_to_string(&children)
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .ok_or_else(|| format!("{node:?}: no PID 1"))
        });
        let machine = Self { unshare, pid, node };
        wait_until(Duration::from_secs(60), Duration::from_millis(100), || {
            let out = machine.sh("systemctl is-system-running 2>&1 || true");
            let state = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            match state.trim() {
                "running" => Ok(()),
                "degraded" => panic!(
                    "{node:?}: units failed at boot:\n{}",
                    machine.sh_ok("systemctl --failed --no-pager")
                ),
                _ => Err(format!("{node:?}: systemd not up: {state}")),
            }
        });
        machine
    }

    /// Runs `script` with `sh -e` in the machine, as root, in `dir` (the workspace root if
    /// `None`).
    pub fn sh_in(&self, dir: Option<&Path>, script: &str, stdin: &[u8]) -> Output {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut child = Command::new("nsenter")
            .arg("--target")
            .arg(self.pid.to_string())
            .arg("--all")
            .arg(format!("--wdns={}", dir.unwrap_or(workspace).display()))
            .args(["sh", "-ec", script])
            .env("PATH", PATH)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }

    /// Runs `script` in the machine from the workspace root.
    pub fn sh(&self, script: &str) -> Output {
        self.sh_in(None, script, b"")
    }

    /// Runs `script`, panics with its output if it fails, and returns its standard output.
    pub fn sh_ok(&self, script: &str) -> String {
        self.sh_input(script, b"")
    }

    /// As [`Machine::sh_ok`], with `stdin` as the script's standard input.
    pub fn sh_input(&self, script: &str, stdin: &[u8]) -> String {
        let out = self.sh_in(None, script, stdin);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{:?}: `{script}` failed ({}):\n{stdout}\n{}",
            self.node,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Waits until the unit's log (`journalctl -u UNIT`) has `count` lines with `pattern`.
    pub fn wait_for_journal(&self, unit: &str, pattern: &str, count: usize, timeout: Duration) {
        let script = format!("journalctl --no-pager -o cat -u {unit}");
        wait_until(timeout, Duration::from_millis(200), || {
            let log = self.sh_ok(&script);
            if log.lines().filter(|l| l.contains(pattern)).count() >= count {
                Ok(())
            } else {
                Err(format!(
                    "{:?}: no {count} line(s) with {pattern:?} in {unit}'s journal:\n{log}",
                    self.node
                ))
            }
        });
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // SIGKILL to a PID namespace's first process ends every process in it.
        // SAFETY: kill with a pid this machine started and a valid signal number.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
        let _ = self.unshare.wait();
    }
}
