//! The server under test as a process, its two WebSocket endpoints as clients, and the network
//! namespace the tests run in.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

pub const TOKEN: &str = "test-token";
const INSIDE: &str = "QWENCODEC_TEST_NETNS";

/// Runs `test` of this binary again in a network namespace of its own, with only `lo` up, and
/// fails when it fails or when it is not exactly one test that ran (a renamed test matches
/// nothing, and a run of nothing succeeds); true when this process is that run (then the test
/// itself runs). Nothing the browser or libnice send can leave the machine.
pub fn in_own_network(test: &str) -> bool {
    if std::env::var_os(INSIDE).is_some() {
        return true;
    }
    // One namespace at a time: two browsers at once would slow each other's measurements.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0"));
    let mut unshare = Command::new("unshare");
    unshare.arg("--net");
    if !root {
        unshare.arg("--map-root-user");
    }
    let mut unshare = unshare
        .args(["--", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""])
        .arg(std::env::current_exe().unwrap())
        .args([
            test,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env(INSIDE, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("unshare (util-linux) does not run");
    // Passed on as it comes, and the harness's summary kept.
    let mut summary = None;
    for line in BufReader::new(unshare.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        println!("{line}");
        if line.starts_with("test result:") {
            summary = Some(line);
        }
    }
    let status = unshare.wait().unwrap();
    assert!(status.success(), "{test} in its network namespace: {status}");
    let summary = summary.unwrap_or_default();
    assert!(
        summary.starts_with("test result: ok. 1 passed;"),
        "{test} in its network namespace ran not one test but: {summary:?}"
    );
    false
}

/// Milliseconds since the epoch: the clock the page's `Date.now()` reads.
pub fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1e3
}

/// The server binary, which cargo builds for this crate's tests.
const SERVER: &str = env!("CARGO_BIN_EXE_qwencodec-server");

/// A running `qwencodec-server` with the bundled test checkpoint; its log is kept.
pub struct Server {
    process: Child,
    pub address: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// The server on this host's loopback, its ICE candidates there too, with `options` after
    /// the tests' own.
    pub fn start(options: &[&str]) -> Self {
        let mut command = Command::new(SERVER);
        command.args(["--bind", "127.0.0.1:0", "--ice-address", "127.0.0.1"]);
        // The tests' own caps, not what the machine measured at start: under load it may
        // measure one session, and the tests' second tab or session would be refused.
        command.args(["--admission", "off"]);
        Self::launch(command, options)
    }

    /// As [`Server::start`], with `env` in the server's environment.
    pub fn start_with_env(options: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(SERVER);
        command.args(["--bind", "127.0.0.1:0", "--ice-address", "127.0.0.1"]);
        command.args(["--admission", "off"]);
        command.envs(env.iter().copied());
        Self::launch(command, options)
    }

    /// As [`Server::start`], with the server's own admission, as `make serve` runs it.
    pub fn start_with_default_admission(options: &[&str]) -> Self {
        let mut command = Command::new(SERVER);
        command.args(["--bind", "127.0.0.1:0", "--ice-address", "127.0.0.1"]);
        Self::launch(command, options)
    }

    /// The server on `host`, listening and gathering ICE candidates on its link to this host:
    /// an address another host reaches, so open to anyone unless a join secret is given.
    pub fn start_on(host: &super::network::ServerHost, options: &[&str]) -> Self {
        let mut command = host.command(SERVER);
        command.args(["--bind", &format!("{}:0", super::network::SERVER_ADDRESS)]);
        if !options.contains(&"--join-secret-file") {
            command.arg("--insecure-open");
        }
        command.args(["--admission", "off"]);
        Self::launch(command, options)
    }

    /// As [`Server::start`], without the tests' operator token: with a join secret, senders then
    /// have tokens of their own alone.
    pub fn start_without_operator_token(options: &[&str]) -> Self {
        let mut command = Command::new(SERVER);
        command.args(["--bind", "127.0.0.1:0", "--ice-address", "127.0.0.1"]);
        command.args(["--admission", "off"]);
        command.env_remove("QWENCODEC_CODES_TOKEN");
        Self::launch(command, options)
    }

    fn launch(mut command: Command, options: &[&str]) -> Self {
        // A test that gives the token in a file gives no other; secrets go in the environment
        // or files, never on the command line.
        let token_removed = command
            .get_envs()
            .any(|(name, value)| name == "QWENCODEC_CODES_TOKEN" && value.is_none());
        if !options.contains(&"--token-file") && !token_removed {
            command.env("QWENCODEC_CODES_TOKEN", TOKEN);
        }
        let mut process = command
            .args(["--device", "cpu"])
            // A GLib warning (fatal under the tests' G_DEBUG) then logs where it came from.
            .env("RUST_BACKTRACE", "1")
            .arg("--model")
            .arg(super::common::fixture_dir("release-tiny"))
            .args(options)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (address_tx, address_rx) = std::sync::mpsc::channel();
        let lines = BufReader::new(process.stdout.take().unwrap()).lines();
        std::thread::spawn({
            let log = log.clone();
            move || {
                for line in lines.map_while(Result::ok) {
                    println!("{line}");
                    let url = line.split("open http://").nth(1);
                    if let Some(url) = url.or_else(|| line.split("open https://").nth(1)) {
                        let _ = address_tx.send(url.split('/').next().unwrap().to_string());
                    }
                    log.lock().unwrap().push(line);
                }
            }
        });
        let address = address_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the server does not say where it listens");
        Self {
            process,
            address,
            log,
        }
    }

    /// The server's threads and resident memory (kB), from `/proc`.
    pub fn threads_and_rss(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.id())).unwrap();
        let field = |name: &str| -> u64 {
            let line = status.lines().find(|line| line.starts_with(name)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        (field("Threads:"), field("VmRSS:"))
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.address)
    }

    /// Whether a line of the log matches, waiting up to `within` for it (the log comes
    /// through a pipe).
    pub fn await_log(&self, matches: impl Fn(&str) -> bool, within: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self.log.lock().unwrap().iter().any(|line| matches(line)) {
                return true;
            }
            if start.elapsed() > within {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A GET of `path`: the response's head and body.
    pub fn get(&self, path: &str) -> (String, String) {
        let mut stream = TcpStream::connect(&self.address).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        (head.to_owned(), body.to_owned())
    }

    /// `/status`: sessions and live pipelines.
    pub fn status(&self) -> (u64, u64) {
        let status: Value = serde_json::from_str(&self.get("/status").1).unwrap();
        (
            status["sessions"].as_u64().unwrap(),
            status["pipelines"].as_u64().unwrap(),
        )
    }

    /// `/status`'s capacity: sessions, most, headroom, real_time_margin, admitting, refusal.
    pub fn capacity(&self) -> Value {
        let status: Value = serde_json::from_str(&self.get("/status").1).unwrap();
        status["capacity"].clone()
    }

    /// Waits up to `within` for `/status`'s capacity to say `admitting`; the capacity last read.
    pub fn await_admitting(&self, admitting: bool, within: Duration) -> Value {
        let start = Instant::now();
        loop {
            let capacity = self.capacity();
            if capacity["admitting"] == admitting || start.elapsed() > within {
                return capacity;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `within` for `/status` to be `wanted`; what it was last.
    pub fn await_status(&self, wanted: (u64, u64), within: Duration) -> (u64, u64) {
        let start = Instant::now();
        loop {
            let status = self.status();
            if status == wanted || start.elapsed() > within {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A WebSocket to `path`, with `token` as the bearer when given.
    pub fn connect(&self, path: &str, token: Option<&str>) -> Client {
        let bearer = token.map(|token| format!("Bearer {token}"));
        let headers: Vec<(&str, &str)> = bearer
            .iter()
            .map(|bearer| ("Authorization", bearer.as_str()))
            .collect();
        self.connect_with(path, &headers)
    }

    /// A WebSocket to `path` with these request headers.
    pub fn connect_with(&self, path: &str, headers: &[(&str, &str)]) -> Client {
        connect_at(&self.address, path, headers)
    }

    /// The codes ingress of `session`, with the right token.
    pub fn sender(&self, session: &str) -> Client {
        self.connect(&format!("/codes?session={session}"), Some(TOKEN))
    }
}

/// A WebSocket to `path` at `address` (a server or something in front of it), with these
/// request headers.
pub fn connect_at(address: &str, path: &str, headers: &[(&str, &str)]) -> Client {
    connect_over(TcpStream::connect(address).unwrap(), address, path, headers)
}

/// A WebSocket to `path` at `address` over `stream` (connected there), with these request
/// headers.
pub fn connect_over(stream: TcpStream, address: &str, path: &str, headers: &[(&str, &str)]) -> Client {
    let mut request = format!("ws://{address}{path}").into_client_request().unwrap();
    for &(name, value) in headers {
        let name: tungstenite::http::HeaderName = name.parse().unwrap();
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (socket, _) = tungstenite::client(request, stream).expect("a WebSocket handshake");
    Client(socket)
}

impl Server {
    /// Sends SIGTERM: the server drains.
    pub fn send_sigterm(&self) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.process.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM");
    }

    /// Waits up to `within` for the server to exit; its exit status.
    pub fn await_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.process.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the server did not exit within {within:?} after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

pub struct Client(WebSocket<TcpStream>);

impl Client {
    pub fn send_binary(&mut self, bytes: Vec<u8>) {
        self.0.send(Message::binary(bytes)).unwrap();
    }

    pub fn send_text(&mut self, text: &str) {
        self.0.send(Message::text(text)).unwrap();
    }

    pub fn cancel(&mut self) {
        self.send_text(&json!({"type": "cancel"}).to_string());
    }

    /// The next text message, as JSON.
    pub fn receive_json(&mut self) -> Value {
        loop {
            match self.0.read().unwrap() {
                Message::Text(text) => return serde_json::from_str(&text).unwrap(),
                Message::Close(frame) => panic!("closed by the server: {frame:?}"),
                _ => (),
            }
        }
    }

    /// Closes the connection as a client that is done does: a close frame, then the server's
    /// answer.
    pub fn close(mut self) {
        self.0.close(None).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match self.0.read() {
                Ok(_) => (),
                Err(tungstenite::Error::ConnectionClosed) => return,
                Err(err) => panic!("the connection ended without the server's close: {err}"),
            }
        }
        panic!("the server did not answer the close");
    }

    /// Reads until the server closes; its close code and reason.
    pub fn close_reason(&mut self) -> (u16, String) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            match self.0.read() {
                Ok(Message::Close(Some(frame))) => return (frame.code.into(), frame.reason.to_string()),
                Ok(Message::Close(None)) => return (0, String::new()),
                Ok(_) => (),
                Err(err) => panic!("the connection ended without a close frame: {err}"),
            }
        }
        panic!("the server did not close the connection");
    }
}
