//! An answer as it is pulled: its next piece (text, the spoken clause, a tool call) and its
//! end.

use crate::tools::{self, CALL_CLOSE, CALL_OPEN, Opening};
use crate::tts::OUT_RATE;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::*;

impl Engine {
    /// The answer in progress.
    pub(super) fn answer(&mut self) -> Result<&mut Answer, Error> {
        self.answer.as_mut().ok_or_else(|| Error::BadState("no answer in progress".into()))
    }

    /// One more token of the answer (or its end: the model's end of turn or the token limit).
    pub(super) fn pull(&mut self) -> Result<(), Error> {
        let answer = self.answer()?;
        if answer.tokens >= answer.limit {
            answer.done = true;
            return Ok(());
        }
        let next = self.llm.next();
        self.sync_kv();
        let answer = self.answer()?;
        match next? {
            None => answer.done = true,
            Some(piece) => {
                answer.text.push_str(&piece);
                answer.tokens += 1;
            }
        }
        Ok(())
    }

    /// The next clause of the answer in progress, with its speech.
    ///
    /// The answer's first piece is its first clause, or its first `first_piece_words` words when
    /// the clause is longer ([`words_end`]). A first clause goes out as soon as its sentence has
    /// ended, without waiting for the next token to show whether more follows: that costs a
    /// token's time (some 40 ms on 2 cores) before the first sound; the end of the answer then
    /// comes as a piece of its own.
    pub(super) fn next_piece(&mut self) -> Result<Piece, Error> {
        let first = self.answer()?.tokens == 0;
        let clause;
        loop {
            let words = if first { self.opt.first_piece_words } else { 0 };
            let answer = self.answer()?;
            let calls = answer.tools.active();
            match tools::opening(answer.text.trim_start()) {
                Opening::Tagged if calls => return self.next_call(),
                Opening::Bare if calls => {
                    self.hold_bare()?;
                    return self.next_call();
                }
                Opening::Perhaps if calls && !answer.done => {
                    // Perhaps a call begins: not a word of it is spoken.
                    self.pull()?;
                    continue;
                }
                _ => {}
            }
            let answer = self.answer()?;
            // Words before a call end at it.
            let call_at = answer.text.find(CALL_OPEN).filter(|&at| calls && at > 0);
            if let Some(end) =
                [clause_end(&answer.text), words_end(&answer.text, words), call_at].into_iter().flatten().min()
            {
                clause = answer.text[..end].to_string();
                answer.text.drain(..end);
                break;
            }
            if first && answer.tokens > 0 && sentence_ended(&answer.text) {
                clause = std::mem::take(&mut answer.text);
                break;
            }
            if answer.done {
                clause = std::mem::take(&mut answer.text);
                break;
            }
            if self.cancelled() {
                self.cut_answer();
                return Err(Error::Interrupted);
            }
            self.pull()?;
        }
        // Look ahead to the next word: whether this clause ends the answer (not for the first).
        loop {
            let answer = self.answer()?;
            if first || answer.done || !answer.text.trim().is_empty() {
                break;
            }
            self.pull()?;
        }
        self.sync_kv();
        let answer = self.answer.as_mut().ok_or_else(|| Error::BadState("no answer in progress".into()))?;
        answer.spoke |= !clause.trim().is_empty();
        let last = answer.done && answer.text.trim().is_empty();
        let speech = answer.speech;
        let tokens = answer.tokens - answer.reported;
        answer.reported = answer.tokens;
        let text = clause;
        let tv = Instant::now();
        let audio = if speech {
            let epoch = self.step.epoch;
            let shared = self.shared.clone();
            self.voice
                .speak(&text, &move || shared.interrupts.load(Ordering::SeqCst) != epoch)
                .map_err(|e| Error::Inference(e.to_string()))?
        } else {
            Vec::new()
        };
        let voice_us = tv.elapsed().as_micros() as u32;
        if self.cancelled() {
            self.cut_answer();
            return Err(Error::Interrupted);
        }
        self.ahead += audio.len() as f32 / OUT_RATE as f32;
        if last {
            self.answer = None;
            let _ = self.llm.feed("<|im_end|>\n", 0, &|| false);
            self.sync_kv();
        }
        Ok(Piece { text, audio, last, tokens, voice_us, ..Piece::default() })
    }

    /// The function call the answer goes on with: written whole (up to its closing tag or the
    /// end of the answer), checked against its tool, and handed out as one piece.
    pub(super) fn next_call(&mut self) -> Result<Piece, Error> {
        loop {
            let answer = self.answer()?;
            if answer.done || answer.text.contains(CALL_CLOSE) {
                break;
            }
            if self.cancelled() {
                self.cut_answer();
                return Err(Error::Interrupted);
            }
            self.pull()?;
        }
        let answer = self.answer()?;
        let from = answer.text.find(CALL_OPEN).map_or(0, |at| at + CALL_OPEN.len());
        let to = answer.text.find(CALL_CLOSE).unwrap_or(answer.text.len());
        let written = answer.text[from..to.max(from)].to_string();
        let rest = to.saturating_add(CALL_CLOSE.len()).min(answer.text.len());
        answer.text.drain(..rest);
        let checked = answer.tools.check(&written);
        let (name, arguments) = match checked {
            Ok(call) => call,
            Err(why) => {
                self.cut_answer();
                return Err(Error::Inference(format!("the model's function call was refused: {why}")));
            }
        };
        // Whether anything follows the call (another call, or words).
        loop {
            let answer = self.answer()?;
            if answer.done || !answer.text.trim().is_empty() {
                break;
            }
            self.pull()?;
        }
        let answer = self.answer()?;
        let last = answer.done && answer.text.trim().is_empty();
        let tokens = answer.tokens - answer.reported;
        answer.reported = answer.tokens;
        answer.calls.push((name.clone(), arguments.clone()));
        if last {
            let answer = self.answer.take();
            self.end_calls(answer);
        }
        self.sync_kv();
        Ok(Piece { last, tokens, call: Some((name, arguments)), ..Piece::default() })
    }

    /// An answer that was calls only ends. The conversation keeps them in the template's own
    /// form (each in `<tool_call>` tags) however the model wrote them: a small model that wrote
    /// a bare call reads its calls back as the template shows them, and answers with the result
    /// rather than calling again.
    pub(super) fn end_calls(&mut self, answer: Option<Answer>) {
        let Some(answer) = answer else { return };
        let canonical: Vec<String> = answer
            .calls
            .iter()
            .map(|(name, arguments)| {
                format!(
                    "{CALL_OPEN}\n{{\"name\": {}, \"arguments\": {arguments}}}\n{CALL_CLOSE}",
                    serde_json::Value::String(name.clone())
                )
            })
            .collect();
        let rewritten = !answer.calls.is_empty()
            && !answer.spoke
            && self.llm.rewind(answer.start)
            && self.llm.feed(&format!("{}<|im_end|>\n", canonical.join("\n")), 0, &|| false).is_ok();
        if !rewritten {
            let _ = self.llm.feed("<|im_end|>\n", 0, &|| false);
        }
    }

    // ---- turn mode ----
}
