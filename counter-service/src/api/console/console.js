// The counter-service console: one ES module, no library, no build step.
//
// Owners and keys are user data. Every node here is made with
// createElement / createElementNS and filled with textContent (or text
// nodes) and setAttribute; markup is never parsed from data. Every part
// of a URL is passed through encodeURIComponent. The page's CSP allows
// this file and the API of this origin, nothing else.

const TOKEN_KEY = 'counter-service.token';
const SVG = 'http://www.w3.org/2000/svg';
const TOP_PAGE = 20;
const HEALTH_EVERY_MS = 3000;
/** Intervals the health page's requests/s line spans (3 minutes). */
const SPARK_INTERVALS = 60;
/** The cache hit ratio's window: the page's scrapes of the last 5 minutes
 *  (since the page opened, while it is younger), as the dashboard's rate()
 *  over a window. Never since the service started: that ratio hides a
 *  cache that stopped serving behind the hours it served. */
const CACHE_WINDOW_MS = 5 * 60 * 1000;
const HOUR_MS = 3600 * 1000;
const DAY_MS = 24 * HOUR_MS;

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  info: null, // GET /v1/namespaces
  timers: [],
  streams: [], // AbortControllers of the page's live streams
};
/** A live stream's pauses before it reconnects: from 1 s, doubling to 10 s. */
const RECONNECT_MS = [1000, 10000];

// ---------------------------------------------------------------- DOM

/** An element with attributes and children (nodes, or text). */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

/** An SVG element with attributes and children. */
function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    node.setAttribute(name, value === true ? '' : String(value));
  }
}

function append(node, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** A link to a console route, its parts encoded. */
function link(text, parts, attrs = {}) {
  return el('a', { href: route(...parts), ...attrs }, text);
}

function route(...parts) {
  return '#/' + parts.map((part) => encodeURIComponent(String(part))).join('/');
}

function enc(value) {
  return encodeURIComponent(String(value));
}

function table(attrs, headings, rows) {
  return el('table', attrs,
    el('thead', {}, el('tr', {}, headings.map((h) => el('th', { scope: 'col' }, h)))),
    el('tbody', {}, rows));
}

function formatNumber(value) {
  return typeof value === 'number' ? value.toLocaleString('en-US') : String(value);
}

function formatTime(value) {
  if (!value) return '—';
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return String(value);
  return date.toISOString().slice(0, 16).replace('T', ' ') + ' UTC';
}

// ---------------------------------------------------------------- API

class ApiError extends Error {
  constructor(status, problem, text) {
    const detail = problem && typeof problem === 'object'
      ? [problem.title, problem.detail].filter(Boolean).join(': ')
      : text;
    super(`${status}${detail ? ' ' + detail : ''}`);
    this.status = status;
    this.problem = problem;
  }
}

/** `method path`, JSON in and out; a problem answer throws an ApiError
 *  unless its status is in `accept`. */
async function api(path, { method = 'GET', body, accept = [] } = {}) {
  const headers = { Accept: 'application/json' };
  if (state.token) headers.Authorization = 'Bearer ' + state.token;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'omit',
    cache: 'no-store',
  });
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!response.ok && !accept.includes(response.status)) {
    throw new ApiError(response.status, json, text);
  }
  return { status: response.status, json, text };
}

async function getJson(path) {
  return (await api(path)).json;
}

function showError(error) {
  const box = document.getElementById('error');
  if (!error) {
    box.hidden = true;
    box.textContent = '';
    return;
  }
  box.textContent = error instanceof Error ? error.message : String(error);
  box.hidden = false;
}

// ---------------------------------------------------------------- token

/** The namespaces and scopes of the token in use, or null (401). */
async function loadInfo() {
  const scopes = document.getElementById('scopes');
  try {
    state.info = await getJson('/v1/namespaces');
    const who = state.token ? 'token' : 'open service';
    scopes.textContent = `${who}: ${state.info.scopes.join(', ')}`;
  } catch (error) {
    state.info = null;
    scopes.textContent = error.status === 401 ? 'no valid token' : '';
    if (error.status !== 401) throw error;
  }
  return state.info;
}

function hasScope(scope) {
  return Boolean(state.info && state.info.scopes.includes(scope));
}

function setupToken() {
  const form = document.getElementById('token-form');
  const input = document.getElementById('token');
  input.value = state.token;
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    state.token = input.value.trim();
    if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token);
    else sessionStorage.removeItem(TOKEN_KEY);
    state.info = null;
    render();
  });
  document.getElementById('token-forget').addEventListener('click', () => {
    input.value = '';
    state.token = '';
    sessionStorage.removeItem(TOKEN_KEY);
    state.info = null;
    render();
  });
}

// ---------------------------------------------------------------- routing

