//! The checker: one thread with a current-thread async runtime runs a task
//! per checked backend (no thread per backend), at most MAX_CONCURRENT
//! checks at once. A new target is checked at once, later checks are
//! jittered within ±10% of the interval so checks of many backends spread
//! out. Results go into the shared table; a change of health is queued and
//! wakes the sync loop through the callback.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Semaphore};

use super::tracker::Tracker;
use super::{BackendHealth, BackendKey, Health, Target, Transition};
use crate::clock::now_unix;
use crate::config::InitialState;

/// Checks in flight at once, whatever the number of backends.
const MAX_CONCURRENT: usize = 256;

#[derive(Default)]
struct Shared {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    states: BTreeMap<BackendKey, (Tracker, BackendHealth)>,
    transitions: Vec<Transition>,
}

pub(crate) struct HealthMonitor {
    shared: Arc<Shared>,
    targets: Option<mpsc::UnboundedSender<Vec<Target>>>,
    thread: Option<JoinHandle<()>>,
    /// The targets last handed over.
    current: Vec<Target>,
}

impl HealthMonitor {
    /// Starts the checker with the states of an earlier run (`restored`),
    /// which targets keep until their checks say otherwise. `wake` is
    /// called after each change of health; it returns false once nobody
    /// listens.
    pub(crate) fn start(
        restored: BTreeMap<BackendKey, BackendHealth>,
        wake: impl Fn() -> bool + Send + Sync + 'static,
    ) -> std::io::Result<HealthMonitor> {
        let shared = Arc::new(Shared::default());
        {
            let mut t = shared.table.lock().unwrap();
            t.states = restored.into_iter().map(|(k, h)| (k, (Tracker::new(h.health), h))).collect();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("health-checks".into())
            .spawn(move || runtime.block_on(run(rx, thread_shared, Arc::new(wake))))?;
        Ok(HealthMonitor { shared, targets: Some(tx), thread: Some(thread), current: Vec::new() })
    }

    /// Checks exactly these targets from now on. A backend that is no
    /// longer a target forgets its state (added again, it starts over);
    /// one whose check changed keeps its health.
    pub(crate) fn set_targets(&mut self, targets: Vec<Target>) {
        if targets == self.current {
            return;
        }
        {
            let mut t = self.shared.table.lock().unwrap();
            let wanted: HashMap<&BackendKey, &Target> = targets.iter().map(|t| (&t.key, t)).collect();
            t.states.retain(|k, _| wanted.contains_key(k));
            let now = now_unix();
            for target in &targets {
                t.states.entry(target.key.clone()).or_insert_with(|| {
                    let health = match target.check.initial {
                        InitialState::Unknown => Health::Unknown,
                        InitialState::Up => Health::Up,
                    };
                    (Tracker::new(health), BackendHealth::new(health, now))
                });
            }
        }
        if let Some(tx) = &self.targets {
            let _ = tx.send(targets.clone());
        }
        self.current = targets;
    }

    /// Every target's health now.
    pub(crate) fn states(&self) -> BTreeMap<BackendKey, BackendHealth> {
        let t = self.shared.table.lock().unwrap();
        t.states.iter().map(|(k, (_, h))| (k.clone(), h.clone())).collect()
    }

    /// The changes of health since the last call, oldest first.
    pub(crate) fn take_transitions(&self) -> Vec<Transition> {
        std::mem::take(&mut self.shared.table.lock().unwrap().transitions)
    }
}

impl Drop for HealthMonitor {
    fn drop(&mut self) {
        // Closing the channel ends the runtime's loop, which drops every
        // check (an exec check's process is killed).
        self.targets = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn run(
    mut rx: mpsc::UnboundedReceiver<Vec<Target>>,
    shared: Arc<Shared>,
    wake: Arc<dyn Fn() -> bool + Send + Sync>,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONCURRENT));
    let mut tasks: HashMap<BackendKey, (Target, tokio::task::JoinHandle<()>)> = HashMap::new();
    while let Some(targets) = rx.recv().await {
        let wanted: HashMap<BackendKey, Target> = targets.into_iter().map(|t| (t.key.clone(), t)).collect();
        tasks.retain(|k, (t, task)| {
            let keep = wanted.get(k) == Some(t);
            if !keep {
                task.abort();
            }
            keep
        });
        for (key, target) in wanted {
            if tasks.contains_key(&key) {
                continue;
            }
            let task = tokio::spawn(watch(target.clone(), shared.clone(), permits.clone(), wake.clone()));
            tasks.insert(key, (target, task));
        }
    }
    for (_, (_, task)) in tasks {
        task.abort();
    }
}

/// Checks one backend for as long as it is a target.
async fn watch(
    target: Target,
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    wake: Arc<dyn Fn() -> bool + Send + Sync>,
) {
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::time::sleep_until(next).await;
        next = tokio::time::Instant::now() + jittered(target.check.interval);
        let result = {
            let Ok(_permit) = permits.acquire().await else { return };
            super::checks::check(&target.key.service, target.key.backend, &target.check).await
        };
        if record(&shared, &target, result) && !wake() {
            return;
        }
    }
}

