//! Session recording, off the session's hot path.
//!
//! Each recorded session gets a [`RecorderActor`] on the recording thread (an arbiter of
//! its own, so a slow disk never delays a step) writing `DIR/YYYY-MM-DD/SESSION_ID/`:
//! `events.jsonl` (every event both ways, in order, with a monotonic timestamp; large
//! base64 fields replaced by references), `input.wav` (16 kHz input), `output.wav`
//! (24 kHz model audio as sent), `frames/NNNNNN.jpg`, and last, atomically, `meta.json`.
//! WAV headers are rewritten after every write, so the files are valid at any moment.
//!
//! The session talks to it through [`Recording`], which holds events until the session
//! has an id, and which drops records (counting them, in the log, in `meta.json` and in
//! the metrics) instead of blocking when the recorder is more than `max_lag` behind.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use actix_web::web::Bytes;
use serde::Serialize;
use serde_json::{Map, Value, json};

pub use crate::dialect::AudioFormat;
use crate::metrics::metrics;

/// Strings longer than this are data, not text: they go to files.
const LARGE: usize = 1024;
pub const INPUT_RATE: u32 = 16000;
pub const OUTPUT_RATE: u32 = 24000;

/// Starts recorders on the recording thread and counts those not finished yet.
#[derive(Clone)]
pub struct RecorderSpawner {
    root: PathBuf,
    arbiter: ArbiterHandle,
    max_lag_bytes: usize,
    unfinished: Arc<AtomicUsize>,
}

impl RecorderSpawner {
    /// Starts the recording thread. Must run inside an actix system.
    pub fn new(root: PathBuf, max_lag_bytes: usize) -> RecorderSpawner {
        let arbiter = Arbiter::new().handle();
        RecorderSpawner { root, arbiter, max_lag_bytes, unfinished: Arc::new(AtomicUsize::new(0)) }
    }

