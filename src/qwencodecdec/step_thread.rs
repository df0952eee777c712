//! One stream of the element: the frames its buffers bring, decoded on a thread of the
//! element's own, so that the streaming thread goes on taking buffers during a step (frames that
//! arrive meanwhile join into the next, larger step), and each step's audio goes downstream as
//! the step ends.
//!
//! The streaming thread only splits buffers into frames and checks their codes; the step thread
//! takes the decoder out, runs a step without any lock held, puts it back and queues the audio.
//! Audio is pushed under the base class's stream lock, which a flush also holds, so audio of a
//! step begun before a flush never follows it: by the step thread when the step ends, or by the
//! streaming thread with its next buffer if that comes first. A step's audio is cut where
//! input buffers' frames end, so that each input buffer is closed as soon as its audio is out.
//! A drain (EOS, a new stream, a refused buffer) and a flush wait for the step in flight, then
//! do their work on the streaming thread.
//!
//! Upstream is paced: the streaming thread waits before each buffer, in a probe on the sink pad
//! and so outside the base class's stream lock, while more than the read-ahead (two steps of
//! `max-step-frames`) waits for the step thread, so a file source cannot hand over
//! its whole file, and a seek or a stop finds at most that much queued. A flush-start or a stop
//! sets `flushing`: no step starts after it, a waiting streaming thread and a drain return at
//! once, and only the step in flight finishes.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;

use super::settings::Stats;
use crate::model::{DecodeError, Model, StreamDecoder};

/// Frames that may wait for the decoder before upstream waits: two of its largest steps, so
/// that the next step is full when one ends, and no more, so that a seek or a stop finds little
/// queued and memory does not grow with a fast source.
pub(super) fn read_ahead_frames(decoder: &StreamDecoder) -> usize {
    2 * decoder.limits().max_step_frames
}

/// What goes downstream, in order.
pub(super) enum Output {
    /// Decoded audio of frames of the oldest unfinished input buffer (and maybe the next
    /// ones'), pushed as a subframe of it.
    Audio(Vec<f32>),
    /// Input buffers whose frames' audio is all out, oldest first: the base class drops them.
    InputsDone(i32),
    /// A serialized event that came after the frames whose audio is before it.
    Event(gst::Event),
}

/// A buffer with a code outside the codebook, none of its frames taken yet. The frames before
/// the bad one are decoded all the same (nothing taken is lost); the bad one and those after
/// it are dropped.
pub(super) struct Refused {
    pub(super) error: DecodeError,
    /// The codes of its whole frames before the bad one (the first of them completing the
    /// previous buffer's cut frame, if any).
    pub(super) valid: Vec<i16>,
    /// Its bytes after its last whole frame: the start of a frame that the next buffer ends.
    pub(super) trailing: Vec<u8>,
}

/// What the streaming thread and the step thread share.
pub(super) struct Stream {
    inner: Mutex<Inner>,
    changed: Condvar,
}