/// Records a result; true when the backend's health changed.
fn record(shared: &Shared, target: &Target, result: Result<(), String>) -> bool {
    let mut t = shared.table.lock().unwrap();
    let now = now_unix();
    let Some((tracker, health)) = t.states.get_mut(&target.key) else { return false };
    let from = tracker.health;
    let changed = tracker.record(result.is_ok(), target.check.rise, target.check.fall);
    health.last_check = Some(now);
    health.last_passed = Some(result.is_ok());
    if let Err(why) = &result {
        health.reason = Some(why.clone());
    }
    let Some(to) = changed else { return false };
    health.health = to;
    health.since = now;
    let reason = match &result {
        Ok(()) => format!("{} passed", target.check.kind.name()),
        Err(why) => why.clone(),
    };
    t.transitions.push(Transition { key: target.key.clone(), from, to, reason });
    true
}

/// `interval` ± 10%, at random.
fn jittered(interval: Duration) -> Duration {
    let r = std::hash::RandomState::new().hash_one(Instant::now()) % 2001;
    interval.mul_f64(0.9 + r as f64 / 10_000.0)
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::config::{CheckKind, HealthCheck};

    #[test]
    fn a_new_target_is_checked_at_once_and_its_changes_wake_the_caller() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let key = BackendKey { service: "web".into(), backend: listener.local_addr().unwrap() };
        let check = HealthCheck {
            kind: CheckKind::Tcp,
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(50),
            rise: 2,
            fall: 2,
            port: None,
            source: None,
            initial: InitialState::Unknown,
        };
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        let mut m = HealthMonitor::start(BTreeMap::new(), move || {
            w.fetch_add(1, Ordering::Relaxed);
            true
        })
        .unwrap();
        m.set_targets(vec![Target { key: key.clone(), check }]);
        assert_eq!(m.states()[&key].health, Health::Unknown, "before the first result");
        let waited = wait(|| m.states()[&key].health == Health::Up);
        assert!(waited < Duration::from_secs(1), "the first check is at once: {waited:?}");
        drop(listener);
        wait(|| m.states()[&key].health == Health::Down);
        let t = m.take_transitions();
        let seen: Vec<(Health, Health)> = t.iter().map(|t| (t.from, t.to)).collect();
        assert_eq!(seen, [(Health::Unknown, Health::Up), (Health::Up, Health::Down)]);
        assert_eq!(t[1].reason, "connect: connection refused");
        assert_eq!(woken.load(Ordering::Relaxed), 2);
        m.set_targets(Vec::new());
        assert!(m.states().is_empty(), "a backend no longer checked is forgotten");
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        for _ in 0..1000 {
            let d = jittered(Duration::from_millis(1000));
            assert!((900..=1100).contains(&d.as_millis()), "{d:?}");
        }
    }

    fn wait(cond: impl Fn() -> bool) -> Duration {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < Duration::from_secs(5), "timed out");
            std::thread::sleep(Duration::from_millis(10));
        }
        start.elapsed()
    }
}
