'use strict';
// The client page: talks to /v1/realtime (the MiniCPM-o Realtime API) in audio, video or
// chat mode. Audio is captured at the device's rate, resampled to 16 kHz float32 and sent
// in chunks of the session's `input_chunk_ms`; the model's 24 kHz audio is scheduled gaplessly.
// Audio sessions are WebRTC calls instead when the browser and the server can (call.js): the
// browser sends the microphone as Opus and plays the model's voice from the call's track.

const $ = (id) => document.getElementById(id);

// What the page did, for people (the status line) and for the browser tests.
const stats = (window.omniStats = {
  state: 'idle', sessionId: null, positions: [], chunksSent: 0, framesSent: 0, deltas: 0,
  audioScheduled: 0, text: '', lastKv: null, interrupts: 0, playbackStopped: 0, errors: [],
  endReason: null, answers: 0, listenKv: [], playingNow: 0, heard: [], droppedWhileWaiting: 0, promptLength: null,
  transport: null, voiceStarted: 0, voiceStopped: 0, voiceCleared: 0, replySeconds: [], replyArrivalSeconds: [],
});

// ---- how long the model took to answer ----
/// A microphone block this loud (RMS) is the user talking.
const VOICE_RMS = 0.01;
/// When the microphone last heard the user (performance.now()), and whether the answer after
/// it has been timed.
let lastVoiceAt = null;
let replyTimed = true;
/// The answer whose voice was last timed (WebSocket sessions).
let voicedResponse = null;

function heardLevel(rms) {
  if (rms < VOICE_RMS || !capturingVoice()) return;
  lastVoiceAt = performance.now();
  replyTimed = false;
}

/// The model's voice starts playing at `at` (performance.now() time): the first time after the
/// user last spoke, the wait is shown ("answered 0.84 s after you stopped talking").
function voiceStartsAt(at) {
  if (replyTimed || lastVoiceAt == null || typeof at !== 'number' || at < lastVoiceAt) return;
  replyTimed = true;
  const seconds = (at - lastVoiceAt) / 1000;
  stats.replySeconds.push(seconds);
  $('reply-time').textContent = `The model answered ${seconds.toFixed(2)} s after you stopped talking.`;
}

function capturingVoice() {
  return (capturing && ws) || call;
}

const ERRORS = {
  queue_full: 'The queue is full. Please try again in a few minutes.',
  service_unavailable: 'No worker can serve this mode right now. Please try again later.',
  worker_busy: 'The assigned worker was busy. Please try again.',
  worker_connect_failed: 'The assigned worker could not be reached. Please try again.',
  inference_error: 'The model failed on that input; the session goes on.',
  rate_limited: 'You are sending too fast; some messages were dropped.',
  buffer_full: 'Too much is waiting for an answer; wait for one, then send again.',
  unauthorized: 'The server needs a valid API key (set it above).',
  too_many_attempts: 'Too many attempts with a wrong key from this address; wait a while, then try again.',
  too_many_connections: 'Too many connections from this address; close another session first.',
  too_many_waiting: 'Too many sessions from this address are already waiting in the queue.',
  forbidden_origin: 'The server does not accept connections from this page\'s address.',
};
const ENDINGS = {
  user_stop: 'You ended the session.',
  hangup: 'You ended the session.',
  timeout: 'The session reached its time limit.',
  context_full: "The conversation filled the model's memory. Start a new session to go on.",
  backend_error: 'The model stopped working. Start a new session.',
  server_shutdown: 'The server is restarting. Start a new session in a moment.',
  cancelled: 'An operator ended your wait in the queue.',
  heartbeat_timeout: 'The server did not hear from this page for too long.',
};
const STATES = {
  idle: 'Choose a mode and press Start.', connecting: 'Connecting…', queued: 'Waiting in the queue',
  starting: 'A worker is ready; starting the session…', listening: 'Listening', speaking: 'Speaking',
  ended: 'The session ended.',
};

function setState(state, detail) {
  stats.state = state;
  $('state').dataset.state = state;
  // A chat answer is written (and read out), not a voice one talks over: "Answering"; and a
  // chat waits for the user's message, it does not listen: "Your turn".
  const chat = { speaking: 'Answering', listening: 'Your turn' };
  $('state').textContent = (mode === 'chat' && chat[state]) || STATES[state] || state;
  if (detail !== undefined) $('detail').textContent = detail;
}

