//! Phone calls: a Twilio Media Streams client written from Twilio's documentation (`connected`,
//! `start`, `media` frames of 20 ms of μ-law at 8 kHz in real time, `stop`) streams a spoken
//! question to `/v1/telephony/twilio` and hears the model back as `media` for its stream, a
//! `mark` after the answer, and a `clear` when it speaks over the next one; a key it presses
//! (`dtmf`) reaches the conversation.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::common::*;

const SID: &str = "MZ00000000000000000000000000000001";

/// 20 ms frames of μ-law at 8 kHz of `samples` (16 kHz).
fn frames(samples: &[f32]) -> Vec<String> {
    let narrow = omni_actors::audio::resample(samples, 16000, 8000).unwrap();
    narrow
        .chunks(160)
        .map(|f| {
            let bytes: Vec<u8> =
                f.iter().map(|&s| audio_codec_algorithms::encode_ulaw((s.clamp(-1.0, 1.0) * 32767.0) as i16)).collect();
            STANDARD.encode(bytes)
        })
        .collect()
}

fn media(n: usize, payload: &str) -> Message {
    Message::text(
        json!({"event": "media", "sequenceNumber": (n + 3).to_string(), "streamSid": SID,
               "media": {"track": "inbound", "chunk": (n + 1).to_string(), "timestamp": (n * 20).to_string(), "payload": payload}})
        .to_string(),
    )
}

/// A provider's messages, as its documentation writes them.
struct Provider {
    /// The `n`th 20 ms frame of the caller's voice.
    media: fn(usize, &str) -> Message,
    /// A mark sent back once what came before it played.
    mark: fn(&Value) -> Message,
    /// The caller pressed `digit`.
    dtmf: fn(&str) -> Message,
    /// What every message of the gateway's must be (it names the stream, it is 20 ms at least...).
    check: fn(&Value),
}

const TWILIO: Provider = Provider {
    media,
    mark: |name| {
        Message::text(
            json!({"event": "mark", "streamSid": SID, "sequenceNumber": "0", "mark": {"name": name}}).to_string(),
        )
    },
    dtmf: |digit| {
        Message::text(
            json!({"event": "dtmf", "streamSid": SID, "sequenceNumber": "0",
                   "dtmf": {"track": "inbound_track", "digit": digit}})
            .to_string(),
        )
    },
    check: |v| assert_eq!(v["streamSid"], SID, "every message names the stream: {v}"),
};

/// The caller asks; once the answer has played (its mark came back) it presses 7 and asks
/// again, and speaks over that second answer as soon as it starts. Between, the line is open
/// (silence), a frame every 20 ms as a provider sends them. Answers the first answer's mark and
/// how many bytes of voice came before it, once the provider was told to clear the second.
async fn converse<S, R>(to: &mut S, from: R, provider: &Provider, server: &Server) -> (Value, usize)
where
    S: futures_util::Sink<Message> + Unpin,
    S::Error: std::fmt::Debug,
    R: futures_util::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin + Send + 'static,
{
    let question = frames(&speech("What is the capital of France?"));
    let silence = frames(&[0.0; 160 * 2])[0].clone();
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let mut from = from;
    tokio::spawn(async move {
        while let Some(Ok(msg)) = from.next().await {
            match msg {
                Message::Text(t) => drop(tx.send(serde_json::from_str::<Value>(&t).unwrap())),
                Message::Close(_) => break,
                _ => {} // pings: answered by the socket
            }
        }
    });
    let mut script: std::collections::VecDeque<String> = question.iter().cloned().collect();
    let mut pace = tokio::time::interval(Duration::from_millis(20));
    let (mut sent, mut voice_bytes) = (0, 0usize);
    let (mut marked, mut asked_again, mut barged, mut cleared) = (None, false, false, false);
    while !cleared {
        assert!(
            sent < 50 * 30,
            "no clear within 30 s of the call: marked {marked:?}, asked again {asked_again}, barged {barged}, {voice_bytes} bytes of voice\n{}",
            server.logs()
        );
        pace.tick().await;
        let payload = script.pop_front().unwrap_or_else(|| silence.clone());
        to.send((provider.media)(sent, &payload)).await.unwrap();
        sent += 1;
        while let Ok(v) = heard.try_recv() {
            (provider.check)(&v);
            match v["event"].as_str() {
                Some("media") => {
                    voice_bytes += STANDARD.decode(v["media"]["payload"].as_str().unwrap()).unwrap().len();
                    if asked_again && !barged && script.is_empty() {
                        // The second answer plays: the caller speaks over it.
                        barged = true;
                        script.extend(question.iter().cloned());
                    }
                }
                Some("mark") => {
                    // Played (the provider sends the mark back once it has played what came before).
                    to.send((provider.mark)(&v["mark"]["name"])).await.unwrap();
                    if marked.is_none() {
                        marked = Some((v["mark"]["name"].clone(), voice_bytes));
                        to.send((provider.dtmf)("7")).await.unwrap();
                        asked_again = true;
                        script.extend(question.iter().cloned());
                    }
                }
                Some("clear") => {
                    assert!(barged, "a clear only when the caller speaks over the voice: {v}");
                    cleared = true;
                }
                other => panic!("the provider does not take {other:?}: {v}"),
            }
        }
    }
    marked.expect("a mark after the answer's voice")
}

