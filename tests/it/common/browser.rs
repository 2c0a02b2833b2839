//! A real browser for the tests: Debian's `chromium`, driven through `chromedriver` with
//! WebDriver (the fantoccini crate), headless, with a fake microphone playing a WAV file and a
//! fake camera. A test that fails leaves no browser behind (one process group, killed).

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client as Browser, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

use super::{Server, WAIT};

pub(crate) const CHROMIUM: &str = "/usr/bin/chromium";
pub(crate) const CHROMEDRIVER: &str = "chromedriver";
/// How long the page may take to reach a state (sessions run in real time).
pub(crate) const PAGE_WAIT: Duration = Duration::from_secs(40);

/// A chromedriver process on a free port, killed when dropped.
pub(crate) struct Driver {
    child: Child,
    pub url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // chromedriver and every Chromium process it started share one process group: a
        // test that failed half-way leaves no browser behind.
        // SAFETY: kill(2) on our own child's process group.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub(crate) fn driver() -> Driver {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} not found: install Debian's chromium and chromium-driver (.ci/run does)"
    );
    let port = free_port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver (Debian package chromium-driver)");
    let mut driver = Driver { child, url: format!("http://127.0.0.1:{port}") };
    let deadline = Instant::now() + WAIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(driver.child.try_wait().unwrap().is_none(), "chromedriver exited at once");
        assert!(Instant::now() < deadline, "chromedriver did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    driver
}

/// A 48 kHz mono WAV for the fake microphone: `bursts` of (tone seconds, silence seconds).
/// Chromium loops it.
pub(crate) fn microphone_wav(dir: &Path, bursts: &[(f32, f32)]) -> PathBuf {
    let path = dir.join("microphone.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 48000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    for &(tone, silence) in bursts {
        for i in 0..(tone * 48000.0) as usize {
            let s = 0.4 * (2.0 * std::f32::consts::PI * 220.0 * i as f32 / 48000.0).sin();
            w.write_sample((s * i16::MAX as f32) as i16).unwrap();
        }
        for _ in 0..(silence * 48000.0) as usize {
            w.write_sample(0i16).unwrap();
        }
    }
    w.finalize().unwrap();
    path
}

/// A 16 kHz mono WAV for the fake microphone: `speech` (16 kHz samples), then `silence_s` of
/// silence. Chromium loops it.
pub(crate) fn microphone_speech(dir: &Path, speech: &[f32], silence_s: f32) -> PathBuf {
    let path = dir.join("speech.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    for s in speech.iter().copied().chain(std::iter::repeat_n(0.0, (silence_s * 16000.0) as usize)) {
        w.write_sample((s.clamp(-1.0, 1.0) * i16::MAX as f32) as i16).unwrap();
    }
    w.finalize().unwrap();
    path
}

pub(crate) async fn browser(driver: &Driver, microphone: &Path) -> Browser {
    browser_with(driver, microphone, &[]).await
}

/// A browser with more command-line switches (`--ignore-certificate-errors`...).
pub(crate) async fn browser_with(driver: &Driver, microphone: &Path, extra: &[&str]) -> Browser {
    let mut args = json!([
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        "--use-fake-device-for-media-stream",
        format!("--use-file-for-fake-audio-capture={}", microphone.display()),
        "--autoplay-policy=no-user-gesture-required",
    ]);
    // The permission prompt is answered yes, unless the test asks for a no.
    if !extra.contains(&"--deny-permission-prompts") {
        args.as_array_mut().unwrap().push(json!("--use-fake-ui-for-media-stream"));
    }
    for a in extra {
        args.as_array_mut().unwrap().push(json!(a));
    }
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), json!({"binary": CHROMIUM, "args": args}));
    // chromedriver is plain HTTP on loopback: no TLS stack for the WebDriver client.
    ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .unwrap_or_else(|e| panic!("start chromium through chromedriver: {e}"))
}

/// Saves what the page shows to `target/screenshots/NAME.png`.
pub(crate) async fn screenshot(b: &Browser, name: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    if let Ok(png) = b.screenshot().await {
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

/// The value of a JavaScript expression on the page.
pub(crate) async fn js(b: &Browser, expr: &str) -> Value {
    b.execute(&format!("return ({expr});"), vec![]).await.unwrap_or_else(|e| panic!("{expr}: {e}"))
}

/// Waits until `expr` is truthy on the page; fails with what the page shows and the server's log.
pub(crate) async fn until(b: &Browser, server: &Server, expr: &str, shot: &str) -> Value {
    let deadline = Instant::now() + PAGE_WAIT;
    loop {
        let v = js(b, expr).await;
        if !(v.is_null() || v == json!(false) || v == json!(0) || v == json!("")) {
            return v;
        }
        if Instant::now() > deadline {
            screenshot(b, &format!("failed-{shot}")).await;
            let page = js(
                b,
                "JSON.stringify({stats: window.omniStats, console: window.consoleStats, \
                             state: (document.getElementById('state')||{}).textContent, \
                             detail: (document.getElementById('detail')||{}).textContent, \
                             problem: (document.getElementById('problem')||{}).textContent})",
            )
            .await;
            panic!("the page never had {expr}: {page}\nserver log:\n{}", server.logs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Opens the client page in `mode`, over WebSocket (`open_client_over` chooses). Echo
/// cancellation, noise suppression and auto gain are on by default (checked here); the tests
/// switch them off, since the fake microphone plays tones and espeak-ng's voice, which noise
/// suppression would treat as noise.
pub(crate) async fn open_client(b: &Browser, server: &Server, mode: &str) {
    open_client_over(b, server, mode, "websocket").await;
}

/// The same, with the page's transport for audio sessions: `"auto"` (WebRTC when it can) or
/// `"websocket"`.
pub(crate) async fn open_client_over(b: &Browser, server: &Server, mode: &str, transport: &str) {
    b.goto(&format!("http://{}/", server.addr)).await.unwrap();
    let default = b.execute("return document.getElementById('transport').value", vec![]).await.unwrap();
    assert_eq!(default, serde_json::Value::from("auto"), "WebRTC when it can, by default");
    b.find(Locator::Id("transport")).await.unwrap().select_by_value(transport).await.unwrap();
    b.find(Locator::Id("mode")).await.unwrap().select_by_value(mode).await.unwrap();
    let on = b.execute("return document.getElementById('processing').checked", vec![]).await.unwrap();
    assert_eq!(on, serde_json::Value::Bool(true), "echo cancellation is on by default");
    b.execute("document.getElementById('processing').checked = false", vec![]).await.unwrap();
}

pub(crate) async fn click(b: &Browser, id: &str) {
    b.find(Locator::Id(id)).await.unwrap().click().await.unwrap();
}

pub(crate) async fn stats(b: &Browser) -> Value {
    js(b, "window.omniStats").await
}
