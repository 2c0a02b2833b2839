//! A call's RTP, as rules without a runtime (packets are rtp-types'): what arrives is put back
//! in order in a short jitter buffer (`Jitter`) and split into the voice and the keys
//! ([`Inbound`]); what leaves is numbered and stamped ([`Outbound`]).
//!
//! The jitter buffer holds up to [`DEPTH`] packets: a packet that arrives out of order within
//! that is put back in its place; one older than what already left is dropped; a packet that
//! never came is told as lost once [`DEPTH`] newer ones wait (played as 20 ms of silence: the
//! session's VAD and clock see an unbroken line). A new stream (another SSRC: a transfer, a bridge that
//! changed) or a run of [`LATE_RUN`] late packets (a stream that restarted behind) starts the
//! buffer afresh. RFC 4733 sends each key in several packets of one RTP timestamp (and its end
//! three times): a key is handed on once, when the first packet of a newer timestamp comes.

use std::collections::BTreeMap;

use omni_actors::edge::client::Keypress;
use rtp_types::{RtpPacket, RtpPacketBuilder};

/// Samples of one 20 ms frame at 8 kHz (one byte each in G.711).
pub const FRAME: usize = 160;
/// One 20 ms frame's ticks on an RTP clock of `clock_rate`.
pub fn frame_ticks(clock_rate: u32) -> u32 {
    clock_rate / 50
}
/// Packets held to put them back in order: 60 ms.
pub const DEPTH: usize = 3;
/// Frames of silence played for a gap at most: a longer one is a pause of the trunk's, not loss.
const MAX_GAP: u16 = 10;
/// Late packets in a row after which the stream is taken as restarted.
pub const LATE_RUN: u32 = 25;

/// What one datagram of the trunk's carried.
#[derive(Debug, Clone, PartialEq)]
pub enum Datagram {
    /// A frame of the caller's voice (its codec's payload) in order.
    Voice(Vec<u8>),
    /// A frame that never came.
    Lost,
    /// A key pressed (its first packet).
    Key(Keypress),
}

/// Why a datagram was not used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Dropped {
    #[error("not RTP: {0}")]
    NotRtp(String),
    #[error("payload type {0} was not agreed")]
    PayloadType(u8),
    #[error("late: sequence {0} already played")]
    Late(u16),
}

/// The caller's side of a call: the voice's payload type and the keys', and the buffer.
#[derive(Debug)]
pub struct Inbound {
    voice: u8,
    events: Option<u8>,
    /// Waiting packets by extended sequence number.
    waiting: BTreeMap<u64, Vec<u8>>,
    /// The extended sequence number of the next packet to play.
    next: Option<u64>,
    /// The RTP timestamp of the last key handed on.
    last_key: Option<u32>,
    /// The voice stream's SSRC, once heard.
    ssrc: Option<u32>,
    /// Late packets in a row.
    late: u32,
}

impl Inbound {
    pub fn new(voice: u8, events: Option<u8>) -> Inbound {
        Inbound { voice, events, waiting: BTreeMap::new(), next: None, last_key: None, ssrc: None, late: 0 }
    }

    /// `seq` extended to 64 bits, as the one nearest the next to play.
    fn extend(&self, seq: u16) -> u64 {
        let Some(next) = self.next else { return u64::from(seq) + (1 << 16) };
        let base = next & !0xffff;
        [base.wrapping_sub(1 << 16), base, base + (1 << 16)]
            .into_iter()
            .map(|b| b + u64::from(seq))
            .min_by_key(|c| c.abs_diff(next))
            .unwrap_or(next)
    }

