//! Two hosts and the link between them, for a listener on another host than the server: the
//! test's own network namespace (see `in_own_network`) is the listener's host, a second one made
//! here is the server's, and a veth pair joins them on TEST-NET-2 (198.51.100.0/24, kept for
//! documentation: no address of it is anyone's). Nothing either host sends leaves the machine.

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const SERVER_ADDRESS: &str = "198.51.100.1";
pub const LISTENER_ADDRESS: &str = "198.51.100.2";
/// The link's two ends: the listener's and the server's.
const LISTENER_LINK: &str = "listener0";
pub const SERVER_LINK: &str = "server0";

/// The server's host: a network namespace held open by a process of its own, joined to ours by
/// the link. Dropped, the process ends, and with it the namespace and the link.
pub struct ServerHost {
    holder: Child,
}

impl ServerHost {
    /// Makes the host and the link, both ends up and addressed. Only from inside a test's own
    /// namespace: the link's listener end lives in it.
    pub fn start() -> Self {
        assert!(
            std::env::var_os("QWENCODEC_TEST_NETNS").is_some(),
            "the server's host is made from inside the test's own network namespace"
        );
        let holder = Command::new("unshare")
            .args(["--net", "--", "sleep", "3600"])
            .spawn()
            .expect("unshare (util-linux) does not run");
        let host = Self { holder };
        // unshare makes the namespace before it runs sleep: wait until it has.
        let started = Instant::now();
        while std::fs::read_link(host.namespace()).ok() == std::fs::read_link("/proc/self/ns/net").ok() {
            assert!(started.elapsed() < Duration::from_secs(10), "no namespace made");
            std::thread::sleep(Duration::from_millis(10));
        }
        let pid = host.holder.id().to_string();
        run(Command::new("ip").args([
            "link",
            "add",
            LISTENER_LINK,
            "type",
            "veth",
            "peer",
            "name",
            SERVER_LINK,
            "netns",
            &pid,
        ]));
        run(Command::new("ip").args([
            "addr",
            "add",
            &format!("{LISTENER_ADDRESS}/24"),
            "dev",
            LISTENER_LINK,
        ]));
        // No IPv6 link-local address on either end: one appears a moment after the link is up
        // (after its duplicate address detection), and Chromium, seeing the host's addresses
        // change, fails the navigation under way with ERR_NETWORK_CHANGED (the page never
        // loaded in one make test run).
        run(Command::new("ip").args(["link", "set", LISTENER_LINK, "addrgenmode", "none"]));
        run(host
            .command("ip")
            .args(["link", "set", SERVER_LINK, "addrgenmode", "none"]));
        run(Command::new("ip").args(["link", "set", LISTENER_LINK, "up"]));
        run(host.command("ip").args(["link", "set", "lo", "up"]));
        run(host
            .command("ip")
            .args(["addr", "add", &format!("{SERVER_ADDRESS}/24"), "dev", SERVER_LINK]));
        run(host.command("ip").args(["link", "set", SERVER_LINK, "up"]));
        host
    }

    fn namespace(&self) -> String {
        format!("/proc/{}/ns/net", self.holder.id())
    }

    /// `program`, to be run on the server's host.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.namespace()))
            .arg("--")
            .arg(program);
        command
    }

    /// Debian's coturn on the server's host, on 3478 (UDP and TCP), its one user
    /// `TURN_USERNAME:TURN_PASSWORD`, relaying from the server's address.
    pub fn start_turn(&self, scratch: &Path) -> Daemon {
        self.start_coturn(
            scratch,
            &[
                "--lt-cred-mech",
                &format!("--user={TURN_USERNAME}:{TURN_PASSWORD}"),
            ],
        )
    }

    /// As [`ServerHost::start_turn`], taking TURN REST credentials made with `secret` (coturn's
    /// `use-auth-secret`: the username `<expiry>:<who>`, refused past its expiry) in place of a
    /// user.
    pub fn start_turn_rest(&self, scratch: &Path, secret: &str) -> Daemon {
        self.start_coturn(
            scratch,
            &["--use-auth-secret", &format!("--static-auth-secret={secret}")],
        )
    }

    /// coturn as [`ServerHost::start_turn`] says, its users as `auth` says.
    fn start_coturn(&self, scratch: &Path, auth: &[&str]) -> Daemon {
        let process = self
            .command("turnserver")
            .args(auth)
            .args([
                &format!("--listening-ip={SERVER_ADDRESS}"),
                &format!("--relay-ip={SERVER_ADDRESS}"),
                &format!("--listening-port={TURN_PORT}"),
                "--min-port=49152",
                "--max-port=49407",
                "--realm=qwencodec.test",
                "--no-tls",
                "--no-dtls",
                "--no-cli",
                "--no-software-attribute",
                "--log-file=stdout",
                "--simple-log",
            ])
            .arg(format!("--userdb={}", scratch.join("turndb").display()))
            .arg(format!("--pidfile={}", scratch.join("turnserver.pid").display()))
            .stdout(Stdio::null())
            .spawn()
            .expect("turnserver (Debian's coturn) does not run: run tools/setup.sh");
        let turn = Daemon(process);
        await_listening(TURN_PORT, "coturn");
        turn
    }
}

