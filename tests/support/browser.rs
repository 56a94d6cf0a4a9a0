//! A real headless Chromium (Debian's `chromium`), driven over the DevTools protocol through a
//! pipe (`--remote-debugging-pipe`: requests on fd 3, answers on fd 4, each message a JSON
//! object ended by a NUL byte), as Puppeteer's `pipe: true` does: no port, no extra library.
//!
//! [`Browser::launch`] starts it (None when Chromium is not installed); [`Browser::open`] opens a
//! page; [`Page::eval`] runs JavaScript in it (promises awaited) and returns the value;
//! [`Page::wait_for`] polls an expression until it is true; [`Page::screenshot`] saves a PNG.
//! Times measured in the page (`performance.now()`) are real: no virtual time.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Where Debian installs Chromium.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// How long one DevTools request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

type Waiters = Arc<Mutex<HashMap<u64, Sender<Value>>>>;

/// A headless Chromium of the test's own (its own profile dir), killed when dropped.
pub struct Browser {
    child: Child,
    to_browser: Mutex<std::fs::File>,
    waiters: Waiters,
    next_id: Mutex<u64>,
    _profile: tempfile::TempDir,
}

/// One page (tab) of a [`Browser`], reached through its flat session.
pub struct Page<'b> {
    browser: &'b Browser,
    session: String,
}

