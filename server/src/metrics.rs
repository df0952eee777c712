//! `GET /metrics`: the server's state and what it has done, in the OpenMetrics text format
//! (which Prometheus scrapes): sessions and pipelines, frames in, audio out, packets late at the
//! sender (underruns a listener hears), refusals by close code or HTTP status, peers taken for
//! gone and senders taken over (docs/streaming-server.md, "Peers that vanish"), the decoder's
//! batches (their step time and rows) and its queue, and the capacity: the most sessions
//! admitted, the headroom, the decoder's real-time margin and whether a join is admitted now.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use gstqwencodec::model::{BatchRun, Model};

use crate::admission::Capacity;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The OpenMetrics text format's content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Refusal {
    /// The WebSocket close code, or the HTTP status.
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RtpDropped {
    /// `address`, `port`, `ssrc`, `not-rtp` (`qwencodec_rtp_codes::Stranger`'s labels), `srtp`
    /// (failed authentication).
    why: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Lost {
    /// `browser`, `sender` or `broadcaster`.
    peer: &'static str,
    /// What showed it gone (`liveness::Gone`'s label).
    why: &'static str,
}

/// Packets of audio late at the sender: counted, and told to the admission, which refuses new
/// sessions while audio is late.
pub struct LateAudio {
    counter: Counter,
    capacity: Arc<Capacity>,
}

impl LateAudio {
    pub fn inc(&self) {
        self.counter.inc();
        self.capacity.audio_late();
    }
}

pub struct Metrics {
    registry: Registry,
    sessions: Gauge,
    sessions_most: Gauge,
    sessions_headroom: Gauge,
    real_time_margin: Gauge<f64, AtomicU64>,
    admitting: Gauge,
    pipelines: Gauge,
    steps_waiting: Gauge,
    pub sessions_opened: Counter,
    pub frames_in: Counter,
    pub audio_seconds_out: Counter<f64, AtomicU64>,
    pub late_audio: LateAudio,
    refusals: Family<Refusal, Counter>,
    peers_lost: Family<Lost, Counter>,
    rtp_dropped: Family<RtpDropped, Counter>,
    pub sender_takeovers: Counter,
    model: Arc<Model>,
    pub capacity: Arc<Capacity>,
}

impl Metrics {
    /// The server's metrics; `model`'s batches are observed from now on, and told to `capacity`.
    pub fn new(model: Arc<Model>, capacity: Arc<Capacity>) -> Arc<Self> {
        let mut registry = Registry::with_prefix("qwencodec");
        let metrics = Self {
            sessions: Gauge::default(),
            sessions_most: Gauge::default(),
            sessions_headroom: Gauge::default(),
            real_time_margin: Gauge::default(),
            admitting: Gauge::default(),
            pipelines: Gauge::default(),
            steps_waiting: Gauge::default(),
            sessions_opened: Counter::default(),
            frames_in: Counter::default(),
            audio_seconds_out: Counter::default(),
            late_audio: LateAudio {
                counter: Counter::default(),
                capacity: capacity.clone(),
            },
            refusals: Family::default(),
            peers_lost: Family::default(),
            rtp_dropped: Family::default(),
            sender_takeovers: Counter::default(),
            model: model.clone(),
            capacity: capacity.clone(),
            registry: Registry::default(),
        };
        let step_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        let batch_rows = Histogram::new(exponential_buckets(1.0, 2.0, 8));
        registry.register(
            "sessions",
            "Sessions open: browsers' and broadcasts",
            metrics.sessions.clone(),
        );
        registry.register(
            "sessions_most",
            "The most sessions admitted: measured at start (--admission measured), or --max-sessions",
            metrics.sessions_most.clone(),
        );
        registry.register(
            "sessions_headroom",
            "Sessions more that would be admitted by the most (sessions_most less sessions)",
            metrics.sessions_headroom.clone(),
        );
        registry.register(
            "admitting",
            "1 when a join now would be admitted: headroom, and (--admission measured) not behind by late audio, steps waiting or the real-time margin",
            metrics.admitting.clone(),
        );
        registry.register(
            "pipelines",
            "Session pipelines not yet freed (more than sessions: a leak)",
            metrics.pipelines.clone(),
        );
        registry.register(
            "sessions_opened",
            "Sessions opened since the start",
            metrics.sessions_opened.clone(),
        );
        registry.register(
            "frames_in",
            "Codec frames taken from senders",
            metrics.frames_in.clone(),
        );
        registry.register(
            "audio_out_seconds",
            "Seconds of audio sent to browsers",
            metrics.audio_seconds_out.clone(),
        );
        registry.register(
            "late_audio",
            "RTP packets that reached the sender more than 100 ms behind their speech's schedule: gaps the listener hears",
            metrics.late_audio.counter.clone(),
        );
        registry.register(
            "refusals",
            "Connections and messages refused, by WebSocket close code or HTTP status",
            metrics.refusals.clone(),
        );
        registry.register(
            "peers_lost",
            "Browsers and senders taken for gone: unanswered pings, a peer connection failed, disconnected or never connected",
            metrics.peers_lost.clone(),
        );
        registry.register(
            "rtp_packets_dropped",
            "Packets dropped at a session's RTP codes port, by why: from another address than its sender's, another port or SSRC than the first packet's, not RTP, failed SRTP authentication",
            metrics.rtp_dropped.clone(),
        );
        registry.register(
            "sender_takeovers",
            "Sessions a new sender took over from the one feeding them (takeover=1)",
            metrics.sender_takeovers.clone(),
        );
        registry.register(
            "decode_step_seconds",
            "Time of the decoder's batched steps on the compute thread",
            step_seconds.clone(),
        );
        registry.register(
            "decode_batch_rows",
            "Streams computed together in a decoder step",
            batch_rows.clone(),
        );
        registry.register(
            "decode_steps_waiting",
            "Decode steps handed over and waiting for the compute thread",
            metrics.steps_waiting.clone(),
        );
        registry.register(
            "decode_real_time_margin",
            "1 less the decoder's load over the last 3 s (its busy share, or its steps' time over their audio's, the larger): 1 idle, 0 at real time, below 0 behind",
            metrics.real_time_margin.clone(),
        );
        model.observe_batches(move |run: &BatchRun| {
            step_seconds.observe(run.time.as_secs_f64());
            batch_rows.observe(run.rows as f64);
            capacity.batch_ran(run);
        });
        Arc::new(Self { registry, ..metrics })
    }

    pub fn refused(&self, code: u16) {
        self.refusals.get_or_create(&Refusal { code }).inc();
    }

    /// A `peer` (`browser`, `sender` or `broadcaster`) taken for gone, for `why`.
    pub fn peer_lost(&self, peer: &'static str, why: &'static str) {
        self.peers_lost.get_or_create(&Lost { peer, why }).inc();
    }

    /// `count` packets dropped at a session's RTP port, for `why`.
    pub fn rtp_dropped(&self, why: &'static str, count: u64) {
        self.rtp_dropped.get_or_create(&RtpDropped { why }).inc_by(count);
    }

    /// The text of `/metrics`, the gauges read now.
    pub fn render(&self, sessions: usize, pipelines: usize) -> String {
        self.sessions.set(sessions as i64);
        self.pipelines.set(pipelines as i64);
        self.steps_waiting.set(self.model.steps_waiting() as i64);
        let capacity = self.capacity.report(sessions);
        self.sessions_most.set(capacity.most as i64);
        self.sessions_headroom.set(capacity.headroom as i64);
        self.real_time_margin.set(capacity.real_time_margin);
        self.admitting.set(capacity.admitting as i64);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).expect("writing to a String");
        text
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gstqwencodec::model::{Dtype, StreamDecoder, TailStrategy, parse_device};

    use super::*;

    /// The value of the sample `name` (with its labels) in an OpenMetrics text.
    fn sample<'a>(text: &'a str, name: &str) -> &'a str {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
    }

    /// What the server did is counted under its label, the gauges are read at each render, the
    /// model's batches reach the histograms, and late audio is both counted and told to the
    /// admission.
    #[test]
    fn the_text_counts_what_was_done_and_reads_the_gauges_at_each_render() {
        // A model of its own: another test's batches would reach its observer.
        let cpu = parse_device("cpu").unwrap();
        let model = Arc::new(Model::load(&crate::config::default_model(), cpu, Dtype::F32).unwrap());
        // Live admission with a floor no margin is below: only late audio refuses a join.
        let capacity = Arc::new(Capacity::new(4, true, f64::MIN, Duration::from_millis(80)));
        let metrics = Metrics::new(model.clone(), capacity.clone());

        let text = metrics.render(0, 0);
        assert_eq!(sample(&text, "qwencodec_sessions_most"), "4");
        assert_eq!(sample(&text, "qwencodec_sessions_headroom"), "4");
        assert_eq!(sample(&text, "qwencodec_admitting"), "1");
        assert_eq!(sample(&text, "qwencodec_decode_batch_rows_count"), "0");
        assert_eq!(sample(&text, "qwencodec_late_audio_total"), "0");
        assert!(!text.contains("qwencodec_refusals_total{"), "{text}");

        metrics.refused(4403);
        metrics.refused(4403);
        metrics.refused(503);
        metrics.rtp_dropped("ssrc", 1);
        metrics.peer_lost("browser", "pings-unanswered");
        metrics.sender_takeovers.inc();
        // One stream's step of two frames: one batch of one row.
        let mut decoder = StreamDecoder::new(model.clone(), 2, TailStrategy::Eager).unwrap();
        let codebooks = model.config().num_quantizers;
        let audio = decoder.push(&vec![0; 2 * codebooks]).unwrap();
        assert_eq!(audio.len(), 2 * model.samples_per_frame());

        let text = metrics.render(3, 5);
        assert_eq!(sample(&text, "qwencodec_sessions"), "3");
        assert_eq!(sample(&text, "qwencodec_pipelines"), "5");
        assert_eq!(sample(&text, "qwencodec_sessions_headroom"), "1");
        assert_eq!(sample(&text, "qwencodec_admitting"), "1");
        assert_eq!(sample(&text, r#"qwencodec_refusals_total{code="4403"}"#), "2");
        assert_eq!(sample(&text, r#"qwencodec_refusals_total{code="503"}"#), "1");
        assert_eq!(
            sample(&text, r#"qwencodec_rtp_packets_dropped_total{why="ssrc"}"#),
            "1"
        );
        assert_eq!(
            sample(
                &text,
                r#"qwencodec_peers_lost_total{peer="browser",why="pings-unanswered"}"#
            ),
            "1"
        );
        assert_eq!(sample(&text, "qwencodec_sender_takeovers_total"), "1");
        assert_eq!(sample(&text, "qwencodec_decode_batch_rows_count"), "1");
        assert_eq!(sample(&text, "qwencodec_decode_batch_rows_sum"), "1.0");
        assert_eq!(sample(&text, "qwencodec_decode_step_seconds_count"), "1");
        assert_eq!(sample(&text, "qwencodec_decode_steps_waiting"), "0");
        assert!(
            sample(&text, "qwencodec_decode_real_time_margin")
                .parse::<f64>()
                .unwrap()
                < 1.0
        );

        metrics.late_audio.inc();
        let text = metrics.render(3, 5);
        assert_eq!(sample(&text, "qwencodec_late_audio_total"), "1");
        assert_eq!(sample(&text, "qwencodec_admitting"), "0");
        assert!(capacity.refusal(3).unwrap().contains("late audio"));
        // Past the most, no headroom is left, and none below zero.
        let text = metrics.render(6, 6);
        assert_eq!(sample(&text, "qwencodec_sessions_headroom"), "0");
    }
}
