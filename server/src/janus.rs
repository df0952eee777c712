//! Janus as a broadcast's fan-out (`--janus`): each broadcast gets a mountpoint of Janus's
//! Streaming plugin, made through Janus's HTTP API and destroyed when the broadcast ends. The
//! server sends the mountpoint plain RTP (Opus), once, to the port Janus opened for it; Janus
//! answers each listener's WebRTC (ICE, DTLS, SRTP) and copies the packets to every one.
//!
//! Why a Streaming mountpoint (docs/server.md, "Broadcasts through Janus"): it is
//! Janus's own one-source-many-viewers primitive, it takes RTP that GStreamer 1.22's `udpsink`
//! sends as it is, and it costs the server no peer connection of its own per broadcast.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::log::log;
use crate::random::random_hex;

/// How long one call to Janus's API may take.
const API_TIMEOUT: Duration = Duration::from_secs(5);
/// The Opus payload type the mountpoint takes, as the server's payloader sends it.
const OPUS_PT: u8 = 96;

/// A Janus server's HTTP API (`http://host:port/janus`), and what listeners are told of it.
pub struct Janus {
    api: String,
    /// Where the mountpoints' RTP goes: the API's host.
    rtp_host: String,
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
    pub host: String,
    pub port: u16,
    janus: Arc<Janus>,
}

impl Janus {
    /// `api`: the HTTP API's URL, `http://host:port/path` (plain HTTP: Janus's API belongs on
    /// the private network it shares with the server).
    pub fn new(api: &str, public: Option<String>, fec: bool) -> Result<Arc<Self>, String> {
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
        Ok(Arc::new(Self {
            api: api.trim_end_matches('/').to_owned(),
            rtp_host,
            public: public.unwrap_or_else(|| api.to_owned()),
            fec,
            client: Client::builder(TokioExecutor::new()).build_http(),
            destroying: Mutex::default(),
        }))
    }

    pub fn api(&self) -> &str {
        &self.api
    }

    /// A new mountpoint for one broadcast's audio, described as `description`.
    pub async fn create_mountpoint(self: &Arc<Self>, description: &str) -> Result<Mountpoint, String> {
        let mut audio = json!({"type": "audio", "mid": "a", "port": 0, "pt": OPUS_PT, "codec": "opus"});
        if self.fec {
            audio["fmtp"] = json!("useinbandfec=1");
        }
        let created = self
            .streaming(json!({
                "request": "create",
                "type": "rtp",
                "description": description,
                "permanent": false,
                "media": [audio],
            }))
            .await?;
        let stream = &created["stream"];
        let id = stream["id"].as_u64();
        let port = stream["ports"]
            .as_array()
            .and_then(|ports| ports.iter().find(|port| port["type"] == "audio"))
            .and_then(|port| port["port"].as_u64())
            .and_then(|port| u16::try_from(port).ok());
        match (id, port) {
            (Some(id), Some(port)) => Ok(Mountpoint {
                id,
                host: self.rtp_host.clone(),
                port,
                janus: self.clone(),
            }),
            _ => Err(format!(
                "Janus made a mountpoint without an id or an audio port: {created}"
            )),
        }
    }

    async fn destroy_mountpoint(&self, id: u64) -> Result<(), String> {
        self.streaming(json!({"request": "destroy", "id": id}))
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

    /// One POST of `message` (a transaction id added) to `url`: Janus's answer, or its error.
    async fn call(&self, url: &str, mut message: Value) -> Result<Value, String> {
        message["transaction"] = json!(random_hex(8)?);
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

impl Drop for Mountpoint {
    /// Destroys the mountpoint on a task of its own (`Janus::settle` waits for it).
    fn drop(&mut self) {
        let (janus, id) = (self.janus.clone(), self.id);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            log!("Janus: mountpoint {id} not destroyed: no runtime to call Janus on");
            return;
        };
        let destroy = runtime.spawn({
            let janus = janus.clone();
            async move {
                if let Err(err) = janus.destroy_mountpoint(id).await {
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
        let host = |api: &str| Janus::new(api, None, true).map(|janus| janus.rtp_host.clone());
        assert_eq!(host("http://198.51.100.1:8088/janus").unwrap(), "198.51.100.1");
        assert_eq!(host("http://janus.internal/janus").unwrap(), "janus.internal");
        assert_eq!(host("http://[2001:db8::1]:8088/janus").unwrap(), "2001:db8::1");
        assert!(host("https://janus.example/janus").is_err());
        assert!(host("http:///janus").is_err());
    }
}
