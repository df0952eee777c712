//! Two hosts and the link between them, for a listener on another host than the server: the
//! test's own network namespace (see `in_own_network`) is the listener's host, a second one made
//! here is the server's, and a veth pair joins them on TEST-NET-2 (198.51.100.0/24, kept for
//! documentation: no address of it is anyone's). Nothing either host sends leaves the machine.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
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
        run(Command::new("ip").args(["addr", "add", &format!("{LISTENER_ADDRESS}/24"), "dev", LISTENER_LINK]));
        run(Command::new("ip").args(["link", "set", LISTENER_LINK, "up"]));
        run(host.command("ip").args(["link", "set", "lo", "up"]));
        run(host.command("ip").args(["addr", "add", &format!("{SERVER_ADDRESS}/24"), "dev", SERVER_LINK]));
        run(host.command("ip").args(["link", "set", SERVER_LINK, "up"]));
        host
    }

    fn namespace(&self) -> String {
        format!("/proc/{}/ns/net", self.holder.id())
    }

    /// `program`, to be run on the server's host.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command.arg(format!("--net={}", self.namespace())).arg("--").arg(program);
        command
    }

    /// Debian's coturn on the server's host, on 3478 (UDP and TCP), its one user
    /// `TURN_USERNAME:TURN_PASSWORD`, relaying from the server's address.
    pub fn start_turn(&self, scratch: &Path) -> Turn {
        let process = self
            .command("turnserver")
            .args([
                &format!("--listening-ip={SERVER_ADDRESS}"),
                &format!("--relay-ip={SERVER_ADDRESS}"),
                &format!("--listening-port={TURN_PORT}"),
                "--min-port=49152",
                "--max-port=49407",
                "--lt-cred-mech",
                &format!("--user={TURN_USERNAME}:{TURN_PASSWORD}"),
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
        let turn = Turn { process };
        // Ready when its TCP listener answers from the listener's host.
        let started = Instant::now();
        while TcpStream::connect((SERVER_ADDRESS, TURN_PORT)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "coturn does not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        turn
    }
}

impl Drop for ServerHost {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

pub const TURN_PORT: u16 = 3478;
pub const TURN_USERNAME: &str = "listener";
pub const TURN_PASSWORD: &str = "turn-test-secret";

/// A running coturn, stopped when dropped.
pub struct Turn {
    process: Child,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
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
    let mut nft = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("nft (Debian's nftables) does not run: run tools/setup.sh");
    nft.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
    assert!(nft.wait().unwrap().success(), "nft refused the firewall:\n{rules}");
}

fn run(command: &mut Command) {
    let status = command.status().unwrap_or_else(|err| panic!("{command:?}: {err}"));
    assert!(status.success(), "{command:?}: {status}");
}