function wait(seconds) {
  if (seconds == null) return 'the wait is not known yet';
  if (seconds < 60) return `about ${Math.max(1, Math.round(seconds))} s to wait`;
  const minutes = Math.round(seconds / 60);
  return `about ${minutes} minute${minutes === 1 ? '' : 's'} to wait`;
}

function say(message) {
  $('detail').textContent = message;
}

// ---- base64 of float32 PCM ----
function f32ToBase64(samples) {
  const bytes = new Uint8Array(samples.buffer, samples.byteOffset, samples.byteLength);
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function base64ToF32(b64) {
  const text = atob(b64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return new Float32Array(bytes.buffer, 0, bytes.length >> 2);
}

function bytesToBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let text = '';
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

// ---- a streaming linear resampler (device rate to 16 kHz) ----
class Resampler {
  constructor(from, to) {
    this.step = from / to;
    this.pos = 0;
    this.prev = 0;
  }
  push(input) {
    const out = [];
    // Positions are measured in input samples; -1 is the last sample of the previous block.
    while (this.pos < input.length - 1) {
      const i = Math.floor(this.pos);
      const frac = this.pos - i;
      const a = i < 0 ? this.prev : input[i];
      out.push(a + (input[i + 1] - a) * frac);
      this.pos += this.step;
    }
    this.pos -= input.length;
    this.prev = input[input.length - 1];
    return Float32Array.from(out);
  }
}

// ---- playback ----
/// How far ahead of the audio clock a piece that does not follow on another is scheduled:
/// enough for the render thread to take it (a render quantum is 5.3 ms at 24 kHz).
const START_LEAD = 0.02;

class Player {
  constructor() {
    this.ctx = null;
    this.next = 0;
    this.sources = new Set();
  }
  ensure() {
    if (!this.ctx) this.ctx = new AudioContext({ sampleRate: 24000 });
    if (this.ctx.state === 'suspended') this.ctx.resume();
  }
  play(samples) {
    if (!samples.length) return;
    this.ensure();
    const buffer = this.ctx.createBuffer(1, samples.length, 24000);
    buffer.copyToChannel(samples, 0);
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.ctx.destination);
    const at = Math.max(this.ctx.currentTime + START_LEAD, this.next);
    source.start(at);
    this.next = at + buffer.duration;
    const startsAt = performance.now() + (at - this.ctx.currentTime) * 1000;
    this.sources.add(source);
    stats.playingNow = this.sources.size;
    source.onended = () => {
      this.sources.delete(source);
      stats.playingNow = this.sources.size;
    };
    stats.audioScheduled += samples.length;
    return startsAt;
  }
  stop() {
    for (const s of this.sources) {
      try { s.stop(); } catch (e) { /* already ended */ }
    }
    this.sources.clear();
    stats.playingNow = 0;
    this.next = 0;
    stats.playbackStopped++;
  }
  /// Seconds of the model's voice still to play.
  left() {
    return this.ctx ? Math.max(0, this.next - this.ctx.currentTime) : 0;
  }
}

// ---- the session ----
const player = new Player();
let ws = null;
/// The WebRTC call of an audio session, when it is one.
let call = null;
let mode = 'audio';
let capture = null;
let pending = [];
let clock = null;
let currentResponse = null;
let cutResponse = null;
let history = [];
let answerNode = null;
let opened = false;
/// The microphone's audio is kept for the model only once the session is ready: what is said
/// while waiting in the queue is dropped (and the page says so), never sent as one late chunk.
let capturing = false;
let heardWhileWaiting = 0;
let settleTimer = null;

/// The model has finished its turn: "Speaking" until its voice has played out, then "Listening".
function listenAfterPlayback(detail) {
  clearTimeout(settleTimer);
  settleTimer = null;
  const left = player.left();
  if (left <= 0.05) {
    setState('listening', detail);
    return;
  }
  setState('speaking', '');
  settleTimer = setTimeout(() => {
    settleTimer = null;
    if (stats.state === 'speaking') setState('listening', detail);
  }, left * 1000);
}

function line(who, text) {
  const p = document.createElement('p');
  p.className = who;
  p.textContent = text;
  $('transcript').appendChild(p);
  $('transcript').scrollTop = $('transcript').scrollHeight;
  return p;
}

function permissionMessage(e) {
  if (e && (e.name === 'NotAllowedError' || e.name === 'SecurityError')) {
    return mode === 'video'
      ? 'Permission to use the microphone or the camera was denied. Allow it in the browser, then press Start again.'
      : 'Permission to use the microphone was denied. Allow it in the browser, then press Start again.';
  }
  if (e && e.name === 'NotFoundError') return 'No microphone or camera was found.';
  if (!window.isSecureContext) return 'The browser only gives the microphone to pages served over https:// (or from localhost).';
  return 'The microphone could not be opened: ' + (e && e.message ? e.message : e);
}

async function startCapture(withVideo) {
  const processing = $('processing').checked;
  const mic = $('mic').value;
  const camera = $('camera').value;
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: {
      deviceId: mic ? { exact: mic } : undefined, channelCount: 1,
      echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing,
    },
    video: withVideo ? { deviceId: camera ? { exact: camera } : undefined, width: 640, height: 480 } : false,
  });
  const ctx = new AudioContext();
  await ctx.audioWorklet.addModule('/app/worklet.js');
  const node = new AudioWorkletNode(ctx, 'capture');
  const resampler = new Resampler(ctx.sampleRate, 16000);
  node.port.onmessage = (e) => {
    const block = e.data;
    let sum = 0;
    for (let i = 0; i < block.length; i++) sum += block[i] * block[i];
    $('level').value = Math.min(1, Math.sqrt(sum / block.length) * 4);
    heardLevel(Math.sqrt(sum / block.length));
    const samples = resampler.push(block);
    if (capturing) pending.push(samples);
    else {
      heardWhileWaiting += samples.length;
      stats.droppedWhileWaiting = heardWhileWaiting / 16000;
    }
  };
  const silent = ctx.createGain();
  silent.gain.value = 0;
  ctx.createMediaStreamSource(stream).connect(node).connect(silent).connect(ctx.destination);
  if (withVideo) $('preview').srcObject = stream;
  capture = { stream, ctx };
  const track = stream.getAudioTracks()[0];
  stats.audioSettings = track && track.getSettings ? track.getSettings() : null;
  listDevices();
}

