//! The pages the binary serves: the client (`/`) and the operator's console (`/console`),
//! with their scripts and style under `/app/`. Every file of `web/` is embedded at build
//! time: the one binary is the whole deployment, and nothing is fetched from elsewhere.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

/// `web/`'s files: name, content type, content.
const ASSETS: [(&str, &str, &str); 7] = [
    ("index.html", "text/html; charset=utf-8", include_str!("../../../web/index.html")),
    ("console.html", "text/html; charset=utf-8", include_str!("../../../web/console.html")),
    ("client.js", "text/javascript; charset=utf-8", include_str!("../../../web/client.js")),
    ("call.js", "text/javascript; charset=utf-8", include_str!("../../../web/call.js")),
    ("console.js", "text/javascript; charset=utf-8", include_str!("../../../web/console.js")),
    ("worklet.js", "text/javascript; charset=utf-8", include_str!("../../../web/worklet.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../../../web/style.css")),
];

/// The pages load only what this server serves; they talk to it alone, over WebSocket, HTTP
/// (`'self'` covers `ws:` and `wss:` of the page's own host) and WebRTC calls it answers.
const POLICY: &str = "default-src 'self'; connect-src 'self'; img-src 'self' data: blob:; \
                      media-src 'self' blob: mediastream:; style-src 'self'; script-src 'self'; \
                      frame-ancestors 'none'; base-uri 'none'";

fn asset(name: &str) -> HttpResponse {
    match ASSETS.iter().find(|(n, ..)| *n == name) {
        Some((_, content_type, body)) => HttpResponse::Ok()
            .content_type(*content_type)
            .insert_header((header::CONTENT_SECURITY_POLICY, POLICY))
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            .body(*body),
        None => super::http_error(actix_web::http::StatusCode::NOT_FOUND, "not_found", "no such file"),
    }
}

pub(super) async fn client() -> HttpResponse {
    asset("index.html")
}

pub(super) async fn console() -> HttpResponse {
    asset("console.html")
}

pub(super) async fn app(name: web::Path<String>) -> HttpResponse {
    asset(&name)
}