function parseHash() {
  const hash = location.hash.replace(/^#\/?/, '');
  if (!hash) return [];
  try {
    return hash.split('/').map(decodeURIComponent);
  } catch {
    return [];
  }
}

function stopTimers() {
  for (const timer of state.timers) clearInterval(timer);
  state.timers = [];
  for (const stream of state.streams) stream.abort();
  state.streams = [];
}

async function render() {
  stopTimers();
  showError(null);
  const main = document.getElementById('main');
  const view = el('section', { class: 'view' });
  main.replaceChildren(view);
  const [page, ...args] = parseHash();
  for (const a of document.querySelectorAll('#nav a')) {
    const target = a.getAttribute('href').replace(/^#\/?/, '');
    a.classList.toggle('current', target === (page === 'top' || page === 'owner' ? '' : page || ''));
  }
  try {
    if (!state.info) await loadInfo();
    if (page === 'health') return await healthPage(view);
    if (!state.info) return needToken(view);
    if (page === 'top') return await topPage(view, args);
    if (page === 'owner') return await ownerPage(view, args);
    if (page === 'checks') return await checksPage(view);
    return namespacesPage(view);
  } catch (error) {
    showError(error);
  }
}

function needToken(view) {
  append(view, [
    el('h1', {}, 'A token, please'),
    el('p', { 'data-test': 'need-token' },
      'This service asks for a Bearer token: type it in the box above. ',
      'It stays in this tab only. The health page needs none.'),
  ]);
}

function namespaceOf(name) {
  const found = state.info.namespaces.find((ns) => ns.name === name);
  if (!found) throw new Error(`no namespace “${name}” for this token`);
  return found;
}

// ---------------------------------------------------------------- 1. namespaces

function namespacesPage(view) {
  append(view, el('h1', {}, 'Namespaces'));
  if (state.info.namespaces.length === 0) {
    append(view, el('p', { 'data-test': 'no-namespace' },
      'This token may read no namespace (it lacks the read scope, or names none).'));
  }
  const list = el('ul', { id: 'namespaces', class: 'namespaces', 'data-test': 'namespace-list' });
  for (const ns of state.info.namespaces) {
    const rows = ns.keys.map((key) => keyRow(ns.name, key.name, {
      kind: key.unique ? 'unique' : 'count',
      slots: key.slots,
      window: key.window,
      unique: key.unique,
      checked: key.checked,
    }));
    for (const key of ns.in_use) {
      rows.push(keyRow(ns.name, key, { kind: 'count', slots: '(pattern)', unique: false, checked: false }));
    }
    const ownerInput = el('input', {
      type: 'text', name: 'owner', placeholder: 'an owner', required: true,
      'data-test': 'owner-input', 'data-ns': ns.name, 'aria-label': `owner in ${ns.name}`,
    });
    const ownerForm = el('form', { class: 'inline', 'data-test': 'owner-form', 'data-ns': ns.name },
      ownerInput, el('button', { type: 'submit' }, 'Open owner'));
    ownerForm.addEventListener('submit', (event) => {
      event.preventDefault();
      if (ownerInput.value) location.hash = route('owner', ns.name, ownerInput.value);
    });
    append(list, el('li', { class: 'namespace', 'data-test': 'namespace', 'data-ns': ns.name },
      el('h2', {}, ns.name),
      ownerForm,
      table({ class: 'keys', 'data-test': 'keys', 'data-ns': ns.name },
        ['Key', 'Kind', 'Slots', 'Window', 'Unique', 'Check', 'Ranking'], rows),
      ns.patterns.length
        ? el('p', { class: 'note' }, 'Open key sets: ', ns.patterns.join(', '),
          ns.in_use.length ? '' : ' (no key of them in use yet)')
        : null));
  }
  append(view, list);
}

function keyRow(ns, name, key) {
  return el('tr', { 'data-test': 'key-row', 'data-ns': ns, 'data-key': name },
    el('td', { class: 'key' }, name),
    el('td', {}, key.kind),
    el('td', {}, key.slots),
    el('td', {}, key.window || '—'),
    el('td', {}, key.unique ? 'yes' : 'no'),
    el('td', {}, key.checked ? 'yes' : 'no'),
    el('td', {}, key.kind === 'count'
      ? link('top owners', ['top', ns, name], { 'data-test': 'top-link' })
      : '—'));
}

// ---------------------------------------------------------------- 2. ranking

async function topPage(view, [ns, key, page = '1', after]) {
  namespaceOf(ns);
  const number = Math.max(1, Number.parseInt(page, 10) || 1);
  append(view,
    el('p', { class: 'crumbs' }, link('Namespaces', ['']), ' / ', ns, ' / ', key),
    el('h1', {}, 'Top owners of ', el('span', { class: 'key' }, key)));
  let path = `/v1/${enc(ns)}/top?key=${enc(key)}&limit=${TOP_PAGE}`;
  if (after) path += `&after=${enc(after)}`;
  const reply = await getJson(path);
  const offset = (number - 1) * TOP_PAGE;
  const rowsOf = (owners) => owners.map((entry, i) =>
    el('tr', { 'data-test': 'top-row', 'data-owner': entry.owner },
      el('td', { class: 'num' }, String(offset + i + 1)),
      el('td', {}, link(entry.owner, ['owner', ns, entry.owner], { 'data-test': 'owner-link' })),
      el('td', { class: 'num' }, formatNumber(entry.total))));
  const ranking = table({ id: 'top', class: 'top', 'data-test': 'top-table' }, ['#', 'Owner', 'Total'], rowsOf(reply.owners));
  append(view, ranking);
  if (reply.owners.length === 0) append(view, el('p', { class: 'note' }, 'No owner has counted this key yet.'));
  // The first page follows the ranking as it moves (top:watch); later
  // pages are read once, their cursor fixed.
  if (!after) {
    const badge = liveBadge();
    view.querySelector('h1').append(' ', badge);
    follow(`/v1/${enc(ns)}/top:watch?key=${enc(key)}&limit=${TOP_PAGE}`, badge, (data) => {
      ranking.tBodies[0].replaceChildren(...rowsOf(data.owners));
    });
  }
  const pager = el('p', { class: 'pager' });
  if (after) append(pager, [link('First page', ['top', ns, key], { 'data-test': 'top-first' }), ' ']);
  if (reply.next) {
    append(pager, link('Next page', ['top', ns, key, number + 1, reply.next],
      { id: 'top-next', 'data-test': 'top-next' }));
  }
  append(view, pager);
}

// ---------------------------------------------------------------- live

/** A badge saying whether a page's numbers are live. */
function liveBadge() {
  return el('span', { class: 'live', 'data-test': 'live', 'data-live': 'false' }, 'connecting…');
}

function setLive(badge, live) {
  badge.dataset.live = live ? 'true' : 'false';
  badge.textContent = live ? 'live' : 'reconnecting…';
}

/** One event of a text/event-stream block, or null (a comment). */
function parseEvent(block) {
  let name = 'message';
  const data = [];
  for (const line of block.split('\n')) {
    if (line.startsWith('event:')) name = line.slice(6).trim();
    else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
  }
  if (data.length === 0) return null;
  try {
    return { name, data: JSON.parse(data.join('\n')) };
  } catch {
    return null;
  }
}

/** Follows the service's event stream `path` while the page shows it,
 *  handing each snapshot's and change's data to `onData`. With `fetch`,
 *  not EventSource, which cannot send the token. After a `closed` event,
 *  an error or the end, it reconnects (a new snapshot) after a pause. */
function follow(path, badge, onData) {
  const controller = new AbortController();
  state.streams.push(controller);
  (async () => {
    let pause = RECONNECT_MS[0];
    while (!controller.signal.aborted) {
      try {
        const headers = { Accept: 'text/event-stream' };
        if (state.token) headers.Authorization = 'Bearer ' + state.token;
        const response = await fetch(path, {
          headers, credentials: 'omit', cache: 'no-store', signal: controller.signal,
        });
        if (!response.ok) throw new Error(String(response.status));
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n/g, '\n');
          let end;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            const event = parseEvent(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
            if (event && (event.name === 'snapshot' || event.name === 'change')) {
              setLive(badge, true);
              pause = RECONNECT_MS[0];
              onData(event.data);
            }
          }
        }
      } catch {
        if (controller.signal.aborted) return;
      }
      setLive(badge, false);
      await new Promise((resolve) => setTimeout(resolve, pause));
      pause = Math.min(pause * 2, RECONNECT_MS[1]);
    }
  })();
}

