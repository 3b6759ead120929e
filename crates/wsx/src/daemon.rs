//! `wsx run`: the gateway and its API under systemd.

use crate::config::Loaded;
use crate::control::{Daemon, LogControl};
use anyhow::{Context, Result};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, reload};
use wsx_api::ApiServer;
use wsx_proxy::Gateway;
use wsx_proxy::rules::{self, RulesConfig};

pub(crate) fn run(path: &Path) -> Result<()> {
    let loaded = Loaded::read(path)?;
    let config = loaded.gateway()?;
    let api = loaded.api()?;
    let log = init_logging(&loaded.config.log.level)?;
    check_descriptors(config.sessions.max_sessions);
    check_memory(&config.sessions);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("wsx")
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async move {
        let gateway = Arc::new(Gateway::start(config).await?);
        let daemon = Arc::new(Daemon::new(gateway.clone(), loaded, log));
        let api = match api {
            Some(api) => match ApiServer::start(api, daemon.clone()).await {
                Ok(server) => Some(server),
                Err(e) => {
                    // The gateway is up and its rules installed: take them down again.
                    drop(daemon);
                    stop_gateway(gateway, Duration::ZERO).await;
                    return Err(e.into());
                }
            },
            None => None,
        };
        info!(version = env!("CARGO_PKG_VERSION"), config = %path.display(), "wsx running");
        notify(&[sd_notify::NotifyState::Ready]);
        let watchdog = tokio::spawn(watchdog());
        let release = tokio::spawn(crate::memory::release_after_waves());
        let mut hangup = signal(SignalKind::hangup())?;
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        loop {
            tokio::select! {
                _ = hangup.recv() => {
                    notify(&[sd_notify::NotifyState::Reloading]);
                    match daemon.reload_file().await {
                        Ok(()) => info!("configuration reloaded from the file"),
                        Err(e) => error!("reload failed, keeping the running configuration: {e:#}"),
                    }
                    notify(&[sd_notify::NotifyState::Ready]);
                }
                _ = terminate.recv() => break,
                _ = interrupt.recv() => break,
            }
        }
        let drain = daemon.drain_timeout();
        info!(deadline = ?drain, "stopping");
        notify(&[sd_notify::NotifyState::Stopping]);
        watchdog.abort();
        release.abort();
        if let Some(api) = api {
            api.shutdown(Duration::from_secs(1)).await;
        }
        drop(daemon);
        stop_gateway(gateway, drain).await;
        info!("stopped");
        Ok(())
    })
}

/// Drains and stops the gateway once the API has let go of it.
async fn stop_gateway(gateway: Arc<Gateway>, drain: Duration) {
    let mut gateway = gateway;
    // The API's last connections drop their handles within moments of its shutdown.
    for _ in 0..200 {
        match Arc::try_unwrap(gateway) {
            Ok(gateway) => return gateway.shutdown(drain).await,
            Err(shared) => gateway = shared,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    warn!("the gateway is still in use; stopping without draining");
}

/// Removes the rules a configuration would install: after a crash, the table, the routing
/// rules and the route table are all that is left behind.
pub(crate) fn cleanup(path: &Path) -> Result<()> {
    let loaded = Loaded::read(path)?;
    let config = loaded.gateway()?;
    // Without [intercept], transparent origin installs its rule with the default numbers;
    // removing what is not there is harmless.
    let i = config.intercept.unwrap_or_default();
    rules::remove(&RulesConfig {
        port: i.port,
        mark: i.mark,
        route_table: i.route_table,
        rule_priority: i.rule_priority,
        interfaces: i.interfaces,
        prefixes: Vec::new(),
    });
    Ok(())
}

/// One line per event; under systemd (journald keeps its own timestamps) without time or
/// colour. The filter can change at runtime (the API's log level).
fn init_logging(level: &str) -> Result<LogControl> {
    let text = std::env::var("WSX_LOG").unwrap_or_else(|_| level.to_owned());
    let filter = EnvFilter::try_new(&text)
        .with_context(|| format!("log.level: not a valid filter: {text}"))?;
    let (filter, handle) = reload::Layer::new(filter);
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let format = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(false)
        .with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    if journal {
        registry.with(format.without_time()).init();
    } else {
        registry.with(format).init();
    }
    Ok(LogControl::new(handle, text))
}

fn notify(state: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, state) {
        warn!(error = %e, "telling systemd");
    }
}

/// Pings systemd's watchdog at half its interval, if the unit enables it.
async fn watchdog() {
    let mut usec = 0;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return;
    }
    let mut interval = tokio::time::interval(Duration::from_micros(usec) / 2);
    loop {
        interval.tick().await;
        notify(&[sd_notify::NotifyState::Watchdog]);
    }
}

/// Says how the memory budget is divided, and warns when it carries fewer sessions than
/// `max_sessions`: beyond what it carries the gateway refuses new sessions at once.
fn check_memory(sessions: &wsx_proxy::SessionConfig) {
    let budget = wsx_proxy::MemoryBudget {
        total: sessions.memory_budget,
    };
    let carried = budget.sessions();
    info!(
        memory_budget_mib = budget.total >> 20,
        relay_buffers_mib = budget.relay_buffers() >> 20,
        sessions = carried,
        "memory budget"
    );
    if sessions.max_sessions > carried {
        warn!(
            max_sessions = sessions.max_sessions,
            memory_budget_mib = budget.total >> 20,
            session_capacity = carried,
            "the memory budget carries about {carried} sessions, not max_sessions: raise \
             memory_budget_mib (32 KiB per session in its quarter for sessions) or lower \
             max_sessions"
        );
    }
}

/// Raises the open-file limit to the hard limit and says, when the limit cannot carry
/// `max_sessions`, how many sessions it can: beyond that the gateway refuses new sessions
/// at once, and the operator should raise `LimitNOFILE` or lower `max_sessions`.
fn check_descriptors(max_sessions: usize) {
    match wsx_proxy::sys::raise_descriptor_limit() {
        Ok((limit, before)) => {
            if limit > before {
                info!(
                    from = before,
                    to = limit,
                    "open-file limit raised to the hard limit"
                );
            }
            let capacity = wsx_proxy::Gateway::capacity_for(limit);
            if max_sessions > capacity {
                warn!(
                    max_sessions,
                    open_file_limit = limit,
                    session_capacity = capacity,
                    "the open-file limit allows about {capacity} sessions, not max_sessions: \
                     raise LimitNOFILE (one descriptor per session through the tunnel, two for one relayed directly) or lower max_sessions"
                );
            }
        }
        Err(e) => warn!(error = %e, "cannot read or raise the open-file limit"),
    }
}
