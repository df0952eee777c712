//! The `stats` property of `rtpqwencodespay` and `rtpqwencodesdepay`: their base class's
//! structure (sequence number, RTP time, clock rate, …, which RTSP servers and applications
//! read) with the element's own counts added, under the same name.

use gst::glib;
use gst::glib::translate::{IntoGlib, ToGlibPtrMut};
use gst::prelude::*;
use gst::subclass::prelude::*;

/// The `stats` property that stands in for the base class `Base`'s.
pub fn pspec<Base: IsA<glib::Object> + glib::object::IsClass>() -> glib::ParamSpec {
    glib::ParamSpecOverride::for_class::<Base>("stats")
}

/// The base class's `stats` with `counts` added.
pub fn with_counts<T: ObjectSubclass>(imp: &T, counts: &[(&str, u64)]) -> gst::Structure {
    let obj = imp.obj();
    let mut value = glib::Value::from_type(gst::Structure::static_type());
    // GObject has no call for a parent's property: this is what g_object_get_property does
    // with the pspec of the base class, which our override hides.
    unsafe {
        let class = glib::gobject_ffi::g_type_class_peek(T::ParentType::static_type().into_glib())
            as *mut glib::gobject_ffi::GObjectClass;
        let pspec = glib::gobject_ffi::g_object_class_find_property(class, c"stats".as_ptr());
        if let (false, Some(get)) = (pspec.is_null(), (*class).get_property) {
            get(
                obj.as_ptr() as *mut glib::gobject_ffi::GObject,
                (*pspec).param_id,
                value.to_glib_none_mut().0,
                pspec,
            );
        }
    }
    let mut stats = value
        .get::<Option<gst::Structure>>()
        .ok()
        .flatten()
        .unwrap_or_else(|| gst::Structure::new_empty("application/x-rtp-stats"));
    for &(name, count) in counts {
        stats.set(name, count);
    }
    stats
}