// ---------------------------------------------------------------- 3. owner

const PRESETS = [
  { id: '24h', label: 'last 24 hours', unit: HOUR_MS, count: 24 },
  { id: '7d', label: 'last 7 days', unit: DAY_MS, count: 7 },
  { id: '30d', label: 'last 30 days', unit: DAY_MS, count: 30 },
  { id: '90d', label: 'last 90 days', unit: DAY_MS, count: 90 },
  { id: 'custom', label: 'from … to … (UTC)' },
];

function presetRange(preset) {
  const to = Math.ceil(Date.now() / preset.unit) * preset.unit;
  return { from: new Date(to - preset.count * preset.unit), to: new Date(to) };
}

function localValue(date) {
  return date.toISOString().slice(0, 16);
}

async function ownerPage(view, [ns, owner]) {
  const namespace = namespaceOf(ns);
  append(view,
    el('p', { class: 'crumbs' }, link('Namespaces', ['']), ' / ', ns, ' / owner'),
    el('h1', {}, 'Owner ', el('span', { class: 'owner', 'data-test': 'owner-name' }, owner), ' in ', ns));

  const counted = namespace.keys.filter((k) => !k.unique).map((k) => k.name).concat(namespace.in_use);
  const countsBody = el('tbody');
  const badge = liveBadge();
  append(view, el('h2', {}, 'Counts ', badge),
    el('table', { id: 'counts', class: 'counts', 'data-test': 'counts-table' },
      el('thead', {}, el('tr', {}, el('th', { scope: 'col' }, 'Key'), el('th', { scope: 'col' }, 'Total'))),
      countsBody));
  const cells = new Map();
  for (const key of counted) {
    const cell = el('td', { class: 'num', 'data-test': 'count', 'data-key': key }, '…');
    cells.set(key, cell);
    append(countsBody, el('tr', {}, el('td', { class: 'key' }, key), cell));
  }
  // 32 keys a request: the service's default `max_batch_keys`.
  for (let i = 0; i < counted.length; i += 32) {
    const keys = counted.slice(i, i + 32);
    const got = await api(`/v1/${enc(ns)}/counts:batchGet`, { method: 'POST', body: { owners: [owner], keys } });
    const byKey = Object.values(got.json.counts)[0] || {};
    for (const key of keys) cells.get(key).textContent = formatNumber(byKey[key] ?? 0);
    // Then each change as it lands (counts:watch), from any instance. A
    // watch takes its owners as a comma-separated list: an owner with a
    // comma in it is read once, not followed.
    if (owner.includes(',')) {
      badge.textContent = 'not live (a comma in the owner)';
      continue;
    }
    const path = `/v1/${enc(ns)}/counts:watch?owners=${enc(owner)}&keys=${keys.map(enc).join(',')}`;
    follow(path, badge, (data) => {
      const changed = Object.values(data.counts)[0] || {};
      for (const [key, total] of Object.entries(changed)) {
        const cell = cells.get(key);
        if (cell) cell.textContent = formatNumber(total);
      }
    });
  }

  const windowed = namespace.keys.filter((k) => !k.unique && k.window);
  const uniques = namespace.keys.filter((k) => k.unique);
  if (windowed.length === 0 && uniques.length === 0) return;

  // The range, shared by the charts and the unique estimates.
  const preset = el('select', { id: 'range-preset', 'data-test': 'range-preset', 'aria-label': 'range' },
    PRESETS.map((p) => el('option', { value: p.id, selected: p.id === '7d' }, p.label)));
  const from = el('input', { id: 'range-from', type: 'datetime-local', 'data-test': 'range-from', 'aria-label': 'from (UTC)' });
  const to = el('input', { id: 'range-to', type: 'datetime-local', 'data-test': 'range-to', 'aria-label': 'to (UTC)' });
  const bucket = el('select', { id: 'range-bucket', 'data-test': 'range-bucket', 'aria-label': 'buckets' },
    el('option', { value: 'day', selected: true }, 'day buckets'),
    el('option', { value: 'hour' }, 'hour buckets'));
  const apply = el('button', { type: 'submit', id: 'range-apply', 'data-test': 'range-apply' }, 'Show');
  const form = el('form', { class: 'range', 'data-test': 'range-form' },
    el('label', {}, 'Range ', preset), ' ', from, ' – ', to, ' UTC ', bucket, ' ', apply);
  const charts = el('div', { class: 'charts' });
  append(view, el('h2', {}, 'Over a range'), form, charts);

  const fill = () => {
    const chosen = PRESETS.find((p) => p.id === preset.value);
    if (chosen && chosen.unit) {
      const range = presetRange(chosen);
      from.value = localValue(range.from);
      to.value = localValue(range.to);
      bucket.value = chosen.unit === HOUR_MS ? 'hour' : 'day';
    }
  };
  preset.addEventListener('change', () => {
    fill();
    if (preset.value !== 'custom') form.requestSubmit();
  });
  for (const input of [from, to]) input.addEventListener('input', () => { preset.value = 'custom'; });
  const show = async () => {
    showError(null);
    const range = { from: new Date(from.value + ':00Z'), to: new Date(to.value + ':00Z') };
    if (Number.isNaN(range.from.getTime()) || Number.isNaN(range.to.getTime()) || range.from >= range.to) {
      showError('The range needs a start before its end.');
      return;
    }
    charts.replaceChildren();
    const jobs = [];
    for (const key of windowed) {
      const figure = el('figure', { class: 'series', 'data-test': 'series', 'data-key': key.name });
      append(charts, figure);
      jobs.push(seriesFigure(figure, ns, owner, key, range, bucket.value));
    }
    if (uniques.length) {
      const list = el('ul', { class: 'uniques', 'data-test': 'uniques' });
      append(charts, el('h3', {}, 'Distinct members'), list);
      jobs.push(uniqueEstimates(list, ns, owner, uniques, range));
    }
    const results = await Promise.allSettled(jobs);
    const failed = results.find((r) => r.status === 'rejected');
    if (failed) showError(failed.reason);
  };
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    show();
  });
  fill();
  await show();
}

