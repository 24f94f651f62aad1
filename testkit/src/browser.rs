//! Debian's headless Chromium driven over the DevTools protocol (a small client over one
//! websocket): open a page, evaluate JavaScript in it, take a screenshot.
//!
//! Rules:
//! 1. [`Browser::launch`] finds `chromium` (or `$VERIFLOW_CHROMIUM`) and returns why not as
//!    an `Err` the test prints as its skip reason; anything failing after the launch is a
//!    test failure (a panic with what the browser said).
//! 2. The browser runs headless, without a sandbox (tests run as root in CI), on a profile in
//!    its own temporary directory, and is killed and reaped when dropped.
//! 3. One session at a time (flattened `Target.attachToTarget`): every command waits for its
//!    own answer, and the events in between are dropped.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// A headless Chromium and its DevTools connection.
pub struct Browser {
    child: Child,
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    session: Option<String>,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.ws.close(None);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Chromium binary: `$VERIFLOW_CHROMIUM`, else `chromium` or `chromium-browser` on the
/// PATH.
pub fn chromium_binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("VERIFLOW_CHROMIUM") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser"] {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err("no chromium on the PATH (run .ci/install-browser, or set VERIFLOW_CHROMIUM)".into())
}

impl Browser {
    /// Starts a headless browser with a `width`×`height` window (rule 1: `Err` is a reason to
    /// skip).
    pub fn launch(width: u32, height: u32) -> Result<Browser, String> {
        let bin = chromium_binary()?;
        let profile = tempfile::tempdir().map_err(|e| format!("a profile directory: {e}"))?;
        let mut child = Command::new(&bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
                &format!("--window-size={width},{height}"),
                &format!("--user-data-dir={}", profile.path().display()),
                "about:blank",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{} does not start: {e}", bin.display()))?;
        // Its stderr names the DevTools websocket; the rest of it is drained in a thread.
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut said = Vec::new();
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(url) = line.trim().strip_prefix("DevTools listening on ") {
                        let _ = tx.send(Ok(url.to_string()));
                        sent = true;
                    } else {
                        said.push(line);
                    }
                }
            }
            if !sent {
                let _ = tx.send(Err(said.join("\n")));
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(url)) => url,
            Ok(Err(said)) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} exited at start: {said}", bin.display()));
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} named no DevTools socket in 60 s",
                    bin.display()
                ));
            }
        };
        let (ws, _) = tungstenite::connect(url.as_str())
            .map_err(|e| format!("the DevTools socket {url}: {e}"))?;
        Ok(Browser {
            child,
            ws,
            next_id: 1,
            session: None,
            _profile: profile,
        })
    }

    /// Sends one command (to the page's session once one is open) and returns its result
    /// (rule 3); an error answer panics with it.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        self.ws
            .send(Message::text(msg.to_string()))
            .unwrap_or_else(|e| panic!("DevTools {method}: {e}"));
        loop {
            let m = self
                .ws
                .read()
                .unwrap_or_else(|e| panic!("DevTools {method}: {e}"));
            let Message::Text(text) = m else { continue };
            let v: Value = serde_json::from_str(text.as_str()).expect("DevTools speaks JSON");
            if v["id"].as_u64() == Some(id) {
                if !v["error"].is_null() {
                    panic!("DevTools {method} failed: {}", v["error"]);
                }
                return v["result"].clone();
            }
        }
    }

    /// Opens `url` in a new page and attaches to it (later calls go to that page).
    pub fn open(&mut self, url: &str) {
        self.session = None;
        let target = self.call("Target.createTarget", json!({ "url": url }));
        let id = target["targetId"]
            .as_str()
            .expect("a target id")
            .to_string();
        let attached = self.call(
            "Target.attachToTarget",
            json!({ "targetId": id, "flatten": true }),
        );
        self.session = Some(
            attached["sessionId"]
                .as_str()
                .expect("a session id")
                .to_string(),
        );
    }

    /// The value of the JavaScript expression `expr` in the page (`null` if it threw).
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expr, "returnByValue": true }),
        );
        r["result"]["value"].clone()
    }

    /// Evaluates `expr` until `ok` holds of its value (every 200 ms, up to `limit`); returns
    /// it, or panics naming `what` with the last value and `dump` evaluated.
    pub fn wait_for(
        &mut self,
        what: &str,
        expr: &str,
        limit: Duration,
        ok: impl Fn(&Value) -> bool,
        dump: &str,
    ) -> Value {
        let t0 = Instant::now();
        loop {
            let v = self.eval(expr);
            if ok(&v) {
                return v;
            }
            if t0.elapsed() > limit {
                let d = self.eval(dump);
                panic!("the page shows no {what} within {limit:?}: {expr} = {v}; {d}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Saves a PNG of the page to `path` (its folder made if missing).
    pub fn screenshot(&mut self, path: &Path) {
        let r = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        use base64::Engine as _;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().expect("screenshot data"))
            .expect("the screenshot is base64");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("the screenshot's folder");
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