function stopCapture() {
  if (!capture) return;
  capture.stream.getTracks().forEach((t) => t.stop());
  capture.ctx.close();
  capture = null;
  $('preview').srcObject = null;
  $('level').value = 0;
}

async function listDevices() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) return;
  const devices = await navigator.mediaDevices.enumerateDevices();
  for (const [select, kind] of [[$('mic'), 'audioinput'], [$('camera'), 'videoinput']]) {
    const chosen = select.value;
    select.replaceChildren(new Option('Default', ''));
    devices.filter((d) => d.kind === kind && d.deviceId).forEach((d, i) => {
      select.appendChild(new Option(d.label || `${kind === 'audioinput' ? 'Microphone' : 'Camera'} ${i + 1}`, d.deviceId));
    });
    select.value = chosen;
  }
}

function takeAudio() {
  let length = 0;
  for (const p of pending) length += p.length;
  const out = new Float32Array(length);
  let at = 0;
  for (const p of pending) {
    out.set(p, at);
    at += p.length;
  }
  pending = [];
  return out;
}

function frame() {
  const video = $('preview');
  if (!video.videoWidth) return null;
  const canvas = $('frame');
  canvas.getContext('2d').drawImage(video, 0, 0, canvas.width, canvas.height);
  stats.framesSent++;
  return canvas.toDataURL('image/jpeg', 0.7).split(',')[1];
}

/// Samples per `input.append` (16 kHz): the session's `input_chunk_ms`.
let chunkSamples = 16000;