/** One windowed key's series over `range` as a chart and its sum. */
async function seriesFigure(figure, ns, owner, key, range, wanted) {
  const path = `/v1/${enc(ns)}/series?owner=${enc(owner)}&key=${enc(key.name)}`
    + `&from=${enc(range.from.toISOString())}&to=${enc(range.to.toISOString())}`;
  const sum = el('span', { class: 'sum', 'data-test': 'range-sum', 'data-key': key.name }, '…');
  append(figure, el('figcaption', {}, el('span', { class: 'key' }, key.name),
    ` (counted by ${key.window}) — sum over the range: `, sum));
  const reply = await getJson(path);
  let buckets = reply.buckets.map((b) => ({ start: new Date(b.start), count: b.count }));
  let unit = key.window;
  if (wanted === 'day' && key.window === 'hour') {
    buckets = byDay(buckets);
    unit = 'day';
  } else if (wanted === 'hour' && key.window === 'day') {
    append(figure, el('p', { class: 'note' }, 'This key counts by day: day buckets.'));
  }
  sum.textContent = formatNumber(reply.sum);
  append(figure, chart(buckets, unit));
}

/** Hour buckets folded into UTC days. */
function byDay(buckets) {
  const days = new Map();
  for (const b of buckets) {
    const day = Math.floor(b.start.getTime() / DAY_MS) * DAY_MS;
    days.set(day, (days.get(day) || 0) + b.count);
  }
  return [...days.entries()].map(([start, count]) => ({ start: new Date(start), count }));
}

