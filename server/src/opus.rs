//! The Opus encoder as WebRTC senders set it: in-band FEC sized by the loss that the listener's
//! RTCP receiver reports tell, DTX when asked for, the bitrate when given.

use gst::glib;
use gst::prelude::*;

use crate::log::log;
use qwencodec_common::Options;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpusSettings {
    /// Bits a second; opusenc's own default when not given.
    pub bitrate: Option<i32>,
    /// In-band forward error correction: each packet carries a coarse copy of the one before,
    /// which the receiver decodes when that one is lost.
    pub fec: bool,
    /// Discontinuous transmission: next to no packets in silence.
    pub dtx: bool,
}

impl Default for OpusSettings {
    fn default() -> Self {
        Self {
            bitrate: None,
            fec: true,
            dtx: false,
        }
    }
}

impl OpusSettings {
    /// `--opus-bitrate BPS`, `--opus-fec on|off` (on), `--opus-dtx on|off` (off).
    pub fn from_options(options: &mut Options) -> Result<Self, String> {
        let switch = |name: &str, value: Option<String>, default: bool| match value.as_deref() {
            None => Ok(default),
            Some("on") => Ok(true),
            Some("off") => Ok(false),
            Some(other) => Err(format!("{name} takes on or off, not {other:?}")),
        };
        let bitrate: Option<i32> = options.take_optional("--opus-bitrate")?;
        if let Some(bitrate) = bitrate
            && !(4_000..=650_000).contains(&bitrate)
        {
            return Err(format!(
                "--opus-bitrate takes 4000 to 650000 bits a second, not {bitrate}"
            ));
        }
        let defaults = Self::default();
        Ok(Self {
            bitrate,
            fec: switch("--opus-fec", options.take("--opus-fec")?, defaults.fec)?,
            dtx: switch("--opus-dtx", options.take("--opus-dtx")?, defaults.dtx)?,
        })
    }

    /// An `opusenc` for speech with these settings.
    pub fn encoder(&self) -> Result<gst::Element, String> {
        let mut encoder = gst::ElementFactory::make("opusenc")
            .property_from_str("audio-type", "voice")
            .property("inband-fec", self.fec)
            .property("dtx", self.dtx);
        if let Some(bitrate) = self.bitrate {
            encoder = encoder.property("bitrate", bitrate);
        }
        encoder.build().map_err(|err| err.to_string())
    }

    pub fn describe(&self) -> String {
        let bitrate = self.bitrate.map_or_else(
            || "opusenc's bitrate".to_owned(),
            |bitrate| format!("{bitrate} bit/s"),
        );
        let on = |on: bool| if on { "on" } else { "off" };
        format!("Opus {bitrate}, FEC {}, DTX {}", on(self.fec), on(self.dtx))
    }
}

/// Keeps `opusenc`'s expected packet loss, which sizes its FEC, at the loss the listener's last
/// RTCP receiver report gave for our stream: read from webrtcbin's RTP session each time a
/// source there sends RTCP.
pub fn follow_reported_loss(webrtcbin: &gst::Element, opusenc: &gst::Element) -> Result<(), String> {
    let rtpbin = webrtcbin
        .downcast_ref::<gst::Bin>()
        .and_then(|bin| bin.by_name("rtpbin"))
        .ok_or("webrtcbin has no rtpbin")?;
    // Weak: the pipeline holds both elements, and a strong reference here would keep it alive.
    let opusenc = opusenc.downgrade();
    rtpbin.connect("on-ssrc-active", false, move |values| {
        let (Ok(rtpbin), Ok(session), Some(opusenc)) = (
            values[0].get::<gst::Element>(),
            values[1].get::<u32>(),
            opusenc.upgrade(),
        ) else {
            return None;
        };
        let internal = rtpbin.emit_by_name::<Option<glib::Object>>("get-internal-session", &[&session]);
        if let Some(percent) = internal.and_then(|internal| reported_loss_percent(&internal)) {
            let before = opusenc.property::<i32>("packet-loss-percentage");
            if before != percent {
                log!(
                    "{}: the listener reports {percent} % loss (was {before} %)",
                    opusenc_pipeline(&opusenc)
                );
                opusenc.set_property("packet-loss-percentage", percent);
            }
        }
        None
    });
    Ok(())
}

/// The loss, in percent, that the last receiver report about our own sending source gave: the
/// report block is kept on the reporting (remote) source, naming ours by its SSRC; RTCP's
/// fraction lost is in 256ths.
fn reported_loss_percent(session: &glib::Object) -> Option<i32> {
    let sources: Vec<gst::Structure> = session
        .property::<gst::Structure>("stats")
        .get::<glib::ValueArray>("source-stats")
        .ok()?
        .iter()
        .filter_map(|source| source.get::<gst::Structure>().ok())
        .collect();
    loss_about_ours(&sources)
}

/// [`reported_loss_percent`] from the session's sources' stats.
fn loss_about_ours(sources: &[gst::Structure]) -> Option<i32> {
    let flag = |source: &gst::Structure, name: &str| source.get::<bool>(name).unwrap_or(false);
    let ours: Vec<u32> = sources
        .iter()
        .filter(|source| flag(source, "internal") && flag(source, "is-sender"))
        .filter_map(|source| source.get::<u32>("ssrc").ok())
        .collect();
    sources.iter().find_map(|source| {
        let about_ours = flag(source, "have-rb") && ours.contains(&source.get::<u32>("rb-ssrc").ok()?);
        let fraction_lost = source.get::<u32>("rb-fractionlost").ok().filter(|_| about_ours)?;
        Some(((fraction_lost * 100 + 128) / 256) as i32)
    })
}

