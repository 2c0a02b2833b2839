//! The operator routes: status, metrics, recorded sessions and their files, and queue
//! cancellation. They answer the admin key (Bearer) or, with none configured, loopback
//! clients only; every answer carries `Cache-Control: no-store` (they hold voices, faces
//! and client addresses, which no cache may keep).

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, web};
use omni_actors::domain::Mode;
use omni_actors::messages::queue::{Cancel, QueueSnapshot};
use omni_actors::observe::metrics::metrics as gateway_metrics;
use omni_actors::status::{StatusQuery, WorkerRow};
use serde_json::json;

use super::http_error;
use crate::auth::{self, Denied};
use crate::http::Gateway;
use crate::observe::recordings;

/// Marks an operator answer as not to be stored by any cache.
fn private(mut resp: HttpResponse) -> HttpResponse {
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// The admin check of the operator routes; `Some` is the refusal.
async fn refusal(req: &HttpRequest, gw: &Gateway) -> Option<HttpResponse> {
    let client = auth::client_ip(req, &gw.config.trusted_proxies);
    let checked = gw.keys.paced(client, |k| k.check_admin(req, client, &gw.config.trusted_proxies)).await;
    let denied = checked.err()?;
    let (status, code) = match denied {
        Denied::AdminLoopbackOnly => (StatusCode::FORBIDDEN, "forbidden"),
        Denied::Throttled => (StatusCode::TOO_MANY_REQUESTS, "too_many_attempts"),
        Denied::Missing(_) | Denied::Wrong(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
    };
    Some(private(http_error(status, code, denied.message())))
}

pub(super) async fn status(req: HttpRequest, gw: web::Data<Gateway>) -> actix_web::Result<HttpResponse> {
    if let Some(refusal) = refusal(&req, &gw).await {
        return Ok(refusal);
    }
    let unavailable = |_| actix_web::error::ErrorServiceUnavailable("the actor system is stopping");
    let status = gw.status.send(StatusQuery).await.map_err(unavailable)?;
    let tickets = gw.queue.snapshot.send(QueueSnapshot).await.map_err(unavailable)?;
    // Every worker in one vocabulary, whatever the role; its session's labels are the
    // session's own.
    let workers: Vec<WorkerRow> = status
        .workers
        .into_iter()
        .map(|mut row| {
            if let Some(conn) = row.conn {
                match gw.registry.labels(conn) {
                    Some(labels) => {
                        row.session = Some(labels.session_id);
                        row.dialect = Some(labels.dialect);
                        row.transport = Some(labels.transport);
                    }
                    None => row.session = Some(format!("c{conn}")),
                }
                row.client_away_s = gw.registry.away_since(conn).map(|since| since.elapsed().as_secs_f64());
            }
            row
        })
        .collect();
    let tickets: Vec<_> = tickets
        .iter()
        .map(|t| {
            let mut row = json!({
                "ticket_id": format!("ticket_{}", t.ticket),
                "mode": t.mode.as_str(),
                "position": t.position,
                "waited_s": t.waited.as_secs_f64(),
                "estimated_wait_s": t.estimated_wait_s,
            });
            // In a cluster: whose client it is (this replica's, or another's).
            if let Some(replica) = &t.replica {
                row["replica"] = replica.clone().into();
            }
            row
        })
        .collect();
    let cluster = status.cluster.map(|c| {
        let mut cluster = json!({"replica": c.replica, "store": if c.store_up { "up" } else { "unreachable" }});
        if let Some(why) = c.store_error {
            cluster["store_error"] = why.into();
        }
        cluster
    });
    let active: serde_json::Map<String, serde_json::Value> =
        Mode::ALL.iter().map(|m| (m.as_str().to_string(), json!(gw.registry.active(*m)))).collect();
    Ok(private(HttpResponse::Ok().json(json!({
        "workers": workers,
        "queue": {"length": tickets.len(), "tickets": tickets},
        "sessions": {"open": gw.registry.len(), "active": active, "held": gw.registry.held()},
        "cluster": cluster,
        // The SIP edge (`[sip]`): whether it reads its port; null with SIP off.
        "sip": gw.sip.up().map(|up| json!({"up": up})),
    }))))
}

pub(super) async fn metrics(req: HttpRequest, gw: web::Data<Gateway>) -> HttpResponse {
    if let Some(refusal) = refusal(&req, &gw).await {
        return refusal;
    }
    private(HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(gateway_metrics().render()))
}

// An early-return HTTP answer; boxing it would only move the allocation.
#[allow(clippy::result_large_err)]
fn recording_root(gw: &Gateway) -> Result<std::path::PathBuf, HttpResponse> {
    match &gw.recorder {
        Some(r) => Ok(r.root().to_path_buf()),
        None => Err(private(http_error(
            StatusCode::NOT_FOUND,
            "not_found",
            "recording is disabled ([recording] enabled = false)",
        ))),
    }
}

#[derive(serde::Deserialize)]
pub(super) struct Page {
    page: Option<usize>,
    per_page: Option<usize>,
}

pub(super) async fn sessions(req: HttpRequest, gw: web::Data<Gateway>, page: web::Query<Page>) -> HttpResponse {
    if let Some(refusal) = refusal(&req, &gw).await {
        return refusal;
    }
    let root = match recording_root(&gw) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let (number, per_page) = (page.page.unwrap_or(1).max(1), page.per_page.unwrap_or(50).clamp(1, 1000));
    private(match web::block(move || recordings::list(&root, number, per_page)).await {
        Ok(Ok((total, items))) => {
            HttpResponse::Ok().json(json!({"page": number, "per_page": per_page, "total": total, "sessions": items}))
        }
        _ => http_error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "cannot list the recordings"),
    })
}

pub(super) async fn session_meta(req: HttpRequest, gw: web::Data<Gateway>, id: web::Path<String>) -> HttpResponse {
    serve_file(&req, &gw, &id, "meta.json").await
}

pub(super) async fn session_file(
    req: HttpRequest,
    gw: web::Data<Gateway>,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    let (id, file) = path.into_inner();
    serve_file(&req, &gw, &id, &file).await
}

async fn serve_file(req: &HttpRequest, gw: &Gateway, id: &str, file: &str) -> HttpResponse {
    if let Some(refusal) = refusal(req, gw).await {
        return refusal;
    }
    let root = match recording_root(gw) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if !recordings::valid_session_id(id) || !recordings::valid_file(file) {
        return private(http_error(
            StatusCode::BAD_REQUEST,
            "invalid_payload",
            "not a session id and file of a recording",
        ));
    }
    let (id, name) = (id.to_string(), file.to_string());
    let path = match web::block(move || recordings::find(&root, &id).map(|dir| dir.join(name))).await {
        Ok(Some(path)) if path.is_file() => path,
        _ => return private(http_error(StatusCode::NOT_FOUND, "not_found", "no such recorded session or file")),
    };
    private(match actix_files::NamedFile::open_async(&path).await {
        Ok(f) => f.into_response(req),
        Err(_) => http_error(StatusCode::NOT_FOUND, "not_found", "no such file"),
    })
}

pub(super) async fn cancel_ticket(req: HttpRequest, gw: web::Data<Gateway>, ticket: web::Path<String>) -> HttpResponse {
    if let Some(refusal) = refusal(&req, &gw).await {
        return refusal;
    }
    let Some(number) = ticket.strip_prefix("ticket_").and_then(|n| n.parse::<u64>().ok()) else {
        return private(http_error(StatusCode::BAD_REQUEST, "invalid_payload", "a ticket id looks like ticket_12"));
    };
    private(match gw.queue.cancel.send(Cancel { ticket: number }).await {
        Ok(true) => HttpResponse::Ok().json(json!({"cancelled": ticket.as_str()})),
        Ok(false) => http_error(StatusCode::NOT_FOUND, "not_found", "no such waiting ticket"),
        Err(_) => http_error(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "the server is stopping"),
    })
}
