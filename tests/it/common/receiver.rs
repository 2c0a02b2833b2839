//! An HTTP endpoint that receives webhooks, in-process on a free loopback port: it keeps
//! every request, and can answer 500 to the first N of them, or never answer at all.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

/// One request as received.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Received {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap()
    }
}

#[derive(Debug, Default)]
pub(crate) struct ReceiverState {
    pub received: Vec<Received>,
    /// Answer 500 to this many more requests.
    pub fail_next: usize,
    /// Never answer (hold each request this long).
    pub hang: Option<Duration>,
    /// Answer every request with a redirect (302) to this URL.
    pub redirect_to: Option<String>,
}

pub(crate) struct Receiver {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<ReceiverState>>,
}

impl Receiver {
    pub(crate) fn start() -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ReceiverState::default()));
        let shared = web::Data::new(state.clone());
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                HttpServer::new(move || App::new().app_data(shared.clone()).default_service(web::to(receive)))
                    .workers(1)
                    .listen(listener)
                    .unwrap()
                    .run()
                    .await
                    .unwrap();
            });
        });
        Receiver { addr, state }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut ReceiverState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Waits until a request satisfies `check`, and returns it.
    pub(crate) fn wait_for(&self, what: &str, check: impl Fn(&Received) -> bool) -> Received {
        let deadline = std::time::Instant::now() + super::WAIT;
        loop {
            if let Some(r) = self.with(|s| s.received.iter().find(|r| check(r)).cloned()) {
                return r;
            }
            assert!(std::time::Instant::now() < deadline, "no webhook {what}: {:?}", self.with(|s| s.received.clone()));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

async fn receive(req: HttpRequest, body: web::Bytes, state: web::Data<Arc<Mutex<ReceiverState>>>) -> HttpResponse {
    let headers =
        req.headers().iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string())).collect();
    let (fail, hang, redirect) = {
        let mut s = state.lock().unwrap();
        s.received.push(Received { headers, body: String::from_utf8_lossy(&body).into_owned() });
        let fail = s.fail_next > 0;
        s.fail_next = s.fail_next.saturating_sub(1);
        (fail, s.hang, s.redirect_to.clone())
    };
    if let Some(to) = redirect {
        return HttpResponse::Found().insert_header(("Location", to)).finish();
    }
    if let Some(hang) = hang {
        actix_web::rt::time::sleep(hang).await;
    }
    if fail { HttpResponse::InternalServerError().body("try again") } else { HttpResponse::Ok().finish() }
}
