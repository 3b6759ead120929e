//! The API served for real (a bound socket, HTTP requests) over a real gateway with no
//! peers on loopback; the configuration side is a stand-in that records what it is asked.
//! Live sessions, peers and the daemon's configuration file are covered end to end in
//! `tests/` (the lab).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;
use wsx_api::model::{ConfigSummary, ConfigView, ShaperEdit};
use wsx_api::{ApiConfig, ApiError, ApiServer, BoxFuture, Control, ErrorCode};
use wsx_proxy::{Gateway, GatewayConfig};
use wsx_tunnel::SecretKey;

const TOKEN: &str = "test-token-0123456789abcdef";

struct Stand {
    gateway: Gateway,
    filter: Mutex<String>,
    applied: Mutex<Vec<String>>,
    edits: Mutex<Vec<ShaperEdit>>,
}

impl Control for Stand {
    fn gateway(&self) -> &Gateway {
        &self.gateway
    }

    fn config(&self) -> ConfigView {
        ConfigView {
            path: "/etc/wsx/wsx.toml".into(),
            config: serde_json::json!({ "tunnel": { "private_key": "<secret>" } }),
        }
    }

    fn check_config(&self, text: &str) -> Result<ConfigSummary, ApiError> {
        if text.contains("bad") {
            return Err(ApiError::new(ErrorCode::InvalidConfig, "not good")
                .field("tunnel.listen")
                .at(2, 10));
        }
        Ok(ConfigSummary {
            peers: 0,
            interception: false,
            applied: false,
        })
    }

    fn edit_shaper(&self, edit: ShaperEdit) -> BoxFuture<'_, Result<ConfigSummary, ApiError>> {
        Box::pin(async move {
            self.edits
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(edit);
            Ok(ConfigSummary {
                peers: 0,
                interception: false,
                applied: true,
            })
        })
    }

    fn apply_config(&self, text: String) -> BoxFuture<'_, Result<ConfigSummary, ApiError>> {
        Box::pin(async move {
            let mut summary = self.check_config(&text)?;
            self.applied
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(text);
            summary.applied = true;
            Ok(summary)
        })
    }

    fn log_filter(&self) -> String {
        self.filter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_log_filter(&self, filter: &str) -> Result<(), ApiError> {
        if filter.contains('!') {
            return Err(ApiError::new(ErrorCode::InvalidValue, "no").field("filter"));
        }
        *self.filter.lock().unwrap_or_else(|e| e.into_inner()) = filter.into();
        Ok(())
    }
}

struct Api {
    server: ApiServer,
    stand: Arc<Stand>,
    base: String,
}

async fn start(config: impl FnOnce(&mut ApiConfig)) -> Api {
    let mut gateway_config =
        GatewayConfig::new(SecretKey::generate(), "127.0.0.1:0".parse().unwrap());
    // No interception and no transparent origin: the gateway installs no rules on this host.
    gateway_config.transparent_origin = false;
    let gateway = Gateway::start(gateway_config).await.unwrap();
    let stand = Arc::new(Stand {
        gateway,
        filter: Mutex::new("info".into()),
        applied: Mutex::new(Vec::new()),
        edits: Mutex::new(Vec::new()),
    });
    let mut api = ApiConfig::new(vec![TOKEN.into()]);
    api.listen = "127.0.0.1:0".parse().unwrap();
    config(&mut api);
    let server = ApiServer::start(api, stand.clone()).await.unwrap();
    let base = format!("http://{}", server.local_addr());
    Api {
        server,
        stand,
        base,
    }
}

/// A request on a blocking thread; returns the status and the body as JSON (or text in
/// a JSON string).
async fn call(
    method: &'static str,
    url: String,
    token: Option<&'static str>,
    body: Option<(&'static str, String)>,
) -> (u16, serde_json::Value) {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .into();
        let mut request = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(token) = token {
            request = request.header("Authorization", format!("Bearer {token}"));
        }
        let response = match body {
            Some((content_type, body)) => agent.run(
                request
                    .header("Content-Type", content_type)
                    .body(body)
                    .unwrap(),
            ),
            None => agent.run(request.body(()).unwrap()),
        };
        let mut response = response.unwrap();
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, json)
    })
    .await
    .unwrap()
}

fn code(body: &serde_json::Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no code>")
}

