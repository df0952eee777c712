//! `qwencodec-server`: its options read into a [`Config`], and the server run on them
//! (the server itself is the library, `qwencodec_server`).

use std::error::Error;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use gstqwencodec::model::Dtype;
use qwencodec_common::Options;
use qwencodec_protocol::token;
use qwencodec_server::config::{
    Admission, CODES_TOKEN_VARIABLE, Config, DEBIAN_JANUS_JS, TlsFiles, TokenSource, default_model,
    open_bind_refusal,
};
use qwencodec_server::{admission, ice, janus, liveness, opus, random};

fn main() -> ExitCode {
    let config = match read_options() {
        Ok(Some(config)) => config,
        Ok(None) => return ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("qwencodec-server: {err}");
            return ExitCode::FAILURE;
        }
    };
    match qwencodec_server::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("qwencodec-server: {err}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "\
qwencodec-server: a TTS media server. A TTS process sends codec frames over a WebSocket (/codes), or
as RTP packets (/codes?session=ID&transport=rtp names the port), each browser session (/ ,
/signal) hears its own speech over WebRTC.

qwencodec-server [--bind 127.0.0.1:8080] [--tls-cert FILE --tls-key FILE] [--model DIR] [--device auto|cpu|cuda|cuda:N]
    [--dtype f32|f16|bf16] [--chunk-frames 1] [--token-file FILE]
    [--join-secret-file FILE] [--insecure-open] [--max-token-ttl 120] [--allow-host HOST,...] [--max-sessions 16]
    [--max-sessions-per-address 8] [--max-joins-per-minute 20]
    [--codes-bind ADDRESS:PORT] [--max-codes-connections 64] [--metrics-bind ADDRESS:PORT]
    [--max-message-bytes 65536] [--idle-timeout 10] [--allow-origin ORIGIN,...]
    [--ping-interval 5] [--peer-timeout 15] [--connect-timeout 20]
    [--max-connections 256] [--max-connections-per-address 32] [--instance NAME]
    [--drain-timeout 30]
    [--admission measured|off] [--admission-margin 0.2] [--cores N] [--ice-address ADDRESS,...] [--ice-interfaces NAME,...]
    [--public-address ADDRESS] [--stun stun://HOST:PORT] [--turn turn://HOST:PORT,...]
    [--turn-secret-file FILE | --turn-credentials FILE] [--opus-bitrate BPS] [--opus-fec on|off] [--opus-dtx on|off]
    [--janus http://HOST:PORT/janus] [--janus-public URL] [--janus-js FILE]
    [--janus-api-secret-file FILE] [--janus-admin-key-file FILE] [--janus-token-secret-file FILE]
    [--trusted-proxy ADDRESS,...]
    [--rtp-srtp offered|required]

  --bind               address and port to serve on (127.0.0.1:8080); an address other hosts
                       reach needs a join secret, or --insecure-open
  --tls-cert           serve https and wss on --bind: the certificate chain, PEM, the server's
                       own first (plain http; --codes-bind stays plain)
  --tls-key            its private key, PEM
  --model              decoder checkpoint folder (the bundled test checkpoint)
  --device             where to decode (auto: CUDA when there is a GPU)
  --dtype              precision of the decoder (f32)
  --chunk-frames       frames per decode step (1)
  --token-file         a file holding the operator's bearer token, which /codes takes for any
                       session and /broadcast takes (else the environment's
                       QWENCODEC_CODES_TOKEN; else, without a join secret, one is made and
                       printed; with one, there is none). One given is not printed. No secret is
                       taken on the command line: it shows in ps
  --join-secret-file   a file holding the join secret (else the environment's
                       QWENCODEC_JOIN_SECRET), 16 bytes or more: a browser joins with a token the
                       application's backend signed with it, which names the session
                       (docs/server-protocol.md), and /signal needs an Origin; a sender feeds the
                       session with a sender token signed with it (and only with one takes it
                       over, takeover=1); without one anyone may join (a demo), which a server
                       bound to an address other hosts reach refuses to start for unless
                       --insecure-open
  --insecure-open      (no value) start without a join secret on an address other hosts reach:
                       anyone who reaches it may join any session
  --max-token-ttl      seconds: a join or sender token expiring further ahead than this is
                       refused (120); each join token opens one session, once
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
  --metrics-bind       serve /metrics and /status on this address alone (a private one: they
                       tell anyone the server's load and sessions), with connection caps of
                       their own; on --bind they are then answered 404 (on --bind)
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
  --turn-secret-file   a file holding the secret the TURN servers check REST credentials with
                       (coturn's use-auth-secret and static-auth-secret; else the environment's
                       QWENCODEC_TURN_SECRET), 16 bytes or more: each page gets its own,
                       username EXPIRY:SESSION, expiring with its join token (without join
                       tokens, --max-token-ttl after the join), and the password coturn checks
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
  --janus              Janus's HTTP API: /broadcast (TTS side, the operator's token) opens a
                       broadcast, a session whose speech goes as RTP to a mountpoint of Janus's
                       Streaming plugin made for it, which Janus serves to every listener (none)
  --janus-public       Janus's HTTP API as listeners' pages reach it (--janus)
  --janus-js           janus.js, served as /janus.js to the page /broadcast.html
                       (/usr/share/javascript/janus-gateway/janus.js, Debian's
                       libjs-janus-gateway)
  --janus-api-secret-file
                       a file holding Janus's api_secret (janus.jcfg), sent on every call (else
                       the environment's QWENCODEC_JANUS_API_SECRET)
  --janus-admin-key-file
                       a file holding the Streaming plugin's admin_key, sent to create and list
                       mountpoints (else QWENCODEC_JANUS_ADMIN_KEY); with it the mountpoints an
                       earlier run left are destroyed at start
  --janus-token-secret-file
                       a file holding Janus's token_auth_secret (else
                       QWENCODEC_JANUS_TOKEN_SECRET): each broadcast's listener page gets a
                       token for the Streaming plugin, valid 12 hours
  --trusted-proxy      proxies (addresses, comma-separated) whose X-Forwarded-For names the
                       client: its address counts in the per-address caps and the log (the
                       right-most not itself a trusted proxy); anyone else's is ignored (none)
  --rtp-srtp           offered: a sender of codes over RTP that asks (srtp=1) sends SRTP of a
                       key its WebSocket is told, others plain RTP; required: RTP without
                       srtp=1 is refused (offered)

SIGTERM or SIGINT: the server drains. It takes no new session (a new /signal is answered 503, a
join 4503, /status says \"draining\": a router sends joins to another server), and ends each
session once its speech has played (its sender sent end or left, its audio out), an idle one at
once, whatever is left after --drain-timeout; then it exits 0. A second signal ends every
session at once.

docs/server-protocol.md has the protocol and the refusals.
";

/// The server's configuration from the command line; None after `--help`.
fn read_options() -> Result<Option<Config>, Box<dyn Error>> {
    // The one option without a value.
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let insecure_open = args.iter().any(|arg| arg == "--insecure-open");
    args.retain(|arg| arg != "--insecure-open");
    let mut options = Options::from_args(args);
    if options.take_help() {
        print!("{USAGE}");
        return Ok(None);
    }
    let bind: SocketAddr = options.take_parsed("--bind", "127.0.0.1:8080".parse()?)?;
    let tls = match (options.take("--tls-cert")?, options.take("--tls-key")?) {
        (Some(certificate), Some(key)) => Some(TlsFiles {
            certificate: certificate.into(),
            key: key.into(),
        }),
        (None, None) => None,
        _ => return Err("give --tls-cert and --tls-key together".into()),
    };
    let model = options.take("--model")?.map_or_else(default_model, PathBuf::from);
    let device = options.take("--device")?.unwrap_or_else(|| "auto".into());
    let dtype: Dtype = options.take_parsed("--dtype", Dtype::F32)?;
    let chunk_frames: u32 = options.take_parsed("--chunk-frames", 1)?;
    if options.take("--token")?.is_some() {
        return Err(format!(
            "--token: a secret on the command line shows in ps; give --token-file FILE or \
             ${CODES_TOKEN_VARIABLE}"
        )
        .into());
    }
    let join_secret_file = options.take("--join-secret-file")?;
    let join_secret = token::JoinSecret::read(join_secret_file.as_deref().map(Path::new))?;
    let variable = std::env::var(CODES_TOKEN_VARIABLE).ok();
    let token = match (options.take("--token-file")?, variable) {
        (Some(file), _) => {
            let text = std::fs::read_to_string(&file).map_err(|err| format!("--token-file {file}: {err}"))?;
            Some((text.trim().to_owned(), TokenSource::Given("--token-file")))
        }
        (None, Some(text)) => Some((
            text.trim().to_owned(),
            TokenSource::Given("$QWENCODEC_CODES_TOKEN"),
        )),
        // Senders have tokens of their own: an operator's token is only where one is asked for.
        (None, None) if join_secret.is_some() => None,
        (None, None) => Some((random::random_hex(16)?, TokenSource::Made)),
    };
    if token.as_ref().is_some_and(|(token, _)| token.is_empty()) {
        return Err("the codes token must not be empty".into());
    }
    let max_token_ttl: u64 = options.take_parsed("--max-token-ttl", 120)?;
    if max_token_ttl == 0 {
        return Err("--max-token-ttl must be 1 or above".into());
    }
    let allowed_hosts: Vec<String> = options.take_list("--allow-host", &[])?;
    if allowed_hosts.iter().any(String::is_empty) {
        return Err("--allow-host: an empty host".into());
    }
    let max_sessions_per_address: usize = options.take_parsed("--max-sessions-per-address", 8)?;
    let max_joins_per_minute: u32 = options.take_parsed("--max-joins-per-minute", 20)?;
    let codes_bind: Option<SocketAddr> = options.take_optional("--codes-bind")?;
    let metrics_bind: Option<SocketAddr> = options.take_optional("--metrics-bind")?;
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
    let max_connections_per_address: usize = options.take_parsed("--max-connections-per-address", 32)?;
    let instance = options.take("--instance")?;
    let drain_timeout: f64 = options.take_parsed("--drain-timeout", 30.0)?;
    let admission = match options.take("--admission")?.as_deref() {
        None | Some("measured") => Admission::Measured,
        Some("off") => Admission::Off,
        Some(other) => return Err(format!("--admission takes measured or off, not {other:?}").into()),
    };
    let margin_floor: f64 = options.take_parsed("--admission-margin", admission::DEFAULT_MARGIN_FLOOR)?;
    let cores: Option<usize> = options.take_optional("--cores")?;
    let ice = ice::Ice::from_options(&mut options, max_token_ttl)?;
    let opus = opus::OpusSettings::from_options(&mut options)?;
    let janus_api = options.take("--janus")?;
    let janus_public = options.take("--janus-public")?;
    let janus_secrets = janus::Secrets::read(
        options.take("--janus-api-secret-file")?.as_deref().map(Path::new),
        options.take("--janus-admin-key-file")?.as_deref().map(Path::new),
        options
            .take("--janus-token-secret-file")?
            .as_deref()
            .map(Path::new),
    )?;
    let trusted_proxies: Vec<std::net::IpAddr> = options.take_list("--trusted-proxy", &[])?;
    let janus_js = options
        .take("--janus-js")?
        .unwrap_or_else(|| DEBIAN_JANUS_JS.into());
    let rtp_srtp_required = match options.take("--rtp-srtp")?.as_deref() {
        None | Some("offered") => false,
        Some("required") => true,
        Some(other) => return Err(format!("--rtp-srtp takes offered or required, not {other:?}").into()),
    };
    if let Some(instance) = &instance
        && (instance.is_empty() || !instance.chars().all(|c| c.is_ascii_alphanumeric()))
    {
        return Err("--instance takes letters and digits".into());
    }
    options.finish()?;
    if janus_api.is_some() && token.is_none() {
        return Err(format!(
            "--janus: /broadcast takes the operator's token, and with a join secret none is made: \
             give --token-file FILE or ${CODES_TOKEN_VARIABLE}"
        )
        .into());
    }
    if let Some(why) = open_bind_refusal(bind, join_secret.is_some(), insecure_open) {
        return Err(why.into());
    }
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
    Ok(Some(Config {
        bind,
        model,
        device,
        dtype,
        chunk_frames,
        token,
        join_secret,
        join_secret_file,
        max_token_ttl,
        allowed_hosts,
        max_sessions_per_address,
        max_joins_per_minute,
        codes_bind,
        metrics_bind,
        max_codes_connections,
        max_sessions,
        max_message_bytes,
        idle_timeout: std::time::Duration::from_secs_f64(idle_timeout),
        peer_times,
        allowed_origins,
        max_connections,
        max_connections_per_address,
        instance,
        drain_timeout,
        admission,
        margin_floor,
        cores,
        host_cores,
        ice,
        opus,
        janus_api,
        janus_public,
        janus_secrets,
        trusted_proxies,
        janus_js,
        tls,
        rtp_srtp_required,
    }))
}
