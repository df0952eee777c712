//! The way downstream: each step's audio pushed through the base class under its stream lock,
//! input buffers closed as their frames' audio is out, drains, resets and refused buffers.

use gst::glib;
use gst::glib::translate::ToGlibPtr;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_audio::prelude::*;
use gst_audio::subclass::prelude::*;

use super::imp::{CAT, QwenCodecDec};
use super::step_thread::{Arrival, Output, Refused, Stream};
use crate::model::DecodeError;

/// The base class's stream lock (`GST_AUDIO_DECODER_STREAM_LOCK`, recursive), which
/// gstreamer-rs does not wrap. Audio goes downstream under it, from the step thread as from the
/// streaming thread, and the base class flushes under it: a flush falls between two pushes.
/// Only ever taken and let go in turn, whoever holds it already: nothing lets go of a hold the
/// base class took.
struct StreamLockGuard(*mut glib::ffi::GRecMutex);

impl Drop for StreamLockGuard {
    fn drop(&mut self) {
        // SAFETY: locked by this guard in `QwenCodecDec::stream_lock`, on this thread; the
        // element (and so the mutex) outlives the guard, which lives inside one of its methods.
        unsafe { glib::ffi::g_rec_mutex_unlock(self.0) }
    }
}

/// Float samples as the bytes of an F32LE buffer, without a copy: the buffer takes the vector.
struct F32Samples(Vec<f32>);

impl AsMut<[u8]> for F32Samples {
    fn as_mut(&mut self) -> &mut [u8] {
        let bytes = std::mem::size_of_val(self.0.as_slice());
        // SAFETY: f32 has no padding and any bytes are a valid f32 bit pattern; the slice covers
        // exactly the vector's initialised samples and borrows it.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), bytes) }
    }
}