/// One input.append of what was captured once a chunk's worth is there; `force` sends at once
/// (at least 4000 samples).
function sendChunk(force) {
  if (!ws || ws.readyState !== WebSocket.OPEN) return;
  let samples = takeAudio();
  if (samples.length < (force ? 4000 : chunkSamples)) {
    if (!force) {
      pending.unshift(samples);
      return;
    }
    const padded = new Float32Array(4000);
    padded.set(samples);
    samples = padded;
  }
  const input = { audio: f32ToBase64(samples) };
  if (mode === 'video') {
    const jpeg = frame();
    if (jpeg) input.video_frames = [jpeg];
  }
  if (force) input.force_listen = true;
  ws.send(JSON.stringify({ type: 'input.append', input }));
  stats.chunksSent++;
}

/// The answer on screen was cut short by the user: it is marked so (it does not read as whole).
function markCut() {
  if (answerNode && currentResponse) answerNode.classList.add('cut');
}

function interrupt() {
  if (call) {
    markCut();
    // The server cuts the model's voice on the call's track.
    call.send({ type: 'response.cancel' });
    call.send({ type: 'output_audio_buffer.clear' });
    stats.interrupts++;
    setState('listening', 'Interrupted: the model listens.');
    return;
  }
  if (!ws || mode === 'chat') return;
  markCut();
  cutResponse = currentResponse;
  clearTimeout(settleTimer);
  settleTimer = null;
  player.stop();
  stats.interrupts++;
  sendChunk(true);
  setState('listening', 'Interrupted: the model listens.');
}

async function start() {
  mode = $('mode').value;
  // Chat has nothing to talk over: no Interrupt.
  $('interrupt').hidden = mode === 'chat';
  stats.errors = [];
  stats.endReason = null;
  $('transcript').replaceChildren();
  history = [];
  capturing = false;
  heardWhileWaiting = 0;
  pending = [];
  lastVoiceAt = null;
  replyTimed = true;
  $('reply-time').textContent = '';
  setState('connecting', '');
  if (mode === 'audio' && $('transport').value !== 'websocket' && webrtcOn && window.Call && Call.supported()) {
    return startCall();
  }
  stats.transport = 'websocket';
  $('transport-used').textContent = '';
  player.ensure();
  if (mode !== 'chat') {
    try {
      await startCapture(mode === 'video');
    } catch (e) {
      setState('ended', permissionMessage(e));
      return;
    }
  }
  const key = $('key').value.trim();
  keepKey('omni-key', key, $('remember-key').checked);
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  // A browser cannot set headers on a WebSocket: the key travels as a subprotocol.
  const protocols = key ? ['realtime', 'openai-insecure-api-key.' + key] : undefined;
  ws = new WebSocket(`${scheme}://${location.host}/v1/realtime?mode=${mode}`, protocols);
  ws.onopen = () => {
    opened = true;
    // Said once the server has taken the connection, not while it is being made.
    $('transport-used').textContent = 'Connected over WebSocket.';
  };
  ws.onmessage = (m) => onEvent(JSON.parse(m.data));
  ws.onclose = onClose;
  opened = false;
  $('start').disabled = true;
  $('stop').disabled = false;
  $('mode').disabled = true;
}

function stop() {
  if (call) return call.hangUp();
  if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'session.close', reason: 'user_stop' }));
  else if (ws) ws.close();
}

