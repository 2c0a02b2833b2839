//! The pages in a real browser: Debian's `chromium`, driven through `chromedriver` with
//! WebDriver (the fantoccini crate), against the real server. Chromium runs headless with a
//! fake microphone that plays a WAV file this test writes (tone bursts, which the reference
//! backend hears as speech, and silences) and a fake camera.
//!
//! It needs `chromium` and `chromium-driver` (`common::needs`: skipped without them by a plain
//! `cargo test`, a failure under `./test.sh`); `.ci/run` installs both. Every test saves screenshots of
//! what it saw in `target/screenshots/`.

use crate::common::*;
use fantoccini::Locator;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn an_audio_session_in_the_browser_streams_the_microphone_and_plays_the_answer() {
    if !needs(&[Need::Browser]) {
        return;
    }
    // A backend that answers best on chunks of a quarter of a second (ABI 1.2 `step_samples`).
    let server = Server::ready(
        Setup::default().workers(workers(1, "chunk_ms = 250")).auth("api_keys = [\"browser-key-0123456789\"]"),
    );
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(2.0, 5.0)])).await;
    open_client(&b, &server, "audio").await;
    screenshot(&b, "client-idle").await;

    // Without the key the server refuses, and the page says why in plain words.
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "unauthorized").await;
    let detail = js(&b, "document.getElementById('detail').textContent").await;
    assert!(detail.as_str().unwrap().contains("API key"), "{detail}");

    b.find(Locator::Id("key")).await.unwrap().send_keys("browser-key-0123456789").await.unwrap();
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.sessionId", "created").await;
    let said = js(&b, "document.getElementById('transport-used').textContent").await;
    assert_eq!(said, "Connected over WebSocket; omni-reference answers.", "the page names what answers");
    until(&b, &server, "window.omniStats.chunksSent >= 3", "streaming").await;
    screenshot(&b, "client-listening").await;
    // The microphone's raw signal (no echo cancellation, noise suppression or gain control
    // unless switched on), a level meter that moves, and the devices listed.
    let settings = js(&b, "window.omniStats.audioSettings").await;
    assert_eq!(settings["echoCancellation"], false, "{settings}");
    assert_eq!(settings["autoGainControl"], false, "{settings}");
    until(&b, &server, "document.getElementById('level').value > 0.05", "level").await;
    let mics = js(&b, "document.getElementById('mic').options.length").await;
    assert!(mics.as_i64().unwrap() >= 2, "no microphone listed beside Default: {mics}");
    // The tone was heard as speech: the model answers with text and audio, scheduled to play.
    until(
        &b,
        &server,
        "window.omniStats.audioScheduled > 24000 && window.omniStats.text.includes('I heard')",
        "answer",
    )
    .await;
    screenshot(&b, "client-speaking").await;
    until(&b, &server, "window.omniStats.answers >= 1", "answer done").await;
    // "Speaking" lasts until the answer has played out, then "Listening".
    until(&b, &server, "window.omniStats.state === 'listening'", "listening again").await;
    let left = js(&b, "player.left()").await.as_f64().unwrap();
    assert!(left < 0.1, "the page said Listening with {left} s of the answer still to play");
    let s = stats(&b).await;
    // The wait from the end of the tone to the answer's voice is timed and shown.
    let waited = s["replySeconds"][0].as_f64().unwrap_or(-1.0);
    assert!(waited > 0.0 && waited < 5.0, "reply time {waited} s: {s}");
    let shown = js(&b, "document.getElementById('reply-time').textContent").await;
    assert!(shown.as_str().unwrap().starts_with("The model answered "), "{shown}");
    let transcript = js(&b, "document.getElementById('transcript').textContent").await;
    assert!(transcript.as_str().unwrap().contains("I heard"), "{transcript}");
    // The chunks are about a quarter of a second of 16 kHz audio each, as `session.created`
    // said (`input_chunk_ms`): the reference backend's KV grows by 1 + 25 tokens per second.
    let kv: Vec<i64> = serde_json::from_value(s["listenKv"].clone()).unwrap();
    let steps: Vec<i64> = kv.windows(2).map(|w| w[1] - w[0]).filter(|d| *d > 0).collect();
    assert!(steps.iter().any(|d| (6..=9).contains(d)), "KV steps {steps:?}: chunks are not ~250 ms of 16 kHz audio");

    click(&b, "stop").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "stopped").await;
    assert_eq!(js(&b, "window.omniStats.endReason").await, "user_stop");
    let detail = js(&b, "document.getElementById('detail').textContent").await;
    assert_eq!(detail, "You ended the session.");
    screenshot(&b, "client-ended").await;
    b.close().await.unwrap();
    server.wait_idle();
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupting_stops_playback_at_once_and_sends_force_listen() {
    if !needs(&[Need::Browser]) {
        return;
    }
    // Long answers (20 steps of speech), so there is something to interrupt.
    let server = Server::ready(Setup::default().workers(workers(1, "reply_steps = 20")).recording("enabled = true"));
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(2.0, 30.0)])).await;
    open_client(&b, &server, "audio").await;
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.playingNow > 0", "speaking").await;
    // Esc is the shortcut for the button.
    b.find(Locator::Css("body")).await.unwrap().send_keys("\u{e00c}").await.unwrap();
    let s = stats(&b).await;
    assert_eq!(s["interrupts"], 1, "{s}");
    assert_eq!(s["playbackStopped"], 1, "{s}");
    // The answer on screen is marked as cut short.
    assert_eq!(js(&b, "document.querySelectorAll('#transcript .model.cut').length").await, 1);
    assert_eq!(s["playingNow"], 0, "playback still going after the interrupt: {s}");
    let scheduled = s["audioScheduled"].as_i64().unwrap();
    // Nothing more of the interrupted answer is played: the server cut it. Four steps answered
    // with a listen since (the microphone is silent now), each of which would have carried the
    // answer's next piece had it gone on.
    let listens = s["listenKv"].as_array().unwrap().len() + 4;
    until(&b, &server, &format!("window.omniStats.listenKv.length >= {listens}"), "after-the-cut").await;
    let s = stats(&b).await;
    assert_eq!(s["audioScheduled"].as_i64().unwrap(), scheduled, "the interrupted answer went on playing: {s}");
    assert_eq!(s["playingNow"], 0, "{s}");
    screenshot(&b, "client-interrupted").await;
    let id = s["sessionId"].as_str().unwrap().to_string();
    click(&b, "stop").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "stopped").await;
    b.close().await.unwrap();

    // The recording shows the chunk the page sent with force_listen.
    let events = std::fs::read_to_string(server.recording(&id).join("events.jsonl")).unwrap();
    let forced = events
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["dir"] == "in" && l["event"]["input"]["force_listen"] == true)
        .count();
    assert_eq!(forced, 1, "{events}");
    server.wait_idle();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_video_session_sends_camera_frames_and_the_console_replays_its_recording() {
    if !needs(&[Need::Browser]) {
        return;
    }
    let server = Server::ready(Setup::default().recording("enabled = true").admin_key("console-admin-0123456789"));
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(2.0, 4.0)])).await;
    open_client(&b, &server, "video").await;
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.framesSent >= 4", "frames").await;
    until(&b, &server, "window.omniStats.answers >= 1", "answer").await;
    screenshot(&b, "client-video").await;
    let s = stats(&b).await;
    // Each chunk carried one frame: the reference backend counts 64 tokens for it on top
    // of the ~26 of a second of audio.
    let kv: Vec<i64> = serde_json::from_value(s["listenKv"].clone()).unwrap();
    let steps: Vec<i64> = kv.windows(2).map(|w| w[1] - w[0]).filter(|d| *d > 0).collect();
    assert!(steps.iter().any(|d| (84..=100).contains(d)), "KV steps {steps:?}: frames not counted");
    let id = s["sessionId"].as_str().unwrap().to_string();
    click(&b, "stop").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "stopped").await;
    server.recording(&id);

    // The console, with the admin key typed in.
    b.goto(&format!("http://{}/console", server.addr)).await.unwrap();
    until(&b, &server, "document.getElementById('problem').textContent.length > 0", "needs key").await;
    b.find(Locator::Id("admin")).await.unwrap().send_keys("console-admin-0123456789").await.unwrap();
    click(&b, "refresh").await; // moves the focus: the key's change event
    until(&b, &server, "window.consoleStats.recordings >= 1", "recordings").await;
    // Kept for this tab only: the user did not ask to remember it.
    let kept = js(&b, "[localStorage.getItem('omni-admin'), sessionStorage.getItem('omni-admin')]").await;
    assert_eq!(kept, json!([null, "console-admin-0123456789"]));
    let workers = until(
        &b,
        &server,
        "document.querySelector('#workers tbody tr') && \
                                       document.querySelector('#workers tbody').textContent",
        "workers",
    )
    .await;
    assert!(workers.as_str().unwrap().contains("idle"), "{workers}");
    screenshot(&b, "console").await;
    // Filters: a mode with no recording hides it, the right one shows it.
    b.find(Locator::Id("filter-mode")).await.unwrap().select_by_value("chat").await.unwrap();
    until(&b, &server, "window.consoleStats.recordings === 0", "filtered out").await;
    b.find(Locator::Id("filter-mode")).await.unwrap().select_by_value("video").await.unwrap();
    until(&b, &server, "window.consoleStats.recordings === 1", "filtered in").await;

    b.find(Locator::Css(&format!("#recordings tr[data-session='{id}']"))).await.unwrap().click().await.unwrap();
    let events =
        until(&b, &server, &format!("window.consoleStats.viewing === '{id}' && window.consoleStats.events"), "viewer")
            .await;
    assert!(events.as_i64().unwrap() > 5, "{events}");
    let listed = js(&b, "document.getElementById('viewer-events').textContent").await;
    let listed = listed.as_str().unwrap();
    for line in ["client: session.init", "client: input.append", "server: listen", "server: text: Reply 1: I heard"] {
        assert!(listed.contains(line), "the viewer does not list {line:?}: {listed}");
    }
    click(&b, "play").await;
    until(&b, &server, "window.consoleStats.playing && window.consoleStats.scheduled > 3", "playing").await;
    until(&b, &server, "window.consoleStats.frames >= 2", "frames shown").await;
    let shown = js(&b, "document.getElementById('viewer-frame').naturalWidth").await;
    assert_eq!(shown, 640, "the recorded camera frame did not decode as an image");
    screenshot(&b, "console-viewer").await;
    b.close().await.unwrap();
    server.wait_idle();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chat_turn_with_an_image_streams_the_answer() {
    if !needs(&[Need::Browser]) {
        return;
    }
    let server = Server::ready(Setup::default());
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(0.5, 0.5)])).await;
    open_client(&b, &server, "chat").await;
    click(&b, "start").await;
    until(&b, &server, "!document.getElementById('send').disabled", "chat ready").await;
    b.find(Locator::Id("message")).await.unwrap().send_keys("Reply with exactly: the sky is blue").await.unwrap();
    click(&b, "send").await;
    until(&b, &server, "window.omniStats.answers === 1", "text answer").await;
    assert_eq!(js(&b, "window.omniStats.text").await, "the sky is blue");
    // Chat has nothing to talk over: no Interrupt, and an answer is "Answering", not "Speaking".
    assert_eq!(js(&b, "document.getElementById('interrupt').hidden").await, true);
    assert!(!js(&b, "document.body.textContent").await.as_str().unwrap().contains("Speaking"));
    // Nor does it listen: it waits for the user's message.
    until(&b, &server, "document.getElementById('state').textContent === 'Your turn'", "chat your turn").await;
    assert!(js(&b, "window.omniStats.audioScheduled").await.as_i64().unwrap() > 0, "no spoken answer");

    let image = dir.path().join("photo.jpg");
    std::fs::write(&image, base64::Engine::decode(&base64::engine::general_purpose::STANDARD, jpeg_b64()).unwrap())
        .unwrap();
    b.find(Locator::Id("attachment")).await.unwrap().send_keys(image.to_str().unwrap()).await.unwrap();
    click(&b, "send").await;
    until(&b, &server, "window.omniStats.answers === 2", "image answer").await;
    let transcript = js(&b, "document.getElementById('transcript').textContent").await;
    assert!(transcript.as_str().unwrap().contains("and 1 image."), "{transcript}");
    screenshot(&b, "client-chat").await;
    click(&b, "stop").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "stopped").await;
    b.close().await.unwrap();
    server.wait_idle();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_browser_in_the_queue_sees_its_position_fall() {
    if !needs(&[Need::Browser]) {
        return;
    }
    let server = Server::ready(Setup::default());
    let busy = active(&server, "audio").await;
    let mut ahead = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    assert_eq!(ahead.expect("session.queued").await["position"], 1);

    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(0.5, 3.0)])).await;
    open_client(&b, &server, "audio").await;
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.positions.includes(2)", "position 2").await;
    let detail = js(&b, "document.getElementById('detail').textContent").await;
    assert!(detail.as_str().unwrap().starts_with("Position 2 of 2"), "{detail}");
    screenshot(&b, "client-queued").await;
    ahead.close_socket().await;
    until(&b, &server, "window.omniStats.positions.includes(1)", "position 1").await;
    busy.close_socket().await;
    until(&b, &server, "window.omniStats.sessionId", "served").await;
    // Updates may repeat a position (the expected wait changed); a position never rises.
    let positions: Vec<i64> = serde_json::from_value(js(&b, "window.omniStats.positions").await).unwrap();
    assert!(positions.windows(2).all(|w| w[1] <= w[0]), "a position went up: {positions:?}");
    assert_eq!((positions.first(), positions.last()), (Some(&2), Some(&1)), "{positions:?}");
    click(&b, "stop").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "stopped").await;
    b.close().await.unwrap();
    server.wait_idle();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_queue_and_a_lost_connection_are_told_in_plain_words() {
    if !needs(&[Need::Browser]) {
        return;
    }
    let mut server = Server::ready(Setup::default().queue("max_waiting = 0"));
    let busy = active(&server, "audio").await;
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(0.5, 3.0)])).await;
    open_client(&b, &server, "audio").await;
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "queue full").await;
    assert_eq!(
        js(&b, "document.getElementById('detail').textContent").await,
        "The queue is full. Please try again in a few minutes."
    );
    busy.close_socket().await;
    server.wait_idle();

    click(&b, "start").await;
    until(&b, &server, "window.omniStats.sessionId", "served").await;
    server.skip_invariants();
    server.signal("KILL");
    until(&b, &server, "window.omniStats.state === 'ended'", "lost").await;
    assert_eq!(js(&b, "document.getElementById('detail').textContent").await, "The connection to the server was lost.");
    screenshot(&b, "client-lost").await;
    b.close().await.unwrap();
}