/// Audio in the negotiated sample format: F32LE hands the samples over as they are (on a
/// little-endian machine), S16LE converts them.
fn output_buffer(audio: Vec<f32>, format: gst_audio::AudioFormat) -> gst::Buffer {
    match format {
        gst_audio::AudioFormat::S16le => gst::Buffer::from_mut_slice(
            audio
                .iter()
                .flat_map(|&sample| ((sample * 32767.0).round() as i16).to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
        _ if cfg!(target_endian = "little") => gst::Buffer::from_mut_slice(F32Samples(audio)),
        _ => gst::Buffer::from_mut_slice(
            audio
                .iter()
                .flat_map(|sample| sample.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
    }
}

impl QwenCodecDec {
    fn stream_mutex(&self) -> *mut glib::ffi::GRecMutex {
        let decoder: *mut gst_audio::ffi::GstAudioDecoder = self
            .obj()
            .upcast_ref::<gst_audio::AudioDecoder>()
            .to_glib_none()
            .0;
        // SAFETY: `decoder` points to this live element's GstAudioDecoder instance, whose
        // `stream_lock` is a GRecMutex initialised by the base class for the element's life.
        unsafe { std::ptr::addr_of_mut!((*decoder).stream_lock) }
    }

    fn stream_lock(&self) -> StreamLockGuard {
        let mutex = self.stream_mutex();
        // SAFETY: see `stream_mutex`; recursive, so taking it where the base class already
        // holds it (handle_frame, flush) is allowed.
        unsafe { glib::ffi::g_rec_mutex_lock(mutex) };
        StreamLockGuard(mutex)
    }

    /// Paces upstream: a probe on the sink pad, which runs on the streaming thread before the
    /// base class takes its stream lock for the buffer, waits while more than the read-ahead
    /// waits for the step thread, so that upstream goes at the decoder's pace while the step
    /// thread pushes its audio under the lock. A flush-start, a stop or a failed step or push
    /// ends the wait (and `handle_frame` then returns the flow).
    pub(super) fn pace_upstream(&self) {
        let element = self.obj().downgrade();
        self.obj().sink_pad().add_probe(
            gst::PadProbeType::BUFFER | gst::PadProbeType::BUFFER_LIST,
            move |_, _| {
                if let Some(element) = element.upgrade() {
                    element.imp().wait_for_room();
                }
                gst::PadProbeReturn::Ok
            },
        );
    }

    /// Waits while more than the read-ahead waits for the step thread (see `pace_upstream`).
    fn wait_for_room(&self) {
        let Some(stream) = self.stream() else { return };
        let mut inner = stream.lock();
        while inner.room_or_flow().is_none() {
            gst::trace!(
                CAT,
                imp = self,
                "{} frames wait: waiting for room",
                inner.backlog_frames()
            );
            inner = stream.wait(inner);
        }
    }

    /// Hands one output to the base class, which stamps audio from the oldest unfinished input
    /// buffer's timestamp on: a subframe that starts an input buffer's audio resyncs to its PTS.
    fn push_output(
        &self,
        output: Output,
        format: gst_audio::AudioFormat,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        match output {
            Output::Audio(audio) => {
                self.stats().samples_out += audio.len() as u64;
                self.obj().finish_subframe(Some(output_buffer(audio, format)))
            }
            Output::InputsDone(input_buffers) => self.obj().finish_frame(None, input_buffers),
            Output::Event(event) => {
                self.push_event_in_place(event);
                Ok(gst::FlowSuccess::Ok)
            }
        }
    }

    /// An event whose place among the audio has come. A TAG goes through the base class,
    /// which merges upstream's tags with the element's (the codec) and sends them before the
    /// next audio; the others go downstream now.
    fn push_event_in_place(&self, event: gst::Event) {
        let what = event.type_();
        let sent = if what == gst::EventType::Tag {
            self.parent_sink_event(event)
        } else {
            self.obj().src_pad().push_event(event)
        };
        if !sent {
            gst::debug!(CAT, imp = self, "Downstream refused a {:?} event", what);
        }
    }

    /// A serialized event that is not the base class's (see `keeps_its_place`): kept in its
    /// place after the frames before it, then pushed with the audio ready. When nothing waits
    /// to go downstream it goes now, where the audio has begun (a drain event after it must not
    /// pass it); a TAG, and anything before the first audio (which the base class's caps and
    /// segment must precede), go to the base class, which sends them before the next audio.
    pub(super) fn queue_event(&self, event: gst::Event) -> bool {
        let Some(stream) = self.stream() else {
            return self.parent_sink_event(event);
        };
        let _lock = self.stream_lock();
        let Some(event) = stream.lock().queue_event(event) else {
            self.push_outbox(&stream);
            return true;
        };
        let obj = self.obj();
        let src = obj.src_pad();
        if event.type_() != gst::EventType::Tag && src.sticky_event::<gst::event::Segment>(0).is_some() {
            return src.push_event(event);
        }
        self.parent_sink_event(event)
    }

    /// The drain event: the stream's frames decoded and their audio pushed (see
    /// [`Self::drain_for_event`]), then the event, all under the stream lock.
    pub(super) fn drain_then_push(&self, event: gst::Event) -> bool {
        let _lock = self.stream_lock();
        self.drain_for_event();
        self.obj().src_pad().push_event(event)
    }

    /// Pushes what the stream has queued, in order, under the stream lock; a failed push is
    /// kept for the streaming thread to return.
    pub(super) fn push_outbox(&self, stream: &Stream) {
        let _lock = self.stream_lock();
        loop {
            let mut inner = stream.lock();
            let Some(output) = inner.next_output() else {
                return;
            };
            let format = inner.format;
            drop(inner);
            if let Err(err) = self.push_output(output, format) {
                gst::debug!(CAT, imp = self, "Pushing audio: {:?}", err);
                stream.lock().flow = Err(err);
                return;
            }
        }
    }

    /// Decodes what the stream still holds (after the step in flight), pushing each step's
    /// audio as it ends, and starts a fresh stream. A flush-start, a stop or a failed push ends
    /// it after the step in flight.
    pub(super) fn drain(&self) -> Result<gst::FlowSuccess, gst::FlowError> {
        let Some(stream) = self.stream() else {
            return Ok(gst::FlowSuccess::Ok);
        };
        let _lock = self.stream_lock();
        stream.lock().set_draining(true);
        drop(stream.lock_idle());
        let result = self.drain_idle(&stream);
        let mut inner = stream.lock();
        let reset = inner.reset(&mut self.stats());
        inner.set_draining(false);
        drop(inner);
        stream.wake();
        let flow = result?;
        reset.map_err(|err| self.step_error(err))?;
        Ok(flow)
    }

    /// A drain that an event asks for (a new stream, a new timeline, `qwencodec-drain`, a gap):
    /// an event has no flow to return, so a push that failed during it (NOT_LINKED, EOS from
    /// downstream) is kept for the next buffer to return, as a failed push of the step thread
    /// is.
    pub(super) fn drain_for_event(&self) {
        let Err(err) = self.drain() else { return };
        if err == gst::FlowError::Flushing {
            return;
        }
        gst::debug!(
            CAT,
            imp = self,
            "Drain for an event: {:?}, kept for the next buffer",
            err
        );
        if let Some(stream) = self.stream() {
            stream.lock().flow = Err(err);
        }
    }

    /// A GAP: time goes on without frames. Lost frames' time (flagged missing data, as
    /// depayloaders send it) with `plc` set goes to the base class, which hands it to
    /// `handle_frame` as an empty buffer to conceal (`conceal`) and does not flush at the
    /// DISCONT after it. Any other gap (a silent live source, or lost time without `plc`):
    /// under the stream lock, so that nothing goes downstream between, the frames before it are
    /// decoded and their audio pushed, and the next frame decodes as on a fresh decoder (the
    /// frames after the hole do not follow the ones before); then the GAP goes on through the
    /// base class, which sends the events pending ahead of it.
    pub(super) fn handle_gap(&self, event: gst::Event) -> bool {
        let _lock = self.stream_lock();
        let lost = match event.view() {
            gst::EventView::Gap(gap) => gap.gap_flags().contains(gst::GapFlags::DATA),
            _ => false,
        };
        if lost && self.obj().is_plc() {
            gst::debug!(CAT, imp = self, "{:?}: lost frames, to conceal", event);
            return self.parent_sink_event(event);
        }
        gst::debug!(
            CAT,
            imp = self,
            "{:?}: a fresh stream after the frames before it",
            event
        );
        self.drain_for_event();
        self.parent_sink_event(event)
    }

    /// The base class's packet-loss concealment: `gap` (an empty buffer) holds the time of
    /// lost frames. A whole number of frames, at most `max-plc-frames`, after a frame of the
    /// stream: that many copies of the last frame take their place, and the decoder goes on.
    /// Otherwise the frames before it end as a stream and the next decodes fresh, as a GAP
    /// without `plc` does; the GAP goes downstream once the stream's segment has.
    pub(super) fn conceal(&self, gap: &gst::Buffer) -> Result<gst::FlowSuccess, gst::FlowError> {
        let stream = self.stream().ok_or(gst::FlowError::Flushing)?;
        let max_frames = self.settings().max_plc_frames as u64;
        let arrival = Arrival {
            frames: 0,
            arrived: self.now(),
            due: self.running_time(gap.pts()),
        };
        let mut inner = stream.lock();
        if let Some(stop) = inner.drain_interrupted() {
            return Err(stop);
        }
        let frames = gap
            .duration()
            .and_then(|duration| whole_frames(duration, inner.frame_duration()))
            .filter(|frames| (1..=max_frames).contains(frames));
        if let Some(concealed) = frames.and_then(|frames| inner.conceal(frames as usize, arrival)) {
            drop(inner);
            gst::debug!(
                CAT,
                imp = self,
                "{} lost frames: the last frame repeated",
                concealed
            );
            self.stats().frames_concealed += concealed;
            stream.wake();
            self.push_outbox(&stream);
            return stream.lock().flow_now();
        }
        // Closed with the frames before it, which have no audio out yet.
        let _ = inner.accept(&[], arrival);
        drop(inner);
        gst::debug!(
            CAT,
            imp = self,
            "Lost time {:?} at {:?} not concealed: a fresh stream after the frames before it",
            gap.duration(),
            gap.pts()
        );
        self.drain_for_event();
        let obj = self.obj();
        let src = obj.src_pad();
        if let Some(pts) = gap.pts()
            && src.sticky_event::<gst::event::Segment>(0).is_some()
        {
            src.push_event(
                gst::event::Gap::builder(pts)
                    .duration(gap.duration())
                    .gap_flags(gst::GapFlags::DATA)
                    .build(),
            );
        }
        stream.lock().flow_now()
    }

    /// A buffer flagged RESYNC starts a talk spurt (an utterance, as depayloaders mark it): the
    /// decoder starts fresh. The base class flushed already at its DISCONT, unless a concealed
    /// gap came just before (the base class then expects the DISCONT): end the stream here.
    pub(super) fn start_talk_spurt(&self) {
        if self.stream().is_some_and(|stream| stream.lock().has_frames()) {
            gst::debug!(CAT, imp = self, "A talk spurt starts: a fresh stream");
            self.drain_for_event();
        }
    }

    /// The drain with the step thread idle: what it finished, then the remaining steps and the
    /// tail on this thread, each pushed as it ends, until done or told to stop.
    fn drain_idle(&self, stream: &Stream) -> Result<gst::FlowSuccess, gst::FlowError> {
        self.push_outbox(stream);
        loop {
            if let Some(stop) = stream.lock().drain_interrupted() {
                gst::debug!(CAT, imp = self, "Drain ended early: {:?}", stop);
                return Err(stop);
            }
            match stream.step_here() {
                None => break,
                Some(Ok(())) => self.push_outbox(stream),
                Some(Err(err)) => return Err(self.step_error(err)),
            }
        }
        let dropped = stream.finish_here().map_err(|err| self.step_error(err))?;
        self.push_outbox(stream);
        if dropped > 0 {
            gst::element_imp_warning!(
                self,
                gst::StreamError::Decode,
                (
                    "Dropped {} bytes at the end of the stream: an incomplete frame",
                    dropped
                )
            );
        }
        stream.lock().flow
    }

    /// Drops everything of the current stream (flushing seek), once the step in flight is
    /// done; its audio is dropped too. Under the stream lock: a push failing on the flush is
    /// over before, and its flow reset with the rest.
    pub(super) fn reset_stream(&self) {
        let Some(stream) = self.stream() else { return };
        let _lock = self.stream_lock();
        let mut inner = stream.lock_idle();
        // As the base class does with the events it holds: the sticky ones stay for after the
        // flush.
        for event in inner.sticky_events_queued() {
            let _ = self.obj().src_pad().store_sticky_event(&event);
        }
        if let Err(err) = inner.reset(&mut self.stats()) {
            gst::warning!(CAT, imp = self, "Cannot reset the decoder: {}", err);
        }
        drop(inner);
        self.forget_subframes();
    }

    /// The base class counts the audio pushed for its oldest input buffer in subframes until
    /// a finish_frame closes it, and neither its flush nor its stop resets that count; while
    /// it is not 0, it holds back pending events (the next segment) and the timestamp resync.
    /// A finish with no audio for all (-1) of its queued input buffers resets it.
    pub(super) fn forget_subframes(&self) {
        let _ = self.obj().finish_frame(None, -1);
    }

    /// A buffer with a code outside the codebook. The frames before the bad one are decoded
    /// as the end of the stream (nothing taken is lost); then the base class counts the error
    /// (its count restarts when audio goes out or at a flush): past `max-errors` it posts it
    /// and the stream stops, else a warning says what was dropped and a fresh stream starts
    /// from the buffer's next frame, whose first bytes the buffer's cut frame holds.
    pub(super) fn refuse_buffer(
        &self,
        stream: &Stream,
        refused: Refused,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        let Refused {
            error,
            valid,
            trailing,
        } = refused;
        let frames = stream.lock().accept_before_bad_code(valid);
        self.stats().frames_in += frames;
        let drained = self.drain();
        gst_audio::audio_decoder_error!(
            self.obj(),
            1,
            gst::StreamError::Decode,
            ("Invalid codec frame: {}", error)
        )?;
        // Let pass, which the base class only logs: the bus still hears of the frames dropped.
        gst::element_imp_warning!(
            self,
            gst::StreamError::Decode,
            (
                "Dropped the frames of a buffer from its bad one on: Invalid codec frame: {} \
                 (max-errors {} lets it pass)",
                error,
                self.obj().max_errors()
            )
        );
        stream.lock().continue_after_refused(trailing);
        drained
    }

    /// A decode step that failed: the stream cannot go on.
    pub(super) fn step_error(&self, err: DecodeError) -> gst::FlowError {
        gst::element_imp_error!(self, gst::LibraryError::Failed, ("Decoding failed: {}", err));
        gst::FlowError::Error
    }
}

/// How many frames of `frame` last `duration`, if a whole number (within a sample at 48 kHz).
fn whole_frames(duration: gst::ClockTime, frame: gst::ClockTime) -> Option<u64> {
    if frame.is_zero() {
        return None;
    }
    let frames = (duration.nseconds() + frame.nseconds() / 2) / frame.nseconds();
    let off = duration.nseconds().abs_diff(frames * frame.nseconds());
    (off <= 20_000).then_some(frames)
}
