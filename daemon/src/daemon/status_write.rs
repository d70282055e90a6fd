//! The status file `hostmesh status` reads, written from what each owner
//! reports, and handed on to the metrics endpoint.
//!
//! The sync loop builds the status from its owners (cheap: counts, files,
//! the shared objects, meshes and peers) and hands it to the metrics
//! endpoint; the services' rows (one per service) are rendered and the
//! file written by the status writer, a thread of its own. A status newer than one still waiting replaces it: the file
//! always ends up with the latest, and an edit never waits behind the
//! status of the last one.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use slog::{warn, Logger};

use super::{report, service_rows, Daemon};
use crate::state::{Status, STATUS_VERSION};

/// One status to write: all but the services' rows, which go at `at`.
struct Job {
    status: Status,
    services: Option<(service_rows::ServiceRows, usize)>,
    /// When the sync loop asked for it.
    asked: Instant,
}

#[derive(Default)]
struct Queue {
    next: Option<Job>,
    /// Write the last status again, marked stopped (the daemon exits).
    stopping: bool,
    writing: bool,
    quit: bool,
}

/// The status writer's thread and its queue of (at most) one status.
pub(super) struct StatusWriter {
    shared: Arc<(Mutex<Queue>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl StatusWriter {
    pub(super) fn start(state_dir: PathBuf, log: Logger) -> Self {
        let shared: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("hm-status".into())
            .spawn(move || write_loop(&theirs, &state_dir, &log))
            .expect("spawn the status writer thread");
        StatusWriter { shared, thread: Some(thread) }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.shared.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job`, replacing one not begun yet.
    fn submit(&self, job: Job) {
        self.queue().next = Some(job);
        self.shared.1.notify_all();
    }

    /// Returns once every status queued so far is written.
    pub(super) fn flush(&self) {
        let mut q = self.queue();
        while q.next.is_some() || q.writing || q.stopping {
            q = self.shared.1.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Writes the last status again, marked stopped, once what is queued
    /// is written; returns when it is. Nothing if none was written.
    pub(super) fn mark_stopped(&self) {
        self.queue().stopping = true;
        self.shared.1.notify_all();
        self.flush();
    }
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        self.flush();
        self.queue().quit = true;
        self.shared.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn write_loop(shared: &(Mutex<Queue>, Condvar), state_dir: &std::path::Path, log: &Logger) {
    let (lock, ready) = shared;
    let mut rows = service_rows::RowCache::default();
    // The last status written: the one a stop marks stopped.
    let mut last: Option<Job> = None;
    loop {
        let job = {
            let mut q = lock.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(job) = q.next.take() {
                    q.writing = true;
                    break Some(job);
                }
                if q.stopping {
                    q.stopping = false;
                    q.writing = true;
                    break None;
                }
                if q.quit {
                    return;
                }
                q = ready.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        match job {
            Some(job) => {
                write(&job, state_dir, log, &mut rows);
                last = Some(job);
            }
            None => {
                if let Some(job) = last.as_mut() {
                    job.status.stopped = true;
                    job.status.updated_at = crate::clock::now_unix();
                    job.asked = Instant::now();
                    write(job, state_dir, log, &mut rows);
                }
            }
        }
        lock.lock().unwrap_or_else(PoisonError::into_inner).writing = false;
        ready.notify_all();
    }
}

fn write(job: &Job, state_dir: &std::path::Path, log: &Logger, cache: &mut service_rows::RowCache) {
    let Job { status, services, asked } = job;
    let written = match services {
        Some((rows, at)) => status.write_with_rows(state_dir, *at, &rows.render(cache)),
        None => status.write(state_dir),
    };
    if let Err(e) = written {
        warn!(log, "cannot write the status file"; "path" => Status::path(state_dir).display().to_string(), "error" => e.to_string());
    }
    // bench/scale reads this (HOSTMESH_DEBUG=1): from the sync loop's
    // asking to the file written.
    slog::debug!(log, "status written"; "duration_ms" => asked.elapsed().as_millis() as u64);
}

impl Daemon {
    /// Builds the status from the last sync and the owners' reports and
    /// queues it for the status writer; returns the one-line STATUS=.
    pub(super) fn write_status(&mut self) -> String {
        let asked = Instant::now();
        let (status, services) = self.status();
        let line = report::status_line(&status);
        let config = Arc::clone(self.config.config());
        let r = &self.runner.reconciler;
        self.metrics.publish(&config, &status, r.entry_counts(), r.map_sizes());
        self.status_writer.submit(Job { status, services, asked });
        line
    }

    fn status(&self) -> (Status, Option<(service_rows::ServiceRows, usize)>) {
        let loaded = &self.config.loaded;
        let outcome = self.runner.last_outcome.as_ref();
        // The desired state of that sync (the reconciler keeps it).
        let desired = outcome.and(self.runner.reconciler.desired());
        let peers = self.peers.probe();
        let backends = crate::health::report(&loaded.config, self.backend_health.applied());
        let mut counts = report::counts(loaded, desired, peers, &self.sweeper.last);
        counts.backends_down = backends.iter().filter(|b| b.state == crate::state::BackendState::Down).count();
        let objects = outcome.zip(desired).map(|(o, d)| {
            let (objects, at) = report::objects(loaded, o, d, self.sidecars.report(), peers);
            (objects, (service_rows::ServiceRows::of(loaded, o, d), at))
        });
        let (objects, services) = objects.map_or((Vec::new(), None), |(objects, rows)| (objects, Some(rows)));
        let status = Status {
            version: STATUS_VERSION,
            pid: std::process::id(),
            started_at: self.started_at,
            updated_at: crate::clock::now_unix(),
            config_dir: self.paths.config.admin().to_path_buf(),
            config_dirs: self.paths.config.in_order().map(|(_, d)| d.to_path_buf()).collect(),
            bpffs: self.paths.bpffs.clone(),
            generation: self.runner.generation,
            resync_interval_ms: self.resync_interval().as_millis() as u64,
            ready: self.runner.ready,
            stopped: false,
            last_sync: self.runner.last_summary.clone(),
            counts,
            files: report::files(loaded),
            skipped: loaded
                .skipped
                .iter()
                .map(|s| crate::state::SkippedEntry { path: s.path.clone(), reason: s.reason.clone() })
                .collect(),
            masked: loaded
                .masked
                .iter()
                .map(|m| crate::state::MaskedEntry { path: m.path.clone(), by: m.by.clone(), by_null: m.by_null })
                .collect(),
            objects,
            warnings: desired
                .map(|d| d.warnings.clone())
                .unwrap_or_default()
                .into_iter()
                .chain(self.runner.reconciler.backend_warnings())
                .chain(self.metrics.listening.error.clone())
                .chain(self.service_health.listening.error.clone())
                .collect(),
            kernel: Some(report::kernel(&self.features, loaded.config.daemon.tc_attach)),
            backends,
        };
        (status, services)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Counts, ObjectKind, ObjectState, ObjectStatus, SyncSummary};

    fn status(generation: u64, objects: &[&str]) -> Status {
        Status {
            version: STATUS_VERSION,
            pid: 1,
            started_at: 0,
            updated_at: 0,
            config_dir: "/etc/hostmesh".into(),
            config_dirs: vec!["/etc/hostmesh".into()],
            bpffs: "/sys/fs/bpf/hostmesh".into(),
            generation,
            resync_interval_ms: 30_000,
            ready: true,
            stopped: false,
            last_sync: SyncSummary::default(),
            counts: Counts::default(),
            files: vec![],
            skipped: vec![],
            masked: vec![],
            objects: objects
                .iter()
                .map(|name| ObjectStatus {
                    kind: ObjectKind::Mesh,
                    name: name.to_string(),
                    origin: None,
                    state: ObjectState::Applied,
                    detail: String::new(),
                    errors: vec![],
                    since: None,
                    in_use: None,
                })
                .collect(),
            warnings: vec![],
            kernel: None,
            backends: vec![],
        }
    }

    fn writer() -> (StatusWriter, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        (StatusWriter::start(dir.path().to_path_buf(), Logger::root(slog::Discard, slog::o!())), dir)
    }

    #[test]
    fn the_file_ends_with_the_last_status_asked_for_and_flush_waits_for_it() {
        let (w, dir) = writer();
        for generation in 1..=200 {
            w.submit(Job { status: status(generation, &[]), services: None, asked: Instant::now() });
        }
        w.flush();
        assert_eq!(Status::read(dir.path()).unwrap().generation, 200);
        {
            let q = w.queue();
            assert!(q.next.is_none() && !q.writing, "flush returned with a status still to write");
        }
        // Dropping the writer writes what is queued first.
        w.submit(Job { status: status(201, &[]), services: None, asked: Instant::now() });
        drop(w);
        assert_eq!(Status::read(dir.path()).unwrap().generation, 201);
    }

    #[test]
    fn a_stop_writes_the_last_status_again_marked_stopped_with_its_rows() {
        let (w, dir) = writer();
        // Nothing written yet: nothing to mark, and no wait.
        w.mark_stopped();
        assert!(Status::read(dir.path()).is_err());
        let config = crate::config::from_text("[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\n");
        let rows = service_rows::ServiceRows::new(Arc::new(config), false, crate::config::CtlbMode::Tcp, &[]);
        w.submit(Job { status: status(4, &["before"]), services: Some((rows, 1)), asked: Instant::now() });
        w.mark_stopped();
        let written = Status::read(dir.path()).unwrap();
        assert!(written.stopped);
        assert_eq!(written.generation, 4);
        let names: Vec<&str> = written.objects.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["before", "web"]);
    }

    #[test]
    fn a_service_s_row_is_rendered_again_only_when_it_changed() {
        let config = Arc::new(crate::config::from_text(
            "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = [\"192.168.1.1:80\"]\n\
             [[service]]\nname = \"api\"\nvip = \"10.96.0.20\"\nport = 443\n",
        ));
        let mut cache = service_rows::RowCache::default();
        let at = |rows: Vec<&str>| -> Vec<(usize, String)> {
            rows.iter().map(|r| (r.as_ptr() as usize, r.to_string())).collect()
        };
        let rows = |errors: &[crate::reconcile::StepError], config: &Arc<crate::config::Config>| {
            service_rows::ServiceRows::new(Arc::clone(config), false, crate::config::CtlbMode::Tcp, errors)
        };
        let first = at(rows(&[], &config).render(&mut cache));
        assert!(first[0].1.contains("10.96.0.10:80/tcp -> 192.168.1.1:80 (connect-time)"), "{}", first[0].1);
        assert_eq!(at(rows(&[], &config).render(&mut cache)), first, "nothing changed: the same rows, not rendered");
        // An error charged to api: its row alone is rendered again.
        let error = crate::reconcile::StepError {
            step: "update HM_SERVICES entry".into(),
            owners: ["service/api"].into(),
            error: "E2BIG".into(),
        };
        let third = at(rows(&[error], &config).render(&mut cache));
        assert_eq!(third[0], first[0]);
        assert!(third[1].0 != first[1].0 && third[1].1.contains("E2BIG"), "{}", third[1].1);
        // api gone: its row goes. Then another path: the row changes.
        let fewer =
            Arc::new(crate::config::Config { services: vec![Arc::clone(&config.services[0])], ..(*config).clone() });
        let fourth = at(rows(&[], &fewer).render(&mut cache));
        assert_eq!((fourth.len(), cache.len()), (1, 1));
        assert_eq!(fourth[0], first[0]);
        let all = service_rows::ServiceRows::new(Arc::clone(&fewer), true, crate::config::CtlbMode::Off, &[]);
        let fifth = at(all.render(&mut cache));
        // (Rendered anew, into text that may lie where the old text was.)
        assert!(fifth[0].1.contains("(bpfnat veth)"), "{}", fifth[0].1);
    }

    #[test]
    fn the_services_rows_are_rendered_on_the_writers_thread_at_their_place() {
        let config = crate::config::from_text(
            "[[service]]\nname = \"web\"\nvip = \"10.96.0.10\"\nport = 80\nbackends = [\"192.168.1.1:80\"]\n\
             [[service]]\nname = \"api\"\nvip = \"10.96.0.20\"\nport = 443\n",
        );
        let error = crate::reconcile::StepError {
            step: "update HM_SERVICES entry".into(),
            owners: ["service/api"].into(),
            error: "bpf: update HM_SERVICES: Argument list too long".into(),
        };
        let rows = service_rows::ServiceRows::new(Arc::new(config), false, crate::config::CtlbMode::Tcp, &[error]);
        let (w, dir) = writer();
        w.submit(Job { status: status(3, &["before", "after"]), services: Some((rows, 1)), asked: Instant::now() });
        w.flush();
        let written = Status::read(dir.path()).unwrap();
        let names: Vec<&str> = written.objects.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["before", "web", "api", "after"]);
        assert_eq!(written.objects[1].detail, "10.96.0.10:80/tcp -> 192.168.1.1:80 (connect-time)");
        assert_eq!(written.objects[1].state, ObjectState::Applied);
        assert_eq!(written.objects[2].state, ObjectState::Error);
        assert!(written.objects[2].errors[0].contains("Argument list too long"), "{:?}", written.objects[2].errors);
    }
}