/** A bar chart (a line past 120 buckets), drawn as SVG nodes. */
function chart(buckets, unit) {
  const width = 720;
  const height = 200;
  const pad = { left: 56, right: 12, top: 12, bottom: 28 };
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const max = Math.max(1, ...buckets.map((b) => b.count));
  const root = svg('svg', {
    class: 'chart', viewBox: `0 0 ${width} ${height}`, role: 'img',
    'data-test': 'chart', 'data-buckets': buckets.length,
  });
  append(root, svg('title', {}, `${buckets.length} ${unit} buckets, highest ${max}`));
  const y = (count) => pad.top + plotH - (count / max) * plotH;
  append(root,
    svg('line', { class: 'axis', x1: pad.left, y1: pad.top + plotH, x2: width - pad.right, y2: pad.top + plotH }),
    svg('line', { class: 'axis', x1: pad.left, y1: pad.top, x2: pad.left, y2: pad.top + plotH }),
    svg('text', { class: 'label', x: pad.left - 6, y: pad.top + 4, 'text-anchor': 'end' }, formatNumber(max)),
    svg('text', { class: 'label', x: pad.left - 6, y: pad.top + plotH, 'text-anchor': 'end' }, '0'));
  if (buckets.length === 0) return root;
  const label = (date) => (unit === 'hour' ? formatTime(date) : date.toISOString().slice(0, 10));
  append(root,
    svg('text', { class: 'label', x: pad.left, y: height - 8 }, label(buckets[0].start)),
    svg('text', { class: 'label', x: width - pad.right, y: height - 8, 'text-anchor': 'end' },
      label(buckets[buckets.length - 1].start)));
  const step = plotW / buckets.length;
  if (buckets.length <= 120) {
    buckets.forEach((b, i) => {
      const top = y(b.count);
      append(root, svg('rect', {
        class: 'bar', x: (pad.left + i * step + step * 0.1).toFixed(2), y: top.toFixed(2),
        width: Math.max(1, step * 0.8).toFixed(2), height: (pad.top + plotH - top).toFixed(2),
        'data-count': b.count,
      }, svg('title', {}, `${label(b.start)}: ${formatNumber(b.count)}`)));
    });
  } else {
    const points = buckets.map((b, i) => `${(pad.left + (i + 0.5) * step).toFixed(2)},${y(b.count).toFixed(2)}`);
    append(root, svg('polyline', { class: 'line', points: points.join(' ') }));
  }
  return root;
}

/** The unique keys' estimates: windowed ones over `range`, others all time. */
async function uniqueEstimates(list, ns, owner, keys, range) {
  const spans = new Map();
  for (const key of keys) {
    const span = el('span', { class: 'num', 'data-test': 'unique-estimate', 'data-key': key.name }, '…');
    spans.set(key.name, span);
    append(list, el('li', {}, el('span', { class: 'key' }, key.name), ': ', span,
      key.window ? ' distinct over the range' : ' distinct, all time (no window)'));
  }
  const ask = async (group, withRange) => {
    if (group.length === 0) return;
    const body = { owners: [owner], keys: group.map((k) => k.name) };
    if (withRange) {
      body.from = range.from.toISOString();
      body.to = range.to.toISOString();
    }
    const reply = await api(`/v1/${enc(ns)}/uniques:batchGet`, { method: 'POST', body });
    const byKey = Object.values(reply.json.uniques)[0] || {};
    for (const key of group) spans.get(key.name).textContent = '≈ ' + formatNumber(byKey[key.name] ?? 0);
  };
  await ask(keys.filter((k) => k.window), true);
  await ask(keys.filter((k) => !k.window), false);
}

// ---------------------------------------------------------------- 4. health

