'use strict';
// A WebRTC call to the gateway (POST /v1/realtime/calls), as the OpenAI Realtime API has them:
// the microphone goes out as Opus on an audio track, the model's voice comes back on it, and
// the events travel as JSON on the `oai-events` data channel. The client page uses it for audio
// sessions when the browser and the server can (see client.js).

class Call {
  /// `onEvent(event)` gets every server event; `onEnd(why)` once, when the call is over.
  constructor({ onEvent, onEnd }) {
    this.onEvent = onEvent;
    this.onEnd = onEnd;
    this.pc = null;
    this.channel = null;
    this.location = null;
    this.key = '';
    this.ended = false;
    this.stream = null;
  }

  static supported() {
    return typeof RTCPeerConnection === 'function' && !!(navigator.mediaDevices && navigator.mediaDevices.getUserMedia);
  }

  /// Opens the microphone, makes the offer and posts it. Throws with the server's error code
  /// (`err.code`) when it refuses the call.
  async open({ key, model, microphone, processing, remote }) {
    this.key = key;
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: {
        deviceId: microphone ? { exact: microphone } : undefined, channelCount: 1,
        echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing,
      },
    });
    // Muted until the session is created (unmute): what is said while the call waits in the
    // queue would not be heard by the model anyway (the server drops it).
    this.unmute(false);
    const pc = (this.pc = new RTCPeerConnection());
    for (const track of this.stream.getAudioTracks()) pc.addTrack(track, this.stream);
    pc.ontrack = (e) => { remote.srcObject = e.streams[0] || new MediaStream([e.track]); };
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === 'failed' || pc.connectionState === 'closed') this.end('connection_lost');
    };
    const channel = (this.channel = pc.createDataChannel('oai-events'));
    channel.onmessage = (m) => this.onEvent(JSON.parse(m.data));
    channel.onclose = () => this.end('channel_closed');
    await pc.setLocalDescription(await pc.createOffer());
    const r = await fetch('/v1/realtime/calls' + (model ? `?model=${encodeURIComponent(model)}` : ''), {
      method: 'POST',
      headers: Object.assign({ 'Content-Type': 'application/sdp' }, key ? { Authorization: 'Bearer ' + key } : {}),
      body: pc.localDescription.sdp,
    });
    if (r.status !== 201) {
      let code = 'call_refused';
      let message = `the server refused the call (HTTP ${r.status})`;
      try {
        const body = await r.json();
        if (body.error) ({ code, message } = body.error);
      } catch (e) { /* not JSON */ }
      this.close();
      const err = new Error(message);
      err.code = code;
      throw err;
    }
    this.location = r.headers.get('Location');
    await pc.setRemoteDescription({ type: 'answer', sdp: await r.text() });
  }

  /// The microphone's track settings (echo cancellation... as the browser applied them).
  settings() {
    const track = this.stream && this.stream.getAudioTracks()[0];
    return track && track.getSettings ? track.getSettings() : null;
  }

  /// The microphone goes out on the call (`on`), or silence does.
  unmute(on = true) {
    if (this.stream) this.stream.getAudioTracks().forEach((t) => { t.enabled = on; });
  }

  send(event) {
    if (this.channel && this.channel.readyState === 'open') this.channel.send(JSON.stringify(event));
  }

  /// Hangs up: the server ends the session (`hangup`), then the connection closes.
  async hangUp() {
    if (this.location) {
      try {
        await fetch(`${this.location}/hangup`, {
          method: 'POST', headers: this.key ? { Authorization: 'Bearer ' + this.key } : {},
        });
      } catch (e) { /* closing below ends it too */ }
    }
    this.end('hangup');
  }

  end(why) {
    if (this.ended) return;
    this.ended = true;
    this.close();
    this.onEnd(why);
  }

  close() {
    if (this.stream) this.stream.getTracks().forEach((t) => t.stop());
    if (this.pc) this.pc.close();
  }
}

window.Call = Call;
