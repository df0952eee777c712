//! A TTS media server: codec frames come in over a WebSocket from a TTS process, each browser
//! session hears its own speech over WebRTC.
//!
//! ```text
//! TTS process --ws /codes?session=ID (token)--> ingress --appsrc--> session pipeline --WebRTC--> browser
//!   (or its frames as RTP packets: /codes?session=ID&transport=rtp names a UDP port, rtp_ingress)
//! browser --ws /signal (JSON: join, SDP, ICE)--> signalling --> session pipeline
//!
//! session pipeline: appsrc ! qwencodecdec ! audioconvert ! audioresample ! opusenc
//!                     ! rtpopuspay ! clocksync ! webrtcbin
//!
//! qwencodec-server [--bind 127.0.0.1:8080] [--model DIR] [--device auto|cpu|cuda]
//!     [--dtype f32|f16|bf16] [--chunk-frames N] ... (--help lists them all)
//! ```
//!
//! One process serves the page (`/`), the browsers' signalling (`/signal`), the codes ingress
//! (`/codes`) and a status document (`/status`: sessions, live pipelines and the capacity). Every session's
//! decoder is an element of its own on the one model the server loaded at start. docs/server-protocol.md
//! has the message formats and the refusals.

mod access;
mod admission;
mod broadcast;
mod connections;
mod http;
mod ice;
mod ingress;
mod janus;
mod liveness;
mod metrics;
mod opus;
// The command-line parser and the WebRTC helpers that the plugin's examples use too.
#[path = "../../examples/common/options.rs"]
#[allow(dead_code)]
mod options;
mod protocol;
mod random;
mod rtp_ingress;
mod session;
mod session_loop;
mod signalling;
mod token;
#[path = "../../examples/common/webrtc.rs"]
#[allow(dead_code)]
mod webrtc;

use std::error::Error;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use connections::Connections;
use gstqwencodec::model::{CheckpointFiles, DecoderConfig, Dtype, Model, parse_device};
use metrics::Metrics;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use session::{CodecFormat, Sessions};

/// A line in the server's log.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => { println!("qwencodec-server: {}", format!($($arg)*)) };
}