#[tokio::test]
async fn every_route_but_health_needs_a_valid_token() {
    let api = start(|_| {}).await;
    let (status, body) = call("GET", format!("{}/api/v1/health", api.base), None, None).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
    for path in [
        "/api/v1/status",
        "/api/v1/peers",
        "/api/v1/sessions",
        "/api/v1/config",
        "/api/v1/log-level",
        "/api/v1/openapi.json",
        "/metrics",
    ] {
        let url = format!("{}{path}", api.base);
        let (status, body) = call("GET", url.clone(), None, None).await;
        assert_eq!((status, code(&body)), (401, "unauthorized"), "{path}");
        let (status, body) = call(
            "GET",
            url.clone(),
            Some("test-token-0123456789abcdeX"),
            None,
        )
        .await;
        assert_eq!((status, code(&body)), (401, "unauthorized"), "{path}");
        let (status, _) = call("GET", url, Some(TOKEN), None).await;
        assert_eq!(status, 200, "{path}");
    }
    api.server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn status_and_sessions_read_the_gateway() {
    let api = start(|_| {}).await;
    let (status, body) = call(
        "GET",
        format!("{}/api/v1/status", api.base),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        body["public_key"].as_str(),
        Some(api.stand.gateway.public_key().to_string().as_str())
    );
    assert_eq!(body["sessions"]["total"], 0);
    let (status, body) = call(
        "GET",
        format!("{}/api/v1/sessions?limit=5&address=10.0.0.0/8", api.base),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(
        (status, body["total"].as_u64(), body["limit"].as_u64()),
        (200, Some(0), Some(5))
    );
    api.server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn bad_input_gets_json_errors_naming_the_field() {
    let api = start(|_| {}).await;
    let base = api.base.clone();
    let get = |path: &str| call("GET", format!("{base}{path}"), Some(TOKEN), None);
    let (status, body) = get("/api/v1/sessions?limit=0").await;
    assert_eq!(
        (status, code(&body), body["error"]["field"].as_str()),
        (422, "invalid_value", Some("limit"))
    );
    let (status, body) = get("/api/v1/sessions?address=not-an-address").await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (422, Some("address"))
    );
    let (status, body) = get("/api/v1/sessions?route=sideways").await;
    assert_eq!((status, code(&body)), (400, "bad_request"));
    let (status, body) = get("/api/v1/sessions?colour=blue").await;
    assert_eq!((status, code(&body)), (400, "bad_request"));
    let (status, body) = get("/api/v1/sessions/not-a-number").await;
    assert_eq!((status, code(&body)), (400, "bad_request"));
    let (status, body) = get("/api/v1/sessions/12345").await;
    assert_eq!((status, code(&body)), (404, "not_found"));
    let (status, body) = get("/api/v1/peers/nobody").await;
    assert_eq!((status, code(&body)), (404, "not_found"));
    let (status, body) = get("/api/v1/nothing-here").await;
    assert_eq!((status, code(&body)), (404, "not_found"));
    let (status, body) = call("DELETE", format!("{base}/api/v1/status"), Some(TOKEN), None).await;
    assert_eq!((status, code(&body)), (405, "method_not_allowed"));
    let put = |path: &str, body: &str| {
        call(
            "PUT",
            format!("{base}{path}"),
            Some(TOKEN),
            Some(("application/json", body.to_string())),
        )
    };
    let (status, body) = put("/api/v1/log-level", "{\"filter\": ").await;
    assert_eq!((status, code(&body)), (400, "bad_request"));
    let (status, body) = put("/api/v1/log-level", "{\"level\": \"debug\"}").await;
    assert_eq!((status, code(&body)), (422, "invalid_value"));
    let (status, body) = put("/api/v1/log-level", "{\"filter\": \"!\"}").await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (422, Some("filter"))
    );
    let (status, body) = put("/api/v1/peers/nobody/bypass", "{\"force\": true}").await;
    assert_eq!((status, code(&body)), (404, "not_found"));
    let (status, body) = call(
        "POST",
        format!("{base}/api/v1/config/check"),
        Some(TOKEN),
        Some(("text/plain", "bad".into())),
    )
    .await;
    assert_eq!(
        (
            status,
            code(&body),
            body["error"]["field"].as_str(),
            body["error"]["line"].as_u64()
        ),
        (422, "invalid_config", Some("tunnel.listen"), Some(2))
    );
    api.server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn log_level_and_config_changes_reach_the_daemon() {
    let api = start(|_| {}).await;
    let (status, body) = call(
        "PUT",
        format!("{}/api/v1/log-level", api.base),
        Some(TOKEN),
        Some(("application/json", "{\"filter\": \"debug\"}".into())),
    )
    .await;
    assert_eq!((status, body["filter"].as_str()), (200, Some("debug")));
    assert_eq!(api.stand.log_filter(), "debug");
    let (status, body) = call(
        "PUT",
        format!("{}/api/v1/config", api.base),
        Some(TOKEN),
        Some(("text/plain", "[tunnel]\n".into())),
    )
    .await;
    assert_eq!((status, body["applied"].as_bool()), (200, Some(true)));
    assert_eq!(*api.stand.applied.lock().unwrap(), ["[tunnel]\n"]);
    api.server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let api = start(|c| c.max_body = 1024).await;
    let (status, body) = call(
        "POST",
        format!("{}/api/v1/config/check", api.base),
        Some(TOKEN),
        Some(("text/plain", "#".repeat(4096))),
    )
    .await;
    assert_eq!((status, code(&body)), (413, "payload_too_large"));
    api.server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn the_openapi_document_lists_every_route() {
    let api = start(|_| {}).await;
    let (status, doc) = call(
        "GET",
        format!("{}/api/v1/openapi.json", api.base),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let paths = doc["paths"].as_object().unwrap();
    for path in [
        "/api/v1/health",
        "/api/v1/status",
        "/api/v1/peers",
        "/api/v1/peers/{name}",
        "/api/v1/peers/{name}/bypass",
        "/api/v1/sessions",
        "/api/v1/sessions/{id}",
        "/api/v1/config",
        "/api/v1/config/check",
        "/api/v1/log-level",
        "/api/v1/shaper",
        "/api/v1/shaper/scenarios/{name}",
        "/api/v1/shaper/filters",
        "/api/v1/shaper/filters/{index}",
        "/metrics",
    ] {
        assert!(
            paths.contains_key(path),
            "{path} missing from {:?}",
            paths.keys()
        );
    }
    assert!(doc["components"]["securitySchemes"]["token"].is_object());
    assert!(doc["components"]["schemas"]["ErrorBody"].is_object());
    api.server.shutdown(Duration::from_secs(1)).await;
}

/// Scenarios and filters are edited one at a time: each request reaches the daemon as an
/// edit with only the fields given; bad bodies are refused before; a gateway without a
/// shaper has no state to show.
#[tokio::test]
async fn scenario_and_filter_edits_reach_the_daemon() {
    let api = start(|_| {}).await;
    let url = |path: &str| format!("{}{path}", api.base);
    let json = |v: serde_json::Value| Some(("application/json", v.to_string()));
    let body = serde_json::json!({"mode": "aggregate", "max_rate": "5 Mbit/s", "priority": 7});
    let (status, _) = call(
        "PUT",
        url("/api/v1/shaper/scenarios/backup"),
        Some(TOKEN),
        json(body),
    )
    .await;
    assert_eq!(status, 200);
    let body = serde_json::json!({"scenario": "backup", "destination_port": [22, "8000-8080"]});
    let (status, _) = call(
        "POST",
        url("/api/v1/shaper/filters?at=0"),
        Some(TOKEN),
        json(body),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = call("DELETE", url("/api/v1/shaper/filters/3"), Some(TOKEN), None).await;
    assert_eq!(status, 200);
    let (status, _) = call(
        "DELETE",
        url("/api/v1/shaper/scenarios/backup"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let fields = |v: serde_json::Value| v.as_object().cloned().unwrap();
    assert_eq!(
        *api.stand.edits.lock().unwrap(),
        [
            ShaperEdit::PutScenario {
                name: "backup".into(),
                fields: fields(
                    serde_json::json!({"mode": "aggregate", "max_rate": "5 Mbit/s", "priority": 7})
                ),
            },
            ShaperEdit::AddFilter {
                at: Some(0),
                fields: fields(
                    serde_json::json!({"scenario": "backup", "destination_port": [22, "8000-8080"]})
                ),
            },
            ShaperEdit::DeleteFilter { index: 3 },
            ShaperEdit::DeleteScenario {
                name: "backup".into()
            },
        ]
    );
    // Unknown fields and wrong types are refused before the daemon sees them.
    let body = serde_json::json!({"max_rate": "5 Mbit/s", "turbo": true});
    let (status, err) = call(
        "PUT",
        url("/api/v1/shaper/scenarios/x"),
        Some(TOKEN),
        json(body),
    )
    .await;
    assert_eq!((status, code(&err)), (422, "invalid_value"), "{err}");
    let (status, err) = call(
        "POST",
        url("/api/v1/shaper/filters"),
        Some(TOKEN),
        json(serde_json::json!({})),
    )
    .await;
    assert_eq!(status, 422, "a filter names its scenario: {err}");
    assert_eq!(api.stand.edits.lock().unwrap().len(), 4);
    let (status, err) = call("GET", url("/api/v1/shaper"), Some(TOKEN), None).await;
    assert_eq!((status, code(&err)), (404, "not_found"));
    api.server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn metrics_are_openmetrics_text() {
    let api = start(|_| {}).await;
    let (status, body) = call("GET", format!("{}/metrics", api.base), Some(TOKEN), None).await;
    assert_eq!(status, 200);
    let text = body.as_str().unwrap();
    assert!(text.contains("wsx_uptime_seconds "), "{text}");
    assert!(
        text.contains("wsx_sessions_opened_total{route=\"tunnel\"} 0"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    api.server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn requests_beyond_the_concurrency_limit_are_refused_not_queued() {
    let api = start(|c| c.max_concurrent = 1).await;
    // Many at once: some are served, the rest refused as busy, none hangs or fails otherwise.
    let calls: Vec<_> = (0..16)
        .map(|_| {
            tokio::spawn(call(
                "GET",
                format!("{}/metrics", api.base),
                Some(TOKEN),
                None,
            ))
        })
        .collect();
    let mut served = 0;
    for c in calls {
        let (status, body) = c.await.unwrap();
        match status {
            200 => served += 1,
            503 => assert_eq!(code(&body), "busy"),
            other => panic!("{other}: {body}"),
        }
    }
    assert!(served >= 1);
    api.server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn tls_serves_the_api_to_a_client_that_trusts_the_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let (cert, key) = (dir.path().join("api.crt"), dir.path().join("api.key"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
    let tls = wsx_api::TlsFiles {
        cert: cert.clone(),
        key,
    };
    let api = start(|c| c.tls = Some(tls)).await;
    let url = format!("https://{}/api/v1/status", api.server.local_addr());
    let pem = std::fs::read(&cert).unwrap();
    let (trusted, untrusted) = tokio::task::spawn_blocking(move || {
        let call = |roots: ureq::tls::RootCerts| {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .tls_config(ureq::tls::TlsConfig::builder().root_certs(roots).build())
                .build()
                .into();
            agent
                .get(&url)
                .header("Authorization", format!("Bearer {TOKEN}"))
                .call()
                .map(|r| r.status().as_u16())
        };
        let certs: Vec<_> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        (
            call(ureq::tls::RootCerts::Specific(Arc::new(certs))),
            call(ureq::tls::RootCerts::WebPki),
        )
    })
    .await
    .unwrap();
    assert_eq!(trusted.unwrap(), 200);
    assert!(
        untrusted.is_err(),
        "a client that does not trust the certificate gets nothing"
    );
    api.server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    let api = start(|c| c.header_timeout = Duration::from_millis(500)).await;
    let addr = api.server.local_addr();
    let closed = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let started = std::time::Instant::now();
        let mut buf = Vec::new();
        // The server answers 408 or just closes; either way the read ends.
        let _ = s.read_to_end(&mut buf);
        started.elapsed()
    })
    .await
    .unwrap();
    assert!(closed < Duration::from_secs(5), "held for {closed:?}");
    // And the server still serves others.
    let (status, _) = call("GET", format!("http://{addr}/api/v1/health"), None, None).await;
    assert_eq!(status, 200);
    api.server.shutdown(Duration::from_secs(1)).await;
}

/// The dashboard is served without a token (it holds no data), from this origin only
/// (its policy allows nothing else), and `/` leads to it; every file the page names is
/// served with its type.
#[tokio::test]
async fn the_dashboard_is_served_without_a_token_and_from_this_origin_only() {
    let api = start(|_| {}).await;
    let base = api.base.clone();
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(Duration::from_secs(20)))
            .build()
            .into();
        let get = |path: &str| agent.get(format!("{base}{path}")).call().unwrap();
        for path in ["/", "/dashboard"] {
            let response = get(path);
            assert_eq!(response.status().as_u16(), 308, "{path}");
            assert_eq!(response.headers()["location"], "/dashboard/", "{path}");
        }
        let mut page = get("/dashboard/");
        assert_eq!(page.status().as_u16(), 200);
        let headers = page.headers().clone();
        assert!(
            headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        let policy = headers["content-security-policy"].to_str().unwrap();
        for rule in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
        ] {
            assert!(policy.contains(rule), "{policy}");
        }
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let html = page.body_mut().read_to_string().unwrap();
        let named: Vec<&str> = html
            .split(['"', '\''])
            .filter(|s| s.starts_with("/dashboard/") && s.len() > "/dashboard/".len())
            .collect();
        assert_eq!(named, ["/dashboard/app.css", "/dashboard/app.js"], "{html}");
        for (path, kind) in [
            ("/dashboard/app.css", "text/css"),
            ("/dashboard/app.js", "text/javascript"),
        ] {
            let mut response = get(path);
            assert_eq!(response.status().as_u16(), 200, "{path}");
            let content_type = response.headers()["content-type"].to_str().unwrap();
            assert!(content_type.starts_with(kind), "{path}: {content_type}");
            assert!(!response.body_mut().read_to_string().unwrap().is_empty());
        }
        // The script reads the API with a header, never with the token in a URL.
        let script = get("/dashboard/app.js")
            .body_mut()
            .read_to_string()
            .unwrap();
        assert!(script.contains("Authorization: 'Bearer ' + token"));
        assert!(!script.contains("?token") && !script.contains("&token"));
    })
    .await
    .unwrap();
    api.server.shutdown(Duration::from_secs(1)).await;
}
