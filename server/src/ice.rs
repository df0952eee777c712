//! How a browser on another host reaches a session: the addresses its host candidates are
//! gathered on, a 1:1 NAT's public address announced for them, and the STUN and TURN servers
//! that webrtcbin and the page both use, with fixed TURN credentials or each session's own
//! (`turn_rest`); and which of a browser's candidates webrtcbin is given.

use std::net::IpAddr;
use std::path::Path;

use gst::prelude::*;
use serde_json::{Value, json};

use qwencodec_common::Options;
use qwencodec_common::webrtc::webrtcbin_on;

use crate::turn_rest::{self, TurnSecret};

/// The environment variable that may hold the TURN credentials, `username:password`.
pub const TURN_CREDENTIALS_VARIABLE: &str = "QWENCODEC_TURN_CREDENTIALS";

/// A STUN or TURN server as the command line names it: `stun://host:port`, `turn://host:port`,
/// `turns://host:port`, with `?transport=udp|tcp` for TURN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IceServer {
    /// `stun`, `turn` or `turns`.
    scheme: String,
    /// `host:port` (an IPv6 host in brackets).
    authority: String,
    /// `?transport=...` or nothing.
    query: String,
}

impl IceServer {
    pub fn parse(url: &str, schemes: &[&str]) -> Result<Self, String> {
        let (scheme, rest) = url
            .split_once("://")
            .or_else(|| url.split_once(':'))
            .ok_or_else(|| format!("{url:?} is not a URL ({}://host:port)", schemes[0]))?;
        if !schemes.contains(&scheme) {
            return Err(format!(
                "{url:?}: the scheme is not one of {}",
                schemes.join(", ")
            ));
        }
        let (authority, query) = match rest.split_once('?') {
            Some((authority, query)) => (authority, format!("?{query}")),
            None => (rest, String::new()),
        };
        if authority.contains('@') {
            return Err(format!(
                "{url:?}: credentials go in --turn-secret-file FILE or --turn-credentials FILE, not on the command line"
            ));
        }
        let port = authority
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse::<u16>().ok());
        if authority.is_empty() || port.is_none() {
            return Err(format!("{url:?}: give host:port"));
        }
        if !matches!(query.as_str(), "" | "?transport=udp" | "?transport=tcp") {
            return Err(format!(
                "{url:?}: the one query taken is ?transport=udp or ?transport=tcp"
            ));
        }
        Ok(Self {
            scheme: scheme.to_owned(),
            authority: authority.to_owned(),
            query,
        })
    }

    /// The URL as webrtcbin takes it, with `credentials` when given.
    fn for_webrtcbin(&self, credentials: Option<&Credentials>) -> String {
        let userinfo = credentials.map_or_else(String::new, |credentials| {
            format!(
                "{}:{}@",
                percent_encoded(&credentials.username),
                percent_encoded(&credentials.password)
            )
        });
        format!("{}://{userinfo}{}{}", self.scheme, self.authority, self.query)
    }

    /// The URL as a browser's `RTCIceServer` takes it (`turn:host:port?transport=tcp`).
    fn for_browser(&self) -> String {
        format!("{}:{}{}", self.scheme, self.authority, self.query)
    }
}

/// TURN's long-term credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    username: String,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, …)", self.username)
    }
}

impl Credentials {
    /// `username:password`, surrounding white space (a file's newline) left out.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.trim().split_once(':') {
            Some((username, password)) if !username.is_empty() && !password.is_empty() => Ok(Self {
                username: username.to_owned(),
                password: password.to_owned(),
            }),
            _ => Err("TURN credentials are username:password".into()),
        }
    }

    /// From `file` when given, else from the environment's `QWENCODEC_TURN_CREDENTIALS`.
    fn read(file: Option<&Path>) -> Result<Option<Self>, String> {
        if let Some(file) = file {
            let text = std::fs::read_to_string(file).map_err(|err| format!("{}: {err}", file.display()))?;
            return Self::parse(&text)
                .map(Some)
                .map_err(|err| format!("{}: {err}", file.display()));
        }
        match std::env::var(TURN_CREDENTIALS_VARIABLE) {
            Ok(text) => Self::parse(&text)
                .map(Some)
                .map_err(|err| format!("${TURN_CREDENTIALS_VARIABLE}: {err}")),
            Err(_) => Ok(None),
        }
    }
}

