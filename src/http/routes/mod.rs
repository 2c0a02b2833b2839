//! HTTP routes: the realtime endpoints (`realtime/`: WebSocket, WebRTC calls, client secrets), telephone
//! calls (`telephony.rs`: Twilio and Telnyx media streams), health, the operator
//! routes (`admin.rs`: status, metrics, recordings, queue cancellation), and the pages
//! (`pages.rs`: the client and the console).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use omni_actors::status::StatusQuery;
use serde_json::json;

use crate::http::Gateway;

mod admin;
mod pages;
mod realtime;
mod telephony;

/// The routes; `origins` are `server.allowed_origins`, the other sites whose pages may make
/// calls and mint secrets here (CORS on those routes: [`realtime::cors`]).
pub(crate) fn configure(cfg: &mut web::ServiceConfig, origins: &[String]) {
    cfg.route("/v1/realtime", web::get().to(realtime::websocket::realtime))
        .route("/v1/telephony/twilio", web::get().to(telephony::twilio))
        // The model in the path: Twilio's <Stream url> takes no query string.
        .route("/v1/telephony/twilio/{model}", web::get().to(telephony::twilio))
        .route("/v1/telephony/telnyx", web::get().to(telephony::telnyx))
        .route("/v1/telephony/telnyx/{model}", web::get().to(telephony::telnyx))
        .route("/api-ws/v1/realtime", web::get().to(realtime::websocket::qwen_realtime))
        .service(
            web::scope("/v1/realtime/calls")
                .wrap(realtime::cors(origins))
                .route("", web::post().to(realtime::calls::create))
                .route("/{id}/hangup", web::post().to(realtime::calls::hang_up))
                .route("/{id}/accept", web::post().to(realtime::sip_calls::accept))
                .route("/{id}/reject", web::post().to(realtime::sip_calls::reject))
                .route("/{id}", web::delete().to(realtime::calls::hang_up)),
        )
        .service(
            web::resource("/v1/realtime/client_secrets")
                .wrap(realtime::cors(origins))
                .route(web::post().to(realtime::client_secrets::mint)),
        )
        .route("/healthz", web::get().to(healthz))
        .route("/readyz", web::get().to(readyz))
        .route("/v1/modes", web::get().to(modes))
        .route("/status", web::get().to(admin::status))
        .route("/metrics", web::get().to(admin::metrics))
        .route("/sessions", web::get().to(admin::sessions))
        .route("/sessions/{id}", web::get().to(admin::session_meta))
        .route("/sessions/{id}/{file:.*}", web::get().to(admin::session_file))
        .route("/queue/{ticket}", web::delete().to(admin::cancel_ticket))
        .route("/", web::get().to(pages::client))
        .route("/console", web::get().to(pages::console))
        .route("/app/{name}", web::get().to(pages::app));
}

/// An HTTP error with the same JSON shape as the WebSocket `error` event.
pub(crate) fn http_error(status: StatusCode, code: &str, message: impl Into<String>) -> HttpResponse {
    let kind = if status.is_client_error() { "client_error" } else { "server_error" };
    HttpResponse::build(status).json(json!({"error": {"code": code, "message": message.into(), "type": kind}}))
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// The modes served, and whether a worker of each is up now: the client page offers only
/// those, and says plainly when none is up. Public, as `/healthz` (it names no worker).
async fn modes(gw: web::Data<Gateway>) -> HttpResponse {
    use omni_actors::domain::Mode;
    let status = gw.status.send(StatusQuery).await.unwrap_or_default();
    let mut out = serde_json::Map::new();
    for mode in Mode::ALL {
        let (served, up) = status.mode(mode);
        out.insert(mode.as_str().to_string(), json!({"served": served, "up": up}));
    }
    // Whether the page may call over WebRTC (`[webrtc] enabled`).
    HttpResponse::Ok().json(json!({"modes": out, "webrtc": gw.calls.is_some()}))
}

/// Ready: some worker can serve (a replica: and it reaches its store), the SIP edge (when on)
/// reads its port, and the server is not stopping.
async fn readyz(gw: web::Data<Gateway>) -> HttpResponse {
    if gw.sip.up() == Some(false) {
        return http_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "the SIP edge stopped reading its port",
        );
    }
    let ready = gw.status.send(StatusQuery).await.is_ok_and(|s| s.ready());
    if ready && !gw.registry.shutting_down() {
        HttpResponse::Ok().json(json!({"status": "ready"}))
    } else {
        http_error(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "no worker can serve")
    }
}