pub(super) struct Inner {
    model: Arc<Model>,
    /// None while the step thread runs a step with it.
    decoder: Option<StreamDecoder>,
    /// Negotiated output sample format (F32LE or S16LE).
    pub(super) format: gst_audio::AudioFormat,
    /// Whole frames taken from buffers, not handed to the decoder yet.
    codes: Vec<i16>,
    /// Those frames by input buffer, oldest first. A step's oldest frame tells how long after
    /// it reached the element (or its time, if later) its audio comes out: the latency kept
    /// true while playing.
    arrivals: VecDeque<Arrival>,
    /// One frame's duration.
    frame_duration: gst::ClockTime,
    frames_accepted: u64,
    /// The stream's last frame taken, which concealment repeats (empty: none since the reset).
    last_frame: Vec<i16>,
    /// Bytes of a frame cut by a buffer boundary, waiting for the rest.
    partial_frame: Vec<u8>,
    /// Per input buffer not yet finished, oldest first: how many of the frames that start in
    /// it have no audio out yet. A buffer is finished as soon as the last of them is out, so
    /// the next audio pushed starts at the next buffer's first frame and takes its timestamp.
    frames_per_input: VecDeque<usize>,
    /// Audio and finished input buffers, oldest first, waiting to be pushed. A reset (which
    /// waits for the step in flight) clears it: audio of a step begun before a flush never
    /// follows it.
    outbox: VecDeque<Output>,
    /// Serialized events that came while frames before them had no audio out yet, oldest
    /// first, each with the count of the stream's frames before it: queued in `outbox` once
    /// those frames' audio is.
    events: VecDeque<(u64, gst::Event)>,
    /// Frames of the stream whose audio is queued in `outbox` (or gone).
    frames_out: u64,
    /// The step thread panicked with the decoder: the stream cannot go on, and nothing waits
    /// for the decoder to come back.
    panicked: bool,
    /// The streaming thread decodes the rest itself: no new step starts.
    draining: bool,
    /// A flush-start or a stop is under way: no step starts, and the streaming thread stops
    /// waiting and draining.
    flushing: bool,
    /// The most frames that wait for the step thread before the streaming thread waits too.
    read_ahead: usize,
    /// `partial_frame` holds the start of a frame whose buffer was refused and closed: the
    /// next buffer counts the frame as its own.
    orphan_partial_frame: bool,
    shutdown: bool,
    /// The step thread's failed step or push, for the streaming thread to return.
    pub(super) flow: Result<gst::FlowSuccess, gst::FlowError>,
    /// Decoder counters already added to the stats (the decoder restarts with each stream).
    counted_steps: u64,
    counted_step_time: Duration,
    counted_batch_rows: u64,
}

/// Frames of one input buffer, in running time: when they reached the element, and when the
/// first of them is due (its timestamp), each where known.
#[derive(Debug, Clone, Copy)]
pub(super) struct Arrival {
    pub(super) frames: usize,
    pub(super) arrived: Option<gst::ClockTime>,
    pub(super) due: Option<gst::ClockTime>,
}

impl Arrival {
    /// From when the first frame's audio is the element's to make: its arrival, or its time if
    /// it came early (upstream's lateness is not the element's).
    fn start(&self) -> Option<gst::ClockTime> {
        let arrived = self.arrived?;
        Some(self.due.map_or(arrived, |due| due.max(arrived)))
    }
}

/// Little-endian int16 codes as numbers.
fn codes_of(bytes: &[u8]) -> impl Iterator<Item = i16> + '_ {
    bytes
        .chunks_exact(2)
        .map(|pair| i16::from_le_bytes([pair[0], pair[1]]))
}

