//! The WebRTC client: str0m, the user's Opus frames replayed in real time, the model's voice
//! timed against its RTP clock.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use str0m::change::SdpAnswer;
use str0m::media::{Direction, Frequency, MediaKind, MediaTime};
use str0m::net::{Protocol, Receive};
use str0m::{Candidate, Event, Input, Output, Rtc, RtcConfig};

use super::{FRAME_MS, Heard, Shared, auth};

/// Posts the offer; the answer and the call's location.
fn post_offer(url: &str, key: Option<String>, sdp: String) -> Result<(String, String), String> {
    let agent = ureq::Agent::new_with_defaults();
    let mut req = agent.post(format!("{url}/v1/realtime/calls")).header("Content-Type", "application/sdp");
    if let Some(k) = &key {
        req = req.header("Authorization", k);
    }
    let mut resp = req.send(sdp).map_err(|e| format!("the offer: {e}"))?;
    let location = resp.headers().get("location").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    Ok((resp.body_mut().read_to_string().map_err(|e| format!("the answer: {e}"))?, location))
}

/// Hangs a call up.
fn hang_up(url: &str, key: Option<String>, location: &str) {
    let agent = ureq::Agent::new_with_defaults();
    let mut req = agent.post(format!("{url}{location}/hangup"));
    if let Some(k) = &key {
        req = req.header("Authorization", k);
    }
    let _ = req.send_empty();
}

pub(super) async fn call(shared: &Shared) -> Result<(), String> {
    let socket = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    socket.set_nonblocking(true).map_err(|e| e.to_string())?;
    let local = socket.local_addr().map_err(|e| e.to_string())?;
    let socket = tokio::net::UdpSocket::from_std(socket).map_err(|e| e.to_string())?;
    let crypto = Arc::new(str0m::crypto::from_feature_flags());
    let mut rtc: Rtc =
        RtcConfig::new().set_crypto_provider(crypto).clear_codecs().enable_opus(true, false).build(Instant::now());
    rtc.add_local_candidate(Candidate::host(local, "udp").map_err(|e| e.to_string())?);
    let mut change = rtc.sdp_api();
    let mid = change.add_media(MediaKind::Audio, Direction::SendRecv, None, None, None);
    let channel = change.add_channel("oai-events".into());
    let (offer, pending) = change.apply().ok_or("no offer")?;
    let (url, key, sdp) = (shared.args.url.clone(), auth(shared), offer.to_sdp_string());
    let (answer, location) =
        tokio::task::spawn_blocking(move || post_offer(&url, key, sdp)).await.map_err(|e| e.to_string())??;
    let answer = SdpAnswer::from_sdp_string(&answer).map_err(|e| format!("the answer: {e}"))?;
    rtc.sdp_api().accept_answer(pending, answer).map_err(|e| e.to_string())?;

    let (mut up, mut down) = (0u64, 0u64);
    let mut heard = Heard::default();
    let mut created: Option<Instant> = None;
    let mut next_frame = Instant::now();
    let mut frame_no = 0usize;
    let mut buf = vec![0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs_f64(shared.args.duration + 60.0);
    loop {
        // Drain the engine: datagrams out, events in, until its next deadline.
        let timeout = loop {
            match rtc.poll_output().map_err(|e| e.to_string())? {
                Output::Timeout(t) => break t,
                Output::Transmit(t) => {
                    up += t.contents.len() as u64;
                    let _ = socket.try_send_to(&t.contents, t.destination);
                }
                Output::Event(Event::ChannelData(d)) => {
                    let Ok(event) = serde_json::from_slice::<Value>(&d.data) else { continue };
                    match event["type"].as_str() {
                        Some("session.created") => {
                            created = Some(Instant::now());
                            next_frame = Instant::now();
                        }
                        Some("error") => return Err(format!("error event: {event}")),
                        _ => {}
                    }
                }
                Output::Event(Event::MediaData(m)) => {
                    let now = Instant::now();
                    // Opus silence is a few bytes; the reference backend's voice is not.
                    if m.data.len() > 20 {
                        heard.voice(now);
                    }
                    heard.frame(now, m.time.rebase(Frequency::MILLIS).numer() as f64);
                }
                Output::Event(_) => {}
            }
        };
        if let Some(since) = created
            && since.elapsed().as_secs_f64() >= shared.args.duration
        {
            let talked = since.elapsed();
            if let Some(mut ch) = rtc.channel(channel) {
                let _ = ch.write(false, br#"{"type":"response.cancel"}"#);
            }
            rtc.disconnect();
            heard.report(shared, up, down, talked);
            let (url, key) = (shared.args.url.clone(), auth(shared));
            let _ = tokio::task::spawn_blocking(move || hang_up(&url, key, &location)).await;
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("the call did not start".into());
        }
        let wake = if created.is_some() { timeout.min(next_frame) } else { timeout };
        tokio::select! {
            got = socket.recv_from(&mut buf) => {
                let (n, from): (usize, SocketAddr) = got.map_err(|e| e.to_string())?;
                down += n as u64;
                if let Ok(r) = Receive::new(Protocol::Udp, from, local, &buf[..n]) {
                    let _ = rtc.handle_input(Input::Receive(Instant::now(), r));
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                let now = Instant::now();
                if created.is_some() && now >= next_frame {
                    let i = heard.frame_out(shared, frame_no, shared.opus.len(), now);
                    let pt = rtc.writer(mid).and_then(|w| w.payload_params().next().map(|p| p.pt()));
                    if let (Some(pt), Some(writer)) = (pt, rtc.writer(mid)) {
                        let time = MediaTime::new(frame_no as u64 * 960, Frequency::FORTY_EIGHT_KHZ);
                        let _ = writer.write(pt, now, time, shared.opus[i].clone());
                    }
                    frame_no += 1;
                    next_frame += Duration::from_millis(FRAME_MS);
                    continue;
                }
                let _ = rtc.handle_input(Input::Timeout(now));
            }
        }
    }
}
