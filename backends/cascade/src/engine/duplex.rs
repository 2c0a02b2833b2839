//! Duplex mode: audio in, voice activity until the user stops speaking, the utterance heard,
//! and the LLM's answer fed ahead while the user is still speaking (taken back if they go on).

use crate::early::Point;
use crate::heard::words;
use crate::tts::OUT_RATE;
use crate::vad::RATE;
use omni_asr_client::Heard;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::*;

impl Engine {
    pub(crate) fn duplex_prefill(&mut self, audio: &[f32], force: bool) -> Result<(), Error> {
        self.session(Kind::Duplex)?;
        let t0 = Instant::now();
        self.held = None;
        let pending = self.shared.force_listen.swap(false, Ordering::SeqCst);
        self.step = Step { epoch: self.shared.interrupts.load(Ordering::SeqCst), ..Step::default() };
        self.ahead = (self.ahead - audio.len() as f32 / RATE as f32).max(0.0);
        if force || pending {
            self.step.forced = true;
            self.take_back_ahead()?;
            self.cut_answer();
            self.vad.clear();
            self.utterance.clear();
            return Ok(());
        }
        let config = self.vad_config();
        let was_speaking = self.vad.in_speech();
        let endpoint = self.vad.push(&config, audio).map_err(Error::Inference)?;
        if self.fed_ahead.as_ref().is_some_and(|a| a.at != (self.utterances, self.vad.speech_ms)) {
            // The user went on: the turn fed ahead was not the whole of it.
            self.take_back_ahead()?;
        }
        if self.answer.is_some() && self.vad.recent_voiced_ms() >= self.opt.barge_in_ms {
            // Barge-in: the user talks over the answer; it stops here.
            self.cut_answer();
        }
        if self.vad.in_speech() || endpoint {
            if !was_speaking && self.utterance.is_empty() {
                self.utterances += 1;
                self.utterance.extend(self.preroll.drain(..));
            }
            self.utterance.extend_from_slice(audio);
        } else {
            self.preroll.extend(audio.iter().copied());
            let excess = self.preroll.len().saturating_sub(PREROLL);
            self.preroll.drain(..excess);
        }
        if endpoint || self.utterance.len() >= MAX_UTTERANCE {
            self.step.endpoint = true;
            self.step.heard_at = (self.utterances, self.vad.speech_ms);
            self.vad.clear();
        } else if self.opt.early_asr_ms > 0
            && self.answer.is_none()
            && self.vad.speech_ms >= self.opt.speech_min_ms
            && self.vad.silence_ms >= self.opt.early_asr_ms
        {
            // (A turn fed ahead is of this very utterance: one of another was taken back above.)
            let at = (self.utterances, self.vad.speech_ms);
            if self.fed_ahead.is_some() {
                // Fed: nothing more to do before the endpoint.
            } else if self.early.finished(at) {
                self.feed_ahead(at)?;
            } else {
                self.early.start(&self.shared.asr, &self.utterance, at);
                if self.opt.answer_ahead {
                    // This step waits for Whisper and begins the answer: the chunks that
                    // arrive meanwhile wait in the worker's backlog, and the hang-over goes on.
                    self.feed_ahead(at)?;
                }
            }
        }
        self.step.prefill_us = t0.elapsed().as_micros() as u32;
        Ok(())
    }

