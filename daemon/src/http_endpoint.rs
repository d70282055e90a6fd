//! The daemon's HTTP endpoints (`[daemon] metrics_listen`: GET /metrics;
//! `[daemon] service_health_listen`: GET /services/NAME), each on one
//! thread of its own with a current-thread runtime (hyper), answering GETs
//! from a handler that reads what the daemon published last. Bounded: at
//! most MAX_CLIENTS connections are served at once (the rest wait in the
//! listen backlog), a client has HEADER_TIMEOUT to send its request and
//! CONNECTION_TIMEOUT in all, so a slow or stuck client costs one slot for
//! a few seconds and never the daemon.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{oneshot, Semaphore};

const MAX_CLIENTS: usize = 4;
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error("cannot listen for {what} on {addr} ([daemon] {key}): {source}")]
    Bind { what: &'static str, key: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error("cannot start the {what} thread: {source}")]
    Thread { what: &'static str, source: std::io::Error },
}

/// What an endpoint answers a GET of a path with.
pub(crate) struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub(crate) fn text(status: StatusCode, body: String) -> Reply {
        Reply { status, content_type: "text/plain; charset=utf-8", body }
    }
}

/// Answers GET PATH; called on the endpoint's thread.
pub(crate) type Handler = Arc<dyn Fn(&str) -> Reply + Send + Sync>;

/// One endpoint: what it serves and the `[daemon]` key it listens at.
#[derive(Clone, Copy)]
pub(crate) struct Kind {
    /// "metrics", "service health".
    pub what: &'static str,
    pub key: &'static str,
    /// The thread's name.
    pub thread: &'static str,
}

/// A running endpoint; dropping it stops the thread and closes the port.
pub(crate) struct Endpoint {
    addr: SocketAddr,
    thread_name: &'static str,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    /// Binds at once (so a taken port is an error here, not later) and
    /// serves on a thread of its own.
    pub(crate) fn start(kind: Kind, addr: SocketAddr, handler: Handler) -> Result<Self, ServeError> {
        let bind_err = |source| ServeError::Bind { what: kind.what, key: kind.key, addr, source };
        let listener = std::net::TcpListener::bind(addr).map_err(bind_err)?;
        listener.set_nonblocking(true).map_err(bind_err)?;
        // The port bound (the one asked for, unless that was 0).
        let addr = listener.local_addr().map_err(bind_err)?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(kind.thread.into())
            .spawn(move || serve(listener, handler, stopped))
            .map_err(|source| ServeError::Thread { what: kind.what, source })?;
        Ok(Endpoint { addr, thread_name: kind.thread, stop: Some(stop), thread: Some(thread) })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn thread_name(&self) -> &'static str {
        self.thread_name
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: std::net::TcpListener, handler: Handler, mut stopped: oneshot::Receiver<()>) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build() else { return };
    rt.block_on(async move {
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
        let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
        loop {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => p,
                _ = &mut stopped => return,
            };
            let Ok(permit) = permit else { return };
            let stream = tokio::select! {
                a = listener.accept() => match a {
                    Ok((s, _)) => s,
                    // EMFILE and the like: back off rather than spin.
                    Err(_) => { tokio::time::sleep(Duration::from_millis(100)).await; continue }
                },
                _ = &mut stopped => return,
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(req, handler.clone()));
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
                drop(permit);
            });
        }
    });
}

async fn answer(req: Request<Incoming>, handler: Handler) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = if req.method() == Method::GET {
        handler(req.uri().path())
    } else {
        Reply::text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n".into())
    };
    let mut r = Response::new(Full::new(Bytes::from(reply.body)));
    *r.status_mut() = reply.status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(reply.content_type));
    Ok(r)
}

/// An endpoint following its `[daemon]` key: (re)started when the address
/// changes, stopped by "off"; a port that is taken is logged once and
/// kept as the status's warning until the address changes.
#[derive(Default)]
pub(crate) struct Listening {
    server: Option<Endpoint>,
    /// The address last tried (`Some(None)`: "off").
    tried: Option<Option<SocketAddr>>,
    /// Why the endpoint is not serving, for the status.
    pub error: Option<String>,
}

impl Listening {
    pub(crate) fn follow(
        &mut self,
        want: Option<SocketAddr>,
        log: &slog::Logger,
        start: impl FnOnce(SocketAddr) -> Result<Endpoint, ServeError>,
    ) {
        if self.tried == Some(want) {
            return;
        }
        self.tried = Some(want);
        // The old one closes its port before a new one binds.
        self.server = None;
        self.error = None;
        let Some(addr) = want else { return };
        match start(addr) {
            Ok(s) => {
                slog::info!(log, "serving HTTP"; "listen" => s.addr().to_string(), "thread" => s.thread_name());
                self.server = Some(s);
            }
            Err(e) => {
                slog::warn!(log, "an endpoint is not served; the dataplane is unaffected"; "error" => e.to_string());
                self.error = Some(e.to_string());
            }
        }
    }

    pub(crate) fn serving(&self) -> bool {
        self.server.is_some()
    }
}
