//! Janus as a broadcast's fan-out (`--janus`): each broadcast gets a mountpoint of Janus's
//! Streaming plugin, made through Janus's HTTP API and destroyed when the broadcast ends. The
//! server sends the mountpoint plain RTP (Opus), once, to the port Janus opened for it; Janus
//! answers each listener's WebRTC (ICE, DTLS, SRTP) and copies the packets to every one.
//!
//! Why a Streaming mountpoint (docs/streaming-server.md, "Broadcasts through Janus"): it is
//! Janus's own one-source-many-viewers primitive, it takes RTP that GStreamer 1.22's `udpsink`
//! sends as it is, and it costs the server no peer connection of its own per broadcast.
//!
//! Janus as its operators secure it: every call carries Janus's `apisecret`, `create` and `list`
//! the Streaming plugin's `admin_key`; each mountpoint is private (not listed), takes its RTP on
//! the API's address alone (`iface`), and has a secret of its own, derived from the admin key
//! and its id so that a later run can destroy what a crashed one left; listeners' pages get a
//! token signed with Janus's `token_auth_secret` that opens the Streaming plugin alone.

use std::net::{IpAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use sha1::Sha1;
use sha2::Sha256;
use tokio::task::JoinHandle;

use crate::log::log;
use crate::random::random_hex;

/// How long one call to Janus's API may take.
const API_TIMEOUT: Duration = Duration::from_secs(5);
/// The Opus payload type the mountpoint takes, as the server's payloader sends it.
const OPUS_PT: u8 = 96;

/// The environment variables that may hold Janus's secrets (their files win).
pub const API_SECRET_VARIABLE: &str = "QWENCODEC_JANUS_API_SECRET";
pub const ADMIN_KEY_VARIABLE: &str = "QWENCODEC_JANUS_ADMIN_KEY";
pub const TOKEN_SECRET_VARIABLE: &str = "QWENCODEC_JANUS_TOKEN_SECRET";
/// What every mountpoint of this server is described as (with ` NAME` for `--instance NAME`):
/// no address, and what the cleanup at start matches.
const DESCRIPTION: &str = "qwencodec broadcast";
/// How long a listener's token opens Janus: a broadcast's link is shared while it runs.
pub const LISTENER_TOKEN_TTL: Duration = Duration::from_secs(12 * 3600);
/// Mountpoint ids the server picks stay below 2^53, as janus.js holds ids in a JavaScript number.
const MOST_ID: u64 = (1 << 53) - 1;

/// Janus's secrets as its operator sets them: `api_secret` (janus.jcfg), the Streaming plugin's
/// `admin_key`, and `token_auth_secret` (janus.jcfg, with `token_auth = true`).
#[derive(Default)]
pub struct Secrets {
    pub api_secret: Option<String>,
    pub admin_key: Option<String>,
    pub token_secret: Option<String>,
}

impl Secrets {
    /// Each from its file when given (`--janus-api-secret-file`, `--janus-admin-key-file`,
    /// `--janus-token-secret-file`), else from its environment variable.
    pub fn read(
        api_secret: Option<&Path>,
        admin_key: Option<&Path>,
        token_secret: Option<&Path>,
    ) -> Result<Self, String> {
        Ok(Self {
            api_secret: read_secret(api_secret, API_SECRET_VARIABLE)?,
            admin_key: read_secret(admin_key, ADMIN_KEY_VARIABLE)?,
            token_secret: read_secret(token_secret, TOKEN_SECRET_VARIABLE)?,
        })
    }
}

/// A secret from `file`, else from `variable`; surrounding white space (a file's newline) left
/// out, and an empty one refused.
fn read_secret(file: Option<&Path>, variable: &str) -> Result<Option<String>, String> {
    let (text, source) = match file {
        Some(file) => (
            std::fs::read_to_string(file).map_err(|err| format!("{}: {err}", file.display()))?,
            file.display().to_string(),
        ),
        None => match std::env::var(variable) {
            Ok(text) => (text, format!("${variable}")),
            Err(_) => return Ok(None),
        },
    };
    match text.trim() {
        "" => Err(format!("{source}: the secret is empty")),
        secret => Ok(Some(secret.to_owned())),
    }
}

/// A Janus server's HTTP API (`http://host:port/janus`), and what listeners are told of it.
pub struct Janus {
    api: String,
    /// Where the mountpoints' RTP goes, and the one address Janus takes it on (`iface`): the
    /// API's host, resolved at start (the server and Janus then agree on it).
    rtp_address: IpAddr,
    secrets: Secrets,
    /// What this server's mountpoints are described as.
    description: String,
    /// The API's URL as a listener's page reaches it (`--janus-public`).
    pub public: String,
    /// Whether the mountpoints' SDP offers Opus in-band FEC (the server's encoder puts it in).
    fec: bool,
    /// hyper's client, as the server's side is hyper's.
    client: Client<HttpConnector, Full<Bytes>>,
    /// Mountpoints being destroyed (a drop cannot wait): a shutdown waits for them.
    destroying: Mutex<Vec<JoinHandle<()>>>,
}

/// A broadcast's mountpoint: where its RTP goes, and the id listeners watch. Destroyed on drop.
pub struct Mountpoint {
    pub id: u64,
    /// What Janus asks to edit or destroy it.
    secret: String,
    pub host: String,
    pub port: u16,
    janus: Arc<Janus>,
}

impl Janus {
    /// `api`: the HTTP API's URL, `http://host:port/path` (plain HTTP: Janus's API belongs on
    /// the private network it shares with the server).
    /// `instance`: `--instance`, which tells this server's mountpoints from those of others
    /// sharing the Janus.
    pub fn new(
        api: &str,
        public: Option<String>,
        fec: bool,
        secrets: Secrets,
        instance: Option<&str>,
    ) -> Result<Arc<Self>, String> {
        let rtp_host = api
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next())
            .and_then(|authority| {
                authority
                    .rsplit_once(':')
                    .map(|(host, _)| host)
                    .or(Some(authority))
            })
            .map(|host| host.trim_start_matches('[').trim_end_matches(']').to_owned())
            .filter(|host| !host.is_empty())
            .ok_or_else(|| format!("--janus takes http://HOST:PORT/PATH, not {api:?}"))?;
        let rtp_address = match rtp_host.parse::<IpAddr>() {
            Ok(address) => address,
            Err(_) => (rtp_host.as_str(), 0)
                .to_socket_addrs()
                .ok()
                .and_then(|mut addresses| addresses.next())
                .map(|address| address.ip())
                .ok_or_else(|| format!("--janus {api}: {rtp_host} has no address"))?,
        };
        let description = match instance {
            Some(instance) => format!("{DESCRIPTION} {instance}"),
            None => DESCRIPTION.to_owned(),
        };
        Ok(Arc::new(Self {
            api: api.trim_end_matches('/').to_owned(),
            rtp_address,
            secrets,
            description,
            public: public.unwrap_or_else(|| api.to_owned()),
            fec,
            client: Client::builder(TokioExecutor::new()).build_http(),
            destroying: Mutex::default(),
        }))
    }

    pub fn api(&self) -> &str {
        &self.api
    }

    /// What the log says of Janus's security as the server calls it.
    pub fn describe(&self) -> String {
        let said = |given: bool, what: &str| match given {
            true => format!("with its {what}"),
            false => format!("without an {what}"),
        };
        format!(
            "{}, {}, listeners {}; private mountpoints taking RTP on {} alone",
            said(self.secrets.api_secret.is_some(), "API secret"),
            said(self.secrets.admin_key.is_some(), "admin key"),
            match self.secrets.token_secret {
                Some(_) => "with tokens it signs",
                None => "without tokens",
            },
            self.rtp_address
        )
    }

    /// A new private mountpoint for one broadcast's audio, taking RTP on the API's address.
    pub async fn create_mountpoint(self: &Arc<Self>) -> Result<Mountpoint, String> {
        let mut audio = json!({
            "type": "audio", "mid": "a", "port": 0, "pt": OPUS_PT, "codec": "opus",
            "iface": self.rtp_address.to_string(),
        });
        if self.fec {
            audio["fmtp"] = json!("useinbandfec=1");
        }
        let id = random_id()?;
        let secret = self.mountpoint_secret(id)?;
        let mut request = json!({
            "request": "create",
            "type": "rtp",
            "id": id,
            "description": self.description,
            "secret": secret,
            "is_private": true,
            "permanent": false,
            "media": [audio],
        });
        if let Some(admin_key) = &self.secrets.admin_key {
            request["admin_key"] = json!(admin_key);
        }
        let created = self.streaming(request).await?;
        let stream = &created["stream"];
        let port = stream["ports"]
            .as_array()
            .and_then(|ports| ports.iter().find(|port| port["type"] == "audio"))
            .and_then(|port| port["port"].as_u64())
            .and_then(|port| u16::try_from(port).ok());
        match (stream["id"].as_u64(), port) {
            (Some(made), Some(port)) if made == id => Ok(Mountpoint {
                id,
                secret,
                host: self.rtp_address.to_string(),
                port,
                janus: self.clone(),
            }),
            _ => Err(format!(
                "Janus made a mountpoint without the id asked for or an audio port: {created}"
            )),
        }
    }

    /// A mountpoint's secret: without an admin key, a new one each (no later run can list it
    /// anyway); with one, derived from it and the id, so that a later run destroys what an
    /// earlier one left.
    fn mountpoint_secret(&self, id: u64) -> Result<String, String> {
        match &self.secrets.admin_key {
            Some(key) => Ok(mountpoint_secret(key, id)),
            None => random_hex(16),
        }
    }

    /// Destroys the mountpoints an earlier run of this server left (a crash leaves them, their
    /// RTP ports open): those described as this server's, listed with the admin key (private
    /// mountpoints are listed with it alone). How many went.
    pub async fn destroy_leftovers(&self) -> Result<usize, String> {
        let Some(admin_key) = &self.secrets.admin_key else {
            return Err(
                "without an admin key (--janus-admin-key-file) the private mountpoints an earlier run left cannot be listed"
                    .into(),
            );
        };
        let listed = self
            .streaming(json!({"request": "list", "admin_key": admin_key}))
            .await?;
        let leftovers: Vec<u64> = listed["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|mountpoint| mountpoint["description"] == self.description.as_str())
            .filter_map(|mountpoint| mountpoint["id"].as_u64())
            .collect();
        for &id in &leftovers {
            self.destroy_mountpoint(id, &mountpoint_secret(admin_key, id))
                .await?;
        }
        Ok(leftovers.len())
    }

    /// The broadcast page's path for `mountpoint`: its Janus, and, with a token secret, a token
    /// for the Streaming plugin in the fragment (which no request carries).
    pub fn listen_path(&self, mountpoint: u64) -> Result<String, String> {
        let janus = form_urlencoded::byte_serialize(self.public.as_bytes()).collect::<String>();
        let mut path = format!("/broadcast.html?mountpoint={mountpoint}&janus={janus}");
        if let Some(secret) = &self.secrets.token_secret {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_err(|_| "the clock is before 1970: no listener token".to_owned())?;
            let token = listener_token(secret, (now + LISTENER_TOKEN_TTL).as_secs());
            path += "#token=";
            path.extend(form_urlencoded::byte_serialize(token.as_bytes()));
        }
        Ok(path)
    }

    async fn destroy_mountpoint(&self, id: u64, secret: &str) -> Result<(), String> {
        self.streaming(json!({"request": "destroy", "id": id, "secret": secret}))
            .await
            .map(|_| ())
    }

    /// Waits up to `patience` for the mountpoints being destroyed; how many are left.
    pub async fn settle(&self, patience: Duration) -> usize {
        let destroying = std::mem::take(&mut *self.destroying.lock().unwrap());
        let left = destroying.len();
        let settled = tokio::time::timeout(patience, async {
            for destroy in destroying {
                let _ = destroy.await;
            }
        })
        .await;
        if settled.is_ok() { 0 } else { left }
    }

    /// One request to the Streaming plugin, in a Janus session of its own (made, attached to
    /// the plugin, and destroyed around it: a mountpoint outlives the session that made it);
    /// the plugin's answer.
    async fn streaming(&self, body: Value) -> Result<Value, String> {
        let session = self.call(&self.api, json!({"janus": "create"})).await?;
        let session = session["data"]["id"]
            .as_u64()
            .ok_or_else(|| format!("Janus made no session: {session}"))?;
        let session_url = format!("{}/{session}", self.api);
        let attach = json!({"janus": "attach", "plugin": "janus.plugin.streaming"});
        let answer = match self.call(&session_url, attach).await {
            Ok(attached) => match attached["data"]["id"].as_u64() {
                Some(handle) => {
                    let handle_url = format!("{session_url}/{handle}");
                    self.call(&handle_url, json!({"janus": "message", "body": body}))
                        .await
                }
                None => Err(format!("Janus attached no handle: {attached}")),
            },
            Err(err) => Err(err),
        };
        if let Err(err) = self.call(&session_url, json!({"janus": "destroy"})).await {
            log!("Janus: ending an API session failed: {err}");
        }
        let data = answer?["plugindata"]["data"].take();
        match data.get("error") {
            Some(error) => Err(format!(
                "Janus's Streaming plugin: {error} ({})",
                data["error_code"]
            )),
            None => Ok(data),
        }
    }

    /// One POST of `message` (a transaction id and the API secret added) to `url`: Janus's
    /// answer, or its error.
    async fn call(&self, url: &str, mut message: Value) -> Result<Value, String> {
        message["transaction"] = json!(random_hex(8)?);
        if let Some(secret) = &self.secrets.api_secret {
            message["apisecret"] = json!(secret);
        }
        let request = hyper::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::from(message.to_string()))
            .map_err(|err| format!("Janus at {url}: {err}"))?;
        let answered = tokio::time::timeout(API_TIMEOUT, async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|err| err.to_string())?;
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|err| err.to_string())?;
            Ok::<_, String>(String::from_utf8_lossy(&body.to_bytes()).into_owned())
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {API_TIMEOUT:?}")));
        let answer: Value = answered
            .map_err(|err| format!("Janus at {url}: {err}"))
            .and_then(|text| {
                serde_json::from_str(&text)
                    .map_err(|err| format!("Janus at {url} answered no JSON ({err}): {text}"))
            })?;
        match answer["janus"].as_str() {
            Some("success") | Some("ack") => Ok(answer),
            _ => Err(format!(
                "Janus at {url}: {}",
                answer["error"]["reason"].as_str().unwrap_or(&answer.to_string())
            )),
        }
    }
}

