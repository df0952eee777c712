//! The Opus encoder as WebRTC senders set it: in-band FEC sized by the loss that the listener's
//! RTCP receiver reports tell, DTX when asked for, the bitrate when given.

use gst::glib;
use gst::prelude::*;

use crate::log;
use crate::options::Options;

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
    let stats = session.property::<gst::Structure>("stats");
    let sources: Vec<gst::Structure> = stats
        .get::<glib::ValueArray>("source-stats")
        .ok()?
        .iter()
        .filter_map(|source| source.get::<gst::Structure>().ok())
        .collect();
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