    /// One datagram: what it makes playable now, in order.
    pub fn push(&mut self, datagram: &[u8], out: &mut Vec<Datagram>) -> Result<(), Dropped> {
        let packet = RtpPacket::parse(datagram).map_err(|e| Dropped::NotRtp(format!("{e:?}")))?;
        let pt = packet.payload_type();
        if Some(pt) == self.events {
            // RFC 4733: event, end bit and volume, duration.
            let payload = packet.payload();
            // Only a newer timestamp is a new key (a late repeat of an older one is not).
            let newer = self.last_key.is_none_or(|last| {
                let ahead = packet.timestamp().wrapping_sub(last);
                ahead != 0 && ahead < 1 << 31
            });
            if let Some(&event) = payload.first()
                && newer
            {
                self.last_key = Some(packet.timestamp());
                if let Some(key) = Keypress::of_event(event) {
                    out.push(Datagram::Key(key));
                }
            }
            return Ok(());
        }
        if pt != self.voice {
            return Err(Dropped::PayloadType(pt));
        }
        if self.ssrc.replace(packet.ssrc()).is_some_and(|s| s != packet.ssrc()) || self.late >= LATE_RUN {
            // Another stream, or this one restarted behind: what waits is of the old one.
            self.waiting.clear();
            self.next = None;
            self.late = 0;
        }
        let seq = self.extend(packet.sequence_number());
        let next = *self.next.get_or_insert(seq);
        if seq < next {
            self.late += 1;
            return Err(Dropped::Late(packet.sequence_number()));
        }
        self.late = 0;
        self.waiting.insert(seq, packet.payload().to_vec());
        self.release(out);
        Ok(())
    }

    /// Plays what is in order, and past a gap once [`DEPTH`] packets wait behind it.
    fn release(&mut self, out: &mut Vec<Datagram>) {
        while let Some(next) = self.next {
            if let Some(frame) = self.waiting.remove(&next) {
                out.push(Datagram::Voice(frame));
                self.next = Some(next + 1);
                continue;
            }
            if self.waiting.len() < DEPTH {
                return;
            }
            let Some((&first, _)) = self.waiting.first_key_value() else { return };
            let gap = first - next;
            if gap <= u64::from(MAX_GAP) {
                for _ in 0..gap {
                    out.push(Datagram::Lost);
                }
            }
            self.next = Some(first);
        }
    }
}

/// The model's side of a call: its packets, numbered and stamped.
#[derive(Debug)]
pub struct Outbound {
    payload_type: u8,
    /// A frame's ticks on the voice's RTP clock.
    ticks: u32,
    ssrc: u32,
    seq: u16,
    timestamp: u32,
    /// The next packet starts a talkspurt (the marker bit).
    spurt: bool,
}

impl Outbound {
    /// Packets of 20 ms frames on a clock of `clock_rate`.
    pub fn new(payload_type: u8, clock_rate: u32, ssrc: u32, seq: u16, timestamp: u32) -> Outbound {
        Outbound { payload_type, ticks: frame_ticks(clock_rate), ssrc, seq, timestamp, spurt: true }
    }

    /// One frame's packet; the clock moves on by the frame.
    pub fn packet(&mut self, frame: &[u8]) -> Vec<u8> {
        let packet = RtpPacketBuilder::new()
            .payload_type(self.payload_type)
            .sequence_number(self.seq)
            .timestamp(self.timestamp)
            .ssrc(self.ssrc)
            .marker_bit(std::mem::take(&mut self.spurt))
            .payload(frame)
            .write_vec_unchecked();
        self.seq = self.seq.wrapping_add(1);
        self.timestamp = self.timestamp.wrapping_add(self.ticks);
        packet
    }