/// The key reached the session: told as the hosted API tells a SIP call's, and in the
/// conversation as the caller's; the log never says which key.
fn the_key_reached_the_conversation(server: &Server, session: &str) {
    let events = std::fs::read_to_string(server.recording(session).join("events.jsonl")).unwrap();
    let told: Vec<Value> = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["dir"] == "out" && l["event"]["type"] == "input_audio_buffer.dtmf_event_received")
        .collect();
    assert_eq!(told.len(), 1, "{events}");
    assert_eq!(told[0]["event"]["event"], "7", "{}", told[0]);
    assert!(events.contains("(the caller pressed 7 on the keypad)"), "{events}");
    assert!(!server.logs().contains("pressed 7"), "{}", server.logs());
}

#[tokio::test]
async fn a_twilio_stream_is_heard_answered_marked_and_cleared() {
    let key = "twilio-key-0123456789";
    let server = Server::ready(
        Setup::default()
            .auth(&format!("api_keys = [\"{key}\"]"))
            .recording("enabled = true")
            .workers(workers(1, "step_ms = 300")),
    );
    let url = server.url(&format!("/v1/telephony/twilio?model=omni&key={key}")).replacen("http", "ws", 1);
    let (ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("Twilio connects");
    let (mut to, from) = ws.split();
    to.send(Message::text(json!({"event": "connected", "protocol": "Call", "version": "1.0.0"}).to_string()))
        .await
        .unwrap();
    let start = json!({"event": "start", "sequenceNumber": "1", "streamSid": SID,
        "start": {"accountSid": "AC1", "streamSid": SID, "callSid": "CA1", "tracks": ["inbound"],
                  "customParameters": {"instructions": "Be brief."},
                  "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}});
    to.send(Message::text(start.to_string())).await.unwrap();
    let (name, first_answer) = converse(&mut to, from, &TWILIO, &server).await;
    assert!(name.as_str().is_some_and(|n| n.starts_with("resp_")), "the mark names the answer: {name}");
    assert!((19_800..=20_200).contains(&first_answer), "2.5 s of voice at 8 kHz before the mark: {first_answer}");
    let status = server.status();
    assert_eq!(status["workers"][0]["transport"], "twilio", "{status}");
    let session = status["workers"][0]["session"].as_str().expect("the call's session").to_string();
    // The call hangs up.
    to.send(Message::text(json!({"event": "stop", "sequenceNumber": "999", "streamSid": SID, "stop": {}}).to_string()))
        .await
        .unwrap();
    server.wait_idle();
    assert!(server.logs().contains("ended (hangup)"), "{}", server.logs());
    the_key_reached_the_conversation(&server, &session);
}

const STREAM_ID: &str = "32DE0DEA-53CB-4B21-89A4-9E1819C043BC";

const TELNYX: Provider = Provider {
    media: |n, payload| {
        // Telnyx's counters are strings; its media names no stream but the message does.
        Message::text(
            json!({"event": "media", "sequence_number": (n + 3).to_string(), "stream_id": STREAM_ID,
                   "media": {"track": "inbound", "chunk": (n + 1).to_string(), "timestamp": (n * 20).to_string(),
                             "payload": payload}})
            .to_string(),
        )
    },
    mark: |name| {
        Message::text(
            json!({"event": "mark", "stream_id": STREAM_ID, "sequence_number": "0", "mark": {"name": name}})
                .to_string(),
        )
    },
    dtmf: |digit| {
        Message::text(
            json!({"event": "dtmf", "stream_id": STREAM_ID, "occurred_at": "2026-12-07T08:54:19.698408Z",
                   "sequence_number": "0", "dtmf": {"digit": digit}})
            .to_string(),
        )
    },
    check: |v| {
        // What goes back is Telnyx's own shape (no stream id), and a media message holds 20 ms
        // at least (Telnyx refuses less).
        assert!(v.get("stream_id").is_none() && v.get("streamSid").is_none(), "{v}");
        if v["event"] == "media" {
            let bytes = STANDARD.decode(v["media"]["payload"].as_str().unwrap()).unwrap().len();
            assert!(bytes >= 160, "{bytes} bytes: under 20 ms");
        }
    },
};

#[tokio::test]
async fn a_telnyx_stream_with_its_token_is_heard_answered_marked_and_cleared_and_needs_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("telnyx-token");
    std::fs::write(&token, "telnyx-stream-token-0123456789\n").unwrap();
    let server = Server::ready(
        Setup::default()
            .auth("api_keys = [\"some-api-key-0123456789\"]")
            .recording("enabled = true")
            .workers(workers(1, "step_ms = 300"))
            .extra(&format!("[telnyx]\nauth_token_file = \"{}\"\n", token.display())),
    );
    let url = server.url("/v1/telephony/telnyx").replacen("http", "ws", 1);
    let request = |token: Option<&str>| {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut req = url.as_str().into_client_request().unwrap();
        if let Some(t) = token {
            req.headers_mut().insert("x-telnyx-streaming-auth-token", t.parse().unwrap());
        }
        req
    };
    // No token and no key: 401; a wrong token: 403.
    for (token, status) in [(None, 401), (Some("telnyx-stream-token-0123456780"), 403)] {
        match tokio_tungstenite::connect_async(request(token)).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status().as_u16(), status),
            other => panic!("taken with {token:?}: {:?}", other.map(|_| ())),
        }
    }
    let (ws, _) = tokio_tungstenite::connect_async(request(Some("telnyx-stream-token-0123456789")))
        .await
        .expect("Telnyx connects");
    let (mut to, from) = ws.split();
    to.send(Message::text(json!({"event": "connected", "version": "1.0.0"}).to_string())).await.unwrap();
    let start = json!({"event": "start", "sequence_number": "1", "stream_id": STREAM_ID,
        "start": {"user_id": "3E6F995F-85F7-4705-9741-53B116D28237", "call_control_id": "v2:T02llQxIyaRkhfRK",
                  "call_session_id": "ff55a038-6f5d-11ef-9692-02420aeffb1f", "from": "+13122010094",
                  "to": "+13122123456", "tags": [], "client_state": "aGF2ZQ==",
                  "custom_parameters": {"instructions": "Be brief."},
                  "media_format": {"encoding": "PCMU", "sample_rate": 8000, "channels": 1}}});
    to.send(Message::text(start.to_string())).await.unwrap();
    let (name, first_answer) = converse(&mut to, from, &TELNYX, &server).await;
    assert!(name.as_str().is_some_and(|n| n.starts_with("resp_")), "the mark names the answer: {name}");
    assert!((19_800..=20_400).contains(&first_answer), "2.5 s of voice at 8 kHz before the mark: {first_answer}");
    let status = server.status();
    assert_eq!(status["workers"][0]["transport"], "telnyx", "{status}");
    let session = status["workers"][0]["session"].as_str().expect("the call's session").to_string();
    let stop = json!({"event": "stop", "sequence_number": "999", "stream_id": STREAM_ID,
        "stop": {"user_id": "3E6F995F-85F7-4705-9741-53B116D28237", "call_control_id": "v2:T02llQxIyaRkhfRK"}});
    to.send(Message::text(stop.to_string())).await.unwrap();
    server.wait_idle();
    assert!(server.logs().contains("ended (hangup)"), "{}", server.logs());
    assert!(!server.logs().contains("telnyx-stream-token"), "the token is never logged");
    the_key_reached_the_conversation(&server, &session);
}

#[tokio::test]
async fn a_stream_without_the_key_or_in_another_format_is_refused() {
    let server = Server::ready(Setup::default().auth("api_keys = [\"twilio-key-0123456789\"]"));
    let url = server.url("/v1/telephony/twilio").replacen("http", "ws", 1);
    match tokio_tungstenite::connect_async(url.as_str()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status().as_u16(), 401),
        other => panic!("accepted without a key: {:?}", other.map(|_| ())),
    }
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{url}?key=twilio-key-0123456789")).await.unwrap();
    let start = json!({"event": "start", "streamSid": SID, "start": {"streamSid": SID, "callSid": "CA2",
        "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": 16000, "channels": 1}}});
    ws.send(Message::text(start.to_string())).await.unwrap();
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.expect("closed in time") {
            Some(Ok(Message::Close(frame))) => {
                assert_eq!(frame.map(|f| u16::from(f.code)), Some(1003));
                break;
            }
            Some(Ok(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    server.wait_idle();
}

#[tokio::test]
async fn with_the_auth_token_only_a_stream_twilio_signed_is_taken_and_needs_no_key() {
    use hmac::Mac;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("twilio-token");
    std::fs::write(&token, "twilio-auth-token-0123456789\n").unwrap();
    let server = Server::ready(Setup::default().auth("api_keys = [\"twilio-key-0123456789\"]").extra(&format!(
        "[twilio]\nauth_token_file = \"{}\"\npublic_url = \"wss://gateway.example.com\"\n\
         [[models]]\nname = \"omni\"\nmodes = [\"audio\"]\n",
        token.display()
    )));
    // The model in the path, as Twilio's <Stream url> takes no query string.
    let path = "/v1/telephony/twilio/omni";
    let url = server.url(path).replacen("http", "ws", 1);
    let sign = |url: &str| {
        let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(b"twilio-auth-token-0123456789").unwrap();
        mac.update(url.as_bytes());
        STANDARD.encode(mac.finalize().into_bytes())
    };
    let request = |signature: Option<String>| {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut req = url.as_str().into_client_request().unwrap();
        if let Some(s) = signature {
            req.headers_mut().insert("X-Twilio-Signature", s.parse().unwrap());
        }
        req
    };
    // Unsigned, or signed for another URL (the one the gateway sees, not the public one): 403.
    for signature in [None, Some(sign(&url))] {
        match tokio_tungstenite::connect_async(request(signature)).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status().as_u16(), 403),
            other => panic!("taken without Twilio's signature: {:?}", other.map(|_| ())),
        }
    }
    // Signed for the URL the TwiML names: taken, without a key.
    let (mut ws, _) =
        tokio_tungstenite::connect_async(request(Some(sign(&format!("wss://gateway.example.com{path}")))))
            .await
            .expect("a signed stream is taken");
    let start = json!({"event": "start", "streamSid": SID, "start": {"streamSid": SID, "callSid": "CA3",
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}});
    ws.send(Message::text(start.to_string())).await.unwrap();
    server.wait_status("the stream's session", WAIT, |s| s["sessions"]["open"] == 1);
    ws.send(Message::text(json!({"event": "stop", "streamSid": SID, "stop": {}}).to_string())).await.unwrap();
    server.wait_idle();
    assert!(server.logs().contains("X-Twilio-Signature is missing or does not match"), "{}", server.logs());
    assert!(!server.logs().contains("twilio-auth-token"), "{}", server.logs());
    // The path names the model: one not served ends the stream's session with its reason.
    let nope = url.replace("/twilio/omni", "/twilio/nope");
    let signed = sign(&format!("wss://gateway.example.com{}", path.replace("/omni", "/nope")));
    let mut req = {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        nope.as_str().into_client_request().unwrap()
    };
    req.headers_mut().insert("X-Twilio-Signature", signed.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.expect("a signed stream is taken");
    while let Ok(Some(Ok(msg))) = tokio::time::timeout(WAIT, ws.next()).await {
        if msg.is_close() {
            break;
        }
    }
    server.wait_idle();
    assert!(server.logs().contains("model 'nope' is not served"), "{}", server.logs());
}
