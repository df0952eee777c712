//! What the WebRTC example and the server share: the Opus RTP caps, a `webrtcbin` whose ICE
//! gathers on the addresses it is given (127.0.0.1 alone for the example),
//! and SDP text to and from webrtcbin's session descriptions.
//!
//! Both go through a few C calls: libnice has no property for the addresses it gathers on, and
//! `GstWebRTCSessionDescription` is a plain C struct in libgstwebrtc, whose Rust bindings would
//! need the `-dev` package of gst-plugins-bad (it pulls in OpenCV). The libraries are linked by
//! the sonames of Debian 12's packages, so no `-dev` package beyond the plugin's is needed.

use std::ffi::{CStr, CString, c_char, c_int, c_void};

use gst::glib;
use gst::glib::translate::{ToGlibPtr, ToGlibPtrMut};
use gst::prelude::*;

/// The RTP caps of the Opus stream the examples send (payload 96; Opus on RTP always states 2
/// channels).
pub fn opus_rtp_caps() -> gst::Caps {
    gst::Caps::builder("application/x-rtp")
        .field("media", "audio")
        .field("encoding-name", "OPUS")
        .field("payload", 96i32)
        .field("clock-rate", 48_000i32)
        .field("encoding-params", "2")
        .build()
}

/// A `webrtcbin` that bundles its media and gathers ICE candidates on 127.0.0.1 only, with no
/// STUN or TURN server and no UPnP: nothing it sends leaves the machine.
pub fn loopback_webrtcbin(name: &str) -> Result<gst::Element, Box<dyn std::error::Error>> {
    Ok(webrtcbin_on(name, &[std::net::Ipv4Addr::LOCALHOST.into()])?)
}

/// A `webrtcbin` that bundles its media and gathers host candidates on `addresses` only (on
/// every interface but loopback when empty, libnice's choice), with no UPnP.
pub fn webrtcbin_on(name: &str, addresses: &[std::net::IpAddr]) -> Result<gst::Element, String> {
    let webrtcbin = gst::ElementFactory::make("webrtcbin")
        .name(name)
        .property_from_str("bundle-policy", "max-bundle")
        .build()
        .map_err(|err| err.to_string())?;
    let ice = webrtcbin.property::<glib::Object>("ice-agent");
    let agent = ice.property::<glib::Object>("agent");
    agent.set_property("upnp", false);
    for address in addresses {
        gather_on(&agent, *address)?;
    }
    Ok(webrtcbin)
}

/// A DTLS certificate of our own for webrtcbin: ECDSA P-256, self-signed. GStreamer 1.22 makes
/// an RSA one by default: browsers take both, but some WebRTC stacks offer ECDSA cipher suites
/// only (aiortc, which pipecat builds on), and their DTLS handshake fails against RSA.
pub struct DtlsCertificate {
    /// The certificate and its private key in PEM, as `dtlssrtpdec`'s `pem` takes them.
    pem: String,
    /// The SHA-256 fingerprint of the certificate, as SDP's `a=fingerprint` gives it.
    fingerprint: String,
}

impl DtlsCertificate {
    pub fn generate() -> Result<Self, String> {
        let certified =
            rcgen::generate_simple_self_signed(vec!["qwencodec".into()]).map_err(|err| err.to_string())?;
        let mut checksum = glib::Checksum::new(glib::ChecksumType::Sha256).ok_or("no SHA-256 in GLib")?;
        checksum.update(certified.cert.der());
        let fingerprint = checksum
            .digest()
            .iter()
            .map(|byte| format!("{byte:02X}"))
            .collect::<Vec<_>>()
            .join(":");
        Ok(Self {
            pem: format!(
                "{}{}",
                certified.cert.pem(),
                certified.signing_key.serialize_pem()
            ),
            fingerprint,
        })
    }

    /// Has `webrtcbin`'s DTLS transports present this certificate: set on each `dtlssrtpdec`
    /// as webrtcbin adds it, before its handshake.
    pub fn install(&self, webrtcbin: &gst::Element) {
        let bin = webrtcbin.downcast_ref::<gst::Bin>().expect("webrtcbin is a bin");
        let pem = self.pem.clone();
        bin.connect_deep_element_added(move |_, _, element| {
            if element
                .factory()
                .is_some_and(|factory| factory.name() == "dtlssrtpdec")
            {
                element.set_property("pem", &pem);
            }
        });
    }

    /// `sdp` (webrtcbin's offer or answer) with this certificate's fingerprint. webrtcbin 1.22
    /// computes the fingerprint over all of `pem`, the private key included, so its own is
    /// wrong for a certificate set this way.
    pub fn fix_fingerprint(&self, sdp: &str) -> String {
        sdp.lines()
            .map(|line| {
                if line.starts_with("a=fingerprint:") {
                    format!("a=fingerprint:sha-256 {}", self.fingerprint)
                } else {
                    line.to_owned()
                }
            })
            .map(|line| line + "\r\n")
            .collect()
    }
}