/** `/metrics` text as samples: name, labels, value. */
function parseMetrics(text) {
  const samples = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const labels = {};
    const pairs = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    let pair;
    while ((pair = pairs.exec(match[2] || '')) !== null) {
      labels[pair[1]] = pair[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
    }
    samples.push({ name: match[1], labels, value: Number(match[3]) });
  }
  return samples;
}

function total(samples, name, keep = () => true) {
  let sum = 0;
  let found = false;
  for (const s of samples) {
    if (s.name === name && keep(s.labels)) {
      sum += s.value;
      found = true;
    }
  }
  return found ? sum : null;
}

const isApi = (labels) => (labels.route || '').startsWith('/v1/');
const ADD_ROUTES = ['/v1/{ns}/counters:add', '/v1/{ns}/counters:addAndGet'];

/** The figures of one scrape that the rates are differences of. */
function figures(samples) {
  const buckets = new Map();
  for (const s of samples) {
    if (s.name === 'counter_service_request_duration_seconds_bucket' && isApi(s.labels)) {
      const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
      buckets.set(le, (buckets.get(le) || 0) + s.value);
    }
  }
  const singleAdds = total(samples, 'counter_service_requests_total',
    (l) => ADD_ROUTES.includes(l.route) && (l.status || '').startsWith('2')) || 0;
  const batchItems = total(samples, 'counter_service_batch_size_sum', (l) => l.op === 'batchAdd') || 0;
  return {
    at: performance.now(),
    requests: total(samples, 'counter_service_requests_total', isApi) || 0,
    adds: singleAdds + batchItems + (total(samples, 'counter_service_consumer_applied') || 0),
    buckets,
    groupSum: total(samples, 'counter_service_add_group_requests_sum'),
    groupCount: total(samples, 'counter_service_add_group_requests_count'),
    hits: total(samples, 'counter_service_cache_hits_total'),
    misses: total(samples, 'counter_service_cache_misses_total'),
    lag: total(samples, 'counter_service_consumer_lag'),
  };
}

/** Prometheus' histogram_quantile over cumulative bucket deltas. */
function quantile(q, now, before) {
  const bounds = [...now.keys()].sort((a, b) => a - b);
  const deltas = bounds.map((le) => Math.max(0, now.get(le) - (before.get(le) || 0)));
  const count = deltas.length ? deltas[deltas.length - 1] : 0;
  if (count <= 0) return null;
  const rank = q * count;
  for (let i = 0; i < bounds.length; i++) {
    if (deltas[i] >= rank) {
      if (bounds[i] === Infinity) return bounds[i - 1] ?? null;
      const lower = i === 0 ? 0 : bounds[i - 1];
      const below = i === 0 ? 0 : deltas[i - 1];
      const inBucket = deltas[i] - below;
      return inBucket > 0 ? lower + (bounds[i] - lower) * ((rank - below) / inBucket) : bounds[i];
    }
  }
  return null;
}

function rates(now, before) {
  const seconds = (now.at - before.at) / 1000;
  const per = (a, b) => (a !== null && b !== null && a >= b && seconds > 0 ? (a - b) / seconds : null);
  const p99 = quantile(0.99, now.buckets, before.buckets);
  const groups = now.groupCount !== null && before.groupCount !== null ? now.groupCount - before.groupCount : 0;
  return {
    requests: per(now.requests, before.requests),
    adds: per(now.adds, before.adds),
    p99: p99 === null ? null : p99 * 1000,
    group: groups > 0 ? (now.groupSum - before.groupSum) / groups : null,
    lag: now.lag,
  };
}

/** Keeps `now` in `scrapes` (the cache's counters of each scrape), and the
 *  oldest scrape still at or before the window's start as its base. A
 *  counter that went down (the service restarted) starts a new window. */
function keepCacheScrape(scrapes, now) {
  if (now.hits === null) return;
  const last = scrapes[scrapes.length - 1];
  if (last && (now.hits < last.hits || now.misses < last.misses)) scrapes.length = 0;
  scrapes.push({ at: now.at, hits: now.hits, misses: now.misses });
  while (scrapes.length > 2 && scrapes[1].at <= now.at - CACHE_WINDOW_MS) scrapes.shift();
}

/** Hits over reads between the window's base and its last scrape; null
 *  without a cache or without a read in the window. */
function cacheRatio(scrapes) {
  if (scrapes.length < 2) return null;
  const [base, last] = [scrapes[0], scrapes[scrapes.length - 1]];
  const hits = last.hits - base.hits;
  const reads = hits + (last.misses - base.misses);
  return reads > 0 ? hits / reads : null;
}