/// Janus's HTTP API port on the server's host.
pub const JANUS_PORT: u16 = 8088;
/// Janus secured as docs/streaming-server.md has it: its `api_secret`, the Streaming plugin's
/// `admin_key`, and `token_auth_secret` for listeners' tokens.
pub const JANUS_API_SECRET: &str = "janus-api-secret";
pub const JANUS_ADMIN_KEY: &str = "janus-admin-key";
pub const JANUS_TOKEN_SECRET: &str = "janus-token-secret";

impl ServerHost {
    /// Debian's Janus on the server's host with a configuration written to `scratch`: its
    /// Streaming plugin alone, its HTTP API on `JANUS_PORT` of the server's address, ICE on the
    /// link alone, secured with `JANUS_API_SECRET`, signed tokens (`JANUS_TOKEN_SECRET`) and
    /// the Streaming plugin's `JANUS_ADMIN_KEY`. Its log goes to `scratch/janus.log`.
    pub fn start_janus(&self, scratch: &Path) -> Daemon {
        let modules = std::fs::read_dir("/usr/lib")
            .unwrap()
            .filter_map(Result::ok)
            .map(|entry| entry.path().join("janus"))
            .find(|folder| folder.join("plugins/libjanus_streaming.so").exists())
            .expect("no Janus plugins under /usr/lib/*/janus (Debian's janus): run tools/setup.sh");
        let folder = |name: &str| modules.join(name).display().to_string();
        let configs = scratch.join("janus");
        std::fs::create_dir_all(&configs).unwrap();
        let others = |kind: &str, keep: &str| {
            std::fs::read_dir(modules.join(kind))
                .unwrap()
                .filter_map(Result::ok)
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".so") && name != keep)
                .collect::<Vec<_>>()
                .join(",")
        };
        let write = |name: &str, text: String| std::fs::write(configs.join(name), text).unwrap();
        write(
            "janus.jcfg",
            format!(
                "general: {{ configs_folder = \"{}\" plugins_folder = \"{}\" transports_folder = \"{}\"
                   events_folder = \"{}\" loggers_folder = \"{}\" debug_level = 4
                   api_secret = \"{JANUS_API_SECRET}\" token_auth = true
                   token_auth_secret = \"{JANUS_TOKEN_SECRET}\" }}
                 media: {{ rtp_port_range = \"20000-20999\" }}
                 nat: {{ ice_enforce_list = \"{SERVER_LINK}\" }}
                 plugins: {{ disable = \"{}\" }}
                 transports: {{ disable = \"{}\" }}
                 events: {{ broadcast = false }}
                 loggers: {{ disable = \"{}\" }}",
                configs.display(),
                folder("plugins"),
                folder("transports"),
                folder("events"),
                folder("loggers"),
                others("plugins", "libjanus_streaming.so"),
                others("transports", "libjanus_http.so"),
                others("loggers", ""),
            ),
        );
        write(
            "janus.transport.http.jcfg",
            format!(
                "general: {{ base_path = \"/janus\" http = true port = {JANUS_PORT} ip = \"{SERVER_ADDRESS}\" https = false }}
                 admin: {{ admin_http = false }}"
            ),
        );
        write(
            "janus.plugin.streaming.jcfg",
            format!("general: {{ admin_key = \"{JANUS_ADMIN_KEY}\" }}"),
        );
        // Janus binds its API to the link's address, which it finds only once the link has its
        // carrier (a moment after both ends are up).
        let started = Instant::now();
        loop {
            let link = self
                .command("ip")
                .args(["-o", "link", "show", SERVER_LINK])
                .output()
                .unwrap();
            let link = String::from_utf8_lossy(&link.stdout).into_owned();
            if link.contains("LOWER_UP") && !link.contains("NO-CARRIER") {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the link has no carrier: {link}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = std::fs::File::create(scratch.join("janus.log")).unwrap();
        let process = self
            .command("janus")
            .arg("--configs-folder")
            .arg(&configs)
            .arg("--disable-colors")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("janus (Debian's janus) does not run: run tools/setup.sh");
        let janus = Daemon(process);
        let started = Instant::now();
        while TcpStream::connect((SERVER_ADDRESS, JANUS_PORT)).is_err() {
            let log = std::fs::read_to_string(scratch.join("janus.log")).unwrap_or_default();
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "Janus does not listen; its log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        janus
    }
}

/// The TLS proxy's port on the server's host.
pub const TLS_PORT: u16 = 8443;
/// The plain HTTP proxy's port on the server's host.
pub const PROXY_PORT: u16 = 8480;

/// A self-signed certificate for the server's address and its key, in PEM files in `scratch`
/// (the browser is started with `--ignore-certificate-errors`).
pub fn self_signed_certificate(scratch: &Path) -> (PathBuf, PathBuf) {
    let certified = rcgen::generate_simple_self_signed(vec![SERVER_ADDRESS.into()]).unwrap();
    let (certificate, key) = (scratch.join("tls.pem"), scratch.join("tls.key"));
    std::fs::write(&certificate, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    (certificate, key)
}

impl ServerHost {
    /// Debian's nginx on the server's host, terminating TLS on `TLS_PORT` for the server at
    /// `backend` with docs/streaming-server.md's `location` block, with a self-signed
    /// certificate; the page's https URL.
    pub fn start_tls_proxy(&self, scratch: &Path, backend: &str) -> (Daemon, String) {
        let (certificate, key) = self_signed_certificate(scratch);
        let scratch_text = scratch.display();
        let config = format!(
            "daemon off;
             master_process off;
             pid {scratch_text}/nginx.pid;
             error_log stderr;
             events {{}}
             http {{
               access_log off;
               client_body_temp_path {scratch_text}/body;
               proxy_temp_path {scratch_text}/proxy;
               fastcgi_temp_path {scratch_text}/fastcgi;
               uwsgi_temp_path {scratch_text}/uwsgi;
               scgi_temp_path {scratch_text}/scgi;
               server {{
                 listen {SERVER_ADDRESS}:{TLS_PORT} ssl;
                 ssl_certificate {};
                 ssl_certificate_key {};
                 location / {{
                   proxy_pass http://{backend};
                   proxy_http_version 1.1;
                   proxy_set_header Upgrade $http_upgrade;
                   proxy_set_header Connection \"upgrade\";
                   proxy_set_header Host $http_host;
                   proxy_read_timeout 3600s;
                 }}
               }}
             }}",
            certificate.display(),
            key.display()
        );
        let config_file = scratch.join("nginx.conf");
        std::fs::write(&config_file, config).unwrap();
        let process = self
            .command("nginx")
            .arg("-c")
            .arg(&config_file)
            .arg("-p")
            .arg(scratch)
            .spawn()
            .expect("nginx (Debian's nginx-light) does not run: run tools/setup.sh");
        let proxy = Daemon(process);
        await_listening(TLS_PORT, "nginx");
        (proxy, format!("https://{SERVER_ADDRESS}:{TLS_PORT}/"))
    }
}

impl ServerHost {
    /// Debian's nginx on the server's host, passing every request on `PROXY_PORT` to the server
    /// at `backend` with docs/streaming-server.md's `location` block (`X-Forwarded-For` included).
    pub fn start_proxy(&self, scratch: &Path, backend: &str) -> Daemon {
        let scratch_text = scratch.display();
        let config = format!(
            "daemon off;
             master_process off;
             pid {scratch_text}/nginx.pid;
             error_log stderr;
             events {{}}
             http {{
               access_log off;
               client_body_temp_path {scratch_text}/body;
               proxy_temp_path {scratch_text}/proxy;
               fastcgi_temp_path {scratch_text}/fastcgi;
               uwsgi_temp_path {scratch_text}/uwsgi;
               scgi_temp_path {scratch_text}/scgi;
               server {{
                 listen {SERVER_ADDRESS}:{PROXY_PORT};
                 location / {{
                   proxy_pass http://{backend};
                   proxy_http_version 1.1;
                   proxy_set_header Upgrade $http_upgrade;
                   proxy_set_header Connection \"upgrade\";
                   proxy_set_header Host $http_host;
                   proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
                   proxy_read_timeout 3600s;
                 }}
               }}
             }}"
        );
        let config_file = scratch.join("nginx-proxy.conf");
        std::fs::write(&config_file, config).unwrap();
        let process = self
            .command("nginx")
            .arg("-c")
            .arg(&config_file)
            .arg("-p")
            .arg(scratch)
            .spawn()
            .expect("nginx (Debian's nginx-light) does not run: run tools/setup.sh");
        let proxy = Daemon(process);
        await_listening(PROXY_PORT, "nginx");
        proxy
    }
}

/// One more address on the listener's end of the link: a second client on the listener's host.
pub fn add_listener_address(address: &str) {
    run(Command::new("ip").args(["addr", "add", &format!("{address}/24"), "dev", LISTENER_LINK]));
}

impl Drop for ServerHost {
    fn drop(&mut self) {
        // The link at once: a namespace goes (and its end of the link with it) a while after
        // its last process, and the next host's link takes the same names.
        let _ = Command::new("ip").args(["link", "del", LISTENER_LINK]).status();
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

pub const TURN_PORT: u16 = 3478;
pub const TURN_USERNAME: &str = "listener";
pub const TURN_PASSWORD: &str = "turn-test-secret";

/// A server the test runs on the server's host (coturn, nginx), stopped when dropped.
pub struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `port` on the server's host takes TCP connections from this host: `what` ready.
fn await_listening(port: u16, what: &str) {
    let started = Instant::now();
    while TcpStream::connect((SERVER_ADDRESS, port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what} does not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A firewall on the listener's host, as a strict office network has: no UDP across the link
/// either way, and TCP out only to `open_ports` of the server's host (its web port, TURN's);
/// nothing new comes in. ICE can then only go through a TURN server over TCP.
pub fn block_all_but_tcp_to(open_ports: &[u16]) {
    let ports = open_ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let rules = format!(
        "table inet firewall {{
           chain output {{
             type filter hook output priority 0; policy accept;
             oifname \"{LISTENER_LINK}\" meta l4proto udp drop
             oifname \"{LISTENER_LINK}\" tcp dport != {{ {ports} }} drop
           }}
           chain input {{
             type filter hook input priority 0; policy accept;
             iifname \"{LISTENER_LINK}\" meta l4proto udp drop
             iifname \"{LISTENER_LINK}\" ct state new drop
           }}
         }}"
    );
    load_rules(&rules);
}

/// The listener's end of the link taken down, as a cable pulled: nothing crosses either way,
/// and neither host's connections are told (no reset, no close). [`link_up`] puts it back.
pub fn link_down() {
    run(Command::new("ip").args(["link", "set", LISTENER_LINK, "down"]));
}

pub fn link_up() {
    run(Command::new("ip").args(["link", "set", LISTENER_LINK, "up"]));
}

/// No UDP across the link either way, TCP as before: a peer connection's path lost (a NAT
/// binding gone, a firewall changed) while its page's signalling goes on. [`unblock_udp`]
/// lifts it.
pub fn block_udp() {
    let rules = format!(
        "table inet udp_blocked {{
           chain output {{
             type filter hook output priority 0; policy accept;
             oifname \"{LISTENER_LINK}\" meta l4proto udp drop
           }}
           chain input {{
             type filter hook input priority 0; policy accept;
             iifname \"{LISTENER_LINK}\" meta l4proto udp drop
           }}
         }}"
    );
    load_rules(&rules);
}

pub fn unblock_udp() {
    run(Command::new("nft").args(["delete", "table", "inet", "udp_blocked"]));
}

/// `rules` (an nftables table) loaded on the listener's host.
fn load_rules(rules: &str) {
    let mut nft = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("nft (Debian's nftables) does not run: run tools/setup.sh");
    nft.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
    assert!(nft.wait().unwrap().success(), "nft refused:\n{rules}");
}

fn run(command: &mut Command) {
    let status = command
        .status()
        .unwrap_or_else(|err| panic!("{command:?}: {err}"));
    assert!(status.success(), "{command:?}: {status}");
}

/// The link made lossy and slow, as netem would make it (this kernel has no netem): UDP
/// across it dropped at random, `loss_percent` in a hundred each way (the kernel's nftables), and
/// every packet each way held `delay` before it goes on (an NFQUEUE whose verdicts a thread
/// here gives late). The TCP connections (page, signalling, sender) are delayed, not dropped:
/// the test's sender crosses the link only because the test has one link.
pub struct Impairment {
    stop: Arc<AtomicBool>,
    delayed: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const QUEUE: u16 = 0;

impl Impairment {
    pub fn start(loss_percent: u32, delay: Duration) -> Self {
        let rules = format!(
            "table inet impairment {{
               chain output {{
                 type filter hook output priority 10; policy accept;
                 oifname \"{LISTENER_LINK}\" meta l4proto udp numgen random mod 100 lt {loss_percent} counter drop
               }}
               chain input {{
                 type filter hook input priority 10; policy accept;
                 iifname \"{LISTENER_LINK}\" meta l4proto udp numgen random mod 100 lt {loss_percent} counter drop
               }}
             }}"
        );
        load_rules(&rules);

        let mut queue = nfq::Queue::open().expect("no netfilter queue");
        queue.bind(QUEUE).expect("cannot bind the netfilter queue");
        queue.set_nonblocking(true);
        let queue_num = QUEUE.to_string();
        for (chain, direction) in [("OUTPUT", "-o"), ("INPUT", "-i")] {
            run(Command::new("iptables").args([
                "-A",
                chain,
                direction,
                LISTENER_LINK,
                "-j",
                "NFQUEUE",
                "--queue-num",
                &queue_num,
                "--queue-bypass",
            ]));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let delayed = Arc::new(AtomicU64::new(0));
        let thread = std::thread::spawn({
            let (stop, delayed) = (stop.clone(), delayed.clone());
            move || {
                let mut held = std::collections::VecDeque::new();
                while !stop.load(Ordering::Relaxed) {
                    while let Ok(message) = queue.recv() {
                        held.push_back((Instant::now() + delay, message));
                    }
                    while held.front().is_some_and(|(due, _)| *due <= Instant::now()) {
                        let (_, mut message) = held.pop_front().unwrap();
                        message.set_verdict(nfq::Verdict::Accept);
                        queue.verdict(message).expect("a verdict refused");
                        delayed.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_micros(500));
                }
                for (_, mut message) in held {
                    message.set_verdict(nfq::Verdict::Accept);
                    let _ = queue.verdict(message);
                }
            }
        });
        Self {
            stop,
            delayed,
            thread: Some(thread),
        }
    }

    /// Packets held and sent on so far.
    pub fn delayed(&self) -> u64 {
        self.delayed.load(Ordering::Relaxed)
    }

    /// UDP packets dropped so far, both ways.
    pub fn dropped(&self) -> u64 {
        let output = Command::new("nft")
            .args(["list", "table", "inet", "impairment"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        text.split("counter packets ")
            .skip(1)
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Impairment {
    fn drop(&mut self) {
        // The rules first, so that nothing is queued once the thread stops.
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", "impairment"])
            .status();
        for (chain, direction) in [("OUTPUT", "-o"), ("INPUT", "-i")] {
            let _ = Command::new("iptables")
                .args(["-D", chain, direction, LISTENER_LINK, "-j", "NFQUEUE"])
                .args(["--queue-num", &QUEUE.to_string(), "--queue-bypass"])
                .status();
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