impl Stream {
    /// `read_ahead`: frames that may wait for the step thread before upstream waits.
    pub(super) fn new(decoder: StreamDecoder, read_ahead: usize) -> Arc<Self> {
        let (num, den) = decoder.model().config().frame_rate();
        let frame_duration = gst::ClockTime::SECOND
            .mul_div_floor(den as u64, num as u64)
            .unwrap();
        Arc::new(Self {
            inner: Mutex::new(Inner {
                model: decoder.model().clone(),
                decoder: Some(decoder),
                format: gst_audio::AudioFormat::F32le,
                codes: Vec::new(),
                arrivals: VecDeque::new(),
                frame_duration,
                frames_accepted: 0,
                last_frame: Vec::new(),
                partial_frame: Vec::new(),
                frames_per_input: VecDeque::new(),
                outbox: VecDeque::new(),
                events: VecDeque::new(),
                frames_out: 0,
                panicked: false,
                draining: false,
                flushing: false,
                read_ahead,
                orphan_partial_frame: false,
                shutdown: false,
                flow: Ok(gst::FlowSuccess::Ok),
                counted_steps: 0,
                counted_step_time: Duration::ZERO,
                counted_batch_rows: 0,
            }),
            changed: Condvar::new(),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn wait<'a>(&self, inner: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        self.changed
            .wait(inner)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lock, once the step in flight (if any) has given the decoder back, or the step
    /// thread has panicked with it.
    pub(super) fn lock_idle(&self) -> MutexGuard<'_, Inner> {
        let mut inner = self.lock();
        while inner.decoder.is_none() && !inner.panicked {
            inner = self.wait(inner);
        }
        inner
    }

    /// Tells the step thread that there may be work.
    pub(super) fn wake(&self) {
        self.changed.notify_all();
    }

    /// Flush-start and stop (`true`), flush-stop (`false`): while set, no step starts and the
    /// streaming thread neither waits for room nor drains.
    pub(super) fn set_flushing(&self, flushing: bool) {
        self.lock().flushing = flushing;
        self.changed.notify_all();
    }

    /// On the calling thread (a drain), the step thread kept out by `draining`: the next full
    /// step, its audio queued; None when no full step waits. No lock is held during the step,
    /// so that a flush-start is seen meanwhile.
    pub(super) fn step_here(&self) -> Option<Result<(), DecodeError>> {
        let (mut decoder, codes, _) = self.lock().take_step()?;
        let result = decoder.push(&codes);
        let mut inner = self.give_back(decoder);
        Some(result.map(|audio| inner.queue_audio(audio)))
    }

    /// Ends the stream on the calling thread, every full step run: the frames still waiting
    /// (the tail, by the tail strategy) decoded and queued, with the closing of every input
    /// buffer left. Returns the bytes of a cut frame dropped.
    pub(super) fn finish_here(&self) -> Result<usize, DecodeError> {
        let mut inner = self.lock();
        let Some(mut decoder) = inner.decoder.take() else {
            return Err(DecodeError::Broken);
        };
        let frames = std::mem::take(&mut inner.codes);
        inner.arrivals.clear();
        drop(inner);
        let audio = decoder.push(&frames).and_then(|mut audio| {
            audio.extend(decoder.finish()?);
            Ok(audio)
        });
        let mut inner = self.give_back(decoder);
        inner.queue_audio(audio?);
        let unfinished = std::mem::take(&mut inner.frames_per_input).len();
        if unfinished > 0 {
            inner.outbox.push_back(Output::InputsDone(unfinished as i32));
        }
        // The events after the last frames, whatever their audio.
        while let Some((_, event)) = inner.events.pop_front() {
            inner.outbox.push_back(Output::Event(event));
        }
        Ok(std::mem::take(&mut inner.partial_frame).len())
    }

    /// Puts the decoder back after a step on the calling thread, for whoever waits for it.
    fn give_back(&self, decoder: StreamDecoder) -> MutexGuard<'_, Inner> {
        let mut inner = self.lock();
        inner.decoder = Some(decoder);
        self.changed.notify_all();
        inner
    }

    /// Starts the step thread of `element`.
    pub(super) fn spawn_steps(
        self: &Arc<Self>,
        element: glib::WeakRef<super::QwenCodecDec>,
    ) -> std::io::Result<StepThread> {
        let stream = self.clone();
        let thread = std::thread::Builder::new()
            .name("qwencodecdec-steps".into())
            .spawn(move || {
                let steps = std::panic::AssertUnwindSafe(|| stream.run_steps(element.clone()));
                if let Err(panic) = std::panic::catch_unwind(steps) {
                    stream.after_panic(&element, panic.as_ref());
                }
            })?;
        Ok(StepThread {
            stream: self.clone(),
            thread: Some(thread),
        })
    }

    /// A panic of the step thread (a bug): the decoder it held is gone, so the stream fails
    /// as after a failed step, with an element error, and whoever waits for the decoder (a
    /// drain, a flush, a stop) goes on. The thread ends; the element starts a new one at its
    /// next READY→PAUSED.
    fn after_panic(&self, element: &glib::WeakRef<super::QwenCodecDec>, panic: &(dyn std::any::Any + Send)) {
        let what = panic
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("no message");
        self.lock().set_panicked();
        self.changed.notify_all();
        if let Some(element) = element.upgrade() {
            gst::element_error!(
                element,
                gst::LibraryError::Failed,
                ("The decoding thread failed"),
                ["It panicked: {}", what]
            );
        }
    }

    /// The step thread: a step whenever a full one waits, its audio queued and pushed.
    fn run_steps(&self, element: glib::WeakRef<super::QwenCodecDec>) {
        // When the last push returned (running time). A synchronised sink holds a push until
        // its audio's time plus the pipeline's latency: frames that came meanwhile waited for
        // downstream, not for the decoder, and counting that wait as the element's would raise
        // its latency, which makes the sink hold longer, and so on (docs/element.md, "Latency",
        // has what it did behind a WebRTC session's clock-synchronised output).
        let mut pushed_at = None;
        loop {
            let mut inner = self.lock();
            let step = loop {
                if inner.shutdown {
                    return;
                }
                if let Some(step) = inner.next_step() {
                    break step;
                }
                inner = self.wait(inner);
            };
            let (mut decoder, codes, oldest_start) = step;
            drop(inner);
            // The backlog shrank: a streaming thread waiting for room may go on.
            self.changed.notify_all();
            let Some(element) = element.upgrade() else {
                return;
            };
            let imp = element.imp();
            // When the step's oldest frame became the element's to decode (as `check_latency`
            // counts it): what it waited since is spent of its hold.
            let since = oldest_start.map(|start| pushed_at.map_or(start, |pushed| start.max(pushed)));
            decoder.set_batch_hold(imp.batch_hold(since));
            if imp.take_planted_panic() {
                panic!("a panic planted by a test");
            }
            let result = decoder.push(&codes);

            let mut inner = self.lock();
            inner.decoder = Some(decoder);
            let mut failed = None;
            match result {
                Ok(audio) => inner.queue_audio(audio),
                Err(err) => {
                    inner.flow = Err(gst::FlowError::Error);
                    failed = Some(err);
                }
            }
            inner.count(&mut imp.stats());
            self.changed.notify_all();
            drop(inner);
            if let Some(err) = failed {
                // Posts the error; the flow it returns is kept above for the streaming thread.
                let _ = imp.step_error(err);
            }
            // Before the push, which a synchronised sink holds until the audio's time.
            if let Some(since) = since {
                imp.check_latency(since);
            }
            imp.push_outbox(self);
            pushed_at = imp.now();
        }
    }
}

impl Inner {
    pub(super) fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn frame_bytes(&self) -> usize {
        2 * self.model.config().num_quantizers
    }

