// The wsx dashboard: reads the gateway's API every second with the token typed at sign-in
// (kept in this tab's sessionStorage, sent as an Authorization header, never in a URL) and
// draws what it reads. Rates are differences of the API's counters between two readings;
// the charts keep the last five minutes the page has seen.
'use strict';

const API = '/api/v1';
const EVERY_MS = 1000;
const HISTORY_S = 300;
const SESSIONS_SHOWN = 50;
const TOKEN_KEY = 'wsx-token';

const $ = (id) => document.getElementById(id);

class Unauthorized extends Error {}

let token = sessionStorage.getItem(TOKEN_KEY);
let timer = null;
let previous = null; // { at, tunnels: Map(peer -> tunnel counters), compression: Map }
const series = { sent: [], received: [], rtt: [], loss: [], fec: [], ratio: [] };

async function api(path, options = {}) {
  const response = await fetch(API + path, {
    ...options,
    cache: 'no-store',
    headers: { Authorization: 'Bearer ' + token },
  });
  if (response.status === 401) throw new Unauthorized('invalid token');
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    const error = new Error(body?.error?.message ?? response.statusText);
    error.status = response.status;
    throw error;
  }
  return response.status === 204 ? null : response.json();
}

// ---- Sign-in -----------------------------------------------------------------------------

function showLogin(message) {
  stop();
  token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  $('dashboard').hidden = true;
  $('logout').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message ?? '';
  $('token').value = '';
  $('token').focus();
}