    /// Nothing was sent for `frames` frames (a pause between answers): the clock moves on as
    /// a microphone's would, and the next packet starts a talkspurt.
    pub fn skip(&mut self, frames: u32) {
        self.timestamp = self.timestamp.wrapping_add(frames * self.ticks);
        self.spurt = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rtp(pt: u8, seq: u16, ts: u32, payload: &[u8]) -> Vec<u8> {
        RtpPacketBuilder::new()
            .payload_type(pt)
            .sequence_number(seq)
            .timestamp(ts)
            .ssrc(9)
            .payload(payload)
            .write_vec_unchecked()
    }

    fn heard(i: &mut Inbound, pt: u8, seq: u16) -> Vec<Datagram> {
        let mut out = Vec::new();
        i.push(&rtp(pt, seq, u32::from(seq) * 160, &[seq as u8; 160]), &mut out).unwrap();
        out
    }

    fn voice(seq: u16) -> Datagram {
        Datagram::Voice(vec![seq as u8; 160])
    }

    #[test]
    fn packets_out_of_order_are_put_back_and_a_lost_one_is_told() {
        let mut i = Inbound::new(0, None);
        assert_eq!(heard(&mut i, 0, 65534), [voice(65534)]);
        // 65535 comes after 0 (across the wrap): put back in its place.
        assert!(heard(&mut i, 0, 0).is_empty());
        assert_eq!(heard(&mut i, 0, 65535), [voice(65535), voice(0)]);
        // 1 never comes: once three packets wait behind it, it is told as lost.
        assert!(heard(&mut i, 0, 2).is_empty() && heard(&mut i, 0, 3).is_empty());
        assert_eq!(heard(&mut i, 0, 4), [Datagram::Lost, voice(2), voice(3), voice(4)]);
        // 1 arrives late: dropped.
        let mut out = Vec::new();
        assert_eq!(i.push(&rtp(0, 1, 160, &[1; 160]), &mut out), Err(Dropped::Late(1)));
    }

    #[test]
    fn a_new_stream_or_one_restarted_behind_starts_afresh() {
        let packet = |ssrc: u32, seq: u16| {
            RtpPacketBuilder::new()
                .payload_type(0)
                .sequence_number(seq)
                .ssrc(ssrc)
                .payload(&[seq as u8; 160][..])
                .write_vec_unchecked()
        };
        let mut i = Inbound::new(0, None);
        let mut out = Vec::new();
        i.push(&packet(9, 1000), &mut out).unwrap();
        // Another SSRC far behind: heard at once.
        i.push(&packet(77, 5), &mut out).unwrap();
        assert_eq!(out, [voice(1000), voice(5)]);
        // The same SSRC restarting behind: dropped as late, then heard after a run of them.
        let mut i = Inbound::new(0, None);
        i.push(&packet(9, 1000), &mut Vec::new()).unwrap();
        let mut out = Vec::new();
        let late = (0..=LATE_RUN as u16).filter(|&seq| i.push(&packet(9, seq), &mut out).is_err()).count();
        assert_eq!((late, out), (LATE_RUN as usize, vec![voice(LATE_RUN as u16)]));
    }

    #[test]
    fn a_key_is_handed_on_once_for_its_packets_and_other_types_are_dropped() {
        let mut i = Inbound::new(0, Some(101));
        let mut out = Vec::new();
        for (end, duration) in [(0u8, 160u16), (0, 320), (0x80, 480), (0x80, 480), (0x80, 480)] {
            let [d0, d1] = duration.to_be_bytes();
            i.push(&rtp(101, 7, 8000, &[5, end | 10, d0, d1]), &mut out).unwrap();
        }
        i.push(&rtp(101, 12, 9600, &[11, 10, 0, 160]), &mut out).unwrap();
        // A late repeat of the first key's end: not a key again.
        i.push(&rtp(101, 9, 8000, &[5, 0x80 | 10, 1, 224]), &mut out).unwrap();
        assert_eq!(out, [Datagram::Key(Keypress::new('5').unwrap()), Datagram::Key(Keypress::new('#').unwrap())]);
        assert_eq!(i.push(&rtp(96, 1, 0, &[0; 10]), &mut out), Err(Dropped::PayloadType(96)));
        assert!(matches!(i.push(&[1, 2, 3], &mut out), Err(Dropped::NotRtp(_))));
    }

    #[test]
    fn outgoing_packets_count_on_and_mark_each_talkspurt() {
        let mut o = Outbound::new(8, 8000, 42, 65535, 0);
        let first = o.packet(&[0xd5; 160]);
        let second = o.packet(&[0xd5; 160]);
        o.skip(50);
        let third = o.packet(&[0xd5; 160]);
        let parse = |p: &[u8]| {
            let p = RtpPacket::parse(p).unwrap();
            (p.payload_type(), p.sequence_number(), p.timestamp(), p.marker_bit(), p.ssrc())
        };
        assert_eq!(parse(&first), (8, 65535, 0, true, 42));
        assert_eq!(parse(&second), (8, 0, 160, false, 42));
        assert_eq!(parse(&third), (8, 1, 320 + 50 * 160, true, 42));
        // Opus counts 960 ticks a frame (48 kHz), whatever its packet's length.
        let mut o = Outbound::new(111, 48_000, 42, 0, 0);
        o.packet(&[1, 2, 3]);
        assert_eq!(RtpPacket::parse(&o.packet(&[4, 5])).unwrap().timestamp(), 960);
    }
}