    /// Frames waiting for the step thread.
    pub(super) fn backlog_frames(&self) -> usize {
        self.codes.len() / self.model.config().num_quantizers
    }

    /// Whether the streaming thread may go on: no more than the read-ahead waits, or it must
    /// return at once (a flush or stop, a failed step or push).
    pub(super) fn room_or_flow(&self) -> Option<Result<gst::FlowSuccess, gst::FlowError>> {
        if self.flushing {
            Some(Err(gst::FlowError::Flushing))
        } else if self.flow.is_err() || self.backlog_frames() <= self.read_ahead {
            Some(self.flow)
        } else {
            None
        }
    }

    /// The decoder, the codes of the next step and from when its oldest frame's audio was the
    /// element's to make (see [`Arrival::start`]), when a full step waits and nothing else has
    /// the decoder, nor is the stream draining, flushing or failed.
    fn next_step(&mut self) -> Option<(StreamDecoder, Vec<i16>, Option<gst::ClockTime>)> {
        if self.draining || self.flushing || self.flow.is_err() {
            return None;
        }
        self.take_step()
    }

    /// The decoder, the codes of the next full step and from when its oldest frame's audio was
    /// the element's to make.
    fn take_step(&mut self) -> Option<(StreamDecoder, Vec<i16>, Option<gst::ClockTime>)> {
        let codebooks = self.model.config().num_quantizers;
        let take = self
            .decoder
            .as_ref()?
            .frames_for_next_step(self.codes.len() / codebooks)?;
        let oldest_due = self.arrivals.front().and_then(Arrival::start);
        let frame = self.frame_duration;
        let mut left = take;
        while left > 0
            && let Some(arrival) = self.arrivals.front_mut()
        {
            let taken = left.min(arrival.frames);
            arrival.frames -= taken;
            arrival.due = arrival.due.map(|due| due + frame * taken as u64);
            left -= taken;
            if arrival.frames == 0 {
                self.arrivals.pop_front();
            }
        }
        let codes = self.take_codes(take * codebooks);
        Some((self.decoder.take()?, codes, oldest_due))
    }