async function signIn(candidate) {
  token = candidate;
  try {
    await api('/status');
  } catch (e) {
    showLogin(e instanceof Unauthorized ? 'That token is not accepted.' : 'No answer: ' + e.message);
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $('login').hidden = true;
  $('dashboard').hidden = false;
  $('logout').hidden = false;
  start();
}

function start() {
  stop();
  tick();
  timer = setInterval(tick, EVERY_MS);
}

function stop() {
  if (timer !== null) clearInterval(timer);
  timer = null;
}

// ---- Reading -----------------------------------------------------------------------------

async function tick() {
  try {
    const [status, peers, sessions, shaper] = await Promise.all([
      api('/status'),
      api('/peers'),
      api('/sessions?limit=' + SESSIONS_SHOWN),
      api('/shaper').catch((e) => (e.status === 404 ? null : Promise.reject(e))),
    ]);
    $('problem').textContent = '';
    record(peers);
    renderGateway(status);
    renderPeers(peers);
    renderCounts(status, sessions);
    renderSessions(sessions);
    renderShaper(shaper);
    for (const [name, unit] of Object.entries(UNITS)) chart($('chart-' + name), series[name], unit);
  } catch (e) {
    if (e instanceof Unauthorized) return showLogin('The token is no longer accepted.');
    $('problem').textContent = 'The gateway did not answer: ' + e.message;
  }
}

// Counters of the peers' tunnels, summed; a tunnel replaced since the last reading starts
// from zero, so a counter that went down is read as new from zero.
function record(peers) {
  const at = performance.now() / 1000;
  const now = { at, tunnels: new Map(), compression: new Map() };
  for (const p of peers) {
    if (p.tunnel) now.tunnels.set(p.name, p.tunnel);
    now.compression.set(p.name, p.compression);
  }
  if (previous) {
    const dt = at - previous.at;
    const grew = (a, b) => (b >= a ? b - a : b);
    let sent = 0, received = 0, lost = 0, tracked = 0, repaired = 0, plain = 0, wire = 0;
    for (const [name, t] of now.tunnels) {
      const before = previous.tunnels.get(name) ?? { bytes_sent: 0, bytes_received: 0,
        packets_lost: 0, data_packets_sent: 0, ack_only_packets_sent: 0,
        fec: { recovered: 0, recovered_by_peer: 0 } };
      sent += grew(before.bytes_sent, t.bytes_sent);
      received += grew(before.bytes_received, t.bytes_received);
      // The path's loss: what was resent and what the peer rebuilt from parity.
      lost += grew(before.packets_lost, t.packets_lost)
        + grew(before.fec.recovered_by_peer, t.fec.recovered_by_peer);
      // Over the packets tracked for loss: data and ACK-only alike.
      tracked += grew(before.data_packets_sent, t.data_packets_sent)
        + grew(before.ack_only_packets_sent, t.ack_only_packets_sent);
      // Repairs both ways: the peer's of our packets, and ours of its.
      repaired += grew(before.fec.recovered, t.fec.recovered)
        + grew(before.fec.recovered_by_peer, t.fec.recovered_by_peer);
    }
    for (const [name, c] of now.compression) {
      const before = previous.compression.get(name) ?? { plain_sent: 0, wire_sent: 0 };
      plain += grew(before.plain_sent, c.plain_sent);
      wire += grew(before.wire_sent, c.wire_sent);
    }
    const rtts = [...now.tunnels.values()].map((t) => t.rtt_seconds * 1000);
    push('sent', at, (sent * 8) / dt);
    push('received', at, (received * 8) / dt);
    push('rtt', at, rtts.length ? Math.max(...rtts) : null);
    push('loss', at, tracked > 0 ? (100 * lost) / tracked : null);
    push('fec', at, repaired / dt);
    push('ratio', at, wire > 0 ? plain / wire : null);
  }
  previous = now;
}

function push(name, at, value) {
  const s = series[name];
  s.push([at, value]);
  while (s.length && s[0][0] < at - HISTORY_S) s.shift();
}

// ---- Rendering ---------------------------------------------------------------------------

function cell(text, className) {
  const td = document.createElement('td');
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function row(cells) {
  const tr = document.createElement('tr');
  for (const c of cells) tr.append(typeof c === 'string' ? cell(c) : c);
  return tr;
}

function fill(table, rows) {
  table.tBodies[0].replaceChildren(...rows);
}

const bits = (bps) => {
  if (bps == null || !Number.isFinite(bps)) return '–';
  for (const [scale, unit] of [[1e9, 'Gbit/s'], [1e6, 'Mbit/s'], [1e3, 'kbit/s']]) {
    if (bps >= scale) return (bps / scale).toFixed(bps >= 10 * scale ? 1 : 2) + ' ' + unit;
  }
  return bps.toFixed(0) + ' bit/s';
};
const bytes = (n) => {
  for (const [scale, unit] of [[2 ** 30, 'GiB'], [2 ** 20, 'MiB'], [2 ** 10, 'KiB']]) {
    if (n >= scale) return (n / scale).toFixed(1) + ' ' + unit;
  }
  return n + ' B';
};
const seconds = (s) =>
  s >= 3600 ? (s / 3600).toFixed(1) + ' h' : s >= 60 ? (s / 60).toFixed(1) + ' min' : s.toFixed(0) + ' s';
const percent = (x) => (x == null ? '–' : x.toFixed(x < 1 ? 2 : 1) + ' %');

const UNITS = {
  sent: bits,
  received: bits,
  rtt: (ms) => (ms == null ? '–' : ms.toFixed(1) + ' ms'),
  loss: percent,
  fec: (x) => (x == null ? '–' : x.toFixed(1) + ' /s'),
  ratio: (x) => (x == null ? '–' : x.toFixed(2) + '×'),
};

function renderGateway(status) {
  $('gateway').textContent =
    `${status.version} · up ${seconds(status.uptime_seconds)} · key ${status.public_key.slice(0, 8)}…`;
}

// The path's loss since the tunnel started, and in brackets what FEC left to resend.
function pathLoss(t) {
  if (t.data_packets_sent + t.ack_only_packets_sent === 0) return '–';
  return `${percent(100 * t.loss_ratio)} (${percent(100 * t.unrepaired_loss_ratio)})`;
}

function renderPeers(peers) {
  fill($('peers'), peers.map((p) => {
    const t = p.tunnel;
    const state = cell(p.healthy ? 'up' : 'down', p.healthy ? 'up' : 'down');
    const bypass = p.bypass_forced ? 'forced' : p.healthy ? 'no' : 'yes: peer down';
    const ratio = p.compression.ratio_sent;
    return row([
      p.name,
      state,
      bypass,
      t ? (t.rtt_seconds * 1000).toFixed(1) + ' ms' : '–',
      t ? pathLoss(t) : '–',
      t ? bytes(t.bytes_sent) : '–',
      t ? bytes(t.bytes_received) : '–',
      t ? String(t.fec.recovered + t.fec.recovered_by_peer) : '–',
      ratio == null ? '–' : ratio.toFixed(2) + '×',
    ]);
  }));
}

function renderCounts(status, page) {
  const s = status.sessions;
  const items = [
    ['Live', `${s.total} of ${status.session_capacity}`],
    ['Through the tunnel', s.tunnel],
    ['From the peer', s.inbound],
    ['Bypassed', s.bypass],
    ['Direct', s.direct],
    ['Opened since start', status.totals.sessions_opened.total],
    ['Reset', status.totals.sessions_reset],
  ];
  $('counts').replaceChildren(...items.flatMap(([k, v]) => {
    const dt = document.createElement('dt');
    const dd = document.createElement('dd');
    dt.textContent = k;
    dd.textContent = String(v);
    return [dt, dd];
  }));
  // Live counts come from the sessions read; when there are more than were read, they
  // are lower bounds.
  const live = new Map();
  for (const session of page.sessions) live.set(session.entry, (live.get(session.entry) ?? 0) + 1);
  const atLeast = page.total > page.sessions.length ? '≥ ' : '';
  const entries = new Set([...Object.keys(status.totals.sessions_by_entry), ...live.keys()]);
  fill($('entries'), [...entries].sort().map((e) => row([
    e, atLeast + String(live.get(e) ?? 0), String(status.totals.sessions_by_entry[e] ?? 0),
  ])));
}

function renderSessions(page) {
  $('sessions-shown').textContent =
    page.total > page.sessions.length ? `(${page.sessions.length} of ${page.total})` : `(${page.total})`;
  fill($('sessions'), page.sessions.map((s) => {
    const kill = document.createElement('button');
    kill.type = 'button';
    kill.textContent = 'Kill';
    kill.title = 'Reset both sides of this session';
    kill.dataset.session = String(s.id);
    kill.addEventListener('click', () => killSession(s.id, kill));
    const action = document.createElement('td');
    action.append(kill);
    return row([String(s.id), s.entry, s.route, s.client, s.destination, seconds(s.age_seconds),
      bytes(s.bytes_from_client), bytes(s.bytes_from_server), action]);
  }));
}

async function killSession(id, button) {
  button.disabled = true;
  try {
    await api('/sessions/' + id, { method: 'DELETE' });
    tick();
  } catch (e) {
    if (e instanceof Unauthorized) return showLogin('The token is no longer accepted.');
    $('problem').textContent = `Session ${id} was not killed: ${e.message}`;
    button.disabled = false;
  }
}

function renderShaper(shaper) {
  $('shaper-card').hidden = shaper === null;
  if (shaper === null) return;
  $('shaper-rate').textContent = `(${bits(shaper.rate_bps)} of ${bits(shaper.wan_rate_bps)})`;
  fill($('scenarios'), shaper.scenarios.map((s) => row([
    s.name, s.mode, String(s.priority), bits(s.min_rate_bps), bits(s.max_rate_bps),
    bits(s.rate_bps), String(s.flows), s.min_met == null ? '–' : s.min_met ? 'yes' : 'no',
  ])));
}

// A line over what the page has seen, up to the last five minutes, scaled to its highest
// value, with the latest value written at the top right.
function chart(element, points, format) {
  const W = 300, H = 100, PAD = 14;
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  const add = (name, attributes, text) => {
    const node = document.createElementNS(svg.namespaceURI, name);
    for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  const known = points.filter(([, v]) => v != null && Number.isFinite(v));
  const latest = known.length ? known[known.length - 1][1] : null;
  const top = Math.max(...known.map(([, v]) => v), 0) || 1;
  const end = points.length ? points[points.length - 1][0] : 0;
  const span = Math.min(HISTORY_S, Math.max(10, end - (points.length ? points[0][0] : end)));
  const x = (t) => W - ((end - t) / span) * W;
  const y = (v) => H - 2 - (v / top) * (H - PAD - 4);
  add('line', { class: 'grid', x1: 0, x2: W, y1: H - 2, y2: H - 2 });
  add('line', { class: 'grid', x1: 0, x2: W, y1: PAD + 2, y2: PAD + 2 });
  if (known.length > 1) {
    const line = known.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
    add('polygon', { class: 'area', points: `${x(known[0][0]).toFixed(1)},${H - 2} ${line} ${x(end).toFixed(1)},${H - 2}` });
    add('polyline', { class: 'line', points: line });
  }
  add('text', { x: 2, y: 11 }, 'max ' + format(top));
  add('text', { x: 2, y: H - 5 }, `last ${seconds(span)}`);
  add('text', { class: 'value', x: W - 2, y: 12, 'text-anchor': 'end' }, format(latest));
  element.replaceChildren(svg);
  element.dataset.latest = latest == null ? '' : String(latest);
}

// ---- Start -------------------------------------------------------------------------------

document.addEventListener('DOMContentLoaded', () => {
  $('login').addEventListener('submit', (event) => {
    event.preventDefault();
    signIn($('token').value.trim());
  });
  $('logout').addEventListener('click', () => showLogin());
  if (token) signIn(token);
  else showLogin();
});
