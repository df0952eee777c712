//! What the parser's input is and where its frames lie: the caps or first bytes it was told,
//! the frame format, rate and count, and the times and caps that follow from them.

use crate::caps::CODES_MEDIA_TYPE;
use crate::npy::FrameFormat;
use crate::typefind::NPY_MEDIA_TYPE;

/// What the input is, as caps (or, without caps, its first bytes) say.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Input {
    /// No caps: the first bytes tell.
    Unknown,
    Npy,
    /// Frames of little-endian int16 codes.
    Raw {
        codebooks: usize,
        framerate: Option<gst::Fraction>,
    },
}

impl Input {
    pub(super) fn from_caps(caps: &gst::CapsRef) -> Option<Input> {
        if caps.is_any() || caps.size() != 1 {
            return None;
        }
        let s = caps.structure(0)?;
        match s.name().as_str() {
            NPY_MEDIA_TYPE => Some(Input::Npy),
            CODES_MEDIA_TYPE => {
                let codebooks = s.get::<i32>("codebooks").ok().filter(|&q| q >= 1)?;
                let framerate = s
                    .get::<gst::Fraction>("framerate")
                    .ok()
                    .filter(|f| f.numer() > 0 && f.denom() > 0);
                Some(Input::Raw {
                    codebooks: codebooks as usize,
                    framerate,
                })
            }
            _ => None,
        }
    }
}

/// Where the frames lie in the input, and their timing.
#[derive(Debug)]
pub(super) struct Layout {
    /// Bytes before the first frame: the `.npy` header.
    pub(super) data_offset: u64,
    pub(super) format: FrameFormat,
    pub(super) framerate: gst::Fraction,
    /// Whether the input stated the frame rate (caps with a framerate); if not, downstream's
    /// (a decoder's model) is taken where it is known, else the `framerate` property.
    pub(super) framerate_stated: bool,
    /// The `.npy` header: its frame count, and what it says, for messages.
    pub(super) declared: Option<Declared>,
    /// Whole frames after `data_offset` and bytes of a cut frame after them, when upstream
    /// knows its size.
    pub(super) present: Option<(u64, u64)>,
}

#[derive(Debug)]
pub(super) struct Declared {
    pub(super) frames: u64,
    pub(super) description: String,
}

impl Layout {
    pub(super) fn frame_bytes(&self) -> u64 {
        self.format.frame_bytes() as u64
    }

    pub(super) fn rate(&self) -> (u128, u128) {
        (self.framerate.numer() as u128, self.framerate.denom() as u128)
    }

    /// When frame `index` starts, rounded down to the nanosecond.
    pub(super) fn frame_time(&self, index: u64) -> Option<gst::ClockTime> {
        let (num, den) = self.rate();
        let nanoseconds = index as u128 * den * gst::ClockTime::SECOND.nseconds() as u128 / num;
        u64::try_from(nanoseconds).ok().map(gst::ClockTime::from_nseconds)
    }

    /// The frame playing at `time`: the last one whose start (as `frame_time` gives it) is at
    /// or before `time`.
    pub(super) fn frame_at(&self, time: gst::ClockTime) -> Option<u64> {
        // frame_time(k) <= t  <=>  k * den * 1e9 < (t + 1) * num.
        let (num, den) = self.rate();
        let below = (time.nseconds() as u128 + 1) * num - 1;
        u64::try_from(below / (den * gst::ClockTime::SECOND.nseconds() as u128)).ok()
    }

    /// The frames that will play: those declared, or fewer when the data is short.
    pub(super) fn playable_frames(&self) -> Option<u64> {
        let declared = self.declared.as_ref().map(|declared| declared.frames);
        let present = self.present.map(|(whole, _)| whole);
        match (declared, present) {
            (Some(declared), Some(present)) => Some(declared.min(present)),
            (declared, present) => declared.or(present),
        }
    }

    pub(super) fn src_caps(&self) -> gst::Caps {
        let mut caps = self.src_caps_without_rate();
        caps.make_mut().set("framerate", self.framerate);
        caps
    }

    pub(super) fn src_caps_without_rate(&self) -> gst::Caps {
        gst::Caps::builder(CODES_MEDIA_TYPE)
            .field("codebooks", self.format.codebooks as i32)
            .field("parsed", true)
            .build()
    }

    /// The warning for a stream that ended after `frames_end` whole frames and `partial` more
    /// bytes, if that is short of what it should hold.
    pub(super) fn shortfall(&self, frames_end: u64, partial: u64) -> Option<String> {
        let cut = if partial > 0 {
            format!(" and {partial} bytes of an incomplete frame (dropped)")
        } else {
            String::new()
        };
        match &self.declared {
            Some(declared) if frames_end < declared.frames => Some(format!(
                "Truncated .npy data: {} declares {} frames, the data holds {frames_end} whole frames{cut}",
                declared.description, declared.frames
            )),
            _ if partial > 0 => Some(format!(
                "Dropped {partial} bytes at the end of the stream: an incomplete frame"
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::npy::IntType;

    fn layout(framerate: gst::Fraction) -> Layout {
        Layout {
            data_offset: 128,
            format: FrameFormat {
                dtype: IntType::I16_LE,
                codebooks: 16,
            },
            framerate,
            framerate_stated: true,
            declared: None,
            present: None,
        }
    }

    /// A frame's start maps back to that frame, and the last nanosecond before the next
    /// frame's start still to it, at rates whose frames are no whole number of nanoseconds.
    #[test]
    fn frame_times_and_frames_at_times_agree() {
        gst::init().unwrap();
        for (numer, denom) in [(25, 2), (30000, 1001), (3, 1), (7, 3)] {
            let layout = layout(gst::Fraction::new(numer, denom));
            for frame in [0u64, 1, 2, 3, 12, 1000, 123_457, 10_000_000] {
                let start = layout.frame_time(frame).unwrap();
                assert_eq!(
                    layout.frame_at(start),
                    Some(frame),
                    "{numer}/{denom}, frame {frame}"
                );
                let next = layout.frame_time(frame + 1).unwrap();
                assert!(next > start);
                let last = gst::ClockTime::from_nseconds(next.nseconds() - 1);
                assert_eq!(
                    layout.frame_at(last),
                    Some(frame),
                    "{numer}/{denom}, before frame {}",
                    frame + 1
                );
            }
        }
        // 12.5 frames per second: frame 1 starts at 80 ms, frame 3 at 240 ms.
        let layout = layout(gst::Fraction::new(25, 2));
        assert_eq!(layout.frame_time(3), Some(gst::ClockTime::from_mseconds(240)));
        assert_eq!(layout.frame_at(gst::ClockTime::from_mseconds(79)), Some(0));
    }

    #[test]
    fn playable_frames_are_the_fewer_of_declared_and_present() {
        gst::init().unwrap();
        let mut layout = layout(gst::Fraction::new(25, 2));
        assert_eq!(layout.playable_frames(), None);
        layout.present = Some((10, 5));
        assert_eq!(layout.playable_frames(), Some(10));
        layout.declared = Some(Declared {
            frames: 8,
            description: "shape (8, 16)".into(),
        });
        assert_eq!(layout.playable_frames(), Some(8));
        assert!(layout.shortfall(8, 0).is_none());
        let short = layout.shortfall(6, 5).unwrap();
        assert!(
            short.contains("declares 8 frames") && short.contains("6 whole frames"),
            "{short}"
        );
    }
}