/// What every connection handler needs.
pub struct Server {
    pub sessions: Sessions,
    pub token: String,
    pub max_message_bytes: usize,
    /// How long a new connection may stay silent before it is closed (its request head too).
    pub idle_timeout: Duration,
    /// When a browser or a sender that answers nothing is gone (see `liveness`).
    pub peer_times: liveness::PeerTimes,
    /// Origins besides the server's own whose pages may open `/signal`.
    pub allowed_origins: Vec<String>,
    /// The hosts a request may name (`--allow-host`); empty: any.
    pub allowed_hosts: Vec<String>,
    /// Who may join a session, and how many and how often each client.
    pub joins: access::JoinPolicy,
    /// A 1:1 NAT's public address (`--public-address`), which an RTP sender is told to send to.
    pub public_address: Option<IpAddr>,
    pub metrics: Arc<Metrics>,
    /// What a sender's codes over RTP are (`/codes?...&transport=rtp`).
    pub rtp_format: rtp_ingress::RtpFormat,
    /// The STUN and TURN servers the page's peer connection is given (`RTCIceServer`s).
    pub browser_ice_servers: serde_json::Value,
    /// Where broadcasts go (`--janus`), if anywhere.
    pub janus: Option<Arc<janus::Janus>>,
    /// janus.js for the broadcast listener page (`--janus-js`), if it was found.
    janus_js: Option<String>,
    connections: Arc<Connections>,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("qwencodec-server: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The bundled test checkpoint (random weights: noise, but every part of the server is real).
fn default_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/release-tiny")
}

const USAGE: &str = "\
qwencodec-server: a TTS media server. A TTS process sends codec frames over a WebSocket (/codes), or
as RTP packets (/codes?session=ID&transport=rtp names the port), each browser session (/ ,
/signal) hears its own speech over WebRTC.

qwencodec-server [--bind 127.0.0.1:8080] [--model DIR] [--device auto|cpu|cuda|cuda:N]
    [--dtype f32|f16|bf16] [--chunk-frames 1] [--token TOKEN | --token-file FILE]
    [--join-secret-file FILE] [--allow-host HOST,...] [--max-sessions 16]
    [--max-sessions-per-address 8] [--max-joins-per-minute 20]
    [--codes-bind ADDRESS:PORT] [--max-codes-connections 64]
    [--max-message-bytes 65536] [--idle-timeout 10] [--allow-origin ORIGIN,...]
    [--ping-interval 5] [--peer-timeout 15] [--connect-timeout 20]
    [--max-connections 256] [--max-connections-per-address 32] [--instance NAME]
    [--drain-timeout 30]
    [--admission measured|off] [--admission-margin 0.2] [--cores N] [--ice-address ADDRESS,...] [--ice-interfaces NAME,...]
    [--public-address ADDRESS] [--stun stun://HOST:PORT] [--turn turn://HOST:PORT,...]
    [--turn-credentials FILE] [--opus-bitrate BPS] [--opus-fec on|off] [--opus-dtx on|off]
    [--janus http://HOST:PORT/janus] [--janus-public URL] [--janus-js FILE]

  --bind               address and port to serve on (127.0.0.1:8080)
  --model              decoder checkpoint folder (the bundled test checkpoint)
  --device             where to decode (auto: CUDA when there is a GPU)
  --dtype              precision of the decoder (f32)
  --chunk-frames       frames per decode step (1)
  --token              the codes ingress's bearer token (generated and printed; one given is
                       not printed)
  --token-file         a file holding the codes ingress's bearer token
  --join-secret-file   a file holding the join secret (else the environment's
                       QWENCODEC_JOIN_SECRET), 16 bytes or more: a browser joins with a token the
                       application's backend signed with it, which names the session
                       (docs/server-protocol.md), and /signal needs an Origin; without one
                       anyone may join (a demo)
  --allow-host         the hosts (HOST or HOST:PORT, comma-separated) a request may name in its
                       Host header, against DNS rebinding; others are answered 403 (any)
  --max-sessions-per-address
                       sessions open at once from one client (an IPv6 /64); 4429 past it (8;
                       0: no cap)
  --max-joins-per-minute
                       joins from one client (an IPv6 /64) a minute, in bursts of as many;
                       4429 past it (20; 0: no limit)
  --codes-bind         serve /codes on this address alone, with connection caps of its own (the
                       TTS side never waits for the public side's); /codes on --bind is then
                       answered 404 (/codes on --bind)
  --max-codes-connections
                       connections open at once on --codes-bind (64)
  --max-sessions       sessions at once; the next is refused with 4429 (16)
  --admission          measured: at most as many sessions as the decoder serves in real time,
                       measured at start from its own steps (a step of every session within
                       75 % of its frames' time), and none while the server is behind now (audio
                       late at the sender, decode steps left waiting, or the decoder's real-time
                       margin below --admission-margin, over the last 3 s); off: --max-sessions
                       alone (measured)
  --admission-margin   the decoder's real-time margin (1 less its load: /status) below which a
                       new session is refused, with --admission measured (0.2)
  --cores              the host's cores this server may take (its decoder computes on as many
                       threads, and its capacity is measured so), for several servers on one
                       host (all of them)
  --max-message-bytes  largest WebSocket message (65536)
  --idle-timeout       seconds a new connection may stay silent, its request head included (10)
  --ping-interval      seconds between the server's pings to each browser and sender (5)
  --peer-timeout       seconds a browser or sender may answer nothing (no pong, no message)
                       before it is taken for gone: a browser's session ends, a sender loses
                       its slot; also how long a peer connection may stay ICE-disconnected (15)
  --connect-timeout    seconds a session's peer connection has to connect (ICE) after its
                       join; past it the session ends (20)
  --allow-origin       origins (scheme://host:port, comma-separated) besides the server's own
                       whose pages may open /signal (none)
  --max-connections    connections open at once; more are answered 503 (256)
  --max-connections-per-address
                       connections open at once from one client address (an IPv6 /64) (32)
  --ice-address        gather ICE host candidates on these addresses alone (every interface but
                       loopback: a browser on another host reaches them); 127.0.0.1 for a
                       server and browser on one machine
  --ice-interfaces     gather on these interfaces' addresses alone (read at start)
  --public-address     behind a 1:1 NAT (a cloud VM): the public address, announced to browsers
                       in place of the host candidates' own, and to RTP codes senders
  --stun               a STUN server (stun://HOST:PORT), for webrtcbin and the page
  --turn               TURN servers (turn://HOST:PORT, turn://HOST:PORT?transport=tcp,
                       turns://HOST:PORT), for webrtcbin and the page
  --turn-credentials   a file holding the TURN servers' username:password (else the environment's
                       QWENCODEC_TURN_CREDENTIALS); the page is given them too
  --opus-bitrate       the speech's Opus bitrate in bits a second (opusenc's default)
  --opus-fec           in-band FEC, sized by the loss the listener's RTCP reports give (on)
  --opus-dtx           no packets in silence (off: the lead-in of silence before a session's
                       first speech is what a browser loses of a new connection's first audio)
  --instance           letters and digits before every session id (NAME-...), for a router
                       in front of several servers to send /codes where the session is
  --drain-timeout      seconds a draining server (SIGTERM) waits for its sessions' speech to
                       play before it ends the sessions left (30)
  --janus              Janus's HTTP API: /broadcast (TTS side, bearer token) opens a broadcast,
                       a session whose speech goes as RTP to a mountpoint of Janus's Streaming
                       plugin made for it, which Janus serves to every listener (none)
  --janus-public       Janus's HTTP API as listeners' pages reach it (--janus)
  --janus-js           janus.js, served as /janus.js to the page /broadcast.html
                       (/usr/share/javascript/janus-gateway/janus.js, Debian's
                       libjs-janus-gateway)

SIGTERM or SIGINT: the server drains. It takes no new session (a new /signal is answered 503, a
join 4503, /status says \"draining\": a router sends joins to another server), and ends each
session once its speech has played (its sender sent end or left, its audio out), an idle one at
once, whatever is left after --drain-timeout; then it exits 0. A second signal ends every
session at once.

docs/server-protocol.md has the protocol and the refusals.
";

/// With RUST_BACKTRACE set, a GLib warning or critical (the tests make them fatal with
/// G_DEBUG=fatal_warnings) is logged with the backtrace of the thread that raised it, so that a
/// rare one says where it came from.
fn backtrace_glib_warnings() {
    if std::env::var_os("RUST_BACKTRACE").is_none() {
        return;
    }
    glib::log_set_writer_func(|level, fields| {
        if matches!(
            level,
            glib::LogLevel::Error | glib::LogLevel::Critical | glib::LogLevel::Warning
        ) {
            let backtrace = std::backtrace::Backtrace::force_capture();
            eprintln!("qwencodec-server: a GLib {level:?} raised at:\n{backtrace}");
        }
        glib::log_writer_default(level, fields)
    });
}

fn run() -> Result<(), Box<dyn Error>> {
    let mut options = options::Options::from_env();
    if options.take_help() {
        print!("{USAGE}");
        return Ok(());
    }
    let bind: SocketAddr = options.take_parsed("--bind", "127.0.0.1:8080".parse()?)?;
    let model_path = options.take("--model")?.map_or_else(default_model, PathBuf::from);
    let device = options.take("--device")?.unwrap_or_else(|| "auto".into());
    let dtype: Dtype = options.take_parsed("--dtype", Dtype::F32)?;
    let chunk_frames: u32 = options.take_parsed("--chunk-frames", 1)?;
    // Where the codes token came from: None when made here (then it is printed).
    let (token, token_source) = match (options.take("--token")?, options.take("--token-file")?) {
        (Some(_), Some(_)) => return Err("give --token or --token-file, not both".into()),
        (Some(token), None) => (token, Some("--token")),
        (None, Some(file)) => {
            let text = std::fs::read_to_string(&file).map_err(|err| format!("--token-file {file}: {err}"))?;
            (text.trim().to_owned(), Some("--token-file"))
        }
        (None, None) => (random::random_hex(16)?, None),
    };
    if token.is_empty() {
        return Err("the codes token must not be empty".into());
    }
    let join_secret_file = options.take("--join-secret-file")?;
    let join_secret = token::JoinSecret::read(join_secret_file.as_deref().map(Path::new))?;
    let allowed_hosts: Vec<String> = options.take_list("--allow-host", &[])?;
    if allowed_hosts.iter().any(String::is_empty) {
        return Err("--allow-host: an empty host".into());
    }
    let max_sessions_per_address: usize = options.take_parsed("--max-sessions-per-address", 8)?;
    let max_joins_per_minute: u32 = options.take_parsed("--max-joins-per-minute", 20)?;
    let codes_bind: Option<SocketAddr> = options.take_optional("--codes-bind")?;
    let max_codes_connections: usize = options.take_parsed("--max-codes-connections", 64)?;
    let max_sessions: usize = options.take_parsed("--max-sessions", 16)?;
    let max_message_bytes: usize = options.take_parsed("--max-message-bytes", 64 * 1024)?;
    let idle_timeout: f64 = options.take_parsed("--idle-timeout", 10.0)?;
    let peer_times = liveness::PeerTimes::from_seconds(
        options.take_parsed("--ping-interval", 5.0)?,
        options.take_parsed("--peer-timeout", 15.0)?,
        options.take_parsed("--connect-timeout", 20.0)?,
    )?;
    let allowed_origins: Vec<String> = options
        .take("--allow-origin")?
        .map(|list| list.split(',').map(|origin| origin.trim().to_owned()).collect())
        .unwrap_or_default();
    let max_connections: usize = options.take_parsed("--max-connections", 256)?;
    let max_per_address: usize = options.take_parsed("--max-connections-per-address", 32)?;
    let instance = options.take("--instance")?;
    let drain_timeout: f64 = options.take_parsed("--drain-timeout", 30.0)?;
    let admission = options.take("--admission")?.unwrap_or_else(|| "measured".into());
    let margin_floor: f64 = options.take_parsed("--admission-margin", admission::DEFAULT_MARGIN_FLOOR)?;
    let cores: Option<usize> = options.take_optional("--cores")?;
    let ice = Arc::new(ice::Ice::from_options(&mut options)?);
    let opus = opus::OpusSettings::from_options(&mut options)?;
    let janus_api = options.take("--janus")?;
    let janus_public = options.take("--janus-public")?;
    let janus_js_path = options
        .take("--janus-js")?
        .unwrap_or_else(|| DEBIAN_JANUS_JS.into());
    if let Some(instance) = &instance
        && (instance.is_empty() || !instance.chars().all(|c| c.is_ascii_alphanumeric()))
    {
        return Err("--instance takes letters and digits".into());
    }
    options.finish()?;
    let janus = janus_api
        .map(|api| janus::Janus::new(&api, janus_public, opus.fec))
        .transpose()?;
    // Read once: the page needs it only where broadcasts go out.
    let janus_js = match &janus {
        Some(_) => Some(
            std::fs::read_to_string(&janus_js_path)
                .map_err(|err| format!("--janus-js {janus_js_path}: {err}"))?,
        ),
        None => None,
    };
    if !drain_timeout.is_finite() || drain_timeout < 0.0 {
        return Err("--drain-timeout must be 0 or above".into());
    }
    if !idle_timeout.is_finite() || idle_timeout <= 0.0 {
        return Err("--idle-timeout must be above 0".into());
    }
    if !(margin_floor.is_finite() && margin_floor <= 1.0) {
        return Err("--admission-margin must be 1 or below".into());
    }
    let host_cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    if let Some(cores) = cores
        && !(1..=host_cores).contains(&cores)
    {
        return Err(format!("--cores takes 1 to {host_cores}, the cores this host has").into());
    }

    backtrace_glib_warnings();
    gst::init()?;
    gstqwencodec::plugin_register_static()?;
    let config =
        CheckpointFiles::locate(&model_path).and_then(|files| DecoderConfig::from_file(&files.config))?;
    // Loaded once here and held: every session's decoder shares this copy, and a bad model
    // or device fails the start instead of the first session.
    let model = Model::shared(&model_path, parse_device(&device)?, dtype)?;
    let dtype_note = gstqwencodec::model::dtype_note(dtype, model.device());
    // Before the capacity is measured: it is measured on the threads the decoder will have.
    // One server decodes for all its sessions: its threads are its own to spin. Several decoding
    // processes on one host each take a share of the cores (--cores), which a spin cannot starve.
    let threads = match cores {
        Some(cores) => model.limit_compute_threads(cores),
        None => model.compute_threads(),
    };
    let share = cores.map_or_else(|| "all".to_owned(), |cores| format!("--cores {cores} of"));
    log!(
        "the decoder computes on {threads} threads ({share} the host's {host_cores} cores); {}",
        gstqwencodec::model::wait_policy()
    );
    let frame = Duration::from_secs_f64(config.samples_per_frame() as f64 / config.sample_rate as f64);
    let max_sessions = match admission.as_str() {
        "measured" => {
            let (served, steps) =
                admission::real_time_capacity(&model, chunk_frames as usize, frame, max_sessions)?;
            let steps: Vec<String> = steps
                .iter()
                .map(|step| format!("{:.1}", step.as_secs_f64() * 1e3))
                .collect();
            log!(
                "admission: {served} sessions served in real time (warm steps of 1, 2, ... rows: {} ms; budget {:.0} ms)",
                steps.join(", "),
                frame.as_secs_f64() * 1e3 * chunk_frames as f64 * admission::STEP_BUDGET
            );
            served
        }
        "off" => max_sessions,
        other => return Err(format!("--admission takes measured or off, not {other:?}").into()),
    };
    let timed = admission::time_session_batches(&model, chunk_frames as usize, max_sessions)?;
    let timed: Vec<String> = timed
        .iter()
        .map(|(rows, step)| format!("{rows} rows {:.1} ms", step.as_secs_f64() * 1e3))
        .collect();
    log!(
        "the sessions' decoders count batches of {} in their latency (timed now, not while sessions play)",
        timed.join(", ")
    );
    let capacity = Arc::new(admission::Capacity::new(
        max_sessions,
        admission == "measured",
        margin_floor,
        frame,
    ));
    if admission == "measured" {
        log!(
            "admission: no session while the server is behind (late audio, decode steps left waiting, the real-time margin below {margin_floor}, over the last {} s)",
            admission::WINDOW.as_secs()
        );
    }
    let metrics = Metrics::new(model.clone(), capacity);
    let format = CodecFormat::new(&config);
    let rtp_format = rtp_ingress::RtpFormat::new(&config);

    let listener = TcpListener::bind(bind)?;
    let address = listener.local_addr()?;
    let codes_listener = codes_bind.map(TcpListener::bind).transpose()?;
    let codes_address = match &codes_listener {
        Some(codes_listener) => codes_listener.local_addr()?,
        None => address,
    };
    let joins_described = match &join_secret {
        Some(_) => format!(
            "a join token signed with the join secret ({}) is required",
            join_secret_file
                .as_deref()
                .map_or(format!("${}", token::SECRET_VARIABLE), |file| format!(
                    "--join-secret-file {file}"
                ))
        ),
        None => "open to anyone who reaches /signal (no join secret: a demo)".to_owned(),
    };
    let server = Arc::new(Server {
        sessions: Sessions::new(
            session::PipelineSettings {
                model: model_path.clone(),
                device: device.clone(),
                dtype,
                chunk_frames,
                format,
                certificate: Arc::new(webrtc::DtlsCertificate::generate()?),
                ice: ice.clone(),
                opus: opus.clone(),
                metrics: metrics.clone(),
                instance,
                _model: model,
            },
            max_sessions,
        ),
        token,
        max_message_bytes,
        idle_timeout: Duration::from_secs_f64(idle_timeout),
        peer_times,
        allowed_origins,
        allowed_hosts,
        joins: access::JoinPolicy::new(join_secret, max_joins_per_minute, max_sessions_per_address),
        public_address: ice.public_address(),
        metrics,
        rtp_format,
        browser_ice_servers: ice.browser_servers(),
        janus,
        janus_js,
        connections: Connections::new(max_connections, max_per_address),
    });
    log!(
        "model {} on {device} ({dtype}), chunk-frames {chunk_frames}, at most {max_sessions} sessions",
        model_path.display()
    );
    if let Some(note) = dtype_note {
        log!("{note}");
    }
    log!("{}", ice.describe());
    log!("{}", opus.describe());
    // A token given is not printed: the log may go where the token must not.
    let bearer = match token_source {
        Some(source) => format!("<the token of {source}>"),
        None => server.token.clone(),
    };
    log!(
        "codes ingress: ws://{codes_address}/codes?session=ID with the header \"Authorization: Bearer {bearer}\""
    );
    log!(
        "joins: {joins_described}; at most {max_sessions_per_address} sessions and {max_joins_per_minute} joins a minute per client (0: no cap)"
    );
    if let Some(janus) = &server.janus {
        log!(
            "broadcasts: ws://{codes_address}/broadcast with the same header, to Janus at {} (listeners: {})",
            janus.api(),
            janus.public
        );
    }
    log!("open http://{address}/ in a browser");

    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    let mut all_connections = vec![server.connections.clone()];
    let public_side = match codes_listener {
        Some(codes_listener) => {
            let connections = Connections::new(max_codes_connections, max_codes_connections);
            all_connections.push(connections.clone());
            let server = server.clone();
            std::thread::spawn(move || accept(&server, codes_listener, &connections, Side::Codes));
            Side::Public
        }
        None => Side::Both,
    };
    std::thread::spawn({
        let server = server.clone();
        move || accept(&server, listener, &server.connections, public_side)
    });
    let signal = signals.forever().next().map_or("a signal", signal_name);
    // Draining: the listeners stay open, so that a router reads /status and retries a join
    // answered 503 elsewhere, and a session's sender may still come back for its speech. Said
    // once it holds: /status asked after the line reads "draining" (asked between a line
    // logged first and the drain, it read false once in make test).
    server.sessions.drain(DRAINING);
    log!(
        "{signal}: draining: no new session; each session ends once its speech has played, the rest after {drain_timeout} s (--drain-timeout); a second signal ends them at once"
    );
    let deadline = Instant::now() + Duration::from_secs_f64(drain_timeout);
    let why = loop {
        let left = server.sessions.close_where_speech_over(DRAIN_TAIL, SHUTTING_DOWN);
        if left == 0 {
            break SHUTTING_DOWN.to_owned();
        }
        if let Some(signal) = signals.pending().next() {
            log!("{}: ending the {left} sessions left at once", signal_name(signal));
            break format!("{SHUTTING_DOWN} (a second signal)");
        }
        if Instant::now() >= deadline {
            log!("--drain-timeout {drain_timeout} s passed: ending the {left} sessions left");
            break format!("{SHUTTING_DOWN} (--drain-timeout {drain_timeout} s passed)");
        }
        std::thread::sleep(DRAIN_POLL);
    };
    log!("shutting down");
    for connections in &all_connections {
        connections.stop();
    }
    server.sessions.close_all(&why);
    let open: usize = all_connections
        .iter()
        .map(|connections| connections.wait_for_all(SHUTDOWN_PATIENCE))
        .sum();
    log!("shut down ({open} connections still open)");
    Ok(())
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        _ => "a signal",
    }
}

/// What a listener serves: with `--codes-bind`, the public side (the page, `/signal`, the
/// status) on `--bind` and the TTS side (`/codes`) on its own; else both on the one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Public,
    Codes,
    Both,
}

/// Where Debian's libjs-janus-gateway puts janus.js.
const DEBIAN_JANUS_JS: &str = "/usr/share/javascript/janus-gateway/janus.js";

/// Why a session ends when the server stops (its browser is told with 1001, its sender 4410).
const SHUTTING_DOWN: &str = "the server is shutting down";
/// Why a join is refused while the server drains.
const DRAINING: &str = "the server is draining (shutting down): join another server";
/// How long after a session's last audio left a draining server ends it: the browser's jitter
/// buffer (its delay a fraction of this in the browser tests, docs/testing.md) has played it by
/// then, and nothing of it is cut off when the peer connection goes.
const DRAIN_TAIL: gst::ClockTime = gst::ClockTime::from_mseconds(500);
/// How often a draining server looks for sessions whose speech is over.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// How long a shutdown waits for the connections to close.
const SHUTDOWN_PATIENCE: Duration = Duration::from_secs(5);

/// Takes connections, each on a thread of its own, while `connections`' caps allow.
fn accept(server: &Arc<Server>, listener: TcpListener, connections: &Arc<Connections>, side: Side) {
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            Err(err) => {
                log!("cannot accept a connection: {err}");
                continue;
            }
        };
        let Ok(peer) = stream.peer_addr() else { continue };
        match connections.admit(peer.ip()) {
            Ok(admitted) => {
                let server = server.clone();
                std::thread::spawn(move || {
                    serve(&server, stream, peer, side);
                    drop(admitted);
                });
            }
            Err(why) => {
                log!("refused {peer}: {why}");
                server.metrics.refused(503);
                let _ = stream.set_write_timeout(Some(http::POLL));
                http::respond(
                    stream,
                    "503 Service Unavailable",
                    "text/plain",
                    &format!("{why}\n"),
                );
            }
        }
    }
}

/// One connection: a page, the status, or one of the two WebSocket endpoints, as `side` serves
/// them.
fn serve(server: &Server, stream: TcpStream, peer: SocketAddr, side: Side) {
    let request = match http::Request::read(&stream, server.idle_timeout) {
        Ok(request) => request,
        Err(err) => {
            log!("{peer}: {err}");
            return;
        }
    };
    let path = access::escaped(&request.path);
    // The TTS side: its paths carry their bearer token, which no page can put on a WebSocket.
    let codes = matches!(request.path.as_str(), "/codes" | "/broadcast");
    if codes && side == Side::Public || !codes && side == Side::Codes {
        log!("{peer}: no {path} on this listener (--codes-bind)");
        return http::respond(stream, "404 Not Found", "text/plain", "not found\n");
    }
    if !codes && !access::host_allowed(&server.allowed_hosts, request.header("host")) {
        let why = match request.header("host") {
            Some(host) => format!("host {} is not allowed (--allow-host)", access::escaped(host)),
            None => "no Host: --allow-host needs one".to_owned(),
        };
        log!("refused {peer} on {path}: 403 {why}");
        server.metrics.refused(403);
        return http::respond(stream, "403 Forbidden", "text/plain", &format!("{why}\n"));
    }
    match (request.path.as_str(), request.is_websocket()) {
        ("/signal", true) => {
            // Refused before the upgrade: a load balancer retries a 503 on another server
            // (nginx's proxy_next_upstream http_503), which a close after it cannot do.
            if let Some(why) = server.sessions.draining() {
                log!("refused {peer} on /signal: 503 {why}");
                server.metrics.refused(503);
                return http::respond(
                    stream,
                    "503 Service Unavailable",
                    "text/plain",
                    &format!("{why}\n"),
                );
            }
            match access::origin_refusal(
                request.header("origin"),
                request.header("host"),
                &server.allowed_origins,
                server.joins.requires_token(),
            ) {
                None => signalling::serve(server, request.upgrade(stream, server), peer),
                Some(why) => {
                    log!("refused {peer} on /signal: {} {why}", http::close::FORBIDDEN);
                    server.metrics.refused(http::close::FORBIDDEN);
                    if let Some(socket) = request.upgrade(stream, server) {
                        http::close(socket, http::close::FORBIDDEN, &why);
                    }
                }
            }
        }
        ("/codes", true) => ingress::serve(
            server,
            &request,
            request.upgrade(stream, server),
            &peer.to_string(),
        ),
        ("/broadcast", true) => broadcast::serve(server, &request, request.upgrade(stream, server), peer),
        ("/broadcast.html", false) => http::respond(
            stream,
            "200 OK",
            "text/html; charset=utf-8",
            include_str!("../page/broadcast.html"),
        ),
        ("/broadcast.js", false) => http::respond(
            stream,
            "200 OK",
            "text/javascript; charset=utf-8",
            include_str!("../page/broadcast.js"),
        ),
        ("/meter.js", false) => http::respond(
            stream,
            "200 OK",
            "text/javascript; charset=utf-8",
            include_str!("../page/meter.js"),
        ),
        ("/janus.js", false) if server.janus_js.is_some() => http::respond(
            stream,
            "200 OK",
            "text/javascript; charset=utf-8",
            server.janus_js.as_deref().unwrap_or_default(),
        ),
        ("/", false) | ("/index.html", false) => http::respond(
            stream,
            "200 OK",
            "text/html; charset=utf-8",
            include_str!("../page/index.html"),
        ),
        ("/app.js", false) => http::respond(
            stream,
            "200 OK",
            "text/javascript; charset=utf-8",
            include_str!("../page/app.js"),
        ),
        ("/metrics", false) => {
            let text = server
                .metrics
                .render(server.sessions.count(), session::live_pipelines());
            http::respond(stream, "200 OK", metrics::CONTENT_TYPE, &text)
        }
        ("/status", false) => {
            let sessions = server.sessions.count();
            let status = serde_json::json!({
                "sessions": sessions,
                "pipelines": session::live_pipelines(),
                "draining": server.sessions.draining().is_some(),
                "capacity": server.metrics.capacity.report(sessions),
            });
            http::respond(stream, "200 OK", "application/json", &status.to_string())
        }
        _ => {
            log!("{peer}: no {path}");
            http::respond(stream, "404 Not Found", "text/plain", "not found\n")
        }
    }
}