#[link(name = "libnice.so.10", kind = "dylib", modifiers = "+verbatim")]
unsafe extern "C" {
    fn nice_address_new() -> *mut c_void;
    fn nice_address_set_from_string(address: *mut c_void, text: *const c_char) -> c_int;
    fn nice_address_free(address: *mut c_void);
    fn nice_agent_add_local_address(agent: *mut glib::gobject_ffi::GObject, address: *const c_void) -> c_int;
}

/// Adds `address` to those the NiceAgent `agent` gathers host candidates on (once any is added,
/// libnice gathers on those alone).
fn gather_on(agent: &glib::Object, address: std::net::IpAddr) -> Result<(), String> {
    let text = CString::new(address.to_string()).expect("an address has no NUL");
    // SAFETY: `agent` is a live NiceAgent (the type of GstWebRTCNice's `agent` property);
    // the address is allocated, set, copied by the agent and freed here.
    let added = unsafe {
        let nice_address = nice_address_new();
        let set = nice_address_set_from_string(nice_address, text.as_ptr());
        let added = set != 0 && nice_agent_add_local_address(agent.to_glib_none().0, nice_address) != 0;
        nice_address_free(nice_address);
        added
    };
    if added {
        Ok(())
    } else {
        Err(format!("cannot gather ICE candidates on {address}"))
    }
}

/// `GstWebRTCSDPType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdpKind {
    Offer = 1,
    Answer = 3,
}

/// `GstWebRTCSessionDescription`'s layout (public in gst/webrtc/rtcsessiondescription.h).
#[repr(C)]
struct RawDescription {
    kind: c_int,
    sdp: *mut c_void,
}

#[link(name = "libgstsdp-1.0.so.0", kind = "dylib", modifiers = "+verbatim")]
unsafe extern "C" {
    fn gst_sdp_message_new_from_text(text: *const c_char, message: *mut *mut c_void) -> c_int;
    fn gst_sdp_message_free(message: *mut c_void) -> c_int;
    fn gst_sdp_message_as_text(message: *const c_void) -> *mut c_char;
}

#[link(name = "libgstwebrtc-1.0.so.0", kind = "dylib", modifiers = "+verbatim")]
unsafe extern "C" {
    fn gst_webrtc_session_description_new(kind: c_int, sdp: *mut c_void) -> *mut c_void;
}

const GST_SDP_OK: c_int = 0;

fn description_type() -> Result<glib::Type, String> {
    glib::Type::from_name("GstWebRTCSessionDescription")
        .ok_or_else(|| "GstWebRTCSessionDescription is not registered: no webrtcbin loaded".into())
}

/// A session description value for webrtcbin's `set-remote-description`, from SDP text.
pub fn description_from_sdp(kind: SdpKind, text: &str) -> Result<glib::Value, String> {
    let text = CString::new(text).map_err(|_| "the SDP holds a NUL byte".to_string())?;
    let mut value = glib::Value::from_type(description_type()?);
    // SAFETY: the SDP message is created by libgstsdp and either freed here or owned by the
    // description, which the value takes.
    unsafe {
        let mut message = std::ptr::null_mut();
        if gst_sdp_message_new_from_text(text.as_ptr(), &mut message) != GST_SDP_OK || message.is_null() {
            if !message.is_null() {
                gst_sdp_message_free(message);
            }
            return Err("the SDP cannot be parsed".into());
        }
        let description = gst_webrtc_session_description_new(kind as c_int, message);
        glib::gobject_ffi::g_value_take_boxed(value.to_glib_none_mut().0, description);
    }
    Ok(value)
}

/// The SDP text of a session description value (as `create-offer` or `create-answer` give it).
pub fn sdp_of(description: &glib::Value) -> Result<String, String> {
    if description.type_() != description_type()? {
        return Err(format!("{} is not a session description", description.type_()));
    }
    // SAFETY: the value holds a GstWebRTCSessionDescription (checked above), whose SDP message
    // is valid while the value lives; the text is copied and freed.
    unsafe {
        let raw = glib::gobject_ffi::g_value_get_boxed(description.to_glib_none().0) as *const RawDescription;
        if raw.is_null() || (*raw).sdp.is_null() {
            return Err("the session description is empty".into());
        }
        let text = gst_sdp_message_as_text((*raw).sdp);
        let sdp = CStr::from_ptr(text).to_string_lossy().into_owned();
        glib::ffi::g_free(text as *mut c_void);
        Ok(sdp)
    }
}