/// The name of the pipeline `element` is in (`session-ID`), for the log.
fn opusenc_pipeline(element: &gst::Element) -> String {
    element
        .parent()
        .map_or_else(|| "a session".to_owned(), |parent| parent.name().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_args(args: &[&str]) -> Result<OpusSettings, String> {
        OpusSettings::from_options(&mut Options::from_args(args.iter().map(|arg| arg.to_string())))
    }

    #[test]
    fn the_opus_settings_are_the_options_within_opus_bitrates() {
        let defaults = from_args(&[]).unwrap();
        assert_eq!(defaults, OpusSettings::default());
        assert_eq!(
            (defaults.bitrate, defaults.fec, defaults.dtx),
            (None, true, false)
        );
        assert_eq!(defaults.describe(), "Opus opusenc's bitrate, FEC on, DTX off");
        let chosen = from_args(&["--opus-bitrate", "4000", "--opus-fec", "off", "--opus-dtx", "on"]).unwrap();
        assert_eq!(
            chosen,
            OpusSettings {
                bitrate: Some(4000),
                fec: false,
                dtx: true
            }
        );
        assert_eq!(chosen.describe(), "Opus 4000 bit/s, FEC off, DTX on");
        let on = from_args(&[
            "--opus-bitrate",
            "650000",
            "--opus-fec",
            "on",
            "--opus-dtx",
            "off",
        ])
        .unwrap();
        assert_eq!((on.bitrate, on.fec, on.dtx), (Some(650_000), true, false));
        for (args, error) in [
            (&["--opus-bitrate", "3999"][..], "not 3999"),
            (&["--opus-bitrate", "650001"], "not 650001"),
            (&["--opus-fec", "yes"], "--opus-fec takes on or off, not \"yes\""),
            (&["--opus-dtx", "1"], "--opus-dtx takes on or off, not \"1\""),
        ] {
            let err = from_args(args).unwrap_err();
            assert!(err.contains(error), "{args:?}: {err}");
        }
    }

    #[test]
    fn the_encoder_is_opusenc_for_voice_with_the_settings() {
        gst::init().unwrap();
        let settings = OpusSettings {
            bitrate: Some(24_000),
            fec: false,
            dtx: true,
        };
        let encoder = settings.encoder().unwrap();
        assert_eq!(encoder.factory().unwrap().name(), "opusenc");
        assert_eq!(encoder.property::<i32>("bitrate"), 24_000);
        assert!(!encoder.property::<bool>("inband-fec"));
        assert!(encoder.property::<bool>("dtx"));
        let audio_type = encoder.property_value("audio-type");
        let nick = glib::EnumValue::from_value(&audio_type).unwrap().1.nick();
        assert_eq!(nick, "voice");
        let default = OpusSettings::default().encoder().unwrap();
        assert!(default.property::<bool>("inband-fec"));
        assert!(!default.property::<bool>("dtx"));
        let opusenc_default = gst::ElementFactory::make("opusenc").build().unwrap();
        assert_eq!(
            default.property::<i32>("bitrate"),
            opusenc_default.property::<i32>("bitrate")
        );
    }

    /// Our source's stats, as rtpbin keeps them.
    fn ours(ssrc: u32, sender: bool) -> gst::Structure {
        gst::Structure::builder("application/x-rtp-source-stats")
            .field("ssrc", ssrc)
            .field("internal", true)
            .field("is-sender", sender)
            .build()
    }

    /// The listener's source's stats, with the block of its last receiver report (about the
    /// source `about`).
    fn report(about: u32, fraction_lost: u32, have_rb: bool) -> gst::Structure {
        gst::Structure::builder("application/x-rtp-source-stats")
            .field("ssrc", 9u32)
            .field("internal", false)
            .field("is-sender", false)
            .field("have-rb", have_rb)
            .field("rb-ssrc", about)
            .field("rb-fractionlost", fraction_lost)
            .build()
    }

    #[test]
    fn the_loss_is_the_listeners_report_about_our_sending_source_in_percent() {
        // Structures need GStreamer initialised, which another test may not have done first.
        gst::init().unwrap();
        let loss = loss_about_ours;
        // RTCP's fraction lost is in 256ths: rounded to the nearest percent.
        for (fraction, percent) in [(0, 0), (1, 0), (2, 1), (64, 25), (128, 50), (255, 100)] {
            assert_eq!(loss(&[ours(7, true), report(7, fraction, true)]), Some(percent));
        }
        // A report about another source, one without a report block, or about a source of ours
        // that does not send: no loss known.
        assert_eq!(loss(&[ours(7, true), report(8, 64, true)]), None);
        assert_eq!(loss(&[ours(7, true), report(7, 64, false)]), None);
        assert_eq!(loss(&[ours(7, false), report(7, 64, true)]), None);
        assert_eq!(loss(&[report(7, 64, true)]), None);
        // The report about ours is found among others.
        assert_eq!(
            loss(&[report(8, 200, true), ours(7, true), report(7, 32, true)]),
            Some(13)
        );
        assert_eq!(loss(&[]), None);
    }
}