    /// Takes one input buffer's bytes (`arrival` says when, and when its first frame is due;
    /// its frame count is counted here): its whole frames wait for the step thread. A buffer
    /// with a bad code is refused: none of its frames is taken (see [`Refused`]).
    pub(super) fn accept(&mut self, data: &[u8], arrival: Arrival) -> Result<u64, Refused> {
        let frame_bytes = self.frame_bytes();
        let codebooks = frame_bytes / 2;
        let carried = self.partial_frame.len();
        let mut starting_here = (carried + data.len()).div_ceil(frame_bytes) - carried.div_ceil(frame_bytes);
        if std::mem::take(&mut self.orphan_partial_frame) && carried > 0 {
            // Its buffer was refused and closed: the frame counts as this one's.
            starting_here += 1;
        }
        self.frames_per_input.push_back(starting_here);
        // A buffer with no frame starting in it is finished at once if it is the oldest.
        self.queue_finished_inputs();

        // Frames are read from the buffer in place; only a frame cut by its start or end is
        // gathered in `partial_frame`.
        let before = self.codes.len();
        let mut data = data;
        if !self.partial_frame.is_empty() {
            let missing = (frame_bytes - self.partial_frame.len()).min(data.len());
            self.partial_frame.extend_from_slice(&data[..missing]);
            data = &data[missing..];
            if self.partial_frame.len() == frame_bytes {
                self.codes.extend(codes_of(&self.partial_frame));
                self.partial_frame.clear();
            }
        }
        let whole = data.len() / frame_bytes * frame_bytes;
        self.codes.extend(codes_of(&data[..whole]));
        let checked = self
            .model
            .check_codes(&self.codes[before..], self.frames_accepted);
        if let Err(error) = checked {
            let valid_frames = match error {
                DecodeError::InvalidCode { frame, .. } => frame - self.frames_accepted,
                _ => 0,
            };
            let mut valid = self.codes.split_off(before);
            valid.truncate(valid_frames as usize * codebooks);
            // The cut frame that the previous buffer left was completed into `valid` or the
            // bad frame: either way it is no longer waiting.
            self.partial_frame.clear();
            return Err(Refused {
                error,
                valid,
                trailing: data[whole..].to_vec(),
            });
        }
        self.partial_frame.extend_from_slice(&data[whole..]);
        let frames = ((self.codes.len() - before) / codebooks) as u64;
        if frames > 0 {
            self.arrivals.push_back(Arrival {
                frames: frames as usize,
                ..arrival
            });
        }
        self.frames_accepted += frames;
        if frames > 0 {
            self.last_frame = self.codes[self.codes.len() - codebooks..].to_vec();
        }
        Ok(frames)
    }

    /// Takes `frames` copies of the stream's last frame in place of lost ones, as an input
    /// buffer of its own; None (nothing taken) when the stream has no frame yet or waits for
    /// the rest of a cut frame.
    pub(super) fn conceal(&mut self, frames: usize, arrival: Arrival) -> Option<u64> {
        if self.last_frame.is_empty() || !self.partial_frame.is_empty() {
            return None;
        }
        let bytes: Vec<u8> = self
            .last_frame
            .iter()
            .flat_map(|code| code.to_le_bytes())
            .cycle()
            .take(frames * self.frame_bytes())
            .collect();
        self.accept(&bytes, arrival).ok()
    }

