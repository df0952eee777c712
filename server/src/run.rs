//! The server run: its model loaded and its capacity measured, its listeners serving, until a
//! signal drains it.

use std::error::Error;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use gstqwencodec::model::{CheckpointFiles, DecoderConfig, Model, parse_device};
use qwencodec_common::webrtc;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::config::{Admission, Config, TokenSource, codes_start_lines};
use crate::connections::{Connections, TrustedProxies};
use crate::listen::{self, Tls};
use crate::log::log;
use crate::metrics::Metrics;
use crate::routes::Side;
use crate::server::Server;
use crate::session::{self, CodecFormat, Sessions};
use qwencodec_protocol::token;

use crate::{access, admission, janus, rtp_ingress};

/// Runs the server with `config` until a signal has drained it.
pub fn run(config: Config) -> Result<(), Box<dyn Error>> {
    let Config {
        bind,
        model: model_path,
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
        idle_timeout,
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
        janus_js: janus_js_path,
        tls,
        rtp_srtp_required,
    } = config;
    // Read first: a certificate that does not load fails the start at once.
    let tls = tls
        .map(|files| Tls::load(&files.certificate, &files.key))
        .transpose()?;
    let ice = Arc::new(ice);
    let janus = janus_api
        .map(|api| janus::Janus::new(&api, janus_public, opus.fec, janus_secrets, instance.as_deref()))
        .transpose()?;
    // Read once: the page needs it only where broadcasts go out.
    let janus_js = match &janus {
        Some(_) => Some(
            std::fs::read_to_string(&janus_js_path)
                .map_err(|err| format!("--janus-js {janus_js_path}: {err}"))?,
        ),
        None => None,
    };
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
    let max_sessions = match admission {
        Admission::Measured => {
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
        Admission::Off => max_sessions,
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
        admission == Admission::Measured,
        margin_floor,
        frame,
    ));
    if admission == Admission::Measured {
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
    let metrics_listener = metrics_bind.map(TcpListener::bind).transpose()?;
    // --tls-cert and --tls-key are --bind's; the TTS side on a --codes-bind of its own stays plain.
    let (http, ws) = if tls.is_some() {
        ("https", "wss")
    } else {
        ("http", "ws")
    };
    let (codes_address, codes_ws) = match &codes_listener {
        Some(codes_listener) => (codes_listener.local_addr()?, "ws"),
        None => (address, ws),
    };
    let join_secret = join_secret.map(Arc::new);
    let signed_senders = join_secret.is_some();
    let joins_described = match &join_secret {
        Some(_) => format!(
            "a join token signed with the join secret ({}), expiring within {max_token_ttl} s, \
             used once, is required",
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
        senders: access::SenderPolicy::new(
            join_secret.clone(),
            token.as_ref().map(|(token, _)| token.clone()),
            max_token_ttl,
        ),
        max_message_bytes,
        idle_timeout,
        peer_times,
        allowed_origins,
        allowed_hosts,
        joins: access::JoinPolicy::new(
            join_secret,
            max_token_ttl,
            max_joins_per_minute,
            max_sessions_per_address,
        ),
        public_address: ice.public_address(),
        metrics,
        rtp_format,
        ice: ice.clone(),
        rtp_srtp_required,
        janus,
        janus_js,
        monitoring_apart: metrics_listener.is_some(),
        connections: Connections::new(max_connections, max_connections_per_address),
        trusted_proxies: TrustedProxies::new(&trusted_proxies),
    });
    log!(
        "model {} on {device} ({dtype}), chunk-frames {chunk_frames}, at most {max_sessions} sessions",
        model_path.display()
    );
    if let Some(note) = dtype_note {
        log!("{note}");
    }
    log!("{}", ice.describe());
    if !server.trusted_proxies.is_empty() {
        log!(
            "clients behind the trusted proxies {}: their X-Forwarded-For names the client (--trusted-proxy)",
            server.trusted_proxies
        );
    }
    log!("{}", opus.describe());
    // A token given is not printed: the log may go where the token must not.
    let operator = token.map(|(token, source)| match source {
        TokenSource::Given(source) => format!("<the token of {source}>"),
        TokenSource::Made => token,
    });
    let codes_url = format!("{codes_ws}://{codes_address}/codes?session=ID");
    let shared_bind = codes_listener.is_none().then_some(address);
    for line in codes_start_lines(&codes_url, shared_bind, signed_senders, operator.as_deref()) {
        log!("{line}");
    }
    log!(
        "joins: {joins_described}; at most {max_sessions_per_address} sessions and {max_joins_per_minute} joins a minute per client (0: no cap)"
    );
    match &metrics_listener {
        Some(metrics_listener) => log!(
            "monitoring: http://{}/metrics and /status alone (--metrics-bind)",
            metrics_listener.local_addr()?
        ),
        None => log!(
            "monitoring: /metrics and /status on {address}, public (--metrics-bind puts them on a private address)"
        ),
    }
    if let Some(janus) = &server.janus {
        log!(
            "broadcasts: {codes_ws}://{codes_address}/broadcast with the same header, to Janus at {} (listeners: {})",
            janus.api(),
            janus.public
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if let Some(janus) = &server.janus {
        log!("Janus: {}", janus.describe());
        match runtime.block_on(janus.destroy_leftovers()) {
            Ok(destroyed) => log!("Janus: {destroyed} mountpoints an earlier run left destroyed"),
            Err(err) => log!("Janus: no cleanup of earlier runs' mountpoints: {err}"),
        }
    }
    // Before the line that says the server is up: from then on a signal drains it.
    let signals = {
        let _entered = runtime.enter();
        Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        }
    };
    log!("open {http}://{address}/ in a browser");

    let mut listeners = vec![(listener, server.connections.clone(), Side::Both, tls)];
    if let Some(codes_listener) = codes_listener {
        listeners[0].2 = Side::Public;
        let connections = Connections::new(max_codes_connections, max_codes_connections);
        listeners.push((codes_listener, connections, Side::Codes, None));
    }
    if let Some(metrics_listener) = metrics_listener {
        let connections = Connections::new(MONITORING_CONNECTIONS, MONITORING_CONNECTIONS);
        listeners.push((metrics_listener, connections, Side::Monitoring, None));
    }
    let served = runtime.block_on(serve(server, listeners, signals, drain_timeout));
    // A task still blocked on a pipeline does not hold the exit.
    runtime.shutdown_timeout(SHUTDOWN_PATIENCE);
    served
}

/// SIGTERM's and SIGINT's streams.
struct Signals {
    term: Signal,
    int: Signal,
}

impl Signals {
    /// The name of the next signal to come.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// Serves the listeners until a signal, then drains the sessions and shuts down. The listeners
/// take connections to the end: past the drain each is answered 503 (`Connections::stop`).
async fn serve(
    server: Arc<Server>,
    listeners: Vec<(TcpListener, Arc<Connections>, Side, Option<Tls>)>,
    mut signals: Signals,
    drain_timeout: f64,
) -> Result<(), Box<dyn Error>> {
    let all_connections: Vec<Arc<Connections>> = listeners
        .iter()
        .map(|(_, connections, _, _)| connections.clone())
        .collect();
    for (listener, connections, side, tls) in listeners {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        tokio::spawn(listen::accept(server.clone(), listener, connections, side, tls));
    }
    let signal = signals.next().await;
    // Draining: the listeners stay open, so that a router reads /status and retries a join
    // answered 503 elsewhere, and a session's sender may still come back for its speech. Said
    // once it holds: /status asked after the line reads "draining" (asked between a line
    // logged first and the drain, it read false once in make test).
    server.sessions.drain(DRAINING);
    log!(
        "{signal}: draining: no new session; each session ends once its speech has played, the rest after {drain_timeout} s (--drain-timeout); a second signal ends them at once"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(drain_timeout);
    let mut poll = tokio::time::interval(DRAIN_POLL);
    let why = loop {
        // Sessions' pipelines stop on the blocking pool.
        let sessions = server.clone();
        let left = tokio::task::spawn_blocking(move || {
            sessions
                .sessions
                .close_where_speech_over(DRAIN_TAIL, SHUTTING_DOWN)
        })
        .await?;
        if left == 0 {
            break SHUTTING_DOWN.to_owned();
        }
        tokio::select! {
            _ = poll.tick() => (),
            signal = signals.next() => {
                log!("{signal}: ending the {left} sessions left at once");
                break format!("{SHUTTING_DOWN} (a second signal)");
            }
            _ = tokio::time::sleep_until(deadline) => {
                log!("--drain-timeout {drain_timeout} s passed: ending the {left} sessions left");
                break format!("{SHUTTING_DOWN} (--drain-timeout {drain_timeout} s passed)");
            }
        }
    };
    log!("shutting down");
    for connections in &all_connections {
        connections.stop();
    }
    let closing = server.clone();
    let open = tokio::task::spawn_blocking(move || {
        closing.sessions.close_all(&why);
        all_connections
            .iter()
            .map(|connections| connections.wait_for_all(SHUTDOWN_PATIENCE))
            .sum::<usize>()
    })
    .await?;
    // The broadcasts' mountpoints, destroyed as their sessions ended.
    if let Some(janus) = &server.janus {
        let left = janus.settle(SHUTDOWN_PATIENCE).await;
        if left > 0 {
            log!("Janus: {left} mountpoints not destroyed in {SHUTDOWN_PATIENCE:?}");
        }
    }
    log!("shut down ({open} connections still open)");
    Ok(())
}

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

/// Connections open at once on `--metrics-bind`: a scraper or two, and an operator.
const MONITORING_CONNECTIONS: usize = 16;

/// How long a shutdown waits for the connections to close.
const SHUTDOWN_PATIENCE: Duration = Duration::from_secs(5);
