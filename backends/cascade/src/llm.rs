//! The language model: a GGUF chat model run by llama.cpp (crate `llama-cpp-2`), holding the
//! conversation in its KV cache. The conversation is written in ChatML (`<|im_start|>role ...
//! <|im_end|>`), the template of the Qwen2.5 and SmolLM2 models the fetch script provides; a
//! model whose template is not ChatML is refused at open.
//!
//! Weights are loaded once per process and path and shared by every handle; each handle has
//! its own context (KV cache).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;

const BATCH: usize = 256;

pub(crate) enum LlmError {
    ContextFull(String),
    Interrupted,
    Failed(String),
}

#[derive(Clone)]
pub(crate) struct Sampling {
    pub temperature: f32,
    pub top_k: i32,
    pub top_p: f32,
    pub seed: u32,
}

struct Openers {
    non_words: Vec<LlamaToken>,
    calls: Vec<LlamaToken>,
}

pub(crate) struct Llm {
    model: &'static LlamaModel,
    ctx: LlamaContext<'static>,
    batch: LlamaBatch<'static>,
    sampler: LlamaSampler,
    sampling: Sampling,
    /// Whether the sampler holds a grammar ([`Llm::hold`]).
    held: bool,
    /// The token a function call opens with (`<tool_call>`), when the model has one.
    call_token: Option<LlamaToken>,
    /// The last token sampled.
    last_token: Option<LlamaToken>,
    /// The tokens that open no word, and those that open a call, once looked up.
    openers: Option<Openers>,
    /// The sampler from the second token of the answer on.
    then: Option<LlamaSampler>,
    n_past: u32,
    n_ctx: u32,
    /// Bytes of a character split across tokens.
    partial: Vec<u8>,
    /// Index of the logits to sample from in the last decoded batch.
    last: i32,
    /// The tokens the last conversation started with (its system block), and whether the KV
    /// cache still holds them at positions 0.. after `clear`: a conversation that starts the
    /// same way reuses them instead of computing them again (most sessions share a prompt).
    prefix: Vec<LlamaToken>,
    kept: bool,
}

fn backend() -> Result<&'static LlamaBackend, String> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            let mut b = LlamaBackend::init().map_err(|e| format!("llama.cpp: {e}"))?;
            b.void_logs();
            Ok(b)
        })
        .as_ref()
        .map_err(|e| e.clone())
}

/// The weights of `path`, loaded once per process.
fn model(path: &Path) -> Result<&'static LlamaModel, String> {
    static MODELS: OnceLock<Mutex<HashMap<PathBuf, &'static LlamaModel>>> = OnceLock::new();
    let backend = backend()?;
    let mut models = MODELS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = models.get(path) {
        return Ok(m);
    }
    let m = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
        .map_err(|e| format!("llm_model {}: llama.cpp could not load it: {e}", path.display()))?;
    let m: &'static LlamaModel = Box::leak(Box::new(m));
    models.insert(path.to_path_buf(), m);
    Ok(m)
}