/// What is said while waiting in the queue is not sent when the session starts (the page says
/// so): no late chunk of the whole wait, and the chunks stay about a second long.
#[tokio::test(flavor = "multi_thread")]
async fn speech_while_waiting_in_the_queue_is_dropped_visibly_not_sent_late() {
    if !needs(&[Need::Browser]) {
        return;
    }
    let server = Server::ready(Setup::default());
    let busy = active(&server, "audio").await;
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(0.5, 3.0)])).await;
    open_client(&b, &server, "audio").await;
    click(&b, "start").await;
    // Two seconds in the queue with the microphone open (the page counts what it drops).
    until(&b, &server, "window.omniStats.state === 'queued' && window.omniStats.droppedWhileWaiting >= 2", "waited")
        .await;
    busy.close_socket().await;
    until(&b, &server, "window.omniStats.sessionId", "served").await;
    let dropped = js(&b, "window.omniStats.droppedWhileWaiting").await.as_f64().unwrap();
    assert!(dropped >= 2.0, "{dropped} s heard while waiting");
    let detail = js(&b, "document.getElementById('detail').textContent").await;
    assert!(detail.as_str().unwrap().contains("were not sent"), "{detail}");
    until(&b, &server, "window.omniStats.listenKv.length >= 3", "listened").await;
    // The reference backend's KV grows by 1 + 25 a second of audio: the first step heard one
    // chunk of about a second, not the wait.
    let kv: Vec<i64> = serde_json::from_value(stats(&b).await["listenKv"].clone()).unwrap();
    let prompt = js(&b, "window.omniStats.promptLength").await.as_i64().unwrap();
    assert!(kv[0] - prompt <= 34, "the first step heard more than a second: KV {kv:?} after a prompt of {prompt}");
    click(&b, "stop").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "stopped").await;
    b.close().await.unwrap();
}

