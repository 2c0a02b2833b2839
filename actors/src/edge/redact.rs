//! What a dialect tells the recording about its own frames ([`Redact`]): which fields carry
//! audio and images, written into the recording's files ([`MediaSink`]) and replaced by
//! references ([`MediaRef`]), so that `events.jsonl` keeps the events without their media.

use std::io;

use serde::Serialize;
use serde_json::value::RawValue;

/// The audio segments (16 kHz) and images a client event carried, for the recording.
pub type RecordedMedia = (Vec<Vec<f32>>, Vec<Vec<u8>>);

/// Whether a frame was received from the client or sent to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Received from the client.
    In,
    /// Sent to the client.
    Out,
}

/// Where a medium of a recorded event was written: `{"$ref": file, ...}` in `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MediaRef {
    /// The file, relative to the recording's directory (`input.wav`, `frames/000001.jpg`, ...).
    #[serde(rename = "$ref")]
    pub file: String,
    /// First sample, for audio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Samples written, for audio.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Characters, for an attachment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chars: Option<u64>,
}

/// The files of a recording, as a redactor writes media into them.
pub trait MediaSink {
    /// 16 kHz input audio, appended to `input.wav`.
    fn input_audio(&mut self, samples: &[f32]) -> io::Result<MediaRef>;
    /// 24 kHz model audio, appended to `output.wav`.
    fn output_audio(&mut self, samples: &[f32]) -> io::Result<MediaRef>;
    /// An image, as `frames/NNNNNN.jpg`.
    fn frame(&mut self, image: &[u8]) -> io::Result<MediaRef>;
    /// A large text value, as `attachments/NNNNNN.b64`.
    fn attachment(&mut self, text: &str) -> io::Result<MediaRef>;
}

/// One event as recorded: the event (JSON) with its media replaced by references, or, for
/// a frame that was not an event, its text.
#[derive(Debug)]
pub enum Recorded {
    /// The event as JSON, its media replaced by [`MediaRef`]s.
    Event(Box<RawValue>),
    /// The frame's text, for a frame that was not an event.
    Raw(String),
}

/// A dialect's knowledge of its own frames, used on the recorder's thread: which fields
/// carry audio and images, and how the model's audio is encoded.
pub trait Redact: Send + Sync {
    /// Turns one frame into what `events.jsonl` keeps of it. `decoded` is the media of an
    /// inbound frame the dialect already decoded, in the order the frame carries it.
    fn redact(
        &self,
        dir: Direction,
        text: &[u8],
        decoded: RecordedMedia,
        sink: &mut dyn MediaSink,
    ) -> io::Result<Recorded>;
}
