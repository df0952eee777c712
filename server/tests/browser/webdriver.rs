//! A headless Chromium driven over WebDriver (Debian's `chromedriver`): a few JSON-over-HTTP
//! calls, made with std alone.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The browser itself, not Debian's launcher script around it.
const CHROMIUM: &str = "/usr/lib/chromium/chromium";

/// Chromium's flags for a machine with no display, no sound device and no network beyond `lo`
/// (what the "facts checked" found to work).
const CHROMIUM_FLAGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",
    "--disable-gpu",
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
    // No name resolves; the hosts the tests' pages are on (this one, or the server's host across
    // the two-host tests' link) are taken as they are.
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1 , EXCLUDE 198.51.100.1",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    // Two tabs measure at once: neither may be throttled as a background tab.
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
    "--window-size=800,500",
];

pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A browser with `flags` besides the tests' own.
    pub fn start_with(flags: &[&str]) -> Self {
        assert!(
            Path::new(CHROMEDRIVER).exists() && Path::new(CHROMIUM).exists(),
            "chromium and chromium-driver are missing: run tools/setup.sh"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver) does not start");
        let profile = tempfile::tempdir().unwrap();
        let mut browser = Self {
            driver,
            port,
            session: String::new(),
            _profile: profile,
        };
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver does not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut args: Vec<String> = CHROMIUM_FLAGS
            .iter()
            .chain(flags)
            .map(|flag| flag.to_string())
            .collect();
        args.push(format!("--user-data-dir={}", browser._profile.path().display()));
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let reply = browser.call("POST", "/session", Some(capabilities));
        browser.session = reply["sessionId"]
            .as_str()
            .expect("a WebDriver session id")
            .to_string();
        browser
    }

    /// One WebDriver command; its `value`. An error reply fails the test with its message.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|body| body.to_string()).unwrap_or_default();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let response = read_response(&mut stream);
        let reply: Value = serde_json::from_str(&response)
            .unwrap_or_else(|err| panic!("WebDriver {method} {path}: {err} in {response:?}"));
        if let Some(error) = reply["value"]["error"].as_str() {
            panic!(
                "WebDriver {method} {path}: {error}: {}",
                reply["value"]["message"]
            );
        }
        reply["value"].clone()
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn open(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({"url": url})));
    }

    /// Runs `script` (a function body; may `await`, its promise is waited for) in the current
    /// tab and gives back what it returns.
    pub fn run(&self, script: &str) -> Value {
        let script = format!("return (async () => {{ {script} }})();");
        self.session_call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// A new window (a tab that is never in the background), made current; its handle.
    pub fn new_window(&self) -> String {
        let reply = self.session_call("POST", "/window/new", Some(json!({"type": "window"})));
        let handle = reply["handle"].as_str().unwrap().to_string();
        self.switch_to(&handle);
        handle
    }

    pub fn window(&self) -> String {
        self.session_call("GET", "/window", None)
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn switch_to(&self, handle: &str) {
        self.session_call("POST", "/window", Some(json!({"handle": handle})));
    }

    /// Closes the current window, as a user closing the tab.
    pub fn close_window(&self) {
        self.session_call("DELETE", "/window", None);
    }

    /// The current window as PNG.
    pub fn screenshot(&self) -> Vec<u8> {
        let png = self.session_call("GET", "/screenshot", None);
        data_encoding::BASE64
            .decode(png.as_str().unwrap().as_bytes())
            .expect("a base64 screenshot")
    }
}

/// The body of an HTTP response, by its Content-Length: chromedriver keeps connections open.
fn read_response(stream: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(head_end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&bytes[..head_end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse().ok())
                .expect("a Content-Length");
            if bytes.len() >= head_end + 4 + length {
                return String::from_utf8_lossy(&bytes[head_end + 4..head_end + 4 + length]).into_owned();
            }
        }
        let read = stream.read(&mut chunk).expect("a WebDriver reply");
        assert!(read > 0, "chromedriver closed the connection mid-reply");
        bytes.extend_from_slice(&chunk[..read]);
    }
}

impl Browser {
    /// Stops every process of the browser (SIGSTOP to chromedriver's descendants), as a hung
    /// or suspended machine stops: it answers nothing, and its connections stay open. They go
    /// on when the guard is dropped.
    pub fn freeze(&self) -> Frozen {
        let processes = descendants(self.driver.id());
        assert!(!processes.is_empty(), "chromedriver has no browser processes");
        signal(&processes, "STOP");
        Frozen { processes }
    }
}

/// A browser's processes, stopped until this is dropped.
pub struct Frozen {
    processes: Vec<u32>,
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(&self.processes, "CONT");
    }
}

fn signal(processes: &[u32], signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(processes.iter().map(u32::to_string))
        .status()
        .expect("kill does not run");
    assert!(status.success(), "kill -{signal} {processes:?}: {status}");
}

/// The processes below `root` (its children, theirs, ...), from /proc.
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After the command's name in parentheses: the state, then the parent.
            let parent = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, parent))
        })
        .collect();
    let mut found = vec![root];
    let mut at = 0;
    while at < found.len() {
        let parent = found[at];
        found.extend(
            parents
                .iter()
                .filter(|&&(_, of)| of == parent)
                .map(|&(pid, _)| pid),
        );
        at += 1;
    }
    found.remove(0);
    found
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.call("DELETE", &format!("/session/{}", self.session), None)
            }));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