const RATES = [
  ['requests', 'API requests/s', (v) => v.toFixed(1), 'no request'],
  ['adds', 'adds/s (items, HTTP and queue)', (v) => v.toFixed(1), 'no add'],
  ['p99', 'p99 latency of API requests', (v) => `${v.toFixed(v < 10 ? 2 : 0)} ms`, 'no request'],
  ['group', 'add group size (requests per commit)', (v) => v.toFixed(1), 'no add group'],
  ['cache', 'cache hit ratio, last 5 min', (v) => `${(v * 100).toFixed(1)} %`, 'no cache, or no read in the last 5 min'],
  ['lag', 'consumer lag (messages)', (v) => formatNumber(v), 'no broker'],
];

async function healthPage(view) {
  const status = el('p', { class: 'status', 'data-test': 'ready-status' }, '…');
  const components = el('ul', { id: 'health-components', class: 'components', 'data-test': 'health-components' });
  const cells = new Map();
  const rows = RATES.map(([id, name]) => {
    const cell = el('td', { class: 'num', 'data-test': 'rate', 'data-rate': id }, 'measuring…');
    cells.set(id, cell);
    return el('tr', {}, el('th', { scope: 'row' }, name), cell);
  });
  const history = [];
  const spark = el('div', { class: 'spark', 'data-test': 'requests-spark' });
  append(view,
    el('h1', {}, 'Health'),
    status,
    components,
    el('h2', {}, 'Live rates'),
    el('p', { class: 'note' },
      `From successive /metrics scrapes, every ${HEALTH_EVERY_MS / 1000} s: each figure is over the last interval, ` +
      'the cache hit ratio over the last 5 minutes (since this page opened, until then).'),
    el('table', { id: 'rates', class: 'rates', 'data-test': 'rates' }, el('tbody', {}, rows)),
    el('h3', {}, 'API requests/s'),
    spark);

  let before = null;
  const cacheScrapes = [];
  const tick = async () => {
    if (!view.isConnected) return;
    try {
      const ready = await api('/readyz', { accept: [503] });
      const body = ready.json || {};
      status.textContent = `Status: ${body.status || ready.status}`;
      status.classList.toggle('bad', body.status !== 'ready');
      const items = [];
      for (const name of ['database', 'cache', 'broker']) {
        const dep = body[name];
        if (!dep) continue;
        items.push(el('li', { class: dep.ok ? 'ok' : 'bad', 'data-test': 'component', 'data-name': name, 'data-ok': String(dep.ok) },
          el('strong', {}, name), ': ', dep.ok ? 'ok' : 'down', dep.detail ? ` — ${dep.detail}` : ''));
      }
      components.replaceChildren(...items);
      const metrics = await fetch('/metrics', { cache: 'no-store', credentials: 'omit' });
      const now = figures(parseMetrics(await metrics.text()));
      keepCacheScrape(cacheScrapes, now);
      if (before) {
        const r = { ...rates(now, before), cache: cacheRatio(cacheScrapes) };
        for (const [id, , format, none] of RATES) {
          cells.get(id).textContent = r[id] === null || r[id] === undefined ? none : format(r[id]);
        }
        if (r.requests !== null) history.push(r.requests);
        if (history.length > SPARK_INTERVALS) history.shift();
        spark.replaceChildren(sparkline(history));
      }
      before = now;
    } catch (error) {
      showError(error);
    }
  };
  await tick();
  state.timers.push(setInterval(tick, HEALTH_EVERY_MS));
}

/** The last intervals' rates on a fixed axis of `SPARK_INTERVALS`, the
 *  newest at the right, from zero to the highest rate (labelled). */
function sparkline(values) {
  const width = 360;
  const height = 60;
  const top = 12;
  const max = Math.max(1, ...values);
  const step = width / (SPARK_INTERVALS - 1);
  const first = SPARK_INTERVALS - values.length;
  const y = (v) => (height - 1 - (v / max) * (height - top - 2)).toFixed(1);
  const points = values.map((v, i) => `${((first + i) * step).toFixed(1)},${y(v)}`);
  return svg('svg', { class: 'sparkline', viewBox: `0 0 ${width} ${height}`, role: 'img' },
    svg('title', {}, `last ${values.length} intervals of ${HEALTH_EVERY_MS / 1000} s, highest ${max.toFixed(1)}/s`),
    svg('line', { class: 'axis', x1: 0, y1: height - 1, x2: width, y2: height - 1 }),
    svg('text', { class: 'label', x: 4, y: 10 }, `${formatNumber(Number(max.toFixed(1)))}/s`),
    svg('polyline', { class: 'line', points: points.join(' ') }));
}

// ---------------------------------------------------------------- 5. check and fix

async function checksPage(view) {
  append(view, el('h1', {}, 'Check and fix'));
  const admin = hasScope('admin');
  if (!admin) {
    append(view, el('p', { class: 'note', 'data-test': 'checks-need-admin' },
      'The check history and the maintenance buttons need a token with the admin scope.'));
  }
  for (const ns of state.info.namespaces) {
    const section = el('section', { class: 'checks', 'data-test': 'checks-ns', 'data-ns': ns.name });
    append(view, section);
    const checked = ns.keys.filter((k) => k.checked).map((k) => k.name);
    append(section, el('h2', {}, ns.name),
      el('p', { class: 'note' }, checked.length
        ? `Checked keys: ${checked.join(', ')}.`
        : 'No key of this namespace has a check (a compaction still runs).'));
    if (!admin) continue;
    await checksOf(section, ns.name);
  }
}

