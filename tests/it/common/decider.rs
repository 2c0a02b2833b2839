//! A chat-completions server as a decider meets one (`[delegation] decider = "http"`): the
//! OpenAI API's `POST /v1/chat/completions`, in-process on a free loopback port, answering
//! what the test sets, and keeping every request with its `Authorization` header.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::{Value, json};

/// How the server answers the next requests.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    /// A call of `name` with `arguments` (JSON text).
    Call(String, String),
    /// Words and no call.
    Words(String),
    /// HTTP 503.
    Down,
    /// Text that is not JSON.
    Malformed,
    /// A call, after this long.
    Slow(Duration),
    /// A 4 MB answer.
    Huge,
    /// A text model's choice, by rule: the first `(word, tool, arguments)` whose word is in the
    /// newest user message (lowercased) is called, if the request offers that tool; else words.
    Rules(Vec<(String, String, String)>),
}

#[derive(Debug)]
pub(crate) struct DeciderState {
    pub answer: Answer,
    /// Every request: its `Authorization` header and its body.
    pub requests: Vec<(Option<String>, Value)>,
}

pub(crate) struct FakeDecider {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<DeciderState>>,
}

impl FakeDecider {
    pub(crate) fn start(answer: Answer) -> FakeDecider {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(DeciderState { answer, requests: Vec::new() }));
        let shared = state.clone();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let data = web::Data::new(shared);
                HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .app_data(web::JsonConfig::default().limit(16 << 20))
                        .route("/v1/chat/completions", web::post().to(complete))
                })
                .workers(1)
                .listen(listener)
                .unwrap()
                .run()
                .await
                .unwrap();
            });
        });
        FakeDecider { addr, state }
    }

    /// The `[delegation]` section of a gateway that asks this server, with `extra` keys.
    pub(crate) fn section(&self, extra: &str) -> String {
        format!(
            "[delegation]\ndecider = \"http\"\nurl = \"http://{}/v1\"\nmodel = \"decider-model\"\napi_key = \"sk-decider-test\"\n{extra}\n",
            self.addr
        )
    }

    pub(crate) fn answer(&self, answer: Answer) {
        self.state.lock().unwrap().answer = answer;
    }

    pub(crate) fn requests(&self) -> Vec<(Option<String>, Value)> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The requests, once there are `n` (within [`crate::common::WAIT`]).
    pub(crate) fn wait_for(&self, n: usize) -> Vec<(Option<String>, Value)> {
        let deadline = std::time::Instant::now() + crate::common::WAIT;
        loop {
            let requests = self.requests();
            if requests.len() >= n {
                return requests;
            }
            assert!(std::time::Instant::now() < deadline, "{n} requests expected: {requests:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

async fn complete(
    req: HttpRequest,
    body: web::Json<Value>,
    state: web::Data<Arc<Mutex<DeciderState>>>,
) -> HttpResponse {
    let auth = req.headers().get("Authorization").and_then(|v| v.to_str().ok()).map(String::from);
    let answer = {
        let mut s = state.lock().unwrap();
        s.requests.push((auth, body.into_inner()));
        s.answer.clone()
    };
    let message = match answer {
        Answer::Down => return HttpResponse::ServiceUnavailable().body("model is loading"),
        Answer::Malformed => return HttpResponse::Ok().content_type("application/json").body("{\"choices\": [ oops"),
        Answer::Huge => {
            let words = "x".repeat(4 << 20);
            return HttpResponse::Ok().json(json!({"choices": [{"message": {"role": "assistant", "content": words}}]}));
        }
        Answer::Slow(how_long) => {
            tokio::time::sleep(how_long).await;
            json!({"role": "assistant", "content": "late"})
        }
        Answer::Words(words) => json!({"role": "assistant", "content": words}),
        Answer::Rules(rules) => {
            let request = state.lock().unwrap().requests.last().map(|r| r.1.clone()).unwrap_or_default();
            let newest = request["messages"].as_array().and_then(|m| m.iter().rev().find(|m| m["role"] == "user"));
            let said = newest.and_then(|m| m["content"].as_str()).unwrap_or_default().to_lowercase();
            let offered = |tool: &str| {
                request["tools"].as_array().is_some_and(|t| t.iter().any(|t| t["function"]["name"] == tool))
            };
            match rules.iter().find(|(word, tool, _)| said.contains(word.as_str()) && offered(tool)) {
                Some((_, tool, arguments)) => json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_fake_1", "type": "function", "function": {"name": tool, "arguments": arguments}}]}),
                None => json!({"role": "assistant", "content": "No tool needed."}),
            }
        }
        Answer::Call(name, arguments) => json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_fake_1", "type": "function", "function": {"name": name, "arguments": arguments}}]}),
    };
    HttpResponse::Ok().json(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "decider-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
    }))
}