/// A mountpoint id Janus has not given: random, from 1 to [`MOST_ID`].
fn random_id() -> Result<u64, String> {
    let hex = random_hex(8)?;
    let bits = u64::from_str_radix(&hex, 16).map_err(|err| format!("a random id: {err}"))?;
    Ok(id_of(bits))
}

/// The mountpoint id of 64 random bits: from 1 (0 asks Janus to pick) to [`MOST_ID`].
fn id_of(bits: u64) -> u64 {
    bits % MOST_ID + 1
}

/// Mountpoint `id`'s secret as derived from the admin key: HMAC-SHA256, in hex.
fn mountpoint_secret(admin_key: &str, id: u64) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(admin_key.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(format!("qwencodec mountpoint {id}").as_bytes());
    data_encoding::HEXLOWER.encode(&mac.finalize().into_bytes())
}

/// A token Janus (`token_auth_secret`) takes until `expires` (Unix seconds) for the Streaming
/// plugin alone: `EXPIRES,janus,janus.plugin.streaming:` and the base64 HMAC-SHA1 of that.
fn listener_token(secret: &str, expires: u64) -> String {
    let signed = format!("{expires},janus,janus.plugin.streaming");
    let mut mac = Hmac::<Sha1>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(signed.as_bytes());
    format!(
        "{signed}:{}",
        data_encoding::BASE64.encode(&mac.finalize().into_bytes())
    )
}