/// The page offers only the modes some worker serves (`GET /v1/modes`), and while no worker is
/// up it says so plainly instead of a wait.
#[tokio::test(flavor = "multi_thread")]
async fn the_page_offers_only_the_modes_served_and_says_when_no_worker_is_up() {
    if !needs(&[Need::Browser]) {
        return;
    }
    // One audio worker, still opening (a model loading for a minute).
    let server = Server::start(
        Setup::default()
            .workers("[[workers]]\nname = \"slow\"\nmodes = [\"audio\"]\n[workers.options]\nopen_ms = 60000\n".into()),
    );
    let (code, body) = server.get("/v1/modes");
    assert_eq!(code, 200, "{body}");
    let modes: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(modes["modes"]["audio"], json!({"served": true, "up": false}), "{modes}");
    assert_eq!(modes["modes"]["video"]["served"], false, "{modes}");
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(0.5, 3.0)])).await;
    open_client(&b, &server, "audio").await;
    until(&b, &server, "window.omniStats.served", "modes").await;
    assert_eq!(js(&b, "document.querySelector('#mode option[value=video]').disabled").await, true);
    assert_eq!(js(&b, "document.querySelector('#mode option[value=chat]').disabled").await, true);
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.state === 'queued'", "queued").await;
    let detail = js(&b, "document.getElementById('detail').textContent").await;
    assert!(detail.as_str().unwrap().contains("No worker is up right now"), "{detail}");
    screenshot(&b, "client-no-worker").await;
    b.close().await.unwrap();
    // The worker is still opening when the test ends.
    let mut server = server;
    server.skip_invariants();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_microphone_and_the_time_limit_are_told_in_plain_words() {
    if !needs(&[Need::Browser]) {
        return;
    }
    let server = Server::ready(Setup::default().limits("audio_session_s = 3"));
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let mic = microphone_wav(dir.path(), &[(0.5, 3.0)]);
    let b = browser_with(&driver, &mic, &["--deny-permission-prompts"]).await;
    open_client(&b, &server, "audio").await;
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "denied").await;
    let detail = js(&b, "document.getElementById('detail').textContent").await;
    assert!(detail.as_str().unwrap().starts_with("Permission to use the microphone was denied"), "{detail}");
    screenshot(&b, "client-denied").await;
    b.close().await.unwrap();

    let b = browser(&driver, &mic).await;
    open_client(&b, &server, "audio").await;
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.endReason", "time limit").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "ended").await;
    assert_eq!(js(&b, "window.omniStats.endReason").await, "timeout");
    assert_eq!(js(&b, "document.getElementById('detail').textContent").await, "The session reached its time limit.");
    b.close().await.unwrap();
    server.wait_idle();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_cancels_a_waiting_clients_ticket() {
    if !needs(&[Need::Browser]) {
        return;
    }
    let server = Server::ready(Setup::default());
    let busy = active(&server, "audio").await;
    let mut waiting = Client::connect(&server.url("/v1/realtime?mode=audio")).await;
    let ticket = waiting.expect("session.queued").await["ticket_id"].as_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(0.5, 3.0)])).await;
    b.goto(&format!("http://{}/console", server.addr)).await.unwrap();
    let row = until(&b, &server, "document.querySelector('#queue tbody').textContent", "ticket listed").await;
    assert!(row.as_str().unwrap().contains(&ticket), "{row}");
    screenshot(&b, "console-queue").await;
    b.find(Locator::Css("#queue tbody button")).await.unwrap().click().await.unwrap();
    waiting.until("session.closed").await;
    let closed = waiting.seen.iter().find(|e| e["type"] == "session.closed").unwrap().clone();
    assert_eq!(closed["reason"], "cancelled", "{closed}");
    until(&b, &server, "document.querySelector('#queue tbody').children.length === 0", "queue empty").await;
    b.close().await.unwrap();
    busy.close_socket().await;
    server.wait_idle();
}