    pub(crate) fn duplex_generate(&mut self) -> Result<Piece, Error> {
        self.session(Kind::Duplex)?;
        let t0 = Instant::now();
        let mut piece = if self.step.forced {
            Piece { listen: true, ..Piece::default() }
        } else if self.answer.is_some() {
            self.next_piece()?
        } else if self.step.endpoint {
            self.step.endpoint = false;
            let audio = std::mem::take(&mut self.utterance);
            let ta = Instant::now();
            if self.fed_ahead.as_ref().is_some_and(|a| a.at != self.step.heard_at) {
                self.take_back_ahead()?;
            }
            let mut ahead = self.fed_ahead.take();
            if let Some((mut p, answer)) = ahead.as_mut().and_then(|a| a.begun.take()) {
                // The answer was begun during the hang-over: its first piece goes out now.
                let a = ahead.take().expect("begun ahead");
                self.answer = answer;
                self.ahead = p.audio.len() as f32 / OUT_RATE as f32;
                self.step.began = true;
                if timing() {
                    eprintln!(
                        "TIMING audio {:.2}s begun ahead: {} tokens, first piece ({} bytes, {:.2}s audio) ready {} ms before the endpoint",
                        audio.len() as f32 / 16000.0,
                        a.tokens,
                        p.text.len(),
                        p.audio.len() as f32 / 24000.0,
                        a.ready.elapsed().as_millis()
                    );
                }
                p.transcript = a.heard;
                p.input_tokens = a.tokens;
                p.prefill_us = self.step.prefill_us;
                p.generate_us = t0.elapsed().as_micros() as u32;
                self.step.outputs += 1;
                return Ok(p);
            }
            let (heard, when) = match &ahead {
                Some(a) => {
                    self.early.discard();
                    (a.heard.clone(), "early, fed ahead")
                }
                None => match self.early.take(self.step.heard_at) {
                    Some(text) => (words(&text), "early"),
                    None => (self.hear(&audio)?, "at the endpoint"),
                },
            };
            let asr_ms = ta.elapsed().as_millis();
            if heard.is_empty() {
                Piece { listen: true, ..Piece::default() }
            } else {
                let max = self.session(Kind::Duplex)?.max_tokens;
                let tf = Instant::now();
                let tokens = match &ahead {
                    Some(a) => a.tokens,
                    None => self.feed_cancellable(&user_turn(&heard), max)?,
                };
                let feed_ms = tf.elapsed().as_millis();
                self.begin(self.new_answer(max, true))?;
                self.step.began = true;
                let tp = Instant::now();
                let mut p = self.next_piece()?;
                // The terms of the first audio's delay (docs/performance.md), on stderr (the
                // gateway's log) when asked: OMNI_BACKEND_TIMING=1 (kept for a worker's process).
                if timing() {
                    eprintln!(
                        "TIMING audio {:.2}s asr {asr_ms} ms ({when}), feed {tokens} tokens {feed_ms} ms, first piece {} ms (voice {} ms; {} bytes, {:.2}s audio)",
                        audio.len() as f32 / 16000.0,
                        tp.elapsed().as_millis(),
                        p.voice_us / 1000,
                        p.text.len(),
                        p.audio.len() as f32 / 24000.0
                    );
                }
                p.transcript = heard;
                p.input_tokens = tokens;
                p
            }
        } else {
            Piece { listen: true, ..Piece::default() }
        };
        piece.prefill_us = self.step.prefill_us;
        piece.generate_us = t0.elapsed().as_micros() as u32;
        self.step.outputs += 1;
        Ok(piece)
    }

    /// More of the answer in this step, while the speech sent is less than `lead_ms` ahead.
    pub(crate) fn duplex_drain(&mut self) -> Result<Option<Piece>, Error> {
        self.session(Kind::Duplex)?;
        if self.answer.is_none()
            || self.step.forced
            || self.step.began
            || self.ahead * 1000.0 >= self.opt.lead_ms as f32
            || self.step.outputs >= 8
        {
            return Ok(None);
        }
        let t0 = Instant::now();
        let mut p = self.next_piece()?;
        p.generate_us = t0.elapsed().as_micros() as u32;
        self.step.outputs += 1;
        Ok(Some(p))
    }

    pub(super) fn cancelled(&self) -> bool {
        self.shared.interrupts.load(Ordering::SeqCst) != self.step.epoch
    }