/// The Chromium binary, if installed.
pub fn chromium() -> Option<PathBuf> {
    let path = PathBuf::from(CHROMIUM);
    path.exists().then_some(path)
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes; each is owned once below.
    let rc = unsafe { nix::libc::pipe2(fds.as_mut_ptr(), nix::libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created by pipe2 and are owned by no one else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    /// Starts headless Chromium with the flags this machine needs (no sandbox as root, no
    /// background networking: the network is closed), at `width` x `height`. None when it is
    /// not installed.
    pub fn launch(width: u32, height: u32) -> Option<Browser> {
        Browser::launch_with(width, height, &[])
    }

    /// [`Browser::launch`] with `extra` flags (e.g. `--ignore-certificate-errors` for a server
    /// with a self-signed certificate, as the benchmark's).
    pub fn launch_with(width: u32, height: u32, extra: &[&str]) -> Option<Browser> {
        let program = chromium()?;
        let profile = tempfile::tempdir().unwrap();
        // Our end writes to the browser's fd 3 and reads from its fd 4.
        let (browser_reads, we_write) = pipe();
        let (we_read, browser_writes) = pipe();
        let (r, w) = (browser_reads.as_raw_fd(), browser_writes.as_raw_fd());
        let mut cmd = Command::new(program);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--hide-scrollbars",
            "--remote-debugging-pipe",
            &format!("--window-size={width},{height}"),
        ])
        .args(extra)
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (dup2) between fork and exec; the two
        // descriptors stay open in the parent until the child has started.
        unsafe {
            cmd.pre_exec(move || {
                // Out of the way first (either may be 3 or 4 already), then onto 3 and 4;
                // dup2's copies are not close-on-exec.
                let r2 = nix::libc::fcntl(r, nix::libc::F_DUPFD, 10);
                let w2 = nix::libc::fcntl(w, nix::libc::F_DUPFD, 10);
                if r2 < 0 || w2 < 0 || nix::libc::dup2(r2, 3) < 0 || nix::libc::dup2(w2, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("starting chromium");
        drop(browser_reads);
        drop(browser_writes);
        let waiters: Waiters = Arc::default();
        let from_browser = std::fs::File::from(we_read);
        let w2 = waiters.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(from_browser);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                let Ok(msg) = serde_json::from_slice::<Value>(&buf) else {
                    continue;
                };
                if let Some(id) = msg.get("id").and_then(Value::as_u64)
                    && let Some(tx) = w2.lock().unwrap().remove(&id)
                {
                    let _ = tx.send(msg);
                }
            }
        });
        Some(Browser {
            child,
            to_browser: Mutex::new(std::fs::File::from(we_write)),
            waiters,
            next_id: Mutex::new(0),
            _profile: profile,
        })
    }

    /// Sends `method` with `params` (to `session`, or the browser) and waits for its answer's
    /// `result`. Panics on a protocol error or no answer within [`REQUEST_TIMEOUT`].
    fn call(&self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = {
            let mut n = self.next_id.lock().unwrap();
            *n += 1;
            *n
        };
        let (tx, rx): (Sender<Value>, Receiver<Value>) = channel();
        self.waiters.lock().unwrap().insert(id, tx);
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        {
            let mut out = self.to_browser.lock().unwrap();
            let mut bytes = serde_json::to_vec(&msg).unwrap();
            bytes.push(0);
            out.write_all(&bytes).expect("writing to chromium");
        }
        let answer = match rx.recv_timeout(REQUEST_TIMEOUT) {
            Ok(a) => a,
            Err(RecvTimeoutError::Timeout) => panic!("chromium did not answer {method} in time"),
            Err(RecvTimeoutError::Disconnected) => panic!("chromium exited during {method}"),
        };
        if let Some(e) = answer.get("error") {
            panic!("chromium refused {method}: {e}");
        }
        answer["result"].clone()
    }

    /// Trusts any server certificate from now on (`Security.setIgnoreCertificateErrors`): for a
    /// server whose CA is a test's own.
    pub fn ignore_certificate_errors(&self) {
        self.call(
            None,
            "Security.setIgnoreCertificateErrors",
            json!({"ignore": true}),
        );
    }

    /// Opens a new page at `url` and waits for its load event (its own requests may go on).
    pub fn open(&self, url: &str) -> Page<'_> {
        let target = self.call(None, "Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().expect("targetId").to_string();
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        );
        let session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_string();
        let page = Page {
            browser: self,
            session,
        };
        page.navigate(url);
        page
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Page<'_> {
    fn call(&self, method: &str, params: Value) -> Value {
        self.browser.call(Some(&self.session), method, params)
    }

    /// Loads `url` in this page and waits until its document is complete.
    pub fn navigate(&self, url: &str) {
        let answer = self.call("Page.navigate", json!({"url": url}));
        if let Some(e) = answer.get("errorText").and_then(Value::as_str) {
            panic!("chromium could not load {url}: {e}");
        }
        self.wait_for(
            "document.readyState === 'complete'",
            Duration::from_secs(30),
        );
    }

    /// The value of the JavaScript `expression` in the page (a promise is awaited). Panics on an
    /// exception, with its text.
    pub fn eval(&self, expression: &str) -> Value {
        let answer = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
        );
        if let Some(e) = answer.get("exceptionDetails") {
            panic!("the page threw on {expression}: {e}");
        }
        answer["result"]["value"].clone()
    }

    /// Polls `expression` every 100 ms until it is `true`; panics after `timeout` with what
    /// the page shows then.
    pub fn wait_for(&self, expression: &str, timeout: Duration) {
        let start = Instant::now();
        loop {
            if self.eval(expression) == Value::Bool(true) {
                return;
            }
            if start.elapsed() > timeout {
                let text = self.eval("document.body ? document.body.innerText.slice(0, 2000) : ''");
                panic!(
                    "the page never made `{expression}` true within {timeout:?}; it shows:\n{text}"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sets the page's viewport to `width` x `height` CSS pixels at scale 1 (the window's size
    /// less its frame otherwise): what a screenshot then shows.
    pub fn set_viewport(&self, width: u32, height: u32) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        );
    }

    /// Saves a PNG of the page's viewport at `path` and returns its size in bytes.
    pub fn screenshot(&self, path: &Path) -> usize {
        use base64::Engine as _;
        let answer = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = base64::engine::general_purpose::STANDARD
            .decode(answer["data"].as_str().expect("screenshot data"))
            .expect("base64 screenshot");
        std::fs::write(path, &png).expect("writing the screenshot");
        png.len()
    }
}