/// `text` with every byte but RFC 3986's unreserved ones percent-encoded, for a URL's userinfo.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                (byte as char).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

/// The ICE settings every session's webrtcbin is made with.
#[derive(Debug, Default)]
pub struct Ice {
    /// Host candidates on these addresses alone; empty: on every interface's (but loopback).
    addresses: Vec<IpAddr>,
    /// A 1:1 NAT's public address, announced in place of the host candidates of its family.
    public_address: Option<IpAddr>,
    stun: Option<IceServer>,
    turn: Vec<IceServer>,
    turn_credentials: Option<Credentials>,
    /// coturn's `static-auth-secret`: each session's page gets credentials of its own, expiring
    /// with its join token, in place of `turn_credentials`.
    turn_secret: Option<TurnSecret>,
    /// Seconds the credentials of the server's own webrtcbin last, from its session's start.
    turn_lifetime: u64,
}

impl Ice {
    /// `--ice-address`, `--ice-interfaces`, `--public-address`, `--stun`, `--turn`, and
    /// `--turn-secret-file` or `--turn-credentials` (or the environment's TURN secret or
    /// credentials). `turn_lifetime`: seconds the server's own TURN REST credentials last.
    pub fn from_options(options: &mut Options, turn_lifetime: u64) -> Result<Self, String> {
        let mut addresses: Vec<IpAddr> = options.take_list("--ice-address", &[])?;
        let interfaces: Vec<String> = options.take_list("--ice-interfaces", &[])?;
        if !interfaces.is_empty() {
            addresses.extend(interface_addresses(&interfaces)?);
        }
        let public_address = options.take_optional("--public-address")?;
        let stun = options
            .take("--stun")?
            .map(|url| IceServer::parse(&url, &["stun"]))
            .transpose()?;
        let turn = options
            .take_list::<String>("--turn", &[])?
            .iter()
            .map(|url| IceServer::parse(url, &["turn", "turns"]))
            .collect::<Result<Vec<_>, _>>()?;
        let secret_file = options.take("--turn-secret-file")?;
        let turn_secret = TurnSecret::read(secret_file.as_deref().map(Path::new))?;
        let credentials_file = options.take("--turn-credentials")?;
        let turn_credentials = match turn_secret {
            // The environment's fixed credentials yield to a secret; the options do not.
            Some(_) if credentials_file.is_some() => {
                return Err("give --turn-secret-file or --turn-credentials, not both".into());
            }
            Some(_) => None,
            None => Credentials::read(credentials_file.as_deref().map(Path::new))?,
        };
        if !turn.is_empty() && turn_credentials.is_none() && turn_secret.is_none() {
            return Err(format!(
                "--turn needs credentials: --turn-secret-file FILE or ${} (coturn's \
                 use-auth-secret), or --turn-credentials FILE or ${TURN_CREDENTIALS_VARIABLE}",
                turn_rest::SECRET_VARIABLE
            ));
        }
        Ok(Self {
            addresses,
            public_address,
            stun,
            turn,
            turn_credentials,
            turn_secret,
            turn_lifetime,
        })
    }

    /// The TURN credentials of `who` until `expires` (Unix seconds): its own from the TURN
    /// secret, or the fixed ones.
    fn turn_credentials_of(&self, who: &str, expires: u64) -> Option<Credentials> {
        match &self.turn_secret {
            Some(secret) => {
                let (username, password) = secret.credentials(who, expires);
                Some(Credentials { username, password })
            }
            None => self.turn_credentials.clone(),
        }
    }