impl Drop for Mountpoint {
    /// Destroys the mountpoint on a task of its own (`Janus::settle` waits for it).
    fn drop(&mut self) {
        let (janus, id, secret) = (self.janus.clone(), self.id, self.secret.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            log!("Janus: mountpoint {id} not destroyed: no runtime to call Janus on");
            return;
        };
        let destroy = runtime.spawn({
            let janus = janus.clone();
            async move {
                if let Err(err) = janus.destroy_mountpoint(id, &secret).await {
                    log!("Janus: mountpoint {id} not destroyed: {err}");
                }
            }
        });
        let mut destroying = janus.destroying.lock().unwrap();
        destroying.retain(|destroy| !destroy.is_finished());
        destroying.push(destroy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rtp_goes_to_the_apis_host() {
        let host =
            |api: &str| Janus::new(api, None, true, Secrets::default(), None).map(|janus| janus.rtp_address);
        let address = |text: &str| text.parse::<IpAddr>().unwrap();
        assert_eq!(
            host("http://198.51.100.1:8088/janus").unwrap(),
            address("198.51.100.1")
        );
        assert!(host("http://localhost/janus").unwrap().is_loopback());
        assert_eq!(
            host("http://[2001:db8::1]:8088/janus").unwrap(),
            address("2001:db8::1")
        );
        assert!(host("https://janus.example/janus").is_err());
        assert!(host("http:///janus").is_err());
        let unknown = host("http://no-such-host.invalid:8088/janus").err().unwrap();
        assert_eq!(
            unknown,
            "--janus http://no-such-host.invalid:8088/janus: no-such-host.invalid has no address"
        );
    }

    /// The token's form is Janus's `janus_auth_check_signature_contains`'s; the figures are
    /// Python's `hmac` over the same text.
    #[test]
    fn listener_tokens_and_mountpoint_secrets_are_as_janus_and_a_later_run_make_them() {
        assert_eq!(
            listener_token("janus-token-secret", 1_700_000_000),
            "1700000000,janus,janus.plugin.streaming:SJLt65FWC3YpWwCzTX01OmpK/aQ="
        );
        assert_eq!(
            mountpoint_secret("admin-key", 42),
            "4247dde1bc1687cd4d0c343dea414aa31731f5046d5775772ee47654a0716203"
        );
        assert_ne!(
            mountpoint_secret("admin-key", 43),
            mountpoint_secret("admin-key", 42)
        );
    }

    /// janus.js holds ids in a JavaScript number: up to `Number.MAX_SAFE_INTEGER`, never 0.
    #[test]
    fn mountpoint_ids_are_spread_over_what_janus_js_holds_exactly() {
        assert_eq!(MOST_ID, 9_007_199_254_740_991);
        assert_eq!(id_of(0), 1);
        assert_eq!(id_of(MOST_ID - 1), MOST_ID);
        assert_eq!(id_of(MOST_ID), 1);
        assert_eq!(id_of(u64::MAX), u64::MAX % MOST_ID + 1);
        let ids: Vec<u64> = (0..1000).map(|_| random_id().unwrap()).collect();
        assert!(ids.iter().all(|id| (1..=MOST_ID).contains(id)));
        // 1000 draws all below half the range: a chance of 2^-1000.
        assert!(ids.iter().any(|&id| id > MOST_ID / 2), "{ids:?}");
    }

    /// The secret a later run derives when there is an admin key; a fresh random one each
    /// mountpoint without.
    #[test]
    fn a_mountpoints_secret_is_derived_from_the_admin_key_or_random() {
        let janus = |admin_key: Option<&str>| {
            let secrets = Secrets {
                admin_key: admin_key.map(str::to_owned),
                ..Secrets::default()
            };
            Janus::new("http://198.51.100.1:8088/janus", None, true, secrets, None).unwrap()
        };
        assert_eq!(
            janus(Some("admin-key")).mountpoint_secret(42).unwrap(),
            mountpoint_secret("admin-key", 42)
        );
        let keyless = janus(None);
        let (one, two) = (
            keyless.mountpoint_secret(42).unwrap(),
            keyless.mountpoint_secret(42).unwrap(),
        );
        assert_eq!(one.len(), 32, "{one}");
        assert!(one.chars().all(|c| c.is_ascii_hexdigit()), "{one}");
        assert_ne!(one, two);
    }

    /// The listener's token opens Janus for [`LISTENER_TOKEN_TTL`], twelve hours from now.
    #[test]
    fn a_listeners_token_expires_twelve_hours_after_the_link_is_made() {
        let secrets = Secrets {
            token_secret: Some("janus-token-secret".into()),
            ..Secrets::default()
        };
        let janus = Janus::new("http://198.51.100.1:8088/janus", None, true, secrets, None).unwrap();
        let now = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        let before = now();
        let path = janus.listen_path(7).unwrap();
        let after = now();
        let token = path.split_once("#token=").unwrap().1;
        let token: String = form_urlencoded::parse(format!("t={token}").as_bytes())
            .next()
            .unwrap()
            .1
            .into_owned();
        let expires: u64 = token.split_once(',').unwrap().0.parse().unwrap();
        assert!(
            (before + 12 * 3600..=after + 12 * 3600).contains(&expires),
            "{token} made between {before} and {after}"
        );
        assert_eq!(token, listener_token("janus-token-secret", expires));
    }

    /// What the log says of how Janus is called, for its operator to check.
    #[test]
    fn the_log_says_which_secrets_janus_is_called_with() {
        let secrets = Secrets {
            api_secret: Some("s".into()),
            token_secret: Some("t".into()),
            ..Secrets::default()
        };
        let janus = Janus::new("http://198.51.100.1:8088/janus", None, true, secrets, None).unwrap();
        assert_eq!(
            janus.describe(),
            "with its API secret, without an admin key, listeners with tokens it signs; \
             private mountpoints taking RTP on 198.51.100.1 alone"
        );
    }

    /// Without an admin key no leftover can be listed: an error, not "none left".
    #[tokio::test]
    async fn leftovers_are_not_called_none_without_an_admin_key() {
        let janus = Janus::new(
            "http://198.51.100.1:8088/janus",
            None,
            true,
            Secrets::default(),
            None,
        )
        .unwrap();
        let err = janus.destroy_leftovers().await.err().unwrap();
        assert!(err.contains("--janus-admin-key-file"), "{err}");
    }

    /// A Janus that takes the connection and never answers: each call gives up after
    /// [`API_TIMEOUT`], as an error.
    async fn silent_janus() -> (tokio::net::TcpListener, Arc<Janus>) {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api = format!("http://{}/janus", silent.local_addr().unwrap());
        let janus = Janus::new(&api, None, true, Secrets::default(), None).unwrap();
        (silent, janus)
    }

    #[tokio::test]
    async fn a_call_no_janus_answers_is_an_error() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api = format!("http://{}/janus", closed.local_addr().unwrap());
        drop(closed);
        let janus = Janus::new(&api, None, true, Secrets::default(), None).unwrap();
        let err = janus.streaming(json!({"request": "list"})).await.err().unwrap();
        assert!(err.starts_with(&format!("Janus at {api}: ")), "{err}");
        let err = janus.call(&api, json!({"janus": "create"})).await.err().unwrap();
        assert!(err.starts_with(&format!("Janus at {api}: ")), "{err}");
    }

    /// A dropped mountpoint is destroyed on a task of its own, which a shutdown's `settle`
    /// waits for; those still calling Janus are kept, each counted when patience runs out.
    #[tokio::test]
    async fn dropped_mountpoints_are_destroyed_and_a_shutdown_waits_for_them() {
        let (_silent, janus) = silent_janus().await;
        assert_eq!(janus.settle(Duration::from_millis(10)).await, 0);
        for id in [1, 2] {
            drop(Mountpoint {
                id,
                secret: "secret".into(),
                host: "127.0.0.1".into(),
                port: 5000,
                janus: janus.clone(),
            });
        }
        assert_eq!(janus.destroying.lock().unwrap().len(), 2);
        assert_eq!(janus.settle(Duration::from_millis(50)).await, 2);
        assert!(janus.destroying.lock().unwrap().is_empty());
    }

    #[test]
    fn the_mountpoints_take_rtp_on_the_apis_address_and_name_no_one() {
        let secrets = Secrets {
            token_secret: Some("janus-token-secret".into()),
            ..Secrets::default()
        };
        let janus = Janus::new("http://198.51.100.1:8088/janus", None, true, secrets, Some("a")).unwrap();
        assert_eq!(janus.rtp_address, IpAddr::from([198, 51, 100, 1]));
        assert_eq!(janus.description, "qwencodec broadcast a");
        let path = janus.listen_path(7).unwrap();
        let (query, token) = path.split_once("#token=").unwrap();
        assert_eq!(
            query,
            "/broadcast.html?mountpoint=7&janus=http%3A%2F%2F198.51.100.1%3A8088%2Fjanus"
        );
        assert!(token.contains("%2Cjanus%2Cjanus.plugin.streaming%3A"), "{token}");
        let localhost = Janus::new(
            "http://localhost:8088/janus",
            None,
            true,
            Secrets::default(),
            None,
        )
        .unwrap();
        assert!(localhost.rtp_address.is_loopback(), "{}", localhost.rtp_address);
        assert!(
            !localhost.listen_path(7).unwrap().contains('#'),
            "no token secret, no token"
        );
        assert_eq!(localhost.description, "qwencodec broadcast");
    }

    #[test]
    fn janus_secrets_come_from_files_or_the_environment_and_are_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("api-secret");
        std::fs::write(&file, "s3cret\n").unwrap();
        let secrets = Secrets::read(Some(&file), None, None).unwrap();
        assert_eq!(secrets.api_secret.as_deref(), Some("s3cret"));
        std::fs::write(&file, " \n").unwrap();
        let err = Secrets::read(Some(&file), None, None).err().unwrap();
        assert_eq!(err, format!("{}: the secret is empty", file.display()));
        let missing = dir.path().join("missing");
        assert!(Secrets::read(None, Some(&missing), None).is_err());
    }
}