    /// Recordings started and not yet finalized.
    pub fn unfinished(&self) -> usize {
        self.unfinished.load(Ordering::SeqCst)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// A recorded session's facts, written to `meta.json` when it ends.
#[derive(Debug, Clone, Serialize)]
pub struct SessionMeta {
    pub session_id: String,
    pub mode: String,
    pub dialect: String,
    pub worker: Option<String>,
    pub client_addr: String,
    pub user_agent: Option<String>,
    pub start: String,
    pub end: String,
    pub duration_s: f64,
    pub close_reason: String,
    pub chunks_received: u64,
    pub chunks_dropped: u64,
    pub chunks_answered: u64,
    pub turns: u64,
    /// Filled in by the recorder.
    pub recording: RecordingSummary,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RecordingSummary {
    pub events: u64,
    pub input_samples: u64,
    pub output_samples: u64,
    pub frames: u64,
    pub attachments: u64,
    /// Records the session dropped because the recorder was too far behind.
    pub dropped_records: u64,
    pub lagged: bool,
    pub error: Option<String>,
}

/// RFC 3339 in UTC, and the `YYYY-MM-DD` of a moment.
pub fn timestamp(t: SystemTime) -> (String, String) {
    let t = time::OffsetDateTime::from(t);
    let full = t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
    let date = format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day());
    (full, date)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    In,
    Out,
}

#[derive(Message)]
#[rtype(result = "()")]
enum Record {
    Event {
        at: Duration,
        dir: Direction,
        text: Bytes,
        /// Decoded inbound audio segments (16 kHz), in the order they appear in `text`.
        audio: Vec<Vec<f32>>,
        /// Decoded inbound images, in order.
        frames: Vec<Vec<u8>>,
        size: usize,
    },
    Finish(Box<SessionMeta>),
}

enum State {
    Off,
    /// Events before the session has an id.
    Prelude(RecorderSpawner, Vec<Record>),
    Live {
        addr: Addr<RecorderActor>,
        lag: Arc<AtomicUsize>,
        max_lag: usize,
    },
    Done,
}

/// The session's side of its recording.
pub struct Recording {
    state: State,
    started: Instant,
    dropped: u64,
}

impl Recording {
    pub fn off() -> Recording {
        Recording { state: State::Off, started: Instant::now(), dropped: 0 }
    }

    /// Records from `started` (the upgrade); nothing is written before `start`.
    pub fn new(spawner: RecorderSpawner, started: Instant) -> Recording {
        Recording { state: State::Prelude(spawner, Vec::new()), started, dropped: 0 }
    }

    pub fn is_on(&self) -> bool {
        matches!(self.state, State::Prelude(..) | State::Live { .. })
    }

    /// An event from the client, with the audio and images it carried, decoded.
    pub fn inbound(&mut self, text: Bytes, audio: Vec<Vec<f32>>, frames: Vec<Vec<u8>>) {
        let size =
            text.len() + audio.iter().map(|a| a.len() * 4).sum::<usize>() + frames.iter().map(Vec::len).sum::<usize>();
        let at = self.started.elapsed();
        self.push(Record::Event { at, dir: Direction::In, text, audio, frames, size });
    }

    /// An event to the client, as sent.
    pub fn outbound(&mut self, text: Bytes) {
        let size = text.len();
        let at = self.started.elapsed();
        self.push(Record::Event { at, dir: Direction::Out, text, audio: Vec::new(), frames: Vec::new(), size });
    }

    fn push(&mut self, record: Record) {
        match &mut self.state {
            State::Prelude(_, held) => held.push(record),
            State::Live { addr, lag, max_lag } => {
                let Record::Event { size, .. } = &record else { return };
                let size = *size;
                if lag.load(Ordering::Relaxed) + size > *max_lag {
                    if self.dropped == 0 {
                        log::warn!(
                            "recording: the recorder is more than {} MB behind; dropping records",
                            *max_lag >> 20
                        );
                    }
                    self.dropped += 1;
                    metrics().recording_dropped.inc();
                    return;
                }
                lag.fetch_add(size, Ordering::Relaxed);
                metrics().recording_lag_bytes.add(size as i64);
                addr.do_send(record);
            }
            State::Off | State::Done => {}
        }
    }

    /// The session has its id: the recorder starts and gets every event so far.
    pub fn start(&mut self, session_id: &str, output_format: AudioFormat, upgraded: SystemTime) {
        let State::Prelude(spawner, held) = std::mem::replace(&mut self.state, State::Off) else {
            return;
        };
        let (_, date) = timestamp(upgraded);
        let dir = spawner.root.join(date).join(session_id);
        let lag = Arc::new(AtomicUsize::new(0));
        spawner.unfinished.fetch_add(1, Ordering::SeqCst);
        let actor = RecorderActor {
            dir,
            output_format,
            files: None,
            lag: lag.clone(),
            unfinished: spawner.unfinished.clone(),
            summary: RecordingSummary::default(),
            keep_alive: None,
        };
        let addr = RecorderActor::start_in_arbiter(&spawner.arbiter, move |_| actor);
        self.state = State::Live { addr, lag, max_lag: spawner.max_lag_bytes };
        for record in held {
            self.push(record);
        }
    }

    /// The session ended: the recorder finalizes every file and writes `meta.json`.
    /// Without an id (it never initialised) nothing was recorded.
    pub fn finish(&mut self, mut meta: SessionMeta) {
        if let State::Live { addr, .. } = std::mem::replace(&mut self.state, State::Done) {
            meta.recording.dropped_records = self.dropped;
            meta.recording.lagged = self.dropped > 0;
            addr.do_send(Record::Finish(Box::new(meta)));
        }
    }
}

struct Files {
    events: BufWriter<File>,
    input: hound::WavWriter<BufWriter<File>>,
    output: hound::WavWriter<BufWriter<File>>,
}

struct RecorderActor {
    dir: PathBuf,
    output_format: AudioFormat,
    files: Option<Files>,
    lag: Arc<AtomicUsize>,
    unfinished: Arc<AtomicUsize>,
    summary: RecordingSummary,
    /// Its own address, held until `Finish` is handled. The session drops its address right
    /// after sending `Finish`; without this one, actix may find no sender left between two
    /// polls of the mailbox and stop the actor with `Finish` still queued (the soak found
    /// 2 such recordings in 30,820).
    keep_alive: Option<Addr<RecorderActor>>,
}

fn wav_spec(rate: u32) -> hound::WavSpec {
    hound::WavSpec { channels: 1, sample_rate: rate, bits_per_sample: 32, sample_format: hound::SampleFormat::Float }
}

impl RecorderActor {
    fn open(&self) -> std::io::Result<Files> {
        fs::create_dir_all(self.dir.join("frames"))?;
        let wav = |name: &str, rate| {
            hound::WavWriter::create(self.dir.join(name), wav_spec(rate)).map_err(std::io::Error::other)
        };
        Ok(Files {
            events: BufWriter::new(File::create(self.dir.join("events.jsonl"))?),
            input: wav("input.wav", INPUT_RATE)?,
            output: wav("output.wav", OUTPUT_RATE)?,
        })
    }

    fn write_event(
        &mut self,
        at: Duration,
        dir: Direction,
        text: &[u8],
        audio: Vec<Vec<f32>>,
        frames: Vec<Vec<u8>>,
    ) -> std::io::Result<()> {
        let mut line = Map::new();
        line.insert("t".into(), json!((at.as_secs_f64() * 1e6).round() / 1e6));
        line.insert("dir".into(), json!(if dir == Direction::In { "in" } else { "out" }));
        match serde_json::from_slice::<Value>(text) {
            Ok(mut event) => {
                let kind = event.get("type").and_then(Value::as_str).unwrap_or_default();
                // Outbound audio is under `audio`, or under `delta` in an audio delta event.
                let audio_delta = kind.ends_with("audio.delta");
                let mut data = Data { audio: audio.into_iter(), frames: frames.into_iter(), audio_delta };
                self.redact(&mut event, None, false, None, dir, &mut data)?;
                line.insert("event".into(), event);
            }
            Err(_) => {
                let raw = String::from_utf8_lossy(&text[..text.len().min(4096)]).into_owned();
                line.insert("raw".into(), json!(raw));
            }
        }
        let files = self.files.as_mut().ok_or_else(|| std::io::Error::other("not open"))?;
        serde_json::to_writer(&mut files.events, &Value::Object(line))?;
        files.events.write_all(b"\n")?;
        files.events.flush()?;
        self.summary.events += 1;
        Ok(())
    }

    /// Replaces large strings with references to the files that hold their data.
    fn redact(
        &mut self,
        v: &mut Value,
        key: Option<&str>,
        in_frames: bool,
        parent_type: Option<&str>,
        dir: Direction,
        data: &mut Data,
    ) -> std::io::Result<()> {
        match v {
            Value::Object(map) => {
                let t = map.get("type").and_then(Value::as_str).map(str::to_owned);
                for (k, item) in map.iter_mut() {
                    self.redact(item, Some(k), k == "video_frames", t.as_deref(), dir, data)?;
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.redact(item, key, in_frames, parent_type, dir, data)?;
                }
            }
            Value::String(s) => {
                // Frames and audio always go to their files; other large strings to attachments.
                let is_frame = in_frames || key == Some("image") || parent_type == Some("image");
                let is_audio = match dir {
                    Direction::In => matches!(key, Some("audio" | "delta" | "data")),
                    Direction::Out => key == Some("audio") || (key == Some("delta") && data.audio_delta),
                };
                if !is_frame && !is_audio && s.len() <= LARGE {
                    return Ok(());
                }
                let reference = match (dir, is_frame, is_audio) {
                    (Direction::In, true, _) => match data.frames.next() {
                        Some(frame) => Some(self.write_frame(&frame)?),
                        None => None,
                    },
                    (Direction::In, false, true) => match data.audio.next() {
                        Some(samples) => Some(self.write_audio(Direction::In, &samples)?),
                        None => None,
                    },
                    (Direction::Out, false, true) => match self.decode_output(s) {
                        Some(samples) => Some(self.write_audio(Direction::Out, &samples)?),
                        None => None,
                    },
                    _ => None,
                };
                *v = match reference {
                    Some(r) => r,
                    None if s.len() > LARGE => self.write_attachment(s)?,
                    None => return Ok(()),
                };
            }
            _ => {}
        }
        Ok(())
    }

    fn decode_output(&self, b64: &str) -> Option<Vec<f32>> {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        Some(match self.output_format {
            AudioFormat::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            AudioFormat::Pcm16 => {
                bytes.chunks_exact(2).map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0).collect()
            }
        })
    }

    fn write_audio(&mut self, dir: Direction, samples: &[f32]) -> std::io::Result<Value> {
        let files = self.files.as_mut().ok_or_else(|| std::io::Error::other("not open"))?;
        let (writer, counter, name) = match dir {
            Direction::In => (&mut files.input, &mut self.summary.input_samples, "input.wav"),
            Direction::Out => (&mut files.output, &mut self.summary.output_samples, "output.wav"),
        };
        let offset = *counter;
        for &s in samples {
            writer.write_sample(s).map_err(std::io::Error::other)?;
        }
        // Rewrites the header: the file is a valid WAV after every write.
        writer.flush().map_err(std::io::Error::other)?;
        *counter += samples.len() as u64;
        Ok(json!({"$ref": name, "offset": offset, "samples": samples.len()}))
    }

    fn write_frame(&mut self, jpeg: &[u8]) -> std::io::Result<Value> {
        self.summary.frames += 1;
        let name = format!("frames/{:06}.jpg", self.summary.frames);
        fs::write(self.dir.join(&name), jpeg)?;
        Ok(json!({"$ref": name}))
    }

    fn write_attachment(&mut self, text: &str) -> std::io::Result<Value> {
        self.summary.attachments += 1;
        fs::create_dir_all(self.dir.join("attachments"))?;
        let name = format!("attachments/{:06}.b64", self.summary.attachments);
        fs::write(self.dir.join(&name), text)?;
        Ok(json!({"$ref": name, "chars": text.len()}))
    }

    fn finish(&mut self, mut meta: SessionMeta) -> std::io::Result<()> {
        if let Some(files) = self.files.take() {
            let Files { mut events, input, output } = files;
            events.flush()?;
            input.finalize().map_err(std::io::Error::other)?;
            output.finalize().map_err(std::io::Error::other)?;
        }
        let dropped = meta.recording.dropped_records;
        meta.recording = RecordingSummary { dropped_records: dropped, lagged: dropped > 0, ..self.summary.clone() };
        let tmp = self.dir.join("meta.json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(&meta)?)?;
        fs::rename(&tmp, self.dir.join("meta.json"))
    }
}

struct Data {
    audio: std::vec::IntoIter<Vec<f32>>,
    frames: std::vec::IntoIter<Vec<u8>>,
    /// The event is an audio delta (its `delta` field is audio).
    audio_delta: bool,
}

impl Actor for RecorderActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.keep_alive = Some(ctx.address());
        match self.open() {
            Ok(files) => self.files = Some(files),
            Err(e) => {
                log::error!("recording {}: cannot create its files: {e}", self.dir.display());
                self.summary.error = Some(e.to_string());
            }
        }
    }
}