    /// The early transcription has the utterance: its turn goes into the LLM now, during the
    /// rest of the hang-over, so that the endpoint's step starts on the answer at once.
    pub(super) fn feed_ahead(&mut self, at: Point) -> Result<(), Error> {
        let tw = Instant::now();
        let Some(text) = self.early.take(at) else { return Ok(()) };
        let waited = tw.elapsed();
        let heard = words(&text);
        let before = self.llm.n_past();
        let t0 = Instant::now();
        let tokens = if heard.is_empty() {
            0
        } else {
            let max = self.session(Kind::Duplex)?.max_tokens;
            match self.feed_cancellable(&user_turn(&heard), max) {
                Ok(tokens) => tokens,
                Err(e) => return self.abandon_ahead(before, e),
            }
        };
        if timing() {
            eprintln!(
                "TIMING fed ahead: waited {} ms for the early words, {tokens} tokens in {} ms",
                waited.as_millis(),
                t0.elapsed().as_millis()
            );
        }
        let begun = if self.opt.answer_ahead && tokens > 0 && heard.trim_end().ends_with(['.', '?', '!']) {
            // Its first piece too, kept for the endpoint, when the words heard end a sentence
            // (Whisper marks the end of one it heard whole; a pause mid-question rarely has
            // it); the whole of it is taken back (`before`) if the user goes on.
            let max = self.session(Kind::Duplex)?.max_tokens;
            self.begin(self.new_answer(max, true))?;
            let tp = Instant::now();
            let piece = self.next_piece();
            let answer = self.answer.take();
            self.ahead = 0.0;
            match piece {
                Ok(piece) => {
                    if timing() {
                        eprintln!(
                            "TIMING begun ahead: first piece {} ms (voice {} ms)",
                            tp.elapsed().as_millis(),
                            piece.voice_us / 1000
                        );
                    }
                    Some((piece, answer))
                }
                Err(e) => return self.abandon_ahead(before, e),
            }
        } else {
            None
        };
        self.fed_ahead = Some(FedAhead { at, heard, before, tokens, begun, ready: Instant::now() });
        Ok(())
    }

    /// Takes the turn fed ahead back out of the LLM.
    pub(super) fn take_back_ahead(&mut self) -> Result<(), Error> {
        let Some(a) = self.fed_ahead.take() else { return Ok(()) };
        if timing() {
            eprintln!("TIMING the turn fed ahead was taken back: the user went on");
        }
        self.rewind_to(a.before)
    }

    /// What was fed or begun ahead failed with `e`: all of it is taken back out of the LLM
    /// (nothing else knows it is there). Interrupted or out of room, it was only not done ahead:
    /// the endpoint's step feeds it, or tells what is wrong; any other error is the step's.
    pub(super) fn abandon_ahead(&mut self, before: u32, e: Error) -> Result<(), Error> {
        self.rewind_to(before)?;
        match e {
            Error::Interrupted | Error::ContextFull(_) => Ok(()),
            e => Err(e),
        }
    }

    /// The LLM back to its first `before` tokens; should llama.cpp refuse, the conversation
    /// starts over from its system prompt (what was fed must not stay half in).
    pub(super) fn rewind_to(&mut self, before: u32) -> Result<(), Error> {
        if !self.llm.rewind(before) {
            eprintln!("omni-cascade: a turn fed ahead could not be taken back; the conversation starts over");
            return self.start_conversation();
        }
        self.sync_kv();
        Ok(())
    }

    pub(super) fn feed_cancellable(&mut self, text: &str, reserve: u32) -> Result<u32, Error> {
        let epoch = self.step.epoch;
        let shared = self.shared.clone();
        let r = self.llm.feed(text, reserve, &move || shared.interrupts.load(Ordering::SeqCst) != epoch);
        self.sync_kv();
        r.map_err(Error::from)
    }

    /// The words of an utterance (see [`words`]).
    pub(super) fn hear(&mut self, audio: &[f32]) -> Result<String, Error> {
        self.early.discard();
        // (checked after the early job ended: an interrupt meanwhile only cut that job short)
        if self.cancelled() {
            return Err(Error::Interrupted);
        }
        match self.shared.asr.transcribe(audio).map_err(|e| Error::Inference(e.to_string()))? {
            Heard::Aborted => Err(Error::Interrupted),
            Heard::Text(t) => Ok(words(&t)),
        }
    }
}