function onEvent(ev) {
  switch (ev.type) {
    case 'session.queued':
    case 'session.queue_update':
      waiting(ev);
      break;
    case 'session.queue_done':
      setState('starting', '');
      ws.send(JSON.stringify({
        type: 'session.init',
        payload: mode === 'chat' ? { transcripts: true } : { system_prompt: $('prompt').value, transcripts: true },
      }));
      break;
    case 'session.created':
      stats.sessionId = ev.session_id;
      // Which backend answers (the reference one answers in words about what it heard).
      if (ev.backend) $('transport-used').textContent = `Connected over WebSocket; ${ev.backend} answers.`;
      stats.promptLength = ev.metrics ? ev.metrics.prompt_length : null;
      capturing = true;
      stats.droppedWhileWaiting = heardWhileWaiting / 16000;
      setState('listening', mode === 'chat' ? 'Type a message.' : heardWhileWaiting >= 16000
        ? `Talk now (the ${Math.round(heardWhileWaiting / 16000)} s before the session was ready were not sent).`
        : 'Talk whenever you like.');
      if (mode === 'chat') $('send').disabled = false;
      else {
        $('interrupt').disabled = false;
        // Chunks as short as the model answers best on (`input_chunk_ms`: a model that decides
        // on every chunk hears the end of speech within a quarter of a second), else a second.
        chunkSamples = Math.max(4000, Math.round((ev.input_chunk_ms || 1000) * 16));
        clock = setInterval(() => sendChunk(false), 50);
      }
      break;
    case 'response.output.delta':
      onDelta(ev);
      break;
    case 'response.done':
      onDone(ev);
      break;
    case 'input.transcript':
      // What the model heard you say (a backend that transcribes, or the gateway's recogniser).
      if (ev.text) line('user', ev.text);
      stats.heard.push(ev.text);
      break;
    case 'session.closed':
      stats.endReason = ev.reason;
      break;
    case 'error':
      stats.errors.push(ev.error.code);
      say(ERRORS[ev.error.code] || ev.error.message);
      break;
  }
}

// ---- an audio session as a WebRTC call (the OpenAI Realtime events on its data channel) ----
async function startCall() {
  stats.transport = 'webrtc';
  currentResponse = null;
  $('transport-used').textContent = '';
  const key = $('key').value.trim();
  keepKey('omni-key', key, $('remember-key').checked);
  $('start').disabled = true;
  $('mode').disabled = true;
  call = new Call({ onEvent: onCallEvent, onEnd: onCallEnd });
  try {
    await call.open({ key, microphone: $('mic').value, processing: $('processing').checked, remote: $('remote') });
  } catch (e) {
    const refused = e && e.code;
    if (refused) stats.errors.push(e.code);
    call = null;
    endSession(refused ? (ERRORS[e.code] || e.message) : permissionMessage(e));
    return;
  }
  // Said once the server has answered the call, not while it is being made.
  $('transport-used').textContent = 'Connected over WebRTC.';
  stats.audioSettings = call.settings();
  $('stop').disabled = false;
  showLevel(call.stream);
  listDevices();
}

/// The microphone's level on the meter, while the call lasts.
function showLevel(stream) {
  const ctx = new AudioContext();
  const analyser = ctx.createAnalyser();
  ctx.createMediaStreamSource(stream).connect(analyser);
  const block = new Float32Array(analyser.fftSize);
  const timer = setInterval(() => {
    if (!call) {
      clearInterval(timer);
      ctx.close();
      $('level').value = 0;
      return;
    }
    analyser.getFloatTimeDomainData(block);
    let sum = 0;
    for (let i = 0; i < block.length; i++) sum += block[i] * block[i];
    $('level').value = Math.min(1, Math.sqrt(sum / block.length) * 4);
    heardLevel(Math.sqrt(sum / block.length));
  }, 20);
}

function onCallEvent(ev) {
  switch (ev.type) {
    case 'session.queued':
    case 'session.queue_update':
      waiting(ev);
      break;
    case 'session.created': {
      stats.sessionId = ev.session.id;
      if (ev.backend) $('transport-used').textContent = `Connected over WebRTC; ${ev.backend} answers.`;
      call.unmute();
      // The prompt, and transcripts of the user's turns (what the model heard: "You: ...").
      const session = { type: 'realtime', audio: { input: { transcription: { model: 'whisper-1' } } } };
      const prompt = $('prompt').value.trim();
      if (prompt) session.instructions = prompt;
      call.send({ type: 'session.update', session });
      $('interrupt').disabled = false;
      setState('listening', 'Talk whenever you like.');
      break;
    }
    case 'conversation.item.input_audio_transcription.completed':
      if (ev.transcript) line('user', ev.transcript);
      stats.heard.push(ev.transcript);
      break;
    case 'response.output_audio_transcript.delta':
    case 'response.output_text.delta':
      stats.deltas++;
      if (ev.response_id !== currentResponse) {
        currentResponse = ev.response_id;
        answerNode = line('model', '');
      }
      stats.text += ev.delta;
      answerNode.textContent += ev.delta;
      break;
    case 'output_audio_buffer.started':
      stats.voiceStarted++;
      voiceStartsAt(performance.now());
      setState('speaking', '');
      break;
    case 'output_audio_buffer.stopped':
      stats.voiceStopped++;
      if (stats.state === 'speaking') setState('listening');
      break;
    case 'output_audio_buffer.cleared':
      stats.voiceCleared++;
      setState('listening', 'Interrupted: the model listens.');
      break;
    case 'response.done':
      stats.answers++;
      currentResponse = null;
      break;
    case 'error':
      stats.errors.push(ev.error.code);
      say(ERRORS[ev.error.code] || ev.error.message);
      break;
  }
}