    /// One frame's duration.
    pub(super) fn frame_duration(&self) -> gst::ClockTime {
        self.frame_duration
    }

    /// Whether frames were taken since the stream started (or was last reset).
    pub(super) fn has_frames(&self) -> bool {
        self.frames_accepted > 0 || !self.codes.is_empty() || !self.partial_frame.is_empty()
    }

    /// Takes the whole frames of a refused buffer that come before its bad code, as the last
    /// of the stream; returns how many. (They are not added
    /// to `frames_accepted`: the drain that follows resets it.)
    pub(super) fn accept_before_bad_code(&mut self, valid: Vec<i16>) -> u64 {
        let frames = (valid.len() / (self.frame_bytes() / 2)) as u64;
        self.arrivals.push_back(Arrival {
            frames: frames as usize,
            arrived: None,
            due: None,
        });
        self.codes.extend(valid);
        frames
    }

    /// After a refused buffer's stream was drained: the bytes after its last whole frame start
    /// the next stream's first frame, which the next buffer completes (the byte stream stays
    /// aligned to frames).
    pub(super) fn continue_after_refused(&mut self, trailing: Vec<u8>) {
        self.partial_frame = trailing;
        self.orphan_partial_frame = !self.partial_frame.is_empty();
    }

    /// The first `count` waiting codes, moved out (the usual step takes them all).
    fn take_codes(&mut self, count: usize) -> Vec<i16> {
        let rest = self.codes.split_off(count);
        std::mem::replace(&mut self.codes, rest)
    }

    /// Queues a step's audio: cut where input buffers' frames end, so that each buffer is
    /// finished as soon as its last frame's audio is out.
    fn queue_audio(&mut self, mut audio: Vec<f32>) {
        let samples_per_frame = self.model.samples_per_frame();
        loop {
            self.queue_finished_inputs();
            self.queue_events_due();
            let frames = audio.len() / samples_per_frame;
            let Some(&unfinished) = self.frames_per_input.front() else {
                break;
            };
            if frames == 0 {
                break;
            }
            let mut taken = frames.min(unfinished);
            // Cut where the next event goes too (`queue_events_due` queued those due now).
            if let Some(&(at, _)) = self.events.front() {
                taken = taken.min((at - self.frames_out) as usize);
            }
            *self.frames_per_input.front_mut().unwrap() -= taken;
            self.frames_out += taken as u64;
            let rest = audio.split_off(taken * samples_per_frame);
            self.outbox.push_back(Output::Audio(audio));
            audio = rest;
        }
    }

    /// Queues the events whose frames' audio is all queued.
    fn queue_events_due(&mut self) {
        while let Some(&(at, _)) = self.events.front()
            && at <= self.frames_out
        {
            let (_, event) = self.events.pop_front().unwrap();
            self.outbox.push_back(Output::Event(event));
        }
    }

    /// Keeps a serialized event where it came, after the frames before it: queued at once if
    /// their audio is, else once it is. Given back when nothing of the stream waits to go
    /// downstream (the base class may send it, with what it holds, before the next audio).
    pub(super) fn queue_event(&mut self, event: gst::Event) -> Option<gst::Event> {
        let waiting = !self.frames_per_input.is_empty() || !self.outbox.is_empty() || !self.events.is_empty();
        if !waiting {
            return Some(event);
        }
        if self.events.is_empty() && self.frames_out >= self.frames_accepted {
            self.outbox.push_back(Output::Event(event));
        } else {
            self.events.push_back((self.frames_accepted, event));
        }
        None
    }