async function checksOf(section, ns) {
  const statusLine = el('span', { class: 'job-status', 'data-test': 'job-status', 'data-ns': ns });
  const history = el('div', { class: 'history' });
  const button = (text, test, path) => {
    const b = el('button', { type: 'button', 'data-test': test, 'data-ns': ns }, text);
    b.addEventListener('click', () => runJob(b, statusLine, path, () => fillHistory(history, ns)));
    return b;
  };
  append(section, el('p', { class: 'actions' },
    button('Check now (dry run)', 'check-now', `/v1/${enc(ns)}/admin:check?dry_run=true`), ' ',
    button('Compact now', 'compact-now', `/v1/${enc(ns)}/admin:compact`), ' ',
    statusLine), history);
  await fillHistory(history, ns);
}

async function fillHistory(history, ns) {
  const { jobs } = await getJson(`/v1/${enc(ns)}/admin/jobs`);
  const runs = [];
  for (const job of jobs) {
    if (job.kind === 'compact') continue;
    const reports = (job.report && job.report.checks) || [];
    if (reports.length === 0) {
      runs.push(runRow(job, { key: job.state === 'done' ? '(no checked key)' : '—' }));
    }
    for (const report of reports) runs.push(runRow(job, report));
  }
  const compactions = jobs.filter((j) => j.kind === 'compact').map((job) =>
    el('tr', { 'data-test': 'compaction-row', 'data-job': job.id },
      el('td', {}, formatTime(job.started_at)),
      el('td', {}, job.state),
      el('td', { class: 'num' }, job.report ? `${formatNumber(job.report.rows_before)} → ${formatNumber(job.report.rows_after)}` : '—'),
      el('td', { class: 'num' }, job.report ? formatNumber(job.report.counters_folded) : jobError(job))));
  const parts = [
    el('h3', {}, 'Last checks, newest first'),
    runs.length
      ? table({ class: 'runs', 'data-test': 'check-runs', 'data-ns': ns },
        ['Started', 'Run', 'State', 'Key', 'Owners checked', 'Drifted', 'Drift', 'Fixed'], runs)
      : el('p', { class: 'note', 'data-test': 'no-check-runs' },
        'No check has run on this instance since it started (jobs are kept by the instance that runs them, the last 16).'),
  ];
  if (compactions.length) {
    parts.push(el('h3', {}, 'Compactions'),
      table({ class: 'runs', 'data-test': 'compactions' }, ['Started', 'State', 'Slot rows', 'Counters folded'], compactions));
  }
  history.replaceChildren(...parts);
}

function jobError(job) {
  return job.error ? String(job.error.detail || job.error.title || 'failed') : '—';
}

function runRow(job, report) {
  const has = (field) => report[field] !== undefined;
  return el('tr', { 'data-test': 'check-run', 'data-job': job.id, 'data-key': report.key || '' },
    el('td', {}, formatTime(job.started_at)),
    el('td', {}, job.kind === 'check_dry_run' ? 'dry run' : 'check and fix'),
    el('td', {}, job.state === 'failed' ? `failed: ${jobError(job)}` : job.state),
    el('td', { class: 'key' }, report.key || '—'),
    el('td', { class: 'num' }, has('owners_checked') ? formatNumber(report.owners_checked) : '—'),
    el('td', { class: 'num' }, has('owners_drifted') ? formatNumber(report.owners_drifted) : '—'),
    el('td', { class: 'num' }, has('total_abs_drift') ? formatNumber(report.total_abs_drift) : '—'),
    el('td', {}, has('fixed') ? (report.fixed ? 'yes' : 'no') : '—'));
}

/** POSTs `path` (a job), then follows the job until it ends. */
async function runJob(button, statusLine, path, done) {
  button.disabled = true;
  showError(null);
  try {
    const started = await api(path, { method: 'POST', accept: [409] });
    if (started.status === 409) {
      statusLine.textContent = `already running: job ${started.json && started.json.job}`;
      return;
    }
    let job = started.json;
    const address = `/v1/${enc(job.namespace)}/admin/jobs/${enc(job.id)}`;
    statusLine.textContent = `${job.kind} ${job.id.slice(0, 8)}: running`;
    while (job.state === 'running') {
      await new Promise((resolve) => setTimeout(resolve, 500));
      job = await getJson(address);
    }
    statusLine.textContent = `${job.kind} ${job.id.slice(0, 8)}: ${job.state}`;
    statusLine.setAttribute('data-state', job.state);
    await done();
  } catch (error) {
    showError(error);
  } finally {
    button.disabled = false;
  }
}

// ---------------------------------------------------------------- start

setupToken();
window.addEventListener('hashchange', render);
render();
