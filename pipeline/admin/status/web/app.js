// The status page: polls /status.json and draws it. Everything the page
// shows is built with DOM calls and textContent (never HTML from data),
// and it loads nothing the binary does not serve (docs/architecture.md#status-page).
'use strict';
(() => {
  const POLL_MS = 2000;
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const PALETTE = ['#2b6cb0', '#dd6b20', '#2f855a', '#c53030', '#6b46c1', '#b7791f', '#319795', '#d53f8c',
    '#4a5568', '#718096', '#9c4221', '#276749'];

  let last = null; // the last status read
  let pending = null; // the action waiting for its confirmation
  const rendered = {}; // section -> what it was last drawn from

  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    return fill(document.createElement(tag), attrs, children);
  }
  function svg(tag, attrs, ...children) {
    return fill(document.createElementNS(SVG_NS, tag), attrs, children);
  }
  function fill(e, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.setAttribute('class', v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const fmtInt = (v) => (v === null || v === undefined ? '–' : Math.round(v).toLocaleString('en-US'));
  function fmtRate(v) {
    if (v === null || v === undefined) return '–';
    return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + '/s';
  }
  function fmtSeconds(s) {
    if (s === null || s === undefined) return '–';
    if (s === 0) return '0 s';
    if (s < 1e-3) return (s * 1e6).toFixed(0) + ' µs';
    if (s < 1) return (s * 1e3).toPrecision(3) + ' ms';
    if (s < 120) return s.toFixed(1) + ' s';
    if (s < 7200) return (s / 60).toFixed(1) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  }
  const fmtTime = (iso) => new Date(iso).toLocaleString('en-GB', { hour12: false });
  // fmtSpan prints a span of time in whole seconds or minutes.
  const fmtSpan = (s) => (s < 120 ? Math.round(s) + ' s' : Math.round(s / 60) + ' min');
  const plural = (n, one, many) => fmtInt(n) + ' ' + (Math.round(n) === 1 ? one : many);

  // prose turns text with `code` spans into nodes.
  function prose(text) {
    return text.split('`').map((part, i) => (i % 2 ? el('code', {}, part) : part));
  }
  const th = (text, num) => el('th', { class: num ? 'num' : '' }, text);

  // once draws a section only when what it shows changed, so a button
  // is not replaced under the pointer at every poll.
  function once(section, data, draw) {
    const k = JSON.stringify(data);
    if (rendered[section] === k) return;
    rendered[section] = k;
    draw();
  }

  function render(st) {
    const waited = st.sampling.window_taken_seconds;
    $('summary').replaceChildren(
      'components: ', el('span', { id: 'components' }, (st.components || []).join(', ') || '–'),
      ' · updated ', el('time', { id: 'updated', datetime: st.at }, new Date(st.at).toLocaleTimeString('en-GB', { hour12: false })),
      ` · a sample every ${fmtSpan(st.sampling.interval_seconds)}, rates and quantiles over the last ${fmtSpan(st.sampling.window_seconds)}`,
      waited > 0 && waited < st.sampling.window_seconds - 1 ? ` (${fmtSpan(waited)} so far)` : '');
    const note = $('actions-note');
    note.hidden = false;
    note.dataset.enabled = String(st.actions_enabled);
    note.replaceChildren(...prose(st.actions_enabled
      ? 'Actions (unpark, redrive) ask for a confirmation and the operator token (ONCEFLOW_ADMIN_TOKEN), sent with that request only.'
      : 'Actions are disabled: this process has no ONCEFLOW_ADMIN_TOKEN. Set it to unpark partitions and redrive DLQ ' +
        'records from this page; meanwhile `onceflow projections unpark` and `onceflow dlq redrive` do it.'));
    const un = $('unavailable');
    un.hidden = !(st.unavailable && st.unavailable.length);
    un.textContent = un.hidden ? '' : 'Could not read: ' + st.unavailable.join(', ') + ' (the process\'s log says why).';

    renderFlow(st);
    renderLag(st);
    renderOutbox(st);
    renderVerify(st);
    once('parked', [st.parked, st.actions_enabled], () => renderParked(st));
    once('dlq', [st.dlq.sent, st.dlq.topics.map((t) => ({ ...t, read_at: null })), st.actions_enabled], () => renderDLQ(st));
  }

  // ---- flow ----

  function renderFlow(st) {
    const hist = Object.fromEntries(st.history.rates.map((r) => [r.metric, r.per_second]));
    const parts = [];
    for (const s of st.flow) {
      parts.push(stageCard(s, hist));
      if (s.into) parts.push(queueBox(s.into));
    }
    $('flow').replaceChildren(...parts);
  }

  function stageCard(s, hist) {
    const card = el('div', { class: 'stage' + (s.present ? '' : ' absent'), 'data-stage': s.name }, el('h3', {}, s.name));
    if (!s.present) {
      card.append(el('p', { class: 'dim' }, 'not in this process'));
      return card;
    }
    const rates = el('table', { class: 'rates' }, el('tr', {}, th(''), th('per second', true), th('total', true)));
    for (const r of s.rates) {
      rates.append(el('tr', { class: 'rate', 'data-metric': r.metric, title: r.metric },
        el('td', {}, r.title), el('td', { class: 'num per-second' }, fmtRate(r.per_second)),
        el('td', { class: 'num total' }, fmtInt(r.total))));
      for (const b of r.by || []) {
        rates.append(el('tr', { class: 'by', 'data-metric': r.metric, 'data-label': r.label, 'data-value': b.value },
          el('td', {}, r.label + ' ' + b.value), el('td', { class: 'num per-second' }, fmtRate(b.per_second)),
          el('td', { class: 'num total' }, fmtInt(b.total))));
      }
    }
    const latencies = el('table', { class: 'latencies' }, el('tr', {}, th(''), th('p50', true), th('p99', true)));
    for (const l of s.latencies) {
      const idle = !(l.count > 0);
      latencies.append(el('tr', { class: 'latency', 'data-metric': l.metric, title: `${l.metric}: ${fmtInt(l.count)} in the window, p90 ${fmtSeconds(l.p90_seconds)}, mean ${fmtSeconds(l.mean_seconds)}` },
        el('td', {}, l.title),
        el('td', { class: 'num p50' }, idle ? 'idle' : fmtSeconds(l.p50_seconds)),
        el('td', { class: 'num p99' }, idle ? '' : fmtSeconds(l.p99_seconds))));
    }
    for (const f of s.facts || []) {
      card.append(el('p', { class: 'fact', 'data-metric': f.metric, title: f.metric }, `${f.title}: ${f.value}`));
    }
    card.append(rates, latencies);
    const first = s.rates[0];
    if (first && hist[first.metric]) card.append(sparkline(hist[first.metric], first.title));
    return card;
  }

  function queueBox(q) {
    const outbox = q.name === 'outbox';
    const groups = (q.groups || []).map((g) => `${g.group} ${fmtInt(g.lag)} behind`).join(', ');
    return el('div', { class: 'queue', 'data-queue': q.name },
      el('span', { class: 'arrow' }, '↓'),
      el('span', { class: 'name' }, q.name || 'topic'),
      el('span', { class: 'depth' }, q.rows === null ? '–' : fmtInt(q.rows) + (outbox ? ' rows waiting' : ' behind')),
      el('span', {}, q.seconds === null ? '' : 'oldest ' + fmtSeconds(q.seconds)),
      el('span', { class: 'dim' }, groups));
  }

  function sparkline(values, title) {
    const W = 150, H = 28;
    const vs = values.filter((v) => v !== null);
    const top = Math.max(1e-9, ...vs);
    const pts = [];
    values.forEach((v, i) => {
      if (v === null) return;
      pts.push(`${(W * i / Math.max(1, values.length - 1)).toFixed(1)},${(H - 2 - (H - 4) * v / top).toFixed(1)}`);
    });
    return svg('svg', { class: 'spark', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': title + ' per second, last samples' },
      svg('title', {}, `${title}: up to ${fmtRate(vs.length ? top : null)} over the samples kept`),
      svg('polyline', { points: pts.join(' ') }));
  }

  // ---- lag ----

  function renderLag(st) {
    const box = $('lag');
    if (!st.lag.exported) {
      $('lag-note').textContent = '';
      box.replaceChildren(el('p', { class: 'dim' }, ...prose(
        'This process exports no consumer lag (ONCEFLOW_LAG_EXPORT=off, or no consumer to measure yet): ' +
        '`onceflow lag` shows it, and so does the page of a process that exports it.')));
      return;
    }
    $('lag-note').textContent = `records behind the last stable offset and the age of the oldest not read; plots: up to the last ${fmtSpan(st.sampling.history_seconds)}`;
    const groups = [];
    for (const g of st.lag.groups) {
      const series = st.history.lag.filter((s) => s.group === g.group);
      const color = (topic, part) => {
        const i = series.findIndex((s) => s.topic === topic && s.partition === part);
        return PALETTE[(i < 0 ? 0 : i) % PALETTE.length];
      };
      const rows = g.partitions.map((p) => {
        const sw = el('span', { class: 'swatch' });
        sw.style.background = color(p.topic, p.partition);
        return el('tr', { class: p.parked ? 'parked' : '', 'data-group': g.group, 'data-topic': p.topic, 'data-partition': p.partition },
          el('td', {}, sw, p.topic), el('td', { class: 'num' }, p.partition),
          el('td', { class: 'num lag' }, fmtInt(p.lag)), el('td', { class: 'num lag-seconds' }, fmtSeconds(p.seconds)),
          el('td', { class: 'parked-reason' }, p.parked ? 'parked: ' + p.parked : ''));
      });
      const table = el('table', { class: 'lag-table' },
        el('tr', {}, th('topic'), th('partition', true), th('lag', true), th('age', true), th('')), rows);
      groups.push(el('div', { class: 'group', 'data-group': g.group },
        el('h3', {}, g.group, ' ', el('span', { class: 'dim' }, 'lag ',
          el('span', { class: 'sum', 'data-group': g.group }, fmtInt(g.sum)),
          g.max_seconds === null ? '' : ', oldest ' + fmtSeconds(g.max_seconds))),
        el('div', { class: 'plots' }, lagPlot(st, g.group, series, color), table)));
    }
    box.replaceChildren(...groups);
  }

  function niceCeil(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  // chart draws series of one value per sample time (null: none) over
  // the history.
  function chart(st, cls, label, series) {
    const W = 560, H = 170, L = 48, R = 10, T = 10, B = 22;
    // The plot spans the samples kept, at least a minute: the whole
    // history once the process is that old.
    const at = st.history.at;
    const now = at[at.length - 1];
    const span = Math.min(st.sampling.history_seconds, Math.max(60, now - at[0]));
    const from = now - span;
    let top = 0;
    for (const s of series) for (const v of s.values) if (v !== null && v > top) top = v;
    top = niceCeil(Math.max(top, 1));
    const x = (t) => L + (W - L - R) * (t - from) / (now - from);
    const y = (v) => T + (H - T - B) * (1 - v / top);
    const g = svg('svg', { class: 'plot ' + cls, viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img', 'aria-label': label },
      svg('line', { class: 'axis', x1: L, y1: y(0), x2: W - R, y2: y(0) }),
      svg('line', { class: 'axis', x1: L, y1: T, x2: L, y2: y(0) }),
      svg('text', { x: L - 4, y: T + 8, 'text-anchor': 'end' }, fmtInt(top)),
      svg('text', { x: L - 4, y: y(0), 'text-anchor': 'end' }, '0'));
    for (let i = 0; i <= 3; i++) {
      const t = from + span * i / 3;
      g.append(svg('text', { x: x(t), y: H - 6, 'text-anchor': i === 0 ? 'start' : i === 3 ? 'end' : 'middle' },
        i === 3 ? 'now' : '−' + fmtSpan(span - span * i / 3)));
    }
    for (const s of series) {
      let seg = [];
      const flush = () => {
        if (seg.length) g.append(svg('polyline', { ...s.attrs, stroke: s.color, points: seg.join(' '), 'data-points': seg.length }));
        seg = [];
      };
      s.values.forEach((v, i) => {
        if (v === null || at[i] < from) { flush(); return; }
        seg.push(`${x(at[i]).toFixed(1)},${y(v).toFixed(1)}`);
      });
      flush();
    }
    return g;
  }

  function lagPlot(st, group, series, color) {
    const p = chart(st, 'lag-plot', `lag of ${group} by partition`,
      series.map((s) => ({ values: s.lag, color: color(s.topic, s.partition), attrs: { 'data-topic': s.topic, 'data-partition': s.partition } })));
    p.setAttribute('data-group', group);
    return p;
  }

  // ---- outbox ----

  function renderOutbox(st) {
    const o = st.outbox;
    if (!o) {
      $('outbox').replaceChildren(el('p', { class: 'dim' }, ...prose(
        'This process runs no relay: the relays export the outbox\'s gauges (and `onceflow outbox status` shows its shards).')));
      return;
    }
    const row = (title, metric, text) => el('tr', { 'data-metric': metric }, el('td', {}, title), el('td', { class: 'num value' }, text));
    const table = el('table', {},
      row('rows waiting', 'onceflow_outbox_backlog_rows', fmtInt(o.backlog_rows)),
      row('oldest row waiting', 'onceflow_outbox_oldest_age_seconds', fmtSeconds(o.oldest_age_seconds)),
      row('dead rows (refused by the broker for good)', 'onceflow_outbox_dead_rows', fmtInt(o.dead_rows)),
      row('commands waiting for an outcome', 'onceflow_commands_pending', fmtInt(o.pending_commands)),
      row('oldest command waiting', 'onceflow_commands_oldest_pending_age_seconds', fmtSeconds(o.oldest_pending_age_seconds)));
    const plot = chart(st, 'outbox-plot', 'outbox rows waiting',
      [{ values: st.history.outbox_backlog_rows, color: PALETTE[0], attrs: {} }]);
    $('outbox').replaceChildren(el('div', { class: 'plots' }, plot, table));
  }

  // ---- the last verification ----

  function renderVerify(st) {
    const v = st.verify;
    if (!v) {
      $('verify').replaceChildren(el('p', { class: 'dim' }, ...prose(
        'No verification recorded: `onceflow verify -since 1h` audits a window and records its result here.')));
      return;
    }
    const when = new Date(v.last_run_timestamp_seconds * 1000).toISOString().replace(/\.\d+Z$/, 'Z');
    const found = v.findings.map((f) => `${f.stage} ${f.kind} ${fmtInt(f.count)}`).join('; ');
    const line = el('p', { 'data-metric': 'onceflow_verify_last_run_ok', class: v.ok ? 'value' : 'value warn' },
      `onceflow verify finished ${when}: ` + (v.ok ? 'nothing lost or doubled' : 'lost or doubled found') + (found ? '; ' + found : ''));
    $('verify').replaceChildren(line);
  }

  // ---- parked ----

  function renderParked(st) {
    const box = $('parked');
    if (!st.parked.read) {
      box.replaceChildren(el('p', { class: 'dim' }, ...prose(
        'This process has no database: the pages of the processes that have one (ingest, relay, projector) and `onceflow lag` show parked partitions.')));
      return;
    }
    const parts = [];
    if (!st.parked.partitions.length) {
      parts.push(el('p', { id: 'none-parked' }, 'No partition is parked.'));
    } else {
      const rows = st.parked.partitions.map((p) => el('tr', { class: 'parked', 'data-consumer': p.consumer, 'data-topic': p.topic, 'data-partition': p.partition },
        el('td', {}, p.consumer), el('td', {}, p.topic), el('td', { class: 'num' }, p.partition), el('td', { class: 'num' }, p.offset),
        el('td', { class: 'reason' }, p.reason), el('td', {}, fmtTime(p.since)),
        el('td', {}, el('button', {
          class: 'unpark danger', type: 'button', disabled: !st.actions_enabled,
          title: st.actions_enabled ? 'try the record again' : 'disabled: no ONCEFLOW_ADMIN_TOKEN',
          onclick: () => ask({
            text: `Unpark partition ${p.partition} of ${p.topic} for ${p.consumer}? Its projector tries the record at offset ${p.offset} ` +
              `again within seconds; if the cause (${p.reason}) is still there, it parks again. Fix the cause first (docs/projector.md).`,
            ok: 'Unpark', path: '/status/unpark', body: { consumer: p.consumer, topic: p.topic, partition: p.partition },
          }),
        }, 'Unpark'))));
      parts.push(el('p', { class: 'dim' }, ...prose('Nothing after the record is applied until an operator acts; fix the cause, then unpark. The detail: `onceflow lag`.')),
        el('table', { id: 'parked-table' },
          el('tr', {}, th('consumer'), th('topic'), th('partition', true), th('offset', true), th('reason'), th('since'), th('')), rows));
    }
    if (st.parked.retrying.length) {
      parts.push(el('h3', {}, 'Retrying (a transient error; nothing is skipped)'),
        el('table', { id: 'retrying-table' },
          el('tr', {}, th('consumer'), th('topic'), th('partition', true), th('class'), th('attempts', true), th('since')),
          st.parked.retrying.map((r) => el('tr', {}, el('td', {}, r.consumer), el('td', {}, r.topic), el('td', { class: 'num' }, r.partition),
            el('td', {}, r.class), el('td', { class: 'num' }, r.attempts), el('td', {}, fmtTime(r.since))))));
    }
    box.replaceChildren(...parts);
  }

  // ---- DLQ ----

  function renderDLQ(st) {
    const parts = [];
    if (st.dlq.sent === null) {
      parts.push(el('p', { class: 'dim' }, 'This process runs no processor: nothing it sent to the DLQ to count.'));
    } else {
      parts.push(el('h3', {}, 'Sent by this process\'s processors since they started ', el('span', { class: 'dim' }, '(onceflow_dlq_records_total)')));
      parts.push(st.dlq.sent.length
        ? el('table', { id: 'dlq-sent' }, el('tr', {}, th('reason'), th('records', true)),
          st.dlq.sent.map((r) => el('tr', { 'data-reason': r.reason }, el('td', {}, r.reason), el('td', { class: 'num records' }, fmtInt(r.records)))))
        : el('p', { id: 'dlq-sent-none' }, 'None.'));
    }
    for (const t of st.dlq.topics) {
      const redrive = (what, body) => el('button', {
        class: 'redrive danger', type: 'button', disabled: !st.actions_enabled,
        title: st.actions_enabled ? 'republish to ' + t.commands : 'disabled: no ONCEFLOW_ADMIN_TOKEN',
        onclick: () => ask({
          text: `Redrive ${what} of ${t.topic} to ${t.commands}? They are produced again as they came (key, value, headers, command id); ` +
            'a command handled meanwhile is recognized by its id and skipped, one that is still poison comes back to the DLQ.',
          ok: 'Redrive', path: '/status/redrive', body: { topic: t.topic, ...body },
        }),
      }, 'Redrive');
      const section = el('div', { class: 'dlq-topic', 'data-topic': t.topic },
        el('h3', {}, t.topic, ' ', el('span', { class: 'dim' }, 'holds ', el('span', { class: 'records' }, fmtInt(t.records)), t.records === 1 ? ' record' : ' records')));
      if (t.by_reason.length) {
        section.append(el('table', { class: 'dlq-reasons' }, el('tr', {}, th('reason'), th('records', true), th('')),
          t.by_reason.map((r) => el('tr', { 'data-reason': r.reason }, el('td', {}, r.reason), el('td', { class: 'num records' }, fmtInt(r.records)),
            el('td', {}, redrive(`every record with reason ${r.reason} (${fmtInt(r.records)})`, { reason: r.reason }))))));
        section.append(el('p', { class: 'dim' }, ...prose(`The newest ${plural(t.newest.length, 'record', 'records')}; their keys and command ids: \`onceflow dlq list\`.`)),
          el('table', { class: 'dlq-newest' },
            el('tr', {}, th('record'), th('time'), th('reason'), th('command type'), th('from'), th('')),
            t.newest.map((d) => {
              const b = redrive(`record ${d.record}`, { records: [d.record] });
              if (!d.redrivable) {
                b.disabled = true;
                b.title = 'its copy left part of the command out: produce it again from its source';
              }
              return el('tr', { 'data-record': d.record }, el('td', {}, d.record), el('td', {}, fmtTime(d.time)), el('td', {}, d.reason),
                el('td', {}, d.command_type || '–'), el('td', {}, d.source), el('td', {}, b));
            })));
      }
      parts.push(section);
    }
    $('dlq').replaceChildren(...parts);
  }

  // ---- actions ----

  function ask(action) {
    if (!last || !last.actions_enabled) return;
    pending = action;
    $('confirm-text').textContent = action.text;
    $('confirm-ok').textContent = action.ok;
    $('token').value = '';
    $('confirm').showModal();
    $('token').focus();
  }

  function showResult(cls, text) {
    const r = $('action-result');
    r.hidden = false;
    r.className = cls;
    r.textContent = text;
  }

  async function act() {
    const a = pending;
    pending = null;
    const token = $('token').value;
    $('token').value = '';
    $('confirm').close();
    if (!a) return;
    const headers = { 'Content-Type': 'application/json' };
    if (token) headers.Authorization = 'Bearer ' + token;
    try {
      const resp = await fetch(a.path, { method: 'POST', headers, body: JSON.stringify(a.body), cache: 'no-store', credentials: 'omit' });
      const text = await resp.text();
      let msg = text.trim();
      try { const j = JSON.parse(text); msg = j.detail || j.message || msg; } catch (_) { /* not JSON */ }
      if (resp.ok) showResult('ok', msg);
      else showResult('refused', `refused (${resp.status}): ${msg}`);
    } catch (e) {
      showResult('refused', 'the request failed: ' + e.message);
    }
    poll();
  }

  function cancel() {
    pending = null;
    $('token').value = '';
    $('confirm').close();
    showResult('', 'canceled: nothing was done');
  }

  // ---- polling ----

  let inflight = null;
  function poll() {
    if (!inflight) inflight = read().finally(() => { inflight = null; });
    return inflight;
  }
  async function read() {
    try {
      const resp = await fetch('/status.json', { cache: 'no-store' });
      if (!resp.ok) throw new Error('HTTP ' + resp.status);
      last = await resp.json();
      render(last);
      document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
    } catch (e) {
      $('summary').textContent = 'cannot read /status.json: ' + e.message;
    }
  }
  async function loop() {
    await poll();
    setTimeout(loop, POLL_MS);
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('confirm-ok').addEventListener('click', act);
    $('confirm-cancel').addEventListener('click', cancel);
    $('confirm').addEventListener('cancel', () => { pending = null; $('token').value = ''; });
    $('token').addEventListener('keydown', (e) => { if (e.key === 'Enter') { e.preventDefault(); act(); } });
    loop();
  });
})();