#[tokio::test(flavor = "multi_thread")]
async fn over_https_the_page_connects_with_wss_and_gets_the_microphone() {
    if !needs(&[Need::Browser]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    localhost_certificate(dir.path(), "cert.pem", "key.pem");
    let mut server =
        Server::start_in(Setup::default().extra("[server.tls]\ncert = \"cert.pem\"\nkey = \"key.pem\""), dir);
    server.skip_invariants(); // the harness reads /status over plain HTTP
    let mic = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser_with(&driver, &microphone_wav(mic.path(), &[(2.0, 5.0)]), &["--ignore-certificate-errors"]).await;
    b.goto(&format!("https://localhost:{}/", server.addr.port())).await.unwrap();
    assert_eq!(js(&b, "window.isSecureContext").await, true);
    b.find(Locator::Id("transport")).await.unwrap().select_by_value("websocket").await.unwrap();
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.sessionId && window.omniStats.chunksSent >= 2", "wss").await;
    click(&b, "stop").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "wss-stopped").await;
    // An audio session calls over WebRTC by default, also from an https page.
    b.find(Locator::Id("transport")).await.unwrap().select_by_value("auto").await.unwrap();
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.transport === 'webrtc' && window.omniStats.voiceStarted >= 1", "https-rtc")
        .await;
    b.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pages_are_served_from_the_binary_with_a_strict_policy() {
    // (no browser needed: runs with plain `cargo test`)
    let server = Server::ready(Setup::default());
    for (path, kind) in [
        ("/", "text/html"),
        ("/console", "text/html"),
        ("/app/client.js", "text/javascript"),
        ("/app/call.js", "text/javascript"),
        ("/app/console.js", "text/javascript"),
        ("/app/worklet.js", "text/javascript"),
        ("/app/style.css", "text/css"),
    ] {
        let (code, head) = http_head(&server, path);
        assert_eq!(code, 200, "{path}");
        assert!(head.contains(&format!("content-type: {kind}")), "{path}: {head}");
        assert!(head.contains("content-security-policy: default-src 'self'"), "{path}: {head}");
    }
    let (code, body) = server.get("/app/../config.toml");
    assert_eq!(code, 404, "{body}");
    let (code, body) = server.get("/app/nothing.js");
    assert_eq!(code, 404);
    assert!(body.contains("not_found"), "{body}");
    // No page loads anything from elsewhere.
    for page in ["/", "/console"] {
        let (_, html) = server.get(page);
        assert!(!html.contains("http://") && !html.contains("https://"), "{page} refers to another host");
    }
}

/// The status and the lower-cased headers of a GET.
fn http_head(server: &Server, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(server.addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let head = text.split("\r\n\r\n").next().unwrap_or_default().to_lowercase();
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, head)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_audio_session_over_webrtc_queues_speaks_hears_interrupts_and_hangs_up() {
    if !needs(&[Need::Browser]) {
        return;
    }
    // Long answers (20 steps of speech), so there is something to interrupt.
    let server = Server::ready(
        Setup::default()
            .workers(workers(1, "reply_steps = 20"))
            .auth("api_keys = [\"browser-key-0123456789\"]")
            .recording("enabled = true"),
    );
    // The only worker is busy: the call waits in the queue.
    let mut busy = Client::connect(&server.url("/v1/realtime?model=omni&api_key=browser-key-0123456789")).await;
    busy.expect("session.created").await;
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(2.0, 30.0)])).await;
    open_client_over(&b, &server, "audio", "auto").await;
    b.find(Locator::Id("key")).await.unwrap().send_keys("browser-key-0123456789").await.unwrap();
    click(&b, "start").await;
    until(&b, &server, "window.omniStats.positions.includes(1)", "rtc-queued").await;
    assert_eq!(js(&b, "window.omniStats.transport").await, "webrtc");
    let said = js(&b, "document.getElementById('transport-used').textContent").await;
    assert_eq!(said, "Connected over WebRTC.");
    // While it waits, the microphone is muted on the call: nothing said then reaches the model.
    assert_eq!(js(&b, "call.stream.getAudioTracks()[0].enabled").await, false, "muted while queued");
    busy.close_socket().await;
    until(&b, &server, "window.omniStats.sessionId", "rtc-created").await;
    until(&b, &server, "call.stream.getAudioTracks()[0].enabled", "rtc-unmuted").await;
    let said = js(&b, "document.getElementById('transport-used').textContent").await;
    assert_eq!(said, "Connected over WebRTC; omni-reference answers.", "what answers, once created");
    // The browser's echo cancellation is what the checkbox says (off in the tests).
    let settings = js(&b, "window.omniStats.audioSettings").await;
    assert_eq!(settings["echoCancellation"], false, "{settings}");
    until(&b, &server, "document.getElementById('level').value > 0.05", "rtc-level").await;
    // The tone is heard as speech; the model's voice plays from the call's track.
    until(&b, &server, "window.omniStats.voiceStarted >= 1", "rtc-speaking").await;
    let waited = js(&b, "window.omniStats.replySeconds[0]").await.as_f64().unwrap_or(-1.0);
    assert!(waited > 0.0 && waited < 5.0, "reply time over the call: {waited} s");
    // What the model heard is shown as the user's line (the page asks for transcripts).
    until(&b, &server, "window.omniStats.heard.some((h) => h && h.includes('seconds of speech'))", "rtc-you").await;
    let you = js(&b, "document.querySelector('#transcript .user').textContent").await;
    assert!(you.as_str().unwrap().contains("seconds of speech"), "{you}");
    until(
        &b,
        &server,
        "(async () => { let e = 0; (await call.pc.getStats()).forEach((r) => { if (r.type === 'inbound-rtp' && r.kind === 'audio') e = r.totalAudioEnergy; }); return e > 0.01; })()",
        "rtc-heard",
    )
    .await;
    screenshot(&b, "client-webrtc-speaking").await;
    let status = server.status();
    assert_eq!(status["workers"][0]["transport"], "webrtc", "{status}");
    click(&b, "interrupt").await;
    until(&b, &server, "window.omniStats.voiceCleared >= 1", "rtc-cleared").await;
    let s = stats(&b).await;
    assert_eq!(s["state"], "listening", "{s}");
    assert_eq!(s["errors"], json!([]), "a muted call is not told its voice was dropped: {s}");
    let id = s["sessionId"].as_str().unwrap().to_string();
    click(&b, "stop").await;
    until(&b, &server, "window.omniStats.state === 'ended'", "rtc-stopped").await;
    assert_eq!(js(&b, "document.getElementById('detail').textContent").await, "You ended the session.");
    assert_eq!(js(&b, "document.getElementById('transport-used').textContent").await, "", "not connected any more");
    // Recorded as a WebSocket session is: the user's voice, the model's, why it ended.
    let dir = server.recording(&id);
    // The console lists it with its transport; its viewer shows the call's events on one list,
    // each run of voice pieces one line, the model's words whole, and no frame pane.
    b.goto(&format!("http://{}/console", server.addr)).await.unwrap();
    until(&b, &server, "window.consoleStats.recordings >= 1", "rtc-recordings").await;
    let row = js(&b, &format!("document.querySelector(\"#recordings tr[data-session='{id}']\").textContent")).await;
    assert!(row.as_str().unwrap().contains("webrtc"), "{row}");
    b.find(Locator::Css(&format!("#recordings tr[data-session='{id}']"))).await.unwrap().click().await.unwrap();
    until(&b, &server, &format!("window.consoleStats.viewing === '{id}'"), "rtc-viewer").await;
    let listed = js(&b, "document.getElementById('viewer-events').textContent").await;
    let listed = listed.as_str().unwrap();
    assert!(listed.contains("client: caller.audio ×"), "voice pieces in runs: {listed}");
    assert!(listed.contains("server: text: Reply 1: I heard"), "the model's words whole: {listed}");
    let (lines, events) = (js(&b, "window.consoleStats.listed").await, js(&b, "window.consoleStats.events").await);
    assert!(lines.as_i64().unwrap() * 3 < events.as_i64().unwrap(), "{lines} lines for {events} events");
    assert_eq!(js(&b, "document.getElementById('viewer-frame').hidden").await, true, "no frames in an audio call");
    screenshot(&b, "console-webrtc-viewer").await;
    b.close().await.unwrap();
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["close_reason"], "hangup", "{meta}");
    assert_eq!(meta["transport"], "webrtc", "{meta}");
    for wav in ["input.wav", "output.wav"] {
        let r = hound::WavReader::open(dir.join(wav)).unwrap();
        assert!(r.duration() > r.spec().sample_rate / 2, "{wav}: {} samples", r.duration());
    }
    server.wait_idle();
}

