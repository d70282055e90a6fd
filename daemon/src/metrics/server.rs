//! The HTTP side of the endpoint: GET /metrics on `[daemon]
//! metrics_listen`, on one thread with a current-thread runtime (hyper).
//! Bounded: at most MAX_SCRAPES connections are served at once (the rest
//! wait in the listen backlog), a client has HEADER_TIMEOUT to send its
//! request and CONNECTION_TIMEOUT in all, so a slow or stuck scraper
//! costs one slot for a few seconds and never the daemon.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::{oneshot, Semaphore};

use super::Metrics;

const MAX_SCRAPES: usize = 4;
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error("cannot listen for metrics on {addr} ([daemon] metrics_listen): {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
}

/// A running endpoint; dropping it stops the thread and closes the port.
pub(crate) struct MetricsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds at once (so a taken port is an error here, not later) and
    /// serves on a thread of its own.
    pub(crate) fn start(addr: SocketAddr, metrics: Metrics) -> Result<Self, ServeError> {
        let listener = std::net::TcpListener::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
        listener.set_nonblocking(true).map_err(|source| ServeError::Bind { addr, source })?;
        // The port bound (the one asked for, unless that was 0).
        let addr = listener.local_addr().map_err(|source| ServeError::Bind { addr, source })?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("hm-metrics".into())
            .spawn(move || serve(listener, metrics, stopped))
            .map_err(ServeError::Thread)?;
        Ok(MetricsServer { addr, stop: Some(stop), thread: Some(thread) })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: std::net::TcpListener, metrics: Metrics, mut stopped: oneshot::Receiver<()>) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build() else { return };
    rt.block_on(async move {
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
        let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
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
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| answer(req, metrics.clone()));
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

async fn answer(req: Request<Incoming>, metrics: Metrics) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r
    };
    Ok(match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut r = reply(StatusCode::OK, metrics.render());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(prometheus_client::encoding::prometheus_text::CONTENT_TYPE),
            );
            r
        }
        (_, "/metrics") => reply(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n".into()),
        _ => reply(StatusCode::NOT_FOUND, "hostmesh serves /metrics only\n".into()),
    })
}