impl Llm {
    pub(crate) fn open(path: &Path, n_ctx: u32, threads: i32, sampling: &Sampling) -> Result<Llm, String> {
        let model = model(path)?;
        let template = model.chat_template(None).ok().and_then(|t| t.to_string().ok()).unwrap_or_default();
        if !template.contains("<|im_start|>") {
            return Err(format!("llm_model {}: its chat template is not ChatML (<|im_start|>)", path.display()));
        }
        let n_ctx = n_ctx.min(model.n_ctx_train().max(512));
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(n_ctx))
            .with_n_batch(BATCH as u32)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let ctx = model.new_context(backend()?, params).map_err(|e| format!("llama.cpp context: {e}"))?;
        let call_token = match model.vocab().tokenize(crate::tools::CALL_OPEN.as_bytes(), false, true)[..] {
            [t] => Some(t),
            _ => None,
        };
        Ok(Llm {
            model,
            ctx,
            batch: LlamaBatch::new(BATCH, 1),
            sampler: sampler(sampling),
            sampling: sampling.clone(),
            held: false,
            call_token,
            last_token: None,
            openers: None,
            then: None,
            n_past: 0,
            n_ctx,
            partial: Vec::new(),
            last: 0,
            prefix: Vec::new(),
            kept: false,
        })
    }

    pub(crate) fn n_past(&self) -> u32 {
        self.n_past
    }

    pub(crate) fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    pub(crate) fn set_sampling(&mut self, sampling: &Sampling) {
        self.sampler = sampler(sampling);
        self.sampling = sampling.clone();
        self.held = false;
        self.then = None;
    }

    /// How the next answer is sampled: freely (`None`), or held to `grammar` (GBNF) from
    /// `root` on. `lazy`: only once the model writes its call token (`<tool_call>`); a model
    /// without one is not held.
    pub(crate) fn hold(&mut self, grammar: Option<&str>, root: &str, lazy: bool) -> Result<(), String> {
        self.last_token = None;
        self.then = None;
        let Some(grammar) = grammar else {
            if std::mem::take(&mut self.held) {
                self.sampler = sampler(&self.sampling);
            }
            return Ok(());
        };
        let held = if lazy {
            let Some(call) = self.call_token else { return self.hold(None, root, false) };
            LlamaSampler::grammar_lazy_patterns(self.model, grammar, root, &[], &[call])
        } else {
            LlamaSampler::grammar(self.model, grammar, root)
        };
        let held = held.map_err(|e| format!("llama.cpp refused the function call grammar: {e}"))?;
        self.sampler = LlamaSampler::chain_simple([held, sampler(&self.sampling)]);
        self.held = true;
        Ok(())
    }

    /// The next answer is words: it opens with a word (not a call, code, or markup), and no
    /// token of it opens a call (`<tool_call>`, `{`).
    pub(crate) fn hold_to_words(&mut self) {
        self.last_token = None;
        let model = self.model;
        let call_token = self.call_token;
        let openers = self.openers.get_or_insert_with(|| {
            let vocab = model.vocab();
            let mut non_words = Vec::new();
            let mut calls = Vec::new();
            for t in (0..model.n_vocab()).map(LlamaToken) {
                let piece = vocab.token_to_piece(t, false, None);
                let first = piece.trim_ascii_start().first().copied();
                if Some(t) == call_token || first == Some(b'{') {
                    calls.push(t);
                }
                // Not a word: punctuation, markup, code; an empty piece (a control token).
                if Some(t) == call_token || first.is_none_or(|c| c.is_ascii() && !c.is_ascii_alphanumeric()) {
                    non_words.push(t);
                }
            }
            Openers { non_words, calls }
        });
        let ban = |tokens: &[LlamaToken]| {
            let biases: Vec<LlamaLogitBias> =
                tokens.iter().map(|&t| LlamaLogitBias::new(t, f32::NEG_INFINITY)).collect();
            LlamaSampler::logit_bias(model.n_vocab(), &biases)
        };
        self.sampler = LlamaSampler::chain_simple([ban(&openers.non_words), sampler(&self.sampling)]);
        self.then = Some(LlamaSampler::chain_simple([ban(&openers.calls), sampler(&self.sampling)]));
        self.held = true;
    }

    /// Holds the rest of the answer to `grammar` from `root`, its last token the first of it
    /// (a bare call's `{`). False, and sampling as it was, when that token does not fit.
    pub(crate) fn hold_from_last(&mut self, grammar: &str, root: &str) -> Result<bool, String> {
        let Some(last) = self.last_token else { return Ok(false) };
        let mut held = LlamaSampler::grammar(self.model, grammar, root)
            .map_err(|e| format!("llama.cpp refused the function call grammar: {e}"))?;
        let mut one = LlamaTokenDataArray::new(vec![LlamaTokenData::new(last, 0.0, 1.0)], false);
        held.apply(&mut one);
        if one.data.first().is_none_or(|d| d.logit() == f32::NEG_INFINITY) {
            return Ok(false);
        }
        held.accept(last);
        self.sampler = LlamaSampler::chain_simple([held, sampler(&self.sampling)]);
        self.held = true;
        Ok(true)
    }

    /// Forgets the conversation. Its start stays in the KV cache, for `start` to reuse.
    pub(crate) fn clear(&mut self) {
        let len = self.prefix.len() as u32;
        self.kept = len > 0
            && (self.kept || self.n_past >= len)
            && self.ctx.clear_kv_cache_seq(Some(0), Some(len), None).unwrap_or(false);
        if !self.kept {
            self.ctx.clear_kv_cache();
            self.prefix.clear();
        }
        self.n_past = 0;
        self.partial.clear();
    }

    /// Takes back what was fed after the first `to` tokens (a user turn fed ahead that the
    /// user went on from). False when llama.cpp could not, and the conversation is as it was.
    pub(crate) fn rewind(&mut self, to: u32) -> bool {
        if to >= self.n_past {
            return true;
        }
        if !self.ctx.clear_kv_cache_seq(Some(0), Some(to), None).unwrap_or(false) {
            return false;
        }
        self.n_past = to;
        self.partial.clear();
        true
    }

    /// Starts a conversation with `text` (its system block): reused from the last conversation
    /// when it started the same way, else computed. Returns its tokens.
    pub(crate) fn start(&mut self, text: &str, cancelled: &dyn Fn() -> bool) -> Result<u32, LlmError> {
        let tokens = self.model.vocab().tokenize(text.as_bytes(), false, true);
        if self.kept && self.n_past == 0 && tokens == self.prefix {
            self.kept = false;
            self.n_past = tokens.len() as u32;
            return Ok(self.n_past);
        }
        self.forget_kept();
        self.prefix.clear();
        let n = self.feed_tokens(&tokens, 0, cancelled)?;
        self.prefix = tokens;
        Ok(n)
    }

    /// The kept start is not wanted: the cache is emptied before anything else goes in.
    fn forget_kept(&mut self) {
        if self.kept {
            self.ctx.clear_kv_cache();
            self.kept = false;
        }
    }

    /// Appends text (with ChatML's special tokens) to the conversation; returns its tokens.
    /// `reserve` tokens must stay free after it (room for an answer).
    pub(crate) fn feed(&mut self, text: &str, reserve: u32, cancelled: &dyn Fn() -> bool) -> Result<u32, LlmError> {
        let tokens = self.model.vocab().tokenize(text.as_bytes(), false, true);
        self.forget_kept();
        self.feed_tokens(&tokens, reserve, cancelled)
    }

    fn feed_tokens(
        &mut self,
        tokens: &[LlamaToken],
        reserve: u32,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<u32, LlmError> {
        let needed = self.n_past as usize + tokens.len() + reserve as usize;
        if needed > self.n_ctx as usize {
            return Err(LlmError::ContextFull(format!(
                "context full: {} tokens held + {} new + {} for the answer > n_ctx {}",
                self.n_past,
                tokens.len(),
                reserve,
                self.n_ctx
            )));
        }
        for (i, piece) in tokens.chunks(BATCH).enumerate() {
            if cancelled() {
                return Err(LlmError::Interrupted);
            }
            let last_piece = (i + 1) * BATCH >= tokens.len();
            self.decode(piece, last_piece)?;
        }
        Ok(tokens.len() as u32)
    }

    fn decode(&mut self, tokens: &[LlamaToken], logits_at_end: bool) -> Result<(), LlmError> {
        self.batch.clear();
        for (i, t) in tokens.iter().enumerate() {
            let logits = logits_at_end && i + 1 == tokens.len();
            self.batch
                .add(*t, (self.n_past + i as u32) as i32, &[0], logits)
                .map_err(|e| LlmError::Failed(format!("llama.cpp batch: {e}")))?;
        }
        self.ctx.decode(&mut self.batch).map_err(|e| LlmError::Failed(format!("llama.cpp decode: {e}")))?;
        self.n_past += tokens.len() as u32;
        if logits_at_end {
            self.last = tokens.len() as i32 - 1;
        }
        Ok(())
    }

    /// The next piece of the answer: `None` at the end of the model's turn.
    pub(crate) fn next(&mut self) -> Result<Option<String>, LlmError> {
        // (`sample` accepts the token too: a second accept would feed a grammar twice)
        let token = self.sampler.sample(&self.ctx, self.last);
        self.last_token = Some(token);
        if let Some(then) = self.then.take() {
            self.sampler = then;
        }
        if self.model.vocab().is_eog(token) {
            return Ok(None);
        }
        if self.n_past + 1 >= self.n_ctx {
            return Err(LlmError::ContextFull(format!("context full while answering (n_ctx {})", self.n_ctx)));
        }
        self.decode(&[token], true)?;
        self.partial.extend(self.model.vocab().token_to_piece(token, false, None));
        // Hand out whole characters only.
        let valid = match std::str::from_utf8(&self.partial) {
            Ok(_) => self.partial.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.partial.len(), // invalid bytes: give them up (lossy)
        };
        let text = String::from_utf8_lossy(&self.partial[..valid]).into_owned();
        self.partial.drain(..valid);
        Ok(Some(text))
    }
}

fn sampler(s: &Sampling) -> LlamaSampler {
    if s.temperature <= 0.0 {
        return LlamaSampler::greedy();
    }
    LlamaSampler::chain_simple([
        LlamaSampler::top_k(s.top_k),
        LlamaSampler::top_p(s.top_p, 1),
        LlamaSampler::temp(s.temperature),
        LlamaSampler::dist(s.seed),
    ])
}