#[tokio::test]
async fn the_page_snippet_in_the_webrtc_docs_calls_as_printed() {
    if !needs(&[Need::Browser]) {
        return;
    }
    let docs =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/webrtc.md")).unwrap();
    let section = docs.split("## A call from a page").nth(1).expect("the section");
    let code = section.split("```js\n").nth(1).expect("a js block").split("```").next().unwrap();
    assert!(code.lines().count() <= 40, "the snippet is short: {} lines", code.lines().count());
    let server = Server::ready(Setup::default().auth("api_keys = [\"browser-key-0123456789\"]"));
    let dir = tempfile::tempdir().unwrap();
    let driver = driver();
    let b = browser(&driver, &microphone_wav(dir.path(), &[(2.0, 30.0)])).await;
    // On a page of the gateway's own, the snippet as printed, then called as its last line says.
    b.goto(&format!("http://{}/", server.addr)).await.unwrap();
    let run = format!(
        "{code}\nwindow.seen = []; window.failed = null;\n\
         call('browser-key-0123456789', (event) => window.seen.push(event))\n\
         .then((c) => {{ window.omniCall = c; }}, (e) => {{ window.failed = String(e); }});"
    );
    b.execute(&run, vec![]).await.unwrap();
    until(&b, &server, "window.failed || window.seen.some((e) => e.type === 'session.created')", "snippet-created")
        .await;
    assert_eq!(js(&b, "window.failed").await, Value::Null);
    // The fake microphone's tone is heard, and answered in words and voice.
    let done = until(&b, &server, "window.seen.find((e) => e.type === 'response.done')", "snippet-answered").await;
    assert_eq!(done["response"]["status"], "completed", "{done}");
    until(&b, &server, "window.seen.some((e) => e.type === 'output_audio_buffer.started')", "snippet-voice").await;
    b.execute("window.omniCall.hangUp()", vec![]).await.unwrap();
    server.wait_idle();
    b.close().await.unwrap();
}
