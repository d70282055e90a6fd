use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// An sd_notify socket: records every datagram a daemon sends, in order.
pub struct NotifyListener {
    path: PathBuf,
    messages: Arc<(Mutex<Vec<String>>, Condvar)>,
    stop: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl NotifyListener {
    pub fn bind(path: &Path) -> NotifyListener {
        let socket = UnixDatagram::bind(path).expect("bind notify socket");
        socket.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
        let messages: Arc<(Mutex<Vec<String>>, Condvar)> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, stopped) = (Arc::clone(&messages), Arc::clone(&stop));
        // The reader ends when told to (it owns the socket); a zero-length
        // datagram is not a message.
        let reader = std::thread::spawn(move || {
            let mut buf = vec![0u8; 8192];
            while !stopped.load(Ordering::Relaxed) {
                match socket.recv(&mut buf) {
                    Ok(n) if n > 0 => {
                        let (lock, cv) = &*sink;
                        lock.lock().unwrap().push(String::from_utf8_lossy(&buf[..n]).into_owned());
                        cv.notify_all();
                    }
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(_) => return,
                }
            }
        });
        NotifyListener { path: path.to_path_buf(), messages, stop, reader: Some(reader) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every message so far.
    pub fn messages(&self) -> Vec<String> {
        self.messages.0.lock().unwrap().clone()
    }

    /// Waits for a message (at index >= `from`) containing the line `line`
    /// (`READY=1`) for at most `timeout` (scaled); returns its index.
    pub fn wait_for(&self, line: &str, from: usize, timeout: Duration) -> Result<usize, String> {
        let timeout = crate::scaled(timeout);
        let deadline = Instant::now() + timeout;
        let (lock, cv) = &*self.messages;
        let mut msgs = lock.lock().unwrap();
        loop {
            if let Some(i) =
                msgs.iter().enumerate().skip(from).find(|(_, m)| m.lines().any(|l| l == line)).map(|(i, _)| i)
            {
                return Ok(i);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("no {line} within {timeout:?}; got {:?}", &msgs[from.min(msgs.len())..]));
            }
            msgs = cv.wait_timeout(msgs, deadline - now).unwrap().0;
        }
    }
}

impl Drop for NotifyListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