function onCallEnd(why) {
  stats.endReason = why;
  call = null;
  let message = ENDINGS[why];
  if (!message && stats.errors.length) message = ERRORS[stats.errors[stats.errors.length - 1]];
  endSession(message || 'The connection to the server was lost.');
}

/// The controls after a session, whichever its transport.
function endSession(message) {
  setState('ended', message);
  $('transport-used').textContent = '';
  $('start').disabled = false;
  $('stop').disabled = true;
  $('interrupt').disabled = true;
  $('send').disabled = true;
  $('mode').disabled = false;
}

function onDelta(ev) {
  stats.deltas++;
  if (ev.metrics && ev.metrics.kv_cache_length != null) stats.lastKv = ev.metrics.kv_cache_length;
  if (ev.kind === 'listen') {
    if (stats.lastKv != null) stats.listenKv.push(stats.lastKv);
    if (stats.state !== 'listening' && !settleTimer) listenAfterPlayback();
    return;
  }
  if (ev.response_id && ev.response_id === cutResponse) return; // interrupted: nothing more of it
  if (ev.response_id !== currentResponse) {
    currentResponse = ev.response_id;
    answerNode = line('model', '');
  }
  setState('speaking', '');
  if (ev.kind === 'text') {
    stats.text += ev.text;
    answerNode.textContent += ev.text;
  } else if (ev.kind === 'audio') {
    const arrived = performance.now();
    const startsAt = player.play(base64ToF32(ev.audio));
    // Timed on an answer's first audio only (a cough during it re-arms nothing).
    // (an empty delta that only ends the turn is no voice)
    if (startsAt != null && ev.response_id !== voicedResponse) {
      voicedResponse = ev.response_id;
      // (and when it arrived, for a benchmark to tell the network's part from the player's)
      if (!replyTimed && lastVoiceAt != null) stats.replyArrivalSeconds.push((arrived - lastVoiceAt) / 1000);
      voiceStartsAt(startsAt);
    }
  }
  if (ev.end_of_turn) {
    stats.answers++;
    listenAfterPlayback();
  }
}

function onDone(ev) {
  stats.answers++;
  if (ev.response_id !== currentResponse) answerNode = line('model', ev.text);
  else if (answerNode && !answerNode.textContent) answerNode.textContent = ev.text;
  if (ev.audio) player.play(base64ToF32(ev.audio));
  history.push({ role: 'assistant', content: ev.text });
  currentResponse = null;
  listenAfterPlayback();
  $('send').disabled = false;
}

/// A browser hides why a WebSocket handshake was refused; the same request over plain HTTP
/// gets the server's answer (unauthorized, too many connections...) as JSON.
async function refusal() {
  const key = $('key').value.trim();
  try {
    const r = await fetch(`/v1/realtime?mode=${mode}`, { headers: key ? { Authorization: 'Bearer ' + key } : {} });
    const body = await r.json();
    const code = body && body.error && body.error.code;
    if (r.status !== 400 && code) {
      stats.errors.push(code);
      return ERRORS[code] || body.error.message;
    }
  } catch (e) { /* the server is not there at all */ }
  return 'The server could not be reached.';
}

async function onClose(e) {
  clearInterval(clock);
  clock = null;
  stopCapture();
  ws = null;
  let message = ENDINGS[stats.endReason];
  if (!opened) message = await refusal();
  if (!message && stats.errors.length) message = ERRORS[stats.errors[stats.errors.length - 1]];
  if (!message && e.code === 1006) message = 'The connection to the server was lost.';
  if (!message && e.code !== 1000) message = `The server closed the connection (${e.code}${e.reason ? ': ' + e.reason : ''}).`;
  endSession(message || 'The session ended.');
}

