//! Turn mode: a conversation prefilled, then answered piece by piece in text and, when asked,
//! speech.

use crate::tools::{CALL_CLOSE, CALL_OPEN};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::*;

impl Engine {
    /// A conversation to answer: `continues` appends it to the one held, otherwise it
    /// replaces it; `prefill_only` takes it in and answers nothing; `tools`, the turn's own.
    /// In a duplex session too (ABI 1.3): the answer joins its conversation.
    pub(crate) fn turn_prefill(&mut self, turn: Turn) -> Result<(), Error> {
        let Turn { messages, continues, speech, max_tokens, prefill_only, tools } = turn;
        let limit = if max_tokens == 0 { self.any_session()?.max_tokens } else { max_tokens };
        if messages.iter().any(|m| m.images > 0) {
            return Err(Error::Unsupported("this backend has no vision: it cannot read images".into()));
        }
        self.step = Step { epoch: self.shared.interrupts.load(Ordering::SeqCst), ..Step::default() };
        self.take_back_ahead()?;
        self.cut_answer();
        if !continues {
            self.start_conversation()?;
        }
        let mut text = String::new();
        let tools = match tools {
            Some(t) => {
                // The turn's own tools, told to the model before its messages.
                let prompt = t.prompt();
                if !prompt.is_empty() {
                    text.push_str(&format!("<|im_start|>system\n{}<|im_end|>\n", prompt.trim_start()));
                }
                Arc::new(t)
            }
            None => self.any_session()?.tools.clone(),
        };
        let mut transcript = String::new();
        for (i, m) in messages.iter().enumerate() {
            let (role, words, clips) = (m.role, &m.text, &m.clips);
            if role == ROLE_CALL {
                text.push_str(&format!(
                    "<|im_start|>assistant\n{CALL_OPEN}\n{{\"name\": {}, \"arguments\": {}}}\n{CALL_CLOSE}<|im_end|>\n",
                    serde_json::Value::String(m.name.clone()),
                    if words.trim().is_empty() { "{}" } else { words.trim() }
                ));
                continue;
            }
            if role == ROLE_RESULT {
                text.push_str(&format!(
                    "<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n",
                    words.trim()
                ));
                continue;
            }
            let role = match role {
                0 => "system",
                2 => "assistant",
                _ => "user",
            };
            let mut content = words.trim().to_string();
            for clip in clips {
                let heard = self.hear(clip)?;
                if i + 1 == messages.len() || role == "user" {
                    transcript = heard.clone();
                }
                if !heard.is_empty() {
                    if !content.is_empty() {
                        content.push(' ');
                    }
                    content.push_str(&heard);
                }
            }
            text.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
        }
        self.prefilled_only = prefill_only;
        if prefill_only {
            let tokens = if text.is_empty() { 0 } else { self.feed_cancellable(&text, 0)? };
            self.turn_first = Some((tokens, transcript));
            return Ok(());
        }
        text.push_str("<|im_start|>assistant\n");
        let tokens = self.feed_cancellable(&text, limit)?;
        let mut answer = self.new_answer(limit, speech);
        answer.tools = tools;
        answer.after_results = messages.last().is_some_and(|m| m.role == ROLE_RESULT);
        self.begin(answer)?;
        self.turn_first = Some((tokens, transcript));
        Ok(())
    }

    pub(crate) fn turn_generate(&mut self) -> Result<Piece, Error> {
        self.any_session()?;
        if std::mem::take(&mut self.prefilled_only) {
            let (tokens, _) = self.turn_first.take().unwrap_or_default();
            return Ok(Piece { last: true, input_tokens: tokens, ..Piece::default() });
        }
        if self.answer.is_none() {
            return Err(Error::BadState("no answer in progress: turn_prefill first".into()));
        }
        let t0 = Instant::now();
        let mut p = self.next_piece()?;
        if let Some((tokens, transcript)) = self.turn_first.take() {
            p.input_tokens = tokens;
            p.transcript = transcript;
        }
        p.generate_us = t0.elapsed().as_micros() as u32;
        Ok(p)
    }
}