    /// A 1:1 NAT's public address (`--public-address`), if one was given.
    pub fn public_address(&self) -> Option<IpAddr> {
        self.public_address
    }

    /// A session's `webrtcbin`, gathering as these settings say (with a TURN secret, with REST
    /// credentials of its own, `qwencodec-server`'s, that last `turn_lifetime` from now).
    pub fn webrtcbin(&self, name: &str) -> Result<gst::Element, String> {
        let webrtcbin = webrtcbin_on(name, &self.addresses)?;
        if let Some(stun) = &self.stun {
            webrtcbin.set_property("stun-server", stun.for_webrtcbin(None));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let credentials = self.turn_credentials_of(SERVER_TURN_USER, now.saturating_add(self.turn_lifetime));
        for turn in &self.turn {
            let url = turn.for_webrtcbin(credentials.as_ref());
            if !webrtcbin.emit_by_name::<bool>("add-turn-server", &[&url]) {
                return Err(format!(
                    "webrtcbin refused the TURN server {}",
                    turn.for_browser()
                ));
            }
        }
        Ok(webrtcbin)
    }

    /// The `RTCPeerConnection` `iceServers` of the page of `session`: the same STUN and TURN
    /// servers, with TURN REST credentials that expire at `expires` (Unix seconds) where the
    /// server has a TURN secret.
    pub fn browser_servers(&self, session: &str, expires: u64) -> Value {
        let mut servers = Vec::new();
        if let Some(stun) = &self.stun {
            servers.push(json!({"urls": stun.for_browser()}));
        }
        let credentials = self.turn_credentials_of(session, expires);
        for turn in &self.turn {
            let mut server = json!({"urls": turn.for_browser()});
            if let Some(credentials) = &credentials {
                server["username"] = credentials.username.clone().into();
                server["credential"] = credentials.password.clone().into();
            }
            servers.push(server);
        }
        Value::Array(servers)
    }

    /// `candidate` (an `a=candidate` value of ours) as the browser is told it: a host candidate's
    /// address replaced by the public one of its family behind a 1:1 NAT.
    pub fn announced(&self, candidate: &str) -> String {
        let Some(public) = self.public_address else {
            return candidate.to_owned();
        };
        let mut fields: Vec<&str> = candidate.split(' ').collect();
        let host = fields.len() >= 8 && fields[6] == "typ" && fields[7] == "host";
        let same_family = fields
            .get(4)
            .and_then(|address| address.parse::<IpAddr>().ok())
            .is_some_and(|address| address.is_ipv4() == public.is_ipv4());
        if !(host && same_family) {
            return candidate.to_owned();
        }
        let public = public.to_string();
        fields[4] = &public;
        fields.join(" ")
    }

    /// What the log says of these settings.
    pub fn describe(&self) -> String {
        let addresses = if self.addresses.is_empty() {
            "every interface".to_owned()
        } else {
            self.addresses
                .iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut text = format!("ICE host candidates on {addresses}");
        if let Some(public) = self.public_address {
            text += &format!(", announced as {public}");
        }
        if let Some(stun) = &self.stun {
            text += &format!("; STUN {}", stun.for_browser());
        }
        for turn in &self.turn {
            text += &format!("; TURN {}", turn.for_browser());
        }
        if !self.turn.is_empty() && self.turn_secret.is_some() {
            text += " (REST credentials: each page's own, expiring with its join token)";
        }
        text
    }
}

/// Who the server's own webrtcbin is in its TURN REST username.
const SERVER_TURN_USER: &str = "qwencodec-server";

/// What a browser's candidate names as its address: webrtcbin resolves a host name it is given,
/// so that a peer could have the server look up, and then send connectivity checks to, any
/// name it chooses.
#[derive(Debug, PartialEq, Eq)]
pub enum CandidateAddress {
    /// An IP address: given to webrtcbin.
    Ip,
    /// An mDNS name (`….local`), as browsers hide their host addresses: dropped, not resolved.
    /// Such a name is for the browser's own network, which a server is seldom on; the browser's
    /// connectivity checks reach the server anyway, which learns the address they come from (a
    /// peer-reflexive candidate).
    Mdns,
    /// Any other host name: refused (no browser sends one).
    HostName,
}

/// The address kind of `candidate`, an ICE candidate attribute already checked
/// (`qwencodec_protocol::messages::check_ice_candidate`): its fifth field.
pub fn candidate_address(candidate: &str) -> CandidateAddress {
    let address = candidate.split(' ').nth(4).unwrap_or_default();
    if address.parse::<IpAddr>().is_ok() {
        return CandidateAddress::Ip;
    }
    let name = address.strip_suffix('.').unwrap_or(address);
    let local =
        name.len() > ".local".len() && name[name.len() - ".local".len()..].eq_ignore_ascii_case(".local");
    if local {
        CandidateAddress::Mdns
    } else {
        CandidateAddress::HostName
    }
}

/// An SDP answer's candidates (`a=candidate:` lines), already checked: the SDP without the mDNS
/// ones, how many candidates it held, and how many of them were mDNS and dropped; or why it is
/// refused (a candidate naming another host name).
pub fn answer_candidates(sdp: &str) -> Result<(String, usize, usize), String> {
    let (mut kept, mut candidates, mut dropped) = (String::with_capacity(sdp.len()), 0, 0);
    for line in sdp.split_inclusive('\n') {
        let attribute = line.trim_end_matches(['\r', '\n']);
        if let Some(candidate) = attribute.strip_prefix("a=")
            && candidate.starts_with("candidate:")
        {
            candidates += 1;
            match candidate_address(candidate) {
                CandidateAddress::Ip => (),
                CandidateAddress::Mdns => {
                    dropped += 1;
                    continue;
                }
                CandidateAddress::HostName => return Err(host_name_refusal(candidate)),
            }
        }
        kept.push_str(line);
    }
    Ok((kept, candidates, dropped))
}

/// Why a candidate naming a host name (not `.local`) is refused.
pub fn host_name_refusal(candidate: &str) -> String {
    let name: String = candidate
        .split(' ')
        .nth(4)
        .unwrap_or_default()
        .chars()
        .take(64)
        .collect();
    format!(
        "an ICE candidate names the host {name:?}: the server resolves no name but .local ones, and those it drops"
    )
}

/// The addresses of the interfaces named (each must have one).
fn interface_addresses(names: &[String]) -> Result<Vec<IpAddr>, String> {
    let interfaces = if_addrs::get_if_addrs().map_err(|err| format!("cannot list the interfaces: {err}"))?;
    let mut addresses = Vec::new();
    for name in names {
        let before = addresses.len();
        addresses.extend(
            interfaces
                .iter()
                .filter(|interface| &interface.name == name)
                .map(|interface| interface.ip()),
        );
        if addresses.len() == before {
            return Err(format!("--ice-interfaces: no interface {name} with an address"));
        }
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ice_servers_are_read_as_webrtcbin_and_browsers_take_them() {
        let turn = IceServer::parse("turn://198.51.100.1:3478?transport=tcp", &["turn", "turns"]).unwrap();
        let credentials = Credentials::parse("user:p@ss:word\n").unwrap();
        assert_eq!(
            turn.for_webrtcbin(Some(&credentials)),
            "turn://user:p%40ss%3Aword@198.51.100.1:3478?transport=tcp"
        );
        assert_eq!(turn.for_browser(), "turn:198.51.100.1:3478?transport=tcp");
        let stun = IceServer::parse("stun:[2001:db8::1]:3478", &["stun"]).unwrap();
        assert_eq!(stun.for_webrtcbin(None), "stun://[2001:db8::1]:3478");
    }

    fn from_args(args: &[&str]) -> Result<Ice, String> {
        Ice::from_options(
            &mut Options::from_args(args.iter().map(|arg| arg.to_string())),
            120,
        )
    }

    #[test]
    fn the_ice_settings_are_the_options_and_turn_needs_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("turn-credentials");
        std::fs::write(&file, "user:secret\n").unwrap();
        let ice = from_args(&[
            "--stun",
            "stun:198.51.100.1:3478",
            "--ice-interfaces",
            "lo",
            "--public-address",
            "203.0.113.5",
            "--turn",
            "turn://198.51.100.1:3478",
            "--turn-credentials",
            file.to_str().unwrap(),
        ])
        .unwrap();
        assert!(
            ice.addresses.contains(&IpAddr::from([127, 0, 0, 1])),
            "{:?}",
            ice.addresses
        );
        assert_eq!(ice.public_address(), Some(IpAddr::from([203, 0, 113, 5])));
        assert_eq!(
            ice.turn_credentials,
            Some(Credentials::parse("user:secret").unwrap())
        );
        let described = ice.describe();
        assert!(
            described.starts_with("ICE host candidates on 127.0.0.1")
                && described.ends_with(
                    ", announced as 203.0.113.5; STUN stun:198.51.100.1:3478; TURN turn:198.51.100.1:3478"
                ),
            "{described}"
        );
        assert_eq!(
            ice.browser_servers("s", 1_800_000_060),
            json!([
                {"urls": "stun:198.51.100.1:3478"},
                {"urls": "turn:198.51.100.1:3478", "username": "user", "credential": "secret"},
            ])
        );
        gst::init().unwrap();
        ice.webrtcbin("webrtc").expect("webrtcbin takes the TURN server");

        let err = from_args(&["--turn", "turn://198.51.100.1:3478"]).unwrap_err();
        assert!(err.starts_with("--turn needs credentials"), "{err}");
        assert!(err.contains("--turn-secret-file"), "{err}");
        let plain = from_args(&[]).unwrap();
        assert!(plain.addresses.is_empty() && plain.turn.is_empty() && plain.public_address().is_none());
        assert_eq!(plain.describe(), "ICE host candidates on every interface");
        let err = from_args(&["--ice-interfaces", "nosuchif0"]).unwrap_err();
        assert_eq!(err, "--ice-interfaces: no interface nosuchif0 with an address");
    }

    #[test]
    fn with_a_turn_secret_each_page_has_credentials_of_its_own_that_expire() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("turn-secret");
        std::fs::write(&secret, "a TURN secret of the tests\n").unwrap();
        let secret = secret.to_str().unwrap();
        let ice = from_args(&[
            "--turn",
            "turn://198.51.100.1:3478?transport=tcp",
            "--turn-secret-file",
            secret,
        ])
        .unwrap();
        assert_eq!(
            ice.browser_servers("abc123", 1_800_000_060),
            json!([{
                "urls": "turn:198.51.100.1:3478?transport=tcp",
                "username": "1800000060:abc123",
                "credential": "VJVhD81zQHIVhAeccW3dVxwGOsQ=",
            }])
        );
        let another = &ice.browser_servers("abc124", 1_800_000_060)[0];
        assert_eq!(another["username"], "1800000060:abc124");
        assert_ne!(another["credential"], "VJVhD81zQHIVhAeccW3dVxwGOsQ=");
        assert!(
            ice.describe()
                .ends_with("(REST credentials: each page's own, expiring with its join token)")
        );
        gst::init().unwrap();
        ice.webrtcbin("webrtc").expect("webrtcbin takes the TURN server");
        let fixed = dir.path().join("turn-credentials");
        std::fs::write(&fixed, "user:secret\n").unwrap();
        let err = from_args(&[
            "--turn",
            "turn://198.51.100.1:3478",
            "--turn-secret-file",
            secret,
            "--turn-credentials",
            fixed.to_str().unwrap(),
        ])
        .unwrap_err();
        assert_eq!(err, "give --turn-secret-file or --turn-credentials, not both");
    }

    #[test]
    fn bad_ice_server_urls_are_refused_with_the_reason() {
        let refusal = |url| IceServer::parse(url, &["turn", "turns"]).unwrap_err();
        assert!(refusal("turn://user:secret@host:3478").contains("--turn-secret-file"));
        assert!(refusal("stun://host:3478").contains("scheme"));
        assert!(refusal("turn://host").contains("host:port"));
        assert!(refusal("turn://host:3478?transport=sctp").contains("transport"));
        for bad in ["nopassword", ":password", "user:", " : \n"] {
            assert!(Credentials::parse(bad).is_err(), "{bad:?}");
        }
        // The password is never shown.
        let credentials = Credentials::parse("user:secret").unwrap();
        assert_eq!(format!("{credentials:?}"), "Credentials(user, …)");
    }

    #[test]
    fn a_public_address_replaces_host_candidates_of_its_family_only() {
        let ice = Ice {
            public_address: Some("203.0.113.7".parse().unwrap()),
            ..Ice::default()
        };
        assert_eq!(
            ice.announced("candidate:1 1 UDP 2015363327 10.0.0.5 41234 typ host"),
            "candidate:1 1 UDP 2015363327 203.0.113.7 41234 typ host"
        );
        for kept in [
            "candidate:2 1 UDP 2015363327 2001:db8::5 41234 typ host",
            "candidate:3 1 UDP 1015021823 198.51.100.9 5000 typ srflx raddr 10.0.0.5 rport 41234",
        ] {
            assert_eq!(ice.announced(kept), kept);
        }
    }

    #[test]
    fn candidates_naming_mdns_names_are_dropped_and_other_host_names_refused() {
        let with =
            |address: &str| format!("candidate:1 1 udp 2113937151 {address} 54400 typ host generation 0");
        assert_eq!(candidate_address(&with("198.51.100.2")), CandidateAddress::Ip);
        assert_eq!(candidate_address(&with("2001:db8::2")), CandidateAddress::Ip);
        for mdns in [
            "0b7b8c56-5f2e-4f58-9a4c-4b0b3c1f8a2e.local",
            "host.LOCAL",
            "host.local.",
        ] {
            assert_eq!(candidate_address(&with(mdns)), CandidateAddress::Mdns, "{mdns}");
        }
        for name in [
            "metadata.google.internal",
            "localhost",
            "local",
            ".local",
            "evil.local.example.org",
        ] {
            assert_eq!(
                candidate_address(&with(name)),
                CandidateAddress::HostName,
                "{name}"
            );
        }
        assert_eq!(
            host_name_refusal(&with("localhost")),
            "an ICE candidate names the host \"localhost\": the server resolves no name but .local ones, and those it drops"
        );
    }

    #[test]
    fn an_answers_candidates_are_counted_and_its_mdns_ones_left_out() {
        let sdp = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96\r\n\
                   a=candidate:1 1 udp 2113937151 198.51.100.2 54400 typ host\r\n\
                   a=candidate:2 1 udp 2113937151 4f1c.local 54401 typ host\r\n\
                   a=candidate:3 1 udp 1677729535 203.0.113.9 54402 typ srflx raddr 0.0.0.0 rport 0\r\n\
                   a=end-of-candidates\r\n";
        let (kept, candidates, dropped) = answer_candidates(sdp).unwrap();
        assert_eq!((candidates, dropped), (3, 1));
        assert_eq!(
            kept,
            sdp.replace("a=candidate:2 1 udp 2113937151 4f1c.local 54401 typ host\r\n", "")
        );
        let (kept, candidates, dropped) = answer_candidates("v=0\nm=audio 9 RTP/AVP 96\n").unwrap();
        assert_eq!(
            (kept.as_str(), candidates, dropped),
            ("v=0\nm=audio 9 RTP/AVP 96\n", 0, 0)
        );
        let refused = answer_candidates(&sdp.replace("4f1c.local", "intranet.example.org")).unwrap_err();
        assert!(refused.contains("\"intranet.example.org\""), "{refused}");
    }
}