async function attachment() {
  const file = $('attachment').files[0];
  if (!file) return null;
  const data = await file.arrayBuffer();
  if (file.type.startsWith('image/')) return { type: 'image', data: bytesToBase64(data) };
  // Audio: decoded and resampled to 16 kHz mono float32.
  const decoded = await new AudioContext().decodeAudioData(data);
  const offline = new OfflineAudioContext(1, Math.ceil(decoded.duration * 16000), 16000);
  const source = offline.createBufferSource();
  source.buffer = decoded;
  source.connect(offline.destination);
  source.start();
  const rendered = await offline.startRendering();
  return { type: 'audio', data: f32ToBase64(rendered.getChannelData(0)) };
}

async function send() {
  const text = $('message').value.trim();
  let part;
  try {
    part = await attachment();
  } catch (e) {
    say('The attachment could not be read: ' + e.message);
    return;
  }
  if (!text && !part) return;
  const content = part ? [{ type: 'text', text }, part] : text;
  history.push({ role: 'user', content });
  line('user', text + (part ? ` [${part.type}]` : ''));
  $('message').value = '';
  $('attachment').value = '';
  $('send').disabled = true;
  answerNode = null;
  currentResponse = null;
  ws.send(JSON.stringify({
    type: 'input.append',
    input: { messages: history, streaming: true, tts: { enabled: $('speech').checked } },
  }));
}

function showMode() {
  document.body.dataset.mode = $('mode').value;
}

/// The modes the server serves, and whether a worker of each is up (`GET /v1/modes`).
let served = null;
/// Whether the server answers WebRTC calls.
let webrtcOn = false;
async function loadModes() {
  try {
    const r = await fetch('/v1/modes');
    if (!r.ok) return;
    const body = await r.json();
    served = body.modes;
    webrtcOn = !!body.webrtc;
  } catch (e) {
    return;
  }
  stats.served = served;
  for (const option of $('mode').options) {
    const m = served[option.value];
    option.hidden = option.disabled = !!m && !m.served;
  }
  if ($('mode').selectedOptions[0] && $('mode').selectedOptions[0].disabled) {
    const first = [...$('mode').options].find((o) => !o.disabled);
    if (first) $('mode').value = first.value;
    showMode();
  }
}

/// A queue event, whichever the transport: the position, and whether a worker is up.
function waiting(ev) {
  stats.positions.push(ev.position);
  setState('queued', queueDetail(ev));
  loadModes();
}

/// Said while waiting: the position and wait, or plainly that no worker is up.
function queueDetail(ev) {
  const m = served && served[mode];
  if (m && !m.up) return `Position ${ev.position} of ${ev.queue_length}. No worker is up right now; you keep your place until one is.`;
  // Until a session like this one has ended here, the estimate is a guess: no number is shown.
  const wait_text = ev.estimate === 'typical' ? 'a worker is busy' : wait(ev.estimated_wait_s);
  return `Position ${ev.position} of ${ev.queue_length}; ${wait_text}.`;
}

$('mode').addEventListener('change', showMode);
$('start').addEventListener('click', start);
$('stop').addEventListener('click', stop);
$('interrupt').addEventListener('click', interrupt);
$('send').addEventListener('click', send);
$('message').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    if (!$('send').disabled) send();
  }
});
document.addEventListener('keydown', (e) => {
  if (e.key === 'Escape') interrupt();
});
/// A key is kept for this tab only (sessionStorage), or on this device (localStorage) when the
/// user asks; never in both.
function keepKey(name, value, remember) {
  (remember ? sessionStorage : localStorage).removeItem(name);
  (remember ? localStorage : sessionStorage).setItem(name, value);
}

$('remember-key').checked = localStorage.getItem('omni-key') !== null;
$('key').value = localStorage.getItem('omni-key') || sessionStorage.getItem('omni-key') || '';
$('remember-key').addEventListener('change', () => keepKey('omni-key', $('key').value.trim(), $('remember-key').checked));
showMode();
listDevices();
loadModes();
