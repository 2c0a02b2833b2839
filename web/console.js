'use strict';
// The operator's console: workers, the queue (cancel a ticket), sessions in progress, and
// recorded sessions with a viewer that plays the input and the model's audio on one
// timeline with the events and the video frames. It reads the operator routes (/status,
// /sessions...), with the admin key when one is set.

const $ = (id) => document.getElementById(id);
const stats = (window.consoleStats = { refreshed: 0, recordings: 0, viewing: null, events: 0, scheduled: 0, playing: false, frames: 0 });

function headers() {
  const key = $('admin').value.trim();
  return key ? { Authorization: 'Bearer ' + key } : {};
}

async function get(path, as = 'json') {
  const r = await fetch(path, { headers: headers() });
  if (!r.ok) {
    let message = `${path}: ${r.status}`;
    try {
      message = (await r.json()).error.message;
    } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return as === 'json' ? r.json() : as === 'text' ? r.text() : r.arrayBuffer();
}

function problem(text) {
  $('problem').textContent = text || '';
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text == null ? '' : String(text);
  if (cls) td.className = cls;
  return td;
}

function seconds(s) {
  if (s == null) return '';
  return s < 60 ? `${s.toFixed(1)} s` : `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

async function refreshStatus() {
  try {
    const s = await get('/status');
    problem('');
    const workers = $('workers').tBodies[0];
    workers.replaceChildren();
    const live = $('live').tBodies[0];
    live.replaceChildren();
    for (const w of s.workers) {
      const row = workers.insertRow();
      cell(row, w.name);
      cell(row, w.node ? `node ${w.node}` : w.backend);
      cell(row, w.modes.join(', '));
      // A worker whose client dropped its connection is held for the client's resume.
      const held = w.client_away_s != null ? ` (held for a dropped client, ${seconds(w.client_away_s)})` : '';
      cell(row, w.state + (w.failure ? `: ${w.failure}` : '') + held, 'state-' + w.state);
      cell(row, w.session);
      cell(row, w.sessions_served);
      cell(row, w.restarts);
      cell(row, w.last_error);
      if (w.state === 'busy') {
        const r = live.insertRow();
        cell(r, w.session);
        cell(r, w.mode);
        cell(r, w.dialect);
        cell(r, w.transport);
        cell(r, w.name);
      }
    }
    $('open').textContent = s.sessions.held
      ? `(${s.sessions.open} open, ${s.sessions.held} held for a dropped client)`
      : `(${s.sessions.open} open)`;
    const queue = $('queue').tBodies[0];
    queue.replaceChildren();
    $('queue-length').textContent = `(${s.queue.length} waiting)`;
    for (const t of s.queue.tickets) {
      const row = queue.insertRow();
      // In a cluster, another replica's client is labelled with its replica's name.
      const here = s.cluster ? s.cluster.replica : null;
      cell(row, t.replica && t.replica !== here ? `${t.ticket_id} (${t.replica})` : t.ticket_id);
      cell(row, t.mode);
      cell(row, t.position);
      cell(row, seconds(t.waited_s));
      cell(row, seconds(t.estimated_wait_s));
      const button = document.createElement('button');
      button.textContent = 'Cancel';
      button.onclick = async () => {
        await fetch('/queue/' + t.ticket_id, { method: 'DELETE', headers: headers() });
        refreshStatus();
      };
      row.insertCell().appendChild(button);
    }
    stats.refreshed++;
  } catch (e) {
    problem(e.message);
  }
}

let recordings = [];

async function refreshRecordings() {
  try {
    const r = await get('/sessions?per_page=500');
    recordings = r.sessions;
    const reasons = [...new Set(recordings.map((s) => s.close_reason).filter(Boolean))].sort();
    const select = $('filter-reason');
    const chosen = select.value;
    select.replaceChildren(new Option('Every ending', ''), ...reasons.map((r) => new Option(r, r)));
    select.value = chosen;
    showRecordings();
  } catch (e) {
    $('recording-count').textContent = `(${e.message})`;
  }
}

function showRecordings() {
  const text = $('filter-text').value.trim().toLowerCase();
  const mode = $('filter-mode').value;
  const reason = $('filter-reason').value;
  const shown = recordings.filter((s) => (!mode || s.mode === mode) && (!reason || s.close_reason === reason)
    && (!text || [s.session_id, s.worker, s.close_reason, s.dialect, s.transport].join(' ').toLowerCase().includes(text)));
  const body = $('recordings').tBodies[0];
  body.replaceChildren();
  for (const s of shown) {
    const row = body.insertRow();
    row.dataset.session = s.session_id;
    cell(row, s.session_id);
    cell(row, s.start);
    cell(row, s.mode);
    cell(row, s.dialect);
    cell(row, s.transport);
    cell(row, s.worker);
    cell(row, seconds(s.duration_s));
    cell(row, s.close_reason);
    row.onclick = () => view(s.session_id);
  }
  stats.recordings = shown.length;
  $('recording-count').textContent = `(${shown.length} of ${recordings.length})`;
}

// ---- the session viewer ----
let viewer = null;

/// The files the server writes into a recording: only these are ever fetched for a `$ref`.
const MEDIA_FILE = /^(input\.wav|output\.wav|frames\/\d{6}\.jpg|attachments\/\d{6}\.b64)$/;

/// Every medium an event refers to: {file, offset, samples} of audio, or a frame. The server
/// renames a `$ref` a client sent; one naming anything but a recording's own file is ignored.
function refs(value, out = []) {
  if (value && typeof value === 'object') {
    if (typeof value.$ref === 'string') {
      if (MEDIA_FILE.test(value.$ref)) out.push(value);
    } else for (const v of Object.values(value)) refs(v, out);
  }
  return out;
}

/// What the model said, in a transcript delta of the OpenAI dialect (GA or beta names).
const TRANSCRIPT_DELTA = new Set(['response.output_audio_transcript.delta', 'response.audio_transcript.delta',
  'response.output_text.delta', 'response.text.delta']);
/// Events a client or the gateway sends many of in a row (audio in pieces): one line for a run.
const GENERATED = new Set(['input_audio_buffer.append', 'caller.audio', 'model.audio',
  'response.output_audio.delta', 'response.audio.delta']);

function describe(line) {
  const e = line.event || {};
  if (e.type === 'response.output.delta') return e.kind === 'text' ? `text: ${e.text}` : e.kind;
  if (TRANSCRIPT_DELTA.has(e.type)) return `text: ${e.delta}`;
  if (e.type === 'conversation.item.input_audio_transcription.completed') return `heard: ${e.transcript}`;
  if (e.type === 'error') return `error ${e.error && e.error.code}`;
  return e.type || (line.raw ? 'raw frame' : '?');
}

/// The lines of the list: a run of one generated event, or of the model's transcript deltas,
/// from one side is one line ("caller.audio ×25", "text: Reply 1: I heard ...").
function listed(lines) {
  const out = [];
  for (const l of lines) {
    const e = l.event || {};
    const last = out[out.length - 1];
    const kind = GENERATED.has(e.type) ? e.type : TRANSCRIPT_DELTA.has(e.type) ? 'text' : null;
    if (kind && last && last.dir === l.dir && (last.kind === kind || (last.kind === 'text' && GENERATED.has(kind)))) {
      // (the answer's words run on across its voice's pieces, which arrive between them)
      last.lines.push(l);
      if (kind === 'text') last.text += e.delta || '';
      else if (last.kind === 'text') last.voice++;
      continue;
    }
    out.push({ kind, dir: l.dir, t: l.t, lines: [l], text: kind === 'text' ? e.delta || '' : '', voice: 0 });
  }
  return out.map((run) => {
    const first = run.lines[0];
    let what = describe(first);
    if (run.kind === 'text') what = `text: ${run.text}${run.voice ? ` (and ${run.voice} pieces of voice)` : ''}`;
    else if (run.kind && run.lines.length > 1) what = `${run.kind} ×${run.lines.length}`;
    return { run, text: `${first.t.toFixed(2)} s ${first.dir === 'in' ? 'client' : 'server'}: ${what}` };
  });
}

async function view(id) {
  stopPlayback();
  try {
    const meta = await get(`/sessions/${id}`);
    const text = await get(`/sessions/${id}/events.jsonl`, 'text');
    const lines = text.split('\n').filter(Boolean).map((l) => JSON.parse(l));
    viewer = { id, meta, lines, duration: Math.max(meta.duration_s || 0, ...lines.map((l) => l.t)), audio: null, frames: new Map() };
    stats.viewing = id;
    stats.events = lines.length;
    $('viewer').hidden = false;
    $('viewer-id').textContent = id;
    $('viewer-meta').textContent = `${meta.mode}, ${meta.dialect} over ${meta.transport || 'websocket'}, worker ${meta.worker || '-'}, `
      + `${seconds(meta.duration_s)}, ended: ${meta.close_reason}; `
      + `${meta.chunks_received} chunks received, ${meta.chunks_dropped} dropped, ${meta.turns} answers`;
    // Frames only for a video session.
    $('viewer-frame').hidden = meta.mode !== 'video';
    const list = $('viewer-events');
    list.replaceChildren();
    const shown = listed(lines);
    for (const { run, text: line } of shown) {
      const li = document.createElement('li');
      li.textContent = line;
      list.appendChild(li);
      for (const l of run.lines) l.node = li;
    }
    stats.listed = shown.length;
    drawTimeline(0);
    $('viewer').scrollIntoView();
  } catch (e) {
    problem(e.message);
  }
}

function drawTimeline(cursor) {
  const canvas = $('timeline');
  const g = canvas.getContext('2d');
  const w = canvas.width;
  const x = (t) => 10 + (t / Math.max(viewer.duration, 0.001)) * (w - 20);
  g.clearRect(0, 0, w, canvas.height);
  g.font = '12px system-ui';
  g.fillStyle = '#5d6776';
  g.fillText('input', 10, 18);
  g.fillText('model', 10, 78);
  g.fillText('events', 10, 138);
  for (const l of viewer.lines) {
    for (const r of refs(l.event)) {
      if (r.samples == null) continue;
      const rate = r.$ref === 'input.wav' ? 16000 : 24000;
      g.fillStyle = r.$ref === 'input.wav' ? '#3b82f6' : '#16a34a';
      g.fillRect(x(l.t), r.$ref === 'input.wav' ? 24 : 84, Math.max(1, x(l.t + r.samples / rate) - x(l.t)), 28);
    }
    const e = l.event || {};
    let color = null;
    if (e.kind === 'listen') color = '#9ca3af';
    else if (e.kind === 'text' || TRANSCRIPT_DELTA.has(e.type)) color = '#7c3aed';
    else if (e.type === 'input_audio_buffer.speech_started' || e.type === 'input_audio_buffer.speech_stopped') color = '#3b82f6';
    else if (e.type === 'error') color = '#b42318';
    if (color) {
      g.fillStyle = color;
      g.fillRect(x(l.t), 144, 2, 20);
    }
  }
  g.fillStyle = '#b42318';
  g.fillRect(x(cursor), 0, 2, canvas.height);
}

async function wav(file) {
  const data = await get(`/sessions/${viewer.id}/${file}`, 'bytes');
  return playbackContext().decodeAudioData(data);
}

let audioContext = null;
function playbackContext() {
  if (!audioContext) audioContext = new AudioContext();
  return audioContext;
}

let playing = null;

async function play() {
  if (!viewer) return;
  stopPlayback();
  const ctx = playbackContext();
  await ctx.resume();
  try {
    if (!viewer.audio) viewer.audio = { 'input.wav': await wav('input.wav'), 'output.wav': await wav('output.wav') };
  } catch (e) {
    problem('The recording has no audio to play: ' + e.message);
    return;
  }
  const start = ctx.currentTime + 0.1;
  const sources = [];
  for (const l of viewer.lines) {
    for (const r of refs(l.event)) {
      const buffer = viewer.audio[r.$ref];
      if (!buffer || r.samples == null) continue;
      // Each piece at the moment it crossed the socket, from its place in the file.
      const source = ctx.createBufferSource();
      source.buffer = buffer;
      source.connect(ctx.destination);
      source.start(start + l.t, r.offset / buffer.sampleRate, r.samples / buffer.sampleRate);
      sources.push(source);
    }
  }
  stats.scheduled = sources.length;
  stats.playing = true;
  $('play').disabled = true;
  $('pause').disabled = false;
  playing = { sources, start, timer: setInterval(() => tick(ctx), 100) };
}

async function tick(ctx) {
  if (!playing) return;
  const t = ctx.currentTime - playing.start;
  $('clock').textContent = `${Math.max(0, t).toFixed(1)} s`;
  drawTimeline(Math.max(0, t));
  let current = null;
  for (const l of viewer.lines) {
    if (l.t > t) break;
    current = l;
    const frames = refs(l.event).filter((r) => r.$ref.startsWith('frames/'));
    if (frames.length) viewer.frame = frames[frames.length - 1].$ref;
  }
  const now = current ? current.node : null;
  for (const li of $('viewer-events').children) li.classList.toggle('now', li === now);
  if (viewer.frame && viewer.frame !== viewer.shownFrame) {
    viewer.shownFrame = viewer.frame;
    const data = await get(`/sessions/${viewer.id}/${viewer.frame}`, 'bytes');
    $('viewer-frame').src = URL.createObjectURL(new Blob([data], { type: 'image/jpeg' }));
    stats.frames++;
  }
  if (t > viewer.duration + 0.5) stopPlayback();
}

function stopPlayback() {
  if (!playing) return;
  for (const s of playing.sources) {
    try { s.stop(); } catch (e) { /* not started */ }
  }
  clearInterval(playing.timer);
  playing = null;
  stats.playing = false;
  $('play').disabled = false;
  $('pause').disabled = true;
}

/// The admin key is kept for this tab only (sessionStorage), or on this device (localStorage)
/// when the user asks; never in both.
function keepAdmin() {
  const remember = $('remember-admin').checked;
  (remember ? sessionStorage : localStorage).removeItem('omni-admin');
  (remember ? localStorage : sessionStorage).setItem('omni-admin', $('admin').value.trim());
}

$('remember-admin').checked = localStorage.getItem('omni-admin') !== null;
$('admin').value = localStorage.getItem('omni-admin') || sessionStorage.getItem('omni-admin') || '';
$('remember-admin').addEventListener('change', keepAdmin);
$('admin').addEventListener('change', () => {
  keepAdmin();
  refreshStatus();
  refreshRecordings();
});
$('refresh').onclick = refreshRecordings;
$('filter-text').oninput = showRecordings;
$('filter-mode').onchange = showRecordings;
$('filter-reason').onchange = showRecordings;
$('play').onclick = play;
$('pause').onclick = stopPlayback;
refreshStatus();
refreshRecordings();
setInterval(refreshStatus, 1000);
