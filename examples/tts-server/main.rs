//! A TTS media server: codec frames come in over a WebSocket from a TTS process, each browser
//! session hears its own speech over WebRTC.
//!
//! ```text
//! TTS process --ws /codes?session=ID (token)--> ingress --appsrc--> session pipeline --WebRTC--> browser
//! browser --ws /signal (JSON: join, SDP, ICE)--> signalling --> session pipeline
//!
//! session pipeline: appsrc ! qwencodecdec ! audioconvert ! audioresample ! clocksync
//!                     ! opusenc ! rtpopuspay ! webrtcbin
//!
//! cargo run --release --example tts-server -- [--bind 127.0.0.1:8080] [--model DIR]
//!     [--device auto|cpu|cuda] [--dtype f32|f16|bf16] [--chunk-frames N] [--token TOKEN]
//!     [--max-sessions N] [--max-message-bytes N] [--idle-timeout SECONDS]
//! ```
//!
//! One process serves the page (`/`), the browsers' signalling (`/signal`), the codes ingress
//! (`/codes`) and a status document (`/status`: sessions and live pipelines). Every session's
//! decoder is an element of its own on the one model the server loaded at start. The README's
//! "Serving speech to browsers" has the message formats and the refusals.

#[path = "../common/mod.rs"]
mod common;
mod http;
mod ingress;
mod session;
mod signalling;

use std::error::Error;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use gstqwencodec::model::{CheckpointFiles, DecoderConfig, Dtype, Model, parse_device};

use session::{CodecFormat, Sessions};

/// A line in the server's log.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => { println!("tts-server: {}", format!($($arg)*)) };
}

/// What every connection handler needs.
pub struct Server {
    pub sessions: Sessions,
    pub token: String,
    pub max_message_bytes: usize,
    /// How long a new connection may stay silent before it is closed.
    pub idle_timeout: Duration,
}

fn main() -> ExitCode {
    common::exit_status("tts-server", run())
}

const USAGE: &str = "\
tts-server: a TTS media server. A TTS process sends codec frames over a WebSocket (/codes),
each browser session (/ , /signal) hears its own speech over WebRTC.

tts-server [--bind 127.0.0.1:8080] [--model DIR] [--device auto|cpu|cuda|cuda:N]
    [--dtype f32|f16|bf16] [--chunk-frames 1] [--token TOKEN] [--max-sessions 16]
    [--max-message-bytes 65536] [--idle-timeout 10]

  --bind               address and port to serve on (127.0.0.1:8080)
  --model              decoder checkpoint folder (the bundled test checkpoint)
  --device             where to decode (auto: CUDA when there is a GPU)
  --dtype              precision of the decoder (f32)
  --chunk-frames       frames per decode step (1)
  --token              the codes ingress's bearer token (generated and printed)
  --max-sessions       sessions at once; the next is refused with 4429 (16)
  --max-message-bytes  largest WebSocket message (65536)
  --idle-timeout       seconds a new connection may stay silent (10)

The README's \"Serving speech to browsers\" has the protocol and the refusals.
";

fn run() -> Result<(), Box<dyn Error>> {
    let mut options = common::Options::from_env();
    if options.take_help() {
        print!("{USAGE}");
        return Ok(());
    }
    let bind: SocketAddr = options.take_parsed("--bind", "127.0.0.1:8080".parse()?)?;
    let model_path = options
        .take("--model")?
        .map_or_else(common::default_model, PathBuf::from);
    let device = options.take("--device")?.unwrap_or_else(|| "auto".into());
    let dtype: Dtype = options.take_parsed("--dtype", Dtype::F32)?;
    let chunk_frames: u32 = options.take_parsed("--chunk-frames", 1)?;
    let token = match options.take("--token")? {
        Some(token) if token.is_empty() => return Err("--token must not be empty".into()),
        Some(token) => token,
        None => session::random_hex(16)?,
    };
    let max_sessions: usize = options.take_parsed("--max-sessions", 16)?;
    let max_message_bytes: usize = options.take_parsed("--max-message-bytes", 64 * 1024)?;
    let idle_timeout: f64 = options.take_parsed("--idle-timeout", 10.0)?;
    options.finish()?;
    if !idle_timeout.is_finite() || idle_timeout <= 0.0 {
        return Err("--idle-timeout must be above 0".into());
    }

    gst::init()?;
    gstqwencodec::plugin_register_static()?;
    let config =
        CheckpointFiles::locate(&model_path).and_then(|files| DecoderConfig::from_file(&files.config))?;
    // Loaded once here and held: every session's decoder shares this copy, and a bad model
    // or device fails the start instead of the first session.
    let model = Model::shared(&model_path, parse_device(&device)?, dtype)?;
    let format = CodecFormat::new(&config);

    let listener = TcpListener::bind(bind)?;
    let address = listener.local_addr()?;
    let server = Arc::new(Server {
        sessions: Sessions::new(
            session::PipelineSettings {
                model: model_path.clone(),
                device: device.clone(),
                dtype,
                chunk_frames,
                format,
                certificate: Arc::new(common::webrtc::DtlsCertificate::generate()?),
                _model: model,
            },
            max_sessions,
        ),
        token,
        max_message_bytes,
        idle_timeout: Duration::from_secs_f64(idle_timeout),
    });
    log!(
        "model {} on {device} ({dtype}), chunk-frames {chunk_frames}, at most {max_sessions} sessions",
        model_path.display()
    );
    log!(
        "codes ingress: ws://{address}/codes?session=ID with the header \"Authorization: Bearer {}\"",
        server.token
    );
    log!("open http://{address}/ in a browser");

    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let server = server.clone();
                std::thread::spawn(move || serve(&server, stream));
            }
            Err(err) => log!("cannot accept a connection: {err}"),
        }
    }
    Ok(())
}

/// One connection: a page, the status, or one of the two WebSocket endpoints.
fn serve(server: &Server, stream: TcpStream) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".into(), |addr| addr.to_string());
    let request = match http::Request::read(&stream, server.idle_timeout) {
        Ok(request) => request,
        Err(err) => {
            log!("{peer}: {err}");
            return;
        }
    };
    match (request.path.as_str(), request.is_websocket()) {
        ("/signal", true) => signalling::serve(server, request.upgrade(stream, server), &peer),
        ("/codes", true) => ingress::serve(server, &request, request.upgrade(stream, server), &peer),
        ("/", false) | ("/index.html", false) => http::respond(
            stream,
            "200 OK",
            "text/html; charset=utf-8",
            include_str!("page/index.html"),
        ),
        ("/app.js", false) => http::respond(
            stream,
            "200 OK",
            "text/javascript; charset=utf-8",
            include_str!("page/app.js"),
        ),
        ("/status", false) => {
            let status = serde_json::json!({
                "sessions": server.sessions.count(),
                "pipelines": session::live_pipelines(),
            });
            http::respond(stream, "200 OK", "application/json", &status.to_string())
        }
        (path, _) => {
            log!("{peer}: no {path}");
            http::respond(stream, "404 Not Found", "text/plain", "not found\n")
        }
    }
}