impl Handler<Record> for RecorderActor {
    type Result = ();

    fn handle(&mut self, record: Record, ctx: &mut Context<Self>) {
        match record {
            Record::Event { at, dir, text, audio, frames, size } => {
                if self.files.is_some()
                    && let Err(e) = self.write_event(at, dir, &text, audio, frames)
                {
                    log::error!("recording {}: write failed: {e}", self.dir.display());
                    self.summary.error.get_or_insert(e.to_string());
                }
                self.lag.fetch_sub(size, Ordering::Relaxed);
                metrics().recording_lag_bytes.sub(size as i64);
            }
            Record::Finish(meta) => {
                if let Err(e) = self.finish(*meta) {
                    log::error!("recording {}: cannot finalize: {e}", self.dir.display());
                }
                self.unfinished.fetch_sub(1, Ordering::SeqCst);
                self.keep_alive = None;
                ctx.stop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: &str) -> SessionMeta {
        SessionMeta {
            session_id: id.into(),
            mode: "video".into(),
            dialect: "minicpm".into(),
            worker: Some("sim-0".into()),
            client_addr: "127.0.0.1:1".into(),
            user_agent: None,
            start: "s".into(),
            end: "e".into(),
            duration_s: 1.0,
            close_reason: "user_stop".into(),
            chunks_received: 1,
            chunks_dropped: 0,
            chunks_answered: 1,
            turns: 0,
            recording: RecordingSummary::default(),
        }
    }

    fn b64(samples: &[f32]) -> String {
        use base64::Engine;
        let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[actix::test]
    async fn a_recording_has_every_file_valid_and_meta_last() {
        let root = tempfile::tempdir().unwrap();
        let spawner = RecorderSpawner::new(root.path().to_path_buf(), 64 << 20);
        let mut rec = Recording::new(spawner.clone(), Instant::now());
        rec.outbound(Bytes::from_static(b"{\"type\":\"session.queue_done\"}"));
        rec.inbound(Bytes::from_static(b"{\"type\":\"session.init\",\"payload\":{}}"), vec![], vec![]);
        rec.start("sess_x", AudioFormat::F32, SystemTime::now());
        let input = vec![0.25f32; 16000];
        let append =
            json!({"type": "input.append", "input": {"audio": b64(&input), "video_frames": ["A".repeat(2000)]}});
        rec.inbound(Bytes::from(append.to_string()), vec![input.clone()], vec![vec![0xFF, 0xD8, 0xFF, 1]]);
        let out = json!({"type": "response.output.delta", "kind": "audio", "audio": b64(&[0.5; 24000])});
        rec.outbound(Bytes::from(out.to_string()));
        rec.outbound(Bytes::from_static(b"not json"));
        rec.finish(meta("sess_x"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while spawner.unfinished() > 0 {
            assert!(Instant::now() < deadline);
            actix::clock::sleep(Duration::from_millis(5)).await;
        }
        let (_, date) = timestamp(SystemTime::now());
        let dir = root.path().join(date).join("sess_x");
        let lines: Vec<Value> = fs::read_to_string(dir.join("events.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0]["event"]["type"], "session.queue_done");
        assert_eq!(lines[0]["dir"], "out");
        assert_eq!(lines[2]["event"]["input"]["audio"], json!({"$ref": "input.wav", "offset": 0, "samples": 16000}));
        assert_eq!(lines[2]["event"]["input"]["video_frames"][0], json!({"$ref": "frames/000001.jpg"}));
        assert_eq!(lines[3]["event"]["audio"], json!({"$ref": "output.wav", "offset": 0, "samples": 24000}));
        assert_eq!(lines[4]["raw"], "not json");
        let ts: Vec<f64> = lines.iter().map(|l| l["t"].as_f64().unwrap()).collect();
        assert!(ts.windows(2).all(|w| w[0] <= w[1]), "ordered: {ts:?}");
        let input_wav = hound::WavReader::open(dir.join("input.wav")).unwrap();
        assert_eq!((input_wav.spec().sample_rate, input_wav.duration()), (16000, 16000));
        let output_wav = hound::WavReader::open(dir.join("output.wav")).unwrap();
        assert_eq!((output_wav.spec().sample_rate, output_wav.duration()), (24000, 24000));
        assert_eq!(fs::read(dir.join("frames/000001.jpg")).unwrap(), [0xFF, 0xD8, 0xFF, 1]);
        let meta: Value = serde_json::from_slice(&fs::read(dir.join("meta.json")).unwrap()).unwrap();
        assert_eq!(meta["recording"]["events"], 5);
        assert_eq!(meta["recording"]["input_samples"], 16000);
        assert!(!dir.join("meta.json.tmp").exists());
    }

    #[actix::test]
    async fn a_session_without_an_id_records_nothing() {
        let root = tempfile::tempdir().unwrap();
        let spawner = RecorderSpawner::new(root.path().to_path_buf(), 64 << 20);
        let mut rec = Recording::new(spawner.clone(), Instant::now());
        rec.outbound(Bytes::from_static(b"{\"type\":\"session.queued\"}"));
        rec.finish(meta("never"));
        assert_eq!(spawner.unfinished(), 0);
        assert_eq!(fs::read_dir(root.path()).unwrap().count(), 0);
    }

    #[actix::test]
    async fn a_recorder_too_far_behind_drops_records_instead_of_blocking() {
        let root = tempfile::tempdir().unwrap();
        let spawner = RecorderSpawner::new(root.path().to_path_buf(), 1000);
        let mut rec = Recording::new(spawner.clone(), Instant::now());
        rec.start("sess_lag", AudioFormat::F32, SystemTime::now());
        rec.outbound(Bytes::from(vec![b'x'; 600]));
        rec.outbound(Bytes::from(vec![b'y'; 1200]));
        assert_eq!(rec.dropped, 1, "a record over the bound is dropped at once, without waiting");
        rec.finish(meta("sess_lag"));
        while spawner.unfinished() > 0 {
            actix::clock::sleep(Duration::from_millis(5)).await;
        }
        let (_, date) = timestamp(SystemTime::now());
        let meta: Value =
            serde_json::from_slice(&fs::read(root.path().join(date).join("sess_lag/meta.json")).unwrap()).unwrap();
        assert_eq!(meta["recording"]["lagged"], true);
        assert!(meta["recording"]["dropped_records"].as_u64().unwrap() >= 1);
    }
}