    /// The sticky events among those queued (a flush drops the others; GStreamer keeps the
    /// sticky ones for after it).
    pub(super) fn sticky_events_queued(&self) -> Vec<gst::Event> {
        let queued = self.outbox.iter().filter_map(|output| match output {
            Output::Event(event) => Some(event),
            _ => None,
        });
        queued
            .chain(self.events.iter().map(|(_, event)| event))
            .filter(|event| {
                event.is_sticky() && !matches!(event.type_(), gst::EventType::Eos | gst::EventType::Segment)
            })
            .cloned()
            .collect()
    }

    /// The step thread panicked with the decoder: what is queued goes, and every later flow is
    /// an error.
    pub(super) fn set_panicked(&mut self) {
        self.panicked = true;
        self.flow = Err(gst::FlowError::Error);
    }

    /// Queues the closing of the oldest input buffers whose frames' audio is all out.
    fn queue_finished_inputs(&mut self) {
        let mut finished = 0;
        while self.frames_per_input.front() == Some(&0) {
            self.frames_per_input.pop_front();
            finished += 1;
        }
        if finished > 0 {
            self.outbox.push_back(Output::InputsDone(finished));
        }
    }

    /// Forgets the stream, the decoder idle: the next frame decodes as on a fresh decoder.
    pub(super) fn reset(&mut self, stats: &mut Stats) -> Result<(), DecodeError> {
        self.count(stats);
        self.codes.clear();
        self.arrivals.clear();
        self.frames_accepted = 0;
        self.last_frame.clear();
        self.partial_frame.clear();
        self.orphan_partial_frame = false;
        self.frames_per_input.clear();
        self.outbox.clear();
        self.events.clear();
        self.frames_out = 0;
        // After a panic the stream stays failed until the element stops.
        if !self.panicked {
            self.flow = Ok(gst::FlowSuccess::Ok);
        }
        self.counted_steps = 0;
        self.counted_batch_rows = 0;
        self.counted_step_time = Duration::ZERO;
        match self.decoder.as_mut() {
            Some(decoder) => decoder.reset(),
            None => Ok(()),
        }
    }

    /// Adds the decoder's new steps to the stats.
    fn count(&mut self, stats: &mut Stats) {
        let Some(decoder) = &self.decoder else { return };
        let (step_time, max_step_time) = decoder.step_times();
        stats.steps += decoder.steps() - self.counted_steps;
        stats.step_time += step_time - self.counted_step_time;
        stats.max_step_time = stats.max_step_time.max(max_step_time);
        stats.state_bytes = decoder.state_bytes() as u64;
        let (batch_rows, max_rows) = decoder.batch_rows();
        stats.batch_rows += batch_rows - self.counted_batch_rows;
        stats.max_batch_rows = stats.max_batch_rows.max(max_rows as u64);
        self.counted_steps = decoder.steps();
        self.counted_batch_rows = batch_rows;
        self.counted_step_time = step_time;
    }

    /// Takes the next output to push.
    pub(super) fn next_output(&mut self) -> Option<Output> {
        self.outbox.pop_front()
    }

    pub(super) fn set_draining(&mut self, draining: bool) {
        self.draining = draining;
    }

    /// The flow for the streaming thread to return now: an error, FLUSHING during a flush or a
    /// stop, else the last flow.
    pub(super) fn flow_now(&self) -> Result<gst::FlowSuccess, gst::FlowError> {
        match self.drain_interrupted() {
            Some(stop) => Err(stop),
            None => self.flow,
        }
    }

    /// Where a drain stands: `Some` when it must end now (a flush or stop under way, a push
    /// that failed), with the flow to return.
    pub(super) fn drain_interrupted(&self) -> Option<gst::FlowError> {
        if self.flushing {
            Some(gst::FlowError::Flushing)
        } else {
            self.flow.err()
        }
    }
}

/// The running step thread; stopping it (on drop) lets the step in flight end first.
pub(super) struct StepThread {
    stream: Arc<Stream>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for StepThread {
    fn drop(&mut self) {
        self.stream.lock().shutdown = true;
        self.stream.wake();
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}
