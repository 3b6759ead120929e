//! The emulator's control socket: a Unix stream socket taking one JSON request per connection
//! and answering one JSON line. Used by the lab library, `wsx-lab stats` and `wsx-lab set`.

use super::params::LinkParams;
use super::stats::EmulatorStats;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// A direction of the link, as named on the control socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// gw-a to gw-b: client to server.
    AToB,
    /// gw-b to gw-a: server to client.
    BToA,
    /// Both directions.
    Both,
}

/// The configuration of a running emulator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmulatorConfig {
    /// gw-a to gw-b (client to server).
    pub a_to_b: LinkParams,
    /// gw-b to gw-a (server to client).
    pub b_to_a: LinkParams,
    /// Seed of the random generators (loss, jitter, reordering, duplication).
    pub seed: u64,
}

impl EmulatorConfig {
    /// Checks both directions' parameters; the error names the direction and the field.
    pub fn validate(&self) -> Result<()> {
        self.a_to_b
            .validate()
            .map_err(anyhow::Error::msg)
            .context("a_to_b")?;
        self.b_to_a
            .validate()
            .map_err(anyhow::Error::msg)
            .context("b_to_a")?;
        Ok(())
    }
}

/// A request on the control socket.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub(crate) enum Request {
    Stats,
    Config,
    Set {
        direction: Direction,
        params: LinkParams,
    },
    /// Starts recording arrivals per millisecond in `direction` (a_to_b or b_to_a).
    MarkTimeline {
        direction: Direction,
    },
    /// The arrivals per millisecond since the mark.
    Timeline {
        direction: Direction,
    },
}

/// An answer on the control socket.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub(crate) enum Response {
    // Boxed: the answers are sent once per request, and the enum stays small.
    Stats(Box<EmulatorStats>),
    Config(Box<EmulatorConfig>),
    Done,
    Timeline { bytes_per_ms: Vec<u64> },
    Error { message: String },
}

/// A client for a running emulator's control socket.
#[derive(Clone, Debug)]
pub struct EmulatorHandle {
    /// `None` for a lab whose WAN is a kernel bridge: every request fails.
    socket: Option<PathBuf>,
}

impl EmulatorHandle {
    /// A handle on the emulator listening at `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: Some(socket.into()),
        }
    }

    /// The handle of a lab without an emulator (a clean WAN): its requests fail, saying so.
    pub(crate) fn absent() -> Self {
        Self { socket: None }
    }

    /// The control socket's path, if there is an emulator.
    pub fn socket(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// The emulator's counters now.
    pub fn stats(&self) -> Result<EmulatorStats> {
        match self.request(&Request::Stats)? {
            Response::Stats(stats) => Ok(*stats),
            other => bail!("unexpected answer to stats: {other:?}"),
        }
    }

    /// The link parameters in force.
    pub fn config(&self) -> Result<EmulatorConfig> {
        match self.request(&Request::Config)? {
            Response::Config(config) => Ok(*config),
            other => bail!("unexpected answer to config: {other:?}"),
        }
    }

    /// Changes one or both directions while the emulator runs (a step change in rate or delay).
    pub fn set(&self, direction: Direction, params: LinkParams) -> Result<()> {
        match self.request(&Request::Set { direction, params })? {
            Response::Done => Ok(()),
            Response::Error { message } => bail!("emulator refused the change: {message}"),
            other => bail!("unexpected answer to set: {other:?}"),
        }
    }

    /// Starts recording the bytes arriving in `direction` per millisecond (a_to_b or
    /// b_to_a), from now.
    pub fn mark_timeline(&self, direction: Direction) -> Result<()> {
        match self.request(&Request::MarkTimeline { direction })? {
            Response::Done => Ok(()),
            Response::Error { message } => bail!("{message}"),
            other => bail!("unexpected answer to mark_timeline: {other:?}"),
        }
    }

    /// IP bytes that arrived in `direction` in each millisecond since its mark.
    pub fn timeline(&self, direction: Direction) -> Result<Vec<u64>> {
        match self.request(&Request::Timeline { direction })? {
            Response::Timeline { bytes_per_ms } => Ok(bytes_per_ms),
            Response::Error { message } => bail!("{message}"),
            other => bail!("unexpected answer to timeline: {other:?}"),
        }
    }

    fn request(&self, request: &Request) -> Result<Response> {
        let Some(socket) = &self.socket else {
            bail!("this lab's WAN is a kernel bridge: there is no emulator to ask");
        };
        let mut stream = UnixStream::connect(socket)
            .with_context(|| format!("connecting to the emulator at {}", socket.display()))?;
        let mut line = serde_json::to_string(request)?;
        line.push('\n');
        stream.write_all(line.as_bytes())?;
        let mut answer = String::new();
        BufReader::new(stream)
            .read_line(&mut answer)
            .context("reading the emulator's answer")?;
        serde_json::from_str(&answer)
            .with_context(|| format!("bad answer from the emulator: {answer:?}"))
    }
}
